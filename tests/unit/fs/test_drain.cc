// test_drain.cc — the drainer against a real POSIX backend directory:
// ordering, skip rules, retries with backoff, checksums.
#include <criterion/criterion.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "fs/cluster/cluster.h"
#include "fs/drain/drain.h"
#include "tests/unit/fs/helpers.h"
#include "tests/unit/fs/mem_records.h"

using ckpt::test::Env;
using ckpt::test::KvKind;
namespace backend = ckpt::backend;
namespace stdfs = std::filesystem;
constexpr uint64_t kRoot = ckpt::meta::kRootIno;

namespace {

// Wraps the real POSIX backend and fails the first `fail_publishes`
// Publish calls and every call while `down` is set, to exercise retries.
class FlakyBackend final : public backend::Backend {
 public:
  explicit FlakyBackend(std::unique_ptr<backend::Backend> inner) : inner_(std::move(inner)) {}
  std::atomic<int> fail_publishes{0};
  std::atomic<bool> down{false};
  std::atomic<int> publishes{0};
  // Publish and Mkdir of paths starting with refuse_prefix fail with refuse_err.
  std::string refuse_prefix;
  int refuse_err = 0;
  std::vector<std::string> order;  // paths published and ops applied, in order
  std::mutex mu;

  std::string Describe() const override { return "flaky:" + inner_->Describe(); }
  ckpt::Status Check() override { return inner_->Check(); }
  // Stages of exactly fail_stage_size bytes fail (EIO) while it is set;
  // those of hold_stage_size bytes wait while hold_stages is set.
  std::atomic<uint64_t> fail_stage_size{0}, hold_stage_size{0};
  std::atomic<bool> hold_stages{false};
  // While `hang` is set, every Stage blocks and ignores its cancel
  // callback, as a call into a hard-mounted NFS server that went away
  // does; `hung` counts the calls blocked now.
  std::atomic<bool> hang{false};
  std::atomic<int> hung{0};
  ckpt::Result<backend::Staged> Stage(int fd, uint64_t size, const std::function<bool()>& c) override {
    if (hang) {
      hung++;
      while (hang) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      hung--;
    }
    if (down) return std::unexpected(EIO);
    if (fail_stage_size != 0 && size == fail_stage_size) return std::unexpected(EIO);
    while (hold_stages && size == hold_stage_size) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return inner_->Stage(fd, size, c);
  }
  ckpt::Status Publish(const backend::Staged& s, const std::string& p, const backend::Attrs& a) override {
    if (down) return std::unexpected(EROFS);
    if (fail_publishes > 0) {
      fail_publishes--;
      return std::unexpected(ENOSPC);
    }
    if (Refused(p)) return std::unexpected(refuse_err);
    publishes++;
    Note("put " + p);
    return inner_->Publish(s, p, a);
  }
  void Abort(const backend::Staged& s) override { inner_->Abort(s); }
  ckpt::Status Mkdir(const std::string& p, const backend::Attrs& a) override {
    if (Refused(p)) return std::unexpected(refuse_err);
    return Op("mkdir " + p, [&] { return inner_->Mkdir(p, a); });
  }
  ckpt::Status Rmdir(const std::string& p) override {
    return Op("rmdir " + p, [&] { return inner_->Rmdir(p); });
  }
  ckpt::Status Remove(const std::string& p) override {
    return Op("rm " + p, [&] { return inner_->Remove(p); });
  }
  ckpt::Status Rename(const std::string& a, const std::string& b, bool x) override {
    return Op("mv " + a + " " + b, [&] { return inner_->Rename(a, b, x); });
  }
  ckpt::Status Symlink(const std::string& p, const std::string& t, const backend::Attrs& a) override {
    return Op("ln " + p, [&] { return inner_->Symlink(p, t, a); });
  }
  ckpt::Status Link(const std::string& a, const std::string& b) override { return inner_->Link(a, b); }
  ckpt::Status SetAttr(const std::string& p, const backend::Attrs& a) override { return inner_->SetAttr(p, a); }
  ckpt::Result<backend::Entry> Stat(const std::string& p) override {
    if (down) return std::unexpected(EIO);
    return inner_->Stat(p);
  }
  ckpt::Result<std::vector<backend::Entry>> ListDir(const std::string& d) override {
    if (down) return std::unexpected(EIO);
    return inner_->ListDir(d);
  }
  ckpt::Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& p, int fd, uint64_t size) override {
    if (down) return std::unexpected(EIO);
    return inner_->Fetch(p, fd, size);
  }
  ckpt::Status List(const std::function<void(const backend::Entry&)>& fn) override { return inner_->List(fn); }
  ckpt::Status PutRecord(const std::string& d, const std::string& n, const std::string& b) override {
    if (down) return std::unexpected(EIO);
    return inner_->PutRecord(d, n, b);
  }
  ckpt::Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& d) override {
    if (down) return std::unexpected(EIO);
    return inner_->ListRecords(d);
  }

 private:
  bool Refused(const std::string& p) const { return refuse_err && p.starts_with(refuse_prefix); }
  void Note(const std::string& s) {
    std::lock_guard lk(mu);
    order.push_back(s);
  }
  ckpt::Status Op(const std::string& what, const std::function<ckpt::Status()>& f) {
    if (down) return std::unexpected(EIO);
    Note(what);
    return f();
  }
  std::unique_ptr<backend::Backend> inner_;
};

// Whether anything is staged in `root`'s staging area (its entries but
// the backends' lock files, lk-NONCE).
bool AnythingStaged(const std::string& root) {
  for (const auto& en : stdfs::directory_iterator(root + "/" + backend::kTmpDir))
    if (!en.path().filename().string().starts_with("lk-")) return true;
  return false;
}

struct DrainEnv {
  std::string root;
  FlakyBackend* flaky;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<Env> env;
  std::unique_ptr<ckpt::fs::Drainer> drainer;

  explicit DrainEnv(uint64_t budget = 64ull << 20) {
    char tmpl[] = "/tmp/ckpt-drain-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    root = tmpl;
    auto inner = backend::OpenPosixBackend(root);
    cr_assert(inner.has_value());
    auto f = std::make_unique<FlakyBackend>(std::move(*inner));
    flaky = f.get();
    be = std::move(f);
    cr_assert(be->Check().has_value());
    env = std::make_unique<Env>(KvKind::kRocks, budget, be.get());
  }
  ~DrainEnv() {
    if (drainer) drainer->Stop();
    drainer.reset();
    env.reset();
    stdfs::remove_all(root);
  }
  // `refusal_skip`: -o on_refusal=skip (a refusal fails its entry at once).
  // What is logged so far drained, then the drainer gone: the writer's
  // state before an outage, in the takeover cases.
  void DrainAllThenStop() {
    Start();
    Drain(30);
    drainer->Stop();
    drainer.reset();
  }
  void Start(bool refusal_skip = false) {
    drainer = std::make_unique<ckpt::fs::Drainer>(&env->table->drain_port(), be.get(), 4);
    drainer->set_refusal_skip(refusal_skip);
    drainer->Start();
  }
  // A run back after replica holders took entries over (Drainer::SkipTaken):
  // `done` they applied, `claimed` not marked yet; `refresh` the drainer's
  // news of them (set_refresh_taken), if any.
  void StartTaken(const std::vector<uint64_t>& done, const std::vector<uint64_t>& claimed = {},
                  std::function<void(ckpt::fs::Drainer*)> refresh = nullptr) {
    drainer = std::make_unique<ckpt::fs::Drainer>(&env->table->drain_port(), be.get(), 4);
    if (refresh) drainer->set_refresh_taken([this, refresh] { refresh(drainer.get()); });
    drainer->SkipTaken(done, claimed);
    drainer->Start();
  }
  // Waits until the drain holds at an entry (a refusal for good).
  ckpt::fs::HeldEntry WaitHeld(int timeout_s = 20) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      if (auto h = env->table->core().oplog.Held()) return *h;
      cr_assert(std::chrono::steady_clock::now() < until, "the drain did not hold at the refused entry");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Waits until the log is empty (everything applied or skipped).
  void Drain(int timeout_s = 20) {
    uint64_t head = env->table->DataStatistics().head_seq;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (env->table->DataStatistics().applied_seq < head) {
      cr_assert(std::chrono::steady_clock::now() < until, "drain timed out");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::string Read(const std::string& rel) {
    std::ifstream in(root + "/" + rel, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  bool Exists(const std::string& rel) { return stdfs::exists(stdfs::symlink_status(root + "/" + rel)); }
};

}  // namespace

Test(drain, trainer_history_reaches_backend_in_order) {
  DrainEnv d;
  Env& e = *d.env;
  for (int step = 1; step <= 3; step++) {
    std::string s = "step_" + std::to_string(step);
    uint64_t dir = e.Mkdir(kRoot, s);
    e.WriteFile(dir, "model.pt", std::string(100000 * step, static_cast<char>('a' + step)));
    e.WriteFile(dir, "optim.pt", std::string(5000, 'o'));
    if (step == 1) e.WriteFile(kRoot, "latest", s);
    else e.Overwrite(e.table->Lookup(kRoot, "latest")->ino, s);
  }
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("step_3/model.pt"), std::string(300000, 'd'));
  cr_assert_eq(d.Read("latest"), "step_3");
  cr_assert(d.Exists("step_1/optim.pt"));
  // Every file is persisted with a checksum; `latest` came after the steps.
  auto latest = e.table->Lookup(kRoot, "latest");
  cr_assert_eq(latest->state, ckpt::meta::DataState::kPersisted);
  cr_assert_neq(latest->checksum_hi | latest->checksum_lo, 0u);
  std::lock_guard lk(d.flaky->mu);
  auto& o = d.flaky->order;
  auto pos = [&](const std::string& s) { return std::find(o.begin(), o.end(), s) - o.begin(); };
  // Each version of `latest` reached the backend after its step's files:
  // with step_(N+1) written in between, no version may be skipped, or the
  // backend would show an old `latest` next to newer steps.
  cr_assert_eq(std::count(o.begin(), o.end(), "put latest"), 3);
  size_t from = 0;
  for (int step = 1; step <= 3; step++) {
    auto it = std::find(o.begin() + from, o.end(), "put latest");
    size_t at = it - o.begin();
    std::string s = "step_" + std::to_string(step);
    cr_assert_lt(pos("put " + s + "/model.pt"), at, "%s before its latest", s.c_str());
    cr_assert_lt(pos("put " + s + "/optim.pt"), at);
    if (step < 3) cr_assert_gt(pos("put step_" + std::to_string(step + 1) + "/model.pt"), at);
    from = at + 1;
  }
}

// Work undone by the very next entry is skipped: nothing in between
// depends on it, and the backend jumps between two moments of history.
Test(drain, back_to_back_rewrites_and_deletes_are_skipped) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t l = e.WriteFile(kRoot, "latest", "step_1");
  e.Overwrite(l, "step_2");
  e.Overwrite(l, "step_3");
  e.WriteFile(kRoot, "tmp", "scratch");
  cr_assert(e.table->Unlink(kRoot, "tmp").has_value());
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("latest"), "step_3");
  cr_assert_not(d.Exists("tmp"));
  std::lock_guard lk(d.flaky->mu);
  auto& o = d.flaky->order;
  cr_assert_eq(std::count(o.begin(), o.end(), "put latest"), 1);
  cr_assert_eq(std::count(o.begin(), o.end(), "put tmp"), 0);
}

Test(drain, write_then_delete_is_never_uploaded) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "tmp", "scratch");
  cr_assert(e.table->Unlink(kRoot, "tmp").has_value());
  uint64_t dir = e.Mkdir(kRoot, "step_9");
  e.WriteFile(dir, "a", "A");
  e.Mkdir(dir, "sub");
  cr_assert(e.table->Unlink(dir, "a").has_value());
  cr_assert(e.table->Rmdir(dir, "sub").has_value());
  cr_assert(e.table->Rmdir(kRoot, "step_9").has_value());
  e.WriteFile(kRoot, "kept", "K");
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("kept"), "K");
  std::lock_guard lk(d.flaky->mu);
  // Only `kept` touched the backend: the tree created and removed was skipped.
  cr_assert_eq(d.flaky->order.size(), 2u, "ops: %zu", d.flaky->order.size());  // rm tmp (no-op) + put kept
  cr_assert_eq(d.flaky->publishes.load(), 1);
  cr_assert_not(d.Exists("step_9"));
  cr_assert_not(d.Exists("tmp"));
}

Test(drain, rename_chains_and_directory_rename_with_undrained_files) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "tmp_ckpt");
  e.WriteFile(dir, "w.pt", "weights");
  e.WriteFile(kRoot, "a", "AAA");
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "b", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "b", dir, "c", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "tmp_ckpt", kRoot, "step_5", 0).has_value());
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("step_5/w.pt"), "weights");
  cr_assert_eq(d.Read("step_5/c"), "AAA");
  cr_assert_not(d.Exists("tmp_ckpt"));
  cr_assert_not(d.Exists("a"));
  cr_assert_not(d.Exists("b"));
}

