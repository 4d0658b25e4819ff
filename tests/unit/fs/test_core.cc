// test_core.cc — Core (fs/core/core.h) and PassthroughFiles
// (fs/core/passthrough_files.h) on their own, over a real tier and a
// store in memory, started by Recover: a refused commit turns the core
// read-only for good; new names are checked against the backend's limits;
// lookups answer ".", ".." and too-long names; an inode nothing holds is
// deleted with its bytes; backend paths follow renames and removals;
// passthrough handles and writers are counted and a writer that does not
// fit the budget is refused the path.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "cache/tier.h"
#include "common/mutex.h"
#include "fs/core/core.h"
#include "fs/core/recovery.h"
#include "fs/meta/meta_store.h"
#include "helpers.h"

namespace fs = ckpt::fs;
namespace meta = ckpt::meta;
using ckpt::MutexLock;
using meta::MetaStore;
constexpr uint64_t kRootIno = meta::kRootIno;

namespace {

constexpr uint64_t M = 1 << 20;

// A Core over a store in memory and a tier of `budget` bytes, recovered
// (a root owned by root).
struct World {
  std::string dir;
  ckpt::test::FailingKv* kv = nullptr;
  std::unique_ptr<MetaStore> store;
  std::unique_ptr<ckpt::cache::Tier> tier;
  std::unique_ptr<fs::Core> core;

  explicit World(uint64_t budget = 64 * M) {
    char tmpl[] = "/dev/shm/ckpt-core-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    dir = tmpl;
    auto k = std::make_unique<ckpt::test::FailingKv>(ckpt::meta::NewMemKv());
    kv = k.get();
    store = std::make_unique<MetaStore>(std::move(k));
    auto t = ckpt::cache::Tier::Open(dir + "/tier", budget);
    cr_assert(t.has_value(), "open tier");
    tier = std::move(*t);
    core = std::make_unique<fs::Core>(store.get(), tier.get(), nullptr);
    cr_assert(fs::Recover(*core, fs::Caller{0, 0}, false).has_value(), "recover");
  }
  ~World() {
    core.reset();
    tier.reset();
    std::filesystem::remove_all(dir);
  }

  // Adds `name` under `parent` in memory and in the store; a regular file
  // gets `bytes` in its tier file.
  uint64_t Add(uint64_t parent, const std::string& name, uint32_t mode, const std::string& bytes = "") {
    MutexLock lk(&core->mu());
    auto n = std::make_unique<fs::Inode>();
    n->rec.ino = core->ns.TakeIno();
    n->rec.parent = parent;
    n->rec.name = name;
    n->rec.mode = mode;
    n->rec.nlink = S_ISDIR(mode) ? 2 : 1;
    n->rec.size = bytes.size();
    const uint64_t ino = n->rec.ino;
    meta::Batch b;
    MetaStore::PutInode(&b, n->rec);
    MetaStore::PutDentry(&b, parent, name, ino, fs::DirentType(mode));
    cr_assert(core->Commit(b).has_value());
    core->ns.Find(parent)->children.emplace(name, ino);
    core->ns.Insert(std::move(n));
    if (S_ISREG(mode)) {
      auto st = tier->Fill(ino, bytes.size(), [&](int fd) {
        return pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()) ? 0 : EIO;
      });
      cr_assert(st.has_value(), "tier file");
    }
    return ino;
  }
};

}  // namespace

// LevelDB's sticky background error: after one refused write every change
// is EROFS, with the reason kept, though the store would accept again.
Test(core, refused_commit_is_read_only_for_good) {
  World w;
  cr_assert(w.core->Writable().has_value());
  cr_assert(w.core->ReadOnlyReason().empty());
  w.kv->fail = true;
  {
    MutexLock lk(&w.core->mu());
    meta::Batch b;
    MetaStore::PutCounter(&b, meta::kNextInoCounter, 99);
    auto st = w.core->Commit(b);
    cr_assert(!st.has_value() && st.error() == EIO, "the refused write reports the store's error");
  }
  w.kv->fail = false;
  cr_assert_eq(w.core->Writable().error(), EROFS);
  cr_assert_neq(w.core->ReadOnlyReason().find("read-only"), std::string::npos);
}

Test(core, new_names_follow_the_backend_limits) {
  World w;
  const uint64_t d = w.Add(kRootIno, "dir", S_IFDIR | 0755);
  fs::Limits l;
  l.max_path = 12;
  l.utf8_names = true;
  w.core->set_limits(l);
  MutexLock lk(&w.core->mu());
  cr_assert_eq(w.core->CheckNewName(kRootIno, ".ckptfs-tmp").error(), EPERM, "reserved at the root");
  cr_assert(w.core->CheckNewName(d, ".ckptfs-tmp").has_value() == false, "12 bytes: dir/.ckptfs-tmp is 15");
  cr_assert(w.core->CheckNewName(d, "abcdefgh").has_value(), "dir/abcdefgh: 12 bytes");
  cr_assert_eq(w.core->CheckNewName(d, "abcdefghi").error(), ENAMETOOLONG);
  cr_assert_eq(w.core->CheckNewName(kRootIno, "abc", 9).error(), ENAMETOOLONG, "a subtree below counts");
  cr_assert_eq(w.core->CheckNewName(kRootIno, std::string("\xc0\xaf", 2)).error(), EILSEQ, "an overlong form");
}

