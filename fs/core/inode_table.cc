// inode_table.cc — the namespace: lookups, attributes, directory entries,
// links, renames and xattrs over the in-memory inode map, each committed to
// fs/meta as one Batch before the map changes. The write path, the drain
// log, recovery and residency (evict, fetch) are in file_state.cc,
// oplog.cc, recovery.cc and residency.cc.
#include "fs/core/core_impl.h"

namespace ckpt::fs {

namespace {
Status CheckName(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return Err(EINVAL);
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  if (name.find('/') != std::string_view::npos) return Err(EINVAL);
  return {};
}
void Touch(Inode* dir, const meta::Timespec& t) { dir->rec.mtime = dir->rec.ctime = t; }

// What the backend holds under an entry's name once the log before now is
// applied. Directories and symlinks are logged when made; a regular file
// once sealed (or imported from the backend: clean, or with a checksum).
// Fifos, sockets and devices never reach it. A file made here and not
// sealed yet has nothing there, or the bytes of a file it was renamed over
// while open, which its persist or its removal replaces in turn.
enum class Held { kNothing, kMaybeStale, kEntry };

Held BackendHolds(const InodeRecord& r) {
  if (S_ISDIR(r.mode) || S_ISLNK(r.mode)) return Held::kEntry;
  if (!S_ISREG(r.mode)) return Held::kNothing;
  if (r.version > 0 || r.state != meta::DataState::kDirty || (r.checksum_hi | r.checksum_lo) != 0) return Held::kEntry;
  return Held::kMaybeStale;
}

LogEntry RemovalOf(const InodeRecord& r, std::string path) {
  LogEntry e;
  e.op = LogOp::kUnlink;
  e.ino = r.ino;
  e.path = std::move(path);
  return e;
}

// The entries that replay a rename (`from` -> `to`; dst: what `to` names,
// or null) on the backend, where the backend lacks a side
// (docs/consistency.md, "Renames, special files and exchanges").
std::vector<LogEntry> BackendRename(const InodeRecord& src, const InodeRecord* dst, std::string from, std::string to,
                                    bool exchange) {
  LogEntry mv;
  mv.op = LogOp::kRename;
  mv.flags = exchange ? 1 : 0;
  mv.ino = src.ino;
  mv.mode = src.mode;  // its type, for the cluster store's names (fs/cluster/etcd_names.h)
  mv.path = std::move(from);
  mv.path2 = std::move(to);
  const Held s = BackendHolds(src), d = dst ? BackendHolds(*dst) : Held::kNothing;
  if (!exchange) {
    // Its rename is a no-op in the backend, which would keep the file it
    // replaces (an ENOENT there is "nothing to do": a file renamed while
    // open comes later, by its persist, and must not delete `to` now).
    if (dst && s == Held::kNothing) return {RemovalOf(*dst, mv.path2), mv};
    return {mv};
  }
  // renameat2 exchanges only two names the backend has, and was a no-op
  // there otherwise: the side it holds moves to the other's name instead
  // (replacing what may be stale there), and the other side's persist, if
  // it is a file, comes later under its new name.
  if (s == Held::kEntry && d == Held::kEntry) return {mv};
  if (s == Held::kNothing && d == Held::kNothing) return {};
  mv.flags = 0;
  const InodeRecord& moved = d > s ? *dst : src;
  const InodeRecord& other = d > s ? src : *dst;
  if (d > s) std::swap(mv.path, mv.path2);
  mv.ino = moved.ino;
  mv.mode = moved.mode;
  // A directory does not replace a file in a rename: a stale one goes first.
  if (S_ISDIR(moved.mode) && BackendHolds(other) == Held::kMaybeStale) return {RemovalOf(other, mv.path2), mv};
  return {mv};
}
}  // namespace

void InodeTable::FillStat(const InodeRecord& r, struct stat* st) {
  *st = {};
  st->st_ino = r.ino;
  st->st_mode = r.mode;
  st->st_nlink = r.nlink;
  st->st_uid = r.uid;
  st->st_gid = r.gid;
  st->st_rdev = r.rdev;
  st->st_size = static_cast<off_t>(S_ISLNK(r.mode) ? r.target.size() : r.size);
  // The preferred I/O size, which stdio and Python size their buffers by:
  // with passthrough the kernel serves reads and writes from a tmpfs file,
  // so report what tmpfs does (a page) — 1 MiB made every small buffered
  // read (zipfile's header reads, torch.load's record headers) read 1 MiB
  // (issue #15: the mmap load of 64 shards spent 33 ms on that). Without
  // passthrough every request is a round trip to the daemon, and large
  // buffers keep them few.
  st->st_blksize = core_.passthrough.active() ? 4096 : 1 << 20;
  uint64_t alloc = S_ISREG(r.mode) ? core_.tier()->AllocatedBytes(r.ino) : 0;
  if (S_ISREG(r.mode) && r.state == meta::DataState::kRemote) alloc = r.size;
  st->st_blocks = static_cast<blkcnt_t>((alloc + 511) / 512);
  st->st_atim = {r.atime.sec, r.atime.nsec};
  st->st_mtim = {r.mtime.sec, r.mtime.nsec};
  st->st_ctim = {r.ctime.sec, r.ctime.nsec};
}

Result<InodeRecord> InodeTable::LookupForReaddir(uint64_t ino) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  n->nlookup++;
  return n->rec;
}

