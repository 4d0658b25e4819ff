// test_meta_store.cc — the metadata schema over a Kv: record encodings (round
// trip, and EIO rather than a crash for torn or foreign bytes), the batch
// builders, the mount-time loaders and the format record. Every test runs
// over both MemKv and RocksKv.
#include <criterion/criterion.h>
#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fs/meta/keys.h"
#include "fs/meta/meta_store.h"
#include "tests/unit/meta/helpers.h"

using ckpt::meta::Batch;
using ckpt::meta::DataState;
using ckpt::meta::DecodeInode;
using ckpt::meta::DecodeLogEntry;
using ckpt::meta::DentryValue;
using ckpt::meta::EncodeInode;
using ckpt::meta::EncodeLogEntry;
using ckpt::meta::InodeRecord;
using ckpt::meta::LogEntry;
using ckpt::meta::LogOp;
using ckpt::meta::MetaStore;
using ckpt::test::KvEnv;
using ckpt::test::KvKind;
using namespace std::string_literals;

namespace {

// A store over a KvEnv's Kv; Reopen() closes both and opens them again.
struct StoreEnv {
  KvEnv kv_env;
  std::unique_ptr<MetaStore> store;

  explicit StoreEnv(KvKind k) : kv_env(k) { store = std::make_unique<MetaStore>(std::move(kv_env.kv)); }
  MetaStore* operator->() { return store.get(); }
  void Reopen() {
    if (kv_env.kind == KvKind::kMem) return;  // nothing to reopen from
    store.reset();
    kv_env.Open();
    store = std::make_unique<MetaStore>(std::move(kv_env.kv));
  }
  void Commit(const Batch& b) {
    auto st = store->Commit(b);
    cr_assert(st.has_value(), "commit: errno %d", st ? 0 : st.error());
  }
  void RawPut(std::string_view key, std::string_view v) {
    Batch b;
    b.Put(key, v);
    Commit(b);
  }
};

// Every field set to something distinctive, strings with NULs and 0xff.
InodeRecord FullRecord() {
  InodeRecord r;
  r.ino = 0x0102030405060708ull;
  r.parent = ~0ull;
  r.mode = 0100644;
  r.uid = 1000;
  r.gid = 0xfffffffeu;
  r.nlink = 3;
  r.size = (1ull << 40) + 7;
  r.rdev = 0x1234;
  r.atime = {-1, 999999999};
  r.mtime = {1700000000, 1};
  r.ctime = {INT64_MAX, 500};
  r.version = 42;
  r.state = DataState::kDraining;
  r.checksum_hi = 0xdeadbeefcafebabeull;
  r.checksum_lo = 0x0123456789abcdefull;
  r.sealed_size = 0x1122334455ull;
  r.name = "ck\0pt\xff.bin"s;
  r.target = "../\0target\0"s + std::string(4096, 'x');
  r.ckpt_ord = 0x0a0b0c0d0e0f1011ull;
  r.memory_only = true;
  return r;
}

void ExpectSameRecord(const InodeRecord& a, const InodeRecord& b) {
  cr_assert_eq(a.ino, b.ino);
  cr_assert_eq(a.parent, b.parent);
  cr_assert_eq(a.mode, b.mode);
  cr_assert_eq(a.uid, b.uid);
  cr_assert_eq(a.gid, b.gid);
  cr_assert_eq(a.nlink, b.nlink);
  cr_assert_eq(a.size, b.size);
  cr_assert_eq(a.rdev, b.rdev);
  cr_assert_eq(a.atime.sec, b.atime.sec);
  cr_assert_eq(a.atime.nsec, b.atime.nsec);
  cr_assert_eq(a.mtime.sec, b.mtime.sec);
  cr_assert_eq(a.mtime.nsec, b.mtime.nsec);
  cr_assert_eq(a.ctime.sec, b.ctime.sec);
  cr_assert_eq(a.ctime.nsec, b.ctime.nsec);
  cr_assert_eq(a.version, b.version);
  cr_assert_eq(static_cast<int>(a.state), static_cast<int>(b.state));
  cr_assert_eq(a.checksum_hi, b.checksum_hi);
  cr_assert_eq(a.checksum_lo, b.checksum_lo);
  cr_assert_eq(a.sealed_size, b.sealed_size);
  cr_assert(a.name == b.name, "name: %zu vs %zu bytes", a.name.size(), b.name.size());
  cr_assert(a.target == b.target, "target: %zu vs %zu bytes", a.target.size(), b.target.size());
  cr_assert_eq(a.ckpt_ord, b.ckpt_ord);
  cr_assert_eq(a.memory_only, b.memory_only);
}

InodeRecord SmallRecord(uint64_t ino, std::string name) {
  InodeRecord r;
  r.ino = ino;
  r.parent = 1;
  r.mode = 0100600;
  r.nlink = 1;
  r.size = ino * 3;
  r.name = std::move(name);
  return r;
}

// Offsets in the inode encoding, counted from the end so that they follow
// the strings: ... state(1) checksum_hi(8) checksum_lo(8) len(4) name len(4)
// target ckpt_ord(8) memory_only(1).
constexpr size_t kCheckpointFields = 9;
size_t StateOffset(const InodeRecord& r, const std::string& enc) {
  // state, checksum, sealed_size, the strings, the checkpoint fields
  return enc.size() - (1 + 16 + 8 + 4 + r.name.size() + 4 + r.target.size() + kCheckpointFields);
}

}  // namespace

