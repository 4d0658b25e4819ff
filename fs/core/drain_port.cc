// drain_port.cc — the core's side of the drain (fs/core/drain_port.h).
#include "fs/core/drain_port.h"

#include "fs/core/core_impl.h"

namespace ckpt::fs {

namespace {

// How long a file written by the kernel must have been left alone before
// the drain copies a version sealed in place from it: well above a clock
// tick (the mtime's grain), far below the close it would wait for.
constexpr int64_t kQuietNs = 100'000'000;

}  // namespace

Result<PersistSource> DrainPort::BeginPersist(const LogEntry& e) { return Source(e, true); }

Result<PersistSource> DrainPort::ReplicaSource(const LogEntry& e) { return Source(e, false); }

Result<PersistSource> DrainPort::Source(const LogEntry& e, bool stage) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(e.ino);  // takes in a passthrough writer's changes first (they may supersede e)
  if (core_.oplog.Superseded(e.seq)) return Err(ESTALE);
  bool same = n && n->rec.version == e.version && S_ISREG(n->rec.mode);
  PersistSource src;
  uint64_t key = cache::SnapKey(e.ino, e.version);
  if (core_.tier()->Has(key)) {
    auto ref = core_.tier()->Ref(key);
    if (!ref) return Err(ref.error() == ENOENT ? ENODATA : ref.error());
    src.ref = *ref;
    src.gen = same ? n->sealed_gen : 0;
  } else {
    // No snapshot: the live file still holds exactly this version, unless
    // a passthrough writer (which sealed it in place with an fsync) still
    // has it open: wait for its close.
    if (same && n->pt_writers > 0) return Err(EINPROGRESS);
    if (!same || n->data_gen != n->sealed_gen || n->rec.state == DataState::kRemote) return Err(ENODATA);
    auto ref = core_.tier()->Ref(e.ino);
    if (!ref) return Err(ref.error() == ENOENT ? ENODATA : ref.error());
    src.ref = *ref;
    src.gen = n->data_gen;
    src.live = true;
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
  if (stage && same && n->data_gen == src.gen) Transition(n, FileEvent::kStage);
  return src;
}

bool DrainPort::StagedBytesHeld(const LogEntry& e, const PersistSource& src) {
  MutexLock lk(&mu());
  return core_.versions.StagedBytesHeld(e, src);
}

void DrainPort::AbortPersist(const LogEntry& e) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(e.ino);
  if (n) Transition(n, FileEvent::kStageEnd);
}

void DrainPort::RecordLost(const LogEntry& e, std::string_view reason) {
  MutexLock lk(&mu());
  Batch b;
  core_.oplog.RecordLost(e, reason, &b);  // its waiters hear EIO when it completes
  core_.tier()->Remove(cache::SnapKey(e.ino, e.version));
  if (!b.empty())
    if (auto st = core_.Commit(b); !st) LOG_ERROR("'{}': cannot record the loss: {}", e.path, strerror(st.error()));
}

Status DrainPort::FailEntry(const LogEntry& e, std::string_view reason) {
  OpLog::Due due;  // fsync=backend waiters now answered; run once the namespace lock is released
  MutexLock lk(&mu());
  Inode* n = core_.Find(e.ino);
  bool current = e.op == LogOp::kPersist && n && S_ISREG(n->rec.mode) && n->rec.version == e.version;
  Batch b;
  auto done = core_.oplog.Complete(e, OpLog::Outcome::kFailed, reason, &b);
  InodeRecord r;
  if (current) {
    r = n->rec;
    // Only a version nothing rewrote since: its bytes stay in the tier,
    // never evicted (the backend has no copy), shown as `failed`.
    if (n->data_gen == n->sealed_gen) r.state = NextState(r.state, FileEvent::kRefuse).value_or(r.state);
    MetaStore::PutInode(&b, r);
  }
  if (auto st = core_.Commit(b); !st) return st;
  if (current) n->rec.state = r.state;
  core_.oplog.Finish(std::move(done), &due);
  if (e.op == LogOp::kPersist) {
    // The snapshot of a version since rewritten is no use any more; the
    // live file of a current version stays.
    core_.tier()->Remove(cache::SnapKey(e.ino, e.version));
    core_.tier()->NotifySpace();
  }
  return {};
}

Status DrainPort::ClearLost() {
  MutexLock lk(&mu());
  Batch b;
  if (auto st = core_.oplog.ClearOutcomes(core_.store(), &b); !st) return st;
  if (auto st = core_.Commit(b); !st) return st;
  LOG_INFO("lost and failed lists cleared ({} and {} entries)", core_.oplog.LostFiles().size(),
           core_.oplog.FailedEntries().size());
  core_.oplog.ClearedOutcomes();
  return {};
}

