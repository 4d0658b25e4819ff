// inode_table.cc — namespace operations over the in-memory inode map, each
// committed to fs/meta as one Batch before the map changes.
#include "fs/inode_table.h"

#include <set>
#include <thread>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/xattr.h>
#include <time.h>

#include <set>

#include "common/failpoint.h"
#include "common/log.h"

namespace ckpt::fs {

using meta::Batch;
using meta::MetaStore;

using meta::DataState;
using meta::LogEntry;
using meta::LogOp;

namespace {
constexpr char kNextInoCounter[] = "next_ino";
constexpr char kAppliedCounter[] = "applied_seq";
constexpr char kImportedCounter[] = "imported";

Status CheckName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return Err(EINVAL);
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  if (name.find('/') != std::string_view::npos) return Err(EINVAL);
  return {};
}
}  // namespace

meta::Timespec InodeTable::Now() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return meta::Timespec{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
}

InodeTable::Inode* InodeTable::Find(uint64_t ino) {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : it->second.get();
}

Result<InodeTable::Inode*> InodeTable::FindDir(uint64_t ino) {
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (!n->is_dir()) return Err(ENOTDIR);
  return n;
}

Result<InodeTable::Inode*> InodeTable::Child(Inode* dir, std::string_view name) {
  auto it = dir->children.find(name);
  if (it == dir->children.end()) return Err(ENOENT);
  Inode* c = Find(it->second);
  if (!c) abort();  // broken invariant: a directory entry without its inode
  return c;
}

Status InodeTable::Writable() const {
  return read_only_.load(std::memory_order_relaxed) ? Err(EROFS) : Status{};
}

std::string InodeTable::ReadOnlyReason() {
  std::lock_guard lk(ro_mu_);
  return ro_reason_;
}

Status InodeTable::Commit(const Batch& b, bool sync) {
  auto st = store_->Commit(b, sync);
  if (st || read_only_.exchange(true)) return st;
  // LevelDB's sticky background error: after the store refused a write,
  // the in-memory namespace and the record may differ; going on would
  // acknowledge changes a restart forgets.
  std::string why = fmt::format("metadata write failed ({}); the mount is read-only until remounted",
                                strerror(st.error()));
  LOG_ERROR("{}", why);
  std::lock_guard lk(ro_mu_);
  ro_reason_ = why;
  return st;
}

namespace {
bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; k++) {
      auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}
}  // namespace

Status InodeTable::CheckNewName(uint64_t parent, std::string_view name, size_t subtree) {
  if (parent == meta::kRootIno && name.starts_with(kReservedRootPrefix)) return Err(EPERM);
  if (limits_.utf8_names && !ValidUtf8(name)) return Err(EILSEQ);
  size_t len = DirPath(parent).size();
  len += (len ? 1 : 0) + name.size() + (subtree ? 1 + subtree : 0);
  if (len > limits_.max_path) return Err(ENAMETOOLONG);
  return {};
}

size_t InodeTable::SubtreePathLen(const Inode* n) {
  size_t longest = 0;
  std::vector<std::pair<const Inode*, size_t>> stack{{n, 0}};
  while (!stack.empty()) {
    auto [d, base] = stack.back();
    stack.pop_back();
    for (auto& [name, ino] : d->children) {
      size_t len = base + (base ? 1 : 0) + name.size();
      longest = std::max(longest, len);
      const Inode* c = Find(ino);
      if (c && c->is_dir()) stack.emplace_back(c, len);
    }
  }
  return longest;
}

Status InodeTable::Load(Caller root_owner) {
  std::lock_guard lk(mu_);
  auto next = store_->GetCounter(kNextInoCounter);
  if (!next) return Err(next.error());
  next_ino_ = std::max<uint64_t>(*next, meta::kRootIno + 1);

  auto st = store_->ForEachInode([&](InodeRecord&& r) {
    auto n = std::make_unique<Inode>();
    n->rec = std::move(r);
    next_ino_ = std::max(next_ino_, n->rec.ino + 1);
    if (S_ISREG(n->rec.mode)) lru_.emplace(0, n->rec.ino);
    inodes_[n->rec.ino] = std::move(n);
  });
  if (!st) return st;

  Batch fix;
  st = store_->ForEachDentry([&](uint64_t parent, std::string_view name, meta::DentryValue v) {
    Inode* p = Find(parent);
    if (!p || !p->is_dir() || !Find(v.ino)) {
      LOG_ERROR("metadata: dropping entry '{}' in dir ino {} (points at missing ino {})", name, parent, v.ino);
      MetaStore::DeleteDentry(&fix, parent, name);
      return;
    }
    p->children.emplace(std::string(name), v.ino);
  });
  if (!st) return st;
  // Every parent chain must end at the root. A cycle (damaged or edited
  // metadata) would make every path walk loop, allocating without bound:
  // refuse the state dir instead.
  for (auto& [ino, n] : inodes_) {
    uint64_t cur = ino;
    for (size_t steps = 0; cur != meta::kRootIno; steps++) {
      Inode* c = Find(cur);
      if (!c) break;  // a dangling parent: the path stops there
      if (steps > inodes_.size()) {
        LOG_ERROR("metadata: the parents of ino {} ('{}') form a cycle; the state dir is damaged", ino, n->rec.name);
        return Err(EUCLEAN);
      }
      cur = c->rec.parent;
    }
  }
  st = store_->ForEachXattr([&](uint64_t ino, std::string_view name, std::string_view value) {
    if (Inode* n = Find(ino)) n->xattrs.emplace(std::string(name), std::string(value));
  });
  if (!st) return st;

  auto applied = store_->GetCounter(kAppliedCounter);
  if (!applied) return Err(applied.error());
  applied_seq_ = *applied;
  next_seq_ = applied_seq_ + 1;
  st = store_->ForEachLogEntry([&](LogEntry&& e) {
    next_seq_ = std::max(next_seq_, e.seq + 1);
    if (e.op == LogOp::kPersist)
      if (Inode* n = Find(e.ino)) n->seal_seq = e.seq;
    log_.push_back(std::move(e));
  });
  if (!st) return st;

  if (!Find(meta::kRootIno)) {
    auto root = std::make_unique<Inode>();
    InodeRecord& r = root->rec;
    r.ino = r.parent = meta::kRootIno;
    r.mode = S_IFDIR | 0755;
    r.uid = root_owner.uid;
    r.gid = root_owner.gid;
    r.nlink = 2;
    r.atime = r.mtime = r.ctime = Now();
    r.state = meta::DataState::kPersisted;
    MetaStore::PutInode(&fix, r);
    inodes_[meta::kRootIno] = std::move(root);
  }

  // Orphans: inodes no name holds (unlinked while open, then the daemon
  // stopped). Their bytes are unreachable; free them.
  std::vector<uint64_t> orphans;
  for (auto& [ino, n] : inodes_)
    if (n->rec.nlink == 0 && ino != meta::kRootIno) orphans.push_back(ino);
  for (uint64_t ino : orphans) {
    Inode* n = Find(ino);
    MetaStore::DeleteInode(&fix, ino);
    for (auto& [k, v] : n->xattrs) MetaStore::DeleteXattr(&fix, ino, k);
    // Its pending version still drains: without its bytes kept aside, a
    // close that returned would end as "lost". Refuse to go on instead.
    if (S_ISREG(n->rec.mode))
      if (auto p = Preserve(n, false); !p) return p;
    tier_->Remove(ino);
    EraseInode(n);
  }
  MetaStore::PutCounter(&fix, kNextInoCounter, next_ino_);
  if (auto c = Commit(fix, true); !c) return c;

  // The tier against the metadata: every regular file's bytes, and the
  // snapshots the pending log needs. Lost files leave the namespace here.
  std::unordered_map<uint64_t, uint64_t> sizes;  // tier key -> st_size
  for (auto [key, size] : tier_->attached()) sizes[key] = size;
  std::set<uint64_t> wanted;
  for (const LogEntry& e : log_)
    if (e.op == LogOp::kPersist) wanted.insert(cache::SnapKey(e.ino, e.version));
  for (auto [key, size] : sizes) {
    if (!tier_->Has(key)) continue;  // removed above (an orphan inode's bytes)
    if (cache::IsSnapKey(key)) {
      Inode* n = Find(cache::SnapIno(key));
      bool current = n && S_ISREG(n->rec.mode) && cache::SnapMatches(key, n->rec.ino, n->rec.version);
      if (!wanted.count(key) && !current) tier_->Remove(key);  // published before the daemon stopped
      continue;
    }
    Inode* n = Find(key);
    if (!n || !S_ISREG(n->rec.mode)) {
      // Never deleted: the metadata may be what is wrong. The operator
      // finds them in orphans/ (counted by `ckptfs status`).
      if (auto o = tier_->Orphan(key); !o) {
        LOG_ERROR("tier: cannot move the file of unknown ino {:016x} to orphans/: {}", key, strerror(o.error()));
        return o;
      }
      LOG_WARN("tier: file of unknown ino {:016x} ({} bytes) moved to {}/orphans/", key, size, tier_->dir());
    }
  }
  Batch rec;
  std::vector<Inode*> files;
  for (auto& [ino, n] : inodes_)
    if (S_ISREG(n->rec.mode) && n->rec.nlink > 0) files.push_back(n.get());
  std::vector<Inode*> lost;
  for (Inode* n : files)
    if (!RecoverFile(n, sizes, &rec)) lost.push_back(n);
  if (!lost.empty()) AdoptPublished(&lost, &rec);
  std::vector<LogEntry> unlinks;
  for (Inode* n : lost) DropLost(n, "not persisted, and its bytes are not in the memory tier", &rec, &unlinks);
  st = store_->ForEachLost([&](uint64_t seq, std::string_view path, std::string_view) {
    next_lost_ = std::max(next_lost_, seq + 1);
    lost_.emplace_back(path);
  });
  if (!st) return st;
  st = store_->ForEachFailed([&](uint64_t seq, std::string_view path, std::string_view reason) {
    next_failed_ = std::max(next_failed_, seq + 1);
    failed_[seq] = FailedEntry{std::string(path), std::string(reason)};
  });
  if (!st) return st;
  FAILPOINT("load.recovery");
  if (!rec.empty())
    if (auto c = Commit(rec, true); !c) return c;
  for (auto& e : unlinks) log_.push_back(std::move(e));
  // Where the backend holds each file: its current path, unless a pending
  // entry may have moved or removed it there (then found on demand).
  bool moves = std::any_of(log_.begin(), log_.end(), [](const LogEntry& e) {
    return e.op == LogOp::kRename || e.op == LogOp::kUnlink || e.op == LogOp::kRmdir || e.op == LogOp::kLink;
  });
  if (!moves)
    for (auto& [ino, n] : inodes_)
      if (S_ISREG(n->rec.mode) && n->rec.nlink > 0 &&
          (n->rec.state == DataState::kPersisted || n->rec.state == DataState::kRemote))
        SetBackendPath(n.get(), EntryPath(n->rec.parent, n->rec.name));
  LOG_INFO("namespace loaded: {} inodes, next ino {}, {} log entries pending", inodes_.size(), next_ino_,
           log_.size());
  return {};
}

