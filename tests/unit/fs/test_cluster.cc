// test_cluster.cc — fs/cluster: sample and gate-time math, the publish rule
// across members, death, leaving and restart, with a fake clock, fake logs
// and a fake record store (no backend, no threads).
#include <criterion/criterion.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "fs/cluster/cluster.h"
#include "fs/cluster/takeover.h"
#include "tests/unit/fs/mem_records.h"

using ckpt::Result;
using ckpt::Status;
using ckpt::fs::Cluster;
using ckpt::fs::ClusterOptions;
using ckpt::fs::HeldForOthers;

namespace {

// One shared store of records, as the backend's reserved area.
using FakeStore = ckpt::test::MemRecords;

// A node's drain log: entries logged (seq, path) and how far it is applied.
struct FakeLog : ckpt::fs::LogView {
  std::vector<std::string> paths;  // paths[i] is seq i + 1
  uint64_t applied = 0;
  std::map<uint64_t, int64_t> times;  // when logged, for LoggedTimes (none: unknown)
  uint64_t Log(const std::string& p) {
    paths.push_back(p);
    return paths.size();
  }
  // Logged at `t` ms (LogAtUs: µs; the cluster's times are µs, the tests'
  // clocks and times ms unless they say otherwise).
  uint64_t LogAt(const std::string& p, int64_t t) { return LogAtUs(p, t * 1000); }
  uint64_t LogAtUs(const std::string& p, int64_t t) {
    times[Log(p)] = t;
    return paths.size();
  }
  std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) override {
    std::vector<std::pair<uint64_t, int64_t>> out;
    for (auto it = times.lower_bound(from); it != times.end() && it->first <= to; ++it) out.push_back(*it);
    return out;
  }
  uint64_t LoggedSeq() override { return paths.size(); }
  uint64_t AppliedSeq() override { return applied; }
  uint64_t DurableAppliedSeq() override { return applied; }  // nothing behind it to sync
  std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) override {
    std::pair<uint64_t, std::vector<std::string>> out{0, {}};
    for (size_t i = applied; i < paths.size(); i++)
      if (out.first++ < max) out.second.push_back(paths[i]);
    return out;
  }
};

struct Node {
  FakeLog log;
  std::unique_ptr<Cluster> c;
  Node(const std::string& id, FakeStore* store, int64_t* clock, int64_t timeout_ms = 60000,
       const std::string& samples = "", const std::string& incarnation = "") {
    ClusterOptions o;
    o.name = "job";
    o.node = id;
    o.incarnation = incarnation;
    o.member_timeout_ms = timeout_ms;
    o.max_skew_ms = 50;
    c = std::make_unique<Cluster>(o, store, &log, samples, [clock] { return *clock * 1000; });
    c->Init();
  }
};

// The cluster's times (µs) in the tests' unit (ms).
int64_t Ms(std::optional<int64_t> us) { return us.value() / 1000; }

// `latest`, logged on node a after `shard` on node b: the heartbeats at
// `at` ms (b, a, b) hold it while the shard is pending, let the shard
// pass, and at `at` + 100 ms, once b's drain applied the shard, let it go.
void ExpectShardFirst(Node& a, Node& b, int64_t* now, int64_t at, uint64_t shard, uint64_t latest, const char* why) {
  *now = at;
  b.c->Heartbeat();
  a.c->Heartbeat();
  b.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "%s", why);
  cr_expect(b.c->MayPublish(shard), "the oldest entry of the cluster must pass");
  b.log.applied = shard;
  *now = at + 100;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest));
}

}  // namespace

// A lost member's paths come from its record (another node's names): a
// newline in one cannot make the warning two log lines.
Test(cluster, lost_files_text_escapes_the_path_it_names) {
  const std::string t = ckpt::fs::LostFilesText(3, 2, {"step_9/rank0\n[error] forged line"});
  cr_expect(t.find('\n') == std::string::npos, "%s", t.c_str());
  cr_expect(t.find("step_9/rank0") != std::string::npos, "%s", t.c_str());
}

Test(cluster, gate_times_and_watermark) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  cr_expect_eq(Ms(a.c->Watermark()), 1000);  // nothing pending: the sample's time
  now = 1050;
  uint64_t s1 = a.log.Log("step1/shard");
  uint64_t s2 = a.log.Log("step1/other");
  cr_expect(!a.c->GateTime(s1).has_value());  // no sample saw it yet
  a.c->Sample();
  cr_expect_eq(Ms(a.c->GateTime(s1)), 1050);
  cr_expect_eq(Ms(a.c->GateTime(s2)), 1050);
  cr_expect_eq(Ms(a.c->Watermark()), 1000);  // closed after 1000, pending
  now = 1100;
  uint64_t s3 = a.log.Log("latest");
  a.c->Sample();
  cr_expect_eq(Ms(a.c->GateTime(s3)), 1100);
  cr_expect_eq(Ms(a.c->GateTime(s1)), 1050);
  // Idle samples while the drain stands still: a run keeps its first and
  // last only.
  for (int i = 0; i < 100; i++) {
    now += 50;
    a.c->Sample();
  }
  cr_expect_leq(a.c->SampleCount(), 5u);
  cr_expect_eq(Ms(a.c->GateTime(s3)), 1100);
  a.log.applied = s2;
  now += 50;
  a.c->Sample();
  cr_expect_eq(Ms(a.c->Watermark()), 1050);  // the newest sample that saw only s1, s2
  a.log.applied = s3;
  now += 50;
  a.c->Sample();
  cr_expect_eq(Ms(a.c->Watermark()), now);
  cr_expect_leq(a.c->SampleCount(), 2u);  // pruned
}

// Shards and latest 4 ms apart, both first seen by the same sample period:
// the samples alone give them the same gate time (and node a's latest would
// pass first, by node id); the times they were logged order them.
Test(cluster, exact_log_times_order_entries_closer_than_a_sample) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  a.c->Heartbeat();
  b.c->Heartbeat();
  uint64_t shard_b = b.log.LogAt("step1/shard_b", 1003);
  uint64_t latest = a.log.LogAt("latest", 1007);
  now = 1010;
  a.c->Sample();
  b.c->Sample();
  cr_expect_eq(Ms(a.c->GateTime(latest)), 1007);
  cr_expect_eq(Ms(b.c->GateTime(shard_b)), 1003);
  ExpectShardFirst(a, b, &now, 1100, shard_b, latest, "latest passed a shard closed 4 ms before it");
}

