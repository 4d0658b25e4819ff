// test_inode_table.cc — namespace semantics and the drain log they write,
// run over both MemKv and RocksKv.
#include <criterion/criterion.h>
#include <linux/fs.h>
#include <sys/xattr.h>

#include <chrono>
#include <set>
#include <thread>

#include "tests/unit/fs/helpers.h"

using ckpt::fs::Caller;
using ckpt::meta::DataState;
using ckpt::meta::LogOp;
using ckpt::test::Env;
using ckpt::test::KvKind;
constexpr uint64_t kRoot = ckpt::meta::kRootIno;

#define BOTH(name)                                          \
  static void name(KvKind k);                               \
  Test(inode_table, name##_mem) { name(KvKind::kMem); }     \
  Test(inode_table, name##_rocks) { name(KvKind::kRocks); } \
  static void name(KvKind k)

static std::vector<std::string> Ops(Env& e) {
  std::vector<std::string> out;
  for (auto& l : e.table->core().oplog.Pending(1000))
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
  e.table->Release(f, O_RDONLY);
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
  cr_assert_eq(e.table->GetXattr(f, "user.a").value_or(""), std::string("1"));
  cr_assert_eq(e.table->GetXattr(f, "user.ckptfs.state").value_or(""), std::string("dirty"));
  cr_assert_eq(e.table->SetXattr(f, "user.ckptfs.state", "persisted", 0).error(), EPERM);
  cr_assert(e.table->RemoveXattr(f, "user.a").has_value());
  cr_assert_eq(e.table->GetXattr(f, "user.a").error(), ENODATA);
  // system.* is not kept: the kernel checks no permission for it.
  cr_assert_eq(e.table->SetXattr(f, "system.x", "1", 0).error(), EOPNOTSUPP);
  cr_assert_eq(e.table->RemoveXattr(f, "system.x").error(), EOPNOTSUPP);
  cr_assert_eq(e.table->SetXattr(f, "other.x", "1", 0).error(), EOPNOTSUPP);
  // One file's xattrs are bounded (256 KiB of names and values, 64 KiB of
  // names): past it ENOSPC, and the mount stays writable.
  const std::string big(ckpt::fs::kMaxXattrValue, 'v');
  int stored = 0;
  for (int i = 0; i < 10; i++) {
    auto st = e.table->SetXattr(f, "user.big" + std::to_string(i), big, 0);
    if (!st) {
      cr_assert_eq(st.error(), ENOSPC);
      break;
    }
    stored++;
  }
  cr_expect_eq(stored, 3, "three of 64 KiB and their names fit in 256 KiB");
  cr_assert(e.table->SetXattr(f, "user.big0", "small", 0).has_value(), "replacing one makes room");
  cr_assert(e.table->SetXattr(f, "user.big3", big, 0).has_value());
  for (int i = 0; i < 4; i++) cr_assert(e.table->RemoveXattr(f, "user.big" + std::to_string(i)).has_value());
  int names = 0;
  for (;; names++)
    if (!e.table->SetXattr(f, "user." + std::string(200, 'n') + std::to_string(names), "", 0)) break;
  cr_expect_lt(e.table->ListXattr(f)->size(), 65537u);
  cr_expect_gt(names, 300);
  cr_assert(e.table->core().Writable().has_value());
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
  cr_assert_eq(e.table->GetXattr(f, "user.k").value_or(""), std::string("v"));
  cr_assert_eq(e.table->Readlink(e.table->Lookup(kRoot, "latest")->ino).value_or(""), std::string("step_1"));
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

static std::string ReadAll(int fd) {
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  cr_assert_eq(pread(fd, out.data(), out.size(), 0), st.st_size);
  return out;
}

// A sealed version the drain has not published keeps its bytes, whatever
// happens to the file afterwards: rewrite (O_TRUNC: moved), in-place write
// (copied), truncate(2), unlink. The drain reads exactly what was sealed.
BOTH(sealed_versions_survive_rewrite_truncate_and_delete) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "version one");
  auto v1 = e.table->core().oplog.Pending(10).at(0);
  e.WriteFile(kRoot, "other", "logged after f's v1, so v1 is not superseded");
  e.Overwrite(f, "v2");  // O_TRUNC: v1 moves to its snapshot
  auto s1 = e.table->drain_port().BeginPersist(v1);
  cr_assert(s1.has_value());
  cr_assert_eq(ReadAll(s1->fd), "version one");
  auto v2 = e.table->core().oplog.Pending(10).at(2);
  cr_assert_eq(v2.version, v1.version + 1);
  auto s2 = e.table->drain_port().BeginPersist(v2);
  cr_assert(s2.has_value());
  cr_assert_eq(e.table->GetXattr(f, "user.ckptfs.state").value_or(""), std::string("draining"));
  // A write in place while v2 drains: v2 is copied first, the staged
  // bytes do not change under the drainer.
  auto fd = e.table->Open(f, O_RDWR);
  cr_assert(fd.has_value());
  cr_assert(e.table->Write(f, 0, 1, [&](int x) { return pwrite(x, "X", 1, 0); }).has_value());
  cr_assert_eq(ReadAll(s2->fd), "v2");
  e.table->Release(f, O_RDWR);
  e.table->drain_port().AbortPersist(v2);
  auto v3 = e.table->core().oplog.Pending(10).back();
  cr_assert_eq(v3.version, v2.version + 1);
  auto s3 = e.table->drain_port().BeginPersist(v3);
  cr_assert(s3.has_value());
  cr_assert_eq(ReadAll(s3->fd), "X2");
  // truncate(2) of the closed file seals v4, which supersedes v3 (the last
  // entry in the log): the drain skips v3, a transfer already reading it
  // keeps its bytes.
  ckpt::fs::AttrChange c;
  c.to_set = ckpt::fs::kSetSize;
  c.size = 1;
  cr_assert(e.table->SetAttr(f, c).has_value());
  cr_assert_eq(e.table->drain_port().BeginPersist(v3).error(), ESTALE);
  cr_assert_eq(ReadAll(s3->fd), "X2");
  auto v4 = e.table->core().oplog.Pending(10).back();
  cr_assert_eq(v4.version, v3.version + 1);
  cr_assert_eq(ReadAll(e.table->drain_port().BeginPersist(v4)->fd), "X");
  // Deleted before draining: the sealed bytes still drain.
  uint64_t g = e.WriteFile(kRoot, "g", "gone");
  auto gl = e.table->core().oplog.Pending(100).back();
  cr_assert_eq(gl.ino, g);
  cr_assert(e.table->Unlink(kRoot, "g").has_value());
  e.table->Forget(g, 1);
  auto sg = e.table->drain_port().BeginPersist(gl);
  cr_assert(sg.has_value(), "%d", sg ? 0 : sg.error());
  cr_assert_eq(ReadAll(sg->fd), "gone");
  // Without its bytes (the tier lost them) a version is reported, not served.
  e.tier->Remove(ckpt::cache::SnapKey(gl.ino, gl.version));
  cr_assert_eq(e.table->drain_port().BeginPersist(gl).error(), ENODATA);
}

// A version still last in the log when the file is sealed again is
// superseded: the drain skips it (ESTALE) and its copy is dropped at once,
// so a file rewritten and fsynced in a loop never piles up copies however
// far behind the drain is.
BOTH(superseded_versions_hold_no_copy) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", std::string(64 * 1024, 'a'));
  auto fd = e.table->Open(f, O_RDWR);
  cr_assert(fd.has_value());
  for (int i = 0; i < 20; i++) {
    // Each in-place write copies the sealed version aside; each fsync seals
    // a new version that supersedes the one before.
    char c = static_cast<char>('b' + i);
    cr_assert(e.table->Write(f, 0, 1, [&](int x) { return pwrite(x, &c, 1, 0); }).has_value());
    cr_assert(e.table->SyncSeal(f).has_value());
    // Live bytes plus at most one copy, never one per fsync.
    cr_assert_leq(e.tier->Stats().used, 2u * 64 * 1024 + 8192, "used %lu after %d fsyncs",
                  static_cast<unsigned long>(e.tier->Stats().used), i + 1);
  }
  e.table->Release(f, O_RDWR);
  auto log = e.table->core().oplog.Pending(100);
  cr_assert_eq(log.size(), 21u);  // superseded entries stay until the drain skips them
  for (size_t i = 0; i + 1 < log.size(); i++) cr_assert_eq(e.table->drain_port().BeginPersist(log[i]).error(), ESTALE);
  auto last = e.table->drain_port().BeginPersist(log.back());
  cr_assert(last.has_value());
  cr_assert_eq(ReadAll(last->fd)[0], static_cast<char>('b' + 19));
  // An fsync with no write since seals nothing and copies nothing.
  cr_assert_eq(e.table->SyncSeal(f).value(), log.back().seq);
  cr_assert_leq(e.tier->Stats().used, 64u * 1024 + 8192);
}

