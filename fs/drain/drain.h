// drain.h — the drainer: applies the ordered log of fs/meta to a backend.
//
// One thread walks the log oldest first and commits each entry in order;
// a pool of staging threads copies the bytes of upcoming persist entries
// into the backend's staging area in parallel, so transfers overlap while
// the backend still sees the mount's history in order. Entries the history
// has undone are skipped: a persist whose file was deleted, rewritten or
// re-sealed since (DrainPort::BeginPersist says ESTALE), and a directory
// created and removed again with nothing moved out of it in between.
//
// Errors from the backend are retried with exponential backoff (100 ms to
// 10 s), one log line per episode; nothing is dropped. An entry the backend
// refuses for good (IsPermanent: a name it cannot hold, a directory where
// the file goes) holds the drain (-o on_refusal=hold, the default): it is
// retried with the same backoff, every later entry waits behind it (order
// first: no `latest` past a missing shard), and the waiters it covers are
// told EIO; `ckptfs skip` fails it, recorded, and the drain goes on. With
// -o on_refusal=skip it is failed at once. While the mount is read-only (a metadata write
// failed: DrainPort::ReadOnlyReason) nothing is applied or staged: no
// progress could be recorded, so every round would upload the same files
// again; the drain waits, once logged, for the next mount to resume it.
// Stop() ends promptly:
// staged uploads are aborted and the log keeps what was not applied. A
// thread stuck in a backend call that does not return (a hard-mounted NFS
// server gone) is waited for kStopWait at most, then left behind with an
// error line (Stop returns false), so that shutdown never hangs on it.
//
// In a cluster (--cluster; fs/cluster/cluster.h) an entry is staged as usual, but
// applied to the backend only once Cluster::MayPublish allows it: the drain
// waits, polling every 50 ms, with one debug line per wait — not an error,
// no backoff.
//
// Test knobs: CKPTFS_DRAIN_DELAY_MS=N waits N ms before each publish, so
// mounted tests can watch the backend while a drain is in progress;
// CKPTFS_DRAIN_PAUSE_FILE=PATH applies nothing while PATH exists (a
// backend that is stuck, then recovers).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/mutex.h"
#include "fs/cluster/cluster.h"
#include "fs/core/drain_port.h"

namespace ckpt::fs {

struct DrainStats {
  uint64_t bytes_persisted = 0;  // since mount
  uint64_t files_persisted = 0;
  uint64_t entries_applied = 0;
  uint64_t entries_skipped = 0;
  uint64_t entries_failed = 0;  // refused by the backend for good (see IsPermanent)
  double rate = 0;              // bytes/s over the last seconds
  uint64_t retries = 0;
  std::string last_error;       // empty when the backend is healthy
  int64_t last_error_time = 0;  // unix seconds
  int64_t error_since = 0;      // unix seconds: when this episode of errors began
  bool in_error = false;
  uint64_t yields = 0;      // transfers that waited for a save to finish (set_yield)
  double yielded_s = 0;     // how long they waited, in all
  bool yielding = false;    // a transfer waits for a save now
  uint64_t holder_wait_seq = 0;  // the head waits for a replica holder's claim of it (or a later one) to be marked
};

// Is a backend error one that no retry can fix for this entry? Then the
// drain holds at it (or, with -o on_refusal=skip, marks it failed and goes
// on); every other error is retried with backoff, for ever, in silence
// after its first log line.
bool IsPermanent(int err);

// Applies one namespace entry (mkdir, rmdir, unlink, rename, symlink, link,
// setattr) to the backend, as the drain does; ENOENT: what it names is not
// there (replayed, or never persisted), the caller's to judge. Also the
// takeover's, for a dead member's entries (fs/cluster/takeover.h).
Status ApplyToBackend(backend::Backend* b, const meta::LogEntry& e);
// A removal (`op` unlink or rmdir) at `gate_us` that cluster `c` keeps out of
// the backend: ordered after a lost member's lost entries
// (Cluster::KeepsRemoval). Logged with `who`. False without a cluster.
bool KeptForLost(Cluster* c, meta::LogOp op, int64_t gate_us, const std::string& path, const std::string& who);

// The nice value of the threads that copy bytes to the backend.
inline constexpr int kStagerNice = 10;

class Drainer {
 public:
  Drainer(DrainPort* port, backend::Backend* backend, int parallel);
  ~Drainer();
  Drainer(const Drainer&) = delete;
  Drainer& operator=(const Drainer&) = delete;