Status DrainPort::CompletePersist(const LogEntry& e, const backend::Staged& s, uint64_t gen) {
  OpLog::Due due;  // fsync=backend waiters now answered; run once the namespace lock is released
  MutexLock lk(&mu());
  Inode* n = core_.Find(e.ino);
  // The checksum belongs to version e.version; the state is "persisted"
  // only if the live bytes are still that version.
  bool same = n && n->rec.version == e.version;
  bool current = same && n->data_gen == gen && n->data_gen == n->sealed_gen;
  Batch b;
  auto done = core_.oplog.Complete(e, OpLog::Outcome::kApplied, "", &b, /*heals=*/true);
  if (same) {
    InodeRecord r = n->rec;
    if (current) r.state = NextState(r.state, FileEvent::kPublish).value_or(r.state);
    r.checksum_hi = s.checksum_hi;
    r.checksum_lo = s.checksum_lo;
    MetaStore::PutInode(&b, r);
  }
  if (auto st = core_.Commit(b); !st) return st;
  if (same) {
    if (current) {
      Transition(n, FileEvent::kPublish);
      n->open_marked = false;
      core_.residency.Persisted();  // the eviction ahead may find room now
    } else {
      Transition(n, FileEvent::kStageEnd);
    }
    n->rec.checksum_hi = s.checksum_hi;
    n->rec.checksum_lo = s.checksum_lo;
    core_.SetBackendPath(n, e.path);
  } else if (n) {
    Transition(n, FileEvent::kStageEnd);
  }
  core_.oplog.Finish(std::move(done), &due);
  core_.tier()->Remove(cache::SnapKey(e.ino, e.version));  // published: the snapshot has done its job
  core_.tier()->NotifySpace();                             // a clean file can now be evicted for a waiting writer
  return {};
}

Status DrainPort::CompleteEntry(const LogEntry& e) {
  OpLog::Due due;  // fsync=backend waiters now answered; run once the namespace lock is released
  MutexLock lk(&mu());
  Batch b;
  // Applied, or skipped (a superseded persist): success either way. An
  // unlink of a failed file heals its failed records (the backend, which
  // never had it, agrees with the mount again).
  auto done = core_.oplog.Complete(e, OpLog::Outcome::kApplied, "", &b, /*heals=*/false);
  if (auto st = core_.Commit(b); !st) return st;
  core_.oplog.Finish(std::move(done), &due);
  if (e.op == LogOp::kPersist) {  // skipped: its snapshot, if any, is not needed
    core_.tier()->Remove(cache::SnapKey(e.ino, e.version));
    core_.tier()->NotifySpace();
  }
  core_.ApplyToBackendPaths(e);
  return {};
}

Status DrainPort::CopyAsideSealedInPlace(const LogEntry& e) {
  const uint64_t ino = e.ino, key = cache::SnapKey(ino, e.version);
  // Still e's version, sealed in place under a passthrough writer, its
  // bytes unchanged since (a change seen supersedes it: Absorb, in Find).
  auto in_place = [&](Inode* n) {
    mu().AssertHeld();  // the caller's
    return n && S_ISREG(n->rec.mode) && n->rec.version == e.version && n->seal_seq == e.seq &&
           core_.versions.SealPending(n) && !core_.oplog.Superseded(e.seq) && n->pt_writers > 0 &&
           n->data_gen == n->sealed_gen && !core_.tier()->Has(key);
  };
  // No seal and no change through the daemon (a truncate, a fallocate)
  // meanwhile; the kernel's writes take no lock of ours.
  Core::Core::DataExclusive data = core_.LockForSeal(ino);
  cache::FdRef live;
  {
    MutexLock lk(&mu());
    Inode* n = core_.Find(ino);
    if (!in_place(n)) return {};
    // A second copy of the file in the tier is worth it only while
    // entries (a `latest`) wait behind it; else the close comes first.
    if (!core_.oplog.HeadWithFollowers(e.seq)) return Err(EINPROGRESS);
    if (n->pt_rdwr > 0) return Err(EINPROGRESS);
    auto ref = core_.tier()->Ref(ino);
    if (!ref) return Err(EINPROGRESS);
    live = *ref;
  }
  // A write(2) to a tmpfs file holds the inode's lock from before it moves
  // the mtime until its last byte; lseek(SEEK_HOLE) takes that lock too,
  // so it returns once any write under way has ended (and reads nothing).
  // Every write that starts later moves the mtime first, before a byte.
  (void)lseek(live->fd, 0, SEEK_HOLE);
  uint64_t gen;
  {
    MutexLock lk(&mu());
    Inode* n = core_.Find(ino);  // what that write did is taken in now
    if (!in_place(n)) return {};
    // The mtime is coarse (a clock tick): one within 100 ms could equal
    // that of a write starting now, which would then go unseen.
    if (WallNs() - n->pt_mtime_ns < kQuietNs) return Err(EINPROGRESS);
    gen = n->data_gen;
  }
  if (auto st = core_.tier()->CopyOut(ino, key, /*wait=*/false); !st) {
    if (st.error() != EAGAIN)
      LOG_ERROR("ino {}: cannot copy version {} aside for the drain: {}", ino, e.version, strerror(st.error()));
    return Err(st.error() == EAGAIN ? ENOSPC : st.error());
  }
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);  // a write during the copy moved the size or the mtime
  if (n && n->data_gen == gen && n->rec.version == e.version && !core_.oplog.Superseded(e.seq)) {
    LOG_DEBUG("ino {}: version {} sealed in place under an open writer, copied aside for the drain", ino, e.version);
    return {};
  }
  // Written during the copy: the copy may be torn, and the live file no
  // longer holds the version either. Superseded: the next seal (the
  // close's) carries the bytes, as when a change is seen before the drain.
  core_.tier()->Remove(key);
  core_.tier()->NotifySpace();
  if (n && n->rec.version == e.version && n->seal_seq == e.seq && core_.versions.SealPending(n))
    core_.oplog.Supersede(e.seq);
  LOG_DEBUG("ino {}: version {} written while copied aside; superseded", ino, e.version);
  return {};
}

}  // namespace ckpt::fs