void InodeTable::Forget(uint64_t ino, uint64_t count) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return;
  if (n->nlookup < count) {
    LOG_ERROR("ino {}: forget {} exceeds lookup count {}", ino, count, n->nlookup);
    n->nlookup = 0;
  } else {
    n->nlookup -= count;
  }
  core_.MaybeDelete(n);
}

void InodeTable::PurgeOrphans() {
  MutexLock lk(&mu());
  std::vector<Inode*> gone;
  for (auto& [ino, n] : core_.ns.all())
    if (n->rec.nlink == 0) gone.push_back(n.get());
  for (Inode* n : gone) {
    n->nlookup = 0;
    n->opens = 0;
    core_.MaybeDelete(n);
  }
}

Result<InodeRecord> InodeTable::GetAttr(uint64_t ino) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  return n->rec;
}

Result<InodeRecord> InodeTable::SetAttr(uint64_t ino, const AttrChange& c) {
  if (auto st = core_.Writable(); !st) return Err(st.error());
  if ((c.to_set & kSetSize) && c.size > core_.limits().max_file_size) return Err(EFBIG);
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  if ((c.to_set & kSetSize) && S_ISREG(n->rec.mode) && n->rec.state == DataState::kRemote && c.size != 0) {
    if (auto st = EnsureLocal(ino); !st) return Err(st.error());
    n = core_.Find(ino);
    if (!n) return Err(ENOENT);
  }
  // A truncate changes the bytes: under the data lock, after the sealed
  // version is kept (copied outside the namespace lock if bytes stay; moved, below, if
  // nobody writes and none stay).
  Core::DataShared data;
  if ((c.to_set & kSetSize) && S_ISREG(n->rec.mode) && (n->writers > 0 || c.size != 0)) {
    lk.Unlock();
    auto l = LockForMutation(ino, true);
    if (!l) return Err(l.error());
    data = std::move(*l);
    lk.Lock();
    n = core_.Find(ino);
    if (!n) return Err(ENOENT);
  }
  InodeRecord r = n->rec;
  meta::Timespec now = core_.Now();
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
    // The sealed version is kept already (copied above), or moved aside
    // now: truncate(2) to 0 of a file nobody writes.
    if (!data.owns_lock())
      if (auto st = core_.versions.MoveAside(core_.ns, n); !st) return Err(st.error());
    if (auto st = core_.tier()->Truncate(ino, c.size); !st) return Err(st.error());
    r.size = c.size;
    r.mtime = now;
    r.state = *NextState(r.state, FileEvent::kChange);
    n->data_gen++;
  }
  if (c.to_set & kSetAtime) r.atime = c.atime;
  if (c.to_set & kSetMtime) r.mtime = c.mtime;
  r.ctime = now;
  n->rec = r;
  Batch b;
  std::vector<LogEntry> log;
  uint64_t dropped = 0;
  if ((c.to_set & kSetSize) && n->opens == 0 && r.nlink > 0) {
    // truncate(2) of a closed file: a new version now
    dropped = core_.versions.Seal(core_.ns, n, core_.ckpts.MemoryOnlyAt(core_.ns, n, n->rec.parent), &b, &log);
  } else if ((c.to_set & (kSetMode | kSetMtime | kSetUid | kSetGid)) && r.nlink > 0 &&
             (S_ISREG(r.mode) || S_ISDIR(r.mode)) && ino != meta::kRootIno &&
             !core_.ckpts.MemoryOnlyAt(core_.ns, n, r.parent)) {
    LogEntry e;
    e.op = LogOp::kSetattr;
    e.ino = ino;
    e.mode = n->rec.mode;
    e.mtime = n->rec.mtime;
    e.uid = n->rec.uid;
    e.gid = n->rec.gid;
    e.has_owner = true;
    e.path = S_ISDIR(r.mode) ? core_.ns.DirPath(ino) : core_.ns.EntryPath(r.parent, r.name);
    core_.oplog.Append(&b, e, &log);
  }
  MetaStore::PutInode(&b, n->rec);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  core_.versions.Supersede(dropped, ino, n->rec.version - 1);
  n->size_dirty = false;
  return n->rec;
}

