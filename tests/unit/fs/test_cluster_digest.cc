// test_cluster_digest.cc — the cluster over a store that reduces (etcd):
// the digest decides as every record would (random clusters, each node's
// head entry asked both ways), lost and returning members, records from
// the future, a stale digest, and the digest's size at 1,000 members. Fake
// clock, fake logs, fake stores (fs/cluster/cluster_digest.cc).
#include <criterion/criterion.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fs/cluster/cluster.h"
#include "tests/unit/fs/mem_records.h"

using ckpt::Result;
using ckpt::Status;
using ckpt::fs::Cluster;
using ckpt::fs::ClusterOptions;

namespace {

using Store = ckpt::test::MemRecords;

// The same, reducing: members read `digest` (what the elected one wrote).
struct DigestStore : Store {
  DigestStore() { digest = ""; }
};

struct Log : ckpt::fs::LogView {
  std::vector<int64_t> at;  // at[i]: when seq i + 1 was logged, µs
  uint64_t applied = 0;
  uint64_t LoggedSeq() override { return at.size(); }
  uint64_t AppliedSeq() override { return applied; }
  uint64_t DurableAppliedSeq() override { return applied; }  // nothing behind it to sync
  std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) override {
    std::pair<uint64_t, std::vector<std::string>> out{at.size() - applied, {}};
    for (size_t i = applied; i < at.size() && out.second.size() < max; i++)
      out.second.push_back("f" + std::to_string(i + 1));
    return out;
  }
  std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) override {
    std::vector<std::pair<uint64_t, int64_t>> out;
    for (uint64_t s = from; s <= to && s <= at.size(); s++) out.emplace_back(s, at[s - 1]);
    return out;
  }
};

struct Node {
  Log log;
  std::unique_ptr<Cluster> c;
  Node(const std::string& id, ckpt::fs::RecordStore* store, int64_t* clock_ms, const std::string& incarnation = "") {
    ClusterOptions o;
    o.name = "job";
    o.node = id;
    o.incarnation = incarnation;
    o.max_skew_ms = 50;
    c = std::make_unique<Cluster>(o, store, &log, "", [clock_ms] { return *clock_ms * 1000; });
    c->Init();
  }
};

// The elected member's reduction: the digest it writes ("" from Reduce:
// nothing new, the store keeps the last one).
// A turn (the digest for one member, between summaries) is shown to every
// member here: it is a digest like the summary, only newer.
std::string Reduce(Node& leader, DigestStore& s, int64_t now_ms) {
  auto list = s.List();
  auto r = leader.c->Reduce(*list, now_ms * 1000);
  return !r.summary.empty() ? r.summary : !r.turn.empty() ? r.turn : *s.digest;
}

}  // namespace

// Random clusters: entries logged and heartbeats at random times, some
// entries applied; then, node by node, its head entry is asked of the rule
// over every record (Store) and over the digest (DigestStore): the same
// answer, every time.
Test(cluster_digest, decides_as_every_record) {
  std::mt19937 rng(20261127);
  int differ = 0, asked = 0, passed = 0;
  for (int round = 0; round < 40; round++) {
    const int m = 3 + static_cast<int>(rng() % 22);
    int64_t now = 1000;
    Store plain;
    DigestStore reducing;
    std::vector<std::unique_ptr<Node>> p, r;
    for (int i = 0; i < m; i++) {
      p.push_back(std::make_unique<Node>("n" + std::to_string(i), &plain, &now));
      r.push_back(std::make_unique<Node>("n" + std::to_string(i), &reducing, &now));
    }
    for (int i = 0; i < m; i++) {
      p[i]->c->Heartbeat();
      r[i]->c->Heartbeat();
    }
    // Events in time order: a log entry (then a sample) or a heartbeat.
    for (int step = 0; step < 6 * m; step++) {
      now += static_cast<int64_t>(rng() % 40);
      const int i = static_cast<int>(rng() % m);
      const int kind = static_cast<int>(rng() % 4);
      for (auto* v : {&p, &r}) {
        Node& n = *(*v)[i];
        if (kind == 0) {
          n.log.at.push_back(now * 1000);
          n.c->Sample();
        } else if (kind == 1 && n.log.applied < n.log.at.size() && n.log.applied + 1 < n.log.at.size()) {
          n.log.applied++;  // applied, though not the newest (that one is asked below)
        } else {
          n.c->Sample();
          if (v == &p) n.c->Heartbeat();
          else n.c->Heartbeat();
        }
      }
      if (kind >= 2) reducing.digest = Reduce(*r[0], reducing, now);  // the elected member follows
    }
    now += static_cast<int64_t>(rng() % 100);
    for (int i = 0; i < m; i++) {
      // The digest of the records as they are now, then node i's own
      // heartbeat and read; the plain node reads every record.
      reducing.digest = Reduce(*r[0], reducing, now);
      p[i]->c->Heartbeat();
      r[i]->c->Heartbeat();
      if (p[i]->log.applied >= p[i]->log.at.size()) continue;
      const uint64_t head = p[i]->log.applied + 1;
      const bool a = p[i]->c->MayPublish(head), b = r[i]->c->MayPublish(head);
      asked++;
      passed += a;
      if (a != b) {
        differ++;
        cr_log_error("round %d node n%d seq %llu: every record says %d, the digest %d", round, i,
                     static_cast<unsigned long long>(head), a, b);
      }
    }
  }
  cr_expect_eq(differ, 0);
  cr_expect_gt(asked, 100, "too few entries asked: %d", asked);
  cr_expect(passed > 0 && passed < asked, "the scenarios never (or always) let the head pass: %d of %d", passed, asked);
}