Test(drain, delete_of_whole_checkpoint_tree_after_persist) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "step_1");
  uint64_t sub = e.Mkdir(dir, "shards");
  for (int i = 0; i < 5; i++) e.WriteFile(sub, "s" + std::to_string(i), std::string(1000, 'x'));
  d.Start();
  d.Drain();
  cr_assert(d.Exists("step_1/shards/s4"));
  for (int i = 0; i < 5; i++) cr_assert(e.table->Unlink(sub, "s" + std::to_string(i)).has_value());
  cr_assert(e.table->Rmdir(dir, "shards").has_value());
  cr_assert(e.table->Rmdir(kRoot, "step_1").has_value());
  d.Drain();
  cr_assert_not(d.Exists("step_1"));
}

Test(drain, retries_with_backoff_and_loses_nothing) {
  DrainEnv d;
  Env& e = *d.env;
  d.flaky->fail_publishes = 3;
  e.WriteFile(kRoot, "a", "first");
  e.WriteFile(kRoot, "b", "second");
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("a"), "first");
  cr_assert_eq(d.Read("b"), "second");
  auto st = d.drainer->Stats();
  cr_assert_geq(st.retries, 3u);
  cr_assert_not(st.in_error);
  cr_assert_neq(st.last_error.find("No space left"), std::string::npos, "%s", st.last_error.c_str());
  // A backend that goes away and comes back.
  d.flaky->down = true;
  e.WriteFile(kRoot, "c", "third");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cr_assert(d.drainer->Stats().in_error);
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), 1u);
  d.flaky->down = false;
  d.Drain(30);
  cr_assert_eq(d.Read("c"), "third");
  // Nothing staged is left behind.
  cr_assert(!AnythingStaged(d.root));
}