// The copy a write makes of a pending version counts against the budget:
// with no room for it the write fails (ENOSPC here: the unit tier has no
// evictor and does not wait; EAGAIN with wait=false) and changes nothing,
// neither the sealed version nor the live bytes; once the drain has
// published the version, the same write needs no copy and goes through.
BOTH(copy_on_write_is_charged_to_the_budget) {
  Env e(k, 256 << 10);
  const std::string v1(160 << 10, 'a');
  uint64_t f = e.WriteFile(kRoot, "f", v1);
  auto l = e.table->core().oplog.Pending(10).at(0);
  cr_assert(e.table->Open(f, O_RDWR).has_value());
  auto w = e.table->Write(
      f, 0, 1, [&](int x) { return pwrite(x, "b", 1, 0); }, /*wait=*/false);
  cr_assert(!w.has_value(), "a write whose copy does not fit went through");
  cr_assert(w.error() == ENOSPC || w.error() == EAGAIN, "%d", w.error());
  cr_assert_leq(e.tier->Stats().used + e.tier->Stats().reserved, 256u << 10);
  auto src = e.table->drain_port().BeginPersist(l);
  cr_assert(src.has_value());
  cr_assert(ReadAll(src->fd) == v1, "the sealed version changed");
  cr_assert(e.table->drain_port().CompletePersist(l, ckpt::backend::Staged{"", v1.size(), 1, 2}, src->gen).has_value());
  src = {};
  w = e.table->Write(
      f, 0, 1, [&](int x) { return pwrite(x, "b", 1, 0); }, false);
  cr_assert(w.has_value(), "%d", w ? 0 : w.error());
  e.table->Release(f, O_RDWR);
}