KV_TEST(inode, round_trip_all_fields) {
  InodeRecord r = FullRecord();
  std::string enc = EncodeInode(r);
  auto d = DecodeInode(enc);
  cr_assert(d.has_value(), "decode of a fresh encoding: errno %d", d ? 0 : d.error());
  ExpectSameRecord(r, *d);
  cr_assert(EncodeInode(*d) == enc, "re-encoding gives the same bytes");

  // A record of format 2 decodes; its checksum (the older, dense kind) is
  // dropped rather than compared with the current kind.
  std::string old_enc = enc.substr(0, enc.size() - kCheckpointFields);
  old_enc[0] = 2;
  auto od = DecodeInode(old_enc);
  cr_assert(od.has_value());
  cr_assert_eq(od->checksum_hi, 0u);
  cr_assert_eq(od->checksum_lo, 0u);
  cr_assert_eq(od->sealed_size, r.sealed_size);
  // Format 3 (no checkpoint fields): not a checkpoint, the checksum kept.
  old_enc[0] = 3;
  od = DecodeInode(old_enc);
  cr_assert(od.has_value());
  cr_assert_eq(od->checksum_hi, r.checksum_hi);
  cr_assert_eq(od->ckpt_ord, 0u);
  cr_assert(!od->memory_only);
  cr_assert_eq(DecodeInode(enc.substr(0, enc.size() - kCheckpointFields)).error(), EIO, "format 4 cut short");

  InodeRecord empty;  // all zero, empty strings
  auto de = DecodeInode(EncodeInode(empty));
  cr_assert(de.has_value());
  ExpectSameRecord(empty, *de);

  for (DataState s : {DataState::kDirty, DataState::kDraining, DataState::kPersisted, DataState::kRemote,
                      DataState::kFailed, DataState::kMemoryOnly}) {
    InodeRecord x = r;
    x.state = s;
    auto dx = DecodeInode(EncodeInode(x));
    cr_assert(dx.has_value());
    cr_assert_eq(static_cast<int>(dx->state), static_cast<int>(s));
  }

  // Through the store, and (RocksKv) through a reopen.
  StoreEnv e(k);
  Batch b;
  MetaStore::PutInode(&b, r);
  e.Commit(b);
  auto g = e->GetInode(r.ino);
  cr_assert(g.has_value());
  ExpectSameRecord(r, *g);
  e.Reopen();
  g = e->GetInode(r.ino);
  cr_assert(g.has_value(), "after reopen: errno %d", g ? 0 : g.error());
  ExpectSameRecord(r, *g);
  cr_assert_eq(e->GetInode(r.ino + 1).error(), ENOENT);
}