bool InodeTable::RecoverFile(Inode* n, const std::unordered_map<uint64_t, uint64_t>& sizes, Batch* b) {
  InodeRecord& r = n->rec;
  const uint64_t ino = r.ino;
  const std::string path = EntryPath(r.parent, r.name);
  const uint64_t snap = cache::SnapKey(ino, r.version);
  const bool pending = SealPending(n);
  auto live = sizes.find(ino);
  InodeRecord before = r;
  if (r.state == DataState::kDraining) r.state = DataState::kDirty;  // a transfer in flight starts over
  if (tier_->Has(snap)) {
    // Being rewritten when the daemon stopped: the last close's version
    // is the snapshot; what was written since was never sealed.
    if (live != sizes.end()) tier_->Remove(ino);
    if (auto st = tier_->Rekey(snap, ino); !st) {
      LOG_ERROR("ino {} '{}': cannot restore version {}: {}", ino, path, r.version, strerror(st.error()));
      return false;
    }
    r.size = r.sealed_size = sizes.at(snap);
    r.state = pending ? DataState::kDirty : DataState::kPersisted;
    LOG_WARN("ino {} '{}': open for writing when the daemon stopped; back to version {} ({} bytes), sealed at its "
             "last close", ino, path, r.version, r.size);
  } else if (pending) {
    // Sealed, not yet in the backend: the live file is that version.
    if (live == sizes.end()) return false;
    if (live->second < r.sealed_size) {
      LOG_ERROR("ino {} '{}': the memory tier holds {} of the {} bytes sealed", ino, path, live->second,
                r.sealed_size);
      tier_->Remove(ino);
      return false;
    }
    if (live->second > r.sealed_size) (void)tier_->Truncate(ino, r.sealed_size);
    r.size = r.sealed_size;
    r.state = DataState::kDirty;
  } else if (r.state == DataState::kDirty) {
    // Written since its last seal and never closed again (or never
    // closed at all): keep what the last close sealed.
    if (live != sizes.end()) tier_->Remove(ino);
    if (r.version == 0) {
      LOG_WARN("ino {} '{}': created but never closed before the daemon stopped", ino, path);
      return false;
    }
    r.size = r.sealed_size;
    r.state = DataState::kRemote;
    LOG_WARN("ino {} '{}': open for writing when the daemon stopped; back to version {} (in the backend)", ino,
             path, r.version);
  } else if (r.state == DataState::kPersisted) {
    if (live == sizes.end() || live->second != r.size) {
      if (live != sizes.end()) {
        LOG_WARN("ino {} '{}': tier holds {} bytes, {} expected; reading it from the backend", ino, path,
                 live->second, r.size);
        tier_->Remove(ino);
      }
      r.state = DataState::kRemote;  // fetched again on the next read
    }
  } else if (r.state == DataState::kRemote && live != sizes.end()) {
    tier_->Remove(ino);  // a fetch cut short
  } else if (r.state == DataState::kFailed) {
    // The backend refused it; the tier holds the only copy.
    if (live == sizes.end() || live->second != r.size) {
      if (live != sizes.end()) tier_->Remove(ino);
      return false;
    }
  }
  if (r.state != before.state || r.size != before.size || r.sealed_size != before.sealed_size)
    MetaStore::PutInode(b, r);
  return true;
}

void InodeTable::AdoptPublished(std::vector<Inode*>* lost, Batch* b) {
  // The daemon can die after the backend rename and before the RocksDB
  // commit: the version is in the backend, only the record says otherwise.
  // It is that version if name, size, mtime (ns) and a checksum match.
  if (!backend_) return;
  std::unordered_map<std::string, backend::Entry> files;
  auto st = backend_->List([&](const backend::Entry& e) {
    if (e.type == backend::Entry::Type::kFile && e.has_checksum) files.emplace(e.path, e);
  });
  if (!st) {
    LOG_WARN("recovery: cannot list the backend ({}); files not in the tier count as lost", strerror(st.error()));
    return;
  }
  std::erase_if(*lost, [&](Inode* n) {
    InodeRecord& r = n->rec;
    auto it = std::find_if(log_.begin(), log_.end(), [&](const LogEntry& e) { return e.seq == n->seal_seq; });
    if (r.version == 0 || it == log_.end() || it->op != LogOp::kPersist || it->version != r.version) return false;
    auto f = files.find(it->path);
    if (f == files.end() || f->second.size != r.sealed_size || f->second.mtime_sec != it->mtime.sec ||
        f->second.mtime_nsec != it->mtime.nsec)
      return false;
    LOG_WARN("ino {} '{}': version {} was published before the daemon stopped; taken from the backend", r.ino,
             it->path, r.version);
    r.size = r.sealed_size;
    r.state = DataState::kRemote;
    r.checksum_hi = f->second.checksum_hi;
    r.checksum_lo = f->second.checksum_lo;
    MetaStore::PutInode(b, r);
    MetaStore::DeleteLog(b, it->seq);
    log_.erase(it);
    n->seal_seq = 0;
    return true;
  });
}

void InodeTable::DropLost(Inode* n, std::string_view reason, Batch* b, std::vector<LogEntry>* out) {
  // Every name of the file goes; directories keep their other entries.
  std::vector<std::pair<Inode*, std::string>> names;
  for (auto& [dino, d] : inodes_) {
    if (!d->is_dir()) continue;
    for (auto& [name, child] : d->children)
      if (child == n->rec.ino) names.emplace_back(d.get(), name);
  }
  for (auto& [d, name] : names) {
    std::string path = EntryPath(d->rec.ino, name);
    LOG_ERROR("ino {} '{}': lost ({}); removed from the namespace", n->rec.ino, path, reason);
    MetaStore::PutLost(b, next_lost_++, path, reason);
    lost_.push_back(path);
    MetaStore::DeleteDentry(b, d->rec.ino, name);
    d->children.erase(d->children.find(name));
    LogEntry e;
    e.op = LogOp::kUnlink;
    e.ino = n->rec.ino;
    e.path = path;
    AppendLog(b, e, out);
  }
  MetaStore::DeleteInode(b, n->rec.ino);
  for (auto& [k, v] : n->xattrs) MetaStore::DeleteXattr(b, n->rec.ino, k);
  tier_->Remove(n->rec.ino);
  EraseInode(n);
}

void InodeTable::FillStat(const InodeRecord& r, struct stat* st) {
  *st = {};
  st->st_ino = r.ino;
  st->st_mode = r.mode;
  st->st_nlink = r.nlink;
  st->st_uid = r.uid;
  st->st_gid = r.gid;
  st->st_rdev = r.rdev;
  st->st_size = static_cast<off_t>(S_ISLNK(r.mode) ? r.target.size() : r.size);
  st->st_blksize = 1 << 20;
  uint64_t alloc = S_ISREG(r.mode) ? tier_->AllocatedBytes(r.ino) : 0;
  if (S_ISREG(r.mode) && r.state == meta::DataState::kRemote) alloc = r.size;
  st->st_blocks = static_cast<blkcnt_t>((alloc + 511) / 512);
  st->st_atim = {r.atime.sec, r.atime.nsec};
  st->st_mtim = {r.mtime.sec, r.mtime.nsec};
  st->st_ctim = {r.ctime.sec, r.ctime.nsec};
}