Test(drain, evicted_file_fetched_and_verified) {
  DrainEnv d;
  Env& e = *d.env;
  std::string data(2 << 20, 'q');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i / 4096);
  uint64_t f = e.WriteFile(kRoot, "big", data);
  d.Start();
  d.Drain();
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kFreed);
  cr_assert_eq(e.table->GetAttr(f)->state, ckpt::meta::DataState::kRemote);
  auto fd = e.table->Open(f, O_RDONLY);
  cr_assert(fd.has_value(), "fetch: %d", fd ? 0 : fd.error());
  std::string back(data.size(), '\0');
  cr_assert_eq(pread(*fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  cr_assert(back == data);
  e.table->Release(f, O_RDONLY);
  cr_assert_eq(e.table->GetAttr(f)->state, ckpt::meta::DataState::kPersisted);
  // Corrupt the backend copy: the next fetch is an EIO, not wrong bytes.
  cr_assert(e.table->Evict(1) == ckpt::cache::Tier::Relief::kFreed);
  {
    std::fstream out(d.root + "/big", std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(12345);
    out.put('!');
  }
  cr_assert_eq(e.table->Open(f, O_RDONLY).error(), EIO);
}

// A trainer whose budget holds about two checkpoints: once the last one is
// persisted, an O_TRUNC rewrite of a file with a version gets passthrough,
// the clean file evicted for its room; a new name (only guessed to be as
// large as the largest file) evicts nothing and takes the copying path. Spares under a cap smaller than a file cover its
// first part.
Test(drain, passthrough_writer_gets_its_room_from_clean_files) {
  DrainEnv d(40ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  uint64_t a = e.WriteFile(kRoot, "step1", std::string(20 << 20, 'c'));  // sealed, pending
  uint64_t latest = e.WriteFile(kRoot, "latest", "v1");                 // rewritten by name, as latest.pt
  d.Start();
  d.Drain();
  cr_assert_eq(e.table->GetAttr(a)->state, ckpt::meta::DataState::kPersisted);
  // A new name (a shard) is only guessed to be as large as the largest
  // file: nothing is evicted for it.
  auto shard = e.table->Mknod(kRoot, "shard", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto ws = e.table->OpenHandle(shard->ino, O_WRONLY | O_TRUNC);
  cr_assert(ws.has_value());
  cr_assert_eq(ws->backing_id, 0);
  cr_assert_eq(e.table->GetAttr(a)->state, ckpt::meta::DataState::kPersisted, "step1 stays for a guess");
  e.table->Release(shard->ino, O_WRONLY, false);
  auto w2 = e.table->OpenHandle(latest, O_WRONLY | O_TRUNC);
  cr_assert(w2.has_value());
  cr_assert_gt(w2->backing_id, 0, "room made by evicting the clean step1");
  cr_assert_eq(e.table->GetAttr(a)->state, ckpt::meta::DataState::kRemote);
  e.table->Release(latest, O_WRONLY, true);
  e.table->core().residency.set_prealloc(8 << 20);
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().second, 0u, "not within a second of a writer's close (the gap between two files)");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().first, 8u << 20, "a spare as large as the cap, not none");
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().second, 1u, "the cap is reached");
  // A passthrough writer takes the tier over its budget: spares go first.
  cr_assert(e.tier->AddSpare(8 << 20, 0));
  auto c = e.table->Mknod(kRoot, "step3", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto wc = e.table->OpenHandle(c->ino, O_WRONLY | O_TRUNC);
  cr_assert(wc.has_value() && wc->backing_id > 0);
  cr_assert_eq(e.tier->Spares().second, 1u, "one spare adopted");
  std::string big(34 << 20, 'z');
  cr_assert_eq(pwrite(wc->fd, big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  e.table->RelieveOverBudget();
  cr_assert_eq(e.tier->Spares().second, 0u, "the spare left was dropped for the budget");
  cr_assert_leq(e.tier->Stats().used, 40u << 20);
  e.table->Release(c->ino, O_WRONLY, true);
}

// Spares (--prealloc auto) may take up to 7/8 of the budget: a checkpoint
// larger than half the budget gets a spare of its whole size once the old
// one is gone (capped at half, as first built, its second half went to
// fresh pages).
Test(drain, auto_spares_cover_a_file_larger_than_half_the_budget) {
  DrainEnv d(64ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  e.table->core().residency.set_prealloc(ckpt::fs::InodeTable::kPreallocAuto);
  uint64_t old = e.WriteFile(kRoot, "step1", std::string(40 << 20, 's'));  // 40 of 64 MiB
  d.Start();
  d.Drain();
  cr_assert(e.table->Unlink(kRoot, "step1").has_value());  // rotated away
  e.table->Forget(old, 1);                                    // and forgotten by the kernel
  d.Drain();
  auto n = e.table->Mknod(kRoot, "step2", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto w = e.table->OpenHandle(n->ino, O_WRONLY | O_TRUNC);  // an O_TRUNC writer: spares are worth making
  cr_assert(w.has_value());
  e.table->Release(n->ino, O_WRONLY, w->backing_id > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().first, 40u << 20, "one spare as large as the 40 MiB file, not half the budget: %llu",
               static_cast<unsigned long long>(e.tier->Spares().first));
}

// A trainer removes its previous checkpoint right after saving the next:
// the spare is made at once from the pages just freed, not after the quiet
// second (on a VM the host takes free memory back within seconds, and a
// spare of such pages is written at a sixth of the speed).
Test(drain, spare_made_at_once_from_pages_just_freed) {
  DrainEnv d(256ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  e.table->core().residency.set_prealloc(ckpt::fs::InodeTable::kPreallocAuto);
  uint64_t old = e.WriteFile(kRoot, "step1", std::string(80 << 20, 's'));  // past Tier::kFreedNoted
  d.Start();
  d.Drain();
  auto n = e.table->Mknod(kRoot, "step2", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto w = e.table->OpenHandle(n->ino, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value());
  e.table->Release(n->ino, O_WRONLY, w->backing_id > 0);
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().second, 0u, "a writer closed just now, nothing freed: the quiet second holds");
  cr_assert(e.table->Unlink(kRoot, "step1").has_value());  // rotated away
  e.table->Forget(old, 1);
  e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().first, 80u << 20, "no spare right after 80 MiB were freed: %llu",
               static_cast<unsigned long long>(e.tier->Spares().first));
}

Test(drain, import_existing_backend_on_first_mount) {
  DrainEnv d;
  stdfs::create_directories(d.root + "/old/step_7");
  { std::ofstream(d.root + "/old/step_7/model.pt") << "old weights"; }
  stdfs::create_symlink("step_7", d.root + "/old/latest");
  { std::ofstream(d.root + "/old/tool") << "#!/bin/sh"; }
  cr_assert_eq(chmod((d.root + "/old/tool").c_str(), 06755), 0);  // someone's setuid file in the backend
  // A fresh state dir over this backend: reopen with a new store.
  d.env.reset();
  d.env = std::make_unique<Env>(KvKind::kRocks, 64ull << 20, d.be.get());
  Env& e = *d.env;
  cr_assert(e.table->shared_ns().ImportBackend().has_value());
  auto old = e.table->Lookup(kRoot, "old");
  cr_assert(old.has_value());
  auto step = e.table->Lookup(old->ino, "step_7");
  auto m = e.table->Lookup(step->ino, "model.pt");
  cr_assert(m.has_value());
  cr_assert_eq(m->state, ckpt::meta::DataState::kRemote);
  cr_assert_eq(m->size, 11u);
  cr_assert_eq(e.table->Readlink(e.table->Lookup(old->ino, "latest")->ino).value_or(""), std::string("step_7"));
  auto tool = e.table->Lookup(old->ino, "tool");
  cr_assert(tool.has_value());
  cr_expect_eq(tool->mode & 07777, 0755u, "imported with the root's owner: no setuid or setgid (mode %o)",
               tool->mode & 07777);
  auto fd = e.table->Open(m->ino, O_RDONLY);
  cr_assert(fd.has_value());
  char buf[16] = {};
  cr_assert_eq(pread(*fd, buf, 11, 0), 11);
  cr_assert_str_eq(buf, "old weights");
  e.table->Release(m->ino, O_RDONLY);
}

// The daemon died after the backend rename and before the RocksDB commit,
// and the tier is gone (a node reboot): the backend already holds the
// version, so the file is taken from there (remote), not listed lost.
Test(drain, published_but_not_committed_survives_a_reboot) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t f = e.WriteFile(kRoot, "model.pt", "all of step 3");
  auto l = e.table->core().oplog.Pending(10).at(0);
  {
    auto src = e.table->drain_port().BeginPersist(l);
    cr_assert(src.has_value());
    auto staged = d.be->Stage(src->fd, src->size, [] { return false; });
    cr_assert(staged.has_value());
    cr_assert(
        d.be->Publish(*staged, l.path, {src->mode, src->uid, src->gid, src->has_owner, src->mtime.sec, src->mtime.nsec})
            .has_value());
  }  // ... and the daemon dies here
  e.table.reset();
  e.tier.reset();
  stdfs::remove_all(e.dir + "/tier");
  e.Open();
  cr_assert_eq(e.table->core().oplog.LostFiles().size(), 0u);
  auto a = e.table->GetAttr(f);
  cr_assert(a.has_value());
  cr_assert_eq(a->state, ckpt::meta::DataState::kRemote);
  cr_assert_eq(a->size, 13u);
  cr_assert_eq(e.table->core().oplog.Pending(10).size(), 0u);
  // Not so for a file the backend holds another version of (size differs).
  uint64_t g = e.WriteFile(kRoot, "latest", "step 3");
  auto gl = e.table->core().oplog.Pending(10).at(0);
  {
    auto src = e.table->drain_port().BeginPersist(gl);
    auto staged = d.be->Stage(src->fd, src->size, [] { return false; });
    cr_assert(d.be->Publish(*staged, gl.path,
                            {src->mode, src->uid, src->gid, src->has_owner, src->mtime.sec, src->mtime.nsec})
                  .has_value());
  }
  e.Overwrite(g, "step 4");  // same size, new mtime: a different version
  e.table.reset();
  e.tier.reset();
  stdfs::remove_all(e.dir + "/tier");
  e.Open();
  cr_assert_eq(e.table->core().oplog.LostFiles().size(), 1u);
  cr_assert_eq(e.table->Lookup(kRoot, "latest").error(), ENOENT);
}

// Outcome of an fsync=backend wait, run to its end (or a 20 s timeout).
static int WaitOutcome(Env& e, uint64_t seq, uint64_t ino) {
  std::atomic<int> got{-1};
  e.table->WhenApplied(seq, ino, [&](int err) { got = err; });
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got < 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return got;
}

// Issue #27: a refusal for good holds the drain (the default): the entries
// after it stay in the log (`latest` never reaches the backend without the
// shard), the waiters whose range covers it are told EIO, not 0, and once
// the backend takes it, everything drains in order.
Test(drain, refusal_holds_the_drain_and_fails_its_waiters) {
  DrainEnv d;
  Env& e = *d.env;
  d.flaky->refuse_prefix = "step1/shard";
  d.flaky->refuse_err = EISDIR;
  uint64_t dir = e.Mkdir(kRoot, "step1");
  uint64_t shard = e.WriteFile(dir, "shard0.pt", "shard");
  uint64_t shard_seq = e.table->core().oplog.LoggedSeq();
  std::atomic<int> shard_fsync{-1};
  e.table->WhenApplied(shard_seq, shard, [&](int err) { shard_fsync = err; });  // pending before the refusal
  e.WriteFile(kRoot, "latest", "step1");
  uint64_t latest_seq = e.table->core().oplog.LoggedSeq();
  d.Start();
  auto h = d.WaitHeld();
  cr_assert_eq(h.path, "step1/shard0.pt");
  cr_assert_eq(h.seq, shard_seq);
  cr_assert_neq(h.reason.find("Is a directory"), std::string::npos, "%s", h.reason.c_str());
  cr_assert_geq(h.behind, 1u, "latest waits behind the shard");
  for (int i = 0; i < 200 && shard_fsync < 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  cr_assert_eq(shard_fsync.load(), EIO, "the refused shard's fsync: %d", shard_fsync.load());
  cr_assert_eq(WaitOutcome(e, latest_seq, 0), EIO, "a wait past the held entry is answered EIO at once");
  auto x = e.table->GetXattr(shard, ckpt::fs::kStateXattr);
  cr_assert(x && *x == "held", "state xattr: %s", x ? x->c_str() : "?");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // retries go on, and hold
  cr_assert_not(d.Exists("latest"), "latest reached the backend past a refused shard");
  cr_assert(e.table->core().oplog.FailedEntries().empty(), "a held entry is not failed");
  cr_assert(d.drainer->Stats().in_error);
  // The operator fixes the backend: the retry publishes both, in order.
  d.flaky->refuse_err = 0;
  d.drainer->Kick();
  d.Drain(30);
  cr_assert_eq(d.Read("step1/shard0.pt"), "shard");
  cr_assert_eq(d.Read("latest"), "step1");
  cr_assert_not(e.table->core().oplog.Held().has_value());
  cr_assert_eq(WaitOutcome(e, latest_seq, 0), 0, "once applied, the wait succeeds");
  std::lock_guard lk(d.flaky->mu);
  auto at = [&](const std::string& what) {
    return std::find(d.flaky->order.begin(), d.flaky->order.end(), what) - d.flaky->order.begin();
  };
  cr_assert_lt(at("put step1/shard0.pt"), at("put latest"), "the shard before latest");
  cr_assert_lt(at("put latest"), static_cast<long>(d.flaky->order.size()), "latest published");
}

// `ckptfs skip`: the operator gives up on the held entry; it is recorded as
// failed (state, list, EIO to its waiters) and the drain goes on.
Test(drain, operator_skip_fails_the_held_entry_and_goes_on) {
  DrainEnv d;
  Env& e = *d.env;
  d.flaky->refuse_prefix = "bad";
  d.flaky->refuse_err = ENAMETOOLONG;
  uint64_t bad = e.WriteFile(kRoot, "bad.pt", "refused");
  e.WriteFile(kRoot, "good.pt", "accepted");
  d.Start();
  d.WaitHeld();
  cr_assert_eq(e.table->core().oplog.RequestSkip("good.pt").error(), ENOENT, "only the held entry can be skipped");
  cr_assert(e.table->core().oplog.RequestSkip("bad.pt").has_value());
  d.drainer->Kick();
  d.Drain(30);
  cr_assert_eq(d.Read("good.pt"), "accepted");
  auto failed = e.table->core().oplog.FailedEntries();
  cr_assert_eq(failed.size(), 1u);
  cr_assert_neq(failed[0].reason.find("skipped by the operator"), std::string::npos, "%s", failed[0].reason.c_str());
  cr_assert_eq(e.table->GetAttr(bad)->state, ckpt::meta::DataState::kFailed);
  cr_assert_eq(WaitOutcome(e, e.table->core().oplog.LoggedSeq(), bad), EIO, "an fsync of the skipped file says EIO");
  cr_assert(e.table->drain_port().ClearLost().has_value());
  cr_assert(e.table->core().oplog.FailedEntries().empty(), "lost --clear forgets the failed list too");
}

// A version lost from the tier before it drained: its waiter is told EIO
// (the drain completes the entry as lost); an outcome from before a waiter
// came is not that waiter's.
Test(drain, lost_version_answers_its_waiter_eio) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t ino = e.WriteFile(kRoot, "gone.pt", "bytes");
  uint64_t seq = e.table->core().oplog.LoggedSeq();
  std::atomic<int> got{-1};
  e.table->WhenApplied(seq, ino, [&](int err) { got = err; });
  e.tier->Remove(ino);  // the tier file is gone (as at a node reboot)
  d.Start();
  d.Drain(30);
  for (int i = 0; i < 200 && got < 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  cr_assert_eq(got.load(), EIO, "the lost version's fsync: %d", got.load());
  cr_assert_eq(e.table->core().oplog.LostFiles().size(), 1u);
  e.WriteFile(kRoot, "next.pt", "later");
  cr_assert_eq(WaitOutcome(e, e.table->core().oplog.LoggedSeq(), 0), 0,
               "a later wait is not answered with an old loss");
}

// Issue #27 item 1: a hard-linked file's new version followed at once by
// the removal of one of its names is not "undone": the file lives on under
// the other name, and the backend must get the new bytes there (the skip
// left the old ones for good, and recovery took them for the last seal).
Test(drain, hard_linked_version_is_not_skipped_when_one_name_goes) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t ino = e.WriteFile(kRoot, "a", "old bytes");
  cr_assert(e.table->Link(ino, kRoot, "b").has_value());
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("b"), "old bytes");
  d.drainer->Stop();
  d.drainer.reset();
  e.Overwrite(ino, "new bytes");                      // persist v2 (names a and b)
  cr_assert(e.table->Unlink(kRoot, "a").has_value());  // the very next entry removes one name
  d.Start();
  d.Drain(30);
  cr_assert_not(d.Exists("a"));
  cr_assert_eq(d.Read("b"), "new bytes", "the surviving name holds the new version");
  cr_assert_eq(e.table->GetAttr(ino)->state, ckpt::meta::DataState::kPersisted);
}

// -o on_refusal=skip: an entry the backend refuses for good (here
// ENAMETOOLONG, as for a path past the backend's PATH_MAX) is marked
// failed; everything after it still drains, in order, and the failure is
// listed and shown in the file's state.
Test(drain, permanent_refusal_fails_one_entry_and_the_drain_goes_on) {
  DrainEnv d;
  Env& e = *d.env;
  d.flaky->refuse_prefix = "bad";
  d.flaky->refuse_err = ENAMETOOLONG;
  uint64_t bad = e.WriteFile(kRoot, "bad.pt", "refused");
  uint64_t dir = e.Mkdir(kRoot, "badir");
  e.WriteFile(dir, "inside.pt", "under a refused directory");
  e.WriteFile(kRoot, "good.pt", "accepted");
  e.WriteFile(kRoot, "latest", "step");
  d.Start(/*refusal_skip=*/true);
  d.Drain(30);  // fails the test if the drain wedges on the refused entries
  cr_assert_eq(d.Read("good.pt"), "accepted");
  cr_assert_eq(d.Read("latest"), "step");
  cr_assert_not(d.Exists("bad.pt"));
  auto failed = e.table->core().oplog.FailedEntries();
  cr_assert_geq(failed.size(), 2u, "bad.pt and badir are listed, got %zu", failed.size());
  cr_assert_eq(failed[0].path, "bad.pt");
  cr_assert_neq(failed[0].reason.find("File name too long"), std::string::npos, "%s", failed[0].reason.c_str());
  cr_assert_eq(e.table->GetAttr(bad)->state, ckpt::meta::DataState::kFailed);
  auto x = e.table->GetXattr(bad, ckpt::fs::kStateXattr);
  cr_assert(x.has_value() && *x == "failed", "state xattr: %s", x ? x->c_str() : "?");
  cr_assert_geq(d.drainer->Stats().entries_failed, 2u);
  cr_assert_not(d.drainer->Stats().in_error, "a permanent failure is not a backend outage");
  // The failed file keeps its bytes in memory and is never evicted.
  cr_assert(e.tier->Has(bad));
  e.table->Evict(1ull << 40);
  cr_assert(e.tier->Has(bad), "the only copy is not evicted");
  // The failure survives a restart; once the path persists, it leaves the list.
  d.drainer->Stop();
  d.drainer.reset();
  e.Open();
  cr_assert_geq(e.table->core().oplog.FailedEntries().size(), 2u);
  cr_assert_eq(e.table->GetAttr(bad)->state, ckpt::meta::DataState::kFailed);
  d.flaky->refuse_err = 0;
  e.Overwrite(bad, "accepted now");
  d.Start(/*refusal_skip=*/true);
  d.Drain(30);
  cr_assert_eq(d.Read("bad.pt"), "accepted now");
  for (auto& f : e.table->core().oplog.FailedEntries()) cr_assert_neq(f.path, "bad.pt");
}

// A transient error (EIO, ENOSPC, EACCES...) is never a failure: retried.
Test(drain, transient_errors_are_not_permanent) {
  for (int err : {EIO, ENOSPC, EACCES, EROFS, ENOENT, ESTALE, ETIMEDOUT, EDQUOT})
    cr_assert_not(ckpt::fs::IsPermanent(err), "errno %d", err);
  for (int err : {ELOOP, ENOTDIR, EISDIR, EEXIST, ENAMETOOLONG, EINVAL, EILSEQ, EFBIG})
    cr_assert(ckpt::fs::IsPermanent(err), "errno %d", err);
}

namespace {
// Opens the evicted file `ino` read-only: the fetch must not wait for the
// pending log (5 s at most; past that the table is shut down and the test
// fails), and the bytes must be `want`.
void ExpectFetchedAtOnce(Env& e, uint64_t ino, const std::string& want) {
  std::atomic<bool> done{false};
  ckpt::Result<int> fd = std::unexpected(EINTR);
  std::thread t([&] {
    fd = e.table->Open(ino, O_RDONLY);
    done = true;
  });
  for (int i = 0; i < 500 && !done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done) {
    e.table->Shutdown();  // unblock it, then fail
    t.join();
    cr_assert_fail("open of an evicted file (%s) waited for the pending log", want.c_str());
  }
  t.join();
  cr_assert(fd.has_value(), "fetch: errno %d", fd ? 0 : fd.error());
  std::string back(want.size(), '\0');
  cr_assert_eq(pread(*fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
  cr_assert_eq(back, want);
  e.table->Release(ino, O_RDONLY);
}

}  // namespace

// Opening an evicted file does not wait for unrelated log entries: with a
// rename still pending (the drain stopped), the fetch reads the file where
// the backend holds it now. So does a file renamed itself, and one whose
// old name was unlinked after a link (it used to fetch a stale path: EIO).
Test(drain, fetch_of_evicted_file_uses_the_backend_path_without_waiting) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t a = e.WriteFile(kRoot, "a", "bytes of a");
  uint64_t c = e.WriteFile(kRoot, "c", "bytes of c");
  e.WriteFile(kRoot, "latest.tmp", "step_2");
  d.Start();
  d.Drain();
  d.drainer->Stop();  // nothing applies from here on
  d.drainer.reset();
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "a2", 0).has_value());
  cr_assert(e.table->Link(c, kRoot, "d").has_value());
  cr_assert(e.table->Unlink(kRoot, "c").has_value());
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  for (auto [ino, want] : {std::pair<uint64_t, std::string>{a, "bytes of a"}, {c, "bytes of c"}}) {
    ExpectFetchedAtOnce(e, ino, want);
  }
  // Once the drain applies the renames, later fetches follow them.
  d.Start();
  d.Drain();
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  auto fd = e.table->Open(a, O_RDONLY);
  cr_assert(fd.has_value(), "fetch after the rename applied: %d", fd ? 0 : fd.error());
  e.table->Release(a, O_RDONLY);
  fd = e.table->Open(c, O_RDONLY);
  cr_assert(fd.has_value(), "fetch of the linked file after the unlink applied: %d", fd ? 0 : fd.error());
  e.table->Release(c, O_RDONLY);
}

// Where the backend holds an evicted file is not tracked after an exchange
// (RENAME_EXCHANGE) or a restart with renames pending. A fetch then used
// to wait until the drain had applied the whole log, holding one of the 4
// fetcher threads: a stuck drain blocked every such open and, with the 4
// taken, every shared-namespace lookup. Now it waits for nothing: the
// pending entries that moved the file say where the backend has it (the
// checksum confirms the bytes), and a file no pending entry touches is
// where it is now.
Test(drain, fetch_of_untracked_file_does_not_wait_for_the_log) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t a = e.WriteFile(kRoot, "a", "bytes of a");
  uint64_t b = e.WriteFile(kRoot, "b", "bytes of b");
  e.WriteFile(kRoot, "latest.tmp", "step_2");
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "b", RENAME_EXCHANGE).has_value());
  d.Start();
  d.Drain();  // a's bytes are at "b" in the backend, b's at "a"; neither tracked
  d.drainer->Stop();  // nothing applies from here on
  d.drainer.reset();
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());  // unrelated
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "a2", 0).has_value());  // b's bytes: "a" in the backend
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  for (auto [ino, want] : {std::pair<uint64_t, std::string>{a, "bytes of a"}, {b, "bytes of b"}}) {
    ExpectFetchedAtOnce(e, ino, want);
  }
  // Once the drain applies the renames, later fetches follow them.
  d.Start();
  d.Drain();
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  for (uint64_t ino : {a, b}) {
    auto fd = e.table->Open(ino, O_RDONLY);
    cr_assert(fd.has_value(), "fetch after the renames applied: %d", fd ? 0 : fd.error());
    e.table->Release(ino, O_RDONLY);
  }
}

