// recovery.cc — start-up: the namespace, the drain log and the tier re-attached
// from fs/meta and the tier directory, lost files dropped and listed, and the
// backend imported on a first mount. Runs before the mount serves requests.
//
// A function over the core's parts (fs/core/recovery.h), as LevelDB's
// recovery is one over VersionSet and the log.
#include "fs/core/recovery.h"

#include "fs/core/core_impl.h"

namespace ckpt::fs {

namespace {

// One regular file's bytes against its metadata. Returns false if the
// file is lost.
bool RecoverFile(Core& core, Inode* n, const std::unordered_map<uint64_t, uint64_t>& sizes, Batch* b)
    REQUIRES(core.mu());
// Takes out of `lost` the files whose pending version the backend already
// holds (published, then the daemon died before the commit).
void AdoptPublished(Core& core, std::vector<Inode*>* lost, Batch* b) REQUIRES(core.mu());
// Removes a lost file's names and records it; logs an unlink of each, so
// an older copy the backend holds under that name goes too (backend ==
// mount after the drain).
void DropLost(Core& core, Inode* n, std::string_view reason, Batch* b, std::vector<LogEntry>* out) REQUIRES(core.mu());

}  // namespace

Status Recover(Core& core, Caller root_owner, bool track_removals) {
  MutexLock lk(&core.mu());
  auto next = core.store()->GetCounter(kNextInoCounter);
  if (!next) return Err(next.error());
  core.ns.ReserveUpTo(*next);

  auto st = core.store()->ForEachInode([&](InodeRecord&& r) {
    core.mu().AssertHeld();  // called back while Load holds the namespace lock
    auto n = std::make_unique<Inode>();
    n->rec = std::move(r);
    if (S_ISREG(n->rec.mode)) core.residency.Add(n->rec.ino);
    core.ns.Insert(std::move(n));
  });
  if (!st) return st;

  Batch fix;
  st = core.store()->ForEachDentry([&](uint64_t parent, std::string_view name, meta::DentryValue v) {
    core.mu().AssertHeld();  // called back while Load holds the namespace lock
    Inode* p = core.Find(parent);
    if (!p || !p->is_dir() || !core.Find(v.ino)) {
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
  for (auto& [ino, n] : core.ns.all()) {
    uint64_t cur = ino;
    for (size_t steps = 0; cur != meta::kRootIno; steps++) {
      Inode* c = core.Find(cur);
      if (!c) break;  // a dangling parent: the path stops there
      if (steps > core.ns.size()) {
        LOG_ERROR("metadata: the parents of ino {} ('{}') form a cycle; the state dir is damaged", ino, n->rec.name);
        return Err(EUCLEAN);
      }
      cur = c->rec.parent;
    }
  }
  st = core.store()->ForEachXattr([&](uint64_t ino, std::string_view name, std::string_view value) {
    core.mu().AssertHeld();  // called back while Load holds the namespace lock
    if (Inode* n = core.Find(ino)) n->xattrs.emplace(std::string(name), std::string(value));
  });
  if (!st) return st;

  auto ckpt = core.store()->GetCounter(kCheckpointCounter);
  if (!ckpt) return Err(ckpt.error());
  core.ckpts.ReserveUpTo(*ckpt);
  for (auto& [ino, n] : core.ns.all()) core.ckpts.ReserveUpTo(n->rec.ckpt_ord + 1);

  auto applied = core.store()->GetCounter(kAppliedCounter);
  if (!applied) return Err(applied.error());
  std::vector<LogEntry> pending;
  st = core.store()->ForEachLogEntry([&](LogEntry&& e) {
    core.mu().AssertHeld();  // called back while Load holds the namespace lock
    if (e.op == LogOp::kPersist)
      if (Inode* n = core.Find(e.ino)) n->seal_seq = e.seq;
    pending.push_back(std::move(e));
  });
  if (!st) return st;
  core.oplog.set_track_removals(track_removals);
  core.oplog.Restore(*applied, std::move(pending));

  if (!core.Find(meta::kRootIno)) {
    auto root = std::make_unique<Inode>();
    InodeRecord& r = root->rec;
    r.ino = r.parent = meta::kRootIno;
    r.mode = S_IFDIR | 0755;
    r.uid = root_owner.uid;
    r.gid = root_owner.gid;
    r.nlink = 2;
    r.atime = r.mtime = r.ctime = core.Now();
    r.state = meta::DataState::kPersisted;
    MetaStore::PutInode(&fix, r);
    core.ns.Insert(std::move(root));
  }

  // Orphans: inodes no name holds (unlinked while open, then the daemon
  // stopped). Their bytes are unreachable; free them.
  std::vector<uint64_t> orphans;
  for (auto& [ino, n] : core.ns.all())
    if (n->rec.nlink == 0 && ino != meta::kRootIno) orphans.push_back(ino);
  for (uint64_t ino : orphans) {
    Inode* n = core.Find(ino);
    MetaStore::DeleteInode(&fix, ino);
    for (auto& [k, v] : n->xattrs) MetaStore::DeleteXattr(&fix, ino, k);
    // Its pending version still drains: without its bytes kept aside, a
    // close that returned would end as "lost". Refuse to go on instead.
    if (S_ISREG(n->rec.mode))
      if (auto p = core.versions.MoveAside(core.ns, n); !p) return p;
    core.tier()->Remove(ino);
    core.EraseInode(n);
  }
  MetaStore::PutCounter(&fix, kNextInoCounter, core.ns.next_ino());
  if (auto c = core.Commit(fix, true); !c) return c;

  // The tier against the metadata: every regular file's bytes, and the
  // snapshots the pending log needs. Lost files leave the namespace here.
  std::unordered_map<uint64_t, uint64_t> sizes;  // tier key -> st_size
  for (auto [key, size] : core.tier()->attached()) sizes[key] = size;
  std::set<uint64_t> wanted;
  for (const LogEntry& e : core.oplog.Pending(SIZE_MAX))
    if (e.op == LogOp::kPersist) wanted.insert(cache::SnapKey(e.ino, e.version));
  for (auto [key, size] : sizes) {
    if (!core.tier()->Has(key)) continue;  // removed above (an orphan inode's bytes)
    Inode* n = core.Find(cache::IsSnapKey(key) ? cache::SnapIno(key) : key);
    // A snapshot the log still needs is kept even when its inode is gone
    // (the file was deleted with a version on its way to the backend).
    if (cache::IsSnapKey(key) && (n || wanted.count(key))) {
      bool current = n && S_ISREG(n->rec.mode) && cache::SnapMatches(key, n->rec.ino, n->rec.version);
      if (!wanted.count(key) && !current) core.tier()->Remove(key);  // published (or superseded) before the stop
      continue;
    }
    if (!n || !S_ISREG(n->rec.mode)) {
      // Never deleted: the metadata may be what is wrong. The operator
      // finds them in orphans/ (counted by `ckptfs status`).
      if (auto o = core.tier()->Orphan(key); !o) {
        LOG_ERROR("tier: cannot move the file of unknown ino {:016x} to orphans/: {}", key, strerror(o.error()));
        return o;
      }
      LOG_WARN("tier: file of unknown ino {:016x} ({} bytes) moved to {}/orphans/", key, size, core.tier()->dir());
    }
  }
  Batch rec;
  std::vector<Inode*> files;
  for (auto& [ino, n] : core.ns.all())
    if (S_ISREG(n->rec.mode) && n->rec.nlink > 0) files.push_back(n.get());
  std::vector<Inode*> lost;
  for (Inode* n : files)
    if (!RecoverFile(core, n, sizes, &rec)) lost.push_back(n);
  if (!lost.empty()) AdoptPublished(core, &lost, &rec);
  std::vector<LogEntry> unlinks;
  for (Inode* n : lost) {
    // Sealed and pending: its replica holders keep that version (they drop
    // it only once this node's record says it was applied) — asked first.
    if (core.keep_lost_for_peers && n->rec.version > 0 && core.versions.SealPending(n) &&
        n->rec.state == DataState::kDirty) {
      LOG_WARN("ino {} '{}': not persisted and not in the memory tier: asked of its replica holders", n->rec.ino,
               core.ns.EntryPath(n->rec.parent, n->rec.name));
      core.awaiting_peers.push_back(n->rec.ino);
      if (n->rec.size != n->rec.sealed_size) {  // what it will hold: the sealed version (as RecoverFile sets it)
        n->rec.size = n->rec.sealed_size;
        MetaStore::PutInode(&rec, n->rec);
      }
      continue;
    }
    DropLost(core, n, "not persisted, and its bytes are not in the memory tier", &rec, &unlinks);
  }
  st = core.store()->ForEachLost(
      [&](uint64_t id, std::string_view path, std::string_view) { core.oplog.RestoreLost(id, path); });
  if (!st) return st;
  st = core.store()->ForEachFailed(
      [&](uint64_t id, std::string_view path, std::string_view reason) { core.oplog.RestoreFailed(id, path, reason); });
  if (!st) return st;
  FAILPOINT("load.recovery");
  if (!rec.empty())
    if (auto c = core.Commit(rec, true); !c) return c;
  core.oplog.Publish(std::move(unlinks));
  // Where the backend holds each file: its current path, unless a pending
  // entry may have moved or removed it there (then found on demand).
  if (!core.oplog.HasMoves())
    for (auto& [ino, n] : core.ns.all())
      if (S_ISREG(n->rec.mode) && n->rec.nlink > 0 &&
          (n->rec.state == DataState::kPersisted || n->rec.state == DataState::kRemote))
        core.SetBackendPath(n.get(), core.ns.EntryPath(n->rec.parent, n->rec.name));
  LOG_INFO("namespace loaded: {} inodes, next ino {}, {} log entries pending", core.ns.size(), core.ns.next_ino(),
           core.oplog.size());
  return {};
}

Status DropAwaited(Core& core, const std::vector<uint64_t>& inos, std::string_view why) {
  MutexLock lk(&core.mu());
  Batch b;
  std::vector<LogEntry> unlinks;
  for (uint64_t ino : inos)
    if (Inode* n = core.Find(ino)) DropLost(core, n, why, &b, &unlinks);
  if (!b.empty())
    if (auto c = core.Commit(b, true); !c) return c;
  core.oplog.Publish(std::move(unlinks));
  return {};
}

namespace {

bool RecoverFile(Core& core, Inode* n, const std::unordered_map<uint64_t, uint64_t>& sizes, Batch* b) {
  InodeRecord& r = n->rec;
  const uint64_t ino = r.ino;
  const std::string path = core.ns.EntryPath(r.parent, r.name);
  const uint64_t snap = cache::SnapKey(ino, r.version);
  const bool pending = core.versions.SealPending(n);
  auto live = sizes.find(ino);
  InodeRecord before = r;
  core.residency.SawFile(r.sealed_size);
  // A passthrough writer that never closed leaves pre-allocated pages past
  // its end: they go back to the budget.
  if (live != sizes.end()) core.tier()->TrimBeyondEof(ino);
  if (r.state == DataState::kDraining) r.state = DataState::kDirty;  // a transfer in flight starts over
  if (core.tier()->Has(snap)) {
    // Being rewritten when the daemon stopped: the last close's version
    // is the snapshot; what was written since was never sealed.
    if (live != sizes.end()) core.tier()->Remove(ino);
    if (auto st = core.tier()->Rekey(snap, ino); !st) {
      LOG_ERROR("ino {} '{}': cannot restore version {}: {}", ino, path, r.version, strerror(st.error()));
      return false;
    }
    r.size = r.sealed_size = sizes.at(snap);
    r.state = pending ? DataState::kDirty : DataState::kPersisted;
    LOG_WARN(
        "ino {} '{}': open for writing when the daemon stopped; back to version {} ({} bytes), sealed at its "
        "last close",
        ino, path, r.version, r.size);
  } else if (pending) {
    // Sealed, not yet in the backend: the live file is that version.
    if (live == sizes.end()) return false;
    if (live->second < r.sealed_size) {
      LOG_ERROR("ino {} '{}': the memory tier holds {} of the {} bytes sealed", ino, path, live->second, r.sealed_size);
      core.tier()->Remove(ino);
      return false;
    }
    if (live->second > r.sealed_size) {
      // Only a passthrough writer grows the live file past a pending seal
      // (the copying path copies the version aside first): it was open
      // after an fsync sealed the file in place. Bytes it overwrote below
      // the sealed size stay as written (docs/consistency.md).
      (void)core.tier()->Truncate(ino, r.sealed_size);
      LOG_WARN(
          "ino {} '{}': open for writing when the daemon stopped; back to version {} ({} bytes), sealed at its "
          "last fsync",
          ino, path, r.version, r.sealed_size);
    }
    r.size = r.sealed_size;
    r.state = DataState::kDirty;
  } else if (r.state == DataState::kDirty && core.ckpts.MemoryOnlyAt(core.ns, n, r.parent)) {
    // In a memory-only checkpoint, rewritten in place when the daemon
    // stopped: the last sealed version has no other copy (the policy's
    // risk, docs/operations.md).
    if (live != sizes.end()) core.tier()->Remove(ino);
    return false;
  } else if (r.state == DataState::kDirty) {
    // Written since its last seal and never closed again (or never
    // closed at all): keep what the last close sealed.
    if (live != sizes.end()) core.tier()->Remove(ino);
    if (r.version == 0) {
      LOG_WARN("ino {} '{}': created but never closed before the daemon stopped", ino, path);
      return false;
    }
    r.size = r.sealed_size;
    r.state = DataState::kRemote;
    LOG_WARN("ino {} '{}': open for writing when the daemon stopped; back to version {} (in the backend)", ino, path,
             r.version);
  } else if (r.state == DataState::kPersisted) {
    if (live == sizes.end() || live->second != r.size) {
      if (live != sizes.end()) {
        LOG_WARN("ino {} '{}': tier holds {} bytes, {} expected; reading it from the backend", ino, path, live->second,
                 r.size);
        core.tier()->Remove(ino);
      }
      r.state = DataState::kRemote;  // fetched again on the next read
    }
  } else if (r.state == DataState::kRemote && live != sizes.end()) {
    core.tier()->Remove(ino);  // a fetch cut short
  } else if (r.state == DataState::kFailed || r.state == DataState::kMemoryOnly) {
    // The backend refused it, or a memory-only checkpoint holds it: the
    // tier holds the only copy.
    if (live == sizes.end() || live->second != r.size) {
      if (live != sizes.end()) core.tier()->Remove(ino);
      return false;
    }
  }
  if (r.state != before.state || r.size != before.size || r.sealed_size != before.sealed_size)
    MetaStore::PutInode(b, r);
  return true;
}

void AdoptPublished(Core& core, std::vector<Inode*>* lost, Batch* b) {
  // The daemon can die after the backend rename and before the RocksDB
  // commit: the version is in the backend, only the record says otherwise.
  // It is that version if name, size, mtime (ns) and a checksum match.
  if (!core.backend()) return;
  std::unordered_map<std::string, backend::Entry> files;
  auto st = core.backend()->List([&](const backend::Entry& e) {
    if (e.type == backend::Entry::Type::kFile && e.has_checksum) files.emplace(e.path, e);
  });
  if (!st) {
    LOG_WARN("recovery: cannot list the backend ({}); files not in the tier count as lost", strerror(st.error()));
    return;
  }
  std::erase_if(*lost, [&](Inode* n) {
    core.mu().AssertHeld();  // called back while Load holds the namespace lock
    InodeRecord& r = n->rec;
    const std::optional<LogEntry> it = n->seal_seq ? core.oplog.Find(n->seal_seq) : std::nullopt;
    if (r.version == 0 || !it || it->op != LogOp::kPersist || it->version != r.version) return false;
    auto f = files.find(it->path);
    if (f == files.end() || f->second.size != r.sealed_size || f->second.mtime_sec != it->mtime.sec ||
        f->second.mtime_nsec != it->mtime.nsec)
      return false;
    LOG_WARN("ino {} '{}': version {} was published before the daemon stopped; taken from the backend", r.ino, it->path,
             r.version);
    r.size = r.sealed_size;
    r.state = DataState::kRemote;
    r.checksum_hi = f->second.checksum_hi;
    r.checksum_lo = f->second.checksum_lo;
    MetaStore::PutInode(b, r);
    MetaStore::DeleteLog(b, it->seq);
    core.oplog.DropRecovered(it->seq);
    n->seal_seq = 0;
    return true;
  });
}

void DropLost(Core& core, Inode* n, std::string_view reason, Batch* b, std::vector<LogEntry>* out) {
  // Every name of the file goes; directories keep their other entries.
  std::vector<std::pair<Inode*, std::string>> names;
  for (auto& [dino, d] : core.ns.all()) {
    if (!d->is_dir()) continue;
    for (auto& [name, child] : d->children)
      if (child == n->rec.ino) names.emplace_back(d.get(), name);
  }
  for (auto& [d, name] : names) {
    std::string path = core.ns.EntryPath(d->rec.ino, name);
    const bool memory_only = core.ckpts.MemoryOnlyAt(core.ns, n, d->rec.ino);
    LOG_ERROR("ino {} '{}': lost ({}); removed from the namespace", n->rec.ino, path, reason);
    core.oplog.AddLost(b, path, reason);
    MetaStore::DeleteDentry(b, d->rec.ino, name);
    d->children.erase(d->children.find(name));
    LogEntry e;
    e.op = LogOp::kUnlink;
    e.ino = n->rec.ino;
    e.path = path;
    if (!memory_only) core.oplog.Append(b, e, out);  // never in the backend
  }
  MetaStore::DeleteInode(b, n->rec.ino);
  for (auto& [k, v] : n->xattrs) MetaStore::DeleteXattr(b, n->rec.ino, k);
  core.tier()->Remove(n->rec.ino);
  core.EraseInode(n);
}

}  // namespace

}  // namespace ckpt::fs