Result<InodeRecord> InodeTable::Lookup(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  std::lock_guard lk(mu_);
  auto dir = FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* c;
  if (name == ".") c = *dir;
  else if (name == "..") c = Find((*dir)->rec.parent);
  else {
    auto r = Child(*dir, name);
    if (!r) return Err(r.error());
    c = *r;
  }
  if (!c) return Err(ENOENT);
  c->nlookup++;
  return c->rec;
}

Result<InodeRecord> InodeTable::LookupForReaddir(uint64_t ino) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  n->nlookup++;
  return n->rec;
}

void InodeTable::Forget(uint64_t ino, uint64_t count) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return;
  if (n->nlookup < count) {
    LOG_ERROR("ino {}: forget {} exceeds lookup count {}", ino, count, n->nlookup);
    n->nlookup = 0;
  } else {
    n->nlookup -= count;
  }
  MaybeDelete(n);
}

void InodeTable::MaybeDelete(Inode* n) {
  if (n->rec.nlink > 0 || n->nlookup > 0 || n->opens > 0 || n->rec.ino == meta::kRootIno) return;
  uint64_t ino = n->rec.ino;
  // A sealed version still on its way to the backend outlives its file.
  // If it cannot be kept, the tier file stays (under its ino, reported at
  // the next start-up) rather than the promised bytes going silently.
  bool keep_live = false;
  if (S_ISREG(n->rec.mode))
    if (auto p = Preserve(n, false); !p) {
      keep_live = true;
      LOG_ERROR("ino {}: its pending version {} could not be kept for the drain ({}); its tier file stays",
                ino, n->rec.version, strerror(p.error()));
    }
  Batch b;
  MetaStore::DeleteInode(&b, ino);
  for (auto& [k, v] : n->xattrs) MetaStore::DeleteXattr(&b, ino, k);
  if (auto st = Commit(b); !st) {
    // The orphan stays recorded and is purged at the next Load.
    LOG_ERROR("ino {}: could not delete metadata: {}", ino, strerror(st.error()));
  }
  if (S_ISREG(n->rec.mode) && !keep_live) tier_->Remove(ino);
  EraseInode(n);
}

void InodeTable::PurgeOrphans() {
  std::lock_guard lk(mu_);
  std::vector<Inode*> gone;
  for (auto& [ino, n] : inodes_)
    if (n->rec.nlink == 0) gone.push_back(n.get());
  for (Inode* n : gone) {
    n->nlookup = 0;
    n->opens = 0;
    MaybeDelete(n);
  }
}

Result<InodeRecord> InodeTable::GetAttr(uint64_t ino) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  return n->rec;
}

Result<InodeRecord> InodeTable::SetAttr(uint64_t ino, const AttrChange& c) {
  if (auto st = Writable(); !st) return Err(st.error());
  if ((c.to_set & kSetSize) && c.size > limits_.max_file_size) return Err(EFBIG);
  std::unique_lock lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if ((c.to_set & kSetSize) && S_ISREG(n->rec.mode) && n->rec.state == DataState::kRemote && c.size != 0) {
    if (auto st = EnsureLocal(lk, ino); !st) return Err(st.error());
    n = Find(ino);
    if (!n) return Err(ENOENT);
  }
  InodeRecord r = n->rec;
  meta::Timespec now = Now();
  if (c.to_set & kSetMode) r.mode = (r.mode & S_IFMT) | (c.mode & 07777);
  if (c.to_set & kSetUid) r.uid = c.uid;
  if (c.to_set & kSetGid) r.gid = c.gid;
  if (c.to_set & (kSetUid | kSetGid)) {
    // chown clears set-user-ID and (for group-executable files) set-group-ID.
    if (!S_ISDIR(r.mode)) {
      r.mode &= ~S_ISUID;
      if (r.mode & S_IXGRP) r.mode &= ~S_ISGID;
    }
  }
  if (c.to_set & kSetSize) {
    if (S_ISDIR(r.mode)) return Err(EISDIR);
    if (!S_ISREG(r.mode)) return Err(EINVAL);
    // Keep the sealed version first: truncate(2) of a file nobody writes
    // moves it aside (or copies, if bytes stay); a writer that opened the
    // file already preserved it, unless its close sealed again since.
    if (auto st = n->writers == 0 ? Preserve(n, c.size != 0) : BeforeMutation(n); !st) return Err(st.error());
    if (auto st = tier_->Truncate(ino, c.size); !st) return Err(st.error());
    r.size = c.size;
    r.mtime = now;
    r.state = DataState::kDirty;
    n->data_gen++;
  }
  if (c.to_set & kSetAtime) r.atime = c.atime;
  if (c.to_set & kSetMtime) r.mtime = c.mtime;
  r.ctime = now;
  n->rec = r;
  Batch b;
  std::vector<LogEntry> log;
  if ((c.to_set & kSetSize) && n->opens == 0 && r.nlink > 0) {
    Seal(n, &b, &log);  // truncate(2) of a closed file: a new version now
  } else if ((c.to_set & (kSetMode | kSetMtime | kSetUid | kSetGid)) && r.nlink > 0 &&
             (S_ISREG(r.mode) || S_ISDIR(r.mode)) && ino != meta::kRootIno) {
    LogEntry e;
    e.op = LogOp::kSetattr;
    e.ino = ino;
    e.mode = n->rec.mode;
    e.mtime = n->rec.mtime;
    e.uid = n->rec.uid;
    e.gid = n->rec.gid;
    e.has_owner = true;
    e.path = S_ISDIR(r.mode) ? DirPath(ino) : EntryPath(r.parent, r.name);
    AppendLog(&b, e, &log);
  }
  MetaStore::PutInode(&b, n->rec);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  n->size_dirty = false;
  return n->rec;
}

Result<InodeRecord> InodeTable::NewNode(uint64_t parent, std::string_view name, uint32_t mode, Caller who,
                                        std::string_view target, uint64_t rdev) {
  if (auto st = CheckName(name); !st) return Err(st.error());
  if (auto st = Writable(); !st) return Err(st.error());
  std::lock_guard lk(mu_);
  auto dir = FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  if (p->rec.nlink == 0) return Err(ENOENT);  // creating in a removed directory
  if (p->children.count(name)) return Err(EEXIST);
  if (auto st = CheckNewName(parent, name); !st) return Err(st.error());

  auto n = std::make_unique<Inode>();
  InodeRecord& r = n->rec;
  r.ino = next_ino_;
  r.parent = parent;
  r.name = std::string(name);
  r.mode = mode;
  r.uid = who.uid;
  r.gid = who.gid;
  if (p->rec.mode & S_ISGID) {  // BSD group semantics in set-group-ID directories
    r.gid = p->rec.gid;
    if (S_ISDIR(mode)) r.mode |= S_ISGID;
  }
  r.nlink = S_ISDIR(mode) ? 2 : 1;
  r.rdev = rdev;
  r.target = std::string(target);
  r.atime = r.mtime = r.ctime = Now();
  r.state = S_ISREG(mode) ? meta::DataState::kDirty : meta::DataState::kPersisted;

  InodeRecord pr = p->rec;
  Touch(p, r.mtime);
  pr.mtime = pr.ctime = r.mtime;
  if (S_ISDIR(mode)) pr.nlink++;

  Batch b;
  std::vector<LogEntry> log;
  if (S_ISDIR(mode) || S_ISLNK(mode)) {
    LogEntry e;
    e.op = S_ISDIR(mode) ? LogOp::kMkdir : LogOp::kSymlink;
    e.ino = r.ino;
    e.mode = r.mode;
    e.uid = r.uid;
    e.gid = r.gid;
    e.has_owner = true;
    e.path = EntryPath(parent, name);
    e.path2 = r.target;
    AppendLog(&b, e, &log);
  }
  MetaStore::PutInode(&b, r);
  MetaStore::PutInode(&b, pr);
  MetaStore::PutDentry(&b, parent, name, r.ino, DirentType(mode));
  MetaStore::PutCounter(&b, kNextInoCounter, next_ino_ + 1);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  if (S_ISREG(mode)) n->data_gen = 1;  // a new file is sealed at its first close

  next_ino_++;
  p->rec = pr;
  p->children.emplace(std::string(name), r.ino);
  n->nlookup = 1;
  InodeRecord out = r;
  if (S_ISREG(r.mode)) lru_.emplace(0, r.ino);
  inodes_[r.ino] = std::move(n);
  return out;
}

Result<InodeRecord> InodeTable::Mknod(uint64_t parent, std::string_view name, uint32_t mode, uint64_t rdev,
                                      Caller who) {
  if (S_ISDIR(mode) || S_ISLNK(mode)) return Err(EINVAL);
  if ((mode & S_IFMT) == 0) mode |= S_IFREG;
  return NewNode(parent, name, mode, who, {}, rdev);
}

Result<InodeRecord> InodeTable::Mkdir(uint64_t parent, std::string_view name, uint32_t mode, Caller who) {
  return NewNode(parent, name, S_IFDIR | (mode & 07777), who, {}, 0);
}