// The same without a checksum to confirm the bytes (a file imported from
// the backend): the fetch waits for the drain to apply the pending entries
// that touch the file's path, but not for ever: EIO after the limit.
Test(drain, fetch_without_checksum_waits_for_its_path_a_bounded_time) {
  DrainEnv d;
  { std::ofstream(d.root + "/x") << "old bytes"; }
  d.env.reset();
  d.env = std::make_unique<Env>(KvKind::kRocks, 64ull << 20, d.be.get());
  Env& e = *d.env;
  cr_assert(e.table->shared_ns().ImportBackend().has_value());
  auto x = e.table->Lookup(kRoot, "x");
  cr_assert(x.has_value() && x->state == ckpt::meta::DataState::kRemote);
  cr_assert_eq(x->checksum_hi | x->checksum_lo, 0u, "an imported file has no checksum");
  cr_assert(e.table->Rename(kRoot, "x", kRoot, "y", 0).has_value());  // pending: no drain runs
  e.Open();  // a restart with a rename pending: where the backend holds files is not tracked
  e.table->set_fetch_wait_limit(std::chrono::milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  auto fd = e.table->Open(x->ino, O_RDONLY);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  cr_assert(!fd.has_value() && fd.error() == EIO, "fetch: %d", fd ? 0 : fd.error());
  cr_assert(took >= 0.4 && took < 5, "waited %.1f s", took);
  d.Start();
  d.Drain();
  fd = e.table->Open(x->ino, O_RDONLY);
  cr_assert(fd.has_value(), "fetch once the rename is applied: %d", fd ? 0 : fd.error());
  char buf[16] = {};
  cr_assert_eq(pread(*fd, buf, 9, 0), 9);
  cr_assert_str_eq(buf, "old bytes");
  e.table->Release(x->ino, O_RDONLY);
}

// A file with several names, rewritten through one of them: every name in
// the backend gets the new bytes (publishing by rename used to leave the
// other names on the old version).
Test(drain, rewrite_of_a_hard_linked_file_reaches_every_name) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t sub = e.Mkdir(kRoot, "sub");
  uint64_t a = e.WriteFile(kRoot, "a", "version one");
  cr_assert(e.table->Link(a, sub, "b").has_value());
  e.Overwrite(a, "version two");  // through either name: one inode
  cr_assert(e.table->Link(a, kRoot, "c").has_value());
  cr_assert(e.table->Unlink(kRoot, "a").has_value());
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("sub/b"), "version two");
  cr_assert_eq(d.Read("c"), "version two");
  cr_assert_not(d.Exists("a"));
  struct stat b1, c1;
  cr_assert_eq(stat((d.root + "/sub/b").c_str(), &b1), 0);
  cr_assert_eq(stat((d.root + "/c").c_str(), &c1), 0);
  cr_assert_eq(b1.st_ino, c1.st_ino, "still one file in the backend");
}

// A clean unmount gives the tier back only when every file is in the
// backend (issue #12): before the drain it refuses and names what is not
// there, removing nothing; after it, the files are recorded remote (read
// from the backend after a remount) and the tier directory is gone.
Test(drain, release_tier_only_when_everything_is_persisted) {
  DrainEnv d;
  const std::string data(300000, 'r');
  uint64_t ino = d.env->WriteFile(ckpt::meta::kRootIno, "ckpt.pt", data);
  const std::string tier_dir = d.env->tier->dir();
  std::string why;
  auto r = d.env->table->ReleaseTier(&why);
  cr_assert(!r.has_value() && r.error() == EBUSY, "released before the drain");
  cr_assert(why.find("not yet in the backend") != std::string::npos, "why: %s", why.c_str());
  cr_assert(stdfs::exists(tier_dir + "/" + d.env->tier->PathOf(ino).substr(tier_dir.size() + 1)), "the refusal removed the tier file");

  d.Start();
  d.Drain();
  d.drainer->Stop();
  r = d.env->table->ReleaseTier(&why);
  cr_assert(r.has_value(), "release after the drain: %s", why.c_str());
  cr_assert_geq(*r, data.size());
  cr_assert(!stdfs::exists(tier_dir), "the tier directory is still there");
  auto rec = d.env->store->GetInode(ino);
  cr_assert(rec.has_value() && rec->state == ckpt::meta::DataState::kRemote, "the file is not recorded remote");
}

// Memory pressure (issue #12): below min-free, persisted files are evicted
// for the deficit (to 1.5 x min-free), a dirty one never; when that falls
// short, new tier writes wait (EAGAIN for a writer that may not wait) until
// the headroom is back.
Test(drain, memory_pressure_evicts_persisted_and_holds_writers_for_dirty) {
  DrainEnv d(256ull << 20);
  constexpr uint64_t M = 1ull << 20;
  const std::string data(4 * M, 'p');
  uint64_t a = d.env->WriteFile(kRoot, "a", data), b = d.env->WriteFile(kRoot, "b", data);
  d.Start();
  d.Drain();
  d.drainer->Stop();
  uint64_t dirty = d.env->WriteFile(kRoot, "dirty", data);  // never drained
  d.env->tier->set_evictor([&](uint64_t need) { return d.env->table->Evict(need); });  // as the daemon does
  // 2M available, min-free 8M: target 12M, deficit 10M: both persisted
  // files go (8M), the dirty one stays, and 8M < 10M: writes wait.
  d.env->table->core().residency.RelieveMemory(2 * M, 8 * M, "test");
  auto p = d.env->table->core().residency.MemoryPressure();
  cr_assert(p.active);
  cr_assert_eq(p.evicted_files, 2u);
  cr_assert(!d.env->tier->Has(a) && !d.env->tier->Has(b), "persisted files not evicted");
  cr_assert(d.env->tier->Has(dirty), "a dirty file was dropped");
  cr_assert(p.writers_held, "eviction fell short, yet writes do not wait");
  auto write = [&] {
    cr_assert(d.env->table->Open(dirty, O_WRONLY).has_value());
    auto w = d.env->table->Write(dirty, 4 * M, M, [&](int fd) { return pwrite(fd, data.data(), M, 4 * M); },
                                 /*wait=*/false);
    d.env->table->Release(dirty, O_WRONLY);
    return w;
  };
  auto w = write();
  cr_assert(!w.has_value() && w.error() == EAGAIN, "a write went through while writers are held");
  // Back above 1.5 x min-free: the episode ends, writes go on.
  d.env->table->core().residency.RelieveMemory(13 * M, 8 * M, "test");
  p = d.env->table->core().residency.MemoryPressure();
  cr_assert(!p.active && !p.writers_held);
  w = write();
  cr_assert(w.has_value(), "writes still held after the pressure ended");
}

// An entry's staging fails before it reaches the head, and the rounds in
// between give every stager slot to later entries (held): when it is the
// head, its retry must get a job anyway. It used to find none (Schedule
// stops at the cap) and dereference jobs_.end() — a daemon crash seen in
// CI (dir_ops).
Test(drain, failed_entry_becomes_head_while_every_stager_is_busy) {
  DrainEnv d;
  d.env->WriteFile(kRoot, "a", std::string(3333, 'a'));     // stages at once
  d.env->WriteFile(kRoot, "b", std::string(1111, 'b'));     // fails, then is the head
  for (int i = 0; i < 6; i++) d.env->WriteFile(kRoot, "f" + std::to_string(i), std::string(2222, 'f'));  // held
  d.flaky->fail_stage_size = 1111;
  d.flaky->hold_stage_size = 2222;
  d.flaky->hold_stages = true;
  d.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // a published, b retried behind held f*
  d.flaky->fail_stage_size = 0;
  d.flaky->hold_stages = false;
  d.Drain();
  cr_assert(d.Read("a") == std::string(3333, 'a'));
  cr_assert(d.Read("b") == std::string(1111, 'b'));
  for (int i = 0; i < 6; i++) cr_assert(d.Read("f" + std::to_string(i)) == std::string(2222, 'f'));
}