KV_TEST(inode, truncated_or_garbage_bytes_are_eio) {
  InodeRecord r = FullRecord();
  std::string enc = EncodeInode(r);
  for (size_t n = 0; n < enc.size(); n++) {
    auto d = DecodeInode(std::string_view(enc).substr(0, n));
    cr_assert(!d.has_value(), "a record cut to %zu of %zu bytes decoded", n, enc.size());
    cr_assert_eq(d.error(), EIO);
  }
  cr_assert_eq(DecodeInode(enc + "x").error(), EIO, "trailing bytes");
  std::string flag = enc;
  flag[enc.size() - 1] = 2;  // memory_only is 0 or 1
  cr_assert_eq(DecodeInode(flag).error(), EIO);

  std::string bad = enc;
  bad[0] = 0;  // unknown format byte
  cr_assert_eq(DecodeInode(bad).error(), EIO);
  bad[0] = 5;  // a format from the future
  cr_assert_eq(DecodeInode(bad).error(), EIO);

  size_t state_at = StateOffset(r, enc);
  cr_assert_eq(static_cast<uint8_t>(enc[state_at]), 1u, "layout: state byte (kDraining) found");
  for (uint8_t s : {6, 7, 0x80, 0xff}) {  // 5 is kMemoryOnly
    bad = enc;
    bad[state_at] = static_cast<char>(s);
    cr_assert_eq(DecodeInode(bad).error(), EIO, "state %u", s);
  }

  // String lengths that point past the end, including 0xffffffff.
  size_t name_len_at = state_at + 25;  // state, checksum, sealed_size
  uint32_t name_len;
  memcpy(&name_len, enc.data() + name_len_at, 4);
  cr_assert_eq(name_len, r.name.size(), "layout: name length found");
  for (uint32_t len : {static_cast<uint32_t>(r.name.size() + 1), 0x7fffffffu, 0xffffffffu}) {
    bad = enc;
    memcpy(bad.data() + name_len_at, &len, 4);
    cr_assert_eq(DecodeInode(bad).error(), EIO, "name length %u", len);
  }
  size_t target_len_at = name_len_at + 4 + r.name.size();
  for (uint32_t len : {static_cast<uint32_t>(r.target.size() - 1), 0xffffffffu}) {
    bad = enc;
    memcpy(bad.data() + target_len_at, &len, 4);
    cr_assert_eq(DecodeInode(bad).error(), EIO, "target length %u", len);
  }

  // Random bytes never crash; whatever decodes must re-encode to the input.
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 20000; i++) {
    std::string g(rng() % 200, '\0');
    for (auto& c : g) c = static_cast<char>(rng());
    if (i % 2 == 0 && g.size() > 0) g[0] = 1;  // get past the format byte half the time
    auto d = DecodeInode(g);
    if (d) cr_assert(EncodeInode(*d) == g, "garbage %d decoded to a different record", i);
    else cr_assert_eq(d.error(), EIO);
  }
  // Random single-byte mutations of a valid record, likewise.
  for (int i = 0; i < 5000; i++) {
    std::string m = enc;
    m[rng() % m.size()] = static_cast<char>(rng());
    auto d = DecodeInode(m);
    if (d && m[0] == 2) continue;  // the older format byte: decodes, re-encodes as the current one
    if (d) cr_assert(EncodeInode(*d) == m);
    else cr_assert_eq(d.error(), EIO);
  }

  // The store reports a torn value as EIO too, point read and loader alike.
  StoreEnv e(k);
  e.RawPut(ckpt::meta::InodeKey(r.ino), enc.substr(0, enc.size() / 2));
  cr_assert_eq(e->GetInode(r.ino).error(), EIO);
  int calls = 0;
  auto st = e->ForEachInode([&](InodeRecord&&) { calls++; });
  cr_assert(!st.has_value());
  cr_assert_eq(st.error(), EIO);
  cr_assert_eq(calls, 0);
}