Test(cluster_digest, lost_member_and_its_return) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), b("b", &s, &now);
  a.c->Heartbeat();
  b.log.at.push_back(now * 1000);
  b.c->Sample();
  b.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  now += 100;
  // b's lease expires: its record is gone from the store.
  s.recs.erase("b");
  s.digest = Reduce(a, s, now);
  a.c->Heartbeat();
  auto st = a.c->Status();
  bool dead = false;
  for (const auto& m : st.members)
    if (m.node == "b") dead = m.state == "dead" && m.unpersisted == 1 && m.paths == std::vector<std::string>{"f1"};
  cr_expect(dead, "a does not list b dead with its file");
  auto d = nlohmann::json::parse(*s.digest);
  cr_expect_eq(d["lost"].size(), 1u);
  // b mounts again: its record is back, it is no longer lost.
  b.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  a.c->Heartbeat();
  for (const auto& m : a.c->Status().members)
    if (m.node == "b") cr_expect_eq(m.state, "live");
  cr_expect(nlohmann::json::parse(*s.digest)["lost"].empty());
}

// A new machine mounts under b's id with a new state dir (another
// incarnation), before or after b's lease expired: b's run is lost all the
// same (its holders publish its replicas, Takeover), and stays named lost
// in the digest while the new run is live; the same run back is not lost.
Test(cluster_digest, a_new_run_under_a_dead_members_id_does_not_bring_it_back) {
  for (bool lease_expired_first : {true, false}) {
    int64_t now = 1000;
    DigestStore s;
    Node a("a", &s, &now, "aaaa"), b("b", &s, &now, "b0b0");
    a.c->Heartbeat();
    b.log.at.push_back(now * 1000);
    b.c->Sample();
    b.c->Heartbeat();
    s.digest = Reduce(a, s, now);
    now += 100;
    if (lease_expired_first) {
      s.recs.erase("b");
      s.digest = Reduce(a, s, now);
    }
    Node b2("b", &s, &now, "b1b1");  // nothing pending: a fresh state dir
    b2.c->Heartbeat();
    now += 100;
    s.digest = Reduce(a, s, now);
    a.c->Heartbeat();
    auto d = nlohmann::json::parse(*s.digest);
    cr_assert_eq(d["lost"].size(), 1u, "b's first run is not named lost (lease expired first: %d)",
                 lease_expired_first);
    cr_expect_eq(d["lost"][0]["incarnation"], "b0b0");
    int dead = 0, live = 0;
    for (const auto& m : a.c->Status().members)
      if (m.node == "b") (m.state == "dead" && m.unpersisted == 1 ? dead : live) += 1;
    cr_expect(dead == 1 && live == 1, "a lists b's runs as %d dead and %d live (lease expired first: %d)", dead, live,
              lease_expired_first);
    // Read again: still lost (a reduction does not forget it).
    now += 100;
    s.digest = Reduce(a, s, now);
    cr_expect_eq(nlohmann::json::parse(*s.digest)["lost"].size(), 1u);
  }
  // The same run back (a restart on its state dir) is not lost.
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now, "aaaa"), b("b", &s, &now, "b0b0");
  b.log.at.push_back(now * 1000);
  b.c->Sample();
  b.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  now += 100;
  Node again("b", &s, &now, "b0b0");
  again.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  cr_expect(nlohmann::json::parse(*s.digest)["lost"].empty());
}