// The stager takes a sealed version from the live tier file (no snapshot:
// nothing changed it since the seal). A writer then rewrites the file while
// a passthrough reader holds it: the version is copied aside (CopyOut), and
// the live file, the one the stager is reading, changes under it. The
// stager must notice and stage the copy instead: published bytes that are
// neither version (or a short read, an EIO and a retry, as seen in CI's
// tsan truncate_while_draining) are wrong.
Test(drain, version_copied_aside_while_staged_from_the_live_file) {
  DrainEnv d;
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  const size_t size = 1 << 20;
  uint64_t f = e.WriteFile(kRoot, "f", std::string(size, 'a'));
  d.flaky->hold_stage_size = size;
  d.flaky->hold_stages = true;
  d.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the stager holds the live file
  auto r = e.table->OpenHandle(f, O_RDONLY);
  cr_assert(r.has_value() && r->backing_id > 0);
  auto w = e.table->OpenHandle(f, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value() && w->backing_id > 0, "a passthrough writer beside a passthrough reader");
  std::string b(size, 'b');
  cr_assert_eq(pwrite(w->fd, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
  d.flaky->hold_stages = false;
  d.Drain();  // only version 1 is in the log: the writer is still open
  cr_assert(d.Read("f") == std::string(size, 'a'), "the sealed version, not the bytes written after it");
  cr_assert_eq(d.drainer->Stats().retries, 0u, "no error, no retry");
  e.table->Release(f, O_WRONLY, true);
  e.table->Release(f, O_RDONLY, true);
  d.Drain();
  cr_assert(d.Read("f") == b);
}

namespace {

// The policies of the daemon (fs/daemon.cc) on a DrainEnv's table.
void SetPolicy(DrainEnv& d, uint64_t every, uint64_t keep = 0) {
  ckpt::fs::CheckpointPolicy p;
  p.pattern = std::regex(R"(step_\d+)");
  p.persist_every = every;
  p.keep_in_memory = keep;
  d.env->table->set_checkpoint_policy(p);
}

// step_I/model.pt holding "model I" (and step_I/opt/state.pt), then
// `latest` (outside any checkpoint) rewritten to "I".
void SaveStep(DrainEnv& d, int i, uint64_t latest, size_t pad = 0) {
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "step_" + std::to_string(i));
  e.WriteFile(dir, "model.pt", "model " + std::to_string(i) + std::string(pad, 'w'));
  e.WriteFile(e.Mkdir(dir, "opt"), "state.pt", "opt " + std::to_string(i));
  e.Overwrite(latest, std::to_string(i));
}

bool Touched(DrainEnv& d, const std::string& what) {
  std::lock_guard lk(d.flaky->mu);
  return std::any_of(d.flaky->order.begin(), d.flaky->order.end(),
                     [&](const std::string& o) { return o.find(what) != std::string::npos; });
}

// Removes step_I as `rm -r` would.
void RemoveStep(DrainEnv& d, int i) {
  Env& e = *d.env;
  auto dir = e.table->Lookup(kRoot, "step_" + std::to_string(i));
  cr_assert(dir.has_value());
  auto opt = e.table->Lookup(dir->ino, "opt");
  cr_assert(e.table->Unlink(opt->ino, "state.pt").has_value());
  cr_assert(e.table->Rmdir(dir->ino, "opt").has_value());
  cr_assert(e.table->Unlink(dir->ino, "model.pt").has_value());
  cr_assert(e.table->Rmdir(kRoot, "step_" + std::to_string(i)).has_value());
}

// A trainer under --persist-every `every`: `latest`, then steps 1..`steps`
// saved with the drainer running, drained. Returns `latest`'s ino.
uint64_t TrainWithPolicy(DrainEnv& d, uint64_t every, int steps) {
  SetPolicy(d, every);
  uint64_t latest = d.env->WriteFile(kRoot, "latest", "0");
  d.Start();
  for (int i = 1; i <= steps; i++) SaveStep(d, i, latest);
  d.Drain();
  return latest;
}

}  // namespace

// --persist-every 3 over 9 steps: steps 3, 6 and 9 reach the backend,
// nothing of the others does, not even their directories, and their
// rotation (rm -r) sends nothing either; `latest` (no checkpoint) drains
// every time. The others are memory-only, and readable.
Test(drain, persist_every_3_over_9_steps) {
  DrainEnv d;
  Env& e = *d.env;
  TrainWithPolicy(d, 3, 9);
  for (int i = 1; i <= 9; i++) {
    const std::string step = "step_" + std::to_string(i);
    const bool drains = i % 3 == 0;
    cr_assert_eq(stdfs::exists(d.root + "/" + step), drains, "%s in the backend: %d", step.c_str(), !drains);
    cr_assert_eq(Touched(d, step), drains, "%s: backend operations", step.c_str());
    auto dir = e.table->Lookup(kRoot, step);
    auto f = e.table->Lookup(dir->ino, "model.pt");
    cr_assert_eq(f->state, drains ? ckpt::meta::DataState::kPersisted : ckpt::meta::DataState::kMemoryOnly);
    cr_assert_eq(dir->ckpt_ord, static_cast<uint64_t>(i));
    cr_assert_eq(dir->memory_only, !drains);
    if (drains) cr_assert(d.Read(step + "/model.pt") == "model " + std::to_string(i));
    if (drains) cr_assert(d.Read(step + "/opt/state.pt") == "opt " + std::to_string(i));
  }
  cr_assert(d.Read("latest") == "9");
  auto stats = e.table->DataStatistics();
  cr_assert_eq(stats.files[static_cast<size_t>(ckpt::meta::DataState::kMemoryOnly)], 12u, "6 steps x 2 files");
  cr_assert_eq(stats.log_len, 0u, "nothing memory-only waits in the log");
  // Rotation: the trainer keeps the last two.
  {
    std::lock_guard lk(d.flaky->mu);
    d.flaky->order.clear();
  }
  for (int i = 1; i <= 7; i++) RemoveStep(d, i);
  d.Drain();
  for (int i : {1, 2, 4, 5, 7}) cr_assert(!Touched(d, "step_" + std::to_string(i)), "rotation of step_%d reached the backend", i);
  cr_assert(Touched(d, "step_3") && Touched(d, "step_6"), "a drained step's removal reaches the backend");
  cr_assert(!stdfs::exists(d.root + "/step_3") && !stdfs::exists(d.root + "/step_6"));
  cr_assert(stdfs::exists(d.root + "/step_9/model.pt"));
  stats = e.table->DataStatistics();
  cr_assert_eq(stats.files[static_cast<size_t>(ckpt::meta::DataState::kMemoryOnly)], 2u, "step_8 is left");
}

// `ckptfs persist` of a memory-only step: its directories and files are
// logged after everything before (ordering holds), drain, and the step
// drains from then on; a file named in it persists the whole step; a step
// that drains already says EALREADY.
Test(drain, persist_of_a_memory_only_step) {
  DrainEnv d;
  Env& e = *d.env;
  TrainWithPolicy(d, 3, 3);
  auto step1 = e.table->Lookup(kRoot, "step_1");
  auto step2 = e.table->Lookup(kRoot, "step_2");
  auto step3 = e.table->Lookup(kRoot, "step_3");
  cr_assert_eq(e.table->PersistCheckpoint(step3->ino, ckpt::fs::Caller{}).error(), EALREADY);
  cr_assert_eq(e.table->PersistCheckpoint(kRoot, ckpt::fs::Caller{}).error(), EALREADY);
  cr_assert_eq(e.table->PersistCheckpoint(step1->ino, ckpt::fs::Caller{4242, 4242}).error(), EPERM,
               "another user's checkpoint");
  auto q = e.table->PersistCheckpoint(step1->ino, ckpt::fs::Caller{});
  cr_assert(q.has_value());
  cr_assert(q->path == "step_1");
  cr_assert_eq(q->files, 2u);
  auto model2 = e.table->Lookup(step2->ino, "model.pt");
  q = e.table->PersistCheckpoint(model2->ino, ckpt::fs::Caller{});  // a file in it: the whole step
  cr_assert(q.has_value() && q->path == "step_2" && q->files == 2u);
  d.Drain();
  for (int i = 1; i <= 3; i++) {
    cr_assert(d.Read("step_" + std::to_string(i) + "/model.pt") == "model " + std::to_string(i));
    cr_assert(d.Read("step_" + std::to_string(i) + "/opt/state.pt") == "opt " + std::to_string(i));
  }
  cr_assert(!e.table->GetAttr(step1->ino)->memory_only);
  cr_assert_eq(e.table->GetAttr(model2->ino)->state, ckpt::meta::DataState::kPersisted);
  // From now on it drains like any other: a new file in it too.
  e.WriteFile(step1->ino, "late.pt", "late");
  d.Drain();
  cr_assert(d.Read("step_1/late.pt") == "late");
}

// A move across the line between a memory-only checkpoint and what drains
// is EXDEV (mv copies then); a memory-only checkpoint renamed stays
// memory-only and its rename reaches nobody; a tree renamed into a
// checkpoint's name becomes a (draining) checkpoint.
Test(drain, moves_across_the_memory_only_line) {
  DrainEnv d;
  Env& e = *d.env;
  TrainWithPolicy(d, 2, 2);  // step_1 memory-only, step_2 drains
  auto s1 = e.table->Lookup(kRoot, "step_1");
  auto s2 = e.table->Lookup(kRoot, "step_2");
  cr_assert_eq(e.table->Rename(s1->ino, "model.pt", kRoot, "model.pt", 0).error(), EXDEV);
  cr_assert_eq(e.table->Rename(s2->ino, "model.pt", s1->ino, "model.pt", 0).error(), EXDEV);
  cr_assert_eq(e.table->Rename(kRoot, "latest", s1->ino, "latest", 0).error(), EXDEV);
  auto m1 = e.table->Lookup(s1->ino, "model.pt");
  cr_assert_eq(e.table->Link(m1->ino, kRoot, "m1").error(), EXDEV);
  e.Mkdir(kRoot, "empty");
  cr_assert_eq(e.table->Rename(kRoot, "step_1", kRoot, "empty", 0).error(), EXDEV, "over a directory that drains");
  // Within one side: fine, and nothing reaches the backend for it.
  cr_assert(e.table->Rename(s1->ino, "model.pt", s1->ino, "model.bak", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "step_1", kRoot, "best", 0).has_value());
  auto best = e.table->Lookup(kRoot, "best");
  cr_assert(best->memory_only && best->ckpt_ord == 1u);
  // A tree written under another name and renamed into place.
  uint64_t tmp = e.Mkdir(kRoot, "tmp");
  e.WriteFile(tmp, "w.pt", "w");
  cr_assert(e.table->Rename(kRoot, "tmp", kRoot, "step_7", 0).has_value());
  d.Drain();
  auto s7 = e.table->Lookup(kRoot, "step_7");
  cr_assert_eq(s7->ckpt_ord, 3u, "numbered when it got its name");
  cr_assert(!s7->memory_only);
  cr_assert(d.Read("step_7/w.pt") == "w");
  cr_assert(!Touched(d, "best") && !Touched(d, "step_1") && !Touched(d, "model.bak"));
}

// A memory-only version survives a restart of the daemon (it is the only
// copy), numbering goes on where it was, and a memory-only file that was
// being rewritten when the daemon stopped is lost, not taken torn.
Test(drain, memory_only_survives_a_restart) {
  DrainEnv d;
  SetPolicy(d, 2);
  Env& e = *d.env;
  uint64_t latest = e.WriteFile(kRoot, "latest", "0");
  SaveStep(d, 1, latest);
  auto s1 = e.table->Lookup(kRoot, "step_1");
  auto m1 = e.table->Lookup(s1->ino, "model.pt");
  uint64_t torn = e.WriteFile(s1->ino, "torn.pt", std::string(4096, 't'));
  cr_assert(e.table->Open(torn, O_RDWR).has_value());
  cr_assert(e.table->Write(torn, 0, 1, [](int fd) { return pwrite(fd, "x", 1, 0); }).has_value());
  e.Open();  // the daemon died: no release
  SetPolicy(d, 2);
  auto m = e.table->GetAttr(m1->ino);
  cr_assert(m.has_value());
  cr_assert_eq(m->state, ckpt::meta::DataState::kMemoryOnly);
  auto fd = e.table->Open(m1->ino, O_RDONLY);
  char buf[16] = {};
  cr_assert_eq(pread(*fd, buf, sizeof buf, 0), 7);
  cr_assert_str_eq(buf, "model 1");
  e.table->Release(m1->ino, O_RDONLY);
  cr_assert(!e.table->Lookup(s1->ino, "torn.pt").has_value(), "a torn memory-only file is dropped");
  auto lost = e.table->core().oplog.LostFiles();
  cr_assert(std::find(lost.begin(), lost.end(), "step_1/torn.pt") != lost.end());
  SaveStep(d, 2, latest);
  auto s2 = e.table->Lookup(kRoot, "step_2");
  cr_assert_eq(s2->ckpt_ord, 2u);
  cr_assert(!s2->memory_only, "number 2 of every 2 drains");
  d.Start();
  d.Drain();
  cr_assert(!stdfs::exists(d.root + "/step_1"));
  cr_assert(!Touched(d, "torn"));
  cr_assert(d.Read("step_2/model.pt") == "model 2");
}

namespace {

// --keep-in-memory `keep`; steps 1..`steps` saved (models of `pad`
// bytes) and drained. Returns: step I's model.pt inode.
std::function<uint64_t(int)> SavedAndDrained(DrainEnv& d, uint64_t keep, int steps, size_t pad) {
  SetPolicy(d, 0, keep);
  Env& e = *d.env;
  uint64_t latest = e.WriteFile(kRoot, "latest", "0");
  for (int i = 1; i <= steps; i++) SaveStep(d, i, latest, pad);
  d.Start();
  d.Drain();
  return [&e](int i) {
    auto s = e.table->Lookup(kRoot, "step_" + std::to_string(i));
    return e.table->Lookup(s->ino, "model.pt")->ino;
  };
}

}  // namespace

// --keep-in-memory 2: when room is needed, persisted files of older
// checkpoints go first, even when the newest two were used less recently;
// the kept ones go last, when nothing else is left.
Test(drain, keep_in_memory_evicts_older_checkpoints_first) {
  DrainEnv d;
  Env& e = *d.env;
  constexpr size_t M = 1 << 20;
  auto model = SavedAndDrained(d, 2, 4, M);
  // Plain LRU would take steps 3 and 4 first: the older steps are read last.
  for (int i : {1, 2}) {
    cr_assert(e.table->Open(model(i), O_RDONLY).has_value());
    e.table->Release(model(i), O_RDONLY);
  }
  (void)e.table->Evict(2 * M);
  cr_assert(e.tier->Has(model(3)) && e.tier->Has(model(4)), "a kept checkpoint was evicted first");
  cr_assert(!e.tier->Has(model(1)) && !e.tier->Has(model(2)), "the older steps stay");
  (void)e.table->Evict(64 * M);  // everything: the kept ones too, at last
  cr_assert(!e.tier->Has(model(3)) && !e.tier->Has(model(4)));
}

// --keep-in-memory 1 while the next checkpoint is being saved: the last
// complete one is what a restart would load, so it is the one kept, not
// the half-written one that merely has the highest number.
Test(drain, keep_in_memory_keeps_the_last_complete_checkpoint_during_a_save) {
  DrainEnv d;
  Env& e = *d.env;
  constexpr size_t M = 1 << 20;
  auto model = SavedAndDrained(d, 1, 2, M);
  // The save below is under way for as long as the test runs, however
  // slow the machine (a writer closed less than the gap ago: SaveUnderWay).
  e.table->core().residency.set_save_gap(std::chrono::seconds(60));
  cr_assert(e.table->Open(model(1), O_RDONLY).has_value());  // plain LRU would take step 2 first
  e.table->Release(model(1), O_RDONLY);
  auto saving = e.table->Mknod(e.Mkdir(kRoot, "step_3"), "model.pt", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  cr_assert(saving.has_value());
  cr_assert(e.table->Open(saving->ino, O_WRONLY).has_value());
  auto w = e.table->Write(saving->ino, 0, 5, [](int f) { return pwrite(f, "half.", 5, 0); });
  cr_assert(w.has_value());
  (void)e.table->Evict(M);
  cr_assert(e.tier->Has(model(2)), "the last complete checkpoint was evicted while step_3 was being saved");
  cr_assert(!e.tier->Has(model(1)));
  // Between two files of the save (the model closed, the optimizer state
  // to come): step_3 has no writer open and is still not complete.
  e.table->Release(saving->ino, O_WRONLY);
  cr_assert(e.table->Open(model(1), O_RDONLY).has_value());  // back in RAM, used last
  e.table->Release(model(1), O_RDONLY);
  cr_assert(e.tier->Has(model(1)));
  (void)e.table->Evict(M);
  cr_assert(e.tier->Has(model(2)), "the last complete checkpoint was evicted between two files of a save");
}

// A memory-only step renamed into another keeps its flag; persisting the
// inner one persists the outer one whole (the backend never holds half of
// a checkpoint whose removal it would then never see).
Test(drain, persist_of_a_nested_memory_only_step) {
  DrainEnv d;
  Env& e = *d.env;
  TrainWithPolicy(d, 3, 2);  // step_1 and step_2 memory-only
  auto s2 = e.table->Lookup(kRoot, "step_2");
  cr_assert(e.table->Rename(kRoot, "step_1", s2->ino, "old", 0).has_value());
  auto inner = e.table->Lookup(s2->ino, "old");
  cr_assert(inner->memory_only);
  auto q = e.table->PersistCheckpoint(inner->ino, ckpt::fs::Caller{});
  cr_assert(q.has_value() && q->path == "step_2" && q->files == 4u, "%s %lu", q ? q->path.c_str() : "-",
            q ? q->files : 0);
  d.Drain();
  cr_assert(d.Read("step_2/model.pt") == "model 2");
  cr_assert(d.Read("step_2/old/model.pt") == "model 1");
  cr_assert(!e.table->GetAttr(inner->ino)->memory_only && !e.table->GetAttr(s2->ino)->memory_only);
  e.WriteFile(inner->ino, "new.pt", "n");  // drains now, inner flag gone
  d.Drain();
  cr_assert(d.Read("step_2/old/new.pt") == "n");
}

namespace {

// The records of a cluster, in memory (the test plays the other member).
struct MemRecords : ckpt::test::MemRecords {
  void Other(int64_t heartbeat, std::optional<int64_t> oldest_gate) {
    nlohmann::json j = {{"node", "z"},          {"cluster", "job"},
                        {"state", "live"},      {"heartbeat_ms", heartbeat},
                        {"watermark_ms", 0},    {"oldest_gate_ms", oldest_gate ? nlohmann::json(*oldest_gate) : nullptr},
                        {"unpersisted", 1},     {"paths", {"step_1/shard_z"}}};
    std::lock_guard lk(mu);
    recs["z"] = j.dump();
  }
};

}  // namespace

// With a cluster, the drain stages the entry (the transfer is not held) but
// publishes it only once Cluster::MayPublish allows: here, once the other
// member's record shows its earlier file persisted.
Test(drain_cluster, publish_waits_for_the_other_members_earlier_file) {
  DrainEnv d;
  Env& e = *d.env;
  std::atomic<int64_t> now{100000};
  MemRecords store;
  auto log = ckpt::fs::LocalLog(&e.table->core().oplog, e.store->kv());
  ckpt::fs::ClusterOptions o;
  o.name = "job";
  o.node = "a";
  ckpt::fs::Cluster c(o, &store, log.get(), "", [&] { return now.load() * 1000; });  // ms, as Other's records
  c.Init();
  store.Other(100000, 99000);  // z: a file pending since before ours
  e.WriteFile(kRoot, "latest", "step_1");
  now = 100100;
  c.Sample();  // latest's gate: 100100
  now = 100200;
  store.Other(100200, 99000);
  c.Heartbeat();
  d.drainer = std::make_unique<ckpt::fs::Drainer>(&e.table->drain_port(), d.be.get(), 4);
  d.drainer->set_cluster(&c);
  d.drainer->Start();
  bool staged = false;
  for (int i = 0; i < 100 && !staged; i++) {  // the bytes are staged meanwhile
    staged = AnythingStaged(d.root);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  cr_expect(staged, "the transfer waited for the cluster too");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  cr_expect(!d.Exists("latest"), "published while z's earlier file is pending");
  auto st = c.Status();
  cr_expect(st.waiting);
  cr_assert_eq(st.waiting_for.size(), 1u);
  cr_expect_eq(st.waiting_for[0], std::string("z"));
  // z persisted its file: nothing pending in its next record.
  now = 100300;
  store.Other(100300, std::nullopt);
  c.Heartbeat();
  d.Drain();
  cr_expect_eq(d.Read("latest"), std::string("step_1"));
  cr_expect(!c.Status().waiting);
}

// The drain yields to a save (set_yield): no transfer starts while the
// hold says a save is under way, and every one does once it no longer does.
// Namespace entries (a mkdir) are not held: they cost no bandwidth.
Test(drain, no_transfer_starts_while_a_save_holds_the_drain) {
  DrainEnv d;
  Env& e = *d.env;
  std::atomic<bool> saving{true};
  std::atomic<int> asked{0};
  uint64_t dir = e.Mkdir(kRoot, "step_1");
  e.WriteFile(dir, "model.pt", std::string(200000, 'm'));
  d.drainer = std::make_unique<ckpt::fs::Drainer>(&e.table->drain_port(), d.be.get(), 4);
  d.drainer->set_yield([&] {
    asked++;
    return saving.load();
  });
  d.drainer->Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  cr_assert(d.Exists("step_1"), "the mkdir is applied while the save goes on");
  cr_assert_not(d.Exists("step_1/model.pt"), "no transfer while the save goes on");
  cr_assert_eq(d.flaky->publishes.load(), 0);
  cr_assert_gt(asked.load(), 5, "the hold is polled while it waits");
  auto s = d.drainer->Stats();
  cr_assert(s.yielding);
  cr_assert_eq(s.yields, 1u);
  saving = false;
  d.Drain();
  cr_assert_eq(d.Read("step_1/model.pt"), std::string(200000, 'm'));
  s = d.drainer->Stats();
  cr_assert_not(s.yielding);
  cr_assert_geq(s.yielded_s, 0.25);
}

// A backend call that never returns (a hard-mounted NFS server gone) does
// not hang the drainer's Stop, and with it the daemon's shutdown: Stop
// gives up on the thread stuck in the backend after a bound, and the log
// keeps the entry for the next mount.
Test(drain, stop_is_bounded_while_a_backend_call_never_returns, .timeout = 120) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "f", std::string(4096, 'f'));
  d.flaky->hang = true;
  d.Start();
  for (int i = 0; i < 1000 && d.flaky->hung == 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  cr_assert_eq(d.flaky->hung.load(), 1, "the stager is not in the backend");
  std::atomic<bool> stopped{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread t([&] {
    d.drainer->Stop();
    stopped = true;
  });
  while (!stopped && std::chrono::steady_clock::now() < start + std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool in_time = stopped;
  d.flaky->hang = false;  // the call returns at last: every thread can end
  t.join();
  cr_assert(in_time, "Drainer::Stop still waits after %.0f s for a backend call that does not return", took);
  cr_assert_eq(e.table->DataStatistics().log_len, 1u, "the log keeps the entry for the next mount");
  cr_assert(!d.Exists("f"));
}

// A version an fsync sealed in place under a passthrough writer that keeps
// the file open (--fsync memory): with `latest` logged behind it, the drain
// copies it aside and goes on (it used to wait for the writer's close,
// and every later entry with it); bytes the writer adds after the fsync are
// not part of that version: they come with the close.
Test(drain, version_sealed_in_place_is_copied_aside_for_the_entries_behind_it) {
  DrainEnv d;
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  const size_t size = 1 << 20;
  e.WriteFile(kRoot, "warm", std::string(size, 'w'));  // so that an O_TRUNC writer gets passthrough
  auto f = e.table->Mknod(kRoot, "model.pt", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  cr_assert(f.has_value());
  auto w = e.table->OpenHandle(f->ino, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value() && w->backing_id > 0, "a passthrough writer");
  std::string a(size, 'a');
  cr_assert_eq(pwrite(w->fd, a.data(), a.size(), 0), static_cast<ssize_t>(a.size()));  // the kernel's write
  cr_assert(e.table->SyncSeal(f->ino).has_value());
  e.WriteFile(kRoot, "latest", "step_1");
  d.Start();
  d.Drain();
  cr_assert(d.Read("model.pt") == a, "the fsynced bytes, while the file is open");
  cr_assert_eq(d.Read("latest"), "step_1");
  std::string b(4096, 'b');
  cr_assert_eq(pwrite(w->fd, b.data(), b.size(), size), static_cast<ssize_t>(b.size()));
  e.table->Release(f->ino, O_WRONLY, true);
  d.Drain();
  cr_assert(d.Read("model.pt") == a + b);
}

// The same under an O_RDWR passthrough handle, which may store through a
// shared mapping without moving the mtime: no copy can be proven untorn,
// so the drain still waits for the close there.
Test(drain, version_sealed_in_place_under_a_read_write_handle_waits_for_the_close) {
  DrainEnv d;
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  const size_t size = 1 << 20;
  e.WriteFile(kRoot, "warm", std::string(size, 'w'));
  auto f = e.table->Mknod(kRoot, "model.pt", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto w = e.table->OpenHandle(f->ino, O_RDWR | O_TRUNC);
  cr_assert(w.has_value() && w->backing_id > 0, "a passthrough writer");
  std::string a(size, 'a');
  cr_assert_eq(pwrite(w->fd, a.data(), a.size(), 0), static_cast<ssize_t>(a.size()));
  cr_assert(e.table->SyncSeal(f->ino).has_value());
  e.WriteFile(kRoot, "latest", "step_1");
  d.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  cr_assert(!d.Exists("latest") && !d.Exists("model.pt"), "nothing passes the open read-write file");
  e.table->Release(f->ino, O_RDWR, true);
  d.Drain();
  cr_assert(d.Read("model.pt") == a);
  cr_assert_eq(d.Read("latest"), "step_1");
}

// Bytes the kernel writes after the fsync, while the drain may be copying
// the version aside, are never published as that version: the backend gets
// the fsynced bytes whole or (the writes seen) nothing until the close, and
// never a mix. Rewrites in place (same size: only the mtime moves) start
// at moments spread over the copy's.
Test(drain, version_sealed_in_place_is_never_published_torn) {
  DrainEnv d(256ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  e.table->set_backing(&fb);
  const size_t size = 32 << 20, piece = 1 << 20;
  e.WriteFile(kRoot, "warm", std::string(size, 'w'));
  const uint64_t latest = e.WriteFile(kRoot, "latest", "none");
  d.Start();
  const std::string a(size, 'a'), b(piece, 'b');
  for (int round = 0; round < 8; round++) {
    const std::string name = "f" + std::to_string(round);
    auto f = e.table->Mknod(kRoot, name, S_IFREG | 0644, 0, ckpt::fs::Caller{});
    auto w = e.table->OpenHandle(f->ino, O_WRONLY | O_TRUNC);
    cr_assert(w.has_value() && w->backing_id > 0, "a passthrough writer");
    cr_assert_eq(pwrite(w->fd, a.data(), a.size(), 0), static_cast<ssize_t>(a.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(120));  // quiet: the drain may copy at once
    cr_assert(e.table->SyncSeal(f->ino).has_value());
    e.Overwrite(latest, name);
    std::thread writer([&, fd = w->fd] {
      std::this_thread::sleep_for(std::chrono::milliseconds(round * 4));
      for (size_t off = 0; off < size; off += piece) {
        (void)!pwrite(fd, b.data(), b.size(), static_cast<off_t>(off));
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    });
    d.Drain();
    writer.join();
    if (d.Exists(name)) cr_assert(d.Read(name) == a, "round %d: the version published torn", round);
    e.table->Release(f->ino, O_WRONLY, true);
    d.Drain();
    cr_assert(d.Read(name) == std::string(size, 'b'), "round %d: the bytes of the close", round);
    (void)e.table->Evict(1ull << 40);  // room for the next passthrough writer
  }
}

// Issue #29 helpers: a table with passthrough (a fake backing) and
// --prealloc auto, as the daemon's; and an O_TRUNC passthrough open and
// close of a file (torch.save's open: spares become worth their memory).
namespace {
void WithSpares(Env& e, ckpt::test::FakeBacking* fb) {
  e.table->set_backing(fb);
  e.table->core().residency.set_prealloc(ckpt::fs::InodeTable::kPreallocAuto);
  e.table->core().residency.set_save_gap(std::chrono::seconds(1));  // these saves come a quiet second apart
}
void TruncOpenClose(Env& e, uint64_t ino) {
  auto w = e.table->OpenHandle(ino, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value());
  e.table->Release(ino, O_WRONLY, w->backing_id > 0);
}
}  // namespace

// Issue #29: a fresh mount makes one spare for its first file (a quarter of
// the budget with --prealloc auto), so the first save is a passthrough
// writer into allocated pages like every later one; the spare is made once.
Test(drain, fresh_mount_first_file_gets_a_spare) {
  DrainEnv d(64ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  WithSpares(e, &fb);
  auto f = e.table->Mknod(kRoot, "step0.pt", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto before = e.table->OpenHandle(f->ino, O_WRONLY | O_TRUNC);
  cr_assert(before.has_value());
  cr_assert_eq(before->backing_id, 0, "no spare, nothing known: the copying path");
  e.table->Release(f->ino, O_WRONLY, false);
  DrainEnv d2(64ull << 20);
  Env& e2 = *d2.env;
  WithSpares(e2, &fb);
  e2.table->RefillSpares();
  cr_assert_eq(e2.tier->Spares().first, 16u << 20, "a quarter of the budget, at once");
  e2.table->RefillSpares();
  cr_assert_eq(e2.tier->Spares().second, 1u, "made once");
  auto g = e2.table->Mknod(kRoot, "step0.pt", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  auto w = e2.table->OpenHandle(g->ino, O_WRONLY | O_TRUNC);
  cr_assert(w.has_value());
  cr_assert_gt(w->backing_id, 0, "the first file is a passthrough writer");
  cr_assert_eq(e2.tier->Spares().second, 0u, "into the spare");
  e2.table->Release(g->ino, O_WRONLY, true);
  e2.table->RefillSpares();
  cr_assert_eq(e2.tier->Spares().second, 0u, "no second first-file spare");
  // An explicit --prealloc sizes it.
  DrainEnv d3(64ull << 20);
  d3.env->table->set_backing(&fb);
  d3.env->table->core().residency.set_prealloc(6u << 20);
  d3.env->table->RefillSpares();
  cr_assert_eq(d3.env->tier->Spares().first, 6u << 20);
}

// Issue #29: with the budget near full (a trainer that keeps every
// checkpoint), persisted files are evicted ahead of the next save to make
// room for its spare, least recently used first.
Test(drain, spare_evicts_persisted_files_when_the_budget_is_full) {
  DrainEnv d(40ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  WithSpares(e, &fb);
  std::vector<uint64_t> steps;
  for (int i = 0; i < 3; i++) {  // three saves, a quiet second apart
    steps.push_back(e.WriteFile(kRoot, "step" + std::to_string(i), std::string(10 << 20, static_cast<char>('a' + i))));
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  // The last save, an O_TRUNC writer (torch.save): spares are worth their
  // memory, and its files are never evicted for one.
  auto latest = e.table->Mknod(kRoot, "latest", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  TruncOpenClose(e, latest->ino);
  e.tier->DropSpares();
  d.Start();
  d.Drain();
  for (uint64_t ino : steps) cr_assert_eq(e.table->GetAttr(ino)->state, ckpt::meta::DataState::kPersisted);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the quiet after a save
  e.table->RefillSpares();
  cr_assert_geq(e.tier->Spares().first, 10u << 20, "a spare as large as a save");
  cr_assert_eq(e.table->GetAttr(steps[0])->state, ckpt::meta::DataState::kRemote, "the oldest save made way");
  cr_assert_eq(e.table->GetAttr(steps[2])->state, ckpt::meta::DataState::kPersisted, "the newest stays");
  cr_assert_leq(e.tier->Stats().used, 40u << 20);
  // The last save's own files are never evicted for a spare (a restarted
  // trainer reads them next): a 30 MiB save in this 40 MiB budget gets no
  // spare rather than lose itself.
  e.tier->DropSpares();
  (void)e.table->Evict(64u << 20);  // the older steps make way
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto big = e.WriteFile(kRoot, "big", std::string(30 << 20, 'B'));
  TruncOpenClose(e, latest->ino);  // the same save: latest.pt
  d.Drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  e.table->RefillSpares();
  cr_assert_eq(e.table->GetAttr(big)->state, ckpt::meta::DataState::kPersisted, "the last save stays in RAM");
}

// Issue #29: spares cover the last save whole — every file of every rank —
// not only twice its largest file (8 ranks x 256 MiB got two spares, and
// six ranks wrote into fresh pages).
Test(drain, spares_cover_a_whole_save) {
  DrainEnv d(256ull << 20);
  Env& e = *d.env;
  ckpt::test::FakeBacking fb;
  WithSpares(e, &fb);
  TruncOpenClose(e, e.table->Mknod(kRoot, "latest", S_IFREG | 0644, 0, ckpt::fs::Caller{})->ino);
  for (int rank = 0; rank < 6; rank++)
    e.WriteFile(kRoot, "rank" + std::to_string(rank), std::string(4 << 20, static_cast<char>('a' + rank)));
  e.tier->DropSpares();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the quiet after a save
  for (int i = 0; i < 10; i++) e.table->RefillSpares();
  cr_assert_eq(e.tier->Spares().second, 6u, "one spare per file of the save: %zu", e.tier->Spares().second);
  cr_assert_eq(e.tier->Spares().first, 24u << 20);
}

// Fifos, sockets and devices never reach the backend, so the rename of one
// over a persisted file changed nothing there, and the file's old bytes
// stayed under its name for good. The name is removed in the backend now:
// also when the file renamed over it before was never sealed (its rename
// was a no-op there too, waiting for a persist that never comes).
Test(drain, special_file_renamed_over_a_persisted_file_removes_it) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "target", "old");
  e.WriteFile(kRoot, "target2", "old");
  d.Start();
  d.Drain();
  cr_assert_eq(d.Read("target"), "old");
  cr_assert(e.table->Mknod(kRoot, "p", S_IFIFO | 0644, 0, ckpt::fs::Caller{}).has_value());
  cr_assert(e.table->Rename(kRoot, "p", kRoot, "target", 0).has_value());
  d.Drain();
  cr_assert_not(d.Exists("target"), "the fifo's name still holds the replaced file's bytes");
  cr_assert_not(d.Exists("p"));
  // An open file renamed over target2, then a fifo over that one before its close.
  auto q = e.table->Mknod(kRoot, "q", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  cr_assert(q.has_value());
  cr_assert(e.table->Open(q->ino, O_RDWR).has_value());
  cr_assert(e.table->Rename(kRoot, "q", kRoot, "target2", 0).has_value());
  cr_assert(e.table->Mknod(kRoot, "p2", S_IFIFO | 0644, 0, ckpt::fs::Caller{}).has_value());
  cr_assert(e.table->Rename(kRoot, "p2", kRoot, "target2", 0).has_value());
  e.table->Release(q->ino, O_RDWR);
  d.Drain();
  cr_assert_not(d.Exists("target2"), "the fifo's name still holds the bytes the open file replaced");
}

// RENAME_EXCHANGE of a persisted file with a fifo: renameat2 needs both
// names, and the backend lacks the fifo, so the exchange was a no-op there
// and the file's bytes stayed under the name the fifo has now. They move
// to the file's new name, where a fetch looks for them.
Test(drain, exchange_with_a_fifo_moves_the_file_in_the_backend) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t a = e.WriteFile(kRoot, "a", "bytes of a");
  d.Start();
  d.Drain();
  cr_assert(e.table->Mknod(kRoot, "p", S_IFIFO | 0644, 0, ckpt::fs::Caller{}).has_value());
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "p", RENAME_EXCHANGE).has_value());
  d.Drain();
  cr_assert_eq(d.Read("p"), "bytes of a");
  cr_assert_not(d.Exists("a"), "the fifo's name holds the file's bytes");
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  auto fd = e.table->Open(a, O_RDONLY);
  cr_assert(fd.has_value(), "fetch after the exchange: %d", fd ? 0 : fd.error());
  std::string back(10, '\0');
  cr_assert_eq(pread(*fd, back.data(), back.size(), 0), 10);
  cr_assert_eq(back, "bytes of a");
  e.table->Release(a, O_RDONLY);
}

// The same with a file open since its creation, never sealed: its later
// persist, to its new name, overwrote the other file's only backend copy.
Test(drain, exchange_with_a_file_never_sealed_moves_the_other_in_the_backend) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t a = e.WriteFile(kRoot, "a", "bytes of a");
  d.Start();
  d.Drain();
  auto q = e.table->Mknod(kRoot, "q", S_IFREG | 0644, 0, ckpt::fs::Caller{});
  cr_assert(q.has_value());
  cr_assert(e.table->Open(q->ino, O_RDWR).has_value());
  std::string qb = "bytes of q";
  cr_assert(e.table->Write(q->ino, 0, qb.size(), [&](int f) { return pwrite(f, qb.data(), qb.size(), 0); }));
  cr_assert(e.table->Rename(kRoot, "a", kRoot, "q", RENAME_EXCHANGE).has_value());
  d.Drain();
  cr_assert_eq(d.Read("q"), "bytes of a");
  cr_assert_not(d.Exists("a"));
  e.table->Release(q->ino, O_RDWR);  // sealed under its new name, "a"
  d.Drain();
  cr_assert_eq(d.Read("a"), "bytes of q");
  cr_assert_eq(d.Read("q"), "bytes of a");
  cr_assert(e.table->Evict(1ull << 30) == ckpt::cache::Tier::Relief::kFreed);
  auto fd = e.table->Open(a, O_RDONLY);
  cr_assert(fd.has_value(), "fetch after the exchange: %d", fd ? 0 : fd.error());
  std::string back(10, '\0');
  cr_assert_eq(pread(*fd, back.data(), back.size(), 0), 10);
  cr_assert_eq(back, "bytes of a");
  e.table->Release(a, O_RDONLY);
}

// mknod(2) of a regular file: no open follows, so no close seals it. It is
// sealed empty at once (mknod's `seal`): it drains, it replaces what it is
// renamed over in the backend, and a restart keeps it.
Test(drain, mknod_of_a_regular_file_drains_it_empty) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "old", "old bytes");
  cr_assert(e.table->Mknod(kRoot, "empty", S_IFREG | 0644, 0, ckpt::fs::Caller{}, /*seal=*/true).has_value());
  d.Start();
  d.Drain();
  cr_assert(d.Exists("empty"), "a file made by mknod never drained");
  cr_assert_eq(stdfs::file_size(d.root + "/empty"), 0u);
  cr_assert_eq(e.table->Lookup(kRoot, "empty")->state, ckpt::meta::DataState::kPersisted);
  cr_assert(e.table->Mknod(kRoot, "e2", S_IFREG | 0644, 0, ckpt::fs::Caller{}, true).has_value());
  cr_assert(e.table->Rename(kRoot, "e2", kRoot, "old", 0).has_value());
  d.Drain();
  cr_assert_eq(d.Read("old"), "", "the replaced file's bytes are still there");
}

Test(drain, mknod_of_a_regular_file_survives_a_restart_before_its_drain) {
  Env e(KvKind::kRocks);
  cr_assert(e.table->Mknod(kRoot, "empty", S_IFREG | 0644, 0, ckpt::fs::Caller{}, true).has_value());
  e.Open();
  auto r = e.table->Lookup(kRoot, "empty");
  cr_assert(r.has_value(), "dropped at the restart as created but never closed");
  cr_assert_eq(r->size, 0u);
}

// Entries replica holders took over while this run was counted dead
// (Drainer::SkipTaken, from the holders' claims in etcd): those done are
// completed unapplied (a persist as published, its checksum from the
// tier), one a live holder claimed and has not done yet holds the drain
// until a refresh says it is done; a claim of a seq past the log (a tail
// the metadata lost) is set aside, and the new entry given that seq is
// published as any other.
Test(drain, entries_holders_took_are_completed_unapplied_and_claims_waited_for) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "staging");
  e.WriteFile(dir, "f", "the holder published these");
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  std::vector<uint64_t> seqs;
  for (const auto& en : pending) seqs.push_back(en.seq);
  cr_assert_geq(seqs.size(), 3u);
  const uint64_t rename_seq = seqs.back(), next = e.table->core().oplog.next_seq();
  std::vector<uint64_t> done(seqs.begin(), seqs.end() - 1);
  d.drainer = std::make_unique<ckpt::fs::Drainer>(&e.table->drain_port(), d.be.get(), 4);
  std::atomic<int> refreshes{0};
  ckpt::fs::Drainer* dr = d.drainer.get();
  dr->set_refresh_taken([&] {
    if (++refreshes >= 2) {  // the holder marked the rename done
      std::vector<uint64_t> all = seqs;
      all.push_back(next);
      dr->SkipTaken(all);
    }
  });
  done.push_back(next);  // a claim of a seq this log never reached
  dr->SkipTaken(done, {rename_seq});
  dr->Start();
  d.Drain(30);
  cr_expect_geq(refreshes.load(), 2, "the drain did not wait for the claimed rename");
  cr_expect_not(d.Exists("staging"), "a taken mkdir was applied");
  cr_expect_not(d.Exists("step"), "a taken rename was applied");
  auto f = e.table->Lookup(e.table->Lookup(kRoot, "step")->ino, "f");
  cr_assert(f.has_value());
  cr_expect_eq(f->state, ckpt::meta::DataState::kPersisted, "a taken persist is not persisted");
  cr_expect_neq(f->checksum_hi | f->checksum_lo, 0u, "no checksum for a taken persist");
  e.WriteFile(kRoot, "after", "new");  // gets seq `next`
  d.Drain(30);
  cr_expect_eq(d.Read("after"), "new", "the entry given a stale claim's seq was skipped");
}

// A holder gave up a file (or never held it) and went on to apply a later
// rename of its directory: the run back publishes the file where that
// rename left it, not at its logged name (which the rename is not applied
// again to move).
Test(drain, an_entry_the_holders_left_goes_where_their_later_renames_put_it) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "staging");
  e.WriteFile(dir, "f", "only the writer had these");
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  std::vector<uint64_t> taken;  // the mkdir and the rename; not the persist
  for (const auto& en : e.table->core().oplog.Pending(16))
    if (en.op != ckpt::meta::LogOp::kPersist) taken.push_back(en.seq);
  cr_assert_eq(taken.size(), 2u);
  cr_assert(d.be->Mkdir("step", {0755, 0, 0, false, 0, 0}).has_value());  // what the holder applied
  d.StartTaken(taken);
  d.Drain(30);
  cr_expect_eq(d.Read("step/f"), "only the writer had these");
  cr_expect_not(d.Exists("staging"), "published at the name the holder's rename had left");
}

// The holders applied, after a file they gave up, a new version of its
// name (latest.tmp renamed over `latest`): the run back does not publish
// the old bytes over it.
Test(drain, an_entry_a_holder_replaced_after_it_is_not_applied_over_the_new_name) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "latest", "step 1");
  e.WriteFile(kRoot, "latest.tmp", "step 2");
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);
  const std::vector<uint64_t> taken{pending[1].seq, pending[2].seq};  // not step 1's persist
  cr_assert(stdfs::exists(d.root));
  {
    std::ofstream f(d.root + "/latest");  // what the holder left
    f << "step 2";
  }
  d.StartTaken(taken);
  d.Drain(30);
  cr_expect_eq(d.Read("latest"), "step 2", "the given-up older version was published over the holder's newer one");
  cr_expect_not(d.Exists("latest.tmp"));
}

// A later entry is claimed and not yet marked: its holder may be applying
// it (a rename of the file's directory) now. The file, given up, waits for
// the mark, then goes where the rename left it.
Test(drain, an_entry_waits_while_a_later_one_is_claimed_and_unmarked) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "staging");
  e.WriteFile(dir, "f", "only the writer had these");
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);
  const uint64_t mkdir_seq = pending[0].seq, rename_seq = pending[2].seq;
  cr_assert(d.be->Mkdir("step", {0755, 0, 0, false, 0, 0}).has_value());  // what the holder applied
  std::atomic<int> refreshes{0};
  d.StartTaken({mkdir_seq}, {rename_seq}, [&](ckpt::fs::Drainer* dr) {
    if (++refreshes >= 2) dr->SkipTaken({mkdir_seq, rename_seq});  // the holder marked the rename done
  });
  d.Drain(30);
  cr_expect_geq(refreshes.load(), 2, "the given-up file did not wait for the claimed rename after it");
  cr_expect_eq(d.Read("step/f"), "only the writer had these");
  cr_expect_not(d.Exists("staging"));
}