BOTH(complete_marks_persisted_and_evict_frees) {
  Env e(k, 1 << 20);
  uint64_t f = e.WriteFile(kRoot, "f", std::string(300000, 'x'));
  auto l = e.table->core().oplog.Pending(10).at(0);
  auto src = e.table->drain_port().BeginPersist(l);
  cr_assert(src.has_value());
  // Nothing clean yet, but a drain is pending: writers should wait.
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kWait);
  ckpt::backend::Staged s;
  s.checksum_hi = 1;
  s.checksum_lo = 2;
  cr_assert(e.table->drain_port().CompletePersist(l, s, src->gen).has_value());
  cr_assert_eq(e.table->GetAttr(f)->state, DataState::kPersisted);
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), 0u);
  cr_assert_eq(e.table->DataStatistics().applied_seq, l.seq);
  uint64_t used = e.tier->Stats().used;
  cr_assert_gt(used, 0u);
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kFreed);
  cr_assert_eq(e.tier->Stats().used, 0u);
  cr_assert_eq(e.table->GetAttr(f)->state, DataState::kRemote);
  // With nothing to drain and nothing clean, waiting would never end.
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kHopeless);
}

// A shell's `>` opens the file, dup2s it to stdout and closes the first
// descriptor before a byte is written: that flush must not seal the empty
// file as a version (the backend would publish an empty `latest` first).
// The flush after the write seals; one with nothing new leaves it to release.
BOTH(flush_seals_only_what_was_written_since_the_open) {
  Env e(k);
  uint64_t ino = e.WriteFile(kRoot, "latest", "step_6\n");
  const size_t before = e.table->core().oplog.Pending(10).size();
  auto h = e.table->OpenHandle(ino, O_WRONLY | O_TRUNC);
  cr_assert(h.has_value());
  cr_assert(e.table->Flush(ino, O_WRONLY, h->gen).has_value());  // the redirect's first close
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), before,
               "an empty version was sealed at a flush with no write");
  cr_assert(e.table->Write(ino, 0, 7, [&](int x) { return pwrite(x, "step_7\n", 7, 0); }).has_value());
  cr_assert(e.table->Flush(ino, O_WRONLY, h->gen).has_value());
  auto log = e.table->core().oplog.Pending(10);
  cr_assert_eq(log.size(), before + 1, "the write was not sealed at the flush");
  e.table->Release(ino, O_WRONLY);
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), before + 1, "release sealed again");
  // touch: create, close with nothing written: sealed at release.
  auto t = e.table->Mknod(kRoot, "t", S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0});
  cr_assert(t.has_value());
  auto th = e.table->OpenHandle(t->ino, O_WRONLY);
  cr_assert(th.has_value());
  cr_assert(e.table->Flush(t->ino, O_WRONLY, th->gen).has_value());
  const size_t at_flush = e.table->core().oplog.Pending(20).size();
  e.table->Release(t->ino, O_WRONLY);
  cr_assert_eq(e.table->core().oplog.Pending(20).size(), at_flush + 1, "an empty new file was never sealed");
}

// close(2) returns after flush, not release: the last writer's flush seals,
// and a write through a handle that outlived it keeps that version.
BOTH(flush_of_last_writer_seals_and_later_writes_copy) {
  Env e(k);
  auto f = e.table->Mknod(kRoot, "f", S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0});
  cr_assert(f.has_value());
  uint64_t ino = f->ino;
  cr_assert(e.table->Open(ino, O_RDWR).has_value());
  cr_assert(e.table->Write(ino, 0, 3, [&](int x) { return pwrite(x, "abc", 3, 0); }).has_value());
  cr_assert(e.table->Flush(ino, O_RDONLY).has_value());  // a reader's close seals nothing
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), 0u);
  cr_assert(e.table->Flush(ino, O_RDWR).has_value());
  auto log = e.table->core().oplog.Pending(10);
  cr_assert_eq(log.size(), 1u);
  cr_assert_eq(log[0].version, 1u);
  cr_assert(e.table->Write(ino, 0, 1, [&](int x) { return pwrite(x, "X", 1, 0); }).has_value());
  auto src = e.table->drain_port().BeginPersist(log[0]);
  cr_assert(src.has_value());
  cr_assert_eq(ReadAll(src->fd), "abc");
  e.table->Release(ino, O_RDWR);  // the late write is sealed as version 2
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), 2u);
  cr_assert_eq(e.table->core().oplog.Pending(10).at(1).version, 2u);
}

BOTH(truncate_of_closed_file_seals) {
  Env e(k);
  uint64_t f = e.WriteFile(kRoot, "f", "abcdef");
  ckpt::fs::AttrChange c;
  c.to_set = ckpt::fs::kSetSize;
  c.size = 2;
  cr_assert(e.table->SetAttr(f, c).has_value());
  auto log = e.table->core().oplog.Pending(10);
  cr_assert_eq(log.size(), 2u);
  cr_assert(log[1].op == LogOp::kPersist);
  cr_assert_eq(log[1].version, 2u);
}

// ---- Start-up recovery (a daemon that died, a tier that vanished) ----

static std::string ReadFile(Env& e, uint64_t ino) {
  auto fd = e.table->Open(ino, O_RDONLY);
  cr_assert(fd.has_value(), "open: %d", fd ? 0 : fd.error());
  std::string s = ReadAll(*fd);
  e.table->Release(ino, O_RDONLY);
  return s;
}

