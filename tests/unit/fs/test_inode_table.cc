// test_inode_table.cc — namespace semantics and the drain log they write,
// run over both MemKv and RocksKv.
#include <criterion/criterion.h>
#include <linux/fs.h>
#include <sys/xattr.h>

#include "tests/unit/fs/helpers.h"

using ckpt::fs::Caller;
using ckpt::meta::DataState;
using ckpt::meta::LogOp;
using ckpt::test::Env;
using ckpt::test::KvKind;
constexpr uint64_t kRoot = ckpt::meta::kRootIno;

#define BOTH(name)                      \
  static void name(KvKind k);           \
  Test(inode_table, name##_mem) { name(KvKind::kMem); }     \
  Test(inode_table, name##_rocks) { name(KvKind::kRocks); } \
  static void name(KvKind k)

static std::vector<std::string> Ops(Env& e) {
  std::vector<std::string> out;
  for (auto& l : e.table->PendingLog(1000))
    out.push_back(std::string(ckpt::meta::LogOpName(l.op)) + " " + l.path + (l.path2.empty() ? "" : " " + l.path2));
  return out;
}

BOTH(create_lookup_errors) {
  Env e(k);
  uint64_t d = e.Mkdir(kRoot, "d");
  e.WriteFile(d, "f", "hello");
  auto f = e.table->Lookup(d, "f");
  cr_assert(f.has_value());
  cr_assert_eq(f->size, 5u);
  cr_assert_eq(e.table->Lookup(d, "nope").error(), ENOENT);
  cr_assert_eq(e.table->Mkdir(kRoot, "d", 0755, Caller{}).error(), EEXIST);
  cr_assert_eq(e.table->Lookup(f->ino, "x").error(), ENOTDIR);
  cr_assert_eq(e.table->Rmdir(kRoot, "d").error(), ENOTEMPTY);
  cr_assert_eq(e.table->Unlink(kRoot, "d").error(), EISDIR);
  cr_assert_eq(e.table->Rmdir(d, "f").error(), ENOTDIR);
  cr_assert_eq(e.table->Mkdir(kRoot, std::string(256, 'a'), 0755, Caller{}).error(), ENAMETOOLONG);
  cr_assert(e.table->Mkdir(kRoot, std::string(255, 'a'), 0755, Caller{}).has_value());
  cr_assert_eq(e.table->GetAttr(kRoot)->nlink, 4u);  // ".", "..", d, aaa...
}

BOTH(rename_rules) {
  Env e(k);
  uint64_t a = e.Mkdir(kRoot, "a");
  uint64_t b = e.Mkdir(a, "b");
  e.WriteFile(kRoot, "x", "1");
  e.WriteFile(kRoot, "y", "22");
  cr_assert_eq(e.table->Rename(kRoot, "a", b, "a2", 0).error(), EINVAL);  // into own subtree
  cr_assert_eq(e.table->Rename(kRoot, "x", kRoot, "y", RENAME_NOREPLACE).error(), EEXIST);
  cr_assert_eq(e.table->Rename(kRoot, "x", kRoot, "a", 0).error(), EISDIR);
  cr_assert_eq(e.table->Rename(kRoot, "a", kRoot, "x", 0).error(), ENOTDIR);
  cr_assert(e.table->Rename(kRoot, "x", kRoot, "y", RENAME_EXCHANGE).has_value());
  cr_assert_eq(e.table->Lookup(kRoot, "x")->size, 2u);
  cr_assert_eq(e.table->Lookup(kRoot, "y")->size, 1u);
  cr_assert(e.table->Rename(kRoot, "x", kRoot, "y", 0).has_value());  // replace
  cr_assert_eq(e.table->Lookup(kRoot, "x").error(), ENOENT);
  cr_assert_eq(e.table->Lookup(kRoot, "y")->size, 2u);
  e.Mkdir(kRoot, "c");
  e.WriteFile(e.Mkdir(kRoot, "full"), "f", "z");
  cr_assert_eq(e.table->Rename(kRoot, "c", kRoot, "full", 0).error(), ENOTEMPTY);
  cr_assert(e.table->Rename(a, "b", kRoot, "b", 0).has_value());  // directory moves up
  cr_assert_eq(e.table->GetAttr(b)->parent, kRoot);
  cr_assert_eq(e.table->GetAttr(a)->nlink, 2u);
}

BOTH(hard_links_and_orphans) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "data");
  cr_assert(e.table->Link(f, kRoot, "g").has_value());
  cr_assert_eq(e.table->GetAttr(f)->nlink, 2u);
  cr_assert(e.table->Unlink(kRoot, "f").has_value());
  auto r = e.table->GetAttr(f);
  cr_assert_eq(r->nlink, 1u);
  cr_assert_str_eq(r->name.c_str(), "g");  // the drainer's path follows the remaining link
  // Unlinked while open: bytes stay until the last close and forget.
  auto fd = e.table->Open(f, O_RDONLY);
  cr_assert(fd.has_value());
  cr_assert(e.table->Unlink(kRoot, "g").has_value());
  cr_assert(e.tier->Has(f));
  e.table->Release(f, false);
  e.table->Forget(f, 2);  // the Mknod and Link lookups
  cr_assert_not(e.tier->Has(f));
  cr_assert_eq(e.table->GetAttr(f).error(), ENOENT);
}

BOTH(xattrs) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "");
  cr_assert(e.table->SetXattr(f, "user.a", "1", 0).has_value());
  cr_assert_eq(e.table->SetXattr(f, "user.a", "2", XATTR_CREATE).error(), EEXIST);
  cr_assert_eq(e.table->SetXattr(f, "user.b", "2", XATTR_REPLACE).error(), ENODATA);
  cr_assert_str_eq(e.table->GetXattr(f, "user.a")->c_str(), "1");
  cr_assert_str_eq(e.table->GetXattr(f, "user.ckptfs.state")->c_str(), "dirty");
  cr_assert_eq(e.table->SetXattr(f, "user.ckptfs.state", "persisted", 0).error(), EPERM);
  cr_assert(e.table->RemoveXattr(f, "user.a").has_value());
  cr_assert_eq(e.table->GetXattr(f, "user.a").error(), ENODATA);
}