// A shard closed on node b and `latest` on node a 0.4 ms later, after a
// barrier faster than a millisecond: in ms both gates were 1003 and the tie
// went by node id, `latest` first (multinode_jobs, 2 CI runs of 9); in µs
// the shard comes first.
Test(cluster, entries_within_one_millisecond_keep_their_order) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  a.c->Heartbeat();
  b.c->Heartbeat();
  uint64_t shard_b = b.log.LogAtUs("step1/shard_b", 1'003'300);
  uint64_t latest = a.log.LogAtUs("latest", 1'003'700);
  now = 1010;
  a.c->Sample();
  b.c->Sample();
  cr_expect_eq(a.c->GateTime(latest).value(), 1'003'700);
  ExpectShardFirst(a, b, &now, 1100, shard_b, latest, "latest passed a shard closed 0.4 ms before it");
  // The record carries µs, and ms for members still on version 1.
  auto j = nlohmann::json::parse(store.recs["a"]);
  cr_expect_eq(j["version"].get<int>(), 2);
  cr_expect_eq(j["oldest_gate_us"].get<int64_t>(), 1'003'700);
  cr_expect_eq(j["oldest_gate_ms"].get<int64_t>(), 1003);
  cr_expect_eq(j["heartbeat_us"].get<int64_t>(), j["heartbeat_ms"].get<int64_t>() * 1000);
}

// A member still on version 1 (records in ms) is read as the start of each
// millisecond: its heartbeat older, its pending file earlier — the safe side.
Test(cluster, reads_a_version_1_record) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  auto v1 = [&](int64_t heartbeat, std::optional<int64_t> gate) {
    store.recs["z"] = nlohmann::json{{"version", 1},       {"node", "z"},
                                     {"cluster", "job"},   {"state", "live"},
                                     {"heartbeat_ms", heartbeat}, {"watermark_ms", 0},
                                     {"oldest_gate_ms", gate ? nlohmann::json(*gate) : nullptr},
                                     {"unpersisted", gate ? 1 : 0}, {"paths", nlohmann::json::array()}}
                          .dump();
  };
  v1(1100, 1003);  // z: a file pending since 1003 ms (1003.0-1003.999)
  uint64_t latest = a.log.LogAtUs("latest", 1'003'500);
  now = 1100;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "passed z's file of the same millisecond");
  auto st = a.c->Status();
  cr_assert_eq(st.members.size(), 2u);
  cr_expect_eq(st.members[1].oldest_gate_ms.value(), 1003);
  v1(1200, std::nullopt);
  now = 1200;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest));
}

Test(cluster, later_entry_waits_for_an_earlier_one_on_another_node) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  a.c->Heartbeat();
  b.c->Heartbeat();
  now = 2000;
  uint64_t shard_b = b.log.Log("step1/shard_b");
  b.c->Sample();
  // The barrier; then a's latest, a sample later.
  now = 2100;
  uint64_t latest = a.log.Log("latest");
  a.c->Sample();
  now = 2200;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "latest passed while b's shard is pending");
  auto st = a.c->Status();
  cr_expect(st.waiting);
  cr_assert_eq(st.waiting_for.size(), 1u);
  cr_expect_eq(st.waiting_for[0], std::string("b"));
  cr_expect(!b.c->MayPublish(shard_b), "a's record read by b predates the shard");
  b.c->Heartbeat();  // reads a's newer record
  cr_expect(b.c->MayPublish(shard_b), "the oldest entry of the cluster must pass");
  b.log.applied = shard_b;  // b's drain published it
  now = 2300;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest));
  cr_expect(!a.c->Status().waiting);
}

Test(cluster, record_must_be_newer_than_the_entry_plus_skew) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  b.c->Heartbeat();  // b: nothing pending, record at 1000
  now = 1200;
  uint64_t e = a.log.Log("latest");
  a.c->Sample();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(e), "b's record predates the entry");
  now = 1240;  // within the skew margin of the gate (1200 + 50)
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(e));
  now = 1260;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(e));
}

// Entries closed on two nodes in the same sample period: each node's record
// shows the other a pending entry with the same gate time. The (gate, node)
// order lets the smaller pass, then the other: no deadlock.
Test(cluster, concurrent_entries_do_not_deadlock) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now), c("c", &store, &now);
  now = 1500;
  uint64_t ea = a.log.Log("step1/shard_a");
  uint64_t eb = b.log.Log("step1/shard_b");
  uint64_t ec = c.log.Log("step1/shard_c");
  for (Node* n : {&a, &b, &c}) n->c->Sample();
  now = 1600;
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  cr_expect(a.c->MayPublish(ea));
  cr_expect(!b.c->MayPublish(eb));
  cr_expect(!c.c->MayPublish(ec));
  a.log.applied = ea;
  now = 1700;
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  cr_expect(b.c->MayPublish(eb));
  cr_expect(!c.c->MayPublish(ec));
  b.log.applied = eb;
  now = 1800;
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  cr_expect(c.c->MayPublish(ec));
}

Test(cluster, dead_member_is_ignored_and_its_files_listed_lost) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000);
  now = 1100;
  b.log.Log("step2/shard_b");
  b.c->Heartbeat();
  now = 1200;
  uint64_t latest = a.log.Log("latest");
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest));
  // b stops (killed): no more heartbeats.
  now = 4000;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "b is not dead yet (2.9 s)");
  now = 4200;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest));
  auto st = a.c->Status();
  bool found = false;
  for (auto& m : st.members) {
    if (m.node != "b") continue;
    found = true;
    cr_expect_eq(m.state, std::string("dead"));
    cr_assert_eq(m.paths.size(), 1u);
    cr_expect_eq(m.paths[0], std::string("step2/shard_b"));
    cr_expect_geq(m.age_ms, 3000);
  }
  cr_expect(found);
  // b restarts with the same id: live again, its entry holds a back.
  now = 4300;
  b.c->Heartbeat();
  now = 4400;
  uint64_t latest2 = a.log.Log("latest");
  a.c->Sample();
  now = 4500;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest2));
}

// b is replaced before it is dead: a new machine mounts under its id with
// a new state dir and overwrites its record (nothing pending). b's run is
// not back: its entry still holds a's `latest` until the run is dead by its
// last heartbeat, then its file is listed lost, as for any dead member —
// the new record does not make it vanish (that let `latest` pass at once,
// with b's shard lost and never named).
Test(cluster, a_new_run_under_a_members_id_does_not_erase_the_old_runs_files) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000, "", "aaaa"), b("b", &store, &now, 3000, "", "b0b0");
  now = 1100;
  b.log.Log("step2/shard_b");
  b.c->Heartbeat();
  now = 1200;
  uint64_t latest = a.log.Log("latest");
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest));
  now = 1300;  // b is killed; a new run mounts under its id at once
  Node b2("b", &store, &now, 3000, "", "b1b1");
  b2.c->Heartbeat();
  now = 1400;
  a.c->Heartbeat();
  now = 2000;
  b2.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "b's first run had step2/shard_b pending: its new run does not erase it");
  now = 4200;
  b2.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest), "b's first run is dead by its last heartbeat");
  int dead = 0, live = 0;
  for (auto& m : a.c->Status().members) {
    if (m.node != "b") continue;
    if (m.state == "dead") {
      dead++;
      cr_assert_eq(m.paths.size(), 1u);
      cr_expect_eq(m.paths[0], std::string("step2/shard_b"));
    } else {
      live++;
    }
  }
  cr_expect(dead == 1 && live == 1, "b's runs: %d dead, %d live", dead, live);
}

