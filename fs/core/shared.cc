// shared.cc — the shared namespace: several mounts (nodes), each with its
// own state dir and tier, over one backend, see each other's persisted
// files. A local miss asks the backend (Stat), a readdir merges the
// backend's one-level listing (ListDir), and clean entries follow the
// backend: a file changed there becomes remote and is fetched again, one
// gone from there leaves this namespace. Every answer of the backend is
// reused for the TTL (--shared-ttl), the bound on how stale a view is.
//
// Who wins (docs/consistency.md, "Shared namespace"): this mount's own
// changes, until the drain has applied them. A name whose unlink, rmdir or
// rename away is still in the pending log never comes back from the
// backend; an entry with a change of this mount still pending (a dirty or
// draining file, a mkdir, a rename onto it), an open file, and anything
// under a memory-only checkpoint are never changed or dropped because of
// the backend. Only clean entries follow it.
//
// The backend is asked without the table's lock: the entry may change
// meanwhile, so everything is looked up again afterwards. A listing or a
// Stat that saw ENOENT while the drain applied an entry of this mount is
// not trusted to drop anything (the entry may have just been published).
// What it gives up: a directory's listing is a snapshot of one level; a
// name can be imported, then dropped, within a TTL of another node's
// rename. Imported entries get the root's owner, like ImportBackend's.
//
#include "fs/core/shared.h"

#include "fs/core/core_impl.h"

namespace ckpt::fs {

namespace {

constexpr size_t kMaxNegative = 65536;  // remembered ENOENTs; all forgotten past this

// The permission bits of an entry found in the backend, which takes the
// mount root's owner: without set-user-ID and set-group-ID, as chown(2)
// clears them, so a file anyone could write to the backend (or give an
// x-amz-meta-mode) never shows as the mount owner's setuid program (that
// matters on a mount with `-o suid`; libfuse mounts nosuid by default).
mode_t ImportedMode(uint32_t mode) { return static_cast<mode_t>(mode & 01777); }

constexpr int kMaxDropDepth = 64;       // deeper clean trees are kept (dropped later, from below)

std::string Join(const std::string& dir, std::string_view name) {
  return dir.empty() ? std::string(name) : dir + "/" + std::string(name);
}

}  // namespace

int64_t SharedNamespace::MonoNs() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec + clock_skew_ns_.load(std::memory_order_relaxed);
}

bool SharedNamespace::SharedDir(Inode* dir) {
  return enabled() && dir && dir->is_dir() && !core_.ckpts.UnderMemoryOnly(core_.ns, dir->rec.ino);
}

bool SharedNamespace::Droppable(Inode* n, const std::string& path, int depth) {
  if (depth > kMaxDropDepth || n->rec.ino == meta::kRootIno || n->rec.memory_only) return false;
  if (depth == 0 && core_.oplog.Touches(path)) return false;  // covers the whole subtree
  if (n->is_dir()) {
    for (auto& [name, ino] : n->children) {
      Inode* c = core_.Find(ino);
      if (!c || !Droppable(c, Join(path, name), depth + 1)) return false;
    }
    return true;
  }
  if (S_ISLNK(n->rec.mode)) return n->rec.nlink == 1;
  if (!S_ISREG(n->rec.mode)) return false;  // fifos, devices: only ever local
  return (n->rec.state == DataState::kPersisted || n->rec.state == DataState::kRemote) && n->opens == 0 &&
         !n->fetching && n->rec.nlink == 1 && !core_.versions.SealPending(n) && n->data_gen == n->sealed_gen;
}