Test(inode_table, survives_reopen) {
  Env e(KvKind::kRocks);
  uint64_t d = e.Mkdir(kRoot, "step_1");
  uint64_t f = e.WriteFile(d, "model.pt", "weights");
  cr_assert(e.table->SetXattr(f, "user.k", "v", 0).has_value());
  cr_assert(e.table->Symlink(kRoot, "latest", "step_1", Caller{}).has_value());
  auto before = e.table->GetAttr(f);
  e.Open();
  auto got = e.table->Lookup(d, "model.pt");
  cr_assert(got.has_value());
  cr_assert_eq(got->ino, f);
  cr_assert_eq(got->size, 7u);
  cr_assert_eq(got->mtime.nsec, before->mtime.nsec);
  cr_assert_str_eq(e.table->GetXattr(f, "user.k")->c_str(), "v");
  cr_assert_str_eq(e.table->Readlink(e.table->Lookup(kRoot, "latest")->ino)->c_str(), "step_1");
  // The log survives too, in order.
  auto ops = Ops(e);
  cr_assert_eq(ops.size(), 3u);
  cr_assert_str_eq(ops[0].c_str(), "mkdir step_1");
  cr_assert_str_eq(ops[1].c_str(), "persist step_1/model.pt");
  cr_assert_str_eq(ops[2].c_str(), "symlink latest step_1");
  // New inodes never reuse numbers.
  cr_assert_gt(e.WriteFile(kRoot, "n", "x"), f);
}

BOTH(log_records_history_in_order) {
  Env e(k);
  uint64_t d = e.Mkdir(kRoot, "ckpt");
  e.WriteFile(d, "a", "A");
  cr_assert(e.table->Rename(kRoot, "ckpt", kRoot, "step_1", 0).has_value());
  e.WriteFile(kRoot, "latest", "step_1");
  cr_assert(e.table->Unlink(d, "a").has_value());
  auto ops = Ops(e);
  const char* want[] = {"mkdir ckpt", "persist ckpt/a", "rename ckpt step_1", "persist latest", "unlink step_1/a"};
  cr_assert_eq(ops.size(), 5u);
  for (size_t i = 0; i < 5; i++) cr_assert_str_eq(ops[i].c_str(), want[i]);
}

BOTH(persist_superseded_by_rewrite_or_delete) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "v1");
  auto v1 = e.table->PendingLog(10).at(0);
  e.Overwrite(f, "v2");
  // v1's bytes are gone from the tier: draining it must be refused.
  cr_assert_eq(e.table->BeginPersist(v1).error(), ESTALE);
  auto v2 = e.table->PendingLog(10).at(1);
  cr_assert_eq(v2.version, v1.version + 1);
  auto src = e.table->BeginPersist(v2);
  cr_assert(src.has_value());
  cr_assert_str_eq(e.table->GetXattr(f, "user.ckptfs.state")->c_str(), "draining");
  // A write while draining invalidates the staged copy.
  auto fd = e.table->Open(f, O_RDWR);
  cr_assert(fd.has_value());
  cr_assert(e.table->Write(f, 0, 1, [&](int x) { return pwrite(x, "X", 1, 0); }).has_value());
  cr_assert_not(e.table->PersistStillValid(v2, src->gen));
  e.table->AbortPersist(v2);
  e.table->Release(f, true);
  // Deleted before draining: superseded too.
  uint64_t g = e.WriteFile(kRoot, "g", "gone");
  auto gl = e.table->PendingLog(100).back();
  cr_assert_eq(gl.ino, g);
  cr_assert(e.table->Unlink(kRoot, "g").has_value());
  cr_assert_eq(e.table->BeginPersist(gl).error(), ESTALE);
}

BOTH(complete_marks_persisted_and_evict_frees) {
  Env e(k, 1 << 20);
  uint64_t f = e.WriteFile(kRoot, "f", std::string(300000, 'x'));
  auto l = e.table->PendingLog(10).at(0);
  auto src = e.table->BeginPersist(l);
  cr_assert(src.has_value());
  // Nothing clean yet, but a drain is pending: writers should wait.
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kWait);
  ckpt::backend::Staged s;
  s.checksum_hi = 1;
  s.checksum_lo = 2;
  cr_assert(e.table->CompletePersist(l, s, src->gen).has_value());
  cr_assert_eq(e.table->GetAttr(f)->state, DataState::kPersisted);
  cr_assert_eq(e.table->PendingLog(10).size(), 0u);
  cr_assert_eq(e.table->DataStatistics().applied_seq, l.seq);
  uint64_t used = e.tier->Stats().used;
  cr_assert_gt(used, 0u);
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kFreed);
  cr_assert_eq(e.tier->Stats().used, 0u);
  cr_assert_eq(e.table->GetAttr(f)->state, DataState::kRemote);
  // With nothing to drain and nothing clean, waiting would never end.
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kHopeless);
}

BOTH(truncate_of_closed_file_seals) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "abcdef");
  ckpt::fs::AttrChange c;
  c.to_set = ckpt::fs::kSetSize;
  c.size = 2;
  cr_assert(e.table->SetAttr(f, c).has_value());
  auto log = e.table->PendingLog(10);
  cr_assert_eq(log.size(), 2u);
  cr_assert(log[1].op == LogOp::kPersist);
  cr_assert_eq(log[1].version, 2u);
}