// A member that joins between two reads of the records, and closes a file
// before this node's entry: the entry waits for a read that sees it.
Test(cluster, member_joining_late_is_seen_before_publishing) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  a.c->Heartbeat();  // reads: a alone
  now = 1100;
  Node b("b", &store, &now);
  b.c->Join();
  uint64_t eb = b.log.Log("step1/shard_b");
  b.c->Sample();
  now = 1200;
  uint64_t ea = a.log.Log("latest");
  a.c->Sample();
  cr_expect(!a.c->MayPublish(ea), "published before reading the records again");
  now = 1300;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(ea), "b's record shows its earlier shard");
  b.log.applied = eb;
  b.c->Heartbeat();
  now = 1400;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(ea));
}

Test(cluster, member_that_left_does_not_hold_others) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  b.c->Heartbeat();
  cr_expect(b.c->Leave());
  now = 1200;
  uint64_t e = a.log.Log("latest");
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(e), "records not read since the entry's close");
  now = 1300;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(e));
  auto st = a.c->Status();
  cr_assert_eq(st.members.size(), 2u);
  cr_expect_eq(st.members[1].state, std::string("left"));
  // A node with pending entries does not write "left".
  Node c("c", &store, &now);
  c.log.Log("x");
  cr_expect(!c.c->Leave());
}

Test(cluster, unreadable_records_and_store_errors) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  store.recs["z"] = "not json";
  store.recs["y"] = nlohmann::json{{"node", "other"}, {"cluster", "job"}}.dump();  // names another node
  now = 1100;
  uint64_t e = a.log.Log("f");
  a.c->Heartbeat();
  now = 1200;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(e));  // nothing readable holds it
  cr_expect_eq(a.c->Status().members.size(), 1u);
  cr_expect(!a.c->Status().node_id_clash);
  // Another mount writing as node a is noticed: the record read back is
  // not the one written.
  store.recs["a"] = nlohmann::json{{"node", "a"}, {"cluster", "job"}, {"state", "live"}}.dump();
  now = 1250;
  a.c->MayPublish(e + 1);  // waits (no sample saw it): the next tick reads
  a.c->Tick();
  cr_expect(a.c->Status().node_id_clash);
  store.down = true;
  a.c->Heartbeat();
  cr_expect(!a.c->Status().last_error.empty());
  store.down = false;
  a.c->Heartbeat();
  cr_expect(a.c->Status().last_error.empty());
}

// Gate times survive a restart (the samples file, kept at every change);
// an entry logged after the last sample (the daemon killed before its
// sampler saw it) gets the last sample time kept alive plus one period —
// not the restart time, which let another node's later `latest` pass it
// (seed 103 of the multi-node crash harness).
Test(cluster, gate_times_survive_a_restart) {
  char tmpl[] = "/tmp/clunit-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  std::string path = std::string(tmpl) + "/cluster-samples";
  FakeStore store;
  int64_t now = 1000;
  std::vector<std::string> logged;
  {
    Node a("a", &store, &now, 60000, path);
    now = 1100;
    a.log.Log("s1");
    a.c->Heartbeat();  // samples kept at each heartbeat
    now = 1200;
    a.log.Log("s2");
    a.c->Sample();  // seen, and kept at once
    now = 1250;
    a.log.Log("s3");  // logged, then the "crash" before the next sample
    logged = a.log.paths;
  }
  now = 5000;
  FakeLog log;
  log.paths = logged;
  ClusterOptions o;
  o.name = "job";
  o.node = "a";
  auto c = std::make_unique<Cluster>(o, &store, &log, path, [&now] { return now * 1000; });
  c->Init();
  cr_expect_eq(Ms(c->GateTime(1)), 1100);
  cr_expect_eq(Ms(c->GateTime(2)), 1200);
  cr_expect_eq(Ms(c->GateTime(3)), 1210, "got %lld", static_cast<long long>(c->GateTime(3).value_or(-1000) / 1000));
  cr_expect_eq(Ms(c->Watermark()), 1000);
  c.reset();
  // A samples file ahead of the log (the log lost entries) is not used.
  FakeLog shorter;
  Cluster c2(o, &store, &shorter, path, [&now] { return now * 1000; });
  c2.Init();
  shorter.Log("new");
  cr_expect(!c2.GateTime(1).has_value());
  std::filesystem::remove_all(tmpl);
}

// A member restarted with an entry pending (its drain held) names that
// entry's gate from its samples: its exact time died with the run, and the
// samples' is later than the one the entry's replica was sent with. By the
// times, its first record said the replica applied, and the holder dropped
// the only copy (Takeover). The record's log position says it is not.
Test(cluster, a_restarted_members_record_does_not_say_its_pending_replica_applied) {
  using ckpt::fs::replica::ShowsApplied;
  using ckpt::fs::replica::WriterRecord;
  char tmpl[] = "/tmp/clunit-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  const std::string path = std::string(tmpl) + "/cluster-samples";
  FakeStore store;
  int64_t now = 1000;
  const int64_t exact = 1'100'300;  // µs: when f was logged, the gate its replica carries
  uint64_t seq = 0;
  std::vector<std::string> logged;
  auto record = [&] {
    auto j = nlohmann::json::parse(store.recs["a"]);
    WriterRecord w{.heartbeat_us = j["heartbeat_us"].get<int64_t>(), .applied_seq = j["applied_seq"].get<uint64_t>()};
    if (!j["oldest_gate_us"].is_null()) w.oldest_gate_us = j["oldest_gate_us"].get<int64_t>();
    return w;
  };
  {
    Node a("a", &store, &now, 60000, path, "run1");
    a.log.Log("s0");
    a.log.applied = 1;
    now = 1100;
    seq = a.log.LogAtUs("f", exact);
    now = 1105;
    a.c->Heartbeat();
    cr_expect_eq(record().oldest_gate_us.value_or(0), exact);
    logged = a.log.paths;
  }
  const ckpt::fs::replica::Replica replica(
      ckpt::fs::replica::Held{.key = {.writer = "a", .ino = 7, .version = 1},
                              .gate_us = static_cast<uint64_t>(exact),
                              .meta = ckpt::fs::replica::EncodeMeta({.seq = seq, .incarnation = "run1", .path = "f"})});
  now = 1200;
  FakeLog log;
  log.paths = logged;
  log.applied = 1;
  ClusterOptions o;
  o.name = "job";
  o.node = "a";
  o.incarnation = "run1";
  Cluster c(o, &store, &log, path, [&now] { return now * 1000; });
  c.Init();
  c.Heartbeat();
  WriterRecord w = record();
  cr_expect_gt(w.oldest_gate_us.value_or(0), exact, "recovered: the samples' gate, later than the exact one");
  cr_expect(!ShowsApplied(w, replica), "f is pending: its replica is kept");
  w.applied_seq.reset();
  cr_expect(ShowsApplied(w, replica), "the times alone (a record without applied_seq) said applied");
  log.applied = seq;
  now = 1300;
  c.Heartbeat();
  cr_expect(ShowsApplied(record(), replica), "applied: its replica goes");
  std::filesystem::remove_all(tmpl);
}

