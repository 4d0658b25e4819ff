// oplog.cc — the ordered drain log (fs/core/oplog.h): appends, the drain's
// view, in-order completion with outcomes, the waiters, and the failed and
// lost records.
#include "fs/core/oplog.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace ckpt::fs {

using meta::Batch;
using meta::kAppliedCounter;
using meta::LogEntry;
using meta::LogOp;
using meta::MetaStore;

namespace {

// Removals the drain applied that RemovalPending still remembers.
constexpr size_t kRecentRemovals = 4096;

bool IsRemoval(const LogEntry& e) {
  if (e.op == LogOp::kRename) return !(e.flags & 1);  // an exchange removes nothing
  return e.op == LogOp::kUnlink || e.op == LogOp::kRmdir;
}

int64_t WallUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool PathUnder(const std::string& path, const std::string& top) {
  return path == top || (path.size() > top.size() && path.starts_with(top) && path[top.size()] == '/');
}

// ---- Start-up ----

void OpLog::Restore(uint64_t applied, std::vector<LogEntry> entries) {
  MutexLock lk(&mu_);
  applied_seq_ = applied;
  applied_.store(applied, std::memory_order_release);
  next_seq_ = std::max(next_seq_, applied + 1);
  published_ = std::max(published_, applied);
  for (auto& e : entries) {
    next_seq_ = std::max(next_seq_, e.seq + 1);
    published_ = std::max(published_, e.seq);
    log_.push_back(std::move(e));
  }
}

void OpLog::RestoreLost(uint64_t id, std::string_view path) {
  MutexLock lk(&mu_);
  next_lost_ = std::max(next_lost_, id + 1);
  lost_.emplace_back(path);
}

void OpLog::RestoreFailed(uint64_t id, std::string_view path, std::string_view reason) {
  MutexLock lk(&mu_);
  next_failed_ = std::max(next_failed_, id + 1);
  failed_[id] = FailedEntry{std::string(path), std::string(reason)};
}

void OpLog::DropRecovered(uint64_t seq) {
  MutexLock lk(&mu_);
  std::erase_if(log_, [&](const LogEntry& e) { return e.seq == seq; });
}

// ---- Appending ----

void OpLog::Append(Batch* b, LogEntry e, std::vector<LogEntry>* out) {
  MutexLock lk(&mu_);
  e.seq = next_seq_++;
  MetaStore::PutLog(b, e);
  out->push_back(std::move(e));
}

void OpLog::Publish(std::vector<LogEntry>&& entries) {
  if (entries.empty()) return;
  {
    // When each entry became real (committed), for --cluster's gate times
    // (fs/cluster/cluster.h): forward, as the seqs are, one µs at least from
    // one entry to the next, so that a dead member's entries, held by
    // several of its replicas' holders, are published in exactly its order
    // (fs/cluster/takeover.h: a rename after the file it moves). Known
    // before the observer sees the entries: the replicator asks for an
    // entry's time as soon as it has it (it found none, and sent gate 0: a
    // dead writer's unlink then went before the file it removes).
    MutexLock lk(&mu_);
    const int64_t now = WallUs();
    for (const auto& e : entries) {
      last_logged_at_ = std::max(last_logged_at_ + 1, now);
      logged_at_[e.seq] = last_logged_at_;
    }
  }
  if (observer_) observer_(entries);
  MutexLock lk(&mu_);
  for (auto& e : entries) {
    published_ = std::max(published_, e.seq);
    log_.push_back(std::move(e));
  }
  log_cv_.NotifyAll();
}

void OpLog::AddLost(Batch* b, const std::string& path, std::string_view reason) {
  MutexLock lk(&mu_);
  MetaStore::PutLost(b, next_lost_++, path, reason);
  lost_.push_back(path);
}

// ---- The drain's side ----

std::vector<LogEntry> OpLog::Pending(size_t max) {
  MutexLock lk(&mu_);
  std::vector<LogEntry> out;
  for (size_t i = 0; i < log_.size() && i < max; i++) out.push_back(log_[i]);
  return out;
}

bool OpLog::WaitForEntries(std::chrono::milliseconds d) {
  MutexLock lk(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (log_.empty() && !shutdown_)
    if (!log_cv_.WaitUntil(&mu_, deadline)) break;
  return !log_.empty() && !shutdown_;
}

bool OpLog::HeadWithFollowers(uint64_t seq) {
  MutexLock lk(&mu_);
  return log_.size() >= 2 && log_.front().seq == seq;
}

bool OpLog::Superseded(uint64_t seq) {
  MutexLock lk(&mu_);
  return superseded_.count(seq) > 0;
}

void OpLog::Supersede(uint64_t seq) {
  MutexLock lk(&mu_);
  superseded_.insert(seq);
}

bool OpLog::IsOpenTail(uint64_t seq, uint64_t ino) {
  MutexLock lk(&mu_);
  return !log_.empty() && log_.back().seq == seq && log_.back().op == LogOp::kPersist && log_.back().ino == ino &&
         !superseded_.count(seq);
}

OpLog::Completion OpLog::Complete(const LogEntry& e, Outcome o, std::string_view reason, Batch* b, bool heals) {
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != e.seq) abort();  // broken invariant: out-of-order completion
  Completion c{e, o, std::string(reason), 0, {}};
  MetaStore::DeleteLog(b, e.seq);
  MetaStore::PutCounter(b, kAppliedCounter, e.seq);
  if (o == Outcome::kFailed) {
    c.failed_id = next_failed_;
    MetaStore::PutFailed(b, c.failed_id, e.path, reason);
  }
  // A path in the backend now (a persist), or gone from the mount (an
  // unlink: the backend, which never had it, agrees again): its failed
  // records are healed.
  if (o == Outcome::kApplied && (e.op == LogOp::kUnlink || (heals && e.op == LogOp::kPersist)))
    for (auto& [id, f] : failed_)
      if (f.path == e.path) {
        c.healed.push_back(id);
        MetaStore::DeleteFailed(b, id);
      }
  return c;
}

void OpLog::Finish(Completion&& c, Due* due) {
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != c.e.seq) abort();  // Complete ... Finish interleaved
  for (uint64_t id : c.healed) failed_.erase(id);
  if (c.outcome == Outcome::kFailed) {
    failed_[c.failed_id] = FailedEntry{c.e.path, std::move(c.reason)};
    next_failed_ = std::max(next_failed_, c.failed_id + 1);
  }
  if (c.outcome != Outcome::kApplied) bad_seqs_.insert(c.e.seq);  // its waiters hear EIO
  if (skip_requested_ == c.e.seq) skip_requested_ = 0;
  superseded_.erase(c.e.seq);
  if (c.outcome == Outcome::kApplied) NoteRemovalApplied(c.e);
  log_.pop_front();
  AdvanceApplied(c.e.seq, due);
}

