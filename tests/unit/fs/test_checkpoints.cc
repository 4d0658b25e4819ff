// test_checkpoints.cc — CheckpointCatalog over a bare Namespace
// (fs/core/checkpoints.h): which new entry starts a checkpoint, numbering,
// memory-only choices of --persist-every and --persist-interval, what
// --keep-in-memory keeps, and what a listing adds up.
#include <criterion/criterion.h>
#include <sys/stat.h>

#include <regex>
#include <string>

#include "common/mutex.h"
#include "fs/core/checkpoints.h"
#include "tree.h"

using ckpt::MutexLock;
using ckpt::fs::CheckpointCatalog;
using ckpt::fs::CheckpointInfo;
using ckpt::fs::CheckpointPolicy;
using ckpt::meta::DataState;
using ckpt::meta::kRootIno;
using ckpt::test::Tree;

namespace {

CheckpointPolicy Pattern(uint64_t every = 0, uint64_t keep = 0) {
  CheckpointPolicy p;
  p.pattern = std::regex(R"(step_\d+)");
  p.persist_every = every;
  p.keep_in_memory = keep;
  return p;
}

uint64_t NoneLost(const std::string&) { return 0; }

}  // namespace

Test(checkpoints, only_the_outermost_match_within_eight_levels_starts_one) {
  Tree t;
  CheckpointCatalog c;
  c.set_policy(Pattern());
  uint64_t runs = t.Add(kRootIno, "runs", S_IFDIR | 0755);
  uint64_t step = t.Add(runs, "step_1", S_IFDIR | 0755);
  uint64_t deep = kRootIno, eight = 0;
  for (int i = 0; i < 9; i++) {
    deep = t.Add(deep, "d" + std::to_string(i), S_IFDIR | 0755);
    if (i == 7) eight = deep;
  }
  MutexLock lk(&t.ns.mu());
  cr_assert(c.Starts(t.ns, runs, "step_2"));
  cr_assert_not(c.Starts(t.ns, runs, "notes"), "a name that does not match");
  t.ns.Find(step)->rec.ckpt_ord = 1;
  cr_assert_not(c.Starts(t.ns, step, "step_3"), "inside a checkpoint: not a checkpoint of its own");
  cr_assert(c.Starts(t.ns, eight, "step_4"), "under 8 directories: found by a listing");
  cr_assert_not(c.Starts(t.ns, deep, "step_4"), "under 9: deeper than a listing searches");
  CheckpointCatalog none;  // no pattern: nothing is a checkpoint
  cr_assert_not(none.Starts(t.ns, runs, "step_2"));
}

Test(checkpoints, numbers_only_grow) {
  CheckpointCatalog c;
  cr_assert_eq(c.next(), 1u);
  c.ReserveUpTo(5);
  cr_assert_eq(c.next(), 5u);
  c.ReserveUpTo(3);  // an older number found at recovery
  cr_assert_eq(c.next(), 5u);
}

Test(checkpoints, persist_every_n_keeps_the_others_in_memory) {
  CheckpointCatalog c;
  c.set_policy(Pattern(3));
  cr_assert(c.ChooseMemoryOnly(1));
  cr_assert(c.ChooseMemoryOnly(2));
  cr_assert_not(c.ChooseMemoryOnly(3));
  cr_assert(c.ChooseMemoryOnly(4));
  cr_assert_not(c.ChooseMemoryOnly(6));
  CheckpointCatalog all;
  all.set_policy(Pattern());
  cr_assert_not(all.ChooseMemoryOnly(1), "no selective policy: every checkpoint drains");
}

Test(checkpoints, persist_interval_drains_the_first_then_waits) {
  CheckpointCatalog c;
  CheckpointPolicy p = Pattern();
  p.persist_interval_s = 3600;
  c.set_policy(p);
  cr_assert_not(c.ChooseMemoryOnly(1), "the first one drains");
  cr_assert(c.ChooseMemoryOnly(2), "the next within the interval stays in memory");
}

Test(checkpoints, memory_only_and_the_checkpoint_holding_an_entry) {
  Tree t;
  CheckpointCatalog c;
  uint64_t s = t.Add(kRootIno, "step_7", S_IFDIR | 0755);
  uint64_t r = t.Add(s, "rank0", S_IFDIR | 0755);
  uint64_t f = t.Add(r, "model.pt", S_IFREG | 0644);
  uint64_t other = t.Add(kRootIno, "other", S_IFREG | 0644);
  MutexLock lk(&t.ns.mu());
  t.ns.Find(s)->rec.ckpt_ord = 7;
  cr_assert_eq(c.Of(t.ns, t.ns.Find(f)), 7u);
  cr_assert_eq(c.Of(t.ns, t.ns.Find(other)), 0u);
  cr_assert_not(c.UnderMemoryOnly(t.ns, r));
  t.ns.Find(s)->rec.memory_only = true;
  cr_assert(c.UnderMemoryOnly(t.ns, r));
  cr_assert(c.MemoryOnlyAt(t.ns, t.ns.Find(f), r));
  cr_assert_not(c.MemoryOnlyAt(t.ns, t.ns.Find(other), kRootIno));
}