Result<InodeRecord> InodeTable::NewNode(uint64_t parent, std::string_view name, uint32_t mode, Caller who,
                                        std::string_view target, uint64_t rdev, bool seal) {
  if (auto st = CheckName(name); !st) return Err(st.error());
  if (auto st = core_.Writable(); !st) return Err(st.error());
  MutexLock lk(&mu());
  auto dir = core_.ns.FindDir(parent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  if (p->rec.nlink == 0) return Err(ENOENT);  // creating in a removed directory
  if (p->children.count(name)) return Err(EEXIST);
  if (auto st = core_.CheckNewName(parent, name); !st) return Err(st.error());

  auto n = std::make_unique<Inode>();
  InodeRecord& r = n->rec;
  r.ino = core_.ns.next_ino();
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
  r.atime = r.mtime = r.ctime = core_.Now();
  r.state = S_ISREG(mode) ? meta::DataState::kDirty : meta::DataState::kPersisted;
  // A new checkpoint gets its number, and the policy decides now whether
  // it drains; inside a memory-only one nothing is logged.
  const bool under_memory_only = core_.ckpts.UnderMemoryOnly(core_.ns, parent);
  if ((S_ISDIR(mode) || S_ISREG(mode)) && !under_memory_only && core_.ckpts.Starts(core_.ns, parent, name)) {
    r.ckpt_ord = core_.ckpts.next();
    r.memory_only = core_.ckpts.ChooseMemoryOnly(r.ckpt_ord);
  }

  InodeRecord pr = p->rec;
  Touch(p, r.mtime);
  pr.mtime = pr.ctime = r.mtime;
  if (S_ISDIR(mode)) pr.nlink++;

  Batch b;
  std::vector<LogEntry> log;
  if ((S_ISDIR(mode) || S_ISLNK(mode)) && !under_memory_only && !r.memory_only)
    core_.oplog.Append(&b, VersionStore::MakeEntry(r, core_.ns.EntryPath(parent, name)), &log);
  if (S_ISREG(mode)) n->data_gen = 1;  // a new file is sealed at its first close
  seal = seal && S_ISREG(mode);
  if (seal) {
    // mknod(2): no close follows, and a file never sealed never drains
    // (nor survives a restart). Sealed empty now, from an empty tier file.
    if (auto st = core_.tier()->Truncate(r.ino, 0); !st) return Err(st.error());
    (void)core_.versions.Seal(core_.ns, n.get(), under_memory_only || r.memory_only, &b, &log);
  }
  MetaStore::PutInode(&b, r);
  MetaStore::PutInode(&b, pr);
  MetaStore::PutDentry(&b, parent, name, r.ino, DirentType(mode));
  MetaStore::PutCounter(&b, kNextInoCounter, core_.ns.next_ino() + 1);
  if (r.ckpt_ord > 0) MetaStore::PutCounter(&b, kCheckpointCounter, r.ckpt_ord + 1);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) {
    if (seal) core_.tier()->Remove(r.ino);
    return Err(st.error());
  }
  if (r.ckpt_ord > 0) {
    core_.ckpts.ReserveUpTo(r.ckpt_ord + 1);
    LOG_DEBUG("checkpoint {} '{}' made{}", r.ckpt_ord, core_.ns.EntryPath(parent, name),
              r.memory_only ? " (memory-only)" : "");
  }

  p->rec = pr;
  p->children.emplace(std::string(name), r.ino);
  n->nlookup = 1;
  InodeRecord out = r;
  if (S_ISREG(r.mode)) core_.residency.Add(r.ino);
  core_.ns.Insert(std::move(n));
  return out;
}