// Two mounts under one --node id (a misconfiguration the default id, made
// of the host name and the state dir's path, never gives): each writes
// the id's record in turn. The elected member sees a run it named lost
// (replaced) come back, names the id in the digest's clashes, and each of
// the two mounts reads it there: status says node_id_clash, as with
// backend records. A single replacement is no clash.
Test(cluster_digest, two_runs_writing_as_one_id_are_named) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now, "aaaa"), b("b", &s, &now, "b0b0"), b2("b", &s, &now, "b1b1");
  a.c->Heartbeat();
  b.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  now += 100;
  b2.c->Heartbeat();  // a replacement, once: not a clash
  s.digest = Reduce(a, s, now);
  cr_expect(nlohmann::json::parse(*s.digest)["clashes"].empty(), "one replacement named a clash");
  now += 100;
  b.c->Heartbeat();  // the first run back on its state dir, once (its replacement died): not a clash either
  s.digest = Reduce(a, s, now);
  cr_expect(nlohmann::json::parse(*s.digest)["clashes"].empty(), "a run back once named a clash");
  for (int i = 0; i < 3; i++) {  // ... but both go on writing
    now += 100;
    b.c->Heartbeat();
    s.digest = Reduce(a, s, now);
    now += 100;
    b2.c->Heartbeat();
    s.digest = Reduce(a, s, now);
  }
  auto d = nlohmann::json::parse(*s.digest);
  cr_assert_eq(d["clashes"].size(), 1u, "the digest names no clash: %s", d.dump().c_str());
  cr_expect_eq(d["clashes"][0], "b");
  b.c->Heartbeat();
  b2.c->Heartbeat();
  a.c->Heartbeat();
  cr_expect(b.c->Status().node_id_clash && b2.c->Status().node_id_clash, "the two mounts were not told");
  cr_expect(!a.c->Status().node_id_clash);
}

Test(cluster_digest, future_records_are_no_members) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now);
  a.log.at.push_back(now * 1000);
  a.c->Sample();
  a.c->Heartbeat();
  const int64_t future = (now + 10LL * 365 * 86400 * 1000) * 1000;
  s.recs["ghost"] = nlohmann::json({{"version", 2},
                                    {"cluster", "job"},
                                    {"node", "ghost"},
                                    {"state", "live"},
                                    {"heartbeat_us", future},
                                    {"watermark_us", 0},
                                    {"oldest_gate_us", 1},
                                    {"unpersisted", 1},
                                    {"paths", nlohmann::json::array()},
                                    {"refused", nlohmann::json::array()}})
                        .dump();
  s.recs["junk"] = "{not json";
  now += 100;
  s.digest = Reduce(a, s, now);
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(1), "a forged record held the drain");
  auto st = a.c->Status();
  cr_expect_eq(st.refused.size(), 1u);
  cr_expect_eq(st.refused[0].node, "ghost");
  cr_expect_eq(st.members_total, 1u);
}

Test(cluster_digest, stale_digest_holds) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), b("b", &s, &now);
  b.c->Heartbeat();
  s.digest = Reduce(b, s, now);  // read before a's entry
  now += 10;
  a.log.at.push_back(now * 1000);
  a.c->Sample();
  now += 200;
  a.c->Heartbeat();  // a's record names its entry; the digest is older
  cr_expect(!a.c->MayPublish(1), "published on a digest read before the entry's gate + skew");
  cr_expect(a.c->Status().waiting_for == std::vector<std::string>{"(this node's next read of the records)"});
  b.c->Heartbeat();
  s.digest = Reduce(b, s, now);
  a.c->Heartbeat();
  cr_expect(a.c->MayPublish(1));
  // A digest dated in this node's future is not used.
  auto future = nlohmann::json::parse(*s.digest);
  future["as_of_us"] = (now + 10000) * 1000;  // the elected member's clock 10 s ahead
  s.digest = future.dump();
  a.log.at.push_back(now * 1000);
  a.c->Sample();
  now += 100;
  a.c->Heartbeat();
  cr_expect(!a.c->MayPublish(2));
  cr_expect(a.c->Status().last_error.find("future") != std::string::npos, "%s", a.c->Status().last_error.c_str());
}

