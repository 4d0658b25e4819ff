// oplog.cc — the ordered drain log as the drainer sees it: entries appended
// with the change that caused them (one Batch), handed out oldest first,
// completed, skipped, failed or lost in order, and the waiters of
// fsync=backend answered as they are applied.
//
// One of the files of InodeTable (fs/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include <chrono>

#include "fs/core_impl.h"

namespace ckpt::fs {

void InodeTable::WhenApplied(uint64_t seq, uint64_t ino, std::function<void(int err)> fn) {
  int err = 0;
  {
    MutexLock lk(&mu_);
    AppliedWaiter w{applied_seq_, ino, nullptr};
    const bool held = held_ && held_->seq <= seq;
    if (applied_seq_ < seq && !shutdown_ && !held) {
      w.fn = std::move(fn);
      applied_waiters_.emplace(seq, std::move(w));
      return;
    }
    err = held || applied_seq_ < seq ? EIO : WaiterOutcome(seq, w);
  }
  fn(err);
}

int InodeTable::WaiterOutcome(uint64_t seq, const AppliedWaiter& w) {
  // Every entry in (floor, seq] was pending when the waiter came: one that
  // did not reach the backend makes its answer EIO. An older failure was
  // someone else's answer; the file's own state says if it is one of them.
  auto bad = bad_seqs_.upper_bound(w.floor);
  if (bad != bad_seqs_.end() && *bad <= seq) return EIO;
  if (w.ino != 0) {
    Inode* n = Find(w.ino);
    if (n && n->rec.state == DataState::kFailed) return EIO;
  }
  return 0;
}

bool InodeTable::DurabilityAwaited() {
  MutexLock lk(&mu_);
  return !applied_waiters_.empty();
}

void InodeTable::AdvanceApplied(uint64_t seq, DueCallbacks* due) {
  applied_seq_ = seq;
  if (held_ && held_->seq <= seq) held_.reset();  // applied, failed or skipped: the drain goes on
  logged_at_.erase(logged_at_.begin(), logged_at_.upper_bound(seq));
  applied_cv_.NotifyAll();
  auto end = applied_waiters_.upper_bound(seq);
  for (auto it = applied_waiters_.begin(); it != end; ++it)
    due->fns.emplace_back(std::move(it->second.fn), WaiterOutcome(it->first, it->second));
  applied_waiters_.erase(applied_waiters_.begin(), end);
  // Outcomes no waiter can ask for any more: those at or below every
  // remaining waiter's floor.
  uint64_t floor = applied_seq_;
  for (auto& [s, w] : applied_waiters_) floor = std::min(floor, w.floor);
  bad_seqs_.erase(bad_seqs_.begin(), bad_seqs_.upper_bound(floor));
}

void InodeTable::FailWaitersCovering(uint64_t seq, DueCallbacks* due) {
  for (auto it = applied_waiters_.lower_bound(seq); it != applied_waiters_.end();) {
    if (it->second.floor < seq) {
      due->fns.emplace_back(std::move(it->second.fn), EIO);
      it = applied_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void InodeTable::HoldEntry(const LogEntry& e, std::string_view reason) {
  DueCallbacks due;  // the waiters it covers: EIO, once mu_ is released
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != e.seq) return;  // applied meanwhile
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  if (!held_ || held_->seq != e.seq) held_ = HeldEntry{e.seq, e.ino, e.version, e.path, "", now_ms / 1000, 0, 0};
  held_->reason = std::string(reason);
  held_->tried_ms = now_ms;
  FailWaitersCovering(e.seq, &due);
}

std::optional<HeldEntry> InodeTable::Held() {
  MutexLock lk(&mu_);
  if (!held_) return std::nullopt;
  HeldEntry h = *held_;
  h.behind = log_.empty() ? 0 : log_.size() - 1;
  return h;
}

Status InodeTable::RequestSkip(std::string_view path) {
  MutexLock lk(&mu_);
  if (!held_ || held_->path != path) return Err(ENOENT);
  skip_requested_ = held_->seq;
  return {};
}

bool InodeTable::SkipRequested(uint64_t seq) {
  MutexLock lk(&mu_);
  return skip_requested_ != 0 && skip_requested_ == seq;
}

void InodeTable::AppendLog(Batch* b, LogEntry e, std::vector<LogEntry>* out) {
  e.seq = next_seq_++;
  MetaStore::PutLog(b, e);
  out->push_back(std::move(e));
}

Status InodeTable::CommitWithLog(const Batch& b, std::vector<LogEntry>&& entries) {
  if (auto st = Commit(b); !st) return st;
  if (entries.empty()) return {};
  // When each entry became real (committed), for --cluster's gate times
  // (fs/cluster.h): wall clock in µs, never backwards, under mu_ as the
  // seqs are; before the close that logged it is answered.
  int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  last_logged_at_ = std::max(last_logged_at_, now);
  for (auto& e : entries) {
    logged_at_[e.seq] = last_logged_at_;
    log_.push_back(std::move(e));
  }
  log_cv_.NotifyAll();
  return {};
}

std::vector<LogEntry> InodeTable::PendingLog(size_t max) {
  MutexLock lk(&mu_);
  std::vector<LogEntry> out;
  for (size_t i = 0; i < log_.size() && i < max; i++) out.push_back(log_[i]);
  return out;
}

bool InodeTable::WaitForLog(std::chrono::milliseconds d) {
  MutexLock lk(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (log_.empty() && !shutdown_)
    if (!log_cv_.WaitUntil(&mu_, deadline)) break;
  return !log_.empty() && !shutdown_;
}

Result<PersistSource> InodeTable::BeginPersist(const LogEntry& e) {
  MutexLock lk(&mu_);
  Inode* n = Find(e.ino);  // takes in a passthrough writer's changes first (they may supersede e)
  if (superseded_.count(e.seq)) return Err(ESTALE);
  bool same = n && n->rec.version == e.version && S_ISREG(n->rec.mode);
  PersistSource src;
  uint64_t key = cache::SnapKey(e.ino, e.version);
  if (tier_->Has(key)) {
    auto ref = tier_->Ref(key);
    if (!ref) return Err(ref.error() == ENOENT ? ENODATA : ref.error());
    src.ref = *ref;
    src.gen = same ? n->sealed_gen : 0;
  } else {
    // No snapshot: the live file still holds exactly this version, unless
    // a passthrough writer (which sealed it in place with an fsync) still
    // has it open: wait for its close.
    if (same && n->pt_writers > 0) return Err(EINPROGRESS);
    if (!same || n->data_gen != n->sealed_gen || n->rec.state == DataState::kRemote) return Err(ENODATA);
    auto ref = tier_->Ref(e.ino);
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
  if (!src.live) return true;
  // Every change of a sealed version's bytes is preceded by its copy or
  // rename aside (LockForMutation, OpenImpl, MoveAside): no snapshot now,
  // no change has begun.
  const uint64_t key = cache::SnapKey(e.ino, e.version);
  if (!tier_->Has(key)) return true;
  auto ref = tier_->Ref(key);
  struct stat snap, staged;
  return ref && fstat((*ref)->fd, &snap) == 0 && fstat(src.fd, &staged) == 0 && snap.st_dev == staged.st_dev &&
         snap.st_ino == staged.st_ino;
}

void InodeTable::AbortPersist(const LogEntry& e) {
  MutexLock lk(&mu_);
  Inode* n = Find(e.ino);
  if (n) Transition(n, FileEvent::kStageEnd);
}

void InodeTable::RecordLost(const LogEntry& e, std::string_view reason) {
  MutexLock lk(&mu_);
  bad_seqs_.insert(e.seq);  // its waiters are told EIO when it completes
  tier_->Remove(cache::SnapKey(e.ino, e.version));
  if (std::find(lost_.begin(), lost_.end(), e.path) != lost_.end()) return;  // listed at start-up
  Batch b;
  MetaStore::PutLost(&b, next_lost_, e.path, reason);
  if (auto st = Commit(b); !st) LOG_ERROR("'{}': cannot record the loss: {}", e.path, strerror(st.error()));
  next_lost_++;
  lost_.push_back(e.path);
}

std::vector<std::string> InodeTable::LostFiles() {
  MutexLock lk(&mu_);
  return lost_;
}

Status InodeTable::FailEntry(const LogEntry& e, std::string_view reason) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  MutexLock lk(&mu_);
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
    if (n->data_gen == n->sealed_gen) r.state = NextState(r.state, FileEvent::kRefuse).value_or(r.state);
    MetaStore::PutInode(&b, r);
  }
  if (auto st = Commit(b); !st) return st;
  if (current) n->rec.state = r.state;
  failed_[next_failed_++] = FailedEntry{e.path, std::string(reason)};
  bad_seqs_.insert(e.seq);
  if (skip_requested_ == e.seq) skip_requested_ = 0;
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
  MutexLock lk(&mu_);
  std::vector<FailedEntry> out;
  out.reserve(failed_.size());
  for (auto& [seq, f] : failed_) out.push_back(f);
  return out;
}

Status InodeTable::ClearLost() {
  MutexLock lk(&mu_);
  Batch b;
  auto del = [&](uint64_t seq, std::string_view, std::string_view) { MetaStore::DeleteLost(&b, seq); };
  if (auto st = store_->ForEachLost(del); !st) return st;
  // The failed list too: the operator has seen what the backend lacks
  // (`ckptfs drain` names both until they are cleared or healed).
  for (auto& [seq, f] : failed_) MetaStore::DeleteFailed(&b, seq);
  if (auto st = Commit(b); !st) return st;
  LOG_INFO("lost and failed lists cleared ({} and {} entries)", lost_.size(), failed_.size());
  lost_.clear();
  failed_.clear();
  return {};
}

Status InodeTable::CompletePersist(const LogEntry& e, const backend::Staged& s, uint64_t gen) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Inode* n = Find(e.ino);
  // The checksum belongs to version e.version; the state is "persisted"
  // only if the live bytes are still that version.
  bool same = n && n->rec.version == e.version;
  bool current = same && n->data_gen == gen && n->data_gen == n->sealed_gen;
  Batch b;
  if (same) {
    InodeRecord r = n->rec;
    if (current) r.state = NextState(r.state, FileEvent::kPublish).value_or(r.state);
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
      Transition(n, FileEvent::kPublish);
      n->open_marked = false;
    } else {
      Transition(n, FileEvent::kStageEnd);
    }
    n->rec.checksum_hi = s.checksum_hi;
    n->rec.checksum_lo = s.checksum_lo;
    SetBackendPath(n, e.path);
  } else if (n) {
    Transition(n, FileEvent::kStageEnd);
  }
  log_.pop_front();
  AdvanceApplied(e.seq, &due);
  tier_->Remove(cache::SnapKey(e.ino, e.version));  // published: the snapshot has done its job
  tier_->NotifySpace();                             // a clean file can now be evicted for a waiting writer
  return {};
}

Status InodeTable::CompleteEntry(const LogEntry& e) {
  DueCallbacks due;  // fsync=backend waiters now satisfied; run once mu_ is released
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Batch b;
  MetaStore::DeleteLog(&b, e.seq);
  MetaStore::PutCounter(&b, kAppliedCounter, e.seq);
  if (auto st = Commit(b); !st) return st;
  // A failed file removed from the mount since: the backend, which never
  // had it, agrees with the mount again.
  std::vector<uint64_t> healed;
  if (e.op == LogOp::kUnlink)
    for (auto& [seq, f] : failed_)
      if (f.path == e.path) healed.push_back(seq);
  if (!healed.empty()) {
    Batch hb;
    for (uint64_t seq : healed) MetaStore::DeleteFailed(&hb, seq);
    if (auto st = Commit(hb); st)
      for (uint64_t seq : healed) failed_.erase(seq);
  }
  log_.pop_front();
  superseded_.erase(e.seq);
  AdvanceApplied(e.seq, &due);
  if (e.op == LogOp::kPersist) {  // skipped: its snapshot, if any, is not needed
    tier_->Remove(cache::SnapKey(e.ino, e.version));
    tier_->NotifySpace();
  }
  ApplyToBackendPaths(e);
  NoteRemovalApplied(e);
  return {};
}

uint64_t InodeTable::AppliedSeq() {
  MutexLock lk(&mu_);
  return applied_seq_;
}

std::vector<std::pair<uint64_t, int64_t>> InodeTable::LoggedTimes(uint64_t from, uint64_t to) {
  MutexLock lk(&mu_);
  std::vector<std::pair<uint64_t, int64_t>> out;
  for (auto it = logged_at_.lower_bound(from); it != logged_at_.end() && it->first <= to; ++it) out.push_back(*it);
  return out;
}

uint64_t InodeTable::LoggedSeq() {
  MutexLock lk(&mu_);
  return next_seq_ - 1;
}

std::pair<uint64_t, std::vector<std::string>> InodeTable::UnpersistedFiles(size_t max) {
  MutexLock lk(&mu_);
  std::pair<uint64_t, std::vector<std::string>> out{0, {}};
  for (const LogEntry& e : log_) {
    if (e.op != meta::LogOp::kPersist) continue;
    if (out.first++ < max) out.second.push_back(e.path);
  }
  return out;
}

int InodeTable::WaitApplied(uint64_t seq, uint64_t ino) {
  struct Answer {
    Mutex mu;
    CondVar cv;
    bool done = false;
    int err = 0;
  };
  auto a = std::make_shared<Answer>();  // the callback may outlive this frame's return by a moment
  WhenApplied(seq, ino, [a](int err) {
    MutexLock lk(&a->mu);
    a->err = err;
    a->done = true;
    a->cv.NotifyAll();
  });
  MutexLock lk(&a->mu);
  while (!a->done) a->cv.Wait(&a->mu);
  return a->err;
}

void InodeTable::Shutdown() {
  DueCallbacks due;  // runs after the lock is released: waiters get EIO
  MutexLock lk(&mu_);
  for (auto& [seq, w] : applied_waiters_) due.fns.emplace_back(std::move(w.fn), EIO);
  applied_waiters_.clear();
  shutdown_ = true;
  log_cv_.NotifyAll();
  applied_cv_.NotifyAll();
  fetch_cv_.NotifyAll();
}

DataStats InodeTable::DataStatistics() {
  MutexLock lk(&mu_);
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

}  // namespace ckpt::fs
