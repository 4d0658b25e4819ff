// persist.cc — the table's half of the drain: which bytes a persist entry
// stages (the sealed version, in its snapshot or the live file), and what
// each outcome does to the file (its state, its checksum, its snapshot).
// The log's half — order, outcomes, waiters — is fs/core/oplog.h; each
// completion here is one RocksDB batch holding both halves.
//
// One of the files of InodeTable (fs/core/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include "fs/core/core_impl.h"

namespace ckpt::fs {

void InodeTable::WhenApplied(uint64_t seq, uint64_t ino, std::function<void(int err)> fn) {
  OpLog::Due due;  // an answer known now runs once the namespace lock is released
  MutexLock lk(&mu());
  // A file whose version the backend refused: its fsync fails at once.
  // Outcomes after this moment reach the waiter through the log; both are
  // decided under the namespace lock, which every completion holds too.
  Inode* n = ino ? core_.Find(ino) : nullptr;
  if (n && n->rec.state == DataState::kFailed) {
    due.fns.emplace_back(std::move(fn), EIO);
    return;
  }
  core_.oplog.WhenApplied(seq, std::move(fn), &due);
}

int InodeTable::WaitApplied(uint64_t seq, uint64_t ino) {
  return OpLog::Await([&](std::function<void(int)> fn) { WhenApplied(seq, ino, std::move(fn)); });
}

Result<PersistSource> InodeTable::BeginPersist(const LogEntry& e) {
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
  if (same && n->data_gen == src.gen) Transition(n, FileEvent::kStage);
  return src;
}

bool InodeTable::StagedBytesHeld(const LogEntry& e, const PersistSource& src) {
  MutexLock lk(&mu());
  return core_.versions.StagedBytesHeld(e, src);
}

void InodeTable::AbortPersist(const LogEntry& e) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(e.ino);
  if (n) Transition(n, FileEvent::kStageEnd);
}

void InodeTable::RecordLost(const LogEntry& e, std::string_view reason) {
  MutexLock lk(&mu());
  Batch b;
  core_.oplog.RecordLost(e, reason, &b);  // its waiters hear EIO when it completes
  core_.tier()->Remove(cache::SnapKey(e.ino, e.version));
  if (!b.empty())
    if (auto st = core_.Commit(b); !st) LOG_ERROR("'{}': cannot record the loss: {}", e.path, strerror(st.error()));
}

Status InodeTable::FailEntry(const LogEntry& e, std::string_view reason) {
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

Status InodeTable::ClearLost() {
  MutexLock lk(&mu());
  Batch b;
  if (auto st = core_.oplog.ClearOutcomes(core_.store(), &b); !st) return st;
  if (auto st = core_.Commit(b); !st) return st;
  LOG_INFO("lost and failed lists cleared ({} and {} entries)", core_.oplog.LostFiles().size(),
           core_.oplog.FailedEntries().size());
  core_.oplog.ClearedOutcomes();
  return {};
}

Status InodeTable::CompletePersist(const LogEntry& e, const backend::Staged& s, uint64_t gen) {
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

Status InodeTable::CompleteEntry(const LogEntry& e) {
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

void InodeTable::Shutdown() {
  core_.oplog.Shutdown();  // waiters hear EIO
  MutexLock lk(&mu());
  shutdown_ = true;
  fetch_cv_.NotifyAll();
}

DataStats InodeTable::DataStatistics() {
  MutexLock lk(&mu());
  DataStats s;
  for (auto& [ino, n] : core_.ns.all()) {
    if (!S_ISREG(n->rec.mode) || n->rec.nlink == 0) continue;
    auto i = static_cast<size_t>(n->rec.state);
    s.files[i]++;
    s.bytes[i] += n->rec.size;
  }
  s.log_len = core_.oplog.size();
  s.head_seq = core_.oplog.LoggedSeq();
  s.applied_seq = core_.oplog.AppliedSeq();
  return s;
}

}  // namespace ckpt::fs