KV_TEST(inode, for_each_in_numeric_order) {
  StoreEnv e(k);
  std::vector<uint64_t> inos = {1, 128, 255, 256, 65536, 1ull << 40, 1ull << 63};
  std::vector<uint64_t> shuffled = inos;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  Batch b;
  for (uint64_t ino : shuffled) MetaStore::PutInode(&b, SmallRecord(ino, "n" + std::to_string(ino)));
  // Other prefixes around 'I' are not inodes.
  MetaStore::PutDentry(&b, 1, "x", 2, DT_REG);
  MetaStore::PutXattr(&b, 1, "user.a", "v");
  MetaStore::PutCounter(&b, "next_ino", 9);
  e.Commit(b);
  e.Reopen();

  std::vector<uint64_t> got;
  auto st = e->ForEachInode([&](InodeRecord&& r) {
    got.push_back(r.ino);
    cr_assert(r.name == "n" + std::to_string(r.ino));
    cr_assert_eq(r.size, r.ino * 3);
  });
  cr_assert(st.has_value());
  cr_assert(got == inos, "ForEachInode gave %zu inodes, not in numeric order", got.size());

  Batch d;
  MetaStore::DeleteInode(&d, 256);
  MetaStore::DeleteInode(&d, 1ull << 40);
  e.Commit(d);
  got.clear();
  cr_assert(e->ForEachInode([&](InodeRecord&& r) { got.push_back(r.ino); }).has_value());
  cr_assert(got == (std::vector<uint64_t>{1, 128, 255, 65536, 1ull << 63}));
  cr_assert_eq(e->GetInode(256).error(), ENOENT);
}

KV_TEST(inode, for_each_stops_at_mismatched_or_bad_record) {
  {
    // A valid record under another inode's key is corruption.
    StoreEnv e(k);
    e.RawPut(ckpt::meta::InodeKey(5), EncodeInode(SmallRecord(6, "six")));
    cr_assert_eq(e->ForEachInode([](InodeRecord&&) {}).error(), EIO);
  }
  ckpt::test::RemoveTempDir();
  ckpt::test::MakeTempDir();
  {
    // A key of the wrong length under 'I'.
    StoreEnv e(k);
    std::string key = ckpt::meta::InodeKey(7) + "x";
    e.RawPut(key, EncodeInode(SmallRecord(7, "seven")));
    cr_assert_eq(e->ForEachInode([](InodeRecord&&) {}).error(), EIO);
  }
  ckpt::test::RemoveTempDir();
  ckpt::test::MakeTempDir();
  {
    // Good, bad, good: the loader gives the first, then stops with EIO.
    StoreEnv e(k);
    Batch b;
    MetaStore::PutInode(&b, SmallRecord(1, "a"));
    MetaStore::PutInode(&b, SmallRecord(3, "c"));
    b.Put(ckpt::meta::InodeKey(2), "garbage");
    e.Commit(b);
    std::vector<uint64_t> got;
    auto st = e->ForEachInode([&](InodeRecord&& r) { got.push_back(r.ino); });
    cr_assert_eq(st.error(), EIO);
    cr_assert(got == std::vector<uint64_t>{1});
  }
}

KV_TEST(dentry, put_delete_and_scan_order) {
  StoreEnv e(k);
  using Entry = std::tuple<uint64_t, std::string, uint64_t, uint8_t>;
  std::vector<Entry> want = {
      {1, "a", 10, DT_REG},   {1, "a\0b"s, 11, DT_DIR},  // a NUL inside a name
      {1, "b", 12, DT_LNK},   {1, "\xff"s, 13, DT_REG}, {255, "x", 14, DT_REG},
      {256, "x", 15, DT_REG}, {65536, "y", 16, DT_DIR}, {1ull << 40, "z", ~0ull, DT_REG},
  };
  std::vector<Entry> shuffled = want;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(4));
  Batch b;
  for (auto& [p, n, ino, t] : shuffled) MetaStore::PutDentry(&b, p, n, ino, t);
  MetaStore::PutInode(&b, SmallRecord(10, "a"));
  MetaStore::PutXattr(&b, 1, "user.x", "v");
  e.Commit(b);
  e.Reopen();

  std::vector<Entry> got;
  auto st = e->ForEachDentry(
      [&](uint64_t p, std::string_view n, DentryValue v) { got.emplace_back(p, std::string(n), v.ino, v.type); });
  cr_assert(st.has_value());
  cr_assert_eq(got.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) cr_assert(got[i] == want[i], "entry %zu differs or is out of order", i);

  // A prefix scan of one directory sees only its own children.
  std::vector<std::string> names;
  auto sc = e->kv()->Scan(ckpt::meta::DentryPrefix(1), [&](std::string_view key, std::string_view) {
    names.emplace_back(key.substr(9));
    return true;
  });
  cr_assert(sc.has_value());
  cr_assert(names == (std::vector<std::string>{"a", "a\0b"s, "b", "\xff"s}));

  Batch d;
  MetaStore::DeleteDentry(&d, 1, "a\0b"s);
  MetaStore::DeleteDentry(&d, 256, "x");
  MetaStore::PutDentry(&d, 256, "x2", 15, DT_REG);  // a rename in one batch
  e.Commit(d);
  got.clear();
  cr_assert(e->ForEachDentry([&](uint64_t p, std::string_view n, DentryValue v) {
               got.emplace_back(p, std::string(n), v.ino, v.type);
             }).has_value());
  cr_assert_eq(got.size(), want.size() - 1);
  cr_assert(std::find(got.begin(), got.end(), Entry{1, "a\0b"s, 11, DT_DIR}) == got.end());
  cr_assert(std::find(got.begin(), got.end(), Entry{256, "x", 15, DT_REG}) == got.end());
  cr_assert(std::find(got.begin(), got.end(), Entry{256, "x2", 15, DT_REG}) != got.end());
  cr_assert(std::find(got.begin(), got.end(), Entry{1, "a", 10, DT_REG}) != got.end());
}

