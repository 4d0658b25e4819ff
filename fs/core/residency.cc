// residency.cc — see residency.h.
#include "fs/core/residency.h"

#include <algorithm>

#include "common/log.h"
#include "fs/core/memory_watch.h"

namespace ckpt::fs {

// ---- LRU ----

void Residency::Add(uint64_t ino) {
  MutexLock lk(&mu_);
  if (use_.emplace(ino, 0).second) lru_.emplace(0, ino);
}

void Residency::Touch(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = use_.find(ino);
  if (it != use_.end()) lru_.erase({it->second, ino});
  const uint64_t stamp = ++clock_;
  use_[ino] = stamp;
  lru_.emplace(stamp, ino);
}

void Residency::Remove(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = use_.find(ino);
  if (it == use_.end()) return;
  lru_.erase({it->second, ino});
  use_.erase(it);
}

std::vector<std::pair<uint64_t, uint64_t>> Residency::Oldest() {
  MutexLock lk(&mu_);
  return {lru_.begin(), lru_.end()};
}

uint64_t Residency::SaveClock() {
  MutexLock lk(&mu_);
  return save_clock_;
}

// ---- Saves ----

void Residency::WriterOpened(bool first) {
  MutexLock lk(&mu_);
  const auto now = std::chrono::steady_clock::now();
  // The first writer after kSaveGap with none begins a save: what it
  // touches from here on is its own (RefillSpares never evicts it). Not a
  // quiet second, as the spares' timing is: one checkpoint's files come
  // with gaps of a second or more between them (torch.save of the model,
  // then its optimizer state split into shards: 1.2 s), and the spare made
  // in such a gap evicted the checkpoint's first part, which a restarted
  // trainer then read from the backend (stop 60: 4.5-6.3 s against 0.3 s).
  // Writers left open that wrote nothing for as long (WritersIdle) are not
  // a save under way: without this a log file kept open froze the save
  // clock, and the eviction ahead kept every file used since.
  if (first) {
    if ((writing_files_ == 0 || NoWritesFor(now)) && now >= quiet_since_ + save_gap_) save_clock_ = clock_;
    writing_files_++;
  }
  quiet_since_ = now;
}

void Residency::set_unseen_writes(std::function<uint64_t()> fn) {
  MutexLock lk(&mu_);
  unseen_writes_ = std::make_shared<const std::function<uint64_t()>>(std::move(fn));
}

void Residency::NoteWrites() {
  std::shared_ptr<const std::function<uint64_t()>> unseen;
  {
    MutexLock lk(&mu_);
    unseen = unseen_writes_;
  }
  const uint64_t v = written_.load(std::memory_order_relaxed) + (unseen ? (*unseen)() : 0);
  MutexLock lk(&mu_);
  noted_at_ = std::chrono::steady_clock::now();
  if (v >= moved_ref_ + kMovedBytes) {
    moved_ref_ = v;
    moved_at_ = noted_at_;
  }
}

bool Residency::SaveUnderWay() {
  MutexLock lk(&mu_);
  const auto now = std::chrono::steady_clock::now();
  return now < quiet_since_ + save_gap_ || (writing_files_ > 0 && !WritersIdle(now));
}

void Residency::WriterClosed(bool last) {
  MutexLock lk(&mu_);
  if (last && writing_files_ > 0) writing_files_--;
  quiet_since_ = std::chrono::steady_clock::now();
}

void Residency::ReaderOpened() {
  MutexLock lk(&mu_);
  reading_files_++;
  read_opened_ = std::chrono::steady_clock::now();
}

void Residency::ReaderClosed() {
  MutexLock lk(&mu_);
  if (reading_files_ > 0) reading_files_--;
  read_closed_ = std::chrono::steady_clock::now();
}

bool Residency::Loading(std::chrono::steady_clock::time_point now) {
  if (reading_files_ > 0 && now < read_opened_ + kLoadSpan) return true;
  return read_closed_.time_since_epoch().count() != 0 && now < read_closed_ + std::chrono::seconds(1);
}

void Residency::set_busy(std::function<bool()> busy) {
  auto f = busy ? std::make_shared<const std::function<bool()>>(std::move(busy)) : nullptr;
  MutexLock lk(&mu_);
  busy_ = std::move(f);
}

bool Residency::Busy(std::chrono::steady_clock::time_point now) {
  std::shared_ptr<const std::function<bool()>> busy;
  {
    MutexLock lk(&mu_);
    if (Loading(now)) return true;
    busy = busy_;
  }
  return busy && (*busy)();  // its own locks, never under mu_
}

void Residency::TruncWriterSeen() {
  trunc_writes_seen_.store(true);
  saved_since_spare_.store(true);
}

void Residency::Sealed(uint64_t bytes) {
  MutexLock lk(&mu_);
  largest_sealed_ = std::max(largest_sealed_, bytes);
  save_bytes_acc_ += bytes;  // this save's bytes so far
  EvictAheadAgainLocked();
}

void Residency::SawFile(uint64_t bytes) {
  MutexLock lk(&mu_);
  largest_sealed_ = std::max(largest_sealed_, bytes);
}

void Residency::Persisted() {
  MutexLock lk(&mu_);
  EvictAheadAgainLocked();
}

void Residency::EvictAheadAgainLocked() {
  // What the eviction ahead may take changed: ask at the next call, and a
  // refusal already under way (it looked before the change) sets no gap.
  evict_skip_ = evict_backoff_ = 0;
  ++evict_epoch_;
}

uint64_t Residency::LargestSealed() {
  MutexLock lk(&mu_);
  return largest_sealed_;
}

uint64_t Residency::ExpectedSize() {
  // Nothing sealed yet: the mount's first file is expected to fit the
  // spare made for it (RefillSpares, --prealloc); without one, nothing is
  // known and the copying path takes it.
  const uint64_t largest = LargestSealed();
  return largest > 0 ? largest : tier_->Spares().first;
}

uint64_t Residency::FirstFileGuess() {
  // Before any file is sealed nothing says how large a save will be: an
  // explicit --prealloc, else a quarter of the budget (issue #29: a
  // trainer's first save as fast as its tenth; 2 GiB of a 8 GiB budget).
  const uint64_t cap = prealloc_.load();
  const uint64_t budget = tier_->Stats().budget;
  return cap == kPreallocAuto ? budget / 4 : std::min(cap, budget - budget / 8);
}

// ---- Spares ----

void Residency::RefillSpares(bool passthrough) {
  uint64_t cap = prealloc_.load(), size, save;
  // Spares are for passthrough writers. Asked before the fresh mount's one
  // spare is counted as made: the spare thread's first call can come
  // before the kernel's INIT turned passthrough on (it used to be counted
  // then, and the first save of such a mount got no spare).
  NoteWrites();  // whether spares are made or not: the next save's start needs it (WriterOpened)
  if (!passthrough || cap == 0) return;
  bool first;
  {
    MutexLock lk(&mu_);
    // No memory claimed ahead while the machine is short of it, nor while
    // a replica needs the room (HoldSpares).
    if (pressure_.active || std::chrono::steady_clock::now() < spares_held_until_) return;
    // Never beside a save, whichever path it takes, nor in the gap between
    // two files of one save (64 shards): only after a quiet second — or at
    // once when the tier just gave pages back (a trainer removing its
    // previous checkpoint), while the host still backs them
    // (Tier::LastFreed; measured, docs/benchmarks.md).
    const auto now = std::chrono::steady_clock::now();
    const bool just_freed = now < tier_->LastFreed() + std::chrono::seconds(1);
    if ((writing_files_ > 0 && !WritersIdle(now)) || (now < quiet_since_ + std::chrono::seconds(1) && !just_freed))
      return;
    size = largest_sealed_;
    first = !trunc_writes_seen_.load();
    // A quiet second: what was sealed since the last one is the last save.
    if (save_bytes_acc_ > 0) {
      last_save_bytes_ = save_bytes_acc_;
      save_bytes_acc_ = 0;
    }
    save = last_save_bytes_;
  }
  // Nor beside a load (ReaderOpened) or a replication (set_busy): Busy,
  // which asks the replicator without mu_ held.
  if (Busy(std::chrono::steady_clock::now())) return;
  // A fresh mount (nothing written since, nothing in the namespace): one
  // spare for its first save, FirstFileGuess, made once. A mount that
  // found files (a restart, a shared backend) makes none until a save: a
  // restarted trainer reads its checkpoint first, and fetching it back
  // (ckptfs warmup) must not find its budget taken by a spare still being
  // made (CI: warmup in an 8 MiB budget got ENOSPC). Past that, spares
  // only once a new version written from nothing (O_TRUNC, passthrough)
  // was seen: they are for such writers.
  if (first) {
    if (size > 0 || first_spare_made_.load()) return;
    size = FirstFileGuess();
  }
  {
    // Nor when the claim would take it there: the watch's last reading, or,
    // with the watch off (--min-free 0), one taken now. A spare is tmpfs
    // pages nothing can reclaim: in a memory cgroup a claim past its limit
    // OOM-kills the trainer or this daemon (stop 47: a 700 MiB cgroup
    // filled by spares, then the daemon killed; spares_memory.sh). The
    // fresh mount's spare refused so is asked again at the next call,
    // until memory is there or a save came.
    uint64_t available, min_free;
    {
      MutexLock lk(&mu_);
      available = pressure_.available, min_free = pressure_.min_free;
    }
    if (min_free == 0) {
      const Headroom now = ReadHeadroom();
      available = now.known ? now.available : UINT64_MAX;
    }
    if (available < 2 * min_free + 2 * size) return;
  }
  if (size == 0 || (first && first_spare_made_.load())) return;
  constexpr uint64_t kUnit = 2u << 20;  // spares are whole 2 MiB
  const uint64_t budget = tier_->Stats().budget;
  size = (size + kUnit - 1) / kUnit * kUnit;
  // Enough for the next save whole — every file of every rank (issue #29:
  // 8 ranks × 256 MiB got two 256 MiB spares, and six ranks wrote fresh
  // pages) — and at least two of the largest file; up to the budget less
  // the eighth AddSpare keeps free: a spare is the first thing given back,
  // so capping it at half the budget (as first built) only left the second
  // half of a file larger than that to fresh pages (issue #15: a 4 GiB
  // file in a 5.2 GiB budget got a 2.6 GiB spare).
  if (cap == kPreallocAuto) cap = std::min(std::max(2 * size, save), budget - budget / 8);
  // One spare per call: the watch calls again in 50 ms, and a save that
  // starts meanwhile stops the refill. Under a cap smaller than a file, a
  // spare covers the file's first part.
  const uint64_t have = tier_->Spares().first;
  const uint64_t bytes = std::min(size, cap > have ? (cap - have) / kUnit * kUnit : 0);
  if (bytes == 0) return;
  const uint64_t headroom = budget / 8;
  // Asked whenever the spares on hand do not cover the next save, not only
  // when there are none: with a remnant left (a small top-up the last save
  // did not adopt) the eviction never ran, and a keep-all save found 20 MiB
  // ready and waited (2.35 s, 0.40 s of it CPU, against 0.51-0.67 s for
  // the other repetitions; make bench, stop 51).
  if (!first && have < std::max(size, save) && saved_since_spare_.load() && evict_) {
    // The budget near full (keep-all: every save a new directory): files
    // already persisted make way for the next save's spare now, least
    // recently used first and the newest --keep-in-memory checkpoints last
    // (Evict), rather than that save taking fresh pages or the copying
    // path at its own expense (issue #29); never the last save's files
    // (what a restarted trainer reads) nor the newest --keep-in-memory
    // checkpoints. Only for the next save's first spare,
    // and only once a save came since the last spare was made: a reader
    // that fetched old checkpoints back (a restarted trainer, an
    // evaluation job) does not see them evicted again for a save that may
    // never come. Not before the mount's first save: what the tier
    // re-attached is what a restarted trainer reads next.
    cache::TierStats s = tier_->Stats();
    uint64_t epoch = 0;
    if (s.used + s.reserved + bytes + headroom > s.for_files() && EvictAheadDue(&epoch)) {
      const auto r = evict_(s.used + s.reserved + bytes + headroom - s.for_files(), true, /*spare_kept=*/true);
      MutexLock lk(&mu_);
      if (r == cache::Tier::Relief::kFreed) spare_skip_ = 0;  // pages freed: a failed spare is tried now
      if (r == cache::Tier::Relief::kFreed || epoch != evict_epoch_) {
        evict_backoff_ = 0;  // room made, or a version sealed or persisted meanwhile
      } else {
        evict_backoff_ = std::min(std::max(1u, 2 * evict_backoff_), kEvictBackoffMax);
      }
      evict_skip_ = evict_backoff_;
    }
  }
  {
    MutexLock lk(&mu_);
    if (spare_skip_ > 0) {  // the last one failed with an error (SpareFailures)
      --spare_skip_;
      return;
    }
  }
  // Cut short when a save, a load or a memory-pressure episode begins (the
  // watch's thread: a spare still being made is not among those it drops,
  // and it would go on growing, 32 MiB at a time, while the trainer needs
  // the memory): the part made is kept (dropped then by the episode's next
  // reading).
  const uint64_t failures = tier_->SpareFailures().first;
  const bool made = tier_->AddSpare(bytes, headroom, [this] {
    const auto now = std::chrono::steady_clock::now();
    if (Busy(now)) return true;
    NoteWrites();
    MutexLock lk(&mu_);
    return (writing_files_ > 0 && !WritersIdle(now)) || pressure_.active || now < spares_held_until_;
  });
  if (made) {
    saved_since_spare_.store(false);
    if (first) first_spare_made_.store(true);
  }
  // Failed (/dev/shm full): asked again after 1, 2, 4 ... calls. Refused
  // for room, or made: at the next call. A fresh mount's one spare too,
  // until made.
  const bool failed = tier_->SpareFailures().first > failures;
  MutexLock lk(&mu_);
  spare_backoff_ = failed ? std::min(std::max(1u, 2 * spare_backoff_), kEvictBackoffMax) : 0;
  spare_skip_ = spare_backoff_;
}

void Residency::HoldSpares(std::chrono::milliseconds d) {
  MutexLock lk(&mu_);
  spares_held_until_ = std::max(spares_held_until_, std::chrono::steady_clock::now() + d);
}

bool Residency::EvictAheadDue(uint64_t* epoch) {
  MutexLock lk(&mu_);
  *epoch = evict_epoch_;
  if (evict_skip_ == 0) return true;
  --evict_skip_;
  return false;
}

// ---- Memory pressure ----

void Residency::RelieveMemory(uint64_t available, uint64_t min_free, const std::string& where) {
  bool was_active;
  {
    MutexLock lk(&mu_);
    pressure_.available = available;
    pressure_.min_free = min_free;
    pressure_.where = where;
    was_active = pressure_.active;
  }
  // An episode begins below min_free and ends above 1.5 x min_free, and
  // eviction aims there: no flapping at the edge while the trainer grows.
  const uint64_t target = min_free + min_free / 2;
  if (min_free == 0 || available >= (was_active ? target : min_free)) {
    if (!was_active) return;
    tier_->set_pressure_limit(~0ull);
    MutexLock lk(&mu_);
    pressure_.active = pressure_.writers_held = false;
    LOG_INFO("memory: {} bytes available again ({}), at least --min-free {}; writes go on", available, where, min_free);
    return;
  }
  const uint64_t deficit = target - std::min(target, available);
  // Pre-allocated pages hold nobody's bytes: they go first.
  cache::TierStats before = tier_->Stats();
  tier_->DropSpares();
  cache::TierStats mid = tier_->Stats();
  uint64_t freed = before.used - std::min(before.used, mid.used);
  uint64_t files_before = mid.files;
  if (freed < deficit && evict_) (void)evict_(deficit - freed, false, false);
  cache::TierStats after = tier_->Stats();
  const uint64_t evicted = mid.used - std::min(mid.used, after.used);
  const uint64_t evicted_files = files_before - std::min(files_before, after.files);
  freed += evicted;
  // Not enough: what is left is dirty (or open). New tier writes wait until
  // the drain makes it clean and this evicts it; never dropped.
  const bool hold = freed < deficit;
  const uint64_t in_tier = after.used + after.reserved;
  tier_->set_pressure_limit(hold ? in_tier - std::min(in_tier, deficit - freed) : ~0ull);
  MutexLock lk(&mu_);
  pressure_.evicted_files += evicted_files;
  pressure_.evicted_bytes += evicted;
  if (!was_active) {
    pressure_.episodes++;
    LOG_WARN("memory: {} bytes available ({}), under --min-free {}: evicted {} files ({} bytes) that are in the backend{}",
             available, where, min_free, evicted_files, freed,
             hold ? "; new writes wait: the rest of the tier is not in the backend yet" : "");
  } else if (hold && !pressure_.writers_held) {
    LOG_WARN("memory: still under --min-free ({} bytes available, {}); new writes wait for the drain", available, where);
  }
  pressure_.active = true;
  pressure_.writers_held = hold;
}

PressureStats Residency::MemoryPressure() {
  MutexLock lk(&mu_);
  return pressure_;
}

}  // namespace ckpt::fs