Status SharedNamespace::DropShared(Inode* p, const std::string& name) {
  // Post-order: children before their directory.
  struct Gone {
    uint64_t parent;
    std::string name;
    uint64_t ino;
  };
  std::vector<Gone> gone;
  std::function<void(Inode*, const std::string&, int)> collect = [&](Inode* dir, const std::string& n, int depth) {
    mu().AssertHeld();  // the caller's
    auto it = dir->children.find(n);
    if (it == dir->children.end() || depth > kMaxDropDepth) return;
    Inode* c = core_.Find(it->second);
    if (c && c->is_dir())
      for (auto& [cn, cino] : c->children) collect(c, cn, depth + 1);
    gone.push_back({dir->rec.ino, n, it->second});
  };
  collect(p, name, 0);
  Batch b;
  std::unordered_map<uint64_t, InodeRecord> recs;  // the next records
  auto rec = [&](uint64_t ino) -> InodeRecord& {
    mu().AssertHeld();  // the caller's
    auto it = recs.find(ino);
    if (it == recs.end()) it = recs.emplace(ino, core_.Find(ino)->rec).first;
    return it->second;
  };
  const meta::Timespec now = core_.Now();
  for (const Gone& g : gone) {
    InodeRecord& r = rec(g.ino);
    InodeRecord& pr = rec(g.parent);
    MetaStore::DeleteDentry(&b, g.parent, g.name);
    if (S_ISDIR(r.mode)) {
      r.nlink = 0;
      pr.nlink--;
    } else {
      r.nlink--;
    }
    r.ctime = now;
  }
  rec(p->rec.ino).mtime = rec(p->rec.ino).ctime = now;
  for (auto& [ino, r] : recs) MetaStore::PutInode(&b, r);
  if (auto st = core_.Commit(b); !st) return st;
  for (auto& [ino, r] : recs) core_.Find(ino)->rec = r;
  for (const Gone& g : gone) {
    Inode* dir = core_.Find(g.parent);
    dir->children.erase(g.name);
    negative_.erase({g.parent, g.name});
  }
  for (const Gone& g : gone)
    if (Inode* n = core_.Find(g.ino)) core_.MaybeDelete(n);
  LOG_DEBUG("shared: '{}' is gone from the backend; dropped {} entries", core_.ns.EntryPath(p->rec.ino, name),
            gone.size());
  return {};
}

Result<Inode*> SharedNamespace::AdoptShared(Inode* p, const std::string& name, const backend::Entry& e) {
  Batch b;
  const uint64_t parent_nlink = p->rec.nlink;
  Inode* n = AdoptEntry(p, name, e, &b);
  MetaStore::PutCounter(&b, kNextInoCounter, core_.ns.next_ino());
  if (auto st = core_.Commit(b); !st) {
    p->children.erase(name);
    p->rec.nlink = parent_nlink;
    core_.EraseInode(n);
    return Err(st.error());
  }
  n->checked_ns = MonoNs();
  negative_.erase({p->rec.ino, name});
  LOG_DEBUG("shared: imported '{}' from the backend", e.path);
  return n;
}

Inode* SharedNamespace::FollowBackend(Inode* p, const std::string& name, Inode* n, const backend::Entry& e) {
  n->checked_ns = MonoNs();
  const std::string path = core_.ns.EntryPath(p->rec.ino, name);
  const auto type = n->is_dir() ? backend::Entry::Type::kDir
                    : S_ISLNK(n->rec.mode) ? backend::Entry::Type::kSymlink
                                           : backend::Entry::Type::kFile;
  const bool regular = S_ISREG(n->rec.mode);
  if (type == backend::Entry::Type::kDir && e.type == type) return n;
  bool same;
  if (!regular && type != backend::Entry::Type::kSymlink) {
    same = false;  // a fifo or device here, something else there: ours stays (not Droppable)
  } else if (e.type != type) {
    same = false;
  } else if (type == backend::Entry::Type::kSymlink) {
    same = n->rec.target == e.target;
  } else if (e.has_checksum && (n->rec.checksum_hi | n->rec.checksum_lo) != 0) {
    same = e.size == n->rec.size && e.checksum_hi == n->rec.checksum_hi && e.checksum_lo == n->rec.checksum_lo;
  } else {
    same = e.size == n->rec.size && e.mtime_sec == n->rec.mtime.sec && e.mtime_nsec == n->rec.mtime.nsec;
  }
  if (same || !Droppable(n, path)) return n;
  if (e.type != type || !regular) {
    // Replaced there by an entry of another kind: ours goes, theirs comes.
    if (!DropShared(p, name)) return n;
    auto a = AdoptShared(p, name, e);
    return a ? *a : nullptr;
  }
  // The same file, other bytes: remote again, fetched at the next open.
  InodeRecord r = n->rec;
  const bool was_local = r.state == DataState::kPersisted;
  r.state = DataState::kRemote;
  r.size = r.sealed_size = e.size;
  r.mtime = r.ctime = {e.mtime_sec, e.mtime_nsec};
  if (e.mode) r.mode = (r.mode & S_IFMT) | ImportedMode(e.mode);
  r.checksum_hi = e.has_checksum ? e.checksum_hi : 0;
  r.checksum_lo = e.has_checksum ? e.checksum_lo : 0;
  Batch b;
  MetaStore::PutInode(&b, r);
  if (!core_.Commit(b)) return n;
  if (was_local) Transition(n, FileEvent::kEvict);
  const DataState state = n->rec.state;
  n->rec = r;
  n->rec.state = state;  // remote either way; kept as Transition left it
  core_.SetBackendPath(n, e.path);
  n->backend_changed = true;
  core_.residency.SawFile(e.size);
  if (was_local) core_.tier()->Remove(n->rec.ino);
  LOG_DEBUG("shared: '{}' changed in the backend ({} bytes); remote again", path, e.size);
  return n;
}