// Open for rewriting when the daemon died: the file comes back as its last
// sealed version, never as the torn bytes written since.
Test(recovery, rewrite_cut_short_keeps_the_last_sealed_version) {
  Env e(KvKind::kRocks);
  uint64_t f = e.WriteFile(kRoot, "ckpt.pt", "sealed bytes");
  auto fd = e.table->Open(f, O_WRONLY | O_TRUNC);  // rewrite begins, never closed
  cr_assert(fd.has_value());
  cr_assert(e.table->Write(f, 0, 4, [&](int x) { return pwrite(x, "torn", 4, 0); }).has_value());
  cr_assert(e.table->Flush(f, O_RDONLY).has_value());  // even a flush of the new size
  e.Open();                                            // the daemon dies and restarts
  auto r = e.table->Lookup(kRoot, "ckpt.pt");
  cr_assert(r.has_value());
  cr_assert_eq(r->size, 12u);
  cr_assert_eq(ReadFile(e, r->ino), "sealed bytes");
  // Its persist entry is still pending and drains those bytes.
  auto log = e.table->core().oplog.Pending(10);
  cr_assert_eq(log.size(), 1u);
  cr_assert_eq(ReadAll(e.table->drain_port().BeginPersist(log[0])->fd), "sealed bytes");
}

// Never closed: nothing was sealed, so nothing is promised; the file goes,
// listed as lost. A file the drain already persisted goes back to the
// backend's copy instead.
Test(recovery, never_closed_is_lost_persisted_rewrite_goes_remote) {
  Env e(KvKind::kRocks);
  uint64_t p = e.WriteFile(kRoot, "persisted", "in the backend");
  auto l = e.table->core().oplog.Pending(10).at(0);
  auto src = e.table->drain_port().BeginPersist(l);
  cr_assert(e.table->drain_port().CompletePersist(l, ckpt::backend::Staged{"", 14, 1, 2}, src->gen).has_value());
  cr_assert_eq(e.table->GetAttr(p)->state, DataState::kPersisted);
  auto fd = e.table->Open(p, O_RDWR);
  cr_assert(e.table->Write(p, 0, 2, [&](int x) { return pwrite(x, "XX", 2, 0); }).has_value());
  auto n = e.table->Mknod(kRoot, "new", S_IFREG | 0644, 0, Caller{});
  auto nfd = e.table->Open(n->ino, O_WRONLY);
  cr_assert(e.table->Write(n->ino, 0, 3, [&](int x) { return pwrite(x, "abc", 3, 0); }).has_value());
  (void)fd;
  (void)nfd;
  e.Open();
  auto pr = e.table->Lookup(kRoot, "persisted");
  cr_assert_eq(pr->state, DataState::kRemote);
  cr_assert_eq(pr->size, 14u);
  cr_assert_eq(e.table->Lookup(kRoot, "new").error(), ENOENT);
  auto lost = e.table->core().oplog.LostFiles();
  cr_assert_eq(lost.size(), 1u);
  cr_assert_str_eq(lost[0].c_str(), "new");
}

// A node reboot wipes the tier: persisted files come back from the
// backend, sealed but unpersisted ones are lost and listed, never served.
Test(recovery, tier_wiped_persisted_remote_pending_lost) {
  Env e(KvKind::kRocks);
  uint64_t p = e.WriteFile(kRoot, "old", "persisted");
  auto l = e.table->core().oplog.Pending(10).at(0);
  auto src = e.table->drain_port().BeginPersist(l);
  cr_assert(e.table->drain_port().CompletePersist(l, ckpt::backend::Staged{"", 9, 1, 2}, src->gen).has_value());
  uint64_t d = e.Mkdir(kRoot, "step_2");
  e.WriteFile(d, "model.pt", "not yet drained");
  src.value().ref.reset();
  e.table.reset();
  e.tier.reset();
  std::filesystem::remove_all(e.dir + "/tier");
  e.Open();
  cr_assert_eq(e.table->GetAttr(p)->state, DataState::kRemote);
  cr_assert(e.table->Lookup(kRoot, "step_2").has_value());
  auto sd = e.table->Lookup(kRoot, "step_2");
  cr_assert_eq(e.table->Lookup(sd->ino, "model.pt").error(), ENOENT);
  auto lost = e.table->core().oplog.LostFiles();
  cr_assert_eq(lost.size(), 1u);
  cr_assert_str_eq(lost[0].c_str(), "step_2/model.pt");
  // The log still holds the entry; its bytes are reported gone.
  auto log = e.table->core().oplog.Pending(10);
  auto it = std::find_if(log.begin(), log.end(), [](auto& x) { return x.op == LogOp::kPersist; });
  cr_assert(it != log.end());
  cr_assert_eq(e.table->drain_port().BeginPersist(*it).error(), ENODATA);
  // ... and the log ends with an unlink of the lost name, so an older copy
  // in the backend goes too (and it survives another restart).
  cr_assert(log.back().op == LogOp::kUnlink);
  cr_assert_str_eq(log.back().path.c_str(), "step_2/model.pt");
  e.Open();
  cr_assert(e.table->core().oplog.Pending(10).back().op == LogOp::kUnlink);
}

// The root names the backend uses for itself cannot be made through the mount.
Test(hardening, reserved_root_names_are_eperm) {
  Env e(KvKind::kMem);
  for (const char* n : {".ckptfs-tmp", ".ckptfs", ".ckptfs-probe-1"}) {
    auto r = e.table->Mkdir(kRoot, n, 0755, ckpt::fs::Caller{0, 0});
    cr_assert(!r.has_value() && r.error() == EPERM, "mkdir %s", n);
    r = e.table->Mknod(kRoot, n, S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0});
    cr_assert(!r.has_value() && r.error() == EPERM, "create %s", n);
  }
  uint64_t f = e.WriteFile(kRoot, "f", "x");
  auto rn = e.table->Rename(kRoot, "f", kRoot, ".ckptfs-tmp", 0);
  cr_assert(!rn.has_value() && rn.error() == EPERM);
  auto ln = e.table->Link(f, kRoot, ".ckptfs-tmp");
  cr_assert(!ln.has_value() && ln.error() == EPERM);
  // Below the root the name is an ordinary one.
  uint64_t d = e.Mkdir(kRoot, "d");
  cr_assert(e.table->Mkdir(d, ".ckptfs-tmp", 0755, ckpt::fs::Caller{0, 0}).has_value());
}