Test(cluster_digest, small_at_a_thousand_members) {
  int64_t now = 1000;
  DigestStore s;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 1000; i++) {
    nodes.push_back(std::make_unique<Node>("node" + std::to_string(i), &s, &now));
    if (i % 3 == 0) {
      nodes.back()->log.at.push_back((now - i) * 1000);
      nodes.back()->c->Sample();
    }
    nodes.back()->c->Heartbeat();
    now++;
  }
  std::string d = Reduce(*nodes[0], s, now);
  auto j = nlohmann::json::parse(d);
  // Idle (nothing pending, nothing changed): the next reduction writes nothing.
  for (auto& n : nodes) n->log.applied = n->log.at.size();
  for (auto& n : nodes) n->c->Heartbeat();
  auto list = s.List();
  cr_expect(nodes[0]->c->Reduce(*list, now * 1000).summary.empty(), "a summary sooner than the gap at 1,000");
  now += Cluster::SummaryGapUs(1000) / 1000;
  cr_expect(!nodes[0]->c->Reduce(*list, now * 1000).summary.empty(), "the drained cluster's digest changed");
  now += 1000;
  for (auto& n : nodes) n->c->Heartbeat();
  list = s.List();
  cr_expect(nodes[0]->c->Reduce(*list, now * 1000).summary.empty(),
            "an idle cluster's refreshed records wrote a digest");
  cr_expect_eq(j["members"].get<int>(), 1000);
  cr_expect_leq(j["records"].size(), 5u, "two of each order, and the elected member's own");
  cr_expect_lt(d.size(), 8192u, "digest of %zu bytes", d.size());
}

// The elected member itself dies with files pending (found by the crash
// harness's node-loss kind): the member elected next never read its record
// itself, but the last digest carried it (the elected member's own record
// always goes in), so it names the dead member lost all the same.
Test(cluster_digest, a_dead_elected_member_is_named_lost_by_the_next) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), b("b", &s, &now), c("c", &s, &now);
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  a.log.at.push_back(now * 1000);  // a, elected, has a file pending
  a.c->Sample();
  a.c->Heartbeat();
  s.digest = Reduce(a, s, now);
  for (Node* n : {&b, &c}) n->c->Heartbeat();  // they read a's digest
  now += 100;
  s.recs.erase("a");  // a's lease expires; b is elected next
  s.digest = Reduce(b, s, now);
  auto d = nlohmann::json::parse(*s.digest);
  cr_expect_eq(d["lost"].size(), 1u, "the next elected member names the dead one lost: %s", s.digest->c_str());
  c.c->Heartbeat();
  bool dead = false;
  for (const auto& m : c.c->Status().members)
    if (m.node == "a") dead = m.state == "dead" && m.unpersisted == 1;
  cr_expect(dead, "the other members list a dead with its file");
}

// The chain of one checkpoint at 300 members (docs/scale.md): every member
// has one shard pending, closed 1 ms apart; each publishes in turn. Each
// step goes to the one member whose turn it is (its own key), not to all:
// the summaries every member receives stay a few, the turns one a step,
// and no member ever passes before the member ahead of it.
// A store like etcd's: the records, the summary, each member's turn key
// (a revision each), and the batons members hand on (`hand`: else they are
// lost, as when the members die or the store refuses them).
struct TurnStore {
  Store recs;
  std::string summary;
  int64_t summary_rev = 0, rev = 0;
  std::map<std::string, std::pair<int64_t, std::string>> turns;
  bool hand = true;
  int handoffs = 0;
  void Took(const ckpt::fs::Reduction& r) {
    if (!r.summary.empty()) summary = r.summary, summary_rev = ++rev;
    if (!r.turn.empty()) turns[r.turn_node] = {++rev, r.turn};
  }
};