Result<InodeRecord> InodeTable::Mknod(uint64_t parent, std::string_view name, uint32_t mode, uint64_t rdev, Caller who,
                                      bool seal) {
  if (S_ISDIR(mode) || S_ISLNK(mode)) return Err(EINVAL);
  if ((mode & S_IFMT) == 0) mode |= S_IFREG;
  return NewNode(parent, name, mode, who, {}, rdev, seal);
}

Result<InodeRecord> InodeTable::Mkdir(uint64_t parent, std::string_view name, uint32_t mode, Caller who) {
  return NewNode(parent, name, S_IFDIR | (mode & 07777), who, {}, 0);
}

Result<InodeRecord> InodeTable::Symlink(uint64_t parent, std::string_view name, std::string_view target, Caller who) {
  if (target.empty()) return Err(ENOENT);
  if (target.size() >= 4096) return Err(ENAMETOOLONG);
  return NewNode(parent, name, S_IFLNK | 0777, who, target, 0);
}

Result<std::string> InodeTable::Readlink(uint64_t ino) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  if (!S_ISLNK(n->rec.mode)) return Err(EINVAL);
  return n->rec.target;
}

Result<InodeRecord> InodeTable::Link(uint64_t ino, uint64_t newparent, std::string_view newname) {
  if (auto st = CheckName(newname); !st) return Err(st.error());
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  if (n->is_dir()) return Err(EPERM);
  auto dir = core_.ns.FindDir(newparent);
  if (!dir) return Err(dir.error());
  Inode* p = *dir;
  if (p->rec.nlink == 0) return Err(ENOENT);
  if (p->children.count(newname)) return Err(EEXIST);
  if (n->rec.nlink >= 65000) return Err(EMLINK);
  if (auto st = core_.Writable(); !st) return Err(st.error());
  if (auto st = core_.CheckNewName(newparent, newname); !st) return Err(st.error());
  // A name in a memory-only checkpoint for a file that drains, or the
  // other way round, would leave the backend with half of it.
  const bool memory_only = core_.ckpts.MemoryOnlyAt(core_.ns, n, n->rec.parent);
  if (memory_only != core_.ckpts.UnderMemoryOnly(core_.ns, newparent)) return Err(EXDEV);

  meta::Timespec now = core_.Now();
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
  e.path = core_.ns.EntryPath(n->rec.parent, n->rec.name);
  e.path2 = core_.ns.EntryPath(newparent, newname);
  if (!memory_only) core_.oplog.Append(&b, e, &log);
  MetaStore::PutInode(&b, r);
  MetaStore::PutInode(&b, pr);
  MetaStore::PutDentry(&b, newparent, newname, ino, DirentType(r.mode));
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) return Err(st.error());
  n->rec = r;
  p->rec = pr;
  p->children.emplace(std::string(newname), ino);
  n->nlookup++;
  return r;
}