// A file with three names, its new version given up by the holders, which
// went on to apply the rename of its directory and the removal of one name:
// the run back publishes it where the rename left it, and links it at its
// other names there, except the one removed since (not brought back).
Test(drain, an_entry_the_holders_left_reaches_its_other_names_where_they_left_them) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "staging");
  uint64_t f = e.WriteFile(dir, "f", "version one");
  cr_assert(e.table->Link(f, dir, "g").has_value());
  cr_assert(e.table->Link(f, dir, "h").has_value());
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("staging/h"), "version one");
  d.drainer->Stop();
  d.drainer.reset();
  e.Overwrite(f, "version two");  // a persist naming the three
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  cr_assert(e.table->Unlink(dir, "h").has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);
  cr_assert_eq(pending[0].op, ckpt::meta::LogOp::kPersist);
  cr_assert_neq(pending[0].path2.find('\0'), std::string::npos, "the persist does not name the file's other two");
  // What the holders applied: the rename and the unlink, not the persist.
  cr_assert(d.be->Rename("staging", "step", false).has_value());
  cr_assert(d.be->Remove("step/h").has_value());
  d.StartTaken({pending[1].seq, pending[2].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("step/f"), "version two");
  cr_expect_eq(d.Read("step/g"), "version two", "the other name was not linked where the rename left it");
  cr_expect_not(d.Exists("step/h"), "a name the holders removed after the persist came back");
  cr_expect_not(d.Exists("staging"), "published at the names the holders' rename had left");
}