bool SharedNamespace::LookupNeedsBackend(uint64_t parent, std::string_view name) {
  if (!enabled() || name == "." || name == ".." || name.size() > kMaxName) return false;
  MutexLock lk(&mu());
  Inode* dir = core_.Find(parent);
  if (!SharedDir(dir)) return false;
  const int64_t now = MonoNs();
  auto it = dir->children.find(name);
  if (it != dir->children.end()) {
    // Only what could follow the backend is compared with it: not a file
    // with changes of its own or open here (the local copy wins anyway).
    Inode* c = core_.Find(it->second);
    if (!c || now - c->checked_ns < ttl_ns_) return false;
    if (!S_ISREG(c->rec.mode)) return true;
    return (c->rec.state == DataState::kPersisted || c->rec.state == DataState::kRemote) && c->opens == 0;
  }
  // Reserved names, and names the backend could not hold (too long, not
  // UTF-8 for S3): nothing there to find.
  if (!core_.CheckNewName(parent, name)) return false;
  // With a cluster store, every miss asks it (LookupInStore).
  if (names_) return true;
  // The directory's listing, taken less than a TTL ago, lacks the name.
  if (now - dir->listed_ok_ns < ttl_ns_) return false;
  auto neg = negative_.find({parent, std::string(name)});
  return neg == negative_.end() || now - neg->second >= ttl_ns_;
}

Result<InodeRecord> SharedNamespace::Lookup(uint64_t parent, std::string_view name) {
  if (!LookupNeedsBackend(parent, name)) return core_.LookupAndCount(parent, name);
  if (names_)
    if (auto r = LookupInStore(parent, name)) return *r;
  bool list = false;
  {
    MutexLock lk(&mu());
    Inode* dir = core_.Find(parent);
    list = ListsInsteadOfStat(dir) && !dir->children.count(name);
  }
  if (list) {
    MergeDir(parent);
    if (!LookupNeedsBackend(parent, name))
      return core_.LookupAndCount(parent, name);  // else: listed elsewhere meanwhile, or failed
  }
  std::string path;
  uint64_t applied;
  {
    MutexLock lk(&mu());
    Inode* dir = core_.Find(parent);
    if (!dir || !dir->is_dir()) return Err(dir ? ENOTDIR : ENOENT);
    path = core_.ns.EntryPath(parent, name);
    applied = core_.oplog.AppliedSeq();
    auto it = dir->children.find(name);
    if (it == dir->children.end() && core_.oplog.RemovalPending(path, applied))
      return Err(ENOENT);  // the local log wins
    if (it != dir->children.end()) {
      Inode* c = core_.Find(it->second);
      if (c) c->checked_ns = MonoNs();  // one Stat per TTL, even while this one runs
    }
  }
  auto e = core_.backend()->Stat(path);
  MutexLock lk(&mu());
  auto dir = core_.ns.FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  std::string key(name);
  auto it = p->children.find(name);
  Inode* c = it == p->children.end() ? nullptr : core_.Find(it->second);
  if (!e) {
    if (e.error() != ENOENT && e.error() != ENOTDIR && e.error() != ELOOP && e.error() != EINVAL) {
      LOG_DEBUG("shared: stat '{}' in the backend: {}; the local view stands", path, strerror(e.error()));
    } else if (!c) {
      if (negative_.size() >= kMaxNegative) negative_.clear();
      negative_[{parent, key}] = MonoNs();
    } else if (applied == core_.oplog.AppliedSeq() && Droppable(c, path)) {
      // Persisted here, gone there: another node removed it.
      if (DropShared(p, key)) return Err(ENOENT);
    }
  } else if (!c) {
    if (!core_.oplog.RemovalPending(path, applied) &&
        !(parent == meta::kRootIno && name.starts_with(kReservedRootPrefix)))
      if (auto a = AdoptShared(p, key, *e); a) c = *a;
  } else {
    c = FollowBackend(p, key, c, *e);
  }
  if (!c) return Err(ENOENT);
  c->nlookup++;
  return c->rec;
}