void InodeTable::RepointPrimary(Inode* n, uint64_t gone_parent, std::string_view gone_name) {
  if (n->rec.parent != gone_parent || n->rec.name != gone_name || n->rec.nlink == 0) return;
  // Rare: the first link of a hard-linked file went away; find another.
  for (auto& [dino, d] : core_.ns.all()) {
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

Result<std::pair<Inode*, Inode*>> InodeTable::EntryToRemove(uint64_t parent, std::string_view name) {
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  if (auto st = core_.Writable(); !st) return Err(st.error());
  return core_.DirAndChild(parent, name);
}

Status InodeTable::Unlink(uint64_t parent, std::string_view name) {
  MutexLock lk(&mu());
  auto pc = EntryToRemove(parent, name);
  if (!pc) return Err(pc.error());
  auto [p, n] = *pc;
  if (n->is_dir()) return Err(EISDIR);

  meta::Timespec now = core_.Now();
  InodeRecord pr = p->rec;
  pr.mtime = pr.ctime = now;
  const bool memory_only = core_.ckpts.MemoryOnlyAt(core_.ns, n, parent);
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
  e.path = core_.ns.EntryPath(parent, name);
  if (!memory_only) core_.oplog.Append(&b, e, &log);  // rotation of a memory-only checkpoint never reaches the backend
  MetaStore::PutInode(&b, pr);
  MetaStore::DeleteDentry(&b, parent, name);
  MetaStore::PutInode(&b, tmp.rec);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) {
    p->children.emplace(std::string(name), n->rec.ino);
    return st;
  }
  p->rec = pr;
  n->rec = tmp.rec;
  core_.MaybeDelete(n);
  return {};
}

Status InodeTable::Rmdir(uint64_t parent, std::string_view name) {
  if (name == ".") return Err(EINVAL);
  if (name == "..") return Err(ENOTEMPTY);
  MutexLock lk(&mu());
  auto pc = EntryToRemove(parent, name);
  if (!pc) return Err(pc.error());
  auto [p, n] = *pc;
  if (!n->is_dir()) return Err(ENOTDIR);
  if (!n->children.empty()) return Err(ENOTEMPTY);

  meta::Timespec now = core_.Now();
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
  e.path = core_.ns.EntryPath(parent, name);
  if (!core_.ckpts.MemoryOnlyAt(core_.ns, n, parent)) core_.oplog.Append(&b, e, &log);
  MetaStore::PutInode(&b, pr);
  MetaStore::DeleteDentry(&b, parent, name);
  MetaStore::PutInode(&b, r);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) return st;
  p->rec = pr;
  n->rec = r;
  p->children.erase(p->children.find(name));
  core_.MaybeDelete(n);
  return {};
}