  void Start();
  // A degraded mount: the backend was unreachable at mount (`why`). The
  // drain starts in error and, while it has nothing to apply, probes the
  // backend (Backend::Check) with backoff until it answers.
  void MarkUnreachable(const std::string& why);
  // Cross-node ordering: every entry waits for `c`'s MayPublish before it
  // is applied. Before Start; `c` outlives the drainer's threads.
  void set_cluster(Cluster* c) { cluster_ = c; }
  // Saves first: a stager starts no transfer while `hold()` is true, polled
  // every 10 ms (fs/core/save_activity.h says when, and bounds it). Before Start.
  void set_yield(std::function<bool()> hold) { hold_ = std::move(hold); }
  // What a refusal for good does (-o on_refusal=): hold the drain at the
  // refused entry (false, the default) or fail it and go on (true).
  // Before Start.
  void set_refusal_skip(bool skip) { refusal_skip_ = skip; }
  // Ends a backoff now (an operator's `ckptfs skip` waits for no timer).
  void Kick();
  // Entries of this run that replica holders took over while it was
  // counted dead (EtcdRecords::SetOnTaken): completed here without being
  // applied (the holders applied them), as superseded entries are.
  // `claimed`: taken by a live holder, not yet done: the drain waits at
  // them, asking `refresh` (set_refresh_taken) twice a second for news.
  void SkipTaken(const std::vector<uint64_t>& seqs, const std::vector<uint64_t>& claimed = {});
  void set_refresh_taken(std::function<void()> f) { refresh_taken_ = std::move(f); }
  // The cluster's view changed (Cluster::SetOnChange): an entry waiting
  // for it asks MayPublish again now.
  void ClusterChanged();
  // Stops the threads, waiting at most `bound` for them. True if they all
  // ended. False if some are still in a backend call (logged once): they
  // may yet use this drainer, its table and its backend when the call
  // returns, so the caller must keep all three alive (the daemon exits
  // without destroying them); the log keeps every entry not applied, for
  // the next mount. Safe to call twice (the second call waits no more).
  // The destructor waits for every thread, however long.
  bool Stop(std::chrono::milliseconds bound = kStopWait);
  static constexpr std::chrono::milliseconds kStopWait{10000};

  DrainStats Stats();

 private:
  // A staging job. `done` and `err` are read and written under mu_ (the
  // analysis cannot say so: they are not members of Drainer); src and staged
  // belong to the stager until it sets `done`, then to the drain thread.
  struct Job {
    meta::LogEntry entry;
    bool done = false;
    int err = 0;  // ESTALE: superseded; ECANCELED: changed while staging
    PersistSource src;
    backend::Staged staged;  // no token: hashed only (a taken entry: nothing staged in the backend)
    bool hashed_only = false;  // HashOnly: nothing to publish (a taken or claimed entry)
  };

  void Run();
  void StageLoop();
  // A thread of the drainer has ended (Stop waits for running_ to reach 0).
  void Exited();
  // Joins the threads (REQUIRES: they ended or will) and drops what was
  // staged and not published.
  void JoinAndDropStaged();
  // Waits while hold_ says a save is under way (or until Stop).
  void YieldToSaves();
  // Time to try copying a version sealed in place aside (copy_retry_at_).
  bool CopyAsideDue();
  // In error with nothing to apply (a degraded mount): time to ask the
  // backend whether it is back.
  bool ProbeDue();
  // Starts staging jobs for persist entries in `window`.
  void Schedule(const std::vector<meta::LogEntry>& window) REQUIRES(mu_);
  // A staging job for `e`, queued for the stagers (no cap).
  std::shared_ptr<Job> AddJob(const meta::LogEntry& e) REQUIRES(mu_);
  // Waits on cv_ until `deadline` or Stop(), whichever is first.
  void SleepUntil(std::chrono::steady_clock::time_point deadline) REQUIRES(mu_);
  // Applies the oldest entry. Returns 0 or the errno to retry on.
  int ApplyHead(const meta::LogEntry& e, const std::vector<meta::LogEntry>& window);
  int ApplyPersist(const meta::LogEntry& e);
  // Waits for the entry's staging job, if any, and drops it (aborting what
  // it staged). False if the drainer stops meanwhile.
  bool DropJob(const meta::LogEntry& e);
  // Records the head entry as failed (`reason`) and removes it from the log.
  int FailHead(const meta::LogEntry& e, const std::string& reason);
  // The head entry is refused for good (`err`) and the drain holds at it
  // (OpLog::Hold); logged once per entry, shown in Stats.
  void HoldHead(const meta::LogEntry& e, int err);
  int ApplyNamespace(const meta::LogEntry& e);
  // Waits until the cluster lets entry `e` reach the backend (at once
  // without a cluster). False if the drainer stops meanwhile.
  bool WaitCluster(const meta::LogEntry& e);
  // WaitCluster, the pause knob (WhilePaused), then WaitCluster again.
  bool Cleared(const meta::LogEntry& e);
  // A namespace entry a replica holder applied (taken_): completed here,
  // unapplied, and its result returned; nullopt if not taken.
  std::optional<int> CompleteIfTaken(const meta::LogEntry& e) EXCLUDES(mu_);
  bool IsTaken(uint64_t seq) EXCLUDES(mu_);
  // Completes a taken persist as published (the holder published these
  // bytes): persisted, with the checksum its job computed.
  int CompleteTaken(const meta::LogEntry& e, const std::shared_ptr<Job>& job);
  // Marks entries undone by a later rmdir of the directory `e` creates.
  // A persist whose very next entry rewrites, deletes or replaces the file.
  bool SkipUndonePersist(const meta::LogEntry& e, const std::vector<meta::LogEntry>& window);
  bool SkipUndoneMkdir(const meta::LogEntry& e);
  void NoteError(const meta::LogEntry& e, int err);
  void NoteSuccess();
  void Backoff();
  // Records that the drain stands still because the mount is read-only
  // (`why`), once, then waits a second (or for Stop).
  void HoldReadOnly(const std::string& why);
  bool read_only_noted_ = false;  // drain thread only

