// test_namespace.cc — Namespace on its own (fs/core/namespace.h): the inode
// map, the tree's queries (child, directory, ancestor, paths, the longest
// path below a directory), inode numbers and the statistics, with no store,
// tier or log behind it.
#include <criterion/criterion.h>
#include <signal.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "fs/core/namespace.h"
#include "tree.h"

using ckpt::MutexLock;
using ckpt::meta::kRootIno;
using ckpt::test::Tree;
namespace fs = ckpt::fs;

Test(namespace_, find_child_and_dir) {
  Tree t;
  uint64_t a = t.Add(kRootIno, "a", S_IFDIR | 0755);
  uint64_t f = t.Add(a, "f.pt", S_IFREG | 0644, 10);
  MutexLock lk(&t.ns.mu());
  cr_assert_eq(t.ns.Find(f)->rec.name, "f.pt");
  cr_assert_null(t.ns.Find(f + 100));
  auto d = t.ns.FindDir(a);
  cr_assert(d.has_value());
  auto c = t.ns.Child(*d, "f.pt");
  cr_assert(c.has_value());
  cr_assert_eq((*c)->rec.ino, f);
  auto missing = t.ns.Child(*d, "nope");
  cr_assert(!missing.has_value());
  cr_assert_eq(missing.error(), ENOENT);
  auto notdir = t.ns.FindDir(f);
  cr_assert(!notdir.has_value());
  cr_assert_eq(notdir.error(), ENOTDIR);
  auto gone = t.ns.FindDir(f + 100);
  cr_assert_eq(gone.error(), ENOENT);
}

Test(namespace_, paths) {
  Tree t;
  uint64_t a = t.Add(kRootIno, "step-100", S_IFDIR | 0755);
  uint64_t b = t.Add(a, "rank0", S_IFDIR | 0755);
  MutexLock lk(&t.ns.mu());
  cr_assert_eq(t.ns.DirPath(kRootIno), "");
  cr_assert_eq(t.ns.DirPath(a), "step-100");
  cr_assert_eq(t.ns.DirPath(b), "step-100/rank0");
  cr_assert_eq(t.ns.EntryPath(b, "model.pt"), "step-100/rank0/model.pt");
  cr_assert_eq(t.ns.EntryPath(kRootIno, "latest"), "latest");
}

Test(namespace_, ancestors) {
  Tree t;
  uint64_t a = t.Add(kRootIno, "a", S_IFDIR | 0755);
  uint64_t b = t.Add(a, "b", S_IFDIR | 0755);
  uint64_t c = t.Add(kRootIno, "c", S_IFDIR | 0755);
  MutexLock lk(&t.ns.mu());
  cr_assert(t.ns.IsAncestor(a, b));
  cr_assert(t.ns.IsAncestor(b, b), "an inode counts as its own ancestor (rename into itself)");
  cr_assert(t.ns.IsAncestor(kRootIno, b));
  cr_assert_not(t.ns.IsAncestor(b, a));
  cr_assert_not(t.ns.IsAncestor(c, b));
}

// A chain deeper than the walk's old bound (100000 steps, then abort()):
// any user who can make directories could build it with renames and take
// the mount down. Now it is walked to the root, as deep as it is.
Test(namespace_, ancestors_of_a_very_deep_directory) {
  Tree t;
  uint64_t top = t.Add(kRootIno, "d", S_IFDIR | 0755), d = top;
  for (int i = 0; i < 100050; i++) d = t.Add(d, "d", S_IFDIR | 0755);
  uint64_t c = t.Add(kRootIno, "c", S_IFDIR | 0755);
  MutexLock lk(&t.ns.mu());
  cr_assert(t.ns.IsAncestor(top, d));
  cr_assert(t.ns.IsAncestor(kRootIno, d));
  cr_assert_not(t.ns.IsAncestor(c, d));
}

Test(namespace_, longest_path_below_a_directory) {
  Tree t;
  uint64_t a = t.Add(kRootIno, "a", S_IFDIR | 0755);
  cr_assert_eq(
      [&] {
        MutexLock lk(&t.ns.mu());
        return t.ns.SubtreePathLen(t.ns.Find(a));
      }(),
      0u);
  uint64_t bb = t.Add(a, "bb", S_IFDIR | 0755);
  t.Add(bb, "file-name", S_IFREG | 0644);          // "bb/file-name": 12
  t.Add(a, "a-much-longer-name", S_IFREG | 0644);  // 18
  MutexLock lk(&t.ns.mu());
  cr_assert_eq(t.ns.SubtreePathLen(t.ns.Find(a)), 18u);
  cr_assert_eq(t.ns.SubtreePathLen(t.ns.Find(bb)), 9u);
}

Test(namespace_, numbers_are_never_reused) {
  Tree t;
  MutexLock lk(&t.ns.mu());
  uint64_t first = t.ns.next_ino();
  cr_assert_eq(first, kRootIno + 1);
  t.ns.ReserveUpTo(50);
  cr_assert_eq(t.ns.next_ino(), 50u);
  t.ns.ReserveUpTo(10);  // never lowers
  cr_assert_eq(t.ns.next_ino(), 50u);
  auto n = std::make_unique<fs::Inode>();
  n->rec.ino = 70;  // recovery inserts the numbers the store holds
  t.ns.Insert(std::move(n));
  cr_assert_eq(t.ns.TakeIno(), 71u, "an inserted number moves the next one past it");
  t.ns.Erase(70);
  cr_assert_null(t.ns.Find(70));
  cr_assert_eq(t.ns.next_ino(), 72u, "an erased number is not given again");
}

Test(namespace_, inserting_a_number_twice_aborts, .signal = SIGABRT) {
  Tree t;
  MutexLock lk(&t.ns.mu());
  auto n = std::make_unique<fs::Inode>();
  n->rec.ino = kRootIno;
  t.ns.Insert(std::move(n));
}

Test(namespace_, an_entry_without_its_inode_aborts, .signal = SIGABRT) {
  Tree t;
  MutexLock lk(&t.ns.mu());
  t.ns.Find(kRootIno)->children.emplace("ghost", 999);
  (void)t.ns.Child(t.ns.Find(kRootIno), "ghost");
}

Test(namespace_, stats) {
  Tree t;
  uint64_t a = t.Add(kRootIno, "a", S_IFDIR | 0755);
  t.Add(a, "x", S_IFREG | 0644, 100);
  t.Add(a, "y", S_IFREG | 0644, 23);
  t.Add(a, "l", S_IFLNK | 0777);
  fs::NamespaceStats s = t.ns.Stats();
  cr_assert_eq(s.inodes, 5u);
  cr_assert_eq(s.dirs, 2u);
  cr_assert_eq(s.files, 2u);
  cr_assert_eq(s.bytes, 123u);
}

// Stats takes the namespace lock itself: a reader beside writers that hold
// it sees whole trees only (TSan checks the rest).
Test(namespace_, stats_beside_writers) {
  Tree t;
  std::thread w([&] {
    for (int i = 0; i < 200; i++) t.Add(kRootIno, "f" + std::to_string(i), S_IFREG | 0644, 1);
  });
  for (int i = 0; i < 200; i++) {
    fs::NamespaceStats s = t.ns.Stats();
    cr_assert_eq(s.inodes, s.files + 1);
    cr_assert_eq(s.bytes, s.files);
  }
  w.join();
  cr_assert_eq(t.ns.Stats().files, 200u);
}
