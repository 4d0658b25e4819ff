// poison.h — which of a dead writer's entries a holder must not apply once
// an earlier one of them was given up (issue #30, "still open (1)";
// docs/design-holder-give-up.md).
//
// A holder gives an entry of a dead writer up when the backend refuses it
// for good or its replica is unreadable, and goes on with the later ones.
// A later entry on the same names then acts on other objects than it did
// on the writer: `mv latest prev` given up, `mv latest.tmp latest` applied,
// and the step that was `latest` is nowhere. So every later entry of that
// writer's run whose names lie at, above or below a given-up entry's names
// (or that persists or links the same file) is given up too, and its names
// join the set. The holders then apply only entries on name trees disjoint
// from everything given up; disjoint trees commute, so "the holders' done
// entries, then the writer's given-up ones in log order" (its run back)
// is log order for every name.
//
// Thread-safety: reentrant; a PoisonView is its owner's to guard.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fs/meta/meta_store.h"

namespace ckpt::fs::replica {

// What one given-up entry makes untouchable.
struct Poison {
  bool all = false;                // its names are unknown: every later entry
  std::vector<std::string> names;  // backend paths
  std::set<uint64_t> inos;         // files: a later persist or link of one
  static Poison All() {
    Poison p;
    p.all = true;
    return p;
  }
};

// One writer run's given-up entries, by seq.
struct PoisonView {
  std::map<uint64_t, Poison> by_seq;
  void Add(uint64_t seq, Poison p);
};

// The names an entry acts on: a persist's path and its other names, both
// names of a rename (an exchange too) and a link, the path of the others.
// A symlink's path2 is its target's text, not a name.
std::vector<std::string> NamesOf(const meta::LogEntry& e);
// What giving `e` up poisons: its names, and its file for a persist or link.
Poison PoisonOf(const meta::LogEntry& e);
// A give-up as the other holders read it (etcd, gaveup/WRITER/RUN/SEQ/
// HOLDER): "*" (names unknown), or NUL-separated items, p<path> and
// i<ino>; "*" as well past kMaxPoisonText. "+" is not a poison: another
// holder applied that entry (done wins, PoisonFromHolders).
inline constexpr size_t kMaxPoisonText = 16 << 10;
inline constexpr char kAppliedText[] = "+";
std::string EncodePoison(const Poison& p);
// What EncodePoison wrote; anything else (a value this version does not
// read) poisons every later entry.
Poison DecodePoison(std::string_view text);
// The holders' values of one writer run, seq -> holder -> value.
using GaveUps = std::map<uint64_t, std::map<std::string, std::string>>;
// A seq poisons unless some holder applied it.
PoisonView PoisonFromHolders(const GaveUps& by_seq);

// The earliest given-up entry before `e` (seq < e.seq) that `e` touches:
// one whose names are unknown, one whose file `e` persists or links, or one
// with a name at, above or below one of `e`'s. nullopt: `e` may be applied.
std::optional<uint64_t> Touches(const PoisonView& v, const meta::LogEntry& e);

}  // namespace ckpt::fs::replica
