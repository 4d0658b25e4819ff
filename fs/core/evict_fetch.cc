// evict_fetch.cc — the table's side of residency (fs/core/residency.h
// decides): the evictor that drops clean files for the budget, in the LRU
// order Residency keeps, and the fetch that brings an evicted (remote) file
// back from where the backend holds it now.
//
// One of the files of InodeTable (fs/core/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include "common/io.h"
#include "fs/core/core_impl.h"

namespace ckpt::fs {

bool InodeTable::NeedsFetch(uint64_t ino, int flags) {
  MutexLock lk(&mu());
  Inode* n = core_.Find(ino);
  bool trunc = (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY;
  return n && S_ISREG(n->rec.mode) && n->rec.state == DataState::kRemote && !trunc;
}

// ---- Budget and remote files ----

Result<uint64_t> InodeTable::ReleaseTier(std::string* why) {
  MutexLock lk(&mu());
  if (const size_t pending = core_.oplog.size(); pending > 0) {
    *why = fmt::format("{} changes not yet in the backend", pending);
    return Err(EBUSY);
  }
  Batch b;
  std::vector<Inode*> resident;
  for (auto& [ino, n] : core_.ns.all()) {
    if (!S_ISREG(n->rec.mode)) continue;
    const std::string path = core_.ns.EntryPath(n->rec.parent, n->rec.name);
    if (n->opens > 0) {
      *why = fmt::format("ino {} '{}' is open", ino, path);
      return Err(EBUSY);
    }
    if (n->rec.state == DataState::kRemote) continue;
    if (n->rec.state != DataState::kPersisted) {
      *why = fmt::format("ino {} '{}' is {}", ino, path, meta::DataStateName(n->rec.state));
      return Err(EBUSY);
    }
    if (!core_.tier()->Has(ino)) continue;
    InodeRecord r = n->rec;
    r.state = DataState::kRemote;
    MetaStore::PutInode(&b, r);
    resident.push_back(n.get());
  }
  // Recorded first: a crash between the two leaves remote files whose
  // bytes are still in the tier, which the next mount removes.
  if (auto st = core_.Commit(b, /*sync=*/true); !st) {
    *why = fmt::format("cannot record the files as remote: {}", strerror(st.error()));
    return Err(st.error());
  }
  for (Inode* n : resident) n->rec.state = DataState::kRemote;
  auto freed = core_.tier()->RemoveAll();
  if (!freed) {
    *why = freed.error() == ENOTEMPTY
               ? fmt::format("{}/orphans holds files no inode owns (docs/operations.md)", core_.tier()->dir())
               : fmt::format("cannot remove it: {}", strerror(freed.error()));
    return Err(freed.error());
  }
  return *freed;
}

void InodeTable::RelieveOverBudget() {
  {
    MutexLock lk(&mu());
    for (uint64_t ino : core_.passthrough.Writers()) core_.Find(ino);  // Find takes in what they wrote
  }
  EvictIfOverBudget();
  // Nothing clean was left to evict: the kernel's writes cannot be made to
  // wait. Said once per episode, not every 50 ms.
  cache::TierStats s = core_.tier()->Stats();
  if (s.used <= s.for_files()) return core_.residency.WithinBudget();
  if (!core_.residency.OverBudgetBegins()) return;
  std::string writers;
  {
    MutexLock lk(&mu());
    for (uint64_t ino : core_.passthrough.Writers()) writers += (writers.empty() ? "ino " : ", ") + std::to_string(ino);
  }
  LOG_WARN(
      "tier: {} of {} bytes in use, over the budget: passthrough writer(s) ({}) wrote more than the largest "
      "file before them and nothing clean is left to evict",
      s.used, s.for_files(), writers.empty() ? "closed since" : writers);
}

void InodeTable::EvictIfOverBudget() {
  cache::TierStats s = core_.tier()->Stats();
  if (s.used + s.reserved <= s.for_files()) return;
  // Spares go before any file: evicting a file a reader will want back to
  // keep pages nobody asked for yet would be the wrong way round. So do
  // the replicas' spares and the copies kept only to serve loads.
  if (core_.tier()->Spares().second > 0) {
    core_.tier()->DropSpares();
    s = core_.tier()->Stats();
    if (s.used + s.reserved <= s.for_files()) return;
  }
  if (core_.tier()->RelieveOutside(s.used + s.reserved - s.for_files()) > 0) {
    s = core_.tier()->Stats();
    if (s.used + s.reserved <= s.for_files()) return;
  }
  (void)Evict(s.used + s.reserved - s.for_files());
}

cache::Tier::Relief InodeTable::Evict(uint64_t need, bool all_or_nothing, bool spare_kept) {
  MutexLock lk(&mu());
  // Least recently used first: the LRU set is in that order already. With
  // --keep-in-memory K, the files of the newest K checkpoints go last, the
  // older of those first: a budget too small for them still gets its room.
  std::vector<Inode*> clean;
  std::vector<std::pair<uint64_t, Inode*>> kept;  // (checkpoint number, file)
  const uint64_t kept_from = core_.ckpts.KeptFrom(core_.ns, core_.residency.SaveUnderWay());
  const uint64_t save_clock = core_.residency.SaveClock();
  for (auto [use, ino] : core_.residency.Oldest()) {
    Inode* n = core_.Find(ino);
    if (!n || n->rec.state != DataState::kPersisted || n->opens != 0 || n->fetching || n->rec.nlink == 0) continue;
    if (spare_kept && use > save_clock) continue;  // the last save's, or read since
    if (uint64_t ord = kept_from > 0 ? core_.ckpts.Of(core_.ns, n) : 0; ord >= kept_from && ord > 0) {
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
      if ((can += core_.tier()->AllocatedBytes(n->rec.ino)) >= need) break;
    if (can < need) return cache::Tier::Relief::kWait;
  }
  uint64_t freed = 0;
  Batch b;
  std::vector<uint64_t> evicted;
  for (Inode* n : clean) {
    if (freed >= need) break;
    uint64_t bytes = core_.tier()->AllocatedBytes(n->rec.ino);
    Transition(n, FileEvent::kEvict);
    MetaStore::PutInode(&b, n->rec);
    evicted.push_back(n->rec.ino);
    freed += bytes;
  }
  if (!evicted.empty()) {
    // Record "remote" before the bytes go: a crash in between leaves a
    // remote file whose tier copy is merely unused.
    if (auto st = core_.Commit(b); !st) {
      for (uint64_t ino : evicted) Transition(core_.Find(ino), FileEvent::kFetch);  // undone
      return cache::Tier::Relief::kWait;
    }
    FAILPOINT("evict.mid");
    for (uint64_t ino : evicted) core_.tier()->Remove(ino);
    LOG_DEBUG("evicted {} files, {} bytes", evicted.size(), freed);
    return cache::Tier::Relief::kFreed;
  }
  // Nothing clean: space comes back only if closed files can drain.
  return core_.oplog.HasPersist() ? cache::Tier::Relief::kWait : cache::Tier::Relief::kHopeless;
}

Status InodeTable::EnsureLocal(uint64_t ino, int attempt) {
  for (;;) {
    Inode* n = core_.Find(ino);
    if (!n) return Err(ENOENT);
    if (n->rec.state != DataState::kRemote) return {};
    if (!n->fetching) break;
    fetch_cv_.Wait(&mu());
    if (shutdown_) return Err(EIO);
  }
  if (!core_.backend()) return Err(EIO);
  Inode* n = core_.Find(ino);
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
    if ((n->rec.checksum_hi | n->rec.checksum_lo) != 0) at = core_.BackendPathFromLog(n);
    if (!at) {
      const auto deadline = std::chrono::steady_clock::now() + fetch_wait_limit_;
      std::string now = core_.ns.EntryPath(n->rec.parent, n->rec.name);
      while (!shutdown_ && core_.oplog.Touches(now)) {
        // Applied seqs move only under the namespace lock (every completion holds it):
        // `seen` is current, and the wait below misses no entry.
        const uint64_t seen = core_.oplog.AppliedSeq();
        mu().unlock();
        const bool more = core_.oplog.WaitAppliedBeyond(seen, deadline);
        mu().lock();
        if (!more) break;
        n = core_.Find(ino);
        if (!n) return Err(ENOENT);
        now = core_.ns.EntryPath(n->rec.parent, n->rec.name);
      }
      if (shutdown_) return Err(EIO);
      n = core_.Find(ino);
      if (!n) return Err(ENOENT);
      if (n->rec.state != DataState::kRemote) return {};
      if (n->fetching || !n->backend_path.empty()) return EnsureLocal(ino, attempt);  // changed meanwhile
      now = core_.ns.EntryPath(n->rec.parent, n->rec.name);
      if (core_.oplog.Touches(now)) {
        LOG_ERROR("ino {} '{}': not fetched: where the backend holds it is not known until the drain applies the "
                  "pending changes to that path, and it has not in {:.1f} s",
                  ino, now, std::chrono::duration<double>(fetch_wait_limit_).count());
        return Err(EIO);
      }
      at = std::move(now);
    }
    // Followed by the drain from here on (ApplyToBackendPaths), so that a
    // rename applied during the fetch sends the retry below to the new path.
    core_.SetBackendPath(n, *at);
  }
  n->fetching = true;
  std::string path = n->backend_path;
  const uint64_t applied_before = core_.oplog.AppliedSeq();
  uint64_t size = n->rec.size, hi = n->rec.checksum_hi, lo = n->rec.checksum_lo;
  mu().unlock();  // the fetch runs without the namespace lock
  // Test knob: CKPTFS_FETCH_DELAY_MS=N makes every fetch take N ms longer
  // (a slow backend), read once.
  static const int fetch_delay_ms = [] {
    const char* v = getenv("CKPTFS_FETCH_DELAY_MS");
    return v ? atoi(v) : 0;
  }();
  if (fetch_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(fetch_delay_ms));
  auto st = core_.tier()->Fill(ino, size, [&](int fd) -> int {
    if (core_.peer_fetch && (hi | lo) != 0) {
      auto peer = core_.peer_fetch(path, fd, size, hi, lo);
      if (peer) return 0;  // checked against hi/lo
      // Nothing of a failed load from a peer may stay: the backend's fetch
      // leaves its zero blocks as holes over whatever is there.
      if (int e = EmptyFile(fd, size); e != 0) return e;
    }
    auto sum = core_.backend()->Fetch(path, fd, size);
    if (!sum) return sum.error();
    if ((hi | lo) != 0 && (sum->first != hi || sum->second != lo)) {
      LOG_ERROR("ino {} '{}': checksum mismatch on fetch from backend ({:016x}{:016x}, expected {:016x}{:016x})", ino,
                path, sum->first, sum->second, hi, lo);
      return EIO;
    }
    return 0;
  });
  mu().lock();
  n = core_.Find(ino);
  if (n) {
    n->fetching = false;
    if (st) {
      Transition(n, FileEvent::kFetch);
      Batch b;
      MetaStore::PutInode(&b, n->rec);
      (void)core_.Commit(b);
    }
  }
  fetch_cv_.NotifyAll();
  // Found from the log and not there: unknown again, found afresh next time.
  if (!st && !tracked && n && n->backend_path == path) core_.SetBackendPath(n, "");
  // The drain moved it while it was being read (a rename applied
  // meanwhile): fetch again from where it is now.
  if (!st && (st.error() == ENOENT || st.error() == EIO) && n &&
      (n->backend_path != path || core_.oplog.AppliedSeq() != applied_before) && attempt < 3)
    return EnsureLocal(ino, attempt + 1);
  if (!st) {
    if (st.error() != EIO) LOG_ERROR("ino {} '{}': fetch from backend failed: {}", ino, path, strerror(st.error()));
    return Err(st.error() == ENOENT ? EIO : st.error());
  }
  return {};
}

}  // namespace ckpt::fs