KV_TEST(dentry, malformed_value_is_eio) {
  StoreEnv e(k);
  Batch b;
  MetaStore::PutDentry(&b, 1, "ok", 2, DT_REG);
  b.Put(ckpt::meta::DentryKey(1, "short"), std::string(8, '\0'));  // no type byte
  e.Commit(b);
  int calls = 0;
  auto st = e->ForEachDentry([&](uint64_t, std::string_view, DentryValue) { calls++; });
  cr_assert(!st.has_value());
  cr_assert_eq(st.error(), EIO);
  cr_assert_eq(calls, 1, "the good entry before the bad one is delivered");
}

KV_TEST(xattr, put_delete_and_scan) {
  StoreEnv e(k);
  Batch b;
  MetaStore::PutXattr(&b, 256, "user.b", "2");
  MetaStore::PutXattr(&b, 1, "user.z", "\0bin\xff"s);
  MetaStore::PutXattr(&b, 1, "user.a", "");
  MetaStore::PutXattr(&b, 1ull << 40, "user.c", std::string(65536, 'v'));
  MetaStore::PutXattr(&b, 255, "user.gone", "x");
  MetaStore::PutInode(&b, SmallRecord(1, "root"));
  e.Commit(b);
  Batch d;
  MetaStore::DeleteXattr(&d, 255, "user.gone");
  MetaStore::PutXattr(&d, 256, "user.b", "22");  // replace
  e.Commit(d);
  e.Reopen();

  using X = std::tuple<uint64_t, std::string, std::string>;
  std::vector<X> got;
  auto st = e->ForEachXattr([&](uint64_t ino, std::string_view n, std::string_view v) {
    got.emplace_back(ino, std::string(n), std::string(v));
  });
  cr_assert(st.has_value());
  std::vector<X> want = {
      {1, "user.a", ""},
      {1, "user.z", "\0bin\xff"s},
      {256, "user.b", "22"},
      {1ull << 40, "user.c", std::string(65536, 'v')},
  };
  cr_assert_eq(got.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) cr_assert(got[i] == want[i], "xattr %zu differs or is out of order", i);
}

KV_TEST(counter, get_put_and_malformed) {
  StoreEnv e(k);
  auto c = e->GetCounter("next_ino");
  cr_assert(c.has_value());
  cr_assert_eq(*c, 0u, "an absent counter reads 0");
  Batch b;
  MetaStore::PutCounter(&b, "next_ino", 42);
  MetaStore::PutCounter(&b, "next_ino2", ~0ull);
  MetaStore::PutCounter(&b, "next_seq", 1ull << 40);
  e.Commit(b);
  e.Reopen();
  cr_assert_eq(*e->GetCounter("next_ino"), 42u);
  cr_assert_eq(*e->GetCounter("next_ino2"), ~0ull);
  cr_assert_eq(*e->GetCounter("next_seq"), 1ull << 40);
  cr_assert_eq(*e->GetCounter("next"), 0u);
  // Stored big-endian, so counters could be range-scanned too.
  auto raw = e->kv()->Get(ckpt::meta::CounterKey("next_ino"));
  cr_assert(raw.has_value());
  cr_assert(*raw == "\0\0\0\0\0\0\0\x2a"s);
  e.RawPut(ckpt::meta::CounterKey("bad"), "1234567");
  cr_assert_eq(e->GetCounter("bad").error(), EIO);
  e.RawPut(ckpt::meta::CounterKey("bad"), "123456789");
  cr_assert_eq(e->GetCounter("bad").error(), EIO);
}