// A samples file and sample time kept by a version 1 daemon (ms) still
// give recovered entries their gate times, in µs.
Test(cluster, gate_times_survive_an_upgrade_from_ms) {
  char tmpl[] = "/tmp/clunit-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  std::string path = std::string(tmpl) + "/cluster-samples";
  {
    FILE* f = fopen(path.c_str(), "w");
    cr_assert_not_null(f);
    fputs("ckptfs-cluster-samples 1\n1000 0 0\n1100 1 1\n1200 2 2\n", f);
    fclose(f);
    int64_t alive_ms = 1250;
    f = fopen((path + ".alive").c_str(), "w");
    cr_assert_not_null(f);
    fwrite(&alive_ms, sizeof alive_ms, 1, f);
    fclose(f);
  }
  FakeStore store;
  FakeLog log;
  for (const char* p : {"s1", "s2", "s3"}) log.Log(p);
  int64_t now = 5000;
  ClusterOptions o;
  o.name = "job";
  o.node = "a";
  Cluster c(o, &store, &log, path, [&now] { return now * 1000; });
  c.Init();
  cr_expect_eq(c.GateTime(1).value(), 1'100'000);
  cr_expect_eq(c.GateTime(2).value(), 1'200'000);
  // Logged after the last sample kept: the end of the alive millisecond
  // plus one sample period.
  cr_expect_eq(c.GateTime(3).value(), 1'261'000, "got %lld", static_cast<long long>(c.GateTime(3).value_or(-1)));
  cr_expect(!std::filesystem::exists(path + ".alive"), "the version 1 file is read once");
  cr_expect(std::filesystem::exists(path + ".alive-us"));
  std::filesystem::remove_all(tmpl);
}

Test(cluster, names) {
  for (const char* ok : {"a", "node-1", "host.example_2"}) cr_expect(ckpt::fs::ValidClusterName(ok), "%s", ok);
  cr_expect(ckpt::fs::ValidClusterName(std::string(64, 'x')));
  for (const char* bad : {"", ".", "..", ".a", "-a", "a/b", "a b", "\xc3\xa9"})
    cr_expect(!ckpt::fs::ValidClusterName(bad), "%s", bad);
  cr_expect(!ckpt::fs::ValidClusterName(std::string(65, 'x')));
}

// Tick: a record is written before the heartbeat is due when this node
// applied entries; a waiting node reads the others' records every tick.
Test(cluster, tick_writes_after_progress_and_reads_while_waiting) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  a.c->Heartbeat();
  b.c->Heartbeat();
  a.c->Heartbeat();
  now = 1100;
  uint64_t eb = b.log.Log("shard_b");
  b.c->Tick();  // nothing applied, heartbeat not due: no record
  cr_expect_eq(nlohmann::json::parse(store.recs["b"])["heartbeat_ms"].get<int64_t>(), 1000);
  now = 1300;
  uint64_t ea = a.log.Log("latest");
  a.c->Sample();
  a.c->Tick();
  cr_expect(!a.c->MayPublish(ea));  // a's records read at 1000
  now = 1400;
  a.c->Tick();  // waiting: reads (b's record still from 1000: stale)
  cr_expect(!a.c->MayPublish(ea));
  b.log.applied = eb;
  now = 1420;
  b.c->Tick();  // applied something: writes at once
  cr_expect_eq(nlohmann::json::parse(store.recs["b"])["heartbeat_ms"].get<int64_t>(), 1420);
  now = 1450;
  a.c->Tick();  // still waiting (the read at 1400 predates b's record): reads again
  cr_expect(a.c->MayPublish(ea));
}

// While another member has files pending, an idle member writes (and reads)
// every tick: the other waits for a record newer than its files.
Test(cluster, idle_member_refreshes_while_another_has_files_pending) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  a.c->Heartbeat();
  b.c->Heartbeat();
  now = 1100;
  b.c->Tick();  // nothing pending anywhere: no record before the heartbeat
  cr_expect_eq(nlohmann::json::parse(store.recs["b"])["heartbeat_ms"].get<int64_t>(), 1000);
  uint64_t e = a.log.Log("latest");
  a.c->Sample();
  now = 1200;
  a.c->Heartbeat();  // a's record: a file pending
  now = 1500;
  b.c->Tick();  // heartbeat due: writes and reads a's record
  now = 1600;
  b.c->Tick();  // busy: writes again before the next heartbeat
  cr_expect_eq(nlohmann::json::parse(store.recs["b"])["heartbeat_ms"].get<int64_t>(), 1600);
  cr_expect(!a.c->MayPublish(e));  // a's last read (1200) predates it
  now = 1650;
  a.c->Tick();  // a waits: reads b's record of 1600 >= gate 1100 + 50
  cr_expect(a.c->MayPublish(e));
  // Two seconds after the last sight of a pending file, b is quiet again.
  a.log.applied = e;
  now = 1700;
  a.c->Tick();
  now = 1800;
  b.c->Tick();  // reads a: nothing pending
  now = 3900;
  b.c->Tick();  // heartbeat due (last at 1800 + 500 passed long ago): writes
  now = 4000;
  b.c->Tick();  // no longer busy, heartbeat not due: no record
  cr_expect_eq(nlohmann::json::parse(store.recs["b"])["heartbeat_ms"].get<int64_t>(), 3900);
}

// A record names the first unpersisted files, as many as fit: a POSIX
// backend holds paths of any length, and a record larger than the store
// takes (backend::kMaxRecordBytes) would not be written at all.
Test(cluster, record_fits_the_store_with_long_paths) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  std::string deep;
  while (deep.size() < 8000) deep += std::string(255, 'd') + "/";
  for (int i = 0; i < 1000; i++) a.log.Log(deep + "\x01shard" + std::to_string(i));  // 6 bytes as JSON
  a.c->Heartbeat();
  const std::string& rec = store.recs.at("a");
  cr_assert_leq(rec.size(), ckpt::backend::kMaxRecordBytes, "record of %zu bytes", rec.size());
  auto j = nlohmann::json::parse(rec);
  cr_expect_eq(j.at("unpersisted").get<uint64_t>(), 1000u);  // the count stays exact
  auto paths = j.at("paths").get<std::vector<std::string>>();
  cr_assert_gt(paths.size(), 0u);
  cr_expect_eq(paths[0], deep + "\x01shard0");
}

// A record as a member writes it (version 2, µs), with times in the tests'
// ms.
std::string RecordAt(const std::string& node, int64_t heartbeat, std::optional<int64_t> gate,
                     std::vector<std::string> paths = {}) {
  return nlohmann::json{{"version", 2},
                        {"cluster", "job"},
                        {"node", node},
                        {"state", "live"},
                        {"heartbeat_us", heartbeat * 1000},
                        {"watermark_us", 0},
                        {"oldest_gate_us", gate ? nlohmann::json(*gate * 1000) : nullptr},
                        {"unpersisted", paths.size()},
                        {"paths", paths}}
      .dump();
}