// One member's view of it: the newer of the summary and its own turn.
struct TurnView : ckpt::fs::RecordStore {
  TurnStore* s;
  std::string node;
  TurnView(TurnStore* st, std::string n) : s(st), node(std::move(n)) {}
  Status Put(const std::string& n, const std::string& b) override { return s->recs.Put(n, b); }
  Status PutHanding(const std::string& n, const std::string& b, const ckpt::fs::Handoff& h) override {
    auto st = s->recs.Put(n, b);
    if (st && s->hand) s->turns[h.to] = {++s->rev, h.digest}, s->handoffs++;
    return st;
  }
  Result<std::vector<std::pair<std::string, std::string>>> List() override { return s->recs.List(); }
  std::optional<std::string> Digest() override {
    auto it = s->turns.find(node);
    return it != s->turns.end() && it->second.first > s->summary_rev ? it->second.second : s->summary;
  }
  std::string Turn() override {
    auto it = s->turns.find(node);
    return it == s->turns.end() ? "" : it->second.second;
  }
};

// A checkpoint's chain: one shard a member, closed 1 ms apart. Returns
// the time the chain took (ms; -1: it did not finish).
struct Chain {
  int m;
  bool hand;
  int summaries = 0, turns_given = 0, handoffs = 0, early = 0;
  int64_t Run();
};

int64_t Chain::Run() {
  int64_t now = 1000;
  TurnStore st;
  st.hand = hand;
  std::vector<std::unique_ptr<TurnView>> views;
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < m; i++) {
    views.push_back(std::make_unique<TurnView>(&st, "n" + std::to_string(1000 + i)));
    nodes.push_back(std::make_unique<Node>(views.back()->node, views.back().get(), &now));
  }
  for (auto& n : nodes) n->c->Heartbeat();
  for (int i = 0; i < m; i++) {
    nodes[i]->log.at.push_back(now * 1000);
    nodes[i]->c->Sample();
    now++;
  }
  now += 100;  // past the last gate + skew: every record written after it
  for (auto& n : nodes) n->c->Heartbeat();
  const int64_t start = now;
  int done = 0;
  for (int step = 0; done < m && step < 100 * m; step++) {
    now += 2;  // a store round trip
    auto list = st.recs.List();
    auto r = nodes[0]->c->Reduce(*list, now * 1000);  // the elected member
    st.Took(r);
    summaries += !r.summary.empty();
    turns_given += !r.turn.empty();
    for (int i = 0; i < m; i++) {
      nodes[i]->c->Heartbeat();  // reads what it was given
      if (nodes[i]->log.applied == 0 && nodes[i]->c->MayPublish(1)) {
        if (i != done) early++;  // one before it has not published yet
        nodes[i]->log.applied = 1;
        done++;
        nodes[i]->c->Heartbeat();  // its record, and the baton handed on
      }
    }
  }
  handoffs = st.handoffs;
  return done == m ? now - start : -1;
}

// Random clusters with batons handed on: whenever a member's head entry
// passes over what it was given (digests, batons), the rule over every
// record, read now, lets it pass too.
Test(cluster_digest, a_baton_lets_pass_only_what_every_record_does) {
  std::mt19937 rng(20261128);
  int passed = 0, wrong = 0, handoffs = 0;
  for (int round = 0; round < 24; round++) {
    const int m = 3 + static_cast<int>(rng() % 30);
    int64_t now = 1000;
    Store plain;
    TurnStore st;
    std::vector<std::unique_ptr<TurnView>> views;
    std::vector<std::unique_ptr<Node>> p, r;
    for (int i = 0; i < m; i++) {
      views.push_back(std::make_unique<TurnView>(&st, "n" + std::to_string(i)));
      p.push_back(std::make_unique<Node>(views.back()->node, &plain, &now));
      r.push_back(std::make_unique<Node>(views.back()->node, views.back().get(), &now));
    }
    for (int i = 0; i < m; i++) p[i]->c->Heartbeat(), r[i]->c->Heartbeat();
    for (int step = 0; step < 30 * m; step++) {
      now += static_cast<int64_t>(rng() % 8);
      const int i = static_cast<int>(rng() % m);
      switch (rng() % 7) {
        case 0:  // a file closed (some members close several)
          for (auto* n : {p[i].get(), r[i].get()}) n->log.at.push_back(now * 1000), n->c->Sample();
          break;
        case 6:  // a checkpoint: a shard closed on every member, in some order
          if (rng() % 8 != 0) break;
          for (int k = 0; k < m; k++) {
            const int j = static_cast<int>((static_cast<unsigned>(i) + static_cast<unsigned>(k) * 7u) % m);
            for (auto* n : {p[j].get(), r[j].get()}) n->log.at.push_back((now * 1000) + k), n->c->Sample();
          }
          break;
        case 1:
          for (auto* n : {p[i].get(), r[i].get()}) n->c->Sample(), n->c->Heartbeat();
          break;
        case 2: {
          auto list = st.recs.List();
          st.Took(r[0]->c->Reduce(*list, now * 1000));
          break;
        }
        default: {  // the member's drain asks for its head entry; now and then every member's, in turn
          const bool sweep = rng() % 4 == 0;
          for (int k = 0; k < (sweep ? m : 1); k++) {
            const int j = sweep ? k : i;
            Node& n = *r[j];
            if (n.log.applied >= n.log.at.size()) continue;
            n.c->Heartbeat();
            p[j]->c->Heartbeat();  // the same records in both stores
            if (!n.c->MayPublish(n.log.applied + 1)) continue;
            passed++;
            if (!p[j]->c->MayPublish(n.log.applied + 1)) {
              wrong++;
              std::string why;  // what holds it over every record
              for (const auto& w : p[j]->c->Status().waiting_for) why += " " + w;
              cr_log_error("round %d n%d seq %llu passed over what it was given, not over every record (held by%s)",
                           round, j, static_cast<unsigned long long>(n.log.applied + 1), why.c_str());
            }
            for (auto* x : {p[j].get(), r[j].get()}) x->log.applied++, x->c->Sample(), x->c->Heartbeat();
          }
        }
      }
    }
    handoffs += st.handoffs;
  }
  cr_expect_eq(wrong, 0);
  cr_expect_gt(passed, 300, "too few entries passed: %d", passed);
  cr_expect_gt(handoffs, 100, "too few batons handed on: %d", handoffs);
  cr_log_info("%d entries passed, %d batons handed on", passed, handoffs);
}