Test(checkpoints, keep_in_memory_counts_the_newest_live_ones) {
  Tree t;
  CheckpointCatalog c;
  c.set_policy(Pattern(0, 2));
  uint64_t ords[] = {3, 9, 5, 7, 11};
  uint64_t inos[5], files[5];
  for (int i = 0; i < 5; i++) {
    inos[i] = t.Add(kRootIno, "step_" + std::to_string(ords[i]), S_IFDIR | 0755);
    files[i] = t.Add(inos[i], "model.pt", S_IFREG | 0644, 10);
  }
  t.Add(t.Add(kRootIno, "step_12", S_IFDIR | 0755), "empty", S_IFDIR | 0755);
  MutexLock lk(&t.ns.mu());
  for (int i = 0; i < 5; i++) t.ns.Find(inos[i])->rec.ckpt_ord = ords[i];
  t.ns.Find(t.ns.Find(kRootIno)->children.at("step_12"))->rec.ckpt_ord = 12;
  t.ns.Find(files[4])->writers = 1;  // step_11 is being saved
  cr_assert_eq(c.KeptFrom(t.ns), 7u, "the newest two complete are 9 and 7 (11 is being saved, 12 has no file)");
  t.ns.Find(files[4])->writers = 0;
  t.ns.Find(files[4])->data_gen = 1;  // closed, not sealed yet: still being written
  cr_assert_eq(c.KeptFrom(t.ns), 7u);
  t.ns.Find(files[4])->sealed_gen = 1;
  cr_assert_eq(c.KeptFrom(t.ns), 9u, "step_11 complete");
  cr_assert_eq(c.KeptFrom(t.ns, /*saving=*/true), 7u, "a save under way: its next file may still come");
  {
    Tree one;  // the first save, or the one right after the last complete one was removed
    uint64_t s1 = one.Add(kRootIno, "step_1", S_IFDIR | 0755);
    one.Add(s1, "model.pt", S_IFREG | 0644, 10);
    MutexLock l1(&one.ns.mu());
    one.ns.Find(s1)->rec.ckpt_ord = 1;
    cr_assert_eq(c.KeptFrom(one.ns, /*saving=*/true), 1u, "none complete: every checkpoint goes last");
  }
  t.ns.Find(files[4])->rec.nlink = 0;  // step_11's file removed
  t.ns.Find(files[1])->rec.nlink = 0;  // step_9 removed, its file first
  t.ns.Find(inos[1])->rec.nlink = 0;
  cr_assert_eq(c.KeptFrom(t.ns), 5u);
  CheckpointCatalog keep_none;
  cr_assert_eq(keep_none.KeptFrom(t.ns), 0u);
}

Test(checkpoints, a_listing_adds_up_each_checkpoint) {
  Tree t;
  CheckpointCatalog c;
  uint64_t s1 = t.Add(kRootIno, "step_1", S_IFDIR | 0755);
  uint64_t a = t.Add(s1, "a.pt", S_IFREG | 0644, 100);
  uint64_t b = t.Add(s1, "b.pt", S_IFREG | 0644, 20);
  uint64_t s2 = t.Add(kRootIno, "step_2", S_IFDIR | 0755);
  uint64_t x = t.Add(s2, "x.pt", S_IFREG | 0644, 5);
  t.Add(kRootIno, "latest", S_IFREG | 0644, 6);
  MutexLock lk(&t.ns.mu());
  auto at = [&](uint64_t ino, DataState st, int64_t mtime_s) {
    auto* n = t.ns.Find(ino);
    n->rec.state = st;
    n->rec.mtime = {mtime_s, 0};
  };
  at(a, DataState::kPersisted, 10);
  at(b, DataState::kDirty, 11);
  at(x, DataState::kPersisted, 5);  // step_2's files are older: it lists first
  t.ns.Find(b)->writers = 1;
  auto list = c.List(t.ns, std::regex(R"(step_\d+)"), [](const std::string& p) { return p == "step_2" ? 1u : 0u; });
  cr_assert_eq(list.size(), 2u);
  const CheckpointInfo& first = list[0];
  const CheckpointInfo& second = list[1];
  cr_assert_eq(first.path, "step_2");
  cr_assert_eq(first.lost, 1u);
  cr_assert_not(first.Complete(), "a lost file: not complete");
  cr_assert_eq(second.path, "step_1");
  cr_assert(second.dir);
  cr_assert_eq(second.files, 2u);
  cr_assert_eq(second.bytes, 120u);
  cr_assert_eq(second.Files(DataState::kPersisted), 1u);
  cr_assert_eq(second.open, 1u);
  cr_assert_not(second.Persisted());
  t.ns.Find(b)->writers = 0;
  at(b, DataState::kPersisted, 11);
  auto again = c.List(t.ns, std::regex(R"(step_\d+)"), NoneLost);
  cr_assert(again[1].Persisted());
  cr_assert(again[0].Persisted());
}

// `ckptfs latest --safe` (--replicas): complete, and every file persisted or
// held by the peers; a file being written, failed or memory-only is not.
Test(checkpoints, safe_means_every_file_persisted_or_replicated) {
  using ckpt::meta::DataState;
  CheckpointInfo c;
  c.files = 3;
  c.state_files[static_cast<size_t>(DataState::kPersisted)] = 1;
  c.state_files[static_cast<size_t>(DataState::kDirty)] = 1;
  c.state_files[static_cast<size_t>(DataState::kDraining)] = 1;
  cr_expect(c.Complete() && !c.Persisted() && !c.Safe(), "two files in this node's RAM only");
  c.replicated = 1;
  cr_expect(!c.Safe(), "one of them in this node's RAM only");
  c.replicated = 2;
  cr_expect(c.Safe());
  c.open = 1;
  cr_expect(!c.Safe(), "a file still being written");
  c.open = 0;
  c.memory_only = true;
  cr_expect(!c.Safe(), "a memory-only checkpoint never drains");
}