// A node whose first record could not be written (Join failed) is unknown
// to the others: nothing it closes is waited for. It must not publish
// either until its record, naming its pending entries, is in the store
// (the reads alone used to let it through: they worked, the writes did not).
Test(cluster, node_whose_join_failed_publishes_only_after_its_record_is_written) {
  FakeStore store;
  store.put_fails = true;
  int64_t now = 1000;
  Node a("a", &store, &now);
  cr_expect(!a.c->Join());
  now = 1100;
  uint64_t e = a.log.Log("step1/shard_a");
  a.c->Sample();
  cr_expect(!a.c->MayPublish(e));
  now = 1200;
  a.c->Tick();  // the drain waits: a read (it works), no write (the last failed)
  cr_expect(!a.c->MayPublish(e), "published with no record of this node in the store");
  now = 1300;
  a.c->Tick();
  cr_expect(!a.c->MayPublish(e), "published with no record of this node in the store");
  cr_expect(!a.c->Status().last_error.empty(), "a read cleared the failed write");
  cr_expect_eq(store.recs.count("a"), 0u);
  auto st = a.c->Status();
  cr_expect(st.publish_blocked_reason.starts_with("not joined"), "%s", st.publish_blocked_reason.c_str());
  cr_expect(st.waiting);
  cr_expect(st.waiting_for == std::vector<std::string>{"(this node's record)"});
  store.put_fails = false;
  now = 1600;
  a.c->Tick();  // the heartbeat is due: the record is written, then read
  cr_expect_eq(store.recs.count("a"), 1u);
  cr_expect(a.c->MayPublish(e), "the record is in the store now");
  cr_expect(a.c->Status().last_error.empty());
  cr_expect(a.c->Status().publish_blocked_reason.empty());
}

// a and b joined at 1000; a logs step1/shard_a at 1100 (its seq returned)
// and both write their records at 1200.
uint64_t JoinedWithOneEntry(Node& a, Node& b, int64_t* now) {
  cr_expect(a.c->Join());
  cr_expect(b.c->Join());
  *now = 1100;
  uint64_t e = a.log.Log("step1/shard_a");
  a.c->Sample();
  *now = 1200;
  b.c->Heartbeat();
  a.c->Heartbeat();
  return e;
}

// A node whose record writes fail after it joined: its record in the store
// is older than its new entries, which the others therefore cannot see; it
// publishes none of them until a write succeeds.
Test(cluster, failed_record_write_stops_publishing_until_one_succeeds) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  uint64_t e1 = JoinedWithOneEntry(a, b, &now);
  cr_expect(a.c->MayPublish(e1));
  a.log.applied = e1;
  store.put_fails = true;  // for a only below: b writes before and after
  now = 1300;
  uint64_t e2 = a.log.Log("step2/shard_a");
  a.c->Sample();
  now = 1500;
  a.c->Heartbeat();  // fails
  store.put_fails = false;
  b.c->Heartbeat();
  store.put_fails = true;
  cr_expect(!a.c->MayPublish(e2));
  now = 1550;
  a.c->Tick();  // waits: reads b's record of 1500 (it works); the write waits for the heartbeat
  cr_expect(!a.c->MayPublish(e2), "published an entry that no record of this node in the store names");
  cr_expect(!a.c->Status().last_error.empty(), "a read cleared the failed write");
  now = 2000;
  a.c->Tick();  // the heartbeat is due, and fails again
  now = 2050;
  a.c->Tick();
  cr_expect(!a.c->MayPublish(e2), "published after a failed write");
  cr_expect(a.c->Status().publish_blocked_reason.find("last write failed") != std::string::npos, "%s",
            a.c->Status().publish_blocked_reason.c_str());
  store.put_fails = false;
  now = 2500;
  a.c->Tick();  // written
  cr_expect(a.c->MayPublish(e2));
  cr_expect(a.c->Status().last_error.empty());
  cr_expect(a.c->Status().publish_blocked_reason.empty());
}

// A node whose store says the others may count it dead (etcd: its lease
// expired, or was last confirmed too long ago) publishes nothing though
// its last write succeeded, and says why; once it stands again, it does.
Test(cluster, node_the_others_may_count_dead_does_not_publish) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now), b("b", &store, &now);
  uint64_t e1 = JoinedWithOneEntry(a, b, &now);
  store.standing = "this node's lease expired";
  cr_expect(!a.c->MayPublish(e1), "published while the others may count it dead");
  cr_expect(a.c->Status().publish_blocked_reason.find("lease expired") != std::string::npos, "%s",
            a.c->Status().publish_blocked_reason.c_str());
  store.standing.clear();
  cr_expect(a.c->MayPublish(e1));
}

// A record whose heartbeat lies ten years ahead (written by anyone who can
// write into .ckptfs-cluster/NAME/): it never ages into "dead", and its
// pending file came first in every comparison, so it held every node's
// drain for ever. It is refused (not a member), and reported.
Test(cluster, record_from_the_future_holds_nobody) {
  FakeStore store;
  int64_t now = 1000;
  const int64_t ten_years = 10LL * 365 * 24 * 3600 * 1000;
  store.recs["zz"] = RecordAt("zz", now + ten_years, 500, {"forged"});
  Node a("a", &store, &now, 3000);
  cr_expect(a.c->Join());
  now = 1100;
  uint64_t e = a.log.Log("latest");
  a.c->Sample();
  now = 1200;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(e), "a record from the future holds the drain");
  now = 10000;  // long past the member timeout
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(e), "a record from the future holds the drain");
  auto st = a.c->Status();
  for (const auto& m : st.members) cr_expect_neq(m.node, std::string("zz"), "a refused record is a member");
  cr_assert_eq(st.refused.size(), 1u, "the refused record is not reported");
  cr_expect_eq(st.refused[0].node, std::string("zz"));
  cr_expect(st.refused[0].reason.find("future") != std::string::npos, "%s", st.refused[0].reason.c_str());
  cr_expect_eq(st.refused[0].unpersisted, 1u);
  cr_expect(st.publish_blocked_reason.empty());
  // a's record names it, so that a real member with that clock would know.
  auto j = nlohmann::json::parse(store.recs.at("a"));
  cr_assert_eq(j.at("refused").size(), 1u);
  cr_expect_eq(j.at("refused")[0].at("node").get<std::string>(), std::string("zz"));
}