Test(cluster_digest, each_step_of_a_chain_is_one_members_turn) {
  // Each member hands the baton on with its record: the next passes without
  // waiting for the elected member (here within the same round), which
  // gives a turn about once per baton (32 members).
  Chain c{300, true};
  const int64_t took = c.Run();
  cr_assert_geq(took, 0, "the chain did not finish");
  cr_expect_eq(c.early, 0, "a member passed before the one ahead of it");
  cr_expect_leq(c.turns_given, 300 / 32 + c.summaries + 2, "%d turns, %d summaries", c.turns_given, c.summaries);
  cr_expect_geq(c.handoffs, 300 - c.turns_given - c.summaries, "%d handoffs", c.handoffs);
  // Handoffs lost (members that die, a store that refuses them): a member
  // the baton names gets a turn after a grace (100 ms), and the turns
  // after a loss go without a baton for a while (1, 2, 4 ... 32): slower,
  // never stuck.
  Chain lost{300, false};
  const int64_t slow = lost.Run();
  cr_assert_geq(slow, 0, "without handoffs the chain did not finish");
  cr_expect_eq(lost.early, 0, "a member passed before the one ahead of it (no handoffs)");
  cr_expect_eq(lost.handoffs, 0);
  cr_expect_leq(slow, 300 * 2 + 20 * 100, "without handoffs: %lld ms", static_cast<long long>(slow));
  cr_log_info("300 members: handed %lld ms (%d turns, %d summaries, %d handoffs); lost %lld ms (%d turns)",
              static_cast<long long>(took), c.turns_given, c.summaries, c.handoffs, static_cast<long long>(slow),
              lost.turns_given);
}

// Node loss with etcd: the digest names a lost member with its U, and a
// removal of another member ordered after it is kept out of the backend
// (LostWindows); one made after the member learned of the loss is not.
Test(cluster_digest, a_removal_after_a_lost_members_entries_is_kept) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), b("b", &s, &now), c("c", &s, &now);
  for (Node* n : {&a, &b, &c}) n->c->Heartbeat();
  now = 1100;
  b.log.at.push_back(now * 1000);  // b's `latest`, not replicated
  b.c->Sample();
  b.c->Heartbeat();
  now = 1200;
  c.log.at.push_back(now * 1000);  // c's rotation
  c.c->Sample();
  c.c->Heartbeat();
  const int64_t g = c.c->GateTime(1).value();
  s.digest = Reduce(a, s, now);
  for (Node* n : {&a, &c}) n->c->Heartbeat();
  cr_expect(!c.c->MayPublish(1), "b's `latest` first");
  now = 1300;
  s.recs.erase("b");  // b's lease expires
  s.digest = Reduce(a, s, now);
  auto d = nlohmann::json::parse(*s.digest);
  cr_assert_eq(d["lost"].size(), 1u, "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][0]["unsafe_gate_us"].get<int64_t>(), 1100 * 1000);
  now = 1400;
  for (Node* n : {&a, &c}) n->c->Heartbeat();  // records newer than c's gate + skew
  s.digest = Reduce(a, s, now);
  c.c->Heartbeat();
  cr_expect(c.c->MayPublish(1), "b is lost: c's entry goes");
  cr_expect_eq(c.c->KeepsRemoval(g, "step_1/shard_c"), std::string("b"));
  cr_expect_eq(c.c->KeepsRemoval(now * 1000 + 1, "later"), std::string(""), "made after the loss was known");
  cr_expect_eq(c.c->Status().kept_removals, 1u);
}