std::optional<Result<InodeRecord>> SharedNamespace::LookupInStore(uint64_t parent, std::string_view name) {
  std::string path;
  {
    MutexLock lk(&mu());
    Inode* dir = core_.Find(parent);
    if (!dir || !dir->is_dir() || dir->children.count(name)) return std::nullopt;
    path = core_.ns.EntryPath(parent, name);
  }
  auto got = names_->Get(path);
  if (!got) {
    LOG_DEBUG("shared: asking the cluster store for '{}': {}; the backend decides", path, strerror(got.error()));
    return std::nullopt;
  }
  if (!*got) return std::nullopt;
  MutexLock lk(&mu());
  auto dir = core_.ns.FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  std::string key(name);
  // Named in the store: whatever the backend said of it before is stale.
  negative_.erase({parent, key});
  p->listed_ok_ns = 0;
  p->listed_ns = 0;
  // Removed on a node (a tombstone), its drain maybe behind: what the
  // backend still holds under the name is stale. (This node holds no such
  // name: the miss was checked above, and a name made here meanwhile
  // would be a child now.)
  if ((*got)->gone && !p->children.count(key)) return Result<InodeRecord>(Err(ENOENT));
  const backend::Entry& e = (*got)->entry;
  // A file or symlink: the backend holds it once persisted (the store names
  // files when they are), asked now. A directory made on another node is
  // taken from the store: it may not have reached the backend yet (its
  // drain is in order, behind that node's files), and the ranks that write
  // into it after a barrier must find it.
  if (e.type != backend::Entry::Type::kDir || p->children.count(key)) return std::nullopt;
  if (core_.oplog.RemovalPending(path, core_.oplog.AppliedSeq()) ||
      (parent == meta::kRootIno && name.starts_with(kReservedRootPrefix)))
    return std::nullopt;
  auto a = AdoptShared(p, key, e);
  if (!a) return std::nullopt;
  (*a)->store_rev = (*got)->revision;
  (*a)->checked_ns = MonoNs();
  (*a)->nlookup++;
  return Result<InodeRecord>((*a)->rec);
}

bool SharedNamespace::StoreSaysChanged(uint64_t ino) {
  std::string path;
  int64_t seen;
  {
    MutexLock lk(&mu());
    Inode* n = core_.Find(ino);
    if (!n) return false;
    if (MonoNs() - n->checked_ns >= ttl_ns_) return true;  // due by the TTL anyway
    path = core_.ns.EntryPath(n->rec.parent, n->rec.name);
    seen = n->store_rev;
  }
  auto got = names_->Get(path);
  if (!got || !*got || (*got)->revision <= seen) return false;
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return false;
  n->store_rev = (*got)->revision;
  n->checked_ns = 0;  // compared with the backend now
  return true;
}

bool SharedNamespace::MergeDue(uint64_t ino) {
  if (!enabled()) return false;
  MutexLock lk(&mu());
  Inode* dir = core_.Find(ino);
  return SharedDir(dir) && MonoNs() - dir->listed_ns >= ttl_ns_;
}