KV_TEST(log, round_trip_order_and_garbage) {
  LogEntry full;
  full.seq = 0x8000000000000001ull;
  full.op = LogOp::kRename;
  full.flags = 1;
  full.ino = 77;
  full.version = 5;
  full.mode = 0100755;
  full.mtime = {-5, 123};
  full.path = "/a\0b"s;
  full.path2 = "/c/\xff"s;
  std::string enc = EncodeLogEntry(full);
  auto d = DecodeLogEntry(enc);
  cr_assert(d.has_value());
  cr_assert_eq(d->seq, full.seq);
  cr_assert_eq(static_cast<int>(d->op), static_cast<int>(full.op));
  cr_assert_eq(d->flags, full.flags);
  cr_assert_eq(d->ino, full.ino);
  cr_assert_eq(d->version, full.version);
  cr_assert_eq(d->mode, full.mode);
  cr_assert_eq(d->mtime.sec, full.mtime.sec);
  cr_assert_eq(d->mtime.nsec, full.mtime.nsec);
  cr_assert(d->path == full.path);
  cr_assert(d->path2 == full.path2);
  cr_assert_not(d->has_owner);
  // Owner and group (issue #16 item 12) round-trip.
  LogEntry owned = full;
  owned.uid = 65534;
  owned.gid = 4321;
  owned.has_owner = true;
  auto o = DecodeLogEntry(EncodeLogEntry(owned));
  cr_assert(o.has_value());
  cr_assert(o->has_owner);
  cr_assert_eq(o->uid, 65534u);
  cr_assert_eq(o->gid, 4321u);
  // An entry written before owners were recorded (format 2: no owner
  // fields) still decodes, with no owner.
  std::string old_enc = EncodeLogEntry(owned);
  old_enc.resize(old_enc.size() - 9);
  old_enc[0] = 2;
  auto od = DecodeLogEntry(old_enc);
  cr_assert(od.has_value());
  cr_assert_not(od->has_owner);
  cr_assert(od->path2 == full.path2);
  cr_assert_eq(DecodeLogEntry(old_enc + "\0"s).error(), EIO);
  for (size_t n = 0; n < enc.size(); n++) cr_assert_eq(DecodeLogEntry(enc.substr(0, n)).error(), EIO, "cut at %zu", n);
  cr_assert_eq(DecodeLogEntry(enc + "\0"s).error(), EIO);
  std::string bad = enc;
  bad[9] = 0;  // op 0 is not an op
  cr_assert_eq(DecodeLogEntry(bad).error(), EIO);
  bad[9] = 9;
  cr_assert_eq(DecodeLogEntry(bad).error(), EIO);

  StoreEnv e(k);
  std::vector<uint64_t> seqs = {1, 255, 256, 65536, 1ull << 40};
  Batch b;
  for (auto it = seqs.rbegin(); it != seqs.rend(); ++it) {
    LogEntry l;
    l.seq = *it;
    l.op = LogOp::kPersist;
    l.ino = *it + 100;
    l.path = "/f" + std::to_string(*it);
    MetaStore::PutLog(&b, l);
  }
  e.Commit(b);
  Batch del;
  MetaStore::DeleteLog(&del, 255);
  e.Commit(del);
  e.Reopen();
  std::vector<uint64_t> got;
  auto st = e->ForEachLogEntry([&](LogEntry&& l) {
    got.push_back(l.seq);
    cr_assert_eq(l.ino, l.seq + 100);
  });
  cr_assert(st.has_value());
  cr_assert(got == (std::vector<uint64_t>{1, 256, 65536, 1ull << 40}));

  // An entry under the wrong sequence number, or garbage, stops the loader.
  e.RawPut(ckpt::meta::LogKey(300), enc);  // enc carries seq 0x8000000000000001
  got.clear();
  cr_assert_eq(e->ForEachLogEntry([&](LogEntry&& l) { got.push_back(l.seq); }).error(), EIO);
  cr_assert(got == (std::vector<uint64_t>{1, 256}));
}

