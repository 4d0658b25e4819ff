// residency.cc — which files are in RAM: the LRU evictor that drops clean
// files for the budget, and the fetch that brings an evicted (remote) file
// back from where the backend holds it now.
//
// One of the files of InodeTable (fs/core/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include "fs/core/core_impl.h"

namespace ckpt::fs {

bool InodeTable::NeedsFetch(uint64_t ino, int flags) {
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  bool trunc = (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY;
  return n && S_ISREG(n->rec.mode) && n->rec.state == DataState::kRemote && !trunc;
}

// ---- Budget and remote files ----

void InodeTable::RelieveMemory(uint64_t available, uint64_t min_free, const std::string& where) {
  bool was_active;
  {
    MutexLock lk(&pressure_mu_);
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
    MutexLock lk(&pressure_mu_);
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
  if (freed < deficit) (void)Evict(deficit - freed);
  cache::TierStats after = tier_->Stats();
  const uint64_t evicted = mid.used - std::min(mid.used, after.used);
  const uint64_t evicted_files = files_before - std::min(files_before, after.files);
  freed += evicted;
  // Not enough: what is left is dirty (or open). New tier writes wait until
  // the drain makes it clean and this evicts it; never dropped.
  const bool hold = freed < deficit;
  const uint64_t in_tier = after.used + after.reserved;
  tier_->set_pressure_limit(hold ? in_tier - std::min(in_tier, deficit - freed) : ~0ull);
  MutexLock lk(&pressure_mu_);
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

InodeTable::PressureStats InodeTable::MemoryPressure() {
  MutexLock lk(&pressure_mu_);
  return pressure_;
}

Result<uint64_t> InodeTable::ReleaseTier(std::string* why) {
  MutexLock lk(&mu_);
  if (const size_t pending = oplog_.size(); pending > 0) {
    *why = fmt::format("{} changes not yet in the backend", pending);
    return Err(EBUSY);
  }
  Batch b;
  std::vector<Inode*> resident;
  for (auto& [ino, n] : inodes_) {
    if (!S_ISREG(n->rec.mode)) continue;
    const std::string path = EntryPath(n->rec.parent, n->rec.name);
    if (n->opens > 0) {
      *why = fmt::format("ino {} '{}' is open", ino, path);
      return Err(EBUSY);
    }
    if (n->rec.state == DataState::kRemote) continue;
    if (n->rec.state != DataState::kPersisted) {
      *why = fmt::format("ino {} '{}' is {}", ino, path, meta::DataStateName(n->rec.state));
      return Err(EBUSY);
    }
    if (!tier_->Has(ino)) continue;
    InodeRecord r = n->rec;
    r.state = DataState::kRemote;
    MetaStore::PutInode(&b, r);
    resident.push_back(n.get());
  }
  // Recorded first: a crash between the two leaves remote files whose
  // bytes are still in the tier, which the next mount removes.
  if (auto st = Commit(b, /*sync=*/true); !st) {
    *why = fmt::format("cannot record the files as remote: {}", strerror(st.error()));
    return Err(st.error());
  }
  for (Inode* n : resident) n->rec.state = DataState::kRemote;
  auto freed = tier_->RemoveAll();
  if (!freed) {
    *why = freed.error() == ENOTEMPTY ? fmt::format("{}/orphans holds files no inode owns (docs/operations.md)",
                                                    tier_->dir())
                                      : fmt::format("cannot remove it: {}", strerror(freed.error()));
    return Err(freed.error());
  }
  return *freed;
}

void InodeTable::RelieveOverBudget() {
  {
    MutexLock lk(&mu_);
    for (uint64_t ino : pt_writing_) Find(ino);  // Find takes in what they wrote
  }
  EvictIfOverBudget();
  // Nothing clean was left to evict: the kernel's writes cannot be made to
  // wait. Said once per episode, not every 50 ms.
  cache::TierStats s = tier_->Stats();
  if (s.used <= s.budget) return over_budget_.store(false);
  if (over_budget_.exchange(true)) return;
  std::string writers;
  {
    MutexLock lk(&mu_);
    for (uint64_t ino : pt_writing_) writers += (writers.empty() ? "ino " : ", ") + std::to_string(ino);
  }
  LOG_WARN("tier: {} of {} bytes in use, over the budget: passthrough writer(s) ({}) wrote more than the largest "
           "file before them and nothing clean is left to evict",
           s.used, s.budget, writers.empty() ? "closed since" : writers);
}

void InodeTable::EvictIfOverBudget() {
  cache::TierStats s = tier_->Stats();
  if (s.used + s.reserved <= s.budget) return;
  // Spares go before any file: evicting a file a reader will want back to
  // keep pages nobody asked for yet would be the wrong way round.
  if (tier_->Spares().second > 0) {
    tier_->DropSpares();
    s = tier_->Stats();
    if (s.used + s.reserved <= s.budget) return;
  }
  (void)Evict(s.used + s.reserved - s.budget);
}

uint64_t InodeTable::FirstFileGuess() {
  // Before any file is sealed nothing says how large a save will be: an
  // explicit --prealloc, else a quarter of the budget (issue #29: a
  // trainer's first save as fast as its tenth; 2 GiB of a 8 GiB budget).
  const uint64_t cap = prealloc_.load();
  const uint64_t budget = tier_->Stats().budget;
  return cap == kPreallocAuto ? budget / 4 : std::min(cap, budget - budget / 8);
}

void InodeTable::RefillSpares() {
  {
    // No memory claimed ahead while the machine is short of it.
    MutexLock lk(&pressure_mu_);
    if (pressure_.active) return;
  }
  uint64_t cap = prealloc_.load(), size, save;
  bool first;
  {
    MutexLock lk(&mu_);
    // Never beside a save, whichever path it takes, nor in the gap between
    // two files of one save (64 shards): only after a quiet second — or at
    // once when the tier just gave pages back (a trainer removing its
    // previous checkpoint), while the host still backs them
    // (Tier::LastFreed; measured, docs/benchmarks.md).
    const auto now = std::chrono::steady_clock::now();
    const bool just_freed = now < tier_->LastFreed() + std::chrono::seconds(1);
    if (writing_files_ > 0 || (now < quiet_since_ + std::chrono::seconds(1) && !just_freed)) return;
    size = largest_sealed_;
    first = !trunc_writes_seen_.load();
    // A quiet second: what was sealed since the last one is the last save.
    if (save_bytes_acc_ > 0) {
      last_save_bytes_ = save_bytes_acc_;
      save_bytes_acc_ = 0;
    }
    save = last_save_bytes_;
  }
  // A fresh mount (nothing written since, nothing in the namespace): one
  // spare for its first save, FirstFileGuess, made once. A mount that
  // found files (a restart, a shared backend) makes none until a save: a
  // restarted trainer reads its checkpoint first, and fetching it back
  // (ckptfs warmup) must not find its budget taken by a spare still being
  // made (CI: warmup in an 8 MiB budget got ENOSPC). Past that, spares
  // only once a new version written from nothing (O_TRUNC, passthrough)
  // was seen: they are for such writers.
  if (first) {
    if (size > 0 || first_spare_made_.exchange(true)) return;
    size = FirstFileGuess();
  }
  {
    // Nor when the claim would take it there (the watch's last reading).
    MutexLock lk(&pressure_mu_);
    if (pressure_.min_free > 0 && pressure_.available < 2 * pressure_.min_free + 2 * size) return;
  }
  if (cap == 0 || size == 0 || !backing_ || !backing_->active()) return;
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
  if (!first && have == 0 && saved_since_spare_.load()) {
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
    if (s.used + s.reserved + bytes + headroom > s.budget)
      (void)Evict(s.used + s.reserved + bytes + headroom - s.budget, true, /*spare_kept=*/true);
  }
  // Cut short when a save begins: the part made is kept.
  if (tier_->AddSpare(bytes, headroom, [this] {
        MutexLock lk(&mu_);
        return writing_files_ > 0;
      }))
    saved_since_spare_.store(false);
}

cache::Tier::Relief InodeTable::Evict(uint64_t need, bool all_or_nothing, bool spare_kept) {
  MutexLock lk(&mu_);
  // Least recently used first: the LRU set is in that order already. With
  // --keep-in-memory K, the files of the newest K checkpoints go last, the
  // older of those first: a budget too small for them still gets its room.
  std::vector<Inode*> clean;
  std::vector<std::pair<uint64_t, Inode*>> kept;  // (checkpoint number, file)
  const uint64_t kept_from = KeptFrom();
  for (auto [use, ino] : lru_) {
    Inode* n = Find(ino);
    if (!n || n->rec.state != DataState::kPersisted || n->opens != 0 || n->fetching || n->rec.nlink == 0) continue;
    if (spare_kept && n->last_use > save_clock_) continue;  // the last save's, or read since
    if (uint64_t ord = kept_from > 0 ? CheckpointOf(n) : 0; ord >= kept_from && ord > 0) {
      kept.emplace_back(ord, n);
    } else {
      clean.push_back(n);
    }
  }
  std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (!spare_kept)
    for (auto& [ord, n] : kept) clean.push_back(n);
  if (all_or_nothing) {
    uint64_t can = 0;
    for (Inode* n : clean)
      if ((can += tier_->AllocatedBytes(n->rec.ino)) >= need) break;
    if (can < need) return cache::Tier::Relief::kWait;
  }
  uint64_t freed = 0;
  Batch b;
  std::vector<uint64_t> evicted;
  for (Inode* n : clean) {
    if (freed >= need) break;
    uint64_t bytes = tier_->AllocatedBytes(n->rec.ino);
    Transition(n, FileEvent::kEvict);
    MetaStore::PutInode(&b, n->rec);
    evicted.push_back(n->rec.ino);
    freed += bytes;
  }
  if (!evicted.empty()) {
    // Record "remote" before the bytes go: a crash in between leaves a
    // remote file whose tier copy is merely unused.
    if (auto st = Commit(b); !st) {
      for (uint64_t ino : evicted) Transition(Find(ino), FileEvent::kFetch);  // undone
      return cache::Tier::Relief::kWait;
    }
    FAILPOINT("evict.mid");
    for (uint64_t ino : evicted) tier_->Remove(ino);
    LOG_DEBUG("evicted {} files, {} bytes", evicted.size(), freed);
    return cache::Tier::Relief::kFreed;
  }
  // Nothing clean: space comes back only if closed files can drain.
  return oplog_.HasPersist() ? cache::Tier::Relief::kWait : cache::Tier::Relief::kHopeless;
}

void InodeTable::TouchLru(Inode* n) {
  lru_.erase({n->last_use, n->rec.ino});
  n->last_use = ++clock_;
  lru_.emplace(n->last_use, n->rec.ino);
}

void InodeTable::SetBackendPath(Inode* n, std::string path) {
  if (!n->backend_path.empty()) {
    auto it = by_backend_path_.find(n->backend_path);
    if (it != by_backend_path_.end() && it->second == n->rec.ino) by_backend_path_.erase(it);
  }
  n->backend_path = std::move(path);
  if (n->backend_path.empty()) return;
  // Another inode recorded there was replaced in the backend.
  auto [it, fresh] = by_backend_path_.try_emplace(n->backend_path, n->rec.ino);
  if (!fresh && it->second != n->rec.ino) {
    if (Inode* old = Find(it->second)) old->backend_path.clear();
    it->second = n->rec.ino;
  }
}

void InodeTable::ApplyToBackendPaths(const LogEntry& e) {
  // The inodes at `path` and below it, in the backend.
  auto subtree = [&](const std::string& path) {
    mu_.AssertHeld();  // the caller's
    std::vector<uint64_t> out;
    if (auto it = by_backend_path_.find(path); it != by_backend_path_.end()) out.push_back(it->second);
    std::string prefix = path + "/";
    for (auto it = by_backend_path_.lower_bound(prefix); it != by_backend_path_.end() && it->first.starts_with(prefix);
         ++it)
      out.push_back(it->second);
    return out;
  };
  auto move = [&](const std::vector<uint64_t>& inos, const std::string& from, const std::string& to) {
    mu_.AssertHeld();  // the caller's
    for (uint64_t ino : inos)
      if (Inode* n = Find(ino)) SetBackendPath(n, to + n->backend_path.substr(from.size()));
  };
  switch (e.op) {
    case LogOp::kRename: {
      auto src = subtree(e.path), dst = subtree(e.path2);
      if (e.flags & 1) {  // an exchange is rare: both sides fall back to waiting for the log
        for (uint64_t ino : src)
          if (Inode* n = Find(ino)) SetBackendPath(n, "");
        for (uint64_t ino : dst)
          if (Inode* n = Find(ino)) SetBackendPath(n, "");
        break;
      }
      for (uint64_t ino : dst)  // replaced in the backend
        if (Inode* n = Find(ino)) SetBackendPath(n, "");
      move(src, e.path, e.path2);
      break;
    }
    case LogOp::kUnlink:
    case LogOp::kRmdir:
      for (uint64_t ino : subtree(e.path))
        if (Inode* n = Find(ino)) SetBackendPath(n, "");
      break;
    default: break;
  }
}

std::optional<std::string> InodeTable::BackendPathFromLog(const Inode* n) {
  return oplog_.PathBeforePending(EntryPath(n->rec.parent, n->rec.name), n->rec.ino);
}

Status InodeTable::EnsureLocal(uint64_t ino, int attempt) {
  for (;;) {
    Inode* n = Find(ino);
    if (!n) return Err(ENOENT);
    if (n->rec.state != DataState::kRemote) return {};
    if (!n->fetching) break;
    fetch_cv_.Wait(&mu_);
    if (shutdown_) return Err(EIO);
  }
  if (!backend_) return Err(EIO);
  Inode* n = Find(ino);
  const bool tracked = !n->backend_path.empty();
  if (!tracked) {
    // Where the backend holds it is not tracked (after an exchange, an
    // unlink of the name it had, or a restart with renames pending). The
    // backend has applied none of the pending entries: undoing those that
    // moved the file gives where it is, and the checksum confirms the
    // bytes. Without a checksum, only a path no pending entry touches is
    // trusted: the fetch waits, at most fetch_wait_limit_, for the drain to
    // apply those that touch it. (It used to wait for the whole log, on one
    // of the 4 fetcher threads: a stuck drain blocked every such open, and
    // with the 4 taken every shared-namespace lookup.)
    std::optional<std::string> at;
    if ((n->rec.checksum_hi | n->rec.checksum_lo) != 0) at = BackendPathFromLog(n);
    if (!at) {
      const auto deadline = std::chrono::steady_clock::now() + fetch_wait_limit_;
      std::string now = EntryPath(n->rec.parent, n->rec.name);
      while (!shutdown_ && oplog_.Touches(now)) {
        // Applied seqs move only under mu_ (every completion holds it):
        // `seen` is current, and the wait below misses no entry.
        const uint64_t seen = oplog_.AppliedSeq();
        mu_.unlock();
        const bool more = oplog_.WaitAppliedBeyond(seen, deadline);
        mu_.lock();
        if (!more) break;
        n = Find(ino);
        if (!n) return Err(ENOENT);
        now = EntryPath(n->rec.parent, n->rec.name);
      }
      if (shutdown_) return Err(EIO);
      n = Find(ino);
      if (!n) return Err(ENOENT);
      if (n->rec.state != DataState::kRemote) return {};
      if (n->fetching || !n->backend_path.empty()) return EnsureLocal(ino, attempt);  // changed meanwhile
      now = EntryPath(n->rec.parent, n->rec.name);
      if (oplog_.Touches(now)) {
        LOG_ERROR("ino {} '{}': not fetched: where the backend holds it is not known until the drain applies the "
                  "pending changes to that path, and it has not in {:.1f} s",
                  ino, now, std::chrono::duration<double>(fetch_wait_limit_).count());
        return Err(EIO);
      }
      at = std::move(now);
    }
    // Followed by the drain from here on (ApplyToBackendPaths), so that a
    // rename applied during the fetch sends the retry below to the new path.
    SetBackendPath(n, *at);
  }
  n->fetching = true;
  std::string path = n->backend_path;
  const uint64_t applied_before = oplog_.AppliedSeq();
  uint64_t size = n->rec.size, hi = n->rec.checksum_hi, lo = n->rec.checksum_lo;
  mu_.unlock();  // the fetch runs without the namespace lock
  // Test knob: CKPTFS_FETCH_DELAY_MS=N makes every fetch take N ms longer
  // (a slow backend), read once.
  static const int fetch_delay_ms = [] {
    const char* v = getenv("CKPTFS_FETCH_DELAY_MS");
    return v ? atoi(v) : 0;
  }();
  if (fetch_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fetch_delay_ms));
  auto st = tier_->Fill(ino, size, [&](int fd) -> int {
    auto sum = backend_->Fetch(path, fd, size);
    if (!sum) return sum.error();
    if ((hi | lo) != 0 && (sum->first != hi || sum->second != lo)) {
      LOG_ERROR("ino {} '{}': checksum mismatch on fetch from backend ({:016x}{:016x}, expected {:016x}{:016x})", ino,
                path, sum->first, sum->second, hi, lo);
      return EIO;
    }
    return 0;
  });
  mu_.lock();
  n = Find(ino);
  if (n) {
    n->fetching = false;
    if (st) {
      Transition(n, FileEvent::kFetch);
      Batch b;
      MetaStore::PutInode(&b, n->rec);
      (void)Commit(b);
    }
  }
  fetch_cv_.NotifyAll();
  // Found from the log and not there: unknown again, found afresh next time.
  if (!st && !tracked && n && n->backend_path == path) SetBackendPath(n, "");
  // The drain moved it while it was being read (a rename applied
  // meanwhile): fetch again from where it is now.
  if (!st && (st.error() == ENOENT || st.error() == EIO) && n &&
      (n->backend_path != path || oplog_.AppliedSeq() != applied_before) && attempt < 3)
    return EnsureLocal(ino, attempt + 1);
  if (!st) {
    if (st.error() != EIO) LOG_ERROR("ino {} '{}': fetch from backend failed: {}", ino, path, strerror(st.error()));
    return Err(st.error() == ENOENT ? EIO : st.error());
  }
  return {};
}

}  // namespace ckpt::fs
