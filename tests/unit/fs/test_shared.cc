// test_shared.cc — the shared namespace (fs/core/shared.cc): two tables, each
// with its own store and tier ("nodes" A and B), over one POSIX backend
// directory. A drains with a Drainer; B's drain is started only where a
// test says, so B's removals stay pending in its log meanwhile.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "fs/drain/drain.h"
#include "tests/unit/fs/helpers.h"

using ckpt::test::Env;
using ckpt::test::KvKind;
namespace backend = ckpt::backend;
namespace stdfs = std::filesystem;
using ckpt::meta::DataState;
constexpr uint64_t kRoot = ckpt::meta::kRootIno;
// Long, so that no busy machine passes it between two steps of a test
// (100 ms did: CI); PastTtl moves the namespace's clock past it instead.
constexpr auto kTtl = std::chrono::seconds(30);

namespace {

struct Node {
  std::unique_ptr<Env> env;
  std::unique_ptr<ckpt::fs::Drainer> drainer;
  backend::Backend* be;
  explicit Node(backend::Backend* b) : be(b) {
    env = std::make_unique<Env>(KvKind::kRocks, 64ull << 20, b);
    env->table->shared_ns().set_ttl(kTtl);
  }
  ~Node() {
    if (drainer) drainer->Stop();
  }
  ckpt::fs::InodeTable& t() { return *env->table; }
  void StartDrain() {
    if (drainer) return;
    drainer = std::make_unique<ckpt::fs::Drainer>(&env->table->drain_port(), be, 2);
    drainer->Start();
  }
  void Drain() {
    StartDrain();
    uint64_t head = t().DataStatistics().head_seq;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (t().DataStatistics().applied_seq < head) {
      cr_assert(std::chrono::steady_clock::now() < until, "drain timed out");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // The file's bytes as an open would serve them (fetched if remote).
  std::string Read(uint64_t ino) {
    auto fd = t().Open(ino, O_RDONLY);
    cr_assert(fd.has_value(), "open ino %lu: %d", ino, fd ? 0 : fd.error());
    struct stat st;
    cr_assert_eq(fstat(*fd, &st), 0);
    std::string s(static_cast<size_t>(st.st_size), '\0');
    cr_assert_eq(pread(*fd, s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
    t().Release(ino, O_RDONLY);
    return s;
  }
  std::vector<std::string> Names(uint64_t dir) {
    auto ls = t().ListDir(dir);
    cr_assert(ls.has_value());
    std::vector<std::string> v;
    for (auto& e : *ls)
      if (e.name != "." && e.name != "..") v.push_back(e.name);
    return v;
  }
};

struct Cluster {
  std::string root;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<Node> a, b;
  Cluster() {
    char tmpl[] = "/tmp/ckpt-shared-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    root = tmpl;
    auto p = backend::OpenPosixBackend(root);
    cr_assert(p.has_value());
    be = std::move(*p);
    cr_assert(be->Check().has_value());
    a = std::make_unique<Node>(be.get());
    b = std::make_unique<Node>(be.get());
  }
  ~Cluster() {
    a.reset();
    b.reset();
    stdfs::remove_all(root);
  }
  bool InBackend(const std::string& rel) { return stdfs::exists(stdfs::symlink_status(root + "/" + rel)); }
  // Node A makes DIR (under the root) with FILE in it and drains both to
  // the backend; returns DIR's inode on A.
  uint64_t DrainedOnA(const char* dir, const char* file, const std::string& bytes) {
    uint64_t d = a->env->Mkdir(kRoot, dir);
    a->env->WriteFile(d, file, bytes);
    a->Drain();
    return d;
  }
};

void PastTtl() { ckpt::fs::SharedNamespace::AdvanceClockForTest(kTtl + std::chrono::milliseconds(20)); }

}  // namespace

// A's files reach B by lookup and by readdir; B's removal of names only
// the backend gave it is applied to the backend in log order, and until
// then the backend's copies never come back on B; A, whose copies are
// clean, loses them after the TTL.
Test(shared, lookup_readdir_and_removal_across_nodes) {
  Cluster c;
  Node& a = *c.a;
  Node& b = *c.b;
  uint64_t step = a.env->Mkdir(kRoot, "global_step1");
  a.env->WriteFile(step, "shard_A", std::string(5000, 'a'));
  a.env->WriteFile(kRoot, "latest", "global_step1");
  a.Drain();

  // Nothing on B yet: its first lookup asks the backend.
  cr_assert(b.t().shared_ns().LookupNeedsBackend(kRoot, "latest"));
  auto latest = b.t().shared_ns().Lookup(kRoot, "latest");
  cr_assert(latest.has_value(), "B lookup latest: %d", latest ? 0 : latest.error());
  cr_expect_eq(latest->state, DataState::kRemote);
  cr_expect_eq(b.Read(latest->ino), "global_step1");
  cr_expect(!b.t().shared_ns().LookupNeedsBackend(kRoot, "latest"), "asked again within the TTL");
  // A miss is remembered for the TTL.
  cr_expect_eq(b.t().shared_ns().Lookup(kRoot, "nothing").error(), ENOENT);
  cr_expect(!b.t().shared_ns().LookupNeedsBackend(kRoot, "nothing"));
  PastTtl();
  cr_expect(b.t().shared_ns().LookupNeedsBackend(kRoot, "nothing"));

  // readdir: the step's directory and its shard, merged in.
  cr_assert(b.t().shared_ns().MergeDue(kRoot));
  b.t().shared_ns().MergeDir(kRoot);
  cr_expect(!b.t().shared_ns().MergeDue(kRoot));
  auto bstep = b.t().Lookup(kRoot, "global_step1");
  cr_assert(bstep.has_value());
  b.t().shared_ns().MergeDir(bstep->ino);
  cr_assert(b.Names(bstep->ino) == std::vector<std::string>{"shard_A"});

  // B rotates the step away; its drain is not running: pending.
  cr_assert(b.t().Unlink(bstep->ino, "shard_A").has_value());
  cr_assert(b.t().Rmdir(kRoot, "global_step1").has_value());
  PastTtl();
  cr_assert(c.InBackend("global_step1/shard_A"));
  cr_expect_eq(b.t().shared_ns().Lookup(kRoot, "global_step1").error(), ENOENT);
  b.t().shared_ns().MergeDir(kRoot);
  cr_expect(b.Names(kRoot) == std::vector<std::string>{"latest"}, "the step came back on B");
  b.Drain();
  cr_expect(!c.InBackend("global_step1"), "B's rmdir not applied to the backend");

  // A held the step persisted and clean: after the TTL it is gone there too.
  PastTtl();
  auto astep = a.t().Lookup(kRoot, "global_step1");
  cr_assert(astep.has_value());
  a.t().Forget(astep->ino, 1);
  cr_expect_eq(a.t().shared_ns().Lookup(kRoot, "global_step1").error(), ENOENT);
  cr_expect(a.Names(kRoot) == std::vector<std::string>{"latest"});
}

// A clean file rewritten by another node is fetched again (the checksum
// tells even at the same size); a file with local changes is never.
Test(shared, revalidation_at_open_and_dirty_wins) {
  Cluster c;
  Node& a = *c.a;
  Node& b = *c.b;
  uint64_t fa = a.env->WriteFile(kRoot, "latest", "step-1");
  a.Drain();
  auto fb = b.t().shared_ns().Lookup(kRoot, "latest");
  cr_assert(fb.has_value());
  cr_assert_eq(b.Read(fb->ino), "step-1");
  cr_expect_eq(b.t().GetAttr(fb->ino)->state, DataState::kPersisted);

  a.env->Overwrite(fa, "step-2");  // the same size
  a.Drain();
  cr_expect(!b.t().shared_ns().RevalidateDue(fb->ino, O_RDONLY), "due within the TTL");
  PastTtl();
  cr_assert(b.t().shared_ns().RevalidateDue(fb->ino, O_RDONLY));
  cr_expect(!b.t().shared_ns().RevalidateDue(fb->ino, O_WRONLY | O_TRUNC), "an O_TRUNC open needs no check");
  b.t().shared_ns().RevalidateForOpen(fb->ino, O_RDONLY);
  cr_expect_eq(b.t().GetAttr(fb->ino)->state, DataState::kRemote);
  cr_expect(b.t().shared_ns().TakeBackendChanged(fb->ino));
  cr_expect(!b.t().shared_ns().TakeBackendChanged(fb->ino), "said once");
  cr_expect_eq(b.Read(fb->ino), "step-2");

  // B changes it (its drain stopped: dirty); A's newer copy does not win.
  b.env->Overwrite(fb->ino, "b-own-bytes");
  a.env->Overwrite(fa, "step-3-longer");
  a.Drain();
  PastTtl();
  cr_expect(!b.t().shared_ns().RevalidateDue(fb->ino, O_RDONLY));
  b.t().shared_ns().RevalidateForOpen(fb->ino, O_RDONLY);
  auto r = b.t().shared_ns().Lookup(kRoot, "latest");
  cr_assert(r.has_value());
  cr_expect_eq(r->state, DataState::kDirty);
  cr_expect_eq(b.Read(fb->ino), "b-own-bytes");
  b.t().shared_ns().MergeDir(kRoot);
  cr_expect_eq(b.Read(fb->ino), "b-own-bytes");
}

// Names under a memory-only checkpoint are never asked of the backend nor
// merged from it, and the shared namespace off (TTL 0) asks nothing.
Test(shared, memory_only_checkpoints_and_ttl_zero) {
  Cluster c;
  Node& b = *c.b;
  ckpt::fs::CheckpointPolicy p;
  p.pattern = std::regex(R"(global_step\d+)");
  p.persist_every = 2;  // checkpoint 1 stays in memory
  b.t().set_checkpoint_policy(p);
  stdfs::create_directories(c.root + "/global_step1");
  std::ofstream(c.root + "/global_step1/extra") << "from elsewhere";
  std::ofstream(c.root + "/other") << "x";
  uint64_t step = b.env->Mkdir(kRoot, "global_step1");
  cr_assert(b.t().GetAttr(step)->memory_only);
  cr_expect(!b.t().shared_ns().LookupNeedsBackend(step, "extra"));
  cr_expect_eq(b.t().shared_ns().Lookup(step, "extra").error(), ENOENT);
  cr_expect(!b.t().shared_ns().MergeDue(step));
  b.t().shared_ns().MergeDir(step);
  cr_expect(b.Names(step).empty());

  b.t().shared_ns().set_ttl(std::chrono::milliseconds(0));
  cr_expect(!b.t().shared_ns().enabled());
  cr_expect(!b.t().shared_ns().LookupNeedsBackend(kRoot, "other"));
  cr_expect_eq(b.t().shared_ns().Lookup(kRoot, "other").error(), ENOENT);
  b.t().shared_ns().MergeDir(kRoot);
  cr_expect(b.Names(kRoot) == std::vector<std::string>{"global_step1"});
}

// A directory renamed here with the rename still pending: the backend holds
// its files under the old name only, yet nothing under the new name is
// dropped or re-fetched, and the old name does not come back.
Test(shared, pending_rename_of_a_directory_keeps_its_files) {
  Cluster c;
  Node& a = *c.a;
  Node& b = *c.b;
  uint64_t d = a.env->Mkdir(kRoot, "d");
  a.env->WriteFile(d, "f", "bytes-of-f");
  a.Drain();
  auto bd = b.t().shared_ns().Lookup(kRoot, "d");
  cr_assert(bd.has_value());
  b.t().shared_ns().MergeDir(bd->ino);
  auto bf = b.t().shared_ns().Lookup(bd->ino, "f");
  cr_assert(bf.has_value());
  cr_assert_eq(b.Read(bf->ino), "bytes-of-f");
  cr_assert(b.t().Rename(kRoot, "d", kRoot, "e", 0).has_value());  // B's drain is not running
  PastTtl();
  cr_assert(c.InBackend("d/f") && !c.InBackend("e"));
  auto again = b.t().shared_ns().Lookup(bd->ino, "f");
  cr_assert(again.has_value(), "f dropped under the renamed directory: %d", again ? 0 : again.error());
  cr_expect_eq(again->ino, bf->ino);
  b.t().shared_ns().RevalidateForOpen(bf->ino, O_RDONLY);
  cr_expect_eq(b.t().GetAttr(bf->ino)->state, DataState::kPersisted);
  b.t().shared_ns().MergeDir(bd->ino);
  b.t().shared_ns().MergeDir(kRoot);
  cr_expect(b.Names(kRoot) == std::vector<std::string>{"e"}, "the old name came back, or the new one went");
  cr_expect(b.Names(bd->ino) == std::vector<std::string>{"f"});
  b.Drain();
  cr_expect(c.InBackend("e/f") && !c.InBackend("d"));
}

// A miss in a small directory lists it: the listing brings the names the
// other node drained there and answers every later miss in it for the TTL
// without asking the backend (a checkpoint's shards are created one after
// another: one listing, not a Stat per shard). A directory the backend
// does not hold yet answers its misses the same way. Past the TTL the
// backend is asked again, and sees what was drained meanwhile.
Test(shared, a_miss_lists_a_small_directory_once_per_ttl) {
  Cluster c;
  Node& a = *c.a;
  Node& b = *c.b;
  uint64_t step = c.DrainedOnA("step_1", "shard_0", std::string(1000, '0'));

  auto bstep = b.t().shared_ns().Lookup(kRoot, "step_1");
  cr_assert(bstep.has_value());
  cr_assert(b.t().shared_ns().LookupNeedsBackend(bstep->ino, "shard_1"));
  cr_expect_eq(b.t().shared_ns().Lookup(bstep->ino, "shard_1").error(), ENOENT);
  for (int i = 2; i < 50; i++)
    cr_expect(!b.t().shared_ns().LookupNeedsBackend(bstep->ino, "shard_" + std::to_string(i)),
              "shard_%d asks the backend", i);
  cr_expect(b.t().Lookup(bstep->ino, "shard_0").has_value(), "the listing did not bring A's shard");
  cr_expect(!b.t().shared_ns().MergeDue(bstep->ino), "the miss's listing counts as the directory's merge");

  // Drained by A after B's listing: unseen for at most the TTL.
  a.env->WriteFile(step, "shard_9", std::string(1000, '9'));
  a.Drain();
  cr_expect_eq(b.t().shared_ns().Lookup(bstep->ino, "shard_9").error(), ENOENT);
  PastTtl();
  cr_expect(b.t().shared_ns().LookupNeedsBackend(bstep->ino, "shard_9"));
  auto s9 = b.t().shared_ns().Lookup(bstep->ino, "shard_9");
  cr_assert(s9.has_value(), "shard_9 unseen past the TTL");
  cr_expect_eq(b.Read(s9->ino), std::string(1000, '9'));

  // Opens past the TTL compare clean files with the backend: the first
  // lists the directory, which compares its siblings too.
  PastTtl();
  auto s0 = b.t().Lookup(bstep->ino, "shard_0");
  cr_assert(s0.has_value());
  cr_assert(b.t().shared_ns().RevalidateDue(s0->ino, O_RDONLY));
  cr_assert(b.t().shared_ns().RevalidateDue(s9->ino, O_RDONLY));
  b.t().shared_ns().RevalidateForOpen(s0->ino, O_RDONLY);
  cr_expect(!b.t().shared_ns().RevalidateDue(s0->ino, O_RDONLY));
  cr_expect(!b.t().shared_ns().RevalidateDue(s9->ino, O_RDONLY), "the open of shard_0 did not list the directory");

  // B's own new directory, not in the backend: its misses are answered too.
  uint64_t mine = b.env->Mkdir(kRoot, "step_2");
  cr_expect_eq(b.t().shared_ns().Lookup(mine, "shard_0").error(), ENOENT);
  cr_expect(!b.t().shared_ns().LookupNeedsBackend(mine, "shard_1"),
            "a miss in a directory the backend lacks asks it again");
}