Result<InodeRecord> InodeTable::Symlink(uint64_t parent, std::string_view name, std::string_view target,
                                        Caller who) {
  if (target.empty()) return Err(ENOENT);
  if (target.size() >= 4096) return Err(ENAMETOOLONG);
  return NewNode(parent, name, S_IFLNK | 0777, who, target, 0);
}

Result<std::string> InodeTable::Readlink(uint64_t ino) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (!S_ISLNK(n->rec.mode)) return Err(EINVAL);
  return n->rec.target;
}

Result<InodeRecord> InodeTable::Link(uint64_t ino, uint64_t newparent, std::string_view newname) {
  if (auto st = CheckName(newname); !st) return Err(st.error());
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (n->is_dir()) return Err(EPERM);
  auto dir = FindDir(newparent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  if (p->rec.nlink == 0) return Err(ENOENT);
  if (p->children.count(newname)) return Err(EEXIST);
  if (n->rec.nlink >= 65000) return Err(EMLINK);
  if (auto st = Writable(); !st) return Err(st.error());
  if (auto st = CheckNewName(newparent, newname); !st) return Err(st.error());

  meta::Timespec now = Now();
  InodeRecord r = n->rec, pr = p->rec;
  r.nlink++;
  r.ctime = now;
  if (r.nlink == 1) {  // re-linking an unlinked-but-open file is not allowed by the kernel, but be safe
    r.parent = newparent;
    r.name = std::string(newname);
  }
  pr.mtime = pr.ctime = now;
  Batch b;
  std::vector<LogEntry> log;
  LogEntry e;
  e.op = LogOp::kLink;
  e.ino = ino;
  e.path = EntryPath(n->rec.parent, n->rec.name);
  e.path2 = EntryPath(newparent, newname);
  AppendLog(&b, e, &log);
  MetaStore::PutInode(&b, r);
  MetaStore::PutInode(&b, pr);
  MetaStore::PutDentry(&b, newparent, newname, ino, DirentType(r.mode));
  if (auto st = CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  n->rec = r;
  p->rec = pr;
  p->children.emplace(std::string(newname), ino);
  n->nlookup++;
  return r;
}

void InodeTable::RepointPrimary(Inode* n, uint64_t gone_parent, std::string_view gone_name) {
  if (n->rec.parent != gone_parent || n->rec.name != gone_name || n->rec.nlink == 0) return;
  // Rare: the first link of a hard-linked file went away; find another.
  for (auto& [dino, d] : inodes_) {
    if (!d->is_dir()) continue;
    for (auto& [cname, cino] : d->children) {
      if (cino == n->rec.ino && !(dino == gone_parent && cname == gone_name)) {
        n->rec.parent = dino;
        n->rec.name = cname;
        return;
      }
    }
  }
}

Status InodeTable::Unlink(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  if (auto st = Writable(); !st) return st;
  std::lock_guard lk(mu_);
  auto dir = FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  auto c = Child(p, name);
  if (!c) return Err(c.error());
  Inode* n = *c;
  if (n->is_dir()) return Err(EISDIR);

  meta::Timespec now = Now();
  InodeRecord pr = p->rec;
  pr.mtime = pr.ctime = now;
  Inode tmp;  // the inode's next record, computed before the commit
  tmp.rec = n->rec;
  tmp.rec.nlink--;
  tmp.rec.ctime = now;
  p->children.erase(p->children.find(name));  // so RepointPrimary skips it
  RepointPrimary(&tmp, parent, name);
  Batch b;
  std::vector<LogEntry> log;
  LogEntry e;
  e.op = LogOp::kUnlink;
  e.ino = n->rec.ino;
  e.path = EntryPath(parent, name);
  AppendLog(&b, e, &log);
  MetaStore::PutInode(&b, pr);
  MetaStore::DeleteDentry(&b, parent, name);
  MetaStore::PutInode(&b, tmp.rec);
  if (auto st = CommitWithLog(b, std::move(log)); !st) {
    p->children.emplace(std::string(name), n->rec.ino);
    return st;
  }
  p->rec = pr;
  n->rec = tmp.rec;
  MaybeDelete(n);
  return {};
}

Status InodeTable::Rmdir(uint64_t parent, std::string_view name) {
  if (name == ".") return Err(EINVAL);
  if (name == "..") return Err(ENOTEMPTY);
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  if (auto st = Writable(); !st) return st;
  std::lock_guard lk(mu_);
  auto dir = FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  auto c = Child(p, name);
  if (!c) return Err(c.error());
  Inode* n = *c;
  if (!n->is_dir()) return Err(ENOTDIR);
  if (!n->children.empty()) return Err(ENOTEMPTY);

  meta::Timespec now = Now();
  InodeRecord pr = p->rec, r = n->rec;
  pr.mtime = pr.ctime = now;
  pr.nlink--;
  r.nlink = 0;
  r.ctime = now;
  Batch b;
  std::vector<LogEntry> log;
  LogEntry e;
  e.op = LogOp::kRmdir;
  e.ino = r.ino;
  e.path = EntryPath(parent, name);
  AppendLog(&b, e, &log);
  MetaStore::PutInode(&b, pr);
  MetaStore::DeleteDentry(&b, parent, name);
  MetaStore::PutInode(&b, r);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return st;
  p->rec = pr;
  n->rec = r;
  p->children.erase(p->children.find(name));
  MaybeDelete(n);
  return {};
}

bool InodeTable::IsAncestor(uint64_t maybe_ancestor, uint64_t ino) {
  // Walks up from ino; true if maybe_ancestor is ino or above it.
  for (int depth = 0; depth < 100000; depth++) {
    if (ino == maybe_ancestor) return true;
    if (ino == meta::kRootIno) return false;
    Inode* n = Find(ino);
    if (!n) return false;
    ino = n->rec.parent;
  }
  abort();  // broken invariant: a cycle in the directory tree
}

Status InodeTable::Rename(uint64_t parent, std::string_view name, uint64_t newparent, std::string_view newname,
                          unsigned flags) {
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Err(EINVAL);
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) return Err(EINVAL);
  if (auto st = CheckName(newname); !st) return st;
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  std::lock_guard lk(mu_);
  auto sd = FindDir(parent);
  if (!sd) return Err(sd.error());
  auto dd = FindDir(newparent);
  if (!dd) return Err(dd.error());
  Inode *sp = *sd, *dp = *dd;
  auto sc = Child(sp, name);
  if (!sc) return Err(sc.error());
  Inode* src = *sc;
  Inode* dst = nullptr;
  if (auto it = dp->children.find(newname); it != dp->children.end()) dst = Find(it->second);

  if (dst == src) return {};  // same inode: POSIX says do nothing
  if (src->is_dir() && IsAncestor(src->rec.ino, newparent)) return Err(EINVAL);
  if (flags & RENAME_NOREPLACE && dst) return Err(EEXIST);
  if (flags & RENAME_EXCHANGE) {
    if (!dst) return Err(ENOENT);
    if (dst->is_dir() && IsAncestor(dst->rec.ino, parent)) return Err(EINVAL);
  } else if (dst) {
    if (src->is_dir() && !dst->is_dir()) return Err(ENOTDIR);
    if (!src->is_dir() && dst->is_dir()) return Err(EISDIR);
    if (dst->is_dir() && !dst->children.empty()) return Err(ENOTEMPTY);
  }
  if (auto st = Writable(); !st) return st;
  if (auto st = CheckNewName(newparent, newname, src->is_dir() ? SubtreePathLen(src) : 0); !st) return st;
  if (dst && (flags & RENAME_EXCHANGE))
    if (auto st = CheckNewName(parent, name, dst->is_dir() ? SubtreePathLen(dst) : 0); !st) return st;

  meta::Timespec now = Now();
  // Work on copies; commit; then apply. sp and dp may be the same inode.
  const bool same_dir = sp == dp;
  const bool exchange = flags & RENAME_EXCHANGE;
  InodeRecord spr = sp->rec, dpr = dp->rec, sr = src->rec;
  InodeRecord dr = dst ? dst->rec : InodeRecord{};
  InodeRecord* from = &spr;
  InodeRecord* to = same_dir ? &spr : &dpr;
  from->mtime = from->ctime = now;
  to->mtime = to->ctime = now;
  sr.ctime = now;
  dr.ctime = now;
  // A record's (parent, name) follows the link that moved; a directory has
  // exactly one link, so its parent always does.
  auto relink = [](InodeRecord& r, uint64_t p0, std::string_view n0, uint64_t p1, std::string_view n1) {
    if (r.parent == p0 && r.name == n0) {
      r.parent = p1;
      r.name = std::string(n1);
    }
    if (S_ISDIR(r.mode)) r.parent = p1;
  };
  Batch b;
  std::vector<LogEntry> log;
  {
    LogEntry e;
    e.op = LogOp::kRename;
    e.flags = exchange ? 1 : 0;
    e.ino = sr.ino;
    e.path = EntryPath(parent, name);
    e.path2 = EntryPath(newparent, newname);
    AppendLog(&b, e, &log);
  }
  if (exchange) {
    if (!same_dir && src->is_dir()) { from->nlink--; to->nlink++; }
    if (!same_dir && dst->is_dir()) { to->nlink--; from->nlink++; }
    relink(sr, parent, name, newparent, newname);
    relink(dr, newparent, newname, parent, name);
    MetaStore::PutDentry(&b, newparent, newname, sr.ino, DirentType(sr.mode));
    MetaStore::PutDentry(&b, parent, name, dr.ino, DirentType(dr.mode));
    MetaStore::PutInode(&b, dr);
  } else {
    if (dst && dst->is_dir()) {
      dr.nlink = 0;
      to->nlink--;
    } else if (dst) {
      dr.nlink--;
      Inode tmp;
      tmp.rec = dr;
      RepointPrimary(&tmp, newparent, newname);
      dr = tmp.rec;
    }
    if (!same_dir && src->is_dir()) { from->nlink--; to->nlink++; }
    relink(sr, parent, name, newparent, newname);
    MetaStore::DeleteDentry(&b, parent, name);
    MetaStore::PutDentry(&b, newparent, newname, sr.ino, DirentType(sr.mode));
    if (dst) MetaStore::PutInode(&b, dr);
  }
  MetaStore::PutInode(&b, sr);
  MetaStore::PutInode(&b, spr);
  if (!same_dir) MetaStore::PutInode(&b, dpr);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return st;

  sp->rec = spr;
  if (!same_dir) dp->rec = dpr;
  src->rec = sr;
  if (exchange) {
    dst->rec = dr;
    sp->children[std::string(name)] = dr.ino;
    dp->children[std::string(newname)] = sr.ino;
  } else {
    sp->children.erase(sp->children.find(name));
    dp->children[std::string(newname)] = sr.ino;
    if (dst) {
      dst->rec = dr;
      MaybeDelete(dst);
    }
  }
  return {};
}

Result<std::vector<DirEntry>> InodeTable::ListDir(uint64_t ino) {
  std::lock_guard lk(mu_);
  auto dir = FindDir(ino);
  if (!dir) return Err(dir.error());
  Inode* d = *dir;
  std::vector<DirEntry> out;
  out.reserve(d->children.size() + 2);
  out.push_back({".", d->rec.ino, S_IFDIR});
  out.push_back({"..", d->rec.parent, S_IFDIR});
  for (auto& [name, cino] : d->children) {
    Inode* c = Find(cino);
    out.push_back({name, cino, c ? c->rec.mode : 0});
  }
  return out;
}

Status InodeTable::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  if (name.empty() || name.size() > 255) return Err(ERANGE);
  if (value.size() > kMaxXattrValue) return Err(E2BIG);
  if (name.starts_with("user.ckptfs.")) return Err(EPERM);
  if (auto st = Writable(); !st) return st;
  if (auto st = Writable(); !st) return st;
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  bool exists = n->xattrs.count(name) != 0;
  if ((flags & XATTR_CREATE) && exists) return Err(EEXIST);
  if ((flags & XATTR_REPLACE) && !exists) return Err(ENODATA);
  InodeRecord r = n->rec;
  r.ctime = Now();
  Batch b;
  MetaStore::PutXattr(&b, ino, name, value);
  MetaStore::PutInode(&b, r);
  if (auto st = Commit(b); !st) return st;
  n->rec = r;
  n->xattrs[std::string(name)] = std::string(value);
  return {};
}