// Paths the backend cannot hold are refused when made, not found at drain.
Test(hardening, backend_path_limits_checked_at_create_and_rename) {
  Env e(KvKind::kMem);
  ckpt::fs::Limits l;
  l.max_path = 40;
  l.utf8_names = true;
  e.table->core().set_limits(l);
  uint64_t d = e.Mkdir(kRoot, "0123456789");                                                      // 10
  uint64_t sub = e.Mkdir(d, "0123456789");                                                        // 21
  e.WriteFile(sub, "0123456789", "x");                                                            // 32
  auto r = e.table->Mknod(sub, std::string(19, 'a'), S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0});  // 41
  cr_assert(!r.has_value() && r.error() == ENAMETOOLONG);
  cr_assert(e.table->Mknod(sub, std::string(18, 'a'), S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0}).has_value());
  // Renaming the directory to a longer name pushes its files past the limit.
  auto rn = e.table->Rename(kRoot, "0123456789", kRoot, "0123456789abcdef", 0);
  cr_assert(!rn.has_value() && rn.error() == ENAMETOOLONG);
  cr_assert(e.table->Rename(kRoot, "0123456789", kRoot, "x", 0).has_value());
  // S3 keys are UTF-8.
  auto bad = e.table->Mknod(kRoot, "caf\xe9", S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0});
  cr_assert(!bad.has_value() && bad.error() == EILSEQ);
  cr_assert(e.table->Mknod(kRoot, "caf\xc3\xa9", S_IFREG | 0644, 0, ckpt::fs::Caller{0, 0}).has_value());
}

// A POSIX backend (the default limits) holds paths of any length, as tmpfs
// does: PATH_MAX bounds one system call's path, relative to its working
// directory, and pjdfstest's */03.t make 4095-byte paths from a directory
// below the mount's root. Names stay within NAME_MAX.
Test(hardening, posix_paths_past_path_max) {
  Env e(KvKind::kMem);
  e.table->core().set_limits(ckpt::fs::Limits{});
  const Caller root{0, 0};
  uint64_t top = e.Mkdir(kRoot, "pjd");
  uint64_t d = top;
  for (int i = 0; i < 32; i++) d = e.Mkdir(d, std::string(255, static_cast<char>('a' + i % 26)));  // 8196 bytes
  uint64_t f = e.WriteFile(d, std::string(255, 'f'), "x");
  cr_assert(e.table->Mknod(d, std::string(255, 'p'), S_IFIFO | 0644, 0, root).has_value());
  cr_assert(e.table->Symlink(d, std::string(255, 's'), "test", root).has_value());
  cr_assert(e.table->Link(f, d, std::string(255, 'l')).has_value());
  cr_assert(e.table->Rename(d, std::string(255, 'f'), d, std::string(255, 'r'), 0).has_value());
  cr_assert(e.table->Rename(kRoot, "pjd", kRoot, std::string(255, 'q'), 0).has_value());  // the whole tree deeper
  cr_assert_eq(e.table->Mkdir(d, std::string(256, 'n'), 0755, root).error(), ENAMETOOLONG);
  bool logged = false;
  for (auto& l : e.table->core().oplog.Pending(1000)) logged |= l.op == LogOp::kLink && l.path2.size() > 8196;
  cr_assert(logged, "the link at its full path is in the drain log");
}

// --max-file-size: writes, truncates and fallocates past it are EFBIG.
Test(hardening, max_file_size_is_efbig) {
  Env e(KvKind::kMem);
  ckpt::fs::Limits l;
  l.max_file_size = 1 << 20;
  e.table->core().set_limits(l);
  uint64_t f = e.WriteFile(kRoot, "f", "x");
  ckpt::fs::AttrChange c;
  c.to_set = ckpt::fs::kSetSize;
  c.size = 100ull << 40;  // truncate -s 100T
  auto r = e.table->SetAttr(f, c);
  cr_assert(!r.has_value() && r.error() == EFBIG);
  c.size = 1 << 20;
  cr_assert(e.table->SetAttr(f, c).has_value());
  auto fd = e.table->Open(f, O_RDWR);
  cr_assert(fd.has_value());
  auto w = e.table->Write(f, (1 << 20) - 1, 2, [](int) -> ssize_t { return 2; });
  cr_assert(!w.has_value() && w.error() == EFBIG);
  auto fa = e.table->Fallocate(f, 0, 0, 2 << 20);
  cr_assert(!fa.has_value() && fa.error() == EFBIG);
  e.table->Release(f, O_RDWR);
}

// A parent-pointer cycle in the metadata is refused at load (it made every
// path walk loop and allocate without bound).
Test(hardening, parent_cycle_is_refused_at_load) {
  Env e(KvKind::kRocks);
  uint64_t a = e.Mkdir(kRoot, "a");
  uint64_t b = e.Mkdir(a, "b");
  e.WriteFile(b, "f", "x");
  auto ra = e.store->GetInode(a);
  cr_assert(ra.has_value());
  ckpt::meta::InodeRecord r = *ra;
  r.parent = b;  // a -> b -> a
  ckpt::meta::Batch batch;
  ckpt::meta::MetaStore::PutInode(&batch, r);
  cr_assert(e.store->Commit(batch, true).has_value());
  e.table.reset();
  auto t = std::make_unique<ckpt::fs::InodeTable>(e.store.get(), e.tier.get(), nullptr);
  auto st = t->Load(ckpt::fs::Caller{0, 0});
  cr_assert(!st.has_value(), "a cycle must be refused");
  cr_assert_eq(st.error(), EUCLEAN);
}