Test(core, lookup_answers_dot_dotdot_and_long_names) {
  World w;
  const uint64_t d = w.Add(kRootIno, "dir", S_IFDIR | 0755);
  const uint64_t f = w.Add(d, "f", S_IFREG | 0644, "x");
  MutexLock lk(&w.core->mu());
  cr_assert_eq((*w.core->Lookup(d, "."))->rec.ino, d);
  cr_assert_eq((*w.core->Lookup(d, ".."))->rec.ino, kRootIno);
  cr_assert_eq((*w.core->Lookup(d, "f"))->rec.ino, f);
  cr_assert_eq(w.core->Lookup(d, "g").error(), ENOENT);
  cr_assert_eq(w.core->Lookup(d, std::string(256, 'a')).error(), ENAMETOOLONG);
  cr_assert_eq(w.core->Lookup(f, "x").error(), ENOTDIR);
}

Test(core, an_inode_nothing_holds_goes_with_its_bytes) {
  World w;
  const uint64_t f = w.Add(kRootIno, "f", S_IFREG | 0644, "bytes");
  MutexLock lk(&w.core->mu());
  fs::Inode* n = w.core->Find(f);
  n->nlookup = 1;
  n->rec.nlink = 0;
  w.core->MaybeDelete(n);
  cr_assert_not_null(w.core->Find(f), "the kernel still holds a lookup");
  n->nlookup = 0;
  w.core->MaybeDelete(n);
  cr_assert_null(w.core->Find(f));
  cr_assert_not(w.tier->Has(f), "its tier file went with it");
  cr_assert_not(w.store->GetInode(f).has_value(), "and its record");
}

Test(core, backend_paths_follow_renames_and_removals) {
  World w;
  const uint64_t d = w.Add(kRootIno, "d", S_IFDIR | 0755);
  const uint64_t a = w.Add(d, "a", S_IFREG | 0644, "1");
  const uint64_t b = w.Add(kRootIno, "b", S_IFREG | 0644, "2");
  MutexLock lk(&w.core->mu());
  w.core->SetBackendPath(w.core->Find(a), "d/a");
  w.core->SetBackendPath(w.core->Find(b), "b");
  meta::LogEntry mv;
  mv.op = meta::LogOp::kRename;
  mv.path = "d";
  mv.path2 = "e";
  w.core->ApplyToBackendPaths(mv);
  cr_assert_eq(w.core->Find(a)->backend_path, "e/a", "moved with its directory");
  w.core->SetBackendPath(w.core->Find(b), "e/a");  // b published over it
  cr_assert_eq(w.core->Find(a)->backend_path, "", "the older inode there was replaced");
  meta::LogEntry rm;
  rm.op = meta::LogOp::kUnlink;
  rm.path = "e/a";
  w.core->ApplyToBackendPaths(rm);
  cr_assert_eq(w.core->Find(b)->backend_path, "");
}

Test(passthrough_files, handles_and_writers_are_counted) {
  World w;
  ckpt::test::FakeBacking fb;
  fs::PassthroughFiles& pt = w.core->passthrough;
  cr_assert_not(pt.active());
  pt.set_backing(&fb);
  cr_assert(pt.active());
  const uint64_t f = w.Add(kRootIno, "f", S_IFREG | 0644, "data");
  MutexLock lk(&w.core->mu());
  fs::Inode* n = w.core->Find(f);
  cr_assert(pt.Start(n, O_RDONLY).has_value());
  cr_assert(pt.Start(n, O_WRONLY).has_value());
  cr_assert_eq(fb.open.size(), 1u, "one backing file per inode");
  cr_assert_eq(pt.Opens().first, 2u);
  cr_assert_eq(pt.Opens().second, 1u);
  cr_assert_eq(pt.Writers().at(0), f);
  cr_assert_eq(n->pt_size, 4u, "the writer's start: the tier file's size");
  pt.End(n, O_WRONLY);
  cr_assert(pt.Writers().empty());
  cr_assert_eq(fb.open.size(), 1u, "a reader still holds it");
  pt.End(n, O_RDONLY);
  cr_assert(fb.open.empty(), "unregistered after the last handle");
  cr_assert_eq(n->backing_id, 0);
  cr_assert_eq(pt.Opens().first, 0u);
}

Test(passthrough_files, a_writer_must_fit_the_budget) {
  World w(16 * M);
  const uint64_t f = w.Add(kRootIno, "f", S_IFREG | 0644, "");
  MutexLock lk(&w.core->mu());
  fs::Inode* n = w.core->Find(f);
  fs::PassthroughFiles& pt = w.core->passthrough;
  cr_assert_not(pt.Room(n, true, UINT64_MAX), "nothing says how large a file is yet");
  n->rec.sealed_size = 8 * M;
  w.core->residency.Sealed(8 * M);
  cr_assert(pt.Room(n, true, UINT64_MAX), "8 MiB and an eighth of 16 fit in 16");
  cr_assert(pt.Room(n, true, 8 * M), "a file expected at the limit may be passthrough");
  cr_assert_not(pt.Room(n, true, 4 * M), "one expected past --max-file-size takes the copying path");
  cr_assert_eq(pt.Shortfall(n, true), 0u);
  n->rec.sealed_size = 15 * M;
  cr_assert_not(pt.Room(n, true, UINT64_MAX));
  cr_assert_eq(pt.Shortfall(n, true), 15 * M + 2 * M - 16 * M, "the version and an eighth, less what is free");
}