  DrainPort* const port_;  // the core's side of each entry
  OpLog* const log_;       // port_->log(): what the drain reads of the log
  backend::Backend* const backend_;
  Cluster* cluster_ = nullptr;
  std::function<bool()> hold_;  // set_yield; empty: never
  int yielding_ GUARDED_BY(mu_) = 0;  // stagers in YieldToSaves now
  const int parallel_;
  bool refusal_skip_ = false;  // set_refusal_skip
  bool kick_ GUARDED_BY(mu_) = false;  // Kick: the backoff ends now
  bool cluster_changed_ GUARDED_BY(mu_) = false;  // ClusterChanged: WaitCluster asks again
  uint64_t held_seq_ GUARDED_BY(mu_) = 0;  // the entry HoldHead last logged
  std::string held_reason_ GUARDED_BY(mu_);  // and why

  // Lock order: mu_, then the namespace lock (then OpLog's).
  Mutex mu_;
  CondVar cv_;                                                     // jobs queued or finished, or Stop()
  std::map<uint64_t, std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);  // by seq
  std::deque<std::shared_ptr<Job>> queue_ GUARDED_BY(mu_);         // waiting for a stager
  std::vector<uint64_t> skip_ GUARDED_BY(mu_);                     // seqs undone by history
  std::set<uint64_t> taken_ GUARDED_BY(mu_);                       // seqs replica holders applied (SkipTaken)
  std::set<uint64_t> stale_taken_ GUARDED_BY(mu_);                 // claims of seqs past the log (SkipTaken)
  std::set<uint64_t> claimed_taken_ GUARDED_BY(mu_);               // claimed, not done yet: waited for
  std::function<void()> refresh_taken_;
  std::chrono::steady_clock::time_point refreshed_at_;  // Run's thread only
  // A live holder claimed `seq` and has not applied it yet: asks for news
  // (at most twice a second); true while so.
  bool WaitingForHolder(uint64_t seq);
  // `e` with its names where the replica holders left them: moved by the
  // later entries they applied (taken_) while this run was counted dead
  // and `e` was not taken (given up, or held by none); nullopt if one of
  // those removed or replaced its name (then `e` is superseded:
  // CompleteLeft completes it unapplied). `e` itself if none.
  std::optional<meta::LogEntry> WhereHoldersLeftIt(const meta::LogEntry& e) EXCLUDES(mu_);
  int CompleteLeft(const meta::LogEntry& e, const std::shared_ptr<Job>& job);
  std::map<uint64_t, meta::LogEntry> taken_entries_
      GUARDED_BY(mu_);  // taken_'s entries, as WhereHoldersLeftIt read them
  DrainStats stats_ GUARDED_BY(mu_);
  std::deque<std::pair<double, uint64_t>> recent_ GUARDED_BY(mu_);  // (time, bytes) for the rate

  int backoff_ms_ = 0;        // drain thread only
  int publish_delay_ms_ = 0;  // CKPTFS_DRAIN_DELAY_MS: a slow backend, for tests
  std::string pause_file_;    // CKPTFS_DRAIN_PAUSE_FILE: a stuck backend, for tests
  // Holds while the pause file exists; true if the drain stopped meanwhile.
  bool WhilePaused();

  std::atomic<bool> stop_{false};
  int running_ GUARDED_BY(mu_) = 0;  // threads started and not ended
  // No copy aside of a version sealed in place before then (no room for
  // one at the last try: DrainPort::CopyAsideSealedInPlace).
  std::chrono::steady_clock::time_point copy_retry_at_ GUARDED_BY(mu_){};
  std::thread runner_;
  std::vector<std::thread> stagers_;
};

}  // namespace ckpt::fs