// Times no member writes: a heartbeat far before 1970 made now - heartbeat
// overflow, so the record never aged into dead and, with a pending gate
// of 1, held every drain for ever; a double (1e300) converted to INT64_MIN.
// Such records are unreadable, and hold nobody.
Test(cluster, a_record_with_times_no_member_writes_holds_nobody) {
  FakeStore store;
  int64_t now = 1000;
  auto forged = [](nlohmann::json heartbeat, nlohmann::json gate) {
    return nlohmann::json{{"version", 2},           {"cluster", "job"},          {"node", "zz"},
                          {"state", "live"},        {"heartbeat_us", heartbeat}, {"watermark_us", 0},
                          {"oldest_gate_us", gate}, {"unpersisted", 1},          {"paths", {"forged"}}}
        .dump();
  };
  Node a("a", &store, &now, 3000);
  cr_expect(a.c->Join());
  now = 1100;
  uint64_t e = a.log.Log("latest");
  a.c->Sample();
  for (const std::string& rec : {forged(INT64_MIN + 1000, 1), forged(1e300, 1), forged(-5, 1), forged(2000 * 1000, -1),
                                 forged(2000 * 1000, 1.5), forged(std::numeric_limits<uint64_t>::max(), 1)}) {
    store.recs["zz"] = rec;
    now += 100;
    a.c->Heartbeat();
    cr_expect(a.c->MayPublish(e), "held by %s", rec.c_str());
    for (const auto& m : a.c->Status().members) cr_expect_neq(m.node, std::string("zz"), "%s", rec.c_str());
  }
}

// The other side of a missing record: a live member whose record vanishes
// from the store (deleted, unreadable) is not a member with nothing
// pending: its last record read holds the others until it is dead.
Test(cluster, member_whose_record_vanished_is_waited_for_until_dead) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000);
  a.c->Join();
  b.c->Join();
  now = 1100;
  b.log.Log("step1/shard_b");
  b.c->Sample();
  now = 1200;
  uint64_t latest = a.log.Log("latest");
  a.c->Sample();
  now = 1300;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest));
  store.recs.erase("b");  // b hangs (no more records), and its record is deleted
  now = 1400;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "passed the shard of a member whose record vanished");
  auto problem = [&] {
    for (const auto& m : a.c->Status().members)
      if (m.node == "b") return m.record_problem;
    return std::string("(not a member)");
  };
  cr_expect_eq(problem(), std::string("missing"));
  store.recs["b"] = "{\"node\": \"b\", \"cluster\": \"job\", \"state\": \"live\"";  // a torn copy
  now = 1500;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "passed the shard of a member whose record is unreadable");
  cr_expect_eq(problem(), std::string("unreadable"));
  now = 4400;  // b's last record (1300) is older than the member timeout: dead
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest));
  bool lost = false;
  for (const auto& m : a.c->Status().members)
    if (m.node == "b") lost = m.state == "dead" && m.paths == std::vector<std::string>{"step1/shard_b"};
  cr_expect(lost, "b's pending shard is not listed as lost");
}

// A member already known whose clock jumps ahead: its new records are
// refused, and its last one read holds the others until it is dead — its
// shard is not passed because it now claims to be in the future.
Test(cluster, member_whose_clock_jumps_ahead_is_waited_for_until_dead) {
  FakeStore store;
  int64_t now = 1000, now_b = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now_b, 3000);
  a.c->Join();
  b.c->Join();
  now = now_b = 1100;
  b.log.Log("step1/shard_b");
  b.c->Sample();
  now = now_b = 1200;
  uint64_t latest = a.log.Log("latest");
  a.c->Sample();
  now = now_b = 1300;
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest));
  now = 1400;
  now_b = 1400 + 600000;  // b's clock steps ten minutes ahead
  b.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "passed the shard of a member whose clock jumped ahead");
  auto st = a.c->Status();
  cr_assert_eq(st.members.size(), 2u);
  cr_expect(st.members[1].record_problem.starts_with("refused"), "%s", st.members[1].record_problem.c_str());
  cr_expect_eq(st.members[1].heartbeat_ms, 1300, "the last record accepted stands");
  cr_assert_eq(st.refused.size(), 1u);
  now = 4400;
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(latest), "b is dead by its last accepted record");
}

// A member whose clock is ahead of another's by more than the skew cannot
// be ordered against it: that member refuses its records (not a member),
// says so in its own record, and the refused node publishes nothing while
// it is refused (its files stay in memory; loud in its log and status).
Test(cluster, node_whose_clock_is_ahead_is_refused_and_does_not_publish) {
  FakeStore store;
  int64_t now = 1000, now_b = 1000 + 5000;  // b's clock 5 s ahead
  Node a("a", &store, &now), b("b", &store, &now_b);
  a.c->Join();
  b.c->Join();
  now += 100;
  now_b += 100;
  uint64_t eb = b.log.Log("step1/shard_b");
  b.c->Sample();
  now += 100;
  now_b += 100;
  // Both beat for 6 s: a refuses b's records and names b in its own; a's
  // records are then newer than b's shard, even by b's clock.
  for (int i = 0; i < 60; i++) {
    now += 100;
    now_b += 100;
    a.c->Heartbeat();
    b.c->Heartbeat();
  }
  cr_expect(!b.c->MayPublish(eb), "a node the others refuse published");
  bool b_member = false;
  for (const auto& m : a.c->Status().members) b_member = b_member || m.node == "b";
  cr_expect(!b_member, "a's members include a record 5 s in the future");
  cr_expect(b.c->Status().publish_blocked_reason.find("member a refuses") != std::string::npos, "%s",
            b.c->Status().publish_blocked_reason.c_str());
  cr_expect(!b.c->Join(), "a refused node joined");
  // b's clock is set right; once real time passes its earlier readings
  // (sample times never go back), a accepts it and b publishes.
  now = now_b = 13000;
  b.c->Heartbeat();
  a.c->Heartbeat();
  now = now_b = 13100;
  a.c->Heartbeat();
  b.c->Heartbeat();
  cr_expect(b.c->MayPublish(eb));
}

// This node's record removed from the store behind its back: the others no
// longer see it, so it publishes nothing until its record is back, which the
// next tick writes (not the next heartbeat). A drain waiting for an entry
// that the record in the store does not name yet gets one at the next tick
// too.
Test(cluster, own_record_missing_is_written_again_before_publishing) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  cr_expect(a.c->Join());
  now = 1100;
  uint64_t e1 = a.log.Log("f1");
  a.c->Sample();
  cr_expect(!a.c->MayPublish(e1), "published an entry its record in the store does not name");
  now = 1200;
  a.c->Tick();  // the drain waits for a record naming e1: written now
  cr_expect_eq(nlohmann::json::parse(store.recs.at("a"))["heartbeat_ms"].get<int64_t>(), 1200);
  cr_expect(a.c->MayPublish(e1));
  a.log.applied = e1;
  now = 1300;
  uint64_t e2 = a.log.Log("f2");
  a.c->Sample();
  now = 1320;
  a.c->Tick();  // applied e1: writes (names e2)
  cr_expect(!a.c->MayPublish(e2), "no read after the gate plus the skew yet");
  store.recs.erase("a");
  now = 1360;
  a.c->Tick();  // the drain waits: reads, and finds its record gone
  cr_expect(!a.c->MayPublish(e2), "published while its record is missing from the store");
  cr_expect(a.c->Status().publish_blocked_reason.find("missing") != std::string::npos);
  now = 1385;
  a.c->Tick();  // written again at once
  cr_expect_eq(store.recs.count("a"), 1u);
  cr_expect(a.c->MayPublish(e2));
}

