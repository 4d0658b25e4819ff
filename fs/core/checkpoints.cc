// checkpoints.cc — checkpoints as units (`ckptfs ls`, `ckptfs latest`):
// the directories and files whose names match the mount's checkpoint
// pattern, each with what its files add up to; and the policies that act
// on them (--persist-every, --persist-interval, --keep-in-memory,
// `ckptfs persist`).
//
// The class CheckpointCatalog (fs/core/checkpoints.h), and InodeTable's side:
// the policy set, the listing, and `ckptfs persist`, which logs a
// memory-only checkpoint for the backend.
#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_set>

#include "fs/core/core_impl.h"

namespace ckpt::fs {

namespace {
constexpr int kMaxDepth = 8;  // checkpoints live near the top; deeper trees are not searched
}  // namespace

void CheckpointCatalog::Add(const Namespace& ns, const Inode* n, CheckpointInfo* c, int depth) {
  if (n->is_dir()) {
    if (depth > 64) return;  // a pathological tree: counted as far as this
    for (auto& [name, ino] : n->children)
      if (const Inode* child = ns.Find(ino)) Add(ns, child, c, depth + 1);
    return;
  }
  if (!S_ISREG(n->rec.mode)) return;
  c->files++;
  c->bytes += n->rec.size;
  auto s = static_cast<size_t>(n->rec.state);
  if (s < meta::kDataStates) {
    c->state_files[s]++;
    c->state_bytes[s] += n->rec.size;
  }
  if (n->writers > 0 || n->data_gen != n->sealed_gen) c->open++;
  else if ((n->rec.state == meta::DataState::kDirty || n->rec.state == meta::DataState::kDraining) && replicated &&
           replicated(n->rec.ino, n->rec.version))
    c->replicated++;
  c->mtime_ns = std::max<int64_t>(c->mtime_ns, n->rec.mtime.sec * 1000000000LL + n->rec.mtime.nsec);
  if (n->t_change_ns == 0 || n->t_seal_ns == 0) c->times_known = false;
  if (n->t_change_ns > 0)
    c->first_change_ns = c->first_change_ns == 0 ? n->t_change_ns : std::min(c->first_change_ns, n->t_change_ns);
  c->last_seal_ns = std::max(c->last_seal_ns, n->t_seal_ns);
  c->last_publish_ns = std::max(c->last_publish_ns, n->t_publish_ns);
}

void CheckpointCatalog::Find(const Namespace& ns, const Inode* dir, const std::string& prefix,
                             const std::regex& pattern, int depth,
                             const std::function<uint64_t(const std::string&)>& lost_under,
                             std::vector<CheckpointInfo>* out) {
  for (auto& [name, ino] : dir->children) {
    const Inode* c = ns.Find(ino);
    if (!c) continue;
    std::string path = prefix.empty() ? name : prefix + "/" + name;
    // A numbered checkpoint stays one under another name (`mv step_5 best`).
    if ((c->is_dir() || S_ISREG(c->rec.mode)) && (c->rec.ckpt_ord > 0 || std::regex_match(name, pattern))) {
      CheckpointInfo info;
      info.path = path;
      info.dir = c->is_dir();
      info.ord = c->rec.ckpt_ord;
      info.memory_only = c->rec.memory_only;
      Add(ns, c, &info, 0);
      info.lost = lost_under(path);
      out->push_back(std::move(info));
    } else if (c->is_dir() && depth < kMaxDepth) {
      Find(ns, c, path, pattern, depth + 1, lost_under, out);
    }
  }
}

std::vector<CheckpointInfo> CheckpointCatalog::List(const Namespace& ns, const std::regex& pattern,
                                                    const std::function<uint64_t(const std::string&)>& lost_under) {
  std::vector<CheckpointInfo> out;
  if (const Inode* root = ns.Find(meta::kRootIno)) Find(ns, root, "", pattern, 0, lost_under, &out);
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
  });
  return out;
}

bool CheckpointCatalog::Starts(const Namespace& ns, uint64_t parent, std::string_view name) {
  if (!policy_.pattern || !std::regex_match(name.begin(), name.end(), *policy_.pattern)) return false;
  // As Find sees it: the outermost match, at most kMaxDepth
  // directories below the root.
  int depth = 0;
  for (uint64_t cur = parent; cur != meta::kRootIno; depth++) {
    const Inode* d = ns.Find(cur);
    if (!d || depth >= kMaxDepth) return false;
    if (d->rec.ckpt_ord > 0 || d->rec.memory_only || std::regex_match(d->rec.name, *policy_.pattern)) return false;
    cur = d->rec.parent;
  }
  return true;
}

bool CheckpointCatalog::ChooseMemoryOnly(uint64_t ord) {
  if (!policy_.selective()) return false;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  bool drains = policy_.persist_every > 0 && ord % policy_.persist_every == 0;
  if (policy_.persist_interval_s > 0 &&
      (last_drained_s_ == 0 || now - last_drained_s_ >= static_cast<int64_t>(policy_.persist_interval_s)))
    drains = true;
  if (drains) last_drained_s_ = now;
  return !drains;
}

bool CheckpointCatalog::UnderMemoryOnly(const Namespace& ns, uint64_t dir) {
  for (int steps = 0; steps < 100000; steps++) {
    const Inode* d = ns.Find(dir);
    if (!d) return false;
    if (d->rec.memory_only) return true;
    if (dir == meta::kRootIno) return false;
    dir = d->rec.parent;
  }
  return false;  // a cycle: Load refuses those
}