Result<std::string> InodeTable::GetXattr(uint64_t ino, std::string_view name) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (name == kStateXattr) {
    if (!S_ISREG(n->rec.mode)) return Err(ENODATA);
    return std::string(meta::DataStateName(n->rec.state));
  }
  auto it = n->xattrs.find(name);
  if (it == n->xattrs.end()) return Err(ENODATA);
  return it->second;
}

Result<std::string> InodeTable::ListXattr(uint64_t ino) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  std::string out;
  for (auto& [k, v] : n->xattrs) {
    out.append(k);
    out.push_back('\0');
  }
  return out;
}

Status InodeTable::RemoveXattr(uint64_t ino, std::string_view name) {
  if (name.starts_with("user.ckptfs.")) return Err(EPERM);
  if (auto st = Writable(); !st) return st;
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  auto it = n->xattrs.find(name);
  if (it == n->xattrs.end()) return Err(ENODATA);
  InodeRecord r = n->rec;
  r.ctime = Now();
  Batch b;
  MetaStore::DeleteXattr(&b, ino, name);
  MetaStore::PutInode(&b, r);
  if (auto st = Commit(b); !st) return st;
  n->rec = r;
  n->xattrs.erase(it);
  return {};
}

bool InodeTable::NeedsFetch(uint64_t ino, int flags) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  bool trunc = (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY;
  return n && S_ISREG(n->rec.mode) && n->rec.state == DataState::kRemote && !trunc;
}

Result<int> InodeTable::Open(uint64_t ino, int flags) {
  std::unique_lock lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (n->is_dir()) return Err(EISDIR);
  if (!S_ISREG(n->rec.mode)) return Err(ENXIO);
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  bool trunc = (flags & O_TRUNC) && writable;
  if (writable)
    if (auto st = Writable(); !st) return Err(st.error());
  bool was_remote = n->rec.state == DataState::kRemote;
  if (was_remote && !(trunc && !n->fetching)) {
    if (auto st = EnsureLocal(lk, ino); !st) return Err(st.error());
    n = Find(ino);
    if (!n) return Err(ENOENT);
  }
  if (writable && n->writers == 0) {
    // The sealed version the drain has not published stays as it is.
    if (auto st = Preserve(n, !trunc); !st) return Err(st.error());
    // Record "being rewritten" before any byte changes, so that a daemon
    // that dies now restarts from the last sealed version, not from torn
    // bytes it would otherwise take for that version.
    if (n->rec.state == DataState::kPersisted || n->rec.state == DataState::kRemote) {
      InodeRecord r = n->rec;
      r.state = DataState::kDirty;
      Batch b;
      MetaStore::PutInode(&b, r);
      if (auto st = Commit(b); !st) return Err(st.error());
      n->pre_open_state = n->rec.state;
      n->open_marked = true;
      n->rec.state = DataState::kDirty;
    }
  }
  auto fd = tier_->Pin(ino, true);
  if (!fd) return Err(fd.error());
  if (trunc && (n->rec.size != 0 || was_remote)) {
    if (auto st = tier_->Truncate(ino, 0); !st) {
      tier_->Unpin(ino);
      return Err(st.error());
    }
    n->rec.size = 0;
    n->rec.mtime = n->rec.ctime = Now();
    n->rec.state = DataState::kDirty;
    n->data_gen++;
    n->size_dirty = true;
  }
  n->opens++;
  if (writable) n->writers++;
  TouchLru(n);
  return *fd;
}

void InodeTable::Release(uint64_t ino, int open_flags) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return;
  tier_->Unpin(ino);
  n->opens--;
  if ((open_flags & O_ACCMODE) != O_RDONLY && n->writers > 0) n->writers--;
  TouchLru(n);
  if (n->rec.nlink > 0 && n->data_gen != n->sealed_gen) {
    if (auto st = SealNow(n); !st) LOG_ERROR("ino {}: could not seal at close: {}", ino, strerror(st.error()));
    // Still open for writing elsewhere: those writes must not reach the
    // version just sealed. If the copy fails now, the next write retries it
    // (BeforeMutation) and fails itself rather than touch sealed bytes.
    if (n->writers > 0)
      if (auto p = Preserve(n, true); !p)
        LOG_ERROR("ino {}: version {} not yet kept aside at close ({}); the next write retries", ino,
                  n->rec.version, strerror(p.error()));
  } else if (n->writers == 0 && n->open_marked && n->rec.nlink > 0) {
    // Opened for writing, closed unchanged: back to what it was.
    n->open_marked = false;
    n->rec.state = n->pre_open_state == DataState::kRemote && tier_->Has(ino) ? DataState::kPersisted
                                                                             : n->pre_open_state;
    Batch b;
    MetaStore::PutInode(&b, n->rec);
    if (auto st = Commit(b); !st) LOG_ERROR("ino {}: could not record state at close", ino);
    else n->size_dirty = false;
  } else if (n->size_dirty && n->rec.nlink > 0) {
    Batch b;
    MetaStore::PutInode(&b, n->rec);
    if (auto st = Commit(b); !st) LOG_ERROR("ino {}: could not record size at close", ino);
    else n->size_dirty = false;
  }
  MaybeDelete(n);
}