// A rename given up by the holders, which went on to rename its target's
// directory: the run back moves the file where that rename left the
// target, not into the directory's old name.
Test(drain, a_rename_the_holders_left_goes_to_where_they_left_its_target) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "a", "moved");
  uint64_t dir = e.Mkdir(kRoot, "staging");
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("a"), "moved");
  d.drainer->Stop();
  d.drainer.reset();
  cr_assert(e.table->Rename(kRoot, "a", dir, "a", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 2u);
  cr_assert(d.be->Rename("staging", "step", false).has_value());  // what the holder applied
  d.StartTaken({pending[1].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("step/a"), "moved");
  cr_expect_not(d.Exists("a"), "the file stayed at its old name");
  cr_expect_not(d.Exists("staging"), "moved into the name the holder's rename had left");
}

// A rename the holders gave up (or never had), then one they applied onto
// the same target: applied late, it put the older file over the newer one
// — `latest` pointing back a checkpoint. Its target is theirs now; it is
// not applied there; what is left of it is its source's removal.
Test(drain, a_rename_whose_target_the_holders_replaced_is_not_applied_over_it) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "step_5.tmp", "five");
  e.WriteFile(kRoot, "step_6.tmp", "six");
  d.DrainAllThenStop();
  cr_assert(e.table->Rename(kRoot, "step_5.tmp", kRoot, "latest", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "step_6.tmp", kRoot, "latest", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 2u);
  cr_assert(d.be->Rename("step_6.tmp", "latest", false).has_value());  // what the holder applied
  d.StartTaken({pending[1].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("latest"), "six", "the older rename was applied over the newer one");
  cr_expect_not(d.Exists("step_5.tmp"), "the rename's source stayed in the backend");
  cr_expect_eq(e.table->core().oplog.Pending(16).size(), 0u);
}

// The same, and then they put a new file at the rename's source: what was
// left of the rename (its source's removal) is theirs too; not applied.
Test(drain, a_superseded_renames_source_they_wrote_again_is_not_removed) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "latest.tmp", "five");
  e.WriteFile(kRoot, "other.tmp", "six");
  d.DrainAllThenStop();
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());
  cr_assert(e.table->Rename(kRoot, "other.tmp", kRoot, "latest", 0).has_value());
  e.WriteFile(kRoot, "latest.tmp", "seven");
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);
  // What the holder applied: the second rename and the new file.
  // (Its publish of "seven" at latest.tmp: the old bytes stand for it here.)
  cr_assert(d.be->Rename("other.tmp", "latest", false).has_value());
  d.StartTaken({pending[1].seq, pending[2].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("latest"), "six");
  cr_expect(d.Exists("latest.tmp"), "the file they wrote at the superseded rename's source was removed");
  cr_expect_eq(e.table->core().oplog.Pending(16).size(), 0u);
}

