// test_kv.cc — the Kv contract (point reads, atomic ordered batches, prefix
// scans in bytewise order), run over both MemKv and RocksKv; RocksKv alone for
// what needs a disk: reopen and the single-opener lock.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/failpoint.h"
#include "fs/meta/keys.h"
#include "fs/meta/kv.h"
#include "tests/unit/meta/helpers.h"

using ckpt::meta::Batch;
using ckpt::meta::InodeKey;
using ckpt::meta::Kv;
using ckpt::meta::ReadU64BE;
using ckpt::test::KvEnv;
using ckpt::test::KvKind;
using namespace std::string_literals;

namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

Pairs ScanAll(Kv* kv, std::string_view prefix) {
  Pairs out;
  auto st = kv->Scan(prefix, [&](std::string_view key, std::string_view v) {
    out.emplace_back(std::string(key), std::string(v));
    return true;
  });
  cr_assert(st.has_value(), "scan failed: %d", st ? 0 : st.error());
  return out;
}

std::vector<std::string> Keys(const Pairs& p) {
  std::vector<std::string> out;
  for (auto& [key, v] : p) out.push_back(key);
  return out;
}

void Put(Kv* kv, std::string_view key, std::string_view v) {
  Batch b;
  b.Put(key, v);
  cr_assert(kv->Write(b).has_value());
}

void ExpectValue(Kv* kv, std::string_view key, std::string_view want) {
  auto v = kv->Get(key);
  cr_assert(v.has_value(), "get of key of %zu bytes: errno %d", key.size(), v ? 0 : v.error());
  cr_assert(*v == want, "value of %zu bytes, want %zu bytes", v->size(), want.size());
}

void ExpectAbsent(Kv* kv, std::string_view key) {
  auto v = kv->Get(key);
  cr_assert(!v.has_value(), "key of %zu bytes should be absent", key.size());
  cr_assert_eq(v.error(), ENOENT);
}

}  // namespace

KV_TEST(kv, get_missing_is_enoent) {
  KvEnv e(k);
  ExpectAbsent(e.kv.get(), "nope");
  ExpectAbsent(e.kv.get(), "");
  cr_assert(e.kv->Write(Batch{}).has_value(), "an empty batch is fine");
  cr_assert(ScanAll(e.kv.get(), "").empty());
}

KV_TEST(kv, put_get_overwrite_binary) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  Put(kv, "a", "1");
  ExpectValue(kv, "a", "1");
  Put(kv, "a", "22");
  ExpectValue(kv, "a", "22");
  // Keys and values are bytes, not C strings: NULs and 0xff survive.
  std::string key = "k\0\xff\x01z"s;
  std::string val = "\0\0v\xff\0"s;
  Put(kv, key, val);
  ExpectValue(kv, key, val);
  ExpectAbsent(kv, "k");  // a prefix of the key is another key
  ExpectAbsent(kv, "k\0\xff\x01"s);
  // An empty value is present, not ENOENT.
  Put(kv, "empty", "");
  ExpectValue(kv, "empty", "");
  // A large value round-trips.
  std::string big(1 << 20, '\0');
  std::mt19937 rng(7);
  for (auto& c : big) c = static_cast<char>(rng());
  Put(kv, "big", big);
  ExpectValue(kv, "big", big);
  // sync=true is the same write, only durable.
  Batch b;
  b.Put("s", "synced");
  cr_assert(kv->Write(b, true).has_value());
  ExpectValue(kv, "s", "synced");
}

// Sync makes the writes before it durable (what `sync` on each would have
// done): nothing a reader sees changes, and it may come at any moment,
// again and again, with nothing new to sync. (A power loss is not
// simulated here: RocksDB's WAL syncs are its own tests'.)
KV_TEST(kv, sync_changes_nothing_a_reader_sees) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  cr_assert(kv->Sync().has_value(), "a sync of an empty store is fine");
  Put(kv, "a", "1");  // no sync of its own
  cr_assert(kv->Sync().has_value());
  ExpectValue(kv, "a", "1");
  cr_assert(kv->Sync().has_value(), "and again, with nothing new");
  Put(kv, "b", "2");
  Batch d;
  d.Delete("a");
  cr_assert(kv->Write(d).has_value());
  cr_assert(kv->Sync().has_value());
  ExpectAbsent(kv, "a");
  ExpectValue(kv, "b", "2");
  e.Reopen();
  kv = e.kv.get();
  ExpectAbsent(kv, "a");
  ExpectValue(kv, "b", "2");
  Put(kv, "c", "3");  // still writable after syncs
  ExpectValue(kv, "c", "3");
}