Status InodeTable::Rename(uint64_t parent, std::string_view name, uint64_t newparent, std::string_view newname,
                          unsigned flags) {
  if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Err(EINVAL);
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)) return Err(EINVAL);
  if (auto st = CheckName(newname); !st) return st;
  if (name.size() > kMaxName) return Err(ENAMETOOLONG);
  MutexLock lk(&mu());
  auto sd = core_.ns.FindDir(parent);
  if (!sd) return Err(sd.error());
  auto dd = core_.ns.FindDir(newparent);
  if (!dd) return Err(dd.error());
  Inode *sp = *sd, *dp = *dd;
  auto sc = core_.Child(sp, name);
  if (!sc) return Err(sc.error());
  Inode* src = *sc;
  Inode* dst = nullptr;
  if (auto it = dp->children.find(newname); it != dp->children.end()) dst = core_.Find(it->second);

  if (dst == src) return {};  // same inode: POSIX says do nothing
  if (src->is_dir() && core_.ns.IsAncestor(src->rec.ino, newparent)) return Err(EINVAL);
  if (flags & RENAME_NOREPLACE && dst) return Err(EEXIST);
  if (flags & RENAME_EXCHANGE) {
    if (!dst) return Err(ENOENT);
    if (dst->is_dir() && core_.ns.IsAncestor(dst->rec.ino, parent)) return Err(EINVAL);
  } else if (dst) {
    if (src->is_dir() && !dst->is_dir()) return Err(ENOTDIR);
    if (!src->is_dir() && dst->is_dir()) return Err(EISDIR);
    if (dst->is_dir() && !dst->children.empty()) return Err(ENOTEMPTY);
  }
  if (auto st = core_.Writable(); !st) return st;
  // A directory moved is checked by its deepest path, where paths are bounded.
  const bool bounded = core_.limits().max_path != SIZE_MAX;
  if (auto st = core_.CheckNewName(newparent, newname, bounded && src->is_dir() ? core_.ns.SubtreePathLen(src) : 0);
      !st)
    return st;
  if (dst && (flags & RENAME_EXCHANGE))
    if (auto st = core_.CheckNewName(parent, name, bounded && dst->is_dir() ? core_.ns.SubtreePathLen(dst) : 0); !st)
      return st;
  // Memory-only checkpoints (--persist-every): a move stays on its side of
  // the line. Into one, the backend would keep what was moved away; out of
  // one, the backend would lack what it holds. EXDEV: `mv` copies instead
  // (and so creates, logs and deletes what it must).
  const bool memory_only = core_.ckpts.MemoryOnlyAt(core_.ns, src, parent);
  if (memory_only != core_.ckpts.MemoryOnlyAt(core_.ns, src, newparent)) return Err(EXDEV);
  if (dst && (core_.ckpts.MemoryOnlyAt(core_.ns, dst, newparent) != memory_only ||
              core_.ckpts.MemoryOnlyAt(core_.ns, dst, parent) != memory_only))
    return Err(EXDEV);
  // A tree renamed into a checkpoint's name (`tmp-step` -> `step_5`) is a
  // checkpoint from now on: numbered, never memory-only (what it holds was
  // logged already).
  uint64_t new_ord = 0;
  if (!memory_only && src->rec.ckpt_ord == 0 && (src->is_dir() || S_ISREG(src->rec.mode)) &&
      core_.ckpts.Starts(core_.ns, newparent, newname))
    new_ord = core_.ckpts.next();

  meta::Timespec now = core_.Now();
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
  if (!memory_only)
    for (const LogEntry& e : BackendRename(sr, dst ? &dst->rec : nullptr, core_.ns.EntryPath(parent, name),
                                           core_.ns.EntryPath(newparent, newname), exchange))
      core_.oplog.Append(&b, e, &log);
  if (new_ord > 0) {
    sr.ckpt_ord = new_ord;
    MetaStore::PutCounter(&b, kCheckpointCounter, new_ord + 1);
  }
  if (exchange) {
    if (!same_dir && src->is_dir()) {
      from->nlink--;
      to->nlink++;
    }
    if (!same_dir && dst->is_dir()) {
      to->nlink--;
      from->nlink++;
    }
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
    if (!same_dir && src->is_dir()) {
      from->nlink--;
      to->nlink++;
    }
    relink(sr, parent, name, newparent, newname);
    MetaStore::DeleteDentry(&b, parent, name);
    MetaStore::PutDentry(&b, newparent, newname, sr.ino, DirentType(sr.mode));
    if (dst) MetaStore::PutInode(&b, dr);
  }
  MetaStore::PutInode(&b, sr);
  MetaStore::PutInode(&b, spr);
  if (!same_dir) MetaStore::PutInode(&b, dpr);
  if (auto st = core_.CommitWithLog(b, std::move(log)); !st) return st;
  if (new_ord > 0) core_.ckpts.ReserveUpTo(new_ord + 1);

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
      core_.MaybeDelete(dst);
    }
  }
  return {};
}

Result<std::vector<DirEntry>> InodeTable::ListDir(uint64_t ino) {
  MutexLock lk(&mu());
  auto dir = core_.ns.FindDir(ino);
  if (!dir) return Err(dir.error());
  Inode* d = *dir;
  std::vector<DirEntry> out;
  out.reserve(d->children.size() + 2);
  out.push_back({".", d->rec.ino, S_IFDIR});
  out.push_back({"..", d->rec.parent, S_IFDIR});
  for (auto& [name, cino] : d->children) {
    Inode* c = core_.Find(cino);
    out.push_back({name, cino, c ? c->rec.mode : 0});
  }
  return out;
}

namespace {

// The namespaces kept here: user.*, and trusted.* and security.*, whose
// writers the kernel checks (CAP_SYS_ADMIN, the LSM). The kernel checks
// nothing for system.* and leaves it to the file system: taken, any user
// could set them on anyone's file (EOPNOTSUPP, as tmpfs without ACLs).
bool KeptNamespace(std::string_view name) {
  return name.starts_with("user.") || name.starts_with("trusted.") || name.starts_with("security.");
}

}  // namespace

