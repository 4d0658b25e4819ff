// residency.h — which files stay in RAM, and the pages made ready for the
// next save: the LRU order of regular files, what a save is (its first
// writer after a quiet second, its bytes), the spares (pre-allocated, warm
// tier pages for passthrough writers, issue #29) and memory-pressure
// episodes.
//
// Residency decides; InodeTable acts. It knows inode numbers, never
// inodes: whether a file may be evicted (clean, closed, not being fetched)
// is the table's question, asked through the Evictor callback, which runs
// without Residency's lock held (it takes the table's). The table tells it
// what happened — a file used, a writer opened or closed, a version sealed
// — from under its own lock.
//
// Thread-safety: every member may be called from any thread. mu_ is a leaf
// (taken after InodeTable's mu_, never with the tier's held).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/tier.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace ckpt::fs {

struct PressureStats {
  uint64_t available = 0, min_free = 0;
  std::string where;
  bool active = false;        // under min_free now
  bool writers_held = false;  // eviction was not enough: new writes wait
  uint64_t episodes = 0, evicted_files = 0, evicted_bytes = 0;  // since mount
};

class Residency {
 public:
  // No writer for this long, and the next one begins a new save (its files
  // are the ones a spare never evicts); less than the pause between two
  // checkpoints of a trainer (make bench: 6 s, BENCH_SETTLE; minutes in
  // training), more than between two files of one checkpoint.
  static constexpr auto kSaveGap = std::chrono::seconds(4);
  // Writers moved (wrote) when this much more was written (WritersIdle).
  static constexpr uint64_t kMovedBytes = 1 << 20;
  // Tests: another gap (their saves come a quiet second apart).
  void set_save_gap(std::chrono::milliseconds g) EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    save_gap_ = g;
  }
  std::chrono::milliseconds save_gap() EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    return save_gap_;
  }
  // Evicts clean files, least recently used first, for `need` bytes
  // (InodeTable::Evict). `all_or_nothing`: only if they cover it all;
  // `spare_kept`: room for a spare, so the last save's files, anything used
  // since it began and the newest --keep-in-memory checkpoints stay.
  using Evictor = std::function<cache::Tier::Relief(uint64_t need, bool all_or_nothing, bool spare_kept)>;

  explicit Residency(cache::Tier* tier) : tier_(tier) {}
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;
  // Before use.
  void set_evictor(Evictor e) { evict_ = std::move(e); }
  // --prealloc: the most bytes of spares to keep; kPreallocAuto: sized from
  // the saves seen (RefillSpares); 0: none.
  static constexpr uint64_t kPreallocAuto = ~0ULL;
  void set_prealloc(uint64_t bytes) { prealloc_ = bytes; }
  uint64_t prealloc() const { return prealloc_.load(); }

  // ---- The LRU order of regular files ----
  void Add(uint64_t ino) EXCLUDES(mu_);    // a new file: least recently used
  void Touch(uint64_t ino) EXCLUDES(mu_);  // used now
  void Remove(uint64_t ino) EXCLUDES(mu_);
  // (use stamp, ino), least recently used first.
  std::vector<std::pair<uint64_t, uint64_t>> Oldest() EXCLUDES(mu_);
  // The stamp when the last save began: a file with a later stamp is that
  // save's or was used since.
  uint64_t SaveClock() EXCLUDES(mu_);

  // ---- Saves ----
  // A handle opened or closed for writing; `first`/`last`: the file's
  // first writer opened, its last closed. The first writer after a quiet
  // second begins a save.
  void WriterOpened(bool first) EXCLUDES(mu_);
  void WriterClosed(bool last) EXCLUDES(mu_);
  // A handle opened or closed for reading only: a load (a restarted
  // trainer reading its checkpoint). Spares wait for it, and one being made
  // stops: warming a spare faults in as many fresh pages as the loader's
  // tensors need, and on a VM whose host takes freed pages back the two
  // fought over them (issue #29: a fresh mount's first load 2.4x tmpfs).
  void ReaderOpened() EXCLUDES(mu_);
  void ReaderClosed() EXCLUDES(mu_);
  // Another of this node's transfers spares wait for, as for a load: with
  // --replicas, the replicator sending a closed file (Replicator::Sending).
  // Warming a spare frees pages for the tier's fallocate to take; beside a
  // replication the link's buffers and sockets take them first, and the
  // spare gets pages the host took back (stop 50: the next save with
  // replicas 2.2x the one without). May be set at any time.
  void set_busy(std::function<bool()> busy) EXCLUDES(mu_);
  // No spare made (one being made stops) for `d`: another member's replica
  // needs the room its spares were dropped for (MakeRoomForReplicas); the
  // spare thread would make them again before the writer's next try.
  void HoldSpares(std::chrono::milliseconds d) EXCLUDES(mu_);
  // An O_TRUNC writer through passthrough: spares are worth their memory.
  void TruncWriterSeen();
  // A save is under way: a writer is writing, or one opened or closed in
  // the last save_gap_ (the gap between two files of one checkpoint).
  bool SaveUnderWay() EXCLUDES(mu_);
  // What the open writers wrote that the daemon does not see (their files'
  // sizes: passthrough writers). Set once, before use; never called under
  // mu_, nor by a caller holding the namespace lock.
  void set_unseen_writes(std::function<uint64_t()> fn) EXCLUDES(mu_);
  // The copying path wrote `bytes`.
  void Wrote(uint64_t bytes) { written_.fetch_add(bytes, std::memory_order_relaxed); }
  // A version of `bytes` sealed (this save's bytes, the largest file).
  void Sealed(uint64_t bytes) EXCLUDES(mu_);
  // A file of `bytes` found (recovery, the backend's import): what a
  // checkpoint here weighs. Every file, however large (a dataset beside
  // the checkpoints turns passthrough off for new names: the copying path
  // is the safe side; ignoring a large checkpoint found would admit its
  // successor as a writer nothing can stop: docs/architecture.md).
  void SawFile(uint64_t bytes) EXCLUDES(mu_);
  uint64_t LargestSealed() EXCLUDES(mu_);
  // A version reached the backend: a file the eviction ahead may take now.
  void Persisted() EXCLUDES(mu_);
  // How large a new file is expected to be: the largest sealed since the
  // mount; before any, the spare made for the first file (0: unknown).
  uint64_t ExpectedSize() EXCLUDES(mu_);
  // The size a fresh mount's first file is expected to have: --prealloc
  // when given, else a quarter of the budget.
  uint64_t FirstFileGuess();

  // ---- Spares ----
  // Tops the spares up (Tier::AddSpare: warm pages), sized from the saves
  // seen, once an O_TRUNC passthrough writer was seen and while no file is
  // open for writing (never beside a save); on a fresh mount one spare of
  // FirstFileGuess for its first file. With the budget near full, files
  // already persisted are evicted ahead for it (not on a fresh mount).
  // `passthrough`: passthrough is active (spares are for its writers).
  // Called every 50 ms by the daemon's spare thread (low priority).
  void RefillSpares(bool passthrough) EXCLUDES(mu_);

  // ---- Memory pressure (fs/core/memory_watch.h) ----
  // Called by the memory watch with the headroom it read (`where` says
  // whose: MemAvailable or a cgroup). Below `min_free`: drops spares,
  // evicts persisted files for the deficit, and if that is not enough holds
  // new tier writes (Tier::set_pressure_limit) until the drain and eviction
  // catch up. Logs once when an episode begins and once when it ends.
  void RelieveMemory(uint64_t available, uint64_t min_free, const std::string& where) EXCLUDES(mu_);
  PressureStats MemoryPressure() EXCLUDES(mu_);

  // Over the budget with nothing clean left to evict (passthrough writers
  // wrote past it): true when such an episode begins, so it is said once.
  bool OverBudgetBegins() { return !over_budget_.exchange(true); }
  void WithinBudget() { over_budget_.store(false); }

 private:
  cache::Tier* const tier_;
  Evictor evict_;  // set before use
  std::atomic<uint64_t> prealloc_{0};

  Mutex mu_;  // a leaf
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  std::unordered_map<uint64_t, uint64_t> use_ GUARDED_BY(mu_);  // ino -> stamp
  std::set<std::pair<uint64_t, uint64_t>> lru_ GUARDED_BY(mu_);  // (stamp, ino), oldest first
  // The largest version sealed since the mount: what a passthrough writer
  // of a new file is expected to write.
  uint64_t largest_sealed_ GUARDED_BY(mu_) = 0;
  // Bytes sealed since the last quiet second (one save: all its files,
  // all its ranks), and the last save's total: how many spares to keep.
  uint64_t save_bytes_acc_ GUARDED_BY(mu_) = 0;
  uint64_t last_save_bytes_ GUARDED_BY(mu_) = 0;
  // The stamp when the last save began (its first writer after a quiet
  // second): files used since are that save's or read since.
  uint64_t save_clock_ GUARDED_BY(mu_) = 0;
  // Files open for writing now, on either path, and a writer's last open
  // or close.
  uint64_t writing_files_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point quiet_since_ GUARDED_BY(mu_){};
  std::chrono::milliseconds save_gap_ GUARDED_BY(mu_) = kSaveGap;
  // Writers that wrote nothing for save_gap_ (a log left open, a handle a
  // trainer forgot) are idle: they neither hold spares back nor keep the
  // next save from beginning. Moved: kMovedBytes more written (seen on
  // the copying path, or unseen: set_unseen_writes) since moved_at_, as
  // NoteWrites last looked (the spare maker's every call).
  std::atomic<uint64_t> written_{0};
  std::shared_ptr<const std::function<uint64_t()>> unseen_writes_ GUARDED_BY(mu_);
  uint64_t moved_ref_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point moved_at_ GUARDED_BY(mu_){};
  // When NoteWrites last looked: a look older than half the gap (the spare
  // thread held up in an eviction or a spare's fallocate) says nothing,
  // and writers are taken to be writing.
  std::chrono::steady_clock::time_point noted_at_ GUARDED_BY(mu_){};
  void NoteWrites() EXCLUDES(mu_);
  // Nothing written for save_gap_, as a recent look saw.
  bool NoWritesFor(std::chrono::steady_clock::time_point now) REQUIRES(mu_) {
    return now >= moved_at_ + save_gap_ && now < noted_at_ + save_gap_ / 2;
  }
  // Writers are open and none wrote, opened or closed for save_gap_.
  bool WritersIdle(std::chrono::steady_clock::time_point now) REQUIRES(mu_) {
    return writing_files_ > 0 && now >= quiet_since_ + save_gap_ && NoWritesFor(now);
  }
  // Files open for reading only, and a reader's last open and close: a
  // load is under way while one opened in the last kLoadSpan is open, or
  // one closed in the last second (Loading).
  uint64_t reading_files_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point read_opened_ GUARDED_BY(mu_){}, read_closed_ GUARDED_BY(mu_){};
  bool Loading(std::chrono::steady_clock::time_point now) REQUIRES(mu_);
  // Loading, or another transfer (set_busy) under way.
  bool Busy(std::chrono::steady_clock::time_point now) EXCLUDES(mu_);
  std::shared_ptr<const std::function<bool()>> busy_ GUARDED_BY(mu_);
  // Past this, a handle held open for reading (an mmap'd checkpoint, a
  // reader that never closes) no longer holds spares back.
  static constexpr std::chrono::seconds kLoadSpan{10};
  PressureStats pressure_ GUARDED_BY(mu_);
  // An O_TRUNC passthrough writer has opened since the mount: only then
  // are spares worth their memory (a mount that only ever updates files in
  // place keeps none).
  std::atomic<bool> trunc_writes_seen_{false};
  std::atomic<bool> first_spare_made_{false};   // a fresh mount's one spare
  std::atomic<bool> saved_since_spare_{false};  // an O_TRUNC writer since the last spare was made
  std::atomic<bool> over_budget_{false};        // OverBudgetBegins
  // The eviction ahead refused (nothing clean enough yet: the drain still
  // has the files) is not asked again at each call: it walks the LRU under
  // the inode table's lock. The next `evict_skip_` calls that would ask do
  // not; each refusal doubles the gap (1, 2, 4 ... kEvictBackoffMax calls
  // of ~50 ms); room made, a version sealed or one persisted ends it, and
  // a refusal during which one was sealed or persisted (`evict_epoch_`
  // moved) sets no gap.
  static constexpr uint32_t kEvictBackoffMax = 32;
  bool EvictAheadDue(uint64_t* epoch) EXCLUDES(mu_);  // false while calls are skipped
  void EvictAheadAgainLocked() REQUIRES(mu_);         // Sealed, Persisted
  uint32_t evict_skip_ GUARDED_BY(mu_) = 0;
  uint32_t evict_backoff_ GUARDED_BY(mu_) = 0;
  uint64_t evict_epoch_ GUARDED_BY(mu_) = 0;
  // A spare the tier failed to make (an error: /dev/shm full, ENOSPC) is
  // not asked for again at each call (each try warms 32 MiB first): the
  // next `spare_skip_` calls do not; each failure doubles the gap, up to
  // kEvictBackoffMax calls; a spare made ends it. A refusal for want of
  // room in the budget costs nothing and sets no gap (a save's spare must
  // not wait past the trainer's removal of its old checkpoint).
  uint32_t spare_skip_ GUARDED_BY(mu_) = 0;
  uint32_t spare_backoff_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point spares_held_until_ GUARDED_BY(mu_){};  // HoldSpares
};

}  // namespace ckpt::fs