KV_TEST(kv, batch_applies_ops_in_order) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  Put(kv, "x", "old");
  Put(kv, "y", "old");
  Batch b;
  b.Put("a", "1");
  b.Delete("a");  // put then delete: absent
  b.Delete("b");  // delete then put: present
  b.Put("b", "2");
  b.Put("c", "first");  // last put wins
  b.Put("c", "second");
  b.Delete("x");  // delete then re-put an existing key: the new value
  b.Put("x", "new");
  b.Put("y", "mid");  // put then delete an existing key: absent
  b.Delete("y");
  b.Delete("never");  // deleting a missing key is not an error
  cr_assert_eq(b.size(), 11u);
  cr_assert(kv->Write(b).has_value());
  ExpectAbsent(kv, "a");
  ExpectValue(kv, "b", "2");
  ExpectValue(kv, "c", "second");
  ExpectValue(kv, "x", "new");
  ExpectAbsent(kv, "y");
  ExpectAbsent(kv, "never");
  cr_assert(Keys(ScanAll(kv, "")) == (std::vector<std::string>{"b", "c", "x"}));
  e.Reopen();  // the same after replay from the WAL
  kv = e.kv.get();
  ExpectAbsent(kv, "a");
  ExpectValue(kv, "b", "2");
  ExpectValue(kv, "c", "second");
  ExpectValue(kv, "x", "new");
  ExpectAbsent(kv, "y");
}

// A reader never sees half a batch: a writer moves "a" and "b" together, and
// every scan (a consistent snapshot in both stores) sees them equal.
KV_TEST(kv, batch_is_atomic_to_readers) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  Put(kv, "pair/a", "0");
  Put(kv, "pair/b", "0");
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 1; i <= 3000; i++) {
      std::string v = std::to_string(i);
      Batch b;
      b.Put("pair/a", v);
      b.Put("pair/filler" + v, std::string(64, 'f'));
      b.Delete("pair/filler" + v);
      b.Put("pair/b", v);
      (void)kv->Write(b);
    }
    stop = true;
  });
  int torn = 0, scans = 0;
  while (!stop) {
    Pairs p = ScanAll(kv, "pair/");
    scans++;
    if (p.size() != 2 || p[0].second != p[1].second) torn++;
  }
  writer.join();
  cr_assert_eq(torn, 0, "%d of %d scans saw a torn batch", torn, scans);
  ExpectValue(kv, "pair/a", "3000");
  ExpectValue(kv, "pair/b", "3000");
}

KV_TEST(kv, scan_prefix_boundaries) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  std::vector<std::string> keys = {
      "a",       "aa\xff"s, "ab",          "ab\0"s, "ab\0\0"s, "ab\x01"s, "ab\x7f"s,
      "ab\x80"s, "ab\xff"s, "ab\xff\xff"s, "ac",    "b",       "\xff"s,   "\0"s,
  };
  std::vector<std::string> shuffled = keys;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  Batch b;
  for (auto& key : shuffled) b.Put(key, "v:" + key);
  cr_assert(kv->Write(b).has_value());

  // Bytewise unsigned order: 0x80 and 0xff sort after 0x7f.
  std::vector<std::string> want_ab = {"ab",      "ab\0"s,   "ab\0\0"s, "ab\x01"s,
                                      "ab\x7f"s, "ab\x80"s, "ab\xff"s, "ab\xff\xff"s};
  Pairs ab = ScanAll(kv, "ab");
  cr_assert(Keys(ab) == want_ab, "scan 'ab' returned %zu keys", ab.size());
  for (auto& [key, v] : ab) cr_assert(v == "v:" + key, "value belongs to its key");

  cr_assert(Keys(ScanAll(kv, "ab\xff"s)) == (std::vector<std::string>{"ab\xff"s, "ab\xff\xff"s}));
  cr_assert(Keys(ScanAll(kv, "ab\0"s)) == (std::vector<std::string>{"ab\0"s, "ab\0\0"s}));
  cr_assert(Keys(ScanAll(kv, "ac")) == (std::vector<std::string>{"ac"}));
  cr_assert(ScanAll(kv, "ad").empty());
  cr_assert(ScanAll(kv, "abc").empty());
  cr_assert(ScanAll(kv, "zz").empty());
  cr_assert(Keys(ScanAll(kv, "\xff"s)) == (std::vector<std::string>{"\xff"s}));

  std::vector<std::string> want_a = {"a", "aa\xff"s};
  want_a.insert(want_a.end(), want_ab.begin(), want_ab.end());
  want_a.push_back("ac");
  cr_assert(Keys(ScanAll(kv, "a")) == want_a);

  std::vector<std::string> all = keys;
  std::sort(all.begin(), all.end());  // std::string orders bytes as unsigned char
  cr_assert(Keys(ScanAll(kv, "")) == all);
}

