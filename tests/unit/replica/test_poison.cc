// test_poison.cc — which of a dead writer's entries a holder gives up
// after it gave an earlier one up (fs/cluster/poison.h).
#include <criterion/criterion.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fs/cluster/poison.h"

using namespace ckpt::fs::replica;
using ckpt::meta::LogEntry;
using ckpt::meta::LogOp;

namespace {

LogEntry Entry(uint64_t seq, LogOp op, std::string path, std::string path2 = "", uint64_t ino = 0) {
  LogEntry e;
  e.seq = seq;
  e.op = op;
  e.path = std::move(path);
  e.path2 = std::move(path2);
  e.ino = ino;
  return e;
}

PoisonView GaveUp(const LogEntry& e) {
  PoisonView v;
  v.Add(e.seq, PoisonOf(e));
  return v;
}

}  // namespace

Test(poison, a_rename_given_up_poisons_both_its_names_and_what_lies_above_or_below) {
  const PoisonView v = GaveUp(Entry(5, LogOp::kRename, "latest", "prev"));
  cr_expect_eq(Touches(v, Entry(6, LogOp::kRename, "latest.tmp", "latest")).value_or(0), 5u);
  cr_expect_eq(Touches(v, Entry(6, LogOp::kUnlink, "prev")).value_or(0), 5u);
  cr_expect_eq(Touches(v, Entry(6, LogOp::kPersist, "prev/f", "", 9)).value_or(0), 5u, "below a name");
  cr_expect(!Touches(v, Entry(6, LogOp::kRename, "latest.tmp", "latest2")), "a sibling that shares a prefix");
  cr_expect(!Touches(v, Entry(6, LogOp::kPersist, "step_6", "", 9)));
  const PoisonView d = GaveUp(Entry(5, LogOp::kMkdir, "a/b/c"));
  cr_expect_eq(Touches(d, Entry(6, LogOp::kRename, "a", "z")).value_or(0), 5u, "above a name");
  cr_expect(!Touches(d, Entry(6, LogOp::kMkdir, "a/x")), "another child of an ancestor");
}

Test(poison, only_entries_after_the_one_given_up) {
  const PoisonView v = GaveUp(Entry(5, LogOp::kRename, "latest", "prev"));
  cr_expect(!Touches(v, Entry(5, LogOp::kRename, "latest", "prev")), "the entry itself (another holder's)");
  cr_expect(!Touches(v, Entry(4, LogOp::kPersist, "latest", "", 3)), "an earlier entry");
}

Test(poison, a_symlinks_target_is_no_name) {
  const PoisonView v = GaveUp(Entry(5, LogOp::kSymlink, "latest", "step_5"));
  cr_expect_eq(Touches(v, Entry(6, LogOp::kRename, "latest.tmp", "latest")).value_or(0), 5u);
  cr_expect(!Touches(v, Entry(6, LogOp::kRename, "step_5", "old")), "the target's text");
  const std::vector<std::string> names = NamesOf(Entry(5, LogOp::kSymlink, "latest", "step_5"));
  cr_expect_eq(names.size(), 1u);
}

Test(poison, a_file_given_up_poisons_its_other_names_and_its_links) {
  const PoisonView v = GaveUp(Entry(5, LogOp::kPersist, "a", std::string("b\0c", 3), 7));
  cr_expect_eq(Touches(v, Entry(6, LogOp::kUnlink, "c")).value_or(0), 5u, "another name of the file");
  cr_expect_eq(Touches(v, Entry(6, LogOp::kLink, "x", "y", 7)).value_or(0), 5u, "a link of the same file");
  cr_expect_eq(Touches(v, Entry(6, LogOp::kPersist, "z", "", 7)).value_or(0), 5u, "its next version elsewhere");
  cr_expect(!Touches(v, Entry(6, LogOp::kPersist, "z", "", 8)), "another file");
  cr_expect(!Touches(v, Entry(6, LogOp::kRename, "x", "y")), "a rename of other names (no ino)");
}

Test(poison, names_unknown_poison_every_later_entry) {
  PoisonView v;
  v.Add(5, Poison::All());
  cr_expect_eq(Touches(v, Entry(9, LogOp::kMkdir, "anything")).value_or(0), 5u);
  cr_expect(!Touches(v, Entry(3, LogOp::kMkdir, "anything")));
}

// Given up, and its names joined the set: a chain of renames through a
// given-up one is poisoned link by link, an unrelated rename is not.
Test(poison, poison_spreads_through_a_chain) {
  PoisonView v = GaveUp(Entry(5, LogOp::kRename, "a", "b"));
  const LogEntry bc = Entry(6, LogOp::kRename, "b", "c");
  cr_assert(Touches(v, bc).has_value());
  v.Add(bc.seq, PoisonOf(bc));
  const LogEntry cd = Entry(7, LogOp::kRename, "c", "d");
  cr_expect_eq(Touches(v, cd).value_or(0), 6u);
  cr_expect(!Touches(v, Entry(8, LogOp::kRename, "x", "y")));
}

Test(poison, the_names_the_other_holders_read_are_the_names_given_up) {
  Poison p;
  p.names = {"a/b", std::string("odd\nname", 8), "latest"};
  p.inos = {7, UINT64_MAX};
  const Poison back = DecodePoison(EncodePoison(p));
  cr_expect(!back.all);
  cr_expect(back.names == p.names);
  cr_expect(back.inos == p.inos);
  cr_expect(DecodePoison(EncodePoison(Poison::All())).all);
  // Past the cap, or not what this version writes: every later entry.
  Poison big;
  big.names.assign(100, std::string(1000, 'x'));
  cr_expect_eq(EncodePoison(big), "*");
  cr_expect(DecodePoison("q what").all);
  cr_expect(DecodePoison(std::string("pa\0i99999999999999999999999", 26)).all, "an ino past 64 bits");
  cr_expect(DecodePoison("").all);
}

Test(poison, an_entry_another_holder_applied_poisons_nothing) {
  const GaveUps by_seq = {
      {5, {{"h", EncodePoison(PoisonOf(Entry(5, LogOp::kRename, "latest", "prev")))}, {"h2", kAppliedText}}},
      {6, {{"h", EncodePoison(PoisonOf(Entry(6, LogOp::kUnlink, "old")))}}}};
  const PoisonView v = PoisonFromHolders(by_seq);
  cr_expect(!v.by_seq.count(5));
  cr_expect(!Touches(v, Entry(7, LogOp::kRename, "latest.tmp", "latest")));
  cr_expect_eq(Touches(v, Entry(7, LogOp::kMkdir, "old")).value_or(0), 6u);
}
