// test_residency.cc — Residency on its own (fs/core/residency.h), over a real
// tier and a recording evictor: the LRU order, when a save begins, what a
// spare is sized from, and memory-pressure episodes.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "cache/tier.h"
#include "fs/core/residency.h"

using ckpt::cache::Tier;
using ckpt::fs::Residency;

namespace {

constexpr uint64_t M = 1 << 20;

// A tier in a fresh directory and the evictions asked for.
struct World {
  std::string dir;
  std::unique_ptr<Tier> tier;
  std::unique_ptr<Residency> res;
  std::vector<std::pair<uint64_t, bool>> evictions;  // (need, spare_kept)

  explicit World(uint64_t budget = 64 * M) {
    char tmpl[] = "/dev/shm/ckpt-residency-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    dir = tmpl;
    auto t = Tier::Open(dir + "/tier", budget);
    cr_assert(t.has_value(), "open tier");
    tier = std::move(*t);
    res = std::make_unique<Residency>(tier.get());
    res->set_evictor([this](uint64_t need, bool, bool spare_kept) {
      evictions.emplace_back(need, spare_kept);
      return Tier::Relief::kWait;
    });
  }
  ~World() {
    res.reset();
    tier.reset();
    std::filesystem::remove_all(dir);
  }
  // Fills ino with `bytes` of data in the tier.
  void Fill(uint64_t ino, uint64_t bytes) {
    std::string data(bytes, 'x');
    cr_assert(tier->Pin(ino, true).has_value(), "pin");
    auto st = tier->Write(ino, 0, bytes, [&](int fd) -> ssize_t {
      ssize_t n = pwrite(fd, data.data(), data.size(), 0);
      return n < 0 ? -errno : n;
    });
    tier->Unpin(ino);
    cr_assert(st.has_value(), "tier write");
  }
  // The budget near full after a save: 40 MiB of clean files the evictor
  // could drop, an O_TRUNC writer seen, a 20 MiB version sealed (a
  // `remnant` spare of that size made between the files and the save).
  void FullAfterASave(uint64_t remnant = 0) {
    res->set_prealloc(Residency::kPreallocAuto);
    Fill(7, 40 * M);
    if (remnant) cr_assert(tier->AddSpare(remnant, 0, nullptr), "a remnant spare");
    res->TruncWriterSeen();
    res->Sealed(20 * M);
  }
};

std::vector<uint64_t> Inos(const std::vector<std::pair<uint64_t, uint64_t>>& order) {
  std::vector<uint64_t> out;
  for (auto& [stamp, ino] : order) out.push_back(ino);
  return out;
}

}  // namespace

Test(residency, lru_order_follows_use) {
  World w;
  w.res->Add(1);
  w.res->Add(2);
  w.res->Add(3);
  w.res->Touch(1);
  cr_assert(Inos(w.res->Oldest()) == (std::vector<uint64_t>{2, 3, 1}));
  w.res->Touch(2);
  w.res->Remove(3);
  cr_assert(Inos(w.res->Oldest()) == (std::vector<uint64_t>{1, 2}));
  w.res->Add(2);  // already there: keeps its place
  cr_assert(Inos(w.res->Oldest()) == (std::vector<uint64_t>{1, 2}));
}

Test(residency, a_save_begins_at_the_first_writer_after_a_quiet_gap) {
  World w;
  w.res->Add(1);
  w.res->Touch(1);  // read before the save
  w.res->WriterOpened(true);
  const uint64_t begun = w.res->SaveClock();
  w.res->Add(2);
  w.res->Touch(2);  // the save's file
  auto order = w.res->Oldest();
  cr_assert_leq(order[0].first, begun, "used before the save: may make way for a spare");
  cr_assert_gt(order[1].first, begun, "the save's own file: never evicted for a spare");
  // A second writer right after is the same save.
  w.res->WriterOpened(true);
  cr_assert_eq(w.res->SaveClock(), begun);
  w.res->WriterClosed(true);
  w.res->WriterClosed(true);
}