// A holder with nothing of its own pending, publishing a dead member's
// replica (issue #30, two losses), dies: the digest names it lost with
// that replica (its record's at-risk file and U), not "gone, nothing
// pending" (which kept no lost window and listed nothing).
Test(cluster_digest, an_idle_holder_lost_with_a_dead_members_replica_is_named_lost) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), h("h", &s, &now);
  const int64_t g = 900 * 1000;  // the dead writer's shard
  h.c->SetHeldGate([g](bool dead_too) {
    ckpt::fs::HeldForOthers held;
    held.gate = g + 1;
    if (dead_too) held.dead_gate = g, held.dead_files = 1, held.dead_paths = {"step1/shard_b"};
    return held;
  });
  for (Node* n : {&a, &h}) n->c->Heartbeat();
  s.digest = Reduce(a, s, now);
  now = 1100;
  s.recs.erase("h");  // h's lease expires
  s.digest = Reduce(a, s, now);
  auto d = nlohmann::json::parse(*s.digest);
  cr_assert_eq(d["lost"].size(), 1u, "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][0]["unsafe_gate_us"].get<int64_t>(), g);
  a.c->Heartbeat();
  cr_expect_eq(a.c->KeepsRemoval(g + 50 * 1000, "step_0/shard_a"), std::string("h"));
}

// K = 2: both holders of a dead writer's shard name it at risk; the loss of
// one is not the shard's (the other publishes it), so it is not listed
// lost with it. Its gate still keeps the removals after it (the safe side).
Test(cluster_digest, a_dead_holders_shard_another_live_holder_names_is_not_listed_lost) {
  int64_t now = 1000;
  DigestStore s;
  Node a("a", &s, &now), h1("h1", &s, &now), h2("h2", &s, &now);
  const int64_t g = 900 * 1000;
  auto holds = [g](std::vector<std::string> paths) {
    return [g, paths](bool dead_too) {
      ckpt::fs::HeldForOthers held{g + 1};
      if (dead_too) held.dead_gate = g, held.dead_files = paths.size(), held.dead_paths = paths;
      return held;
    };
  };
  h1.c->SetHeldGate(holds({"step1/shard_b", "step1/shard_c"}));  // shard_c: h1 alone holds it
  h2.c->SetHeldGate(holds({"step1/shard_b"}));
  for (Node* n : {&a, &h1, &h2}) n->c->Heartbeat();
  s.digest = Reduce(a, s, now);
  now = 1100;
  s.recs.erase("h1");  // h1's lease expires; h2 lives on
  s.digest = Reduce(a, s, now);
  auto d = nlohmann::json::parse(*s.digest);
  cr_assert_eq(d["lost"].size(), 1u, "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][0]["node"].get<std::string>(), std::string("h1"));
  cr_expect_eq(d["lost"][0]["at_risk"].get<uint64_t>(), 1u, "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][0]["paths"], nlohmann::json::array({"step1/shard_c"}), "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][0]["unsafe_gate_us"].get<int64_t>(), g);
  // Then h2 dies too: the shard is lost now, and named with it.
  now = 1200;
  s.recs.erase("h2");
  s.digest = Reduce(a, s, now);
  d = nlohmann::json::parse(*s.digest);
  cr_assert_eq(d["lost"].size(), 2u, "%s", s.digest->c_str());
  cr_expect_eq(d["lost"][1]["node"].get<std::string>(), std::string("h2"));
  cr_expect_eq(d["lost"][1]["paths"], nlohmann::json::array({"step1/shard_b"}), "%s", s.digest->c_str());
}
