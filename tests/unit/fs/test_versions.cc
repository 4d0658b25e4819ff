// test_versions.cc — VersionStore on its own (fs/core/versions.h), over a
// real tier and OpLog and a bare Namespace: a seal logs a persist entry and
// makes the version pending; copy-on-write is asked for only while a
// sealed version is pending with no snapshot; MoveAside keeps its bytes;
// a seal with nothing logged after the previous one supersedes it; a
// memory-only seal logs nothing; the persist entry names every link.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/tier.h"
#include "common/mutex.h"
#include "fs/core/versions.h"
#include "tree.h"

namespace fs = ckpt::fs;
namespace meta = ckpt::meta;
namespace cache = ckpt::cache;
using ckpt::MutexLock;
constexpr uint64_t kRootIno = meta::kRootIno;

namespace {

constexpr uint64_t M = 1 << 20;

// A tree, a tier, a log and the store over them.
struct World {
  ckpt::test::Tree t;
  std::string dir;
  std::unique_ptr<cache::Tier> tier;
  fs::OpLog log;
  std::unique_ptr<fs::Residency> res;
  std::unique_ptr<fs::VersionStore> v;

  World() {
    char tmpl[] = "/dev/shm/ckpt-versions-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    dir = tmpl;
    auto tr = cache::Tier::Open(dir + "/tier", 64 * M);
    cr_assert(tr.has_value(), "open tier");
    tier = std::move(*tr);
    res = std::make_unique<fs::Residency>(tier.get());
    v = std::make_unique<fs::VersionStore>(tier.get(), &log, res.get());
  }
  ~World() { std::filesystem::remove_all(dir); }

  // A regular file `name` at the root with `bytes` in its live tier file.
  fs::Inode* File(const std::string& name, const std::string& bytes) {
    uint64_t ino = t.Add(kRootIno, name, S_IFREG | 0644, bytes.size());
    auto fd = tier->Pin(ino, true);
    cr_assert(fd.has_value(), "tier pin");
    cr_assert_eq(pwrite(*fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    tier->Unpin(ino);
    MutexLock lk(&t.ns.mu());
    fs::Inode* n = t.ns.Find(ino);
    n->data_gen = 1;
    return n;
  }

  // Seals and publishes the entries, as InodeTable::SealNow does.
  uint64_t Seal(fs::Inode* n, bool memory_only = false) {
    MutexLock lk(&t.ns.mu());
    meta::Batch b;
    std::vector<meta::LogEntry> out;
    uint64_t dropped = v->Seal(t.ns, n, memory_only, &b, &out);
    log.Publish(std::move(out));
    v->Supersede(dropped, n->rec.ino, n->rec.version - 1);
    return dropped;
  }

  std::optional<meta::LogEntry> Head() {
    auto p = log.Pending(1);
    if (p.empty()) return std::nullopt;
    return p[0];
  }

  void Apply(uint64_t seq) {
    for (;;) {
      auto e = Head();
      if (!e || e->seq > seq) return;
      fs::OpLog::Due due;
      meta::Batch b;
      auto c = log.Complete(*e, fs::OpLog::Outcome::kApplied, "", &b, false);
      log.Finish(std::move(c), &due);
    }
  }
};

}  // namespace

Test(versions, a_seal_logs_the_version_and_makes_it_pending) {
  World w;
  fs::Inode* n = w.File("model.pt", "abc");
  cr_assert_not(w.v->SealPending(n));
  w.Seal(n);
  cr_assert_eq(n->rec.version, 1u);
  cr_assert_eq(n->sealed_gen, n->data_gen);
  cr_assert_eq(n->rec.state, meta::DataState::kDirty);
  cr_assert(w.v->SealPending(n));
  auto e = w.Head();
  cr_assert(e.has_value());
  cr_assert_eq(e->op, meta::LogOp::kPersist);
  cr_assert_eq(e->path, "model.pt");
  cr_assert_eq(e->version, 1u);
  cr_assert_eq(e->seq, n->seal_seq);
  w.Apply(n->seal_seq);
  cr_assert_not(w.v->SealPending(n), "applied: the backend holds it");
}

Test(versions, copy_on_write_only_for_a_pending_version_without_a_snapshot) {
  World w;
  fs::Inode* n = w.File("f", "0123456789");
  cr_assert_not(w.v->NeedsCopy(n), "never sealed");
  w.Seal(n);
  cr_assert(w.v->NeedsCopy(n), "pending, its bytes only in the live file");
  {
    MutexLock lk(&w.t.ns.mu());
    cr_assert(w.v->MoveAside(w.t.ns, n).has_value());
  }
  cr_assert(w.tier->Has(cache::SnapKey(n->rec.ino, n->rec.version)), "the version's bytes went to its snapshot");
  cr_assert_not(w.v->NeedsCopy(n), "a snapshot holds the version");
  n->data_gen++;  // a change after the seal
  cr_assert_not(w.v->NeedsCopy(n), "only the first change after a seal pays");
}

Test(versions, a_seal_with_nothing_logged_after_the_previous_supersedes_it) {
  World w;
  fs::Inode* n = w.File("ckpt.pt", "v1");
  w.Seal(n);
  uint64_t first = n->seal_seq;
  n->data_gen++;
  uint64_t dropped = w.Seal(n);
  cr_assert_eq(dropped, first, "the older pending version is dropped");
  cr_assert(w.log.Superseded(first));
  cr_assert_neq(n->seal_seq, first);
  // With another entry logged after it, the older version stays.
  fs::Inode* other = w.File("other.pt", "x");
  w.Seal(other);
  n->data_gen++;
  cr_assert_eq(w.Seal(n), 0u);
}

Test(versions, a_memory_only_seal_logs_nothing) {
  World w;
  fs::Inode* n = w.File("step_2.pt", "abc");
  w.Seal(n, true);
  cr_assert_eq(n->rec.state, meta::DataState::kMemoryOnly);
  cr_assert_eq(n->seal_seq, 0u);
  cr_assert_not(w.Head().has_value());
}

Test(versions, the_persist_entry_names_every_link) {
  World w;
  fs::Inode* n = w.File("a", "abc");
  uint64_t d = w.t.Add(kRootIno, "d", S_IFDIR | 0755);
  {
    MutexLock lk(&w.t.ns.mu());
    w.t.ns.Find(d)->children.emplace("b", n->rec.ino);
    n->rec.nlink = 2;
    meta::LogEntry e = w.v->PersistEntry(w.t.ns, n);
    cr_assert_eq(e.path, "a");
    cr_assert_eq(e.path2, "d/b");
  }
}

Test(versions, transition_follows_the_table_and_keeps_the_times) {
  World w;
  fs::Inode* n = w.File("f", "abc");
  fs::Transition(n, fs::FileEvent::kChange);
  cr_assert_eq(n->rec.state, meta::DataState::kDirty);
  cr_assert_gt(n->t_change_ns, 0);
  fs::Transition(n, fs::FileEvent::kEvict);  // not allowed in dirty: logged, kept
  cr_assert_eq(n->rec.state, meta::DataState::kDirty);
  fs::Transition(n, fs::FileEvent::kPublish);
  cr_assert_eq(n->rec.state, meta::DataState::kPersisted);
  cr_assert_geq(n->t_publish_ns, n->t_change_ns);
}