// One checkpoint's files come with gaps between them (torch.save of the
// model, then the optimizer state split into shards: 1.2 s); the spare
// made in such a gap must not evict the first part. A writer within
// kSaveGap of the last is the same save; one after it begins the next.
Test(residency, a_file_written_a_second_after_the_last_is_the_same_save, .timeout = 30) {
  World w;
  w.res->WriterOpened(true);
  const uint64_t begun = w.res->SaveClock();
  w.res->Add(1);
  w.res->Touch(1);  // the model
  w.res->WriterClosed(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  w.res->WriterOpened(true);  // its optimizer state
  cr_assert_eq(w.res->SaveClock(), begun, "a second file 1.5 s later began a new save");
  w.res->Add(2);
  w.res->Touch(2);
  w.res->WriterClosed(true);
  auto order = w.res->Oldest();
  cr_assert_gt(order[0].first, begun, "the checkpoint's first file may make way for a spare");
  std::this_thread::sleep_for(ckpt::fs::Residency::kSaveGap + std::chrono::milliseconds(500));
  w.res->WriterOpened(true);  // the next checkpoint
  cr_assert_gt(w.res->SaveClock(), begun);
  w.res->WriterClosed(true);
}

// A writer left open (a trainer's log, a handle never closed) that writes
// nothing is not a save under way: the next checkpoint's first writer
// begins a new save, though that writer is still open. One that is
// writing, on either path, keeps the save going.
Test(residency, a_save_begins_beside_a_writer_left_open) {
  World w;
  // A gap long enough that a loaded machine's stall between the look and
  // the open (under half of it) does not make the look stale.
  const auto gap = std::chrono::milliseconds(1000), past_gap = std::chrono::milliseconds(1200);
  w.res->set_save_gap(gap);
  std::atomic<uint64_t> unseen{0};
  w.res->set_unseen_writes([&] { return unseen.load(); });
  w.res->WriterOpened(true);  // train.log, never closed
  const uint64_t begun = w.res->SaveClock();
  w.res->Add(1);
  w.res->Touch(1);
  std::this_thread::sleep_for(past_gap);
  w.res->WriterOpened(true);
  cr_assert_eq(w.res->SaveClock(), begun, "no look at the writes yet: the open writer is taken to be writing");
  std::this_thread::sleep_for(past_gap);
  w.res->RefillSpares(false);  // the spare maker looks at the writes (none)
  w.res->WriterOpened(true);   // the next checkpoint
  const uint64_t next = w.res->SaveClock();
  cr_assert_gt(next, begun, "an idle writer left open kept the next save from beginning");
  w.res->Add(2);
  w.res->Touch(2);
  std::this_thread::sleep_for(past_gap);
  unseen += 2 * M;  // a passthrough writer wrote 2 MiB meanwhile
  w.res->RefillSpares(false);
  w.res->WriterOpened(true);
  cr_assert_eq(w.res->SaveClock(), next, "a file opened while another is written began a new save");
  std::this_thread::sleep_for(past_gap);
  w.res->Wrote(2 * M);  // and on the copying path
  w.res->RefillSpares(false);
  w.res->WriterOpened(true);
  cr_assert_eq(w.res->SaveClock(), next);
  for (int i = 0; i < 5; i++) w.res->WriterClosed(true);
}

// Spares wait while a writer writes, not while one sits open idle.
Test(residency, an_idle_writer_left_open_holds_no_spare_back) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->set_save_gap(std::chrono::milliseconds(200));
  std::atomic<uint64_t> unseen{0};
  w.res->set_unseen_writes([&] { return unseen.load(); });
  w.res->TruncWriterSeen();
  w.res->Sealed(8 * M);
  w.res->WriterOpened(true);  // train.log, never closed
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  unseen += 2 * M;
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "a spare made beside a writer that is writing");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  w.res->RefillSpares(true);
  cr_assert_gt(w.tier->Spares().first, 0u, "a writer left open, idle, held the spare back");
  w.res->WriterClosed(true);
}

Test(residency, expected_size_is_the_largest_file_sealed) {
  World w;
  cr_assert_eq(w.res->ExpectedSize(), 0u, "nothing known, no spare");
  w.res->Sealed(3 * M);
  w.res->Sealed(1 * M);
  w.res->SawFile(2 * M);
  cr_assert_eq(w.res->LargestSealed(), 3 * M);
  cr_assert_eq(w.res->ExpectedSize(), 3 * M);
}

Test(residency, first_file_guess_from_prealloc_or_the_budget) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  cr_assert_eq(w.res->FirstFileGuess(), 16 * M, "a quarter of the budget");
  w.res->set_prealloc(8 * M);
  cr_assert_eq(w.res->FirstFileGuess(), 8 * M);
  w.res->set_prealloc(1000 * M);
  cr_assert_eq(w.res->FirstFileGuess(), 56 * M, "never past seven eighths of the budget");
}