// A clock ahead by more than the member timeout sees every other member
// dead (their heartbeats look that old): it must not take that for leave to
// publish unordered. The refusal names its own recent record, so it counts
// whatever the refusing member looks like to it.
Test(cluster, node_whose_clock_is_ahead_by_more_than_the_member_timeout_does_not_publish) {
  FakeStore store;
  int64_t now = 1000, now_b = 1000 + 120000;  // b's clock 2 min ahead, member timeout 1 min
  Node a("a", &store, &now), b("b", &store, &now_b);
  a.c->Join();
  b.c->Join();
  now += 100;
  now_b += 100;
  uint64_t eb = b.log.Log("step1/shard_b");
  b.c->Sample();
  for (int i = 0; i < 3; i++) {
    now += 100;
    now_b += 100;
    a.c->Heartbeat();
    b.c->Heartbeat();
  }
  auto st = b.c->Status();
  cr_assert_eq(st.members.size(), 2u);
  cr_expect_eq(st.members[0].state, std::string("dead"), "a, by b's clock");
  cr_expect(!b.c->MayPublish(eb), "a node the others refuse published (they look dead to it)");
  // A refusal of an old record of b (a forged one, a member gone long
  // ago) refuses nothing.
  store.recs["zz"] = nlohmann::json{{"version", 2},
                                    {"cluster", "job"},
                                    {"node", "zz"},
                                    {"state", "live"},
                                    {"heartbeat_us", now_b * 1000},
                                    {"watermark_us", 0},
                                    {"oldest_gate_us", nullptr},
                                    {"unpersisted", 0},
                                    {"paths", nlohmann::json::array()},
                                    {"refused", {{{"node", "c"}, {"heartbeat_us", (now_b - 61000) * 1000}}}}}
                         .dump();
  Node c("c", &store, &now_b);
  cr_expect(c.c->Join(), "refused by a refusal of a record it never wrote");
}

// Replicas (issue #30, fs/cluster/takeover.h): c holds a replica of b's
// shard. While it does, its record names the shard's gate (+1 µs) as
// pending: a's `latest`, closed after the shard, waits for it even once b
// is dead, and so does c's own later file; b's own shard never waits for
// its replica. Once b is dead, MayPublishAs lets c publish b's shard in
// b's place; once c dropped the replica, `latest` goes.
Test(cluster, a_replica_held_for_a_dead_node_keeps_the_order) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000), c("c", &store, &now, 3000);
  std::optional<int64_t> held;  // what c holds: the shard's gate + 1 µs
  c.c->SetHeldGate([&held](bool) { return HeldForOthers{held}; });
  now = 1100;
  uint64_t shard = b.log.Log("step1/shard_b");
  b.c->Sample();
  held = Ms(b.c->GateTime(shard)) * 1000 + 1;
  now = 1200;
  uint64_t latest = a.log.Log("latest");
  a.c->Sample();
  uint64_t own = c.log.Log("step1/shard_c");
  c.c->Sample();
  now = 1300;
  for (Node* n : {&b, &c, &a, &b, &c, &a}) n->c->Heartbeat();
  cr_expect(b.c->MayPublish(shard), "the writer's own entry never waits for its replica");
  cr_expect(!a.c->MayPublish(latest), "latest waits for the shard");
  cr_expect(!c.c->MayPublish(own), "the holder's own later file waits for the replica it holds");
  // b dies with its shard pending; past the member timeout it is dead.
  now = 4500;
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(!a.c->MayPublish(latest), "b is dead, but c still holds its shard: latest waits");
  cr_expect(c.c->MayPublishAs(*held - 1, "b"), "c may publish b's shard in b's place");
  cr_expect(!a.c->MayPublishAs(*held + 1000, "b"), "not a gate past what c holds");
  held.reset();  // published and dropped
  now = 4600;
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  const bool went = a.c->MayPublish(latest);
  auto st = a.c->Status();
  cr_expect(went, "once the replica is dropped, latest goes (waits for %s)",
            st.waiting_for.empty() ? "-" : st.waiting_for[0].c_str());
  a.log.applied = latest;  // (same gate as c's own file: a's goes first, by node id)
  now = 4700;
  for (Node* n : {&a, &c}) n->c->Heartbeat();
  cr_expect(c.c->MayPublish(own));
}

// The holder's own shard, closed before the dead writer's `latest` it
// holds a replica of, reaches the backend first: MayPublishAs looked at the
// other members' records only (this node's own is never among them), so c
// published b's `latest` while its own earlier shard was still draining.
Test(cluster, a_holder_publishes_a_dead_writers_later_file_after_its_own) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000), c("c", &store, &now, 3000);
  std::optional<int64_t> held;
  c.c->SetHeldGate([&held](bool) { return HeldForOthers{held}; });
  now = 1100;
  uint64_t own = c.log.Log("step1/shard_c");
  c.c->Sample();
  now = 1200;
  uint64_t latest = b.log.Log("latest");
  b.c->Sample();
  const int64_t g = Ms(b.c->GateTime(latest)) * 1000;
  held = g + 1;  // c holds b's `latest`
  now = 4500;    // b is dead; c's shard still pending
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(!c.c->MayPublishAs(g + 1, "b"), "c's own earlier shard goes first");
  cr_expect(c.c->MayPublish(own), "and it may: the replica it holds is of a later file");
  c.log.applied = own;
  now = 4600;
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(c.c->MayPublishAs(g + 1, "b"), "then b's latest, in b's place");
}

// A dead member's entries held by two holders (issue #30: a file on c, the
// rename that moves it, one µs later, on a): the rename's holder asks for
// its gate + 1 (takeover.cc), so c's record — the file's gate + 1 µs —
// holds it back however close the two gates are; the file's holder goes.
Test(cluster, a_dead_members_entries_on_two_holders_keep_its_exact_order) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000), c("c", &store, &now, 3000);
  std::optional<int64_t> on_c, on_a;
  c.c->SetHeldGate([&on_c](bool) { return HeldForOthers{on_c}; });
  a.c->SetHeldGate([&on_a](bool) { return HeldForOthers{on_a}; });
  now = 1100;
  uint64_t file = b.log.Log("step.tmp/shard_b");
  b.c->Sample();
  const int64_t g = Ms(b.c->GateTime(file)) * 1000;
  on_c = g + 1;      // c holds the file
  on_a = g + 1 + 1;  // a holds the rename, logged one µs after it
  now = 4500;        // b is dead
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(c.c->MayPublishAs(g + 1, "b"), "the file goes first");
  cr_expect(!a.c->MayPublishAs(g + 1 + 1, "b"), "the rename waits for the file's holder");
  cr_expect(a.c->MayPublishAs(g + 1, "b"), "(asked at its bare gate, it would have gone first: the + 1 µs tie)");
  on_c.reset();  // published
  now = 4600;
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(a.c->MayPublishAs(g + 1 + 1, "b"), "then the rename");
}