void SharedNamespace::MergeDir(uint64_t ino) {
  if (!MergeDue(ino)) return;
  std::string path;
  uint64_t applied;
  const int64_t started = MonoNs();
  {
    MutexLock lk(&mu());
    Inode* d = core_.Find(ino);
    if (!d) return;
    d->listed_ns = started;  // one listing per TTL, even while this one runs
    path = core_.ns.DirPath(ino);
    applied = core_.oplog.AppliedSeq();
    if (!path.empty() && core_.oplog.RemovalPending(path, applied)) return;
  }
  auto ls = core_.backend()->ListDir(path);
  if (!ls) {
    LOG_DEBUG("shared: list '{}' in the backend: {}; the local view stands", path, strerror(ls.error()));
    if (ls.error() != ENOENT) return;
    // Not in the backend (not drained yet, or removed there): none of the
    // names looked up in it can be there either.
    MutexLock lk(&mu());
    if (Inode* d = core_.Find(ino); d && d->is_dir() && core_.ns.DirPath(ino) == path) {
      d->listed_ok_ns = started;
      d->listed_count = 0;
    }
    return;
  }
  MutexLock lk(&mu());
  Inode* d = core_.Find(ino);
  if (!d || !d->is_dir() || d->rec.nlink == 0 || core_.ns.DirPath(ino) != path) return;  // moved meanwhile: next time
  d->listed_ok_ns = started;
  d->listed_count = ls->size();
  std::set<std::string, std::less<>> there;
  for (const backend::Entry& e : *ls) {
    auto slash = e.path.rfind('/');
    std::string name = slash == std::string::npos ? e.path : e.path.substr(slash + 1);
    if (name.empty() || name.size() > kMaxName) continue;
    there.insert(name);
    auto it = d->children.find(name);
    if (it != d->children.end()) {
      if (Inode* c = core_.Find(it->second)) FollowBackend(d, name, c, e);
      continue;
    }
    if (core_.oplog.RemovalPending(e.path, applied) || (ino == meta::kRootIno && name.starts_with(kReservedRootPrefix)))
      continue;
    (void)AdoptShared(d, name, e);
  }
  if (applied != core_.oplog.AppliedSeq()) return;  // the listing may predate an entry just published
  std::vector<std::string> gone;
  for (auto& [name, cino] : d->children)
    if (!there.count(name))
      if (Inode* c = core_.Find(cino); c && Droppable(c, Join(path, name))) gone.push_back(name);
  for (const auto& name : gone) (void)DropShared(d, name);
}

bool SharedNamespace::ListsInsteadOfStat(Inode* dir) {
  // One listing answers for every name in a small directory for a TTL (a
  // checkpoint's files are created, or opened, one after another) where a
  // Stat answers for one. Small: as the backend held it at the last
  // listing, else as this mount holds it.
  return dir && dir->is_dir() &&
         (dir->listed_ok_ns != 0 ? dir->listed_count : dir->children.size()) <= core_.backend()->ListCheaperUpTo();
}

bool SharedNamespace::RevalidateDue(uint64_t ino, int flags) {
  if (!enabled()) return false;
  if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) return false;
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  // With a cluster store an open within the TTL still asks it (StoreSaysChanged).
  if (!n || !S_ISREG(n->rec.mode) || n->rec.nlink == 0 || (!names_ && MonoNs() - n->checked_ns < ttl_ns_)) return false;
  if (!SharedDir(core_.Find(n->rec.parent))) return false;
  return Droppable(n, core_.ns.EntryPath(n->rec.parent, n->rec.name));
}

void SharedNamespace::RevalidateForOpen(uint64_t ino, int flags) {
  if (!RevalidateDue(ino, flags)) return;
  if (names_ && !StoreSaysChanged(ino)) return;
  std::string path;
  uint64_t parent;
  std::string name;
  bool list;
  {
    MutexLock lk(&mu());
    Inode* n = core_.Find(ino);
    if (!n) return;
    parent = n->rec.parent;
    list = ListsInsteadOfStat(core_.Find(parent));
  }
  // Listed, it is compared with the backend as every name there is (and
  // the next opens in that directory need nothing for a TTL).
  if (list) MergeDir(parent);
  {
    MutexLock lk(&mu());
    Inode* n = core_.Find(ino);
    if (!n || MonoNs() - n->checked_ns < ttl_ns_) return;
    n->checked_ns = MonoNs();
    parent = n->rec.parent;
    name = n->rec.name;
    path = core_.ns.EntryPath(parent, name);
  }
  auto e = core_.backend()->Stat(path);
  if (!e) {
    // Gone there: the next lookup or listing drops it; the open goes on
    // with what it has (or fails its fetch with EIO).
    LOG_DEBUG("shared: stat '{}' at open: {}", path, strerror(e.error()));
    return;
  }
  MutexLock lk(&mu());
  Inode* p = core_.Find(parent);
  if (!p || !p->is_dir()) return;
  auto it = p->children.find(name);
  if (it == p->children.end() || it->second != ino) return;  // renamed or replaced meanwhile
  if (Inode* n = core_.Find(ino); n && e->type == backend::Entry::Type::kFile) FollowBackend(p, name, n, *e);
}

