// core.cc — the rules every change of the core follows (commit, then
// change memory; a refused commit turns the mount read-only), the lookups
// that take in a passthrough writer's bytes, and where the backend holds
// each file (fs/core/core.h).
#include "fs/core/core.h"

#include "fs/core/core_impl.h"

namespace ckpt::fs {

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

meta::Timespec Core::Now() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return meta::Timespec{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
}

Inode* Core::Find(uint64_t ino) {
  Inode* n = ns.Find(ino);
  if (n && n->pt_writers > 0) Absorb(n);
  return n;
}

Result<Inode*> Core::Child(Inode* dir, std::string_view name) {
  auto c = ns.Child(dir, name);
  if (c && (*c)->pt_writers > 0) Absorb(*c);
  return c;
}

Result<std::pair<Inode*, Inode*>> Core::DirAndChild(uint64_t parent, std::string_view name) {
  auto dir = ns.FindDir(parent);
  if (!dir) return Err(dir.error());
  auto c = Child(*dir, name);
  if (!c) return Err(c.error());
  return std::pair{*dir, *c};
}

Status Core::Writable() const { return read_only_.load(std::memory_order_relaxed) ? Err(EROFS) : Status{}; }

std::string Core::ReadOnlyReason() {
  MutexLock lk(&ro_mu_);
  return ro_reason_;
}

Status Core::Commit(const Batch& b, bool sync) {
  auto st = store_->Commit(b, sync);
  if (st || read_only_.exchange(true)) return st;
  // LevelDB's sticky background error: after the store refused a write,
  // the in-memory namespace and the record may differ; going on would
  // acknowledge changes a restart forgets.
  std::string why =
      fmt::format("metadata write failed ({}); the mount is read-only until remounted", strerror(st.error()));
  LOG_ERROR("{}", why);
  MutexLock lk(&ro_mu_);
  ro_reason_ = why;
  return st;
}

Status Core::CheckNewName(uint64_t parent, std::string_view name, size_t subtree) {
  if (parent == meta::kRootIno && name.starts_with(kReservedRootPrefix)) return Err(EPERM);
  if (limits_.utf8_names && !ValidUtf8(name)) return Err(EILSEQ);
  if (limits_.max_path == SIZE_MAX) return {};  // a POSIX backend: any depth
  size_t len = ns.DirPath(parent).size();
  len += (len ? 1 : 0) + name.size() + (subtree ? 1 + subtree : 0);
  if (len > limits_.max_path) return Err(ENAMETOOLONG);
  return {};
}

void Core::MaybeDelete(Inode* n) {
  if (n->rec.nlink > 0 || n->nlookup > 0 || n->opens > 0 || n->rec.ino == meta::kRootIno) return;
  uint64_t ino = n->rec.ino;
  // A sealed version still on its way to the backend outlives its file.
  // If it cannot be kept, the tier file stays (under its ino, reported at
  // the next start-up) rather than the promised bytes going silently.
  bool keep_live = false;
  if (S_ISREG(n->rec.mode))
    if (auto p = versions.MoveAside(ns, n); !p) {
      keep_live = true;
      LOG_ERROR("ino {}: its pending version {} could not be kept for the drain ({}); its tier file stays", ino,
                n->rec.version, strerror(p.error()));
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

void Core::EraseInode(Inode* n) {
  uint64_t ino = n->rec.ino;
  residency.Remove(ino);
  SetBackendPath(n, "");
  ns.Erase(ino);
}

void Core::Absorb(Inode* n) {
  auto st = tier_->Refresh(n->rec.ino);
  if (!st) return;
  const uint64_t size = static_cast<uint64_t>(st->st_size);
  const int64_t mtime_ns = st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
  if (size == n->pt_size && mtime_ns == n->pt_mtime_ns) return;
  n->pt_size = size;
  n->pt_mtime_ns = mtime_ns;
  // Checked here, not per write: the kernel's writes never reach the
  // daemon. Said once per overrun; CutToLimit acts on it.
  const bool over = size > limits_.max_file_size;
  if (over && !n->pt_oversize)
    LOG_WARN(
        "ino {} ({}): a passthrough writer took it to {} bytes, over --max-file-size ({}): cut back at its "
        "close or fsync, which fail with EFBIG",
        n->rec.ino, ns.EntryPath(n->rec.parent, n->rec.name), size, limits_.max_file_size);
  n->pt_oversize = over;
  versions.SupersedeInPlace(n);
  n->rec.size = size;
  n->rec.mtime = n->rec.ctime = meta::Timespec{st->st_mtim.tv_sec, static_cast<uint32_t>(st->st_mtim.tv_nsec)};
  Transition(n, FileEvent::kChange);
  n->data_gen++;
  if (n->rec.mode & (S_ISUID | S_ISGID)) n->rec.mode &= ~(S_ISUID | ((n->rec.mode & S_IXGRP) ? S_ISGID : 0));
  n->size_dirty = true;
}

Status Core::CutToLimit(Inode* n) {
  if (!n->pt_oversize) return {};
  if (auto st = tier_->Truncate(n->rec.ino, limits_.max_file_size); !st) {
    LOG_ERROR("ino {}: cannot cut the file back to --max-file-size: {}", n->rec.ino, strerror(st.error()));
    return st;
  }
  Absorb(n);  // the new size and mtime; clears pt_oversize
  return Err(EFBIG);
}

void Core::SetBackendPath(Inode* n, std::string path) {
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

void Core::ApplyToBackendPaths(const LogEntry& e) {
  // The inodes at `path` and below it, in the backend.
  auto subtree = [&](const std::string& path) {
    mu().AssertHeld();  // the caller's
    std::vector<uint64_t> out;
    if (auto it = by_backend_path_.find(path); it != by_backend_path_.end()) out.push_back(it->second);
    std::string prefix = path + "/";
    for (auto it = by_backend_path_.lower_bound(prefix); it != by_backend_path_.end() && it->first.starts_with(prefix);
         ++it)
      out.push_back(it->second);
    return out;
  };
  auto move = [&](const std::vector<uint64_t>& inos, const std::string& from, const std::string& to) {
    mu().AssertHeld();  // the caller's
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
    default: break;
  }
}

std::optional<std::string> Core::BackendPathFromLog(const Inode* n) {
  return oplog.PathBeforePending(ns.EntryPath(n->rec.parent, n->rec.name), n->rec.ino);
}

Status Core::CommitWithLog(const Batch& b, std::vector<LogEntry>&& entries) {
  if (auto st = Commit(b); !st) return st;
  oplog.Publish(std::move(entries));  // before the change that logged them is answered
  return {};
}

Result<InodeRecord> Core::LookupAndCount(uint64_t parent, std::string_view name) {
  MutexLock lk(&mu());
  auto c = Lookup(parent, name);
  if (!c) return Err(c.error());
  (*c)->nlookup++;
  return (*c)->rec;
}

Result<Inode*> Core::Lookup(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  auto dir = ns.FindDir(parent);
  if (!dir) return Err(dir.error());
  if (name == ".") return *dir;
  if (name == "..") {
    Inode* up = Find((*dir)->rec.parent);
    if (!up) return Err(ENOENT);
    return up;
  }
  return Child(*dir, name);
}

Core::DataExclusive Core::LockForSeal(uint64_t ino) {
  DataExclusive l;
  {
    MutexLock lk(&mu());
    Inode* n = Find(ino);
    if (!n) return l;
    l.mu = n->data_mu;
  }
  l.lock = std::unique_lock(*l.mu);
  return l;
}

}  // namespace ckpt::fs
