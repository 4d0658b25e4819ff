// oplog.h — the ordered drain log: what the backend must still be told, in
// order, and what became of each entry.
//
// Entries are appended in the RocksDB batch of the change that caused them
// (Append, then Publish once the batch is committed), handed to the drain
// oldest first (Pending), and completed strictly in order with their real
// outcome (Complete + Finish): applied, undone by later history, failed
// (the backend refused it for good), lost (its bytes are gone) or skipped
// by the operator. Each fsync=backend waiter (WhenApplied) is answered
// with the outcome of the entries it covers: 0 only if each of them reached
// the backend or was undone; EIO if one failed, was lost or was skipped, if
// the drain holds at a refusal inside its range, or at Shutdown. The failed
// and lost records (status, `ckptfs drain`, `ckptfs lost`) live here too.
//
// The log knows paths and inode numbers, never inodes: InodeTable decides
// what an outcome does to a file (its state, its snapshot) and calls in
// here for the log's half. The drainer and the cluster read the log
// through the const-ish queries (AppliedSeq, Pending, LoggedTimes, Held,
// UnpersistedFiles) without touching the namespace's lock.
//
// Thread-safety: every member takes mu_, a leaf (lock order: InodeTable's
// mu_, then this one). Two sequences need the caller to hold one lock of
// its own across them, so that nothing interleaves: Append ... Publish
// (seqs reach the log in the order they were given), and Complete ...
// Finish (the head stays the head). InodeTable holds its mu_ for both.
// Waiter callbacks never run under mu_: they are collected in a Due, whose
// destructor runs them (declare it before the caller's own lock guard).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

// A failed log entry, for status: the path and why the backend refused it.
struct FailedEntry {
  std::string path;
  std::string reason;
};

// The entry the drain holds at (OpLog::Hold): the backend refuses it for
// good and the entries after it wait.
struct HeldEntry {
  uint64_t seq = 0;
  uint64_t ino = 0;
  uint64_t version = 0;
  std::string path;
  std::string reason;
  int64_t since = 0;     // unix seconds: the first refusal
  int64_t tried_ms = 0;  // unix ms: the last refusal (retries go on)
  uint64_t behind = 0;   // entries waiting behind it
};

// Is `path` `top` or under it? ("a/b" is under "a", "ab" is not.)
bool PathUnder(const std::string& path, const std::string& top);

class OpLog {
 public:
  OpLog() = default;
  OpLog(const OpLog&) = delete;
  OpLog& operator=(const OpLog&) = delete;

  // Callbacks to run once no lock is held: declare before the lock guard,
  // so its destructor runs after the unlock.
  struct Due {
    std::vector<std::pair<std::function<void(int)>, int>> fns;  // each with its outcome
    Due() = default;
    Due(const Due&) = delete;
    Due& operator=(const Due&) = delete;
    ~Due() {
      for (auto& [f, err] : fns) f(err);
    }
  };

  // ---- Start-up (before any other thread uses the log) ----
  // The applied counter and the entries the store holds, oldest first.
  void Restore(uint64_t applied, std::vector<meta::LogEntry> entries) EXCLUDES(mu_);
  void RestoreLost(uint64_t id, std::string_view path) EXCLUDES(mu_);
  void RestoreFailed(uint64_t id, std::string_view path, std::string_view reason) EXCLUDES(mu_);
  // Recovery found the pending persist `seq` already in the backend:
  // removes it (the caller deleted it from the store in its batch).
  void DropRecovered(uint64_t seq) EXCLUDES(mu_);
  // Keep the recent removals RemovedSince answers (the shared namespace).
  void set_track_removals(bool on) { track_removals_ = on; }

  // ---- Appending (caller's lock held from Append to Publish) ----
  // Gives `e` the next seq, adds it to the batch and to `out`.
  void Append(meta::Batch* b, meta::LogEntry e, std::vector<meta::LogEntry>* out) EXCLUDES(mu_);
  // After the batch holding them committed: the entries join the log.
  void Publish(std::vector<meta::LogEntry>&& entries) EXCLUDES(mu_);
  // Called by Publish with each batch of entries as it is logged (with the
  // core's lock held: it may take only a leaf lock of its own). Set before
  // anything is logged; --cluster-store's names (fs/cluster/etcd_names.h).
  void set_observer(std::function<void(const std::vector<meta::LogEntry>&)> fn) { observer_ = std::move(fn); }
  // Records a loss found outside the drain (recovery) in `b`.
  void AddLost(meta::Batch* b, const std::string& path, std::string_view reason) EXCLUDES(mu_);