void OpLog::RecordLost(const LogEntry& e, std::string_view reason, Batch* b) {
  MutexLock lk(&mu_);
  bad_seqs_.insert(e.seq);
  if (std::find(lost_.begin(), lost_.end(), e.path) != lost_.end()) return;  // listed at start-up
  MetaStore::PutLost(b, next_lost_++, e.path, reason);
  lost_.push_back(e.path);
}

void OpLog::AdvanceApplied(uint64_t seq, Due* due) {
  applied_seq_ = seq;
  applied_.store(seq, std::memory_order_release);
  if (held_ && held_->seq <= seq) held_.reset();  // applied, failed or skipped: the drain goes on
  logged_at_.erase(logged_at_.begin(), logged_at_.upper_bound(seq));
  applied_cv_.NotifyAll();
  auto end = waiters_.upper_bound(seq);
  for (auto it = waiters_.begin(); it != end; ++it)
    due->fns.emplace_back(std::move(it->second.fn), Answer(it->first, it->second));
  waiters_.erase(waiters_.begin(), end);
  // Outcomes no waiter can ask for any more: at or below every remaining
  // waiter's floor.
  uint64_t floor = applied_seq_;
  for (auto& [s, w] : waiters_) floor = std::min(floor, w.floor);
  bad_seqs_.erase(bad_seqs_.begin(), bad_seqs_.upper_bound(floor));
}

int OpLog::Answer(uint64_t seq, const Waiter& w) {
  // Every entry in (floor, seq] was pending when the waiter came: one that
  // did not reach the backend makes its answer EIO. An older failure was
  // someone else's answer.
  auto bad = bad_seqs_.upper_bound(w.floor);
  return bad != bad_seqs_.end() && *bad <= seq ? EIO : 0;
}

void OpLog::NoteRemovalApplied(const LogEntry& e) {
  if (!track_removals_ || !IsRemoval(e)) return;
  removed_.emplace_back(e.seq, e.path);
  if (removed_.size() > kRecentRemovals) {
    removed_trimmed_ = removed_.front().first;
    removed_.pop_front();
  }
}

// ---- Holding at a refusal ----