uint64_t CheckpointCatalog::Of(const Namespace& ns, const Inode* n) {
  for (int steps = 0; n && steps < 100000; steps++) {
    if (n->rec.ckpt_ord > 0) return n->rec.ckpt_ord;
    if (n->rec.ino == meta::kRootIno) return 0;
    n = ns.Find(n->rec.parent);
  }
  return 0;
}

uint64_t CheckpointCatalog::KeptFrom(const Namespace& ns, bool saving) {
  if (policy_.keep_in_memory == 0) return 0;
  std::set<uint64_t> with_files, being_written;
  for (auto& [ino, n] : ns.all()) {
    if (n->is_dir() || n->rec.nlink == 0) continue;
    const uint64_t ord = Of(ns, n.get());
    if (ord == 0) continue;
    with_files.insert(ord);
    if (n->writers > 0 || n->data_gen != n->sealed_gen) being_written.insert(ord);
  }
  if (saving && !with_files.empty()) being_written.insert(*with_files.rbegin());
  std::vector<uint64_t> ords;
  for (uint64_t ord : with_files)
    if (!being_written.contains(ord)) ords.push_back(ord);
  // None complete (the first save, or a save right after the last
  // complete one was removed): every checkpoint goes last.
  if (ords.empty()) return with_files.empty() ? 0 : *with_files.begin();
  const size_t k = std::min<size_t>(ords.size(), policy_.keep_in_memory);
  std::nth_element(ords.begin(), ords.begin() + static_cast<std::ptrdiff_t>(k - 1), ords.end(), std::greater<>());
  return ords[k - 1];
}

void InodeTable::set_checkpoint_policy(CheckpointPolicy p) {
  MutexLock lk(&mu());
  core_.ckpts.set_policy(std::move(p));
}

void InodeTable::SetReplicated(std::function<bool(uint64_t ino, uint64_t version)> fn) {
  MutexLock lk(&mu());
  core_.ckpts.replicated = fn;
  core_.replicated = std::move(fn);
}

std::vector<CheckpointInfo> InodeTable::Checkpoints(const std::regex& pattern) {
  MutexLock lk(&mu());
  // What passthrough writers wrote counts (sizes, open files).
  for (uint64_t ino : core_.passthrough.Writers()) core_.Find(ino);
  return core_.ckpts.List(core_.ns, pattern, [this](const std::string& path) { return core_.oplog.LostUnder(path); });
}

Result<InodeTable::PersistQueued> InodeTable::PersistCheckpoint(uint64_t ino, Caller who) {
  if (auto st = core_.Writable(); !st) return Err(st.error());
  MutexLock lk(&mu());
  Inode* root = core_.Find(ino);
  if (!root) return Err(ENOENT);
  while (!root->rec.memory_only) {
    if (root->rec.ino == meta::kRootIno) return Err(EALREADY);
    root = core_.Find(root->rec.parent);
    if (!root) return Err(EALREADY);
  }
  // The outermost memory-only checkpoint: one renamed into another is
  // persisted with it (the backend never holds half of the outer one).
  for (Inode* up = root; up->rec.ino != meta::kRootIno;) {
    up = core_.Find(up->rec.parent);
    if (!up) break;
    if (up->rec.memory_only) root = up;
  }
  if (who.uid != 0 && who.uid != geteuid() && who.uid != root->rec.uid) return Err(EPERM);
  PersistQueued out;
  out.path = root->is_dir() ? core_.ns.DirPath(root->rec.ino) : core_.ns.EntryPath(root->rec.parent, root->rec.name);
  // Directories before what they hold, as they were made; each sealed
  // version once, under its first name (PersistEntry links the others).
  Batch b;
  std::vector<LogEntry> log;
  std::unordered_set<Inode*> queued;  // files logged (a hard-linked one is met once per name)
  std::vector<Inode*> flagged;        // memory-only checkpoints at or below the root
  std::vector<std::pair<Inode*, std::string>> stack{{root, out.path}};
  while (!stack.empty()) {
    auto [n, path] = stack.back();
    stack.pop_back();
    if (n->rec.memory_only) {
      flagged.push_back(n);
      if (n->is_dir() || n->rec.state != DataState::kMemoryOnly) {
        InodeRecord r = n->rec;
        r.memory_only = false;
        MetaStore::PutInode(&b, r);
      }
    }
    if (n->is_dir() || S_ISLNK(n->rec.mode)) {
      core_.oplog.Append(&b, VersionStore::MakeEntry(n->rec, path), &log);
      for (auto it = n->children.rbegin(); it != n->children.rend(); ++it)
        if (Inode* c = core_.Find(it->second)) stack.emplace_back(c, path + "/" + it->first);
    } else if (S_ISREG(n->rec.mode) && n->rec.state == DataState::kMemoryOnly && queued.insert(n).second) {
      InodeRecord r = n->rec;
      r.state = *NextState(r.state, FileEvent::kQueue);
      r.memory_only = false;
      MetaStore::PutInode(&b, r);
      core_.oplog.Append(&b, core_.versions.PersistEntry(core_.ns, n), &log);
      out.files++;
      out.bytes += n->rec.sealed_size;
    }
  }
  std::vector<std::pair<Inode*, uint64_t>> seqs;
  for (const LogEntry& e : log)
    if (e.op == LogOp::kPersist) seqs.emplace_back(core_.Find(e.ino), e.seq);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  for (Inode* n : flagged) n->rec.memory_only = false;
  for (auto [n, seq] : seqs) {
    Transition(n, FileEvent::kQueue);
    n->seal_seq = seq;
  }
  LOG_INFO("'{}': memory-only checkpoint queued for the backend ({} files, {} bytes)", out.path, out.files, out.bytes);
  return out;
}

}  // namespace ckpt::fs