// The atomic symlink swap (`ln -s step_N latest.tmp && mv -T latest.tmp
// latest`) twice, the first rename given up: the symlink the holders made
// at latest.tmp after it is a new object, not the one that rename moves.
// Taken for it, the rename's target check found the holders' second rename
// over `latest` and removed their `latest` (stop 58's review).
Test(drain, a_symlink_swap_the_holders_made_again_keeps_their_latest) {
  DrainEnv d;
  Env& e = *d.env;
  cr_assert(e.table->Symlink(kRoot, "latest.tmp", "step_5", ckpt::fs::Caller{}).has_value());
  d.DrainAllThenStop();
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());
  cr_assert(e.table->Symlink(kRoot, "latest.tmp", "step_6", ckpt::fs::Caller{}).has_value());
  cr_assert(e.table->Rename(kRoot, "latest.tmp", kRoot, "latest", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);
  // What the holders' symlink and rename left in the backend.
  stdfs::remove(d.root + "/latest.tmp");
  stdfs::create_symlink("step_6", d.root + "/latest");
  d.StartTaken({pending[1].seq, pending[2].seq});
  d.Drain(30);
  cr_assert(d.Exists("latest"), "the holders' latest was removed");
  cr_expect_eq(stdfs::read_symlink(d.root + "/latest").string(), std::string("step_6"));
  cr_expect_not(d.Exists("latest.tmp"));
  cr_expect_eq(e.table->core().oplog.Pending(16).size(), 0u);
}

// A persist given up, then a hard link of the file the holders applied
// (ENOENT there: no file yet, taken as done): the run back publishes the
// file and links it at that name too. It was published at its own name
// only (the persist, logged at the close, names no link).
Test(drain, a_persist_the_holders_left_reaches_a_name_they_linked_after_it) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t dir = e.Mkdir(kRoot, "step_5");
  uint64_t f = e.WriteFile(dir, "model.pt", "five");
  cr_assert(e.table->Link(f, kRoot, "best.pt").has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 3u);  // mkdir, persist, link
  cr_assert_eq(pending[1].op, ckpt::meta::LogOp::kPersist);
  cr_assert(d.be->Mkdir("step_5", {0755, 0, 0, false, 0, 0}).has_value());  // theirs; their link found nothing
  d.StartTaken({pending[0].seq, pending[2].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("step_5/model.pt"), "five");
  cr_expect_eq(d.Read("best.pt"), "five", "the name they linked after it never reached the backend");
}

// A new version given up, then the holders removed its main name (the
// file lives on under a hard link): the run back publishes it at the name
// left. It was completed as superseded, and the link kept the old bytes.
Test(drain, a_persist_whose_name_the_holders_removed_goes_to_its_other_name) {
  DrainEnv d;
  Env& e = *d.env;
  uint64_t f = e.WriteFile(kRoot, "a", "version one");
  cr_assert(e.table->Link(f, kRoot, "b").has_value());
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("b"), "version one");
  d.drainer->Stop();
  d.drainer.reset();
  e.Overwrite(f, "version two");  // a persist naming a and b
  cr_assert(e.table->Unlink(kRoot, "a").has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 2u);
  cr_assert(d.be->Remove("a").has_value());  // what the holder applied
  d.StartTaken({pending[1].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("b"), "version two", "the new version did not reach the name the file lives on under");
  cr_expect_not(d.Exists("a"), "the name the holders removed came back");
}

// An exchange given up, then the holders renamed its target's directory:
// the run back exchanges the two where that rename left them (an exchange's
// target is an object of its own: followed like its source).
Test(drain, an_exchange_the_holders_left_goes_to_where_they_left_its_target) {
  DrainEnv d;
  Env& e = *d.env;
  e.WriteFile(kRoot, "a", "was a");
  uint64_t dir = e.Mkdir(kRoot, "staging");
  e.WriteFile(dir, "b", "was b");
  d.Start();
  d.Drain(30);
  cr_assert_eq(d.Read("staging/b"), "was b");
  d.drainer->Stop();
  d.drainer.reset();
  cr_assert(e.table->Rename(kRoot, "a", dir, "b", RENAME_EXCHANGE).has_value());
  cr_assert(e.table->Rename(kRoot, "staging", kRoot, "step", 0).has_value());
  auto pending = e.table->core().oplog.Pending(16);
  cr_assert_eq(pending.size(), 2u);
  cr_assert(d.be->Rename("staging", "step", false).has_value());  // what the holder applied
  d.StartTaken({pending[1].seq});
  d.Drain(30);
  cr_expect_eq(d.Read("a"), "was b");
  cr_expect_eq(d.Read("step/b"), "was a", "the exchange did not follow its target's directory");
  cr_expect_not(d.Exists("staging"), "the exchange made the directory's old name again");
}
