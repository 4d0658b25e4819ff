// test_cluster_durable.cc — a node's record tells the others no applied seq
// a machine crash could undo (fs/cluster/log_view.h): the cluster over the
// real OpLog and LocalLog, on a Kv whose syncs the test watches and fails.
#include <criterion/criterion.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "fs/cluster/cluster.h"
#include "fs/core/oplog.h"
#include "fs/meta/kv.h"
#include "tests/unit/fs/mem_records.h"

using ckpt::Result;
using ckpt::Status;
using ckpt::fs::Cluster;
using ckpt::fs::ClusterOptions;
using ckpt::fs::OpLog;
using ckpt::meta::Batch;
using ckpt::meta::LogEntry;
using ckpt::meta::LogOp;

namespace {

// A MemKv whose Sync is watched: what the log had applied when each began
// (what it covers: every completion committed before it), how many, a
// failure on demand, and something to do while it runs.
class SyncKv final : public ckpt::meta::Kv {
 public:
  explicit SyncKv(OpLog* log) : log_(log) {}
  bool fail = false;
  int syncs = 0;
  uint64_t covered = 0;          // the applied seq the last successful sync covers
  std::function<void()> during;  // runs inside the sync, after it began
  Result<std::string> Get(std::string_view k) override { return inner_->Get(k); }
  Status Write(const Batch& b, bool sync) override { return inner_->Write(b, sync); }
  Status Sync() override {
    syncs++;
    const uint64_t began = log_->AppliedSeq();
    if (during) during();
    if (fail) return std::unexpected(EIO);
    covered = began;
    return {};
  }
  Status Scan(std::string_view p, const std::function<bool(std::string_view, std::string_view)>& fn) override {
    return inner_->Scan(p, fn);
  }

 private:
  OpLog* const log_;
  std::unique_ptr<ckpt::meta::Kv> inner_ = ckpt::meta::NewMemKv();
};

// The store of records, checking each put of this node's: its applied_seq
// must be covered by a sync that succeeded before the put.
struct CheckedRecords : ckpt::test::MemRecords {
  SyncKv* kv = nullptr;
  int checked = 0;
  Status Put(const std::string& node, const std::string& bytes) override {
    const uint64_t applied = nlohmann::json::parse(bytes).value("applied_seq", uint64_t{0});
    cr_expect_leq(applied, kv->covered, "record of %s: applied_seq %lu, but the metadata is durable up to %lu only",
                  node.c_str(), static_cast<unsigned long>(applied), static_cast<unsigned long>(kv->covered));
    checked++;
    return MemRecords::Put(node, bytes);
  }
};

// Logs one namespace entry and completes it as the drain does (Complete,
// the commit, Finish; the commit is the test's: nothing is read back).
uint64_t ApplyOne(OpLog* log) {
  Batch b;
  std::vector<LogEntry> out;
  LogEntry e;
  e.op = LogOp::kMkdir;
  e.path = "d" + std::to_string(log->next_seq());
  log->Append(&b, std::move(e), &out);
  log->Publish(std::move(out));
  const LogEntry head = log->Pending(1).at(0);
  OpLog::Due due;
  Batch done;
  log->Finish(log->Complete(head, OpLog::Outcome::kApplied, "", &done), &due);
  return log->AppliedSeq();
}

uint64_t RecordApplied(ckpt::test::MemRecords& store, const std::string& node) {
  return nlohmann::json::parse(store.recs.at(node)).at("applied_seq").get<uint64_t>();
}

}  // namespace