// Node loss (issue #30): b dies with `latest` not replicated (its record's
// U); a's rotation, ordered after it, passes once b is dead — and is kept
// out of the backend, or the backend's older `latest` could name the step
// it removes. A removal before U, or logged after a learned of the loss,
// goes; with b's entries all replicated (U none) nothing is kept.
Test(cluster, a_removal_ordered_after_a_lost_members_entries_is_kept) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000);
  now = 1100;
  const uint64_t latest = b.log.LogAt("latest", 1100);
  b.c->Heartbeat();
  now = 1200;
  const uint64_t rm = a.log.LogAt("step_1/shard_a", 1200);
  a.c->Heartbeat();
  const int64_t g = a.c->GateTime(rm).value();
  cr_expect(!a.c->MayPublish(rm), "b's `latest` first");
  cr_expect_eq(a.c->KeepsRemoval(g, "step_1/shard_a"), std::string(""), "b is not lost yet");
  now = 4200;  // b is dead
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(rm));
  cr_expect_eq(a.c->KeepsRemoval(g, "step_1/shard_a"), std::string("b"), "ordered after b's lost `latest`");
  cr_expect_eq(a.c->KeepsRemoval(b.c->GateTime(latest).value() - 1, "before"), std::string(""),
               "before b's first lost entry");
  now = 4300;
  const uint64_t rm2 = a.log.LogAt("step_2/shard_a", 4300);
  a.c->Sample();
  cr_expect_eq(a.c->KeepsRemoval(a.c->GateTime(rm2).value(), "step_2/shard_a"), std::string(""),
               "made after a learned of the loss");
  auto st = a.c->Status();
  cr_expect_eq(st.kept_removals, 1u);
  cr_assert_eq(st.kept_paths.size(), 1u);
  cr_expect_eq(st.kept_paths[0], std::string("step_1/shard_a"));

  // c's entries are all held by replicas (UnsafeFrom past them) at its
  // last record: its loss loses only what it logged after that record.
  Node c("c", &store, &now, 3000);
  const uint64_t shard = c.log.LogAt("step_2/shard_c", 4300);
  c.c->SetReplicas([shard] { return shard + 1; }, [](uint64_t, uint64_t) { return true; });
  const uint64_t rm3 = a.log.LogAt("step_3/shard_a", 4350);
  now = 4400;
  c.c->Heartbeat();
  const uint64_t rm4 = a.log.LogAt("step_4/shard_a", 4450);
  now = 4500;
  a.c->Heartbeat();
  now = 7500;  // c is dead
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(rm3));
  cr_expect_eq(a.c->KeepsRemoval(a.c->GateTime(rm3).value(), "step_3/shard_a"), std::string(""),
               "before c's last record, all of whose entries were replicated");
  cr_expect_eq(a.c->KeepsRemoval(a.c->GateTime(rm4).value(), "step_4/shard_a"), std::string("c"),
               "after it: what c logged then is not known");
}

// Two losses (issue #30, review D3): b dies with its shard replicated on
// c only; c, to publish it in b's place, dies too. c's record named the
// shard as its own at risk — its U at the shard's gate, its path among
// c's — so the shard is listed lost with c, and a's removal ordered after
// it is kept out of the backend. (c's record named none of it: nothing
// listed the shard lost, and the removal went.)
Test(cluster, a_holder_lost_with_a_dead_writers_replica_names_it_and_keeps_what_follows) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now, 3000), b("b", &store, &now, 3000), c("c", &store, &now, 3000);
  HeldForOthers on_c;
  c.c->SetHeldGate([&on_c](bool dead_too) { return dead_too ? on_c : HeldForOthers{on_c.gate}; });
  now = 1100;
  const uint64_t shard = b.log.LogAt("step1/shard_b", 1100);
  b.c->SetReplicas([shard] { return shard + 1; }, [](uint64_t, uint64_t) { return true; });  // held by c
  b.c->Sample();
  const int64_t g = b.c->GateTime(shard).value();
  on_c.gate = g + 1;
  now = 1200;
  const uint64_t rm = a.log.LogAt("step_0/shard_a", 1200);
  a.c->Sample();
  now = 1300;
  for (Node* n : {&b, &c, &a}) n->c->Heartbeat();  // b's last record: nothing of it at risk
  cr_expect(!a.c->MayPublish(rm), "b's shard first");
  now = 4500;  // b is dead: c is to publish the shard in its place
  on_c.dead_gate = g;
  on_c.dead_files = 1;
  on_c.dead_paths = {"step1/shard_b"};
  for (Node* n : {&c, &a, &c, &a}) n->c->Heartbeat();
  cr_expect(!a.c->MayPublish(rm), "c holds b's shard");
  cr_expect_eq(a.c->KeepsRemoval(a.c->GateTime(rm).value(), "step_0/shard_a"), std::string(""),
               "b's loss lost nothing: its shard is on c");
  now = 7600;  // c is dead too
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(rm));
  cr_expect_eq(a.c->KeepsRemoval(a.c->GateTime(rm).value(), "step_0/shard_a"), std::string("c"),
               "ordered after b's shard, lost with c");
  bool named = false;
  for (const auto& m : a.c->Status().members)
    if (m.node == "c")
      named = m.at_risk >= 1 && std::find(m.paths.begin(), m.paths.end(), "step1/shard_b") != m.paths.end();
  cr_expect(named, "c's record does not name b's shard as lost with it");
}

// A file closed while every earlier entry is replicated is named at risk
// by the next tick, and so is each one after it: the replicator's
// UnsafeFrom is the next seq to log while nothing is at risk and stays that
// seq once that entry is logged, so a record naming nothing at risk stood
// while three shards closed, and a node lost then took them unlisted (the
// crash harness's node-loss kind, seed 166835).
Test(cluster, each_entry_at_risk_is_named_at_the_next_tick) {
  FakeStore store;
  int64_t now = 1000;
  Node a("a", &store, &now);
  uint64_t held = 0;  // entries up to here are replicated K times
  a.c->SetReplicas([&] { return held + 1; }, [](uint64_t, uint64_t) { return false; });
  a.c->Heartbeat();
  auto record = [&] {
    std::lock_guard lk(store.mu);
    return nlohmann::json::parse(store.recs.at("a"));
  };
  cr_assert(record()["unsafe_gate_us"].is_null());
  now = 1010;  // well before the next heartbeat is due
  a.log.LogAt("step_1/shard_0", 1010);
  a.c->Tick();
  cr_assert(!record()["unsafe_gate_us"].is_null(), "the first file at risk, named at once");
  cr_expect_eq(record()["at_risk"].get<int>(), 1);
  now = 1020;
  a.log.LogAt("step_1/shard_1", 1020);
  a.c->Tick();
  cr_expect_eq(record()["at_risk"].get<int>(), 2, "the next one too, though the first at risk did not move");
  held = 2;
  a.log.applied = 0;
  now = 1030;
  a.c->Tick();
  cr_expect(record()["unsafe_gate_us"].is_null(), "both replicated: nothing at risk");
  now = 1040;
  a.c->Tick();  // nothing changed: no write needed, and none breaks anything
  cr_expect(record()["unsafe_gate_us"].is_null());
}