// One batch mixing every record kind is applied whole.
KV_TEST(store, commit_mixed_batch) {
  StoreEnv e(k);
  Batch seed;
  MetaStore::PutDentry(&seed, 1, "old", 5, DT_REG);
  MetaStore::PutInode(&seed, SmallRecord(5, "old"));
  e.Commit(seed);

  // "create new, unlink old" as one namespace change.
  Batch b;
  MetaStore::PutInode(&b, SmallRecord(6, "new"));
  MetaStore::PutDentry(&b, 1, "new", 6, DT_REG);
  MetaStore::PutCounter(&b, "next_ino", 7);
  MetaStore::DeleteDentry(&b, 1, "old");
  MetaStore::DeleteInode(&b, 5);
  MetaStore::PutXattr(&b, 6, "user.k", "v");
  e.Commit(b);
  e.Reopen();
  cr_assert_eq(e->GetInode(5).error(), ENOENT);
  cr_assert_eq(e->GetInode(6)->name, "new");
  cr_assert_eq(*e->GetCounter("next_ino"), 7u);
  std::vector<std::string> names;
  cr_assert(e->ForEachDentry([&](uint64_t, std::string_view n, DentryValue) { names.emplace_back(n); }).has_value());
  cr_assert(names == std::vector<std::string>{"new"});
  int xattrs = 0;
  cr_assert(e->ForEachXattr([&](uint64_t, std::string_view, std::string_view) { xattrs++; }).has_value());
  cr_assert_eq(xattrs, 1);
}

KV_TEST(format, created_once_and_stable) {
  StoreEnv e(k);
  auto id = e->EnsureFormat();
  cr_assert(id.has_value(), "EnsureFormat on an empty store: errno %d", id ? 0 : id.error());
  auto raw = e->kv()->Get(ckpt::meta::kFormatKey);
  cr_assert(raw.has_value(), "the format record is written");
  auto again = e->EnsureFormat();
  cr_assert(again.has_value());
  cr_assert_eq(*again, *id);
  cr_assert(*e->kv()->Get(ckpt::meta::kFormatKey) == *raw, "the second call does not rewrite the record");
  e.Reopen();
  auto reopened = e->EnsureFormat();
  cr_assert(reopened.has_value());
  cr_assert_eq(*reopened, *id, "the id survives a reopen");

  // Another fresh store gets its own id.
  std::set<uint64_t> ids = {*id};
  for (int i = 0; i < 4; i++) {
    MetaStore other(ckpt::meta::NewMemKv());
    ids.insert(*other.EnsureFormat());
  }
  cr_assert_eq(ids.size(), 5u, "filesystem ids are random");
}

KV_TEST(format, rejects_foreign_record) {
  StoreEnv e(k);
  auto id = e->EnsureFormat();
  cr_assert(id.has_value());
  std::string good = *e->kv()->Get(ckpt::meta::kFormatKey);

  std::vector<std::string> foreign = {
      "", "something else entirely", good.substr(0, good.size() - 1),  // torn
      good + "x",                                                      // longer
  };
  std::string wrong_magic = good;
  wrong_magic[0] = 'X';
  foreign.push_back(wrong_magic);
  // Right magic and length, another version: the magic is "ckptfs-meta" (11
  // bytes), then a u32 version.
  cr_assert(good.starts_with("ckptfs-meta"), "layout: magic first");
  std::string wrong_version = good;
  wrong_version[11] = static_cast<char>(wrong_version[11] + 1);
  foreign.push_back(wrong_version);

  for (size_t i = 0; i < foreign.size(); i++) {
    e.RawPut(ckpt::meta::kFormatKey, foreign[i]);
    auto r = e->EnsureFormat();
    cr_assert(!r.has_value(), "foreign format record %zu accepted", i);
    cr_assert_eq(r.error(), EINVAL, "record %zu", i);
    cr_assert(*e->kv()->Get(ckpt::meta::kFormatKey) == foreign[i], "a foreign record is never overwritten");
  }
  e.RawPut(ckpt::meta::kFormatKey, good);
  cr_assert_eq(*e->EnsureFormat(), *id);
}