Status InodeTable::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  if (name.empty() || name.size() > 255) return Err(ERANGE);
  if (value.size() > kMaxXattrValue) return Err(E2BIG);
  if (!KeptNamespace(name)) return Err(EOPNOTSUPP);
  if (name.starts_with("user.ckptfs.")) return Err(EPERM);
  if (auto st = core_.Writable(); !st) return st;
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  auto old = n->xattrs.find(name);
  bool exists = old != n->xattrs.end();
  if ((flags & XATTR_CREATE) && exists) return Err(EEXIST);
  if ((flags & XATTR_REPLACE) && !exists) return Err(ENODATA);
  // All of a file's names and values within kMaxXattrBytes: in RAM and in
  // RocksDB, unbounded they let one user fill the state dir (the mount then
  // goes read-only for everyone) or make listxattr answer ERANGE for good.
  // Their names within what one listxattr returns (XATTR_LIST_MAX).
  size_t total = name.size() + value.size(), names = exists ? 0 : name.size() + 1;
  for (const auto& [k, v] : n->xattrs) {
    names += k.size() + 1;
    if (k != name) total += k.size() + v.size();
  }
  if (total > kMaxXattrBytes || names > XATTR_LIST_MAX) return Err(ENOSPC);
  InodeRecord r = n->rec;
  r.ctime = core_.Now();
  Batch b;
  MetaStore::PutXattr(&b, ino, name, value);
  MetaStore::PutInode(&b, r);
  if (auto st = core_.Commit(b); !st) return st;
  n->rec = r;
  n->xattrs[std::string(name)] = std::string(value);
  return {};
}

Result<std::string> InodeTable::GetXattr(uint64_t ino, std::string_view name) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  if (name == kStateXattr) {
    if (!S_ISREG(n->rec.mode)) return Err(ENODATA);
    // The version the drain holds at (refused for good, retried): `held`.
    if (core_.oplog.HoldsVersion(ino, n->rec.version) && n->rec.state != DataState::kPersisted)
      return std::string("held");
    if ((n->rec.state == DataState::kDirty || n->rec.state == DataState::kDraining) && core_.replicated &&
        n->data_gen == n->sealed_gen && core_.replicated(ino, n->rec.version))
      return std::string("replicated");
    return std::string(meta::DataStateName(n->rec.state));
  }
  if (name == kIoXattr) {
    if (!S_ISREG(n->rec.mode)) return Err(ENODATA);
    return std::string(n->opens == 0 ? "closed" : n->pt_opens > 0 ? "passthrough" : "daemon");
  }
  // One stored before namespaces were checked (a system.* another user
  // set) is inert: neither shown nor listed (cp -a would carry it on).
  if (!KeptNamespace(name)) return Err(EOPNOTSUPP);
  auto it = n->xattrs.find(name);
  if (it == n->xattrs.end()) return Err(ENODATA);
  return it->second;
}

Result<std::string> InodeTable::ListXattr(uint64_t ino) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  std::string out;
  for (auto& [k, v] : n->xattrs) {
    if (!KeptNamespace(k)) continue;  // stored before namespaces were checked: inert
    out.append(k);
    out.push_back('\0');
  }
  return out;
}

Status InodeTable::RemoveXattr(uint64_t ino, std::string_view name) {
  if (!KeptNamespace(name)) return Err(EOPNOTSUPP);
  if (name.starts_with("user.ckptfs.")) return Err(EPERM);
  if (auto st = core_.Writable(); !st) return st;
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  if (!n) return Err(ENOENT);
  auto it = n->xattrs.find(name);
  if (it == n->xattrs.end()) return Err(ENODATA);
  InodeRecord r = n->rec;
  r.ctime = core_.Now();
  Batch b;
  MetaStore::DeleteXattr(&b, ino, name);
  MetaStore::PutInode(&b, r);
  if (auto st = core_.Commit(b); !st) return st;
  n->rec = r;
  n->xattrs.erase(it);
  return {};
}

// ---- Paths and the log ----

}  // namespace ckpt::fs