// Tier bytes of an inode the metadata does not know are kept in orphans/.
Test(hardening, unknown_tier_files_go_to_orphans) {
  Env e(KvKind::kRocks);
  e.WriteFile(kRoot, "f", "x");
  {
    auto fd = e.tier->Pin(0x777, true);
    cr_assert(fd.has_value());
    cr_assert_eq(pwrite(*fd, "orphan bytes", 12, 0), 12);
    e.tier->Unpin(0x777);
  }
  e.Open();
  cr_assert_not(e.tier->Has(0x777));
  cr_assert_eq(e.tier->Stats().orphans, 1u);
  cr_assert(std::filesystem::exists(e.dir + "/tier/orphans/0000000000000777"));
}

// A file deleted with its version still owed to the drain: its snapshot
// outlives the inode, also across a restart (it used to go to orphans/ as
// "unknown", and the drain then listed the file lost; found by the crash
// harness, seed 10610008).
Test(hardening, snapshot_of_a_deleted_file_survives_a_restart) {
  Env e(KvKind::kRocks);
  uint64_t f = e.WriteFile(kRoot, "f", "version one");
  cr_assert(e.table->Unlink(kRoot, "f").has_value());
  e.table->Forget(f, 1);
  const uint64_t key = ckpt::cache::SnapKey(f, 1);
  cr_assert(e.tier->Has(key), "moved aside for the drain");
  e.Open();
  cr_assert(e.tier->Has(key), "kept at start-up");
  cr_assert_eq(e.tier->Stats().orphans, 0u);
  auto log = e.table->core().oplog.Pending(10);
  cr_assert(!log.empty());
  bool found = false;
  for (auto& l : log)
    if (l.op == LogOp::kPersist && l.ino == f) {
      auto src = e.table->drain_port().BeginPersist(l);
      cr_assert(src.has_value(), "the drain finds the bytes: %d", src ? 0 : src.error());
      cr_assert_eq(src->size, 11u);
      found = true;
    }
  cr_assert(found);
}

// After one failed metadata write the mount is read-only for good (until a
// remount), says why, and still serves reads.
Test(hardening, failed_metadata_write_makes_the_mount_read_only) {
  Env e(KvKind::kMem);
  auto kv = std::make_unique<ckpt::test::FailingKv>(ckpt::meta::NewMemKv());
  ckpt::test::FailingKv* fk = kv.get();
  e.table.reset();
  e.store = std::make_unique<ckpt::meta::MetaStore>(std::move(kv));
  e.table = std::make_unique<ckpt::fs::InodeTable>(e.store.get(), e.tier.get(), nullptr);
  cr_assert(e.table->Load(ckpt::fs::Caller{0, 0}).has_value());
  uint64_t f = e.WriteFile(kRoot, "f", "kept");
  cr_assert(e.table->core().ReadOnlyReason().empty());
  fk->fail = true;
  auto r = e.table->Mkdir(kRoot, "d", 0755, ckpt::fs::Caller{0, 0});
  cr_assert(!r.has_value() && r.error() == EIO, "the failing write itself reports the error");
  fk->fail = false;  // the store would accept again: the mount stays read-only
  cr_assert_neq(e.table->core().ReadOnlyReason().find("read-only"), std::string::npos);
  r = e.table->Mkdir(kRoot, "d2", 0755, ckpt::fs::Caller{0, 0});
  cr_assert(!r.has_value() && r.error() == EROFS);
  auto w = e.table->Open(f, O_WRONLY);
  cr_assert(!w.has_value() && w.error() == EROFS);
  auto rd = e.table->Open(f, O_RDONLY);
  cr_assert(rd.has_value(), "reads go on");
  e.table->Release(f, O_RDONLY);
  cr_assert(!e.table->Unlink(kRoot, "f").has_value());
}