Result<size_t> InodeTable::Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int)>& fn,
                                 bool wait) {
  if (auto st = Writable(); !st) return Err(st.error());
  if (off > limits_.max_file_size || len > limits_.max_file_size - off) return Err(EFBIG);
  {
    // A write through a handle that outlived the seal (a dup'd fd after
    // close, mmap writeback): the sealed version is kept first.
    std::lock_guard lk(mu_);
    Inode* node = Find(ino);
    if (node)
      if (auto st = BeforeMutation(node); !st) return Err(st.error());
  }
  // The tier may wait for space here: never under mu_.
  auto n = tier_->Write(ino, off, len, fn, wait);
  if (!n) return n;
  std::lock_guard lk(mu_);
  Inode* node = Find(ino);
  if (!node) return n;
  node->rec.size = std::max(node->rec.size, off + *n);
  node->rec.mtime = node->rec.ctime = Now();
  node->rec.state = DataState::kDirty;
  node->data_gen++;
  // Writing clears set-user-ID and set-group-ID, as on local filesystems.
  if (node->rec.mode & (S_ISUID | S_ISGID)) node->rec.mode &= ~(S_ISUID | ((node->rec.mode & S_IXGRP) ? S_ISGID : 0));
  node->size_dirty = true;
  return n;
}

Status InodeTable::Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, bool wait) {
  if (auto st = Writable(); !st) return st;
  if (off > limits_.max_file_size || len > limits_.max_file_size - off) return Err(EFBIG);
  {
    std::lock_guard lk(mu_);
    Inode* n = Find(ino);
    if (!n) return Err(ENOENT);
    if (!S_ISREG(n->rec.mode)) return Err(ENODEV);
    if (auto st = BeforeMutation(n); !st) return st;
  }
  if (auto st = tier_->Fallocate(ino, mode, off, len, wait); !st) return st;
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return {};
  if (!(mode & FALLOC_FL_KEEP_SIZE)) n->rec.size = std::max(n->rec.size, off + len);
  n->rec.mtime = n->rec.ctime = Now();
  n->rec.state = DataState::kDirty;
  n->data_gen++;
  n->size_dirty = true;
  return {};
}

Status InodeTable::Flush(uint64_t ino, int open_flags) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  bool last_writer = (open_flags & O_ACCMODE) != O_RDONLY && n->writers == 1;
  if (last_writer && n->rec.nlink > 0 && n->data_gen != n->sealed_gen && S_ISREG(n->rec.mode)) return SealNow(n);
  if (!n->size_dirty) return {};
  Batch b;
  MetaStore::PutInode(&b, n->rec);
  if (auto st = Commit(b); !st) return st;
  n->size_dirty = false;
  return {};
}

Status InodeTable::BeforeMutation(Inode* n) {
  if (n->data_gen != n->sealed_gen || !SealPending(n)) return {};
  return Preserve(n, true);
}

Result<uint64_t> InodeTable::SyncSeal(uint64_t ino) {
  std::lock_guard lk(mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (n->rec.nlink > 0 && n->data_gen != n->sealed_gen && S_ISREG(n->rec.mode)) {
    if (auto st = SealNow(n); !st) return Err(st.error());
    if (n->writers > 0)  // the caller keeps writing: not into this version
      if (auto st = Preserve(n, true); !st) return Err(st.error());
  }
  // Everything logged so far, this file's seal included.
  return next_seq_ - 1;
}

Status InodeTable::SyncToBackend(uint64_t ino, bool wait) {
  auto seq = SyncSeal(ino);
  if (!seq) return Err(seq.error());
  if (!wait) return {};
  return WaitApplied(*seq) ? Status{} : Err(EIO);
}

void InodeTable::WhenApplied(uint64_t seq, std::function<void(int err)> fn) {
  int err = 0;
  {
    std::lock_guard lk(mu_);
    if (applied_seq_ < seq && !shutdown_) {
      applied_waiters_.emplace(seq, std::move(fn));
      return;
    }
    err = applied_seq_ >= seq ? 0 : EIO;
  }
  fn(err);
}

void InodeTable::AdvanceApplied(uint64_t seq, DueCallbacks* due) {
  applied_seq_ = seq;
  applied_cv_.notify_all();
  auto end = applied_waiters_.upper_bound(seq);
  for (auto it = applied_waiters_.begin(); it != end; ++it) due->fns.push_back(std::move(it->second));
  applied_waiters_.erase(applied_waiters_.begin(), end);
}

// ---- Paths and the log ----

std::string InodeTable::DirPath(uint64_t dir_ino) {
  std::vector<const std::string*> parts;
  for (uint64_t ino = dir_ino; ino != meta::kRootIno;) {
    Inode* n = Find(ino);
    if (!n || parts.size() > inodes_.size()) break;  // Load refused cycles; never loop
    parts.push_back(&n->rec.name);
    ino = n->rec.parent;
  }
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!out.empty()) out.push_back('/');
    out.append(**it);
  }
  return out;
}

std::string InodeTable::EntryPath(uint64_t parent, std::string_view name) {
  std::string p = DirPath(parent);
  if (!p.empty()) p.push_back('/');
  p.append(name);
  return p;
}

void InodeTable::AppendLog(Batch* b, LogEntry e, std::vector<LogEntry>* out) {
  e.seq = next_seq_++;
  MetaStore::PutLog(b, e);
  out->push_back(std::move(e));
}

Status InodeTable::CommitWithLog(const Batch& b, std::vector<LogEntry>&& entries) {
  if (auto st = Commit(b); !st) return st;
  if (entries.empty()) return {};
  for (auto& e : entries) log_.push_back(std::move(e));
  log_cv_.notify_all();
  return {};
}

void InodeTable::Seal(Inode* n, Batch* b, std::vector<LogEntry>* out) {
  n->rec.version++;
  n->rec.sealed_size = n->rec.size;
  n->rec.state = DataState::kDirty;
  n->sealed_gen = n->data_gen;
  LogEntry e;
  e.op = LogOp::kPersist;
  e.ino = n->rec.ino;
  e.version = n->rec.version;
  e.mode = n->rec.mode;
  e.mtime = n->rec.mtime;
  e.uid = n->rec.uid;
  e.gid = n->rec.gid;
  e.has_owner = true;
  e.path = EntryPath(n->rec.parent, n->rec.name);
  // A file with several names: the backend publishes under the first and
  // must link the others to the new bytes (publishing renames a new file
  // over the name, which breaks the backend's hard link). path2 lists them,
  // NUL-separated. Scanning every directory is fine: hard links are rare.
  if (n->rec.nlink > 1) {
    for (auto& [dino, d] : inodes_) {
      if (!d->is_dir()) continue;
      for (auto& [name, child] : d->children) {
        if (child != n->rec.ino || (dino == n->rec.parent && name == n->rec.name)) continue;
        if (!e.path2.empty()) e.path2.push_back('\0');
        e.path2 += EntryPath(dino, name);
      }
    }
  }
  AppendLog(b, e, out);
  n->seal_seq = out->back().seq;
}

Status InodeTable::SealNow(Inode* n) {
  Batch b;
  std::vector<LogEntry> log;
  Seal(n, &b, &log);
  MetaStore::PutInode(&b, n->rec);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return st;
  n->size_dirty = false;
  n->open_marked = false;
  return {};
}

std::vector<LogEntry> InodeTable::PendingLog(size_t max) {
  std::lock_guard lk(mu_);
  std::vector<LogEntry> out;
  for (size_t i = 0; i < log_.size() && i < max; i++) out.push_back(log_[i]);
  return out;
}

bool InodeTable::WaitForLog(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  log_cv_.wait_for(lk, d, [&] { return !log_.empty() || shutdown_; });
  return !log_.empty() && !shutdown_;
}

Status InodeTable::Preserve(Inode* n, bool keep_bytes) {
  uint64_t ino = n->rec.ino;
  if (!S_ISREG(n->rec.mode) || !SealPending(n)) return {};
  uint64_t key = cache::SnapKey(ino, n->rec.version);
  if (tier_->Has(key) || !tier_->Has(ino)) return {};
  if (auto st = tier_->Snapshot(ino, key, keep_bytes); !st) {
    LOG_ERROR("ino {} '{}': cannot keep version {} for the drain: {}", ino, EntryPath(n->rec.parent, n->rec.name),
              n->rec.version, strerror(st.error()));
    return st;
  }
  LOG_DEBUG("ino {}: version {} kept as a snapshot ({})", ino, n->rec.version, keep_bytes ? "copy" : "move");
  return {};
}

Result<PersistSource> InodeTable::BeginPersist(const LogEntry& e) {
  std::lock_guard lk(mu_);
  Inode* n = Find(e.ino);
  bool same = n && n->rec.version == e.version && S_ISREG(n->rec.mode);
  PersistSource src;
  uint64_t key = cache::SnapKey(e.ino, e.version);
  if (tier_->Has(key)) {
    auto ref = tier_->Ref(key);
    if (!ref) return Err(ref.error() == ENOENT ? ENODATA : ref.error());
    src.ref = *ref;
    src.gen = same ? n->sealed_gen : 0;
  } else {
    // No snapshot: the live file still holds exactly this version.
    if (!same || n->data_gen != n->sealed_gen || n->rec.state == DataState::kRemote) return Err(ENODATA);
    auto ref = tier_->Ref(e.ino);
    if (!ref) return Err(ref.error() == ENOENT ? ENODATA : ref.error());
    src.ref = *ref;
    src.gen = n->data_gen;
  }
  struct stat st;
  if (fstat(src.ref->fd, &st) != 0) return ErrFromErrno();
  src.fd = src.ref->fd;
  src.size = static_cast<uint64_t>(st.st_size);
  src.mode = e.mode & 07777;
  src.mtime = e.mtime;
  // The owner the version was sealed with; for an entry logged before
  // owners were recorded, the file's current one.
  if (e.has_owner) {
    src.uid = e.uid, src.gid = e.gid, src.has_owner = true;
  } else if (n) {
    src.uid = n->rec.uid, src.gid = n->rec.gid, src.has_owner = true;
  }
  if (same && n->data_gen == src.gen) n->rec.state = DataState::kDraining;
  return src;
}