Test(residency, a_fresh_mount_gets_one_spare_and_only_with_passthrough) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->RefillSpares(/*passthrough=*/false);
  cr_assert_eq(w.tier->Spares().first, 0u, "spares are for passthrough writers");
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "the first file's spare: a quarter of the budget");
  cr_assert_eq(w.res->ExpectedSize(), 16 * M, "and the first file is expected to fit it");
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "made once");
}

Test(residency, no_spare_beside_a_save) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->WriterOpened(true);
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "a writer is open");
  w.res->WriterClosed(true);
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "not in the second after a writer closed");
}

Test(residency, no_spare_beside_a_load) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->ReaderOpened();
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "a file is open for reading: a load");
  w.res->ReaderClosed();
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "not in the second after a reader closed");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "made once the load is a second past");
}

Test(residency, no_spare_beside_a_replication) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  std::atomic<bool> sending{true};
  w.res->set_busy([&] { return sending.load(); });
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "the replicator is sending a file");
  sending = false;
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "made once it is done");
  w.res->set_busy(nullptr);
}

Test(residency, a_spare_being_made_stops_when_a_replication_begins) {
  // 256 MiB budget: the fresh mount's spare is a quarter, two 32 MiB chunks
  // (Tier::AddSpare). Busy is asked once by RefillSpares' gate, then
  // between chunks: the replicator begins sending after the first chunk.
  World w(256 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  std::atomic<int> asked{0};
  w.res->set_busy([&] { return asked.fetch_add(1) >= 1; });
  w.res->RefillSpares(true);
  cr_assert_geq(asked.load(), 2, "asked again while the spare was made");
  cr_assert_eq(w.tier->Spares().first, 32 * M, "the chunk made before the replication is kept, the rest not made");
  w.res->set_busy(nullptr);
}

Test(residency, a_spare_being_made_stops_when_memory_runs_short) {
  // 512 MiB budget: the fresh mount's spare is a quarter, four 32 MiB
  // chunks. A memory-pressure episode begins (the watch's thread) after
  // the first: the rest is not made — it went on growing while the trainer
  // needed the memory, out of reach of the episode's DropSpares.
  World w(512 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  std::atomic<int> asked{0};
  w.res->set_busy([&] {
    if (asked.fetch_add(1) == 1) w.res->RelieveMemory(1 * M, 64 * M, "test");
    return false;
  });
  w.res->RefillSpares(true);
  cr_assert(w.res->MemoryPressure().active, "the episode began while the spare was made");
  cr_assert_eq(w.tier->Spares().first, 32 * M, "the chunk made before the episode is kept, the rest not made");
  w.res->set_busy(nullptr);
}

Test(residency, a_spare_refused_for_room_is_asked_for_at_the_next_call) {
  // The tier has no room for the fresh mount's spare (16 MiB beside 50 MiB
  // of files in 64 MiB): made at the first call once there is (it was
  // never asked again: the fresh mount's one spare counted as made when
  // asked; and a refusal for room costs nothing, so it sets no back-off: a
  // save's spare must not miss the trainer's removal of its old one).
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.Fill(7, 50 * M);
  for (int i = 0; i < 3; i++) w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "no room");
  w.tier->Remove(7);
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "made at the next call once there is room");
  cr_assert_eq(w.tier->SpareFailures().first, 0u, "a refusal for room is no failure");
}

Test(residency, a_spare_that_fails_is_asked_for_again_less_often) {
  // The tier cannot make it (here its directory is gone: ENOENT; /dev/shm
  // full: ENOSPC): each try warms 32 MiB first and logged a line, every
  // 50 ms. Asked again after 1, 2, 4 ... calls: tries at calls 1, 3, 6.
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  std::filesystem::remove_all(w.dir + "/tier");
  for (int i = 0; i < 8; i++) w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u);
  cr_assert_eq(w.tier->SpareFailures().first, 3u, "tried at calls 1, 3 and 6 of 8");
  cr_assert_eq(w.tier->SpareFailures().second, ENOENT);
}

Test(residency, no_spare_while_a_replica_needs_the_room) {
  // MakeRoomForReplicas dropped the spares for another member's replica:
  // none is made again before the writer's next try has taken the room.
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->HoldSpares(std::chrono::milliseconds(300));
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "held");
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 16 * M, "made once the hold is over (the fresh mount's one spare still owed)");
}