// The drain applied two entries, and the metadata cannot be synced (its
// completions may still roll back with a machine crash): the record keeps
// the seq the last sync covered. Once a sync succeeds it shows them. The
// etcd store deletes this node's claims up to that seq, and the holders
// drop its replicas by it: told early, a crash left the entries pending
// with neither.
Test(cluster_durable, the_record_shows_no_applied_seq_before_a_sync_covers_it) {
  OpLog log;
  SyncKv kv(&log);
  CheckedRecords store;
  store.kv = &kv;
  auto view = ckpt::fs::LocalLog(&log, &kv);
  ClusterOptions o;
  o.name = "job";
  o.node = "a";
  int64_t now = 1000;
  Cluster c(o, &store, view.get(), "", [&] { return now * 1000; });
  c.Init();
  c.Heartbeat();
  cr_expect_eq(RecordApplied(store, "a"), 0u);
  cr_expect_eq(kv.syncs, 0, "nothing applied: nothing to sync");
  ApplyOne(&log);
  cr_assert_eq(ApplyOne(&log), 2u);
  kv.fail = true;
  now = 1100;
  c.Heartbeat();
  cr_expect_eq(kv.syncs, 1, "one sync a record");
  cr_expect_eq(RecordApplied(store, "a"), 0u, "applied_seq told before the metadata was durable");
  kv.fail = false;
  now = 1200;
  c.Heartbeat();
  cr_expect_eq(kv.syncs, 2);
  cr_expect_eq(RecordApplied(store, "a"), 2u, "durable now: shown");
  now = 1300;
  c.Heartbeat();
  cr_expect_eq(kv.syncs, 2, "nothing applied since: no sync");
  cr_expect_eq(RecordApplied(store, "a"), 2u);
  cr_expect_eq(store.checked, 4);
}

// An entry applied while the sync runs is not covered by it: the seq the
// record may show is the one read before the sync began.
Test(cluster_durable, an_entry_applied_during_the_sync_is_not_covered) {
  OpLog log;
  SyncKv kv(&log);
  CheckedRecords store;
  store.kv = &kv;
  auto view = ckpt::fs::LocalLog(&log, &kv);
  ClusterOptions o;
  o.name = "job";
  o.node = "a";
  int64_t now = 1000;
  Cluster c(o, &store, view.get(), "", [&] { return now * 1000; });
  c.Init();
  cr_assert_eq(ApplyOne(&log), 1u);
  kv.during = [&] { ApplyOne(&log); };  // entry 2, applied during the sync
  c.Heartbeat();
  kv.during = nullptr;
  cr_expect_eq(log.AppliedSeq(), 2u);
  cr_expect_eq(RecordApplied(store, "a"), 1u);
  now = 1100;
  c.Heartbeat();
  cr_expect_eq(RecordApplied(store, "a"), 2u, "the next record's sync covers it");
}

// LocalLog's DurableAppliedSeq: at most one sync a call, none when nothing
// was applied since the last, the seq read before the sync, the last
// durable one while syncs fail; and a first sync after a restart (the
// counter read back may be in the page cache only, after a crash of the
// process).
Test(cluster_durable, durable_applied_seq_syncs_only_for_new_completions) {
  OpLog log;
  SyncKv kv(&log);
  auto view = ckpt::fs::LocalLog(&log, &kv);
  cr_expect_eq(view->DurableAppliedSeq(), 0u);
  cr_expect_eq(kv.syncs, 0);
  ApplyOne(&log);
  cr_expect_eq(view->DurableAppliedSeq(), 1u);
  cr_expect_eq(view->DurableAppliedSeq(), 1u);
  cr_expect_eq(kv.syncs, 1);
  ApplyOne(&log);
  kv.during = [&] { ApplyOne(&log); };
  cr_expect_eq(view->DurableAppliedSeq(), 2u, "3 was applied during the sync");
  kv.during = nullptr;
  cr_expect_eq(kv.syncs, 2);
  cr_expect_eq(view->DurableAppliedSeq(), 3u);
  cr_expect_eq(kv.syncs, 3);
  kv.fail = true;
  ApplyOne(&log);
  cr_expect_eq(view->DurableAppliedSeq(), 3u, "a failed sync makes nothing durable");
  cr_expect_eq(view->DurableAppliedSeq(), 3u);
  cr_expect_eq(kv.syncs, 5, "tried again at each call");
  kv.fail = false;
  cr_expect_eq(view->DurableAppliedSeq(), 4u);

  OpLog restarted;
  restarted.Restore(7, {});
  SyncKv kv2(&restarted);
  auto view2 = ckpt::fs::LocalLog(&restarted, &kv2);
  cr_expect_eq(view2->DurableAppliedSeq(), 7u);
  cr_expect_eq(kv2.syncs, 1, "the applied counter read back at start-up is synced before it is told");
}