void InodeTable::AbortPersist(const LogEntry& e) {
  std::lock_guard lk(mu_);
  Inode* n = Find(e.ino);
  if (n && n->rec.state == DataState::kDraining) n->rec.state = DataState::kDirty;
}

void InodeTable::RecordLost(const LogEntry& e, std::string_view reason) {
  std::lock_guard lk(mu_);
  tier_->Remove(cache::SnapKey(e.ino, e.version));
  if (std::find(lost_.begin(), lost_.end(), e.path) != lost_.end()) return;  // listed at start-up
  Batch b;
  MetaStore::PutLost(&b, next_lost_, e.path, reason);
  if (auto st = Commit(b); !st) LOG_ERROR("'{}': cannot record the loss: {}", e.path, strerror(st.error()));
  next_lost_++;
  lost_.push_back(e.path);
}

std::vector<std::string> InodeTable::LostFiles() {
  std::lock_guard lk(mu_);
  return lost_;
}

Status InodeTable::FailEntry(const LogEntry& e, std::string_view reason) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  std::lock_guard lk(mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Inode* n = Find(e.ino);
  bool current = e.op == LogOp::kPersist && n && S_ISREG(n->rec.mode) && n->rec.version == e.version;
  Batch b;
  MetaStore::PutFailed(&b, next_failed_, e.path, reason);
  MetaStore::DeleteLog(&b, e.seq);
  MetaStore::PutCounter(&b, kAppliedCounter, e.seq);
  InodeRecord r;
  if (current) {
    r = n->rec;
    // Only a version nothing rewrote since: its bytes stay in the tier,
    // never evicted (the backend has no copy), shown as `failed`.
    if (n->data_gen == n->sealed_gen) r.state = DataState::kFailed;
    MetaStore::PutInode(&b, r);
  }
  if (auto st = Commit(b); !st) return st;
  if (current) n->rec.state = r.state;
  failed_[next_failed_++] = FailedEntry{e.path, std::string(reason)};
  log_.pop_front();
  AdvanceApplied(e.seq, &due);
  if (e.op == LogOp::kPersist) {
    // The snapshot of a version since rewritten is no use any more; the
    // live file of a current version stays.
    tier_->Remove(cache::SnapKey(e.ino, e.version));
    tier_->NotifySpace();
  }
  return {};
}

std::vector<FailedEntry> InodeTable::FailedEntries() {
  std::lock_guard lk(mu_);
  std::vector<FailedEntry> out;
  out.reserve(failed_.size());
  for (auto& [seq, f] : failed_) out.push_back(f);
  return out;
}

Status InodeTable::ClearLost() {
  std::lock_guard lk(mu_);
  Batch b;
  auto del = [&](uint64_t seq, std::string_view, std::string_view) { MetaStore::DeleteLost(&b, seq); };
  if (auto st = store_->ForEachLost(del); !st) return st;
  if (auto st = Commit(b); !st) return st;
  LOG_INFO("lost list cleared ({} entries)", lost_.size());
  lost_.clear();
  return {};
}

Status InodeTable::CompletePersist(const LogEntry& e, const backend::Staged& s, uint64_t gen) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  std::lock_guard lk(mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Inode* n = Find(e.ino);
  // The checksum belongs to version e.version; the state is "persisted"
  // only if the live bytes are still that version.
  bool same = n && n->rec.version == e.version;
  bool current = same && n->data_gen == gen && n->data_gen == n->sealed_gen;
  Batch b;
  if (same) {
    InodeRecord r = n->rec;
    if (current) r.state = DataState::kPersisted;
    r.checksum_hi = s.checksum_hi;
    r.checksum_lo = s.checksum_lo;
    MetaStore::PutInode(&b, r);
  }
  MetaStore::DeleteLog(&b, e.seq);
  MetaStore::PutCounter(&b, kAppliedCounter, e.seq);
  std::vector<uint64_t> healed;  // failed records of this path: it is in the backend now
  for (auto& [seq, f] : failed_)
    if (f.path == e.path) {
      healed.push_back(seq);
      MetaStore::DeleteFailed(&b, seq);
    }
  if (auto st = Commit(b); !st) return st;
  for (uint64_t seq : healed) failed_.erase(seq);
  if (same) {
    if (current) {
      n->rec.state = DataState::kPersisted;
      n->open_marked = false;
    } else if (n->rec.state == DataState::kDraining) {
      n->rec.state = DataState::kDirty;
    }
    n->rec.checksum_hi = s.checksum_hi;
    n->rec.checksum_lo = s.checksum_lo;
    SetBackendPath(n, e.path);
  } else if (n && n->rec.state == DataState::kDraining) {
    n->rec.state = DataState::kDirty;
  }
  log_.pop_front();
  AdvanceApplied(e.seq, &due);
  tier_->Remove(cache::SnapKey(e.ino, e.version));  // published: the snapshot has done its job
  tier_->NotifySpace();  // a clean file can now be evicted for a waiting writer
  return {};
}

Status InodeTable::CompleteEntry(const LogEntry& e) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  std::lock_guard lk(mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Batch b;
  MetaStore::DeleteLog(&b, e.seq);
  MetaStore::PutCounter(&b, kAppliedCounter, e.seq);
  if (auto st = Commit(b); !st) return st;
  log_.pop_front();
  AdvanceApplied(e.seq, &due);
  if (e.op == LogOp::kPersist) {  // skipped: its snapshot, if any, is not needed
    tier_->Remove(cache::SnapKey(e.ino, e.version));
    tier_->NotifySpace();
  }
  ApplyToBackendPaths(e);
  return {};
}

bool InodeTable::WaitApplied(uint64_t seq) {
  std::unique_lock lk(mu_);
  applied_cv_.wait(lk, [&] { return applied_seq_ >= seq || shutdown_; });
  return applied_seq_ >= seq;
}

void InodeTable::Shutdown() {
  DueCallbacks due;  // runs after the lock is released: waiters get EIO
  due.err = EIO;
  std::lock_guard lk(mu_);
  for (auto& [seq, fn] : applied_waiters_) due.fns.push_back(std::move(fn));
  applied_waiters_.clear();
  shutdown_ = true;
  log_cv_.notify_all();
  applied_cv_.notify_all();
  fetch_cv_.notify_all();
}

// ---- Budget and remote files ----

cache::Tier::Relief InodeTable::Evict(uint64_t need) {
  std::lock_guard lk(mu_);
  // Least recently used first: the LRU set is in that order already.
  std::vector<Inode*> clean;
  for (auto [use, ino] : lru_) {
    Inode* n = Find(ino);
    if (n && n->rec.state == DataState::kPersisted && n->opens == 0 && !n->fetching && n->rec.nlink > 0)
      clean.push_back(n);
  }
  uint64_t freed = 0;
  Batch b;
  std::vector<uint64_t> evicted;
  for (Inode* n : clean) {
    if (freed >= need) break;
    uint64_t bytes = tier_->AllocatedBytes(n->rec.ino);
    n->rec.state = DataState::kRemote;
    MetaStore::PutInode(&b, n->rec);
    evicted.push_back(n->rec.ino);
    freed += bytes;
  }
  if (!evicted.empty()) {
    // Record "remote" before the bytes go: a crash in between leaves a
    // remote file whose tier copy is merely unused.
    if (auto st = Commit(b); !st) {
      for (uint64_t ino : evicted) Find(ino)->rec.state = DataState::kPersisted;
      return cache::Tier::Relief::kWait;
    }
    FAILPOINT("evict.mid");
    for (uint64_t ino : evicted) tier_->Remove(ino);
    LOG_DEBUG("evicted {} files, {} bytes", evicted.size(), freed);
    return cache::Tier::Relief::kFreed;
  }
  // Nothing clean: space comes back only if closed files can drain.
  bool drainable = false;
  for (const LogEntry& e : log_)
    if (e.op == LogOp::kPersist) {
      drainable = true;
      break;
    }
  return drainable ? cache::Tier::Relief::kWait : cache::Tier::Relief::kHopeless;
}

void InodeTable::TouchLru(Inode* n) {
  lru_.erase({n->last_use, n->rec.ino});
  n->last_use = ++clock_;
  lru_.emplace(n->last_use, n->rec.ino);
}

void InodeTable::EraseInode(Inode* n) {
  uint64_t ino = n->rec.ino;
  lru_.erase({n->last_use, ino});
  SetBackendPath(n, "");
  inodes_.erase(ino);
}