Test(residency, a_full_budget_evicts_ahead_for_the_next_saves_spare) {
  World w(64 * M);
  w.FullAfterASave();
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 1u, "room asked for before the spare is made");
  cr_assert(w.evictions[0].second, "for a spare: the last save's files stay");
  cr_assert_geq(w.evictions[0].first, 20 * M + 8 * M + 40 * M - 64 * M);
}

Test(residency, a_remnant_spare_does_not_keep_the_budget_full) {
  // A spare too small for the next save (a top-up left over when the save
  // took the spare beside it) is no reason to skip the eviction ahead.
  World w(64 * M);
  w.FullAfterASave(/*remnant=*/2 * M);
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 1u, "room asked for although a spare is there");
  cr_assert(w.evictions[0].second, "for a spare: the last save's files stay");
}

Test(residency, a_refused_eviction_ahead_is_asked_less_often) {
  // Nothing clean to evict yet (the drain still has the files): the
  // eviction ahead walks the LRU under the inode table's lock, so it is not
  // asked again at each of the spare thread's calls (50 ms apart) but
  // after 1, 2, 4 ... calls; a version sealed (a save) or persisted (the
  // drain) asks at once.
  World w(64 * M);
  w.FullAfterASave();
  std::vector<size_t> asked;
  for (int i = 0; i < 12; i++) {
    w.res->RefillSpares(true);
    asked.push_back(w.evictions.size());
  }
  cr_assert(asked == (std::vector<size_t>{1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4}), "asked after 1, 2, 4, 8 calls");
  w.res->Sealed(20 * M);
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 5u, "a save: asked at once");
  w.res->RefillSpares(true);
  w.res->Persisted();
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 6u, "a file persisted: asked at once");
  // Room made ends the back-off: asked at every call.
  w.res->set_evictor([&w](uint64_t need, bool, bool spare_kept) {
    w.evictions.emplace_back(need, spare_kept);
    return Tier::Relief::kFreed;
  });
  w.res->Sealed(20 * M);
  for (int i = 0; i < 3; i++) w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 9u, "room made: no back-off");
}

Test(residency, a_refusal_overtaken_by_a_persist_sets_no_back_off) {
  // The eviction looked at the LRU before the drain published a file; its
  // refusal is stale, so the next call asks again for the room that file
  // frees, instead of waiting out a gap.
  World w(64 * M);
  w.FullAfterASave();
  w.res->set_evictor([&w](uint64_t need, bool, bool spare_kept) {
    w.evictions.emplace_back(need, spare_kept);
    if (w.evictions.size() == 2) w.res->Persisted();  // lands while the 2nd looks
    return Tier::Relief::kWait;
  });
  w.res->RefillSpares(true);  // refused: skips the next call
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 1u, "the back-off skipped a call");
  w.res->RefillSpares(true);  // asked; a file persisted meanwhile
  cr_assert_eq(w.evictions.size(), 2u);
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 3u, "asked at once: the refusal was overtaken");
  w.res->RefillSpares(true);
  cr_assert_eq(w.evictions.size(), 3u, "a plain refusal backs off again");
}

Test(residency, memory_pressure_drops_spares_then_evicts_then_holds_writers) {
  World w(64 * M);
  w.res->set_prealloc(Residency::kPreallocAuto);
  w.res->RefillSpares(true);  // a 16 MiB spare
  cr_assert_gt(w.tier->Spares().first, 0u);
  w.res->RelieveMemory(/*available=*/2 * M, /*min_free=*/8 * M, "test");
  cr_assert_eq(w.tier->Spares().first, 0u, "spares go first");
  auto p = w.res->MemoryPressure();
  cr_assert(p.active);
  cr_assert_eq(p.episodes, 1u);
  cr_assert_eq(w.evictions.size(), 0u, "the spare covered the deficit");
  w.res->RefillSpares(true);
  cr_assert_eq(w.tier->Spares().first, 0u, "no memory claimed ahead under pressure");
  w.res->RelieveMemory(13 * M, 8 * M, "test");
  cr_assert_not(w.res->MemoryPressure().active, "above 1.5 x min_free: the episode ends");
}

Test(residency, over_budget_is_said_once_per_episode) {
  World w;
  cr_assert(w.res->OverBudgetBegins());
  cr_assert_not(w.res->OverBudgetBegins());
  w.res->WithinBudget();
  cr_assert(w.res->OverBudgetBegins());
}
