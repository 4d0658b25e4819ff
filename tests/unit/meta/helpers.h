// helpers.h — one test body, two stores: every fs/meta suite runs over MemKv
// and RocksKv, as 3FS tests/kv/TestKVStore.cc runs one suite over several
// stores.
//
// Criterion forks per test, so each test makes its own temporary directory in
// .init and removes it in .fini; .fini also runs after a failed assertion
// (which longjmps out of the body, skipping destructors).
#pragma once

#include <criterion/criterion.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "fs/meta/kv.h"

namespace ckpt::test {

enum class KvKind { kMem, kRocks };

inline const char* KvName(KvKind k) { return k == KvKind::kMem ? "mem" : "rocks"; }

// The running test's temporary directory.
inline std::string g_dir;

inline void MakeTempDir() {
  char tmpl[] = "/tmp/ckpt-meta-unit-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl), "mkdtemp");
  g_dir = tmpl;
}

inline void RemoveTempDir() {
  if (g_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
  g_dir.clear();
}

// A store of either kind. RocksKv lives in <g_dir>/db.
struct KvEnv {
  KvKind kind;
  std::string dir;
  std::unique_ptr<meta::Kv> kv;

  explicit KvEnv(KvKind k) : kind(k), dir(g_dir + "/db") { Open(); }

  void Open() {
    if (kind == KvKind::kMem) {
      kv = meta::NewMemKv();
      return;
    }
    auto r = meta::OpenRocksKv(dir);
    cr_assert(r.has_value(), "OpenRocksKv(%s): errno %d", dir.c_str(), r ? 0 : r.error());
    kv = std::move(*r);
  }

  // Closes the store and opens it again from disk. MemKv has no disk: it
  // keeps the same object, so "reopen" checks are meaningful only for RocksKv.
  void Reopen() {
    if (kind == KvKind::kMem) return;
    kv.reset();
    Open();
  }
};

}  // namespace ckpt::test

// KV_TEST(suite, name) { body using `k` (KvKind) } defines suite::name_mem and
// suite::name_rocks, each running the body once in a fresh temp dir.
#define KV_TEST(suite, name)                                                                            \
  static void suite##_##name(ckpt::test::KvKind k);                                                     \
  Test(suite, name##_mem, .init = ckpt::test::MakeTempDir, .fini = ckpt::test::RemoveTempDir) {         \
    suite##_##name(ckpt::test::KvKind::kMem);                                                           \
  }                                                                                                     \
  Test(suite, name##_rocks, .init = ckpt::test::MakeTempDir, .fini = ckpt::test::RemoveTempDir) {       \
    suite##_##name(ckpt::test::KvKind::kRocks);                                                         \
  }                                                                                                     \
  static void suite##_##name([[maybe_unused]] ckpt::test::KvKind k)

// A RocksKv-only test (reopen, locking), with the same temp-dir set-up.
#define ROCKS_TEST(suite, name) \
  Test(suite, name, .init = ckpt::test::MakeTempDir, .fini = ckpt::test::RemoveTempDir)