void InodeTable::SetBackendPath(Inode* n, std::string path) {
  if (!n->backend_path.empty()) {
    auto it = by_backend_path_.find(n->backend_path);
    if (it != by_backend_path_.end() && it->second == n->rec.ino) by_backend_path_.erase(it);
  }
  n->backend_path = std::move(path);
  if (n->backend_path.empty()) return;
  // Another inode recorded there was replaced in the backend.
  auto [it, fresh] = by_backend_path_.try_emplace(n->backend_path, n->rec.ino);
  if (!fresh && it->second != n->rec.ino) {
    if (Inode* old = Find(it->second)) old->backend_path.clear();
    it->second = n->rec.ino;
  }
}

void InodeTable::ApplyToBackendPaths(const LogEntry& e) {
  // The inodes at `path` and below it, in the backend.
  auto subtree = [&](const std::string& path) {
    std::vector<uint64_t> out;
    if (auto it = by_backend_path_.find(path); it != by_backend_path_.end()) out.push_back(it->second);
    std::string prefix = path + "/";
    for (auto it = by_backend_path_.lower_bound(prefix); it != by_backend_path_.end() && it->first.starts_with(prefix);
         ++it)
      out.push_back(it->second);
    return out;
  };
  auto move = [&](const std::vector<uint64_t>& inos, const std::string& from, const std::string& to) {
    for (uint64_t ino : inos)
      if (Inode* n = Find(ino)) SetBackendPath(n, to + n->backend_path.substr(from.size()));
  };
  switch (e.op) {
    case LogOp::kRename: {
      auto src = subtree(e.path), dst = subtree(e.path2);
      if (e.flags & 1) {  // an exchange is rare: both sides fall back to waiting for the log
        for (uint64_t ino : src)
          if (Inode* n = Find(ino)) SetBackendPath(n, "");
        for (uint64_t ino : dst)
          if (Inode* n = Find(ino)) SetBackendPath(n, "");
        break;
      }
      for (uint64_t ino : dst)  // replaced in the backend
        if (Inode* n = Find(ino)) SetBackendPath(n, "");
      move(src, e.path, e.path2);
      break;
    }
    case LogOp::kUnlink:
    case LogOp::kRmdir:
      for (uint64_t ino : subtree(e.path))
        if (Inode* n = Find(ino)) SetBackendPath(n, "");
      break;
    default:
      break;
  }
}

Status InodeTable::EnsureLocal(std::unique_lock<std::mutex>& lk, uint64_t ino, int attempt) {
  for (;;) {
    Inode* n = Find(ino);
    if (!n) return Err(ENOENT);
    if (n->rec.state != DataState::kRemote) return {};
    if (!n->fetching) break;
    fetch_cv_.wait(lk);
    if (shutdown_) return Err(EIO);
  }
  if (!backend_) return Err(EIO);
  Inode* n = Find(ino);
  if (n->backend_path.empty()) {
    // Where the backend holds it is not tracked (after an exchange, an
    // unlink of the name it had, or a restart with renames pending): once
    // the log has reached this moment, it is the current path.
    uint64_t head = next_seq_ - 1;
    applied_cv_.wait(lk, [&] { return applied_seq_ >= head || shutdown_; });
    if (shutdown_) return Err(EIO);
    n = Find(ino);
    if (!n) return Err(ENOENT);
    if (n->rec.state != DataState::kRemote) return {};
    if (n->fetching) return EnsureLocal(lk, ino, attempt);  // another fetch started meanwhile
    if (n->backend_path.empty()) SetBackendPath(n, EntryPath(n->rec.parent, n->rec.name));
  }
  n->fetching = true;
  std::string path = n->backend_path;
  uint64_t size = n->rec.size, hi = n->rec.checksum_hi, lo = n->rec.checksum_lo;
  lk.unlock();
  // Test knob: CKPTFS_FETCH_DELAY_MS=N makes every fetch take N ms longer
  // (a slow backend), read once.
  static const int fetch_delay_ms = [] {
    const char* v = getenv("CKPTFS_FETCH_DELAY_MS");
    return v ? atoi(v) : 0;
  }();
  if (fetch_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fetch_delay_ms));
  auto st = tier_->Fill(ino, size, [&](int fd) -> int {
    auto sum = backend_->Fetch(path, fd, size);
    if (!sum) return sum.error();
    if ((hi | lo) != 0 && (sum->first != hi || sum->second != lo)) {
      LOG_ERROR("ino {} '{}': checksum mismatch on fetch from backend ({:016x}{:016x}, expected {:016x}{:016x})",
                ino, path, sum->first, sum->second, hi, lo);
      return EIO;
    }
    return 0;
  });
  lk.lock();
  n = Find(ino);
  if (n) {
    n->fetching = false;
    if (st) {
      n->rec.state = DataState::kPersisted;
      Batch b;
      MetaStore::PutInode(&b, n->rec);
      (void)Commit(b);
    }
  }
  fetch_cv_.notify_all();
  // The drain moved it while it was being read (a rename applied
  // meanwhile): fetch again from where it is now.
  if (!st && st.error() == ENOENT && n && n->backend_path != path && attempt < 3)
    return EnsureLocal(lk, ino, attempt + 1);
  if (!st) {
    if (st.error() != EIO) LOG_ERROR("ino {} '{}': fetch from backend failed: {}", ino, path, strerror(st.error()));
    return Err(st.error() == ENOENT ? EIO : st.error());
  }
  return {};
}

Status InodeTable::ImportBackend() {
  std::lock_guard lk(mu_);
  auto imported = store_->GetCounter(kImportedCounter);
  if (!imported) return Err(imported.error());
  if (*imported || !backend_) return {};
  Batch b;
  std::unordered_map<std::string, uint64_t> dirs{{"", meta::kRootIno}};
  uint64_t count = 0;
  Inode* root = Find(meta::kRootIno);
  auto st = backend_->List([&](const backend::Entry& e) {
    auto slash = e.path.rfind('/');
    std::string parent_path = slash == std::string::npos ? "" : e.path.substr(0, slash);
    std::string name = slash == std::string::npos ? e.path : e.path.substr(slash + 1);
    auto pit = dirs.find(parent_path);
    if (pit == dirs.end() || name.empty() || name.size() > kMaxName) {
      LOG_WARN("import: skipping backend entry '{}'", e.path);
      return;
    }
    Inode* p = Find(pit->second);
    if (p->children.count(name)) return;
    auto n = std::make_unique<Inode>();
    InodeRecord& r = n->rec;
    r.ino = next_ino_++;
    r.parent = p->rec.ino;
    r.name = name;
    r.uid = root->rec.uid;
    r.gid = root->rec.gid;
    r.mtime = r.atime = r.ctime = {e.mtime_sec, e.mtime_nsec};
    r.version = 1;
    switch (e.type) {
      case backend::Entry::Type::kDir:
        r.mode = S_IFDIR | (e.mode ? e.mode & 07777 : 0755);
        r.nlink = 2;
        r.state = DataState::kPersisted;
        p->rec.nlink++;
        dirs[e.path] = r.ino;
        break;
      case backend::Entry::Type::kFile:
        r.mode = S_IFREG | (e.mode ? e.mode & 07777 : 0644);
        r.nlink = 1;
        r.size = r.sealed_size = e.size;
        r.state = DataState::kRemote;
        if (e.has_checksum) {
          r.checksum_hi = e.checksum_hi;
          r.checksum_lo = e.checksum_lo;
        }
        break;
      case backend::Entry::Type::kSymlink:
        r.mode = S_IFLNK | 0777;
        r.nlink = 1;
        r.target = e.target;
        r.state = DataState::kPersisted;
        break;
    }
    MetaStore::PutInode(&b, r);
    MetaStore::PutInode(&b, p->rec);
    MetaStore::PutDentry(&b, p->rec.ino, name, r.ino, DirentType(r.mode));
    p->children.emplace(name, r.ino);
    inodes_[r.ino] = std::move(n);
    if (e.type == backend::Entry::Type::kFile) {
      lru_.emplace(0, r.ino);
      SetBackendPath(Find(r.ino), e.path);
    }
    count++;
  });
  if (!st) return st;
  MetaStore::PutCounter(&b, kNextInoCounter, next_ino_);
  MetaStore::PutCounter(&b, kImportedCounter, 1);
  if (auto c = Commit(b, true); !c) return c;
  if (count) LOG_INFO("import: {} entries found in the backend {}", count, backend_->Describe());
  return {};
}

DataStats InodeTable::DataStatistics() {
  std::lock_guard lk(mu_);
  DataStats s;
  for (auto& [ino, n] : inodes_) {
    if (!S_ISREG(n->rec.mode) || n->rec.nlink == 0) continue;
    auto i = static_cast<size_t>(n->rec.state);
    s.files[i]++;
    s.bytes[i] += n->rec.size;
  }
  s.log_len = log_.size();
  s.head_seq = next_seq_ - 1;
  s.applied_seq = applied_seq_;
  return s;
}

NamespaceStats InodeTable::Stats() {
  std::lock_guard lk(mu_);
  NamespaceStats s;
  for (auto& [ino, n] : inodes_) {
    s.inodes++;
    if (n->is_dir()) s.dirs++;
    if (S_ISREG(n->rec.mode)) {
      s.files++;
      s.bytes += n->rec.size;
    }
  }
  return s;
}

}  // namespace ckpt::fs