bool SharedNamespace::TakeBackendChanged(uint64_t ino) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n || !n->backend_changed) return false;
  n->backend_changed = false;
  return true;
}

Status SharedNamespace::ImportBackend() {
  MutexLock lk(&mu());
  auto imported = core_.store()->GetCounter(kImportedCounter);
  if (!imported) return Err(imported.error());
  if (*imported || !core_.backend()) return {};
  Batch b;
  std::unordered_map<std::string, uint64_t> dirs{{"", meta::kRootIno}};
  uint64_t count = 0;
  auto st = core_.backend()->List([&](const backend::Entry& e) {
    mu().AssertHeld();  // called back while ImportBackend holds the namespace lock
    auto slash = e.path.rfind('/');
    std::string parent_path = slash == std::string::npos ? "" : e.path.substr(0, slash);
    std::string name = slash == std::string::npos ? e.path : e.path.substr(slash + 1);
    auto pit = dirs.find(parent_path);
    if (pit == dirs.end() || name.empty() || name.size() > kMaxName) {
      LOG_WARN("import: skipping backend entry '{}'", e.path);
      return;
    }
    Inode* p = core_.Find(pit->second);
    if (p->children.count(name)) return;
    Inode* n = AdoptEntry(p, name, e, &b);
    if (e.type == backend::Entry::Type::kDir) dirs[e.path] = n->rec.ino;
    count++;
  });
  if (!st) return st;
  MetaStore::PutCounter(&b, kNextInoCounter, core_.ns.next_ino());
  MetaStore::PutCounter(&b, kImportedCounter, 1);
  if (auto c = core_.Commit(b, true); !c) return c;
  if (count) LOG_INFO("import: {} entries found in the backend {}", count, core_.backend()->Describe());
  return {};
}

Inode* SharedNamespace::AdoptEntry(Inode* p, const std::string& name, const backend::Entry& e, Batch* b) {
  Inode* root = core_.Find(meta::kRootIno);
  auto n = std::make_unique<Inode>();
  InodeRecord& r = n->rec;
  r.ino = core_.ns.TakeIno();
  r.parent = p->rec.ino;
  r.name = name;
  r.uid = root->rec.uid;
  r.gid = root->rec.gid;
  r.mtime = r.atime = r.ctime = {e.mtime_sec, e.mtime_nsec};
  r.version = 1;
  switch (e.type) {
    case backend::Entry::Type::kDir:
      r.mode = S_IFDIR | (e.mode ? ImportedMode(e.mode) : 0755);
      r.nlink = 2;
      r.state = DataState::kPersisted;
      p->rec.nlink++;
      break;
    case backend::Entry::Type::kFile:
      r.mode = S_IFREG | (e.mode ? ImportedMode(e.mode) : 0644);
      r.nlink = 1;
      r.size = r.sealed_size = e.size;
      core_.residency.SawFile(e.size);  // what a checkpoint here weighs
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
  MetaStore::PutInode(b, r);
  MetaStore::PutInode(b, p->rec);
  MetaStore::PutDentry(b, p->rec.ino, name, r.ino, DirentType(r.mode));
  p->children.emplace(name, r.ino);
  Inode* out = n.get();
  core_.ns.Insert(std::move(n));
  if (e.type == backend::Entry::Type::kFile) {
    core_.residency.Add(r.ino);
    core_.SetBackendPath(out, e.path);
  }
  return out;
}

}  // namespace ckpt::fs