  // The seq the next entry gets (every entry logged so far is below it).
  uint64_t next_seq() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return next_seq_;
  }

  // ---- The drain's side ----
  // The first `max` entries not yet applied, oldest first.
  std::vector<meta::LogEntry> Pending(size_t max) EXCLUDES(mu_);
  // Waits until the log has entries, up to `d`. False on timeout or shutdown.
  bool WaitForEntries(std::chrono::milliseconds d) EXCLUDES(mu_);
  // Is `seq` the oldest pending entry, with others behind it?
  bool HeadWithFollowers(uint64_t seq) EXCLUDES(mu_);
  // Persist entries a newer version of the same file replaced before the
  // drain took them: the drain skips them (their bytes are not wanted).
  bool Superseded(uint64_t seq) EXCLUDES(mu_);
  void Supersede(uint64_t seq) EXCLUDES(mu_);
  // Is the newest entry the persist `seq` of `ino`, not superseded? (A
  // new seal of that file may then replace it.)
  bool IsOpenTail(uint64_t seq, uint64_t ino) EXCLUDES(mu_);

  // What became of an entry.
  enum class Outcome {
    kApplied,  // in the backend, or undone by later history (skipped as superseded)
    kFailed,   // refused for good, or skipped by the operator: recorded as failed
    kLost,     // its bytes are gone (RecordLost came first)
  };
  // Completing the head, in two steps around the caller's commit:
  // Complete adds to `b` the removal of the entry and the applied counter
  // (and for kFailed the failed record; for kApplied the removal of failed
  // records of the same path, which are healed); Finish, once `b` is
  // committed, pops the entry and answers the waiters it satisfies.
  // Aborts if `e` is not the head: completion out of order is a bug that
  // would break every guarantee downstream.
  struct Completion {
    meta::LogEntry e;
    Outcome outcome = Outcome::kApplied;
    std::string reason;
    uint64_t failed_id = 0;
    std::vector<uint64_t> healed;  // failed records this completion removes
  };
  Completion Complete(const meta::LogEntry& e, Outcome o, std::string_view reason, meta::Batch* b,
                      bool heals = true) EXCLUDES(mu_);
  void Finish(Completion&& c, Due* due) EXCLUDES(mu_);
  // The entry's bytes are lost: its waiters will hear EIO; the path joins
  // the lost list (recorded in `b`) unless listed already. The caller
  // commits `b`, then completes the entry as kLost.
  void RecordLost(const meta::LogEntry& e, std::string_view reason, meta::Batch* b) EXCLUDES(mu_);

  // ---- A refusal holds the drain (-o on_refusal=hold) ----
  // The backend refused the head `e` for good: it stays (retried), later
  // entries wait, and the waiters whose range covers it hear EIO now.
  void Hold(const meta::LogEntry& e, std::string_view reason) EXCLUDES(mu_);
  std::optional<HeldEntry> Held() EXCLUDES(mu_);
  // Is `ino`'s version `version` the entry held at?
  bool HoldsVersion(uint64_t ino, uint64_t version) EXCLUDES(mu_);
  // `ckptfs skip`: ENOENT unless the held entry names `path`.
  [[nodiscard]] Status RequestSkip(std::string_view path) EXCLUDES(mu_);
  bool SkipRequested(uint64_t seq) EXCLUDES(mu_);

  // ---- Waiters (fsync with --fsync backend, drain, umount) ----
  // Calls fn with the outcome once every entry up to `seq` is applied (see
  // the file comment). An answer known already goes into `due` (a caller
  // that holds a lock of its own passes one declared before it), or, with
  // none, is given at once on this thread.
  void WhenApplied(uint64_t seq, std::function<void(int err)> fn, Due* due = nullptr) EXCLUDES(mu_);
  // Waits as WhenApplied does and returns its outcome (0 or EIO).
  int WaitApplied(uint64_t seq) EXCLUDES(mu_);
  // Calls `start` with a callback and waits until that is called; returns
  // the errno it was called with (WaitApplied over any WhenApplied).
  static int Await(const std::function<void(std::function<void(int)>)>& start);
  // Waits until the applied seq passes `seen`, up to `deadline`. False on
  // timeout or shutdown.
  bool WaitAppliedBeyond(uint64_t seen, std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_);
  bool DurabilityAwaited() EXCLUDES(mu_);
  // Wakes every waiter with EIO; later waits return at once.
  void Shutdown() EXCLUDES(mu_);
  bool shut_down() const { return shutdown_flag_.load(std::memory_order_acquire); }

  // ---- Queries ----
  uint64_t AppliedSeq() const { return applied_.load(std::memory_order_acquire); }
  // The newest entry published (its batch committed), 0 if none: a seq
  // given by Append whose commit failed never counts, so no waiter waits
  // for an entry that will never be applied.
  uint64_t LoggedSeq() EXCLUDES(mu_);
  size_t size() EXCLUDES(mu_);
  bool HasPersist() EXCLUDES(mu_);  // any persist entry pending?
  bool HasMoves() EXCLUDES(mu_);    // any rename, unlink, rmdir or link pending?
  // When the pending entries from..to were logged (wall clock µs, never
  // decreasing with seq); entries recovered at start have none.
  std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) EXCLUDES(mu_);
  // Pending persist entries: how many, and the first `max` paths.
  std::pair<uint64_t, std::vector<std::string>> UnpersistedFiles(size_t max) EXCLUDES(mu_);
  // Every pending persist entry's (ino, version, path), oldest first.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> UnpersistedVersions() EXCLUDES(mu_);
  // The persist entry `seq` if pending.
  std::optional<meta::LogEntry> Find(uint64_t seq) EXCLUDES(mu_);
  // Does a pending entry name `path`, something under it, or a directory
  // above it?
  bool Touches(const std::string& path) EXCLUDES(mu_);
  // Does the pending log remove `path` or a directory above it, or did the
  // drain apply such a removal after seq `since` (kept while
  // set_track_removals)? Then the backend's copy must not come back.
  bool RemovalPending(const std::string& path, uint64_t since) EXCLUDES(mu_);
  // Where `ino`, now at `path`, was before every pending entry: the moves
  // (renames, exchanges, links) undone newest first. nullopt if an entry
  // says something else was there (unknown).
  std::optional<std::string> PathBeforePending(std::string path, uint64_t ino) EXCLUDES(mu_);

  // ---- Outcome records ----
  std::vector<FailedEntry> FailedEntries() EXCLUDES(mu_);
  std::vector<std::string> LostFiles() EXCLUDES(mu_);
  size_t LostUnder(const std::string& path) EXCLUDES(mu_);
  // `ckptfs lost --clear`: adds the deletion of every lost and failed
  // record to `b`; ClearedOutcomes once it is committed.
  [[nodiscard]] Status ClearOutcomes(meta::MetaStore* store, meta::Batch* b) EXCLUDES(mu_);
  void ClearedOutcomes() EXCLUDES(mu_);
  // The failed records of `path` (an unlink of a failed file heals them).
  std::vector<uint64_t> FailedAt(const std::string& path) EXCLUDES(mu_);
  void Healed(const std::vector<uint64_t>& ids) EXCLUDES(mu_);

 private:
  struct Waiter {
    uint64_t floor = 0;  // applied seq when registered: the outcomes after it are its own
    std::function<void(int)> fn;
  };
  // The waiter's answer now that its seq is applied.
  int Answer(uint64_t seq, const Waiter& w) REQUIRES(mu_);
  void AdvanceApplied(uint64_t seq, Due* due) REQUIRES(mu_);
  void NoteRemovalApplied(const meta::LogEntry& e) REQUIRES(mu_);

  ckpt::Mutex mu_;
  std::function<void(const std::vector<meta::LogEntry>&)> observer_;  // set_observer
  std::deque<meta::LogEntry> log_ GUARDED_BY(mu_);  // oldest first
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  uint64_t published_ GUARDED_BY(mu_) = 0;  // LoggedSeq
  uint64_t applied_seq_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> applied_{0};                        // mirrors applied_seq_ for lock-free reads
  std::map<uint64_t, int64_t> logged_at_ GUARDED_BY(mu_);  // pending seq -> when logged, µs
  int64_t last_logged_at_ GUARDED_BY(mu_) = 0;
  std::set<uint64_t> superseded_ GUARDED_BY(mu_);
  std::multimap<uint64_t, Waiter> waiters_ GUARDED_BY(mu_);
  // Seqs applied without reaching the backend (failed, lost, skipped),
  // kept while a waiter registered before them may ask.
  std::set<uint64_t> bad_seqs_ GUARDED_BY(mu_);
  std::optional<HeldEntry> held_ GUARDED_BY(mu_);
  uint64_t skip_requested_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, FailedEntry> failed_ GUARDED_BY(mu_);  // by record id
  uint64_t next_failed_ GUARDED_BY(mu_) = 1;
  std::vector<std::string> lost_ GUARDED_BY(mu_);
  uint64_t next_lost_ GUARDED_BY(mu_) = 1;
  // Removals the drain applied lately, (seq, path), oldest first.
  bool track_removals_ = false;  // set before the mount serves
  std::deque<std::pair<uint64_t, std::string>> removed_ GUARDED_BY(mu_);
  uint64_t removed_trimmed_ GUARDED_BY(mu_) = 0;  // the newest seq dropped from removed_
  bool shutdown_ GUARDED_BY(mu_) = false;
  std::atomic<bool> shutdown_flag_{false};
  ckpt::CondVar log_cv_;      // the log gained entries
  ckpt::CondVar applied_cv_;  // applied_seq_ advanced
};

}  // namespace ckpt::fs