void OpLog::Hold(const LogEntry& e, std::string_view reason) {
  Due due;  // the waiters it covers hear EIO once mu_ is released
  MutexLock lk(&mu_);
  if (log_.empty() || log_.front().seq != e.seq) return;  // applied meanwhile
  const int64_t now_ms = WallUs() / 1000;
  if (!held_ || held_->seq != e.seq) held_ = HeldEntry{e.seq, e.ino, e.version, e.path, "", now_ms / 1000, 0, 0};
  held_->reason = std::string(reason);
  held_->tried_ms = now_ms;
  // The waiters whose range covers it hear EIO now, not when it ends.
  for (auto it = waiters_.lower_bound(e.seq); it != waiters_.end();) {
    if (it->second.floor < e.seq) {
      due.fns.emplace_back(std::move(it->second.fn), EIO);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<HeldEntry> OpLog::Held() {
  MutexLock lk(&mu_);
  if (!held_) return std::nullopt;
  HeldEntry h = *held_;
  h.behind = log_.empty() ? 0 : log_.size() - 1;
  return h;
}

bool OpLog::HoldsVersion(uint64_t ino, uint64_t version) {
  MutexLock lk(&mu_);
  return held_ && held_->ino == ino && held_->version == version;
}

Status OpLog::RequestSkip(std::string_view path) {
  MutexLock lk(&mu_);
  if (!held_ || held_->path != path) return Err(ENOENT);
  skip_requested_ = held_->seq;
  return {};
}

bool OpLog::SkipRequested(uint64_t seq) {
  MutexLock lk(&mu_);
  return skip_requested_ != 0 && skip_requested_ == seq;
}

// ---- Waiters ----

void OpLog::WhenApplied(uint64_t seq, std::function<void(int err)> fn, Due* due) {
  Due here;  // declared before the lock: runs after the unlock
  MutexLock lk(&mu_);
  Waiter w{applied_seq_, nullptr};
  const bool held = held_ && held_->seq <= seq;
  if (applied_seq_ < seq && !shutdown_ && !held) {
    w.fn = std::move(fn);
    waiters_.emplace(seq, std::move(w));
    return;
  }
  const int err = held || applied_seq_ < seq ? EIO : Answer(seq, w);
  (due ? due : &here)->fns.emplace_back(std::move(fn), err);
}

int OpLog::Await(const std::function<void(std::function<void(int)>)>& start) {
  struct Reply {
    Mutex mu;
    CondVar cv;
    bool done = false;
    int err = 0;
  };
  auto a = std::make_shared<Reply>();  // the callback may outlive this frame's return by a moment
  start([a](int err) {
    MutexLock lk(&a->mu);
    a->err = err;
    a->done = true;
    a->cv.NotifyAll();
  });
  MutexLock lk(&a->mu);
  while (!a->done) a->cv.Wait(&a->mu);
  return a->err;
}

int OpLog::WaitApplied(uint64_t seq) {
  return Await([&](std::function<void(int)> fn) { WhenApplied(seq, std::move(fn)); });
}

bool OpLog::WaitAppliedBeyond(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  MutexLock lk(&mu_);
  while (applied_seq_ <= seen && !shutdown_)
    if (!applied_cv_.WaitUntil(&mu_, deadline)) break;
  return applied_seq_ > seen && !shutdown_;
}

bool OpLog::DurabilityAwaited() {
  MutexLock lk(&mu_);
  return !waiters_.empty();
}

void OpLog::Shutdown() {
  Due due;  // runs after the lock is released: waiters get EIO
  MutexLock lk(&mu_);
  for (auto& [seq, w] : waiters_) due.fns.emplace_back(std::move(w.fn), EIO);
  waiters_.clear();
  shutdown_ = true;
  shutdown_flag_.store(true, std::memory_order_release);
  log_cv_.NotifyAll();
  applied_cv_.NotifyAll();
}

// ---- Queries ----

uint64_t OpLog::LoggedSeq() {
  MutexLock lk(&mu_);
  return published_;
}

size_t OpLog::size() {
  MutexLock lk(&mu_);
  return log_.size();
}

bool OpLog::HasPersist() {
  MutexLock lk(&mu_);
  return std::any_of(log_.begin(), log_.end(), [](const LogEntry& e) { return e.op == LogOp::kPersist; });
}

bool OpLog::HasMoves() {
  MutexLock lk(&mu_);
  return std::any_of(log_.begin(), log_.end(), [](const LogEntry& e) {
    return e.op == LogOp::kRename || e.op == LogOp::kUnlink || e.op == LogOp::kRmdir || e.op == LogOp::kLink;
  });
}

std::vector<std::pair<uint64_t, int64_t>> OpLog::LoggedTimes(uint64_t from, uint64_t to) {
  MutexLock lk(&mu_);
  std::vector<std::pair<uint64_t, int64_t>> out;
  for (auto it = logged_at_.lower_bound(from); it != logged_at_.end() && it->first <= to; ++it) out.push_back(*it);
  return out;
}

std::pair<uint64_t, std::vector<std::string>> OpLog::UnpersistedFiles(size_t max) {
  MutexLock lk(&mu_);
  std::pair<uint64_t, std::vector<std::string>> out{0, {}};
  for (const LogEntry& e : log_) {
    if (e.op != LogOp::kPersist) continue;
    if (out.first++ < max) out.second.push_back(e.path);
  }
  return out;
}

std::vector<std::tuple<uint64_t, uint64_t, std::string>> OpLog::UnpersistedVersions() {
  MutexLock lk(&mu_);
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> out;
  for (const LogEntry& e : log_)
    if (e.op == LogOp::kPersist) out.emplace_back(e.ino, e.version, e.path);
  return out;
}

std::optional<LogEntry> OpLog::Find(uint64_t seq) {
  MutexLock lk(&mu_);
  for (const LogEntry& e : log_)
    if (e.seq == seq) return e;
  return std::nullopt;
}

bool OpLog::Touches(const std::string& path) {
  MutexLock lk(&mu_);
  // At, under or above `path`: a pending rename of a directory above it
  // means the backend does not hold it under this path yet.
  auto touches = [&](const std::string& p) { return PathUnder(p, path) || PathUnder(path, p); };
  for (const LogEntry& e : log_) {
    if (touches(e.path)) return true;
    if ((e.op == LogOp::kRename || e.op == LogOp::kLink) && touches(e.path2)) return true;
  }
  return false;
}

bool OpLog::RemovalPending(const std::string& path, uint64_t since) {
  MutexLock lk(&mu_);
  for (const LogEntry& e : log_)
    if (IsRemoval(e) && PathUnder(path, e.path)) return true;
  // Applied while the backend was asked: the answer may predate it. If
  // some of those were forgotten already, nothing is trusted.
  if (removed_trimmed_ > since) return true;
  for (auto it = removed_.rbegin(); it != removed_.rend() && it->first > since; ++it)
    if (PathUnder(path, it->second)) return true;
  return false;
}

std::optional<std::string> OpLog::PathBeforePending(std::string p, uint64_t ino) {
  MutexLock lk(&mu_);
  // `p`: where the file was just after entry *it; before it, where?
  for (auto it = log_.rbegin(); it != log_.rend(); ++it) {
    const LogEntry& x = *it;
    auto moved = [&](const std::string& from, const std::string& to) { p = from + p.substr(to.size()); };
    switch (x.op) {
      case LogOp::kRename:
        if (PathUnder(p, x.path2)) moved(x.path, x.path2);
        else if (!(x.flags & 1) && PathUnder(p, x.path)) return std::nullopt;  // nothing is left at a rename's source
        else if (PathUnder(p, x.path)) moved(x.path2, x.path);                 // an exchange
        break;
      case LogOp::kLink:
        if (p == x.path2) p = x.path;  // a name the link gave it: it was at the link's source
        else if (PathUnder(p, x.path2)) return std::nullopt;
        break;
      case LogOp::kPersist:
        if (p == x.path && x.ino != ino) return std::nullopt;  // another file was there
        break;
      case LogOp::kSetattr: break;
      case LogOp::kUnlink:
      case LogOp::kRmdir:
      case LogOp::kMkdir:
      case LogOp::kSymlink:
        if (PathUnder(p, x.path)) return std::nullopt;  // removed, or made there: not this file then
        break;
    }
  }
  return p;
}

// ---- Outcome records ----

std::vector<FailedEntry> OpLog::FailedEntries() {
  MutexLock lk(&mu_);
  std::vector<FailedEntry> out;
  out.reserve(failed_.size());
  for (auto& [id, f] : failed_) out.push_back(f);
  return out;
}

std::vector<std::string> OpLog::LostFiles() {
  MutexLock lk(&mu_);
  return lost_;
}

size_t OpLog::LostUnder(const std::string& path) {
  MutexLock lk(&mu_);
  return std::count_if(lost_.begin(), lost_.end(), [&](const std::string& l) { return PathUnder(l, path); });
}

Status OpLog::ClearOutcomes(MetaStore* store, Batch* b) {
  MutexLock lk(&mu_);
  auto del = [&](uint64_t id, std::string_view, std::string_view) { MetaStore::DeleteLost(b, id); };
  if (auto st = store->ForEachLost(del); !st) return st;
  // The failed list too: the operator has seen what the backend lacks
  // (`ckptfs drain` names both until they are cleared or healed).
  for (auto& [id, f] : failed_) MetaStore::DeleteFailed(b, id);
  return {};
}

void OpLog::ClearedOutcomes() {
  MutexLock lk(&mu_);
  lost_.clear();
  failed_.clear();
}

std::vector<uint64_t> OpLog::FailedAt(const std::string& path) {
  MutexLock lk(&mu_);
  std::vector<uint64_t> out;
  for (auto& [id, f] : failed_)
    if (f.path == path) out.push_back(id);
  return out;
}

void OpLog::Healed(const std::vector<uint64_t>& ids) {
  MutexLock lk(&mu_);
  for (uint64_t id : ids) failed_.erase(id);
}

}  // namespace ckpt::fs