// The per-inode passthrough rules (docs/architecture.md, "Passthrough"):
// all handles of an inode or none; new writers only for O_TRUNC; the first
// file of a mount takes the copying path; a writer under passthrough
// readers copies the pending version aside and truncates the live file in
// place; what the kernel wrote is taken in at getattr and sealed at close.
BOTH(passthrough_handles) {
  Env e(k);
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  auto made = e.table->Mknod(kRoot, "first", S_IFREG | 0644, 0, Caller{});
  cr_assert(made.has_value());
  auto w0 = e.table->OpenHandle(made->ino, O_WRONLY | O_TRUNC);
  cr_assert(w0.has_value());
  cr_assert_eq(w0->backing_id, 0, "the first file of a mount: nothing says how large it will be");
  e.table->Release(made->ino, O_WRONLY, false);

  uint64_t f = e.WriteFile(kRoot, "f", std::string(4096, 'a'));  // sealed, pending in the log
  auto r1 = e.table->OpenHandle(f, O_RDONLY);
  auto r2 = e.table->OpenHandle(f, O_RDONLY);
  cr_assert(r1.has_value() && r2.has_value());
  cr_assert_gt(r1->backing_id, 0, "readers are passthrough");
  cr_assert_eq(r2->backing_id, r1->backing_id, "one backing id per inode");
  cr_assert_eq(*e.table->GetXattr(f, ckpt::fs::kIoXattr), "passthrough");
  auto w = e.table->OpenHandle(f, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value());
  cr_assert_eq(w->backing_id, r1->backing_id, "a writer beside passthrough readers must be one too");
  const uint64_t v1 = e.table->GetAttr(f)->version;
  cr_assert(e.tier->Has(ckpt::cache::SnapKey(f, v1)), "the pending version was copied aside");
  cr_assert_eq(e.table->GetAttr(f)->size, 0u, "truncated in place");
  // The kernel writes into the tier file.
  cr_assert_eq(pwrite(w->fd, "hello world", 11, 0), 11);
  cr_assert_eq(e.table->GetAttr(f)->size, 11u, "taken in at getattr");
  cr_assert(e.table->Flush(f, O_WRONLY).has_value());
  e.table->Release(f, O_WRONLY, true);
  cr_assert_gt(e.table->GetAttr(f)->version, v1, "sealed at close");
  e.table->Release(f, O_RDONLY, true);
  cr_assert_eq(fb.open.size(), 1u);
  e.table->Release(f, O_RDONLY, true);
  cr_assert(fb.open.empty(), "the backing id is closed with the last handle");
  cr_assert_eq(*e.table->GetXattr(f, ckpt::fs::kIoXattr), "closed");

  // r+ opens keep the copying path, and then so does a reader beside it.
  auto rw = e.table->OpenHandle(f, O_RDWR);
  cr_assert_eq(rw->backing_id, 0);
  auto r3 = e.table->OpenHandle(f, O_RDONLY);
  cr_assert_eq(r3->backing_id, 0);
  cr_assert_eq(*e.table->GetXattr(f, ckpt::fs::kIoXattr), "daemon");
  e.table->Release(f, O_RDONLY, false);
  e.table->Release(f, O_RDWR, false);
  // Two versions drain, in order; none is lost.
  auto log = e.table->core().oplog.Pending(100);
  size_t persists = 0;
  for (auto& l : log) persists += l.op == LogOp::kPersist && l.ino == f;
  cr_assert_geq(persists, 2u);
}