KV_TEST(kv, scan_stops_when_fn_returns_false) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  Batch b;
  for (char c = 'a'; c <= 'j'; c++) b.Put("p"s + c, "v");
  cr_assert(kv->Write(b).has_value());
  std::vector<std::string> seen;
  auto st = kv->Scan("p", [&](std::string_view key, std::string_view) {
    seen.emplace_back(key);
    return seen.size() < 3;
  });
  cr_assert(st.has_value());
  cr_assert(seen == (std::vector<std::string>{"pa", "pb", "pc"}));
}

// Big-endian inode numbers make a prefix scan return inodes in numeric order,
// including bytes >= 0x80 (which a signed-char comparison would put first).
KV_TEST(kv, inode_keys_scan_in_numeric_order) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  std::vector<uint64_t> inos = {
      1, 2, 127, 128, 255, 256, 257, 65535, 65536, 1ull << 32, 1ull << 40, (1ull << 40) + 1, 1ull << 63, ~0ull};
  std::vector<uint64_t> shuffled = inos;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(2));
  Batch b;
  for (uint64_t ino : shuffled) b.Put(InodeKey(ino), std::to_string(ino));
  b.Put("H", "before");  // neighbours of the 'I' prefix stay out of the scan
  b.Put("J", "after");
  cr_assert(kv->Write(b).has_value());
  std::vector<uint64_t> got;
  for (auto& [key, v] : ScanAll(kv, std::string(1, ckpt::meta::kInodePrefix))) {
    cr_assert_eq(key.size(), 9u);
    uint64_t ino = ReadU64BE(key, 1);
    cr_assert(v == std::to_string(ino));
    got.push_back(ino);
  }
  cr_assert(got == inos, "scan returned %zu inodes, not in numeric order", got.size());
}

KV_TEST(kv, concurrent_writers) {
  KvEnv e(k);
  Kv* kv = e.kv.get();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; t++) {
    ts.emplace_back([kv, t] {
      for (int i = 0; i < 250; i++) {
        Batch b;
        b.Put("t" + std::to_string(t) + "/" + std::to_string(1000 + i), std::to_string(i));
        (void)kv->Write(b);
      }
    });
  }
  for (auto& t : ts) t.join();
  cr_assert_eq(ScanAll(kv, "t").size(), 1000u);
  for (int t = 0; t < 4; t++) cr_assert_eq(ScanAll(kv, "t" + std::to_string(t) + "/").size(), 250u);
  ExpectValue(kv, "t3/1249", "249");
}

ROCKS_TEST(rocks_kv, reopen_keeps_data) {
  std::string dir = ckpt::test::g_dir + "/db";
  {
    auto kv = ckpt::meta::OpenRocksKv(dir);
    cr_assert(kv.has_value());
    Batch b;
    b.Put("keep", "1");
    b.Put("gone", "x");
    b.Put("bin\0\xff"s, "\0v"s);
    cr_assert((*kv)->Write(b, false).has_value());  // WAL, no fsync: survives a clean close
    Batch d;
    d.Delete("gone");
    d.Put("keep", "2");
    cr_assert((*kv)->Write(d, true).has_value());
    for (uint64_t ino : {1ull << 40, 256ull, 1ull, 65536ull, 255ull}) {
      Batch i;
      i.Put(InodeKey(ino), "i");
      cr_assert((*kv)->Write(i).has_value());
    }
  }  // the unique_ptr closes the DB
  auto kv = ckpt::meta::OpenRocksKv(dir);
  cr_assert(kv.has_value(), "reopen: errno %d", kv ? 0 : kv.error());
  ExpectValue(kv->get(), "keep", "2");
  ExpectAbsent(kv->get(), "gone");
  ExpectValue(kv->get(), "bin\0\xff"s, "\0v"s);
  std::vector<uint64_t> inos;
  for (auto& key : Keys(ScanAll(kv->get(), "I"))) inos.push_back(ReadU64BE(key, 1));
  cr_assert(inos == (std::vector<uint64_t>{1, 255, 256, 65536, 1ull << 40}));
  // And it is still writable after the reopen.
  Put(kv->get(), "after", "reopen");
  ExpectValue(kv->get(), "after", "reopen");
}

ROCKS_TEST(rocks_kv, second_open_of_locked_dir_fails) {
  std::string dir = ckpt::test::g_dir + "/db";
  auto first = ckpt::meta::OpenRocksKv(dir);
  cr_assert(first.has_value());
  Put(first->get(), "k", "v");
  auto second = ckpt::meta::OpenRocksKv(dir);
  cr_assert(!second.has_value(), "a second open of a locked store must fail");
  cr_assert_eq(second.error(), EBUSY, "kv.h promises EBUSY for a locked store, got %d", second.error());
  // The first handle is untouched.
  ExpectValue(first->get(), "k", "v");
  first->reset();
  auto third = ckpt::meta::OpenRocksKv(dir);
  cr_assert(third.has_value(), "open after the first closed: errno %d", third ? 0 : third.error());
  ExpectValue(third->get(), "k", "v");
}

