// test_sent_sums.cc — the checksums a writer keeps of its replicas
// (fs/cluster/sent_sums.h): one per version, forgotten exactly, swept by
// what a start still needs, and a foreign value is no checksum.
#include <criterion/criterion.h>

#include <set>
#include <utility>

#include "fs/cluster/sent_sums.h"
#include "fs/meta/keys.h"

using namespace ckpt::fs::replica;
using Sum = std::pair<uint64_t, uint64_t>;

// Whether a checksum is kept for ino@version (a read error fails the test).
static bool Kept(ckpt::meta::Kv* kv, uint64_t ino, uint64_t version) {
  auto s = SentSum(kv, ino, version);
  cr_assert(s.has_value());
  return s->has_value();
}

Test(sent_sums, one_per_version_forgotten_exactly_and_swept_by_need) {
  auto kv = ckpt::meta::NewMemKv();
  cr_assert(RememberSentSum(kv.get(), 7, 1, 0x1111, 0x2222).has_value());
  cr_assert(RememberSentSum(kv.get(), 7, 2, 0x3333, 0x4444).has_value());
  cr_assert(RememberSentSum(kv.get(), 9, 1, ~0ull, 1).has_value());
  auto ra = SentSum(kv.get(), 7, 1), rb = SentSum(kv.get(), 7, 2), rc = SentSum(kv.get(), 9, 1);
  cr_assert(ra && rb && rc);
  auto a = *ra, b = *rb, c = *rc;
  cr_assert(a && b && c);
  cr_expect((*a == Sum(0x1111, 0x2222)));
  cr_expect((*b == Sum(0x3333, 0x4444)), "each version its own");
  cr_expect((*c == Sum(~0ull, 1)));
  cr_expect(!Kept(kv.get(), 8, 1), "none kept: none");
  cr_assert(ForgetSentSum(kv.get(), 7, 1).has_value());
  cr_expect(!Kept(kv.get(), 7, 1));
  cr_expect(Kept(kv.get(), 7, 2), "the other version stays");
  cr_expect(ForgetSentSum(kv.get(), 7, 1).has_value(), "forgetting twice is nothing");

  // A value that is not 16 bytes (a foreign or torn one) is no checksum,
  // and a key of another length is swept whatever is needed.
  ckpt::meta::Batch bad;
  bad.Put(ckpt::meta::SentSumKey(5, 1), "short");
  bad.Put(ckpt::meta::SentSumKey(5, 2) + "x", std::string(16, 'a'));
  cr_assert(kv->Write(bad).has_value());
  cr_expect(!Kept(kv.get(), 5, 1), "a short value is not believed");

  std::set<Sum> asked;  // (ino, version)
  auto swept = SweepSentSums(kv.get(), [&](uint64_t ino, uint64_t version) {
    // Asked after the scan: the caller's own locks and this Kv may be used
    // (inside MemKv's Scan this read would deadlock: the binary's timeout).
    (void)kv->Get(ckpt::meta::InodeKey(ino));
    asked.insert({ino, version});
    return ino == 9;  // only 9@1 is still pending
  });
  cr_assert(swept.has_value());
  cr_expect_eq(*swept, 3u, "7@2, 5@1 and the odd key went");
  cr_expect((asked.count(Sum(7, 2)) && asked.count(Sum(9, 1)) && asked.count(Sum(5, 1))));
  cr_expect(!Kept(kv.get(), 7, 2));
  cr_expect(Kept(kv.get(), 9, 1), "what is needed stays");
  auto again = SweepSentSums(kv.get(), [](uint64_t, uint64_t) { return true; });
  cr_expect(again && *again == 0, "nothing more to sweep");
  // Other prefixes are never touched.
  ckpt::meta::Batch other;
  other.Put(ckpt::meta::InodeKey(7), "inode");
  cr_assert(kv->Write(other).has_value());
  cr_expect(SweepSentSums(kv.get(), [](uint64_t, uint64_t) { return false; }).has_value());
  cr_expect(kv->Get(ckpt::meta::InodeKey(7)).has_value(), "an inode's key is not a checksum");
}