// The open that created a file (FUSE create) writes a new version from
// nothing with or without O_TRUNC (cp, tempfile, open(..., "xb")): a
// passthrough writer, into fresh pages (a spare stays a spare: its pages
// are all there, and a sparse file written into it would take them all).
// Not an O_APPEND writer, not an open that did not create the file, and
// not under memory pressure.
BOTH(created_writer_is_passthrough_without_a_spare) {
  Env e(k);
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  e.WriteFile(kRoot, "sealed", std::string(4096, 'a'));  // a size to expect
  e.table->core().residency.set_prealloc(1 << 20);
  cr_assert(e.tier->AddSpare(2 << 20, 0));
  const uint64_t spare = e.tier->Spares().first;
  cr_assert_gt(spare, 0u);
  auto made = e.table->Mknod(kRoot, "excl", S_IFREG | 0600, 0, Caller{});
  cr_assert(made.has_value());
  auto w = e.table->OpenHandle(made->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
  cr_assert(w.has_value());
  cr_assert_gt(w->backing_id, 0, "the writer of the file its open created");
  cr_assert_eq(e.tier->Spares().first, spare, "no spare adopted");
  cr_assert_eq(pwrite(w->fd, "hello", 5, 0), 5);
  cr_assert(e.table->Flush(made->ino, O_WRONLY).has_value());
  e.table->Release(made->ino, O_WRONLY, true);
  cr_assert_eq(e.table->GetAttr(made->ino)->size, 5u);

  auto again = e.table->OpenHandle(made->ino, O_WRONLY | O_CREAT);  // it exists now: an update in place
  cr_assert(again.has_value());
  cr_assert_eq(again->backing_id, 0);
  e.table->Release(made->ino, O_WRONLY, false);
  auto log = e.table->Mknod(kRoot, "log", S_IFREG | 0600, 0, Caller{});
  cr_assert(log.has_value());
  auto a = e.table->OpenHandle(log->ino, O_WRONLY | O_CREAT | O_APPEND, /*created=*/true);
  cr_assert(a.has_value());
  cr_assert_eq(a->backing_id, 0, "an O_APPEND writer keeps the copying path");
  e.table->Release(log->ino, O_WRONLY, false);
  // Under memory pressure: the copying path, where new writes can be made
  // to wait; a passthrough writer cannot be.
  e.table->core().residency.RelieveMemory(1 << 20, 64 << 20, "test");
  auto pressed = e.table->Mknod(kRoot, "pressed", S_IFREG | 0600, 0, Caller{});
  cr_assert(pressed.has_value());
  auto p = e.table->OpenHandle(pressed->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
  cr_assert(p.has_value());
  cr_assert_eq(p->backing_id, 0, "under memory pressure");
  e.table->Release(pressed->ino, O_WRONLY, false);
  e.table->core().residency.RelieveMemory(1ull << 40, 64 << 20, "test");
}

// What a passthrough writer wrote, as the spare thread sees it (the daemon
// sees none of its writes): a file grown by a MiB or more counts what it
// grew; one rewritten in place (its size set first) counts a MiB per
// change of its mtime; a log's small appends count once they add up.
BOTH(passthrough_writes_are_seen_by_their_files) {
  Env e(k);
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  e.WriteFile(kRoot, "sealed", std::string(4 << 20, 'a'));  // room expected for a new name
  auto made = e.table->Mknod(kRoot, "w", S_IFREG | 0600, 0, Caller{});
  cr_assert(made.has_value());
  auto w = e.table->OpenHandle(made->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
  cr_assert(w.has_value() && w->backing_id > 0);
  auto& pt = e.table->core().passthrough;
  const uint64_t start = pt.SampleWrites();
  const std::string mib(1 << 20, 'x');
  cr_assert_eq(pwrite(w->fd, mib.data(), mib.size(), 0), static_cast<ssize_t>(mib.size()));
  cr_assert_eq(pt.SampleWrites(), start + mib.size(), "a MiB written");
  cr_assert_eq(pwrite(w->fd, "line\n", 5, mib.size()), 5);
  cr_assert_eq(pt.SampleWrites(), start + mib.size(), "a log line alone is no move");
  cr_assert_eq(ftruncate(w->fd, 3 << 20), 0);  // the size set first, then filled in place
  const uint64_t grown = pt.SampleWrites();
  cr_assert_geq(grown, start + (3u << 20), "grown to 3 MiB by a truncate");
  const struct timespec long_ago[2] = {{1, 0}, {1, 0}};  // a kernel with coarse timestamps would give the
  cr_assert_eq(futimens(w->fd, long_ago), 0);            // truncate and the write the same mtime
  (void)pt.SampleWrites();                               // (the size is the same: that counts once)
  const uint64_t before = pt.SampleWrites();
  cr_assert_eq(pwrite(w->fd, mib.data(), mib.size(), 1 << 20), static_cast<ssize_t>(mib.size()));
  cr_assert_eq(pt.SampleWrites(), before + (1u << 20), "a write in place counts a MiB");
  cr_assert_eq(pt.SampleWrites(), before + (1u << 20), "nothing since");
  // A checkpoint-sized file: its writer, paused or storing through a
  // mapping, moves at every look.
  cr_assert_eq(ftruncate(w->fd, ckpt::fs::PassthroughFiles::kNeverIdle), 0);
  const uint64_t big = pt.SampleWrites();
  cr_assert_eq(pt.SampleWrites(), big + ckpt::fs::Residency::kMovedBytes, "a checkpoint's writer taken for idle");
  e.table->Release(made->ino, O_WRONLY, true);
}

// The kernel writes for a passthrough writer without asking: eight ranks
// opening their shards at once must not each be admitted against the same
// free room. Those admitted before count with what they are expected to
// write still; their close gives the room back.
BOTH(passthrough_writers_admitted_at_once_fit_the_budget_together) {
  Env e(k);
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  const uint64_t shard = 16ull << 20;
  e.WriteFile(kRoot, "step1", std::string(shard, 'a'));  // each shard is expected this large
  std::vector<uint64_t> admitted, copying;
  for (int r = 0; r < 8; r++) {
    auto made = e.table->Mknod(kRoot, "rank" + std::to_string(r), S_IFREG | 0600, 0, Caller{});
    cr_assert(made.has_value());
    auto w = e.table->OpenHandle(made->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
    cr_assert(w.has_value());
    (w->backing_id > 0 ? admitted : copying).push_back(made->ino);
  }
  const uint64_t budget = e.tier->Stats().budget;
  cr_assert_geq(admitted.size(), 1u, "the first rank writes through passthrough");
  cr_assert_leq(shard * (1 + admitted.size()), budget, "%zu writers of %llu MiB admitted into %llu MiB",
                admitted.size(), static_cast<unsigned long long>(shard >> 20),
                static_cast<unsigned long long>(budget >> 20));
  // Writers left open that write nothing (a log kept open) stop holding
  // the room they were expected to fill after the save gap, as the spare
  // thread's look (SampleWrites) sees it; what they wrote they still hold.
  // A gap of 1 s: a stall under 500 ms leaves the look fresh.
  e.table->core().residency.set_save_gap(std::chrono::milliseconds(1000));
  auto& pt = e.table->core().passthrough;
  auto open_new = [&](const std::string& name) {
    auto made = e.table->Mknod(kRoot, name, S_IFREG | 0600, 0, Caller{});
    cr_assert(made.has_value());
    auto w = e.table->OpenHandle(made->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
    cr_assert(w.has_value());
    const bool pt_writer = w->backing_id > 0;
    e.table->Release(made->ino, O_WRONLY, pt_writer);
    return pt_writer;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  cr_assert(!open_new("stale_look"), "no look for half the gap: the writers are taken to be writing");
  const std::string wrote(2 * shard, 'w');  // the first rank wrote twice what was expected
  int fd0 = *e.tier->Pin(admitted[0], false);
  cr_assert_eq(pwrite(fd0, wrote.data(), wrote.size(), 0), static_cast<ssize_t>(wrote.size()));
  (void)pt.SampleWrites();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  (void)pt.SampleWrites();  // nothing moved since
  cr_assert(!open_new("beside_written"), "the bytes an idle writer wrote were taken as free");
  cr_assert_eq(ftruncate(fd0, 0), 0);
  e.tier->Unpin(admitted[0]);
  (void)pt.SampleWrites();
  cr_assert(open_new("beside_idle"), "writers idle for the gap still held the room they were expected to fill");
  for (uint64_t ino : copying) e.table->Release(ino, O_WRONLY, false);
  for (uint64_t ino : admitted) e.table->Release(ino, O_WRONLY, true);  // wrote nothing: room given back
  auto late = e.table->Mknod(kRoot, "late", S_IFREG | 0600, 0, Caller{});
  cr_assert(late.has_value());
  auto w = e.table->OpenHandle(late->ino, O_WRONLY | O_CREAT | O_EXCL, /*created=*/true);
  cr_assert(w.has_value());
  cr_assert_gt(w->backing_id, 0, "admitted again once the others closed");
  e.table->Release(late->ino, O_WRONLY, true);
}