ROCKS_TEST(rocks_kv, open_of_a_regular_file_fails) {
  std::string path = ckpt::test::g_dir + "/file";
  int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  cr_assert_geq(fd, 0);
  close(fd);
  auto kv = ckpt::meta::OpenRocksKv(path);
  cr_assert(!kv.has_value());
  cr_assert_neq(kv.error(), 0);
  auto under = ckpt::meta::OpenRocksKv(path + "/db");
  cr_assert(!under.has_value());
  cr_assert_neq(under.error(), 0);
}

namespace {
// Writes `n` small batches (one WAL record each) and closes the store
// without a flush, so everything is in the WAL only.
std::string WriteWalOnly(const std::string& dir, int n) {
  {
    auto kv = ckpt::meta::OpenRocksKv(dir);
    cr_assert(kv.has_value());
    for (int i = 0; i < n; i++) {
      Batch b;
      b.Put("k" + std::to_string(1000 + i), std::string(100, 'a' + i % 26));
      cr_assert((*kv)->Write(b, true).has_value());
    }
  }
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".log" && std::filesystem::file_size(e.path()) > 0) return e.path().string();
  cr_assert_fail("no WAL file in %s", dir.c_str());
  return {};
}
}  // namespace

// Four bytes overwritten in the middle of the WAL: the open fails (EUCLEAN)
// instead of opening what came before the damage and dropping the rest.
ROCKS_TEST(rocks_kv, mid_log_corruption_is_refused) {
  std::string dir = ckpt::test::g_dir + "/db";
  std::string log = WriteWalOnly(dir, 60);
  auto size = std::filesystem::file_size(log);
  int fd = open(log.c_str(), O_WRONLY);
  cr_assert_geq(fd, 0);
  cr_assert_eq(pwrite(fd, "XXXX", 4, static_cast<off_t>(size / 2)), 4);
  close(fd);
  auto kv = ckpt::meta::OpenRocksKv(dir);
  cr_assert(!kv.has_value(), "a WAL damaged in the middle must not open");
  cr_assert_eq(kv.error(), EUCLEAN, "want EUCLEAN, got %d", kv.error());
}

// A torn last record (a power loss during the append) is what may be
// tolerated: the store opens with every record before it.
ROCKS_TEST(rocks_kv, torn_wal_tail_is_tolerated) {
  std::string dir = ckpt::test::g_dir + "/db";
  std::string log = WriteWalOnly(dir, 60);
  auto size = std::filesystem::file_size(log);
  cr_assert_eq(truncate(log.c_str(), static_cast<off_t>(size - 50)), 0);
  auto kv = ckpt::meta::OpenRocksKv(dir);
  cr_assert(kv.has_value(), "torn tail: errno %d", kv ? 0 : kv.error());
  ExpectValue(kv->get(), "k1000", std::string(100, 'a'));
  ExpectValue(kv->get(), "k1058", std::string(100, 'a' + 58 % 26));
}

// A sync that fails is an errno (the disk of the state dir failing: the
// fault meta.write), and the store syncs again once the disk is back.
ROCKS_TEST(rocks_kv, a_failed_sync_is_eio) {
  const std::string flag = ckpt::test::g_dir + "/fault";
  setenv("CKPTFS_FAULT", ("meta.write:" + flag).c_str(), 1);
  ckpt::InitFailpoints();
  auto kv = ckpt::meta::OpenRocksKv(ckpt::test::g_dir + "/db");
  cr_assert(kv.has_value());
  Put(kv->get(), "k", "v");
  int fd = open(flag.c_str(), O_CREAT | O_WRONLY, 0600);
  cr_assert_geq(fd, 0);
  close(fd);
  auto st = (*kv)->Sync();
  cr_assert(!st.has_value(), "a sync on a failing disk succeeded");
  cr_expect_eq(st.error(), EIO);
  cr_assert_eq(unlink(flag.c_str()), 0);
  cr_expect((*kv)->Sync().has_value());
  ExpectValue(kv->get(), "k", "v");
}

// `ckptfs gc` opens the store read-only: a sync there has nothing to do
// (RocksDB's read-only handle cannot sync) and succeeds.
ROCKS_TEST(rocks_kv, sync_of_a_read_only_store_succeeds) {
  const std::string dir = ckpt::test::g_dir + "/db";
  {
    auto kv = ckpt::meta::OpenRocksKv(dir);
    cr_assert(kv.has_value());
    Put(kv->get(), "k", "v");
  }
  auto ro = ckpt::meta::OpenRocksKv(dir, nullptr, /*read_only=*/true);
  cr_assert(ro.has_value(), "read-only open: errno %d", ro ? 0 : ro.error());
  cr_expect((*ro)->Sync().has_value());
  ExpectValue(ro->get(), "k", "v");
}
