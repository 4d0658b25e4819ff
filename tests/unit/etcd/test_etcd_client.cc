// test_etcd_client.cc — the etcd client (fs/cluster/etcd_client.h) against
// a real etcd (Debian's etcd-server, started per test by tests/etcd/etcd.sh
// on free 127.0.0.1 ports): keys, transactions, leases and their expiry,
// watches, fail-over between the members of a 3-member etcd, and bad store
// addresses refused.
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/options.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/checksum.h"
#include "common/mutex.h"
#include "fs/cluster/etcd_client.h"
#include "fs/cluster/etcd_records.h"
#include "fs/cluster/poison.h"
#include "fs/cluster/replica_store.h"
#include "fs/cluster/takeover.h"

using namespace ckpt::fs::etcd;

namespace {

std::string g_dir, g_script;

std::string FindScript() {
  if (const char* src = std::getenv("CKPTFS_SRC_DIR")) return std::string(src) + "/tests/etcd/etcd.sh";
  std::filesystem::path p = std::filesystem::current_path();
  for (int i = 0; i < 6; i++, p = p.parent_path())
    if (std::filesystem::exists(p / "tests/etcd/etcd.sh")) return (p / "tests/etcd/etcd.sh").string();
  return {};
}

std::string Run(const std::string& cmd, int* rc) {
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[256];
  while (f && fgets(buf, sizeof buf, f)) out += buf;
  int st = f ? pclose(f) : -1;
  *rc = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// Starts an etcd of `members` members; its endpoints as URLs.
std::vector<std::string> Start(int members) {
  g_script = FindScript();
  cr_assert(!g_script.empty(), "tests/etcd/etcd.sh not found");
  char tmpl[] = "/tmp/ckpt-etcd-XXXXXX";
  g_dir = mkdtemp(tmpl);
  int rc = 0;
  std::string eps = Run(g_script + " start " + g_dir + " " + std::to_string(members), &rc);
  if (rc == 77) cr_skip_test("etcd is not installed (apt-get install etcd-server)");
  cr_assert_eq(rc, 0, "etcd did not start");
  auto parsed = ParseStoreUrl("etcd://" + eps);
  cr_assert(parsed.has_value());
  return *parsed;
}

void Stop() {
  if (g_dir.empty()) return;
  int rc = 0;
  Run(g_script + " stop " + g_dir, &rc);
  std::filesystem::remove_all(g_dir);
}

Options Opts(std::vector<std::string> eps, std::string user = "", std::string password = "",
             int64_t timeout_ms = 5000) {
  Options o;
  o.endpoints = std::move(eps);
  o.user = std::move(user);
  o.password = std::move(password);
  o.timeout_ms = timeout_ms;
  return o;
}

// A member's records of cluster "job" (client timeout 2 s).
// `run`: its incarnation ("" unknown).
ckpt::fs::EtcdRecordsOptions RecordsOpts(const std::vector<std::string>& eps, const std::string& node, int64_t ttl_s,
                                         const std::string& run = "") {
  ckpt::fs::EtcdRecordsOptions o;
  o.client = Opts(eps, "", "", 2000);
  o.url = "etcd://test";
  o.cluster = "job";
  o.node = node;
  o.lease_ttl_s = ttl_s;
  o.incarnation = run;
  return o;
}

template <class F>
bool WaitFor(F f, int ms) {
  for (int i = 0; i < ms / 10; i++) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

}  // namespace

TestSuite(etcd_client, .fini = Stop, .timeout = 60);

Test(etcd_client, store_urls) {
  auto ok = ParseStoreUrl("etcd://127.0.0.1:2379,10.0.0.2:2380");
  cr_assert(ok.has_value());
  cr_assert_eq(ok->size(), 2u);
  cr_assert_str_eq((*ok)[0].c_str(), "http://127.0.0.1:2379");
  auto tls = ParseStoreUrl("etcds://etcd-0.svc:2379");
  cr_assert(tls.has_value());
  cr_assert_str_eq((*tls)[0].c_str(), "https://etcd-0.svc:2379");
  for (const char* bad :
       {"", "etcd://", "http://127.0.0.1:2379", "etcd://host", "etcd://host:0", "etcd://host:65536", "etcd://host:23x9",
        "etcd://:2379", "etcd://a:1,,b:2", "etcd://h/x:1", "etcd://h:1/", "etcd://a b:1"}) {
    auto r = ParseStoreUrl(bad);
    cr_assert(!r.has_value(), "accepted '%s'", bad);
    cr_assert(!r.error().empty());
    cr_assert(r.error().find('\n') == std::string::npos);
  }
  const std::string end = PrefixEnd("/a/");  // held: the macro reads the string after the statement
  cr_assert_str_eq(end.c_str(), "/a0");
  cr_assert_eq(PrefixEnd(std::string("a\xff", 2)), "b");
}

Test(etcd_client, put_range_delete) {
  Client c(Opts(Start(1)));
  auto rev = c.Put("/t/a", std::string("bytes\0\xff", 7));
  cr_assert(rev.has_value(), "%s", c.LastError().c_str());
  cr_assert(c.Put("/t/b", "2").has_value());
  cr_assert(c.Put("/u", "3").has_value());
  auto r = c.Range("/t/", PrefixEnd("/t/"));
  cr_assert(r.has_value());
  cr_assert_eq(r->kvs.size(), 2u);
  cr_assert_eq(r->kvs[0].value, std::string("bytes\0\xff", 7));
  cr_assert_str_eq(r->kvs[1].key.c_str(), "/t/b");
  cr_assert_geq(r->revision, *rev);
  auto one = c.Range("/t/b");
  cr_assert_eq(one->kvs.size(), 1u);
  auto limited = c.Range("/", PrefixEnd("/"), 1);
  cr_assert_eq(limited->kvs.size(), 1u);
  cr_assert(limited->more);
  cr_assert_eq(*c.Delete("/t/", PrefixEnd("/t/")), 2);
  cr_assert(c.Range("/t/", PrefixEnd("/t/"))->kvs.empty());
  cr_assert_eq(c.Range("/u")->kvs.size(), 1u);
}

Test(etcd_client, transactions) {
  Client c(Opts(Start(1)));
  auto first = c.PutIfAbsent("/lead", "n1", 0);
  cr_assert(first.has_value());
  cr_assert(first->succeeded);
  auto second = c.PutIfAbsent("/lead", "n2", 0);
  cr_assert(second.has_value());
  cr_assert(!second->succeeded);
  cr_assert_eq(second->kvs.size(), 1u);
  cr_assert_str_eq(second->kvs[0].value.c_str(), "n1");
  auto guarded = c.PutIfEqual("/summary", "s1", 0, "/lead", "n1");
  cr_assert(guarded->succeeded);
  auto refused = c.PutIfEqual("/summary", "s2", 0, "/lead", "n2");
  cr_assert(!refused->succeeded);
  auto summary = c.Range("/summary");  // held: the macro reads the string after the statement
  cr_assert_str_eq(summary->kvs[0].value.c_str(), "s1");
}

// A delete guarded by the key's mod_revision deletes only the version it
// names: a key put again since stays (EtcdNames' expiry of a name another
// node wrote after this one); the other ops of the transaction go on.
Test(etcd_client, delete_if_mod_revision) {
  Client c(Opts(Start(1)));
  auto r1 = c.Put("/n/a", "mine");
  cr_assert(r1.has_value());
  auto r2 = c.Put("/n/a", "theirs");
  cr_assert(r2.has_value());
  cr_assert_gt(*r2, *r1);
  cr_assert(c.Put("/n/b", "b").has_value());
  auto t = c.Txn({{.del = true, .key = "/n/a", .if_mod_revision = *r1}, {.del = true, .key = "/n/b"}});
  cr_assert(t.has_value(), "txn: %s", c.LastError().c_str());
  auto a = c.Range("/n/a");
  cr_assert_eq(a->kvs.size(), 1u, "a key put again since was deleted");
  cr_assert_str_eq(a->kvs[0].value.c_str(), "theirs");
  cr_assert_eq(c.Range("/n/b")->kvs.size(), 0u);
  // Naming the current version deletes it.
  cr_assert(c.Txn({{.del = true, .key = "/n/a", .if_mod_revision = *r2}}).has_value());
  cr_assert_eq(c.Range("/n/a")->kvs.size(), 0u);
}

// A put guarded by another key's value (a baton handed on with a record,
// only while the elected member is the one it names): the guarded put goes
// only while the guard holds; the transaction's other puts go either way.
Test(etcd_client, put_if_guard_holds) {
  Client c(Opts(Start(1)));
  cr_assert(c.Put("/lead", "n1 7").has_value());
  auto t = c.Txn({{.key = "/rec", .value = "r1"},
                  {.key = "/turn/b", .value = "baton1", .guard_key = "/lead", .guard_value = "n1 7"}});
  cr_assert(t.has_value(), "txn: %s", c.LastError().c_str());
  auto turn = c.Range("/turn/b");
  cr_assert_eq(turn->kvs.size(), 1u);
  cr_assert_str_eq(turn->kvs[0].value.c_str(), "baton1");
  cr_assert(c.Put("/lead", "n2 9").has_value());  // another election
  t = c.Txn({{.key = "/rec", .value = "r2"},
             {.key = "/turn/b", .value = "baton2", .guard_key = "/lead", .guard_value = "n1 7"}});
  cr_assert(t.has_value(), "txn: %s", c.LastError().c_str());
  turn = c.Range("/turn/b");
  cr_assert_str_eq(turn->kvs[0].value.c_str(), "baton1", "a baton of an older election was written");
  auto rec = c.Range("/rec");
  cr_assert_str_eq(rec->kvs[0].value.c_str(), "r2", "the record did not go with the guard failing");
}

Test(etcd_client, leases_expire_and_revoke) {
  Client c(Opts(Start(1)));
  auto id = c.Grant(2);
  cr_assert(id.has_value(), "%s", c.LastError().c_str());
  cr_assert(c.Put("/m/n1", "x", *id).has_value());
  cr_assert_eq(c.Range("/m/n1")->kvs[0].lease, *id);
  auto ttl = c.KeepAlive(*id);
  cr_assert(ttl.has_value());
  cr_assert_geq(*ttl, 1);
  // Left alone, it expires and takes its key along.
  cr_assert(WaitFor([&] { return c.Range("/m/n1")->kvs.empty(); }, 6000), "the lease's key outlived it");
  cr_assert_eq(*c.KeepAlive(*id), 0);
  auto id2 = c.Grant(30);
  cr_assert(c.Put("/m/n2", "y", *id2).has_value());
  cr_assert(c.Revoke(*id2).has_value());
  cr_assert(c.Range("/m/n2")->kvs.empty());
  // A put with a lease that does not exist fails.
  cr_assert(!c.Put("/m/n3", "z", *id2).has_value());
}

Test(etcd_client, watch_sees_puts_and_deletes) {
  Client c(Opts(Start(1)));
  ckpt::Mutex mu;
  std::vector<WatchEvent> seen;
  std::atomic<int64_t> rev{0};
  auto start = c.Put("/w/x", "0");
  Watch w(
      &c, "/w/", PrefixEnd("/w/"), *start + 1,
      [&](const std::vector<WatchEvent>& evs, int64_t r) {
        ckpt::MutexLock lk(&mu);
        seen.insert(seen.end(), evs.begin(), evs.end());
        rev = r;
      },
      [](const std::string&) {}, [] {});
  cr_assert(c.Put("/w/a", "1").has_value());
  cr_assert(c.Put("/other", "1").has_value());
  cr_assert(c.Delete("/w/a").has_value());
  cr_assert(WaitFor(
      [&] {
        ckpt::MutexLock lk(&mu);
        return seen.size() >= 2;
      },
      5000));
  w.Stop();
  ckpt::MutexLock lk(&mu);
  cr_assert_eq(seen.size(), 2u);
  cr_assert_str_eq(seen[0].kv.key.c_str(), "/w/a");
  cr_assert_str_eq(seen[0].kv.value.c_str(), "1");
  cr_assert(!seen[0].deleted);
  cr_assert(seen[1].deleted);
}

// A watch on a member cut off from the others' majority (here: the two
// others killed) is ended by etcd with "no leader" because the watch asks
// for a leader (Grpc-Metadata-Hasleader): without it, etcd kept the stream
// open and silent for as long as the partition lasted, and the digest,
// turn and member watches of every node on that member stalled.
Test(etcd_client, a_watch_on_a_member_without_a_leader_ends, .timeout = 90) {
  auto eps = Start(3);
  Client c(Opts({eps[0]}));
  cr_assert(c.Put("/w/x", "0").has_value());
  ckpt::Mutex mu;
  std::string err;
  std::atomic<bool> created{false};
  Watch w(
      &c, "/w/", PrefixEnd("/w/"), 0, [&](const std::vector<WatchEvent>&, int64_t) { created = true; },
      [&](const std::string& e) {
        ckpt::MutexLock lk(&mu);
        if (!e.empty()) err = e;
      },
      [] {});
  cr_assert(WaitFor([&] { return created.load(); }, 10000), "the watch never started");
  int rc = 0;
  Run(g_script + " kill " + g_dir + " 1", &rc);
  cr_assert_eq(rc, 0);
  Run(g_script + " kill " + g_dir + " 2", &rc);
  cr_assert_eq(rc, 0);
  cr_assert(WaitFor(
                [&] {
                  ckpt::MutexLock lk(&mu);
                  return !err.empty();
                },
                30000),
            "the watch on a member without a leader stayed open and silent");
  w.Stop();  // (the gateway ends the stream: the error says so, not why)
  Stop();
}

// One grant at a time: the heartbeat, the reads and the names asked for a
// lease at once (after a loss, or at start), each granted one, and all but
// one of them were never kept alive: a record put under one expired with
// the live node's name.
Test(etcd_client, concurrent_askers_of_a_lease_share_one_grant) {
  auto eps = Start(1);
  ckpt::fs::EtcdRecordsOptions o;
  o.client = Opts(eps);
  o.url = "etcd://test";
  o.cluster = "job";
  o.node = "a";
  o.lease_ttl_s = 5;
  ckpt::fs::EtcdRecords r(o, [] { return int64_t{0}; });
  std::vector<std::thread> ts;
  std::vector<int64_t> got(8, 0);
  for (size_t i = 0; i < got.size(); i++) ts.emplace_back([&, i] { got[i] = r.Lease().value_or(-1); });
  for (auto& t : ts) t.join();
  for (int64_t id : got) cr_expect(id > 0 && id == got[0], "leases %lld and %lld", (long long)got[0], (long long)id);
  cr_expect_eq(r.Stats().grants, 1u);
}

Test(etcd_client, one_member_down_nothing_changes, .timeout = 90) {
  auto eps = Start(3);
  Client c(Opts(eps));
  cr_assert(c.Put("/k", "1").has_value());
  int rc = 0;
  Run(g_script + " kill " + g_dir + " 0", &rc);
  cr_assert_eq(rc, 0);
  // The other two keep a quorum: requests go on, through the next endpoint.
  cr_assert(WaitFor([&] { return c.Put("/k", "2").has_value(); }, 10000), "%s", c.LastError().c_str());
  auto k = c.Range("/k");
  cr_assert_str_eq(k->kvs[0].value.c_str(), "2");
  auto id = c.Grant(5);
  cr_assert(id.has_value());
  cr_assert(c.KeepAlive(*id).has_value());
}

Test(etcd_client, unreachable_store_fails_fast) {
  // A port nothing listens on: refused, in well under the timeout.
  Client c(Opts({"http://127.0.0.1:1"}, "", "", 3000));
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.Put("/k", "v");
  cr_assert(!r.has_value());
  cr_assert_eq(r.error(), ECONNREFUSED);
  cr_assert_lt(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  cr_assert(c.LastError().find("127.0.0.1:1") != std::string::npos);
}

Test(etcd_client, hung_store_bounded_and_marked_unreachable) {
  // A store that accepts connections and never answers (a hung etcd, a
  // proxy in front of a dead one): a request with a short budget gives up
  // in about that budget, and the client says it is unreachable.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  cr_assert_eq(listen(fd, 16), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  Client c(Opts({"http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))}));
  cr_assert(c.reachable());
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.Txn({{false, "/k", "", "v", 0}}, 300);
  const auto took = std::chrono::steady_clock::now() - t0;
  close(fd);
  cr_assert(!r.has_value());
  cr_assert_eq(r.error(), ETIMEDOUT);
  cr_assert_lt(took, std::chrono::milliseconds(2000), "a 300 ms request took %lld ms",
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  cr_assert(!c.reachable());
}

Test(etcd_client, reachable_again_once_it_answers, .timeout = 90) {
  auto eps = Start(1);
  Client c(Opts(eps, "", "", 3000));
  cr_assert(c.Put("/k", "1").has_value());
  cr_assert(c.reachable());
  int rc = 0;
  Run(g_script + " stop " + g_dir, &rc);
  cr_assert(!c.Put("/k", "2").has_value());
  cr_assert(!c.reachable());
  Run(g_script + " restart " + g_dir + " 0", &rc);
  cr_assert_eq(rc, 0, "etcd did not restart");
  cr_assert(WaitFor([&] { return c.Put("/k", "3").has_value(); }, 20000), "%s", c.LastError().c_str());
  cr_assert(c.reachable());
}

Test(etcd_client, users_and_passwords, .timeout = 90) {
  auto eps = Start(1);
  Client root(Opts(eps));
  // etcd's auth: a root user, a role with read-write on a prefix, a user in it.
  for (const char* step :
       {"user add root:rootpw", "user grant-role root root", "user add ckpt:s3cret", "role add ckpt",
        "role grant-permission ckpt --prefix=true readwrite /ckptfs/", "user grant-role ckpt ckpt", "auth enable"}) {
    int rc = 0;
    // Until auth is enabled, etcdctl needs no user.
    std::string out = Run("ETCDCTL_API=3 etcdctl --endpoints=" + eps[0] + " " + step + " 2>&1", &rc);
    cr_assert_eq(rc, 0, "etcdctl %s: %s", step, out.c_str());
  }
  Client user(Opts(eps, "ckpt", "s3cret"));
  cr_assert(user.Put("/ckptfs/j/x", "1").has_value(), "%s", user.LastError().c_str());
  auto denied = user.Put("/elsewhere", "1");
  cr_assert(!denied.has_value());
  cr_assert_eq(denied.error(), EACCES);
  Client wrong(Opts(eps, "ckpt", "nope"));
  auto bad = wrong.Put("/ckptfs/j/x", "1");
  cr_assert(!bad.has_value());
  cr_assert_eq(bad.error(), EACCES);
  cr_assert(wrong.LastError().find("nope") == std::string::npos, "the password was in: %s", wrong.LastError().c_str());
  auto anon = root.Put("/ckptfs/j/x", "1");
  cr_assert(!anon.has_value());
}

// One test at a time: each starts its own etcd (a 3-member one takes a
// few seconds), and with two parallel workers Criterion 2.4's runner leaked
// two small allocations of its own under LeakSanitizer (asan-unit_etcd;
// no test's memory: the stacks are all libcriterion's). A main of our own
// is Criterion's documented way to set its options.
int main(int argc, char* argv[]) {
  struct criterion_test_set* tests = criterion_initialize();
  int result = 0;
  criterion_options.jobs = 1;
  if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
  criterion_finalize(tests);
  return result;
}

Test(etcd_client, range_since_gives_what_changed_only) {
  Client c(Opts(Start(1)));
  auto a = c.Put("/r/a", "1");
  auto b = c.Put("/r/b", "2");
  cr_assert(a && b);
  auto r = c.RangeSince("/r/", PrefixEnd("/r/"), *a + 1);
  cr_assert(r.has_value(), "%s", c.LastError().c_str());
  cr_assert_eq(r->kvs.size(), 1u);
  cr_assert_str_eq(r->kvs[0].key.c_str(), "/r/b");
  cr_expect_geq(r->revision, *b);
  cr_assert(c.Put("/r/a", "3").has_value());
  r = c.RangeSince("/r/", PrefixEnd("/r/"), *b + 1);
  cr_assert(r && r->kvs.size() == 1u && r->kvs[0].value == "3");
}

// The elected member keeps the records it read and reads only what
// changed before each reduction (docs/scale.md): a member that joins is
// seen, one whose lease is revoked is gone from the next reduction (its
// removal comes by the watch; a read from before it does not bring it
// back), and the whole range is read about once, not once per reduction.
Test(etcd_client, the_elected_member_reads_what_changed) {
  auto eps = Start(1);
  auto open = [&](const std::string& node, ckpt::Mutex* mu, std::vector<std::string>* seen) {
    ckpt::fs::EtcdRecordsOptions o;
    o.client = Opts(eps);
    o.url = "etcd://test";
    o.cluster = "job";
    o.node = node;
    o.lease_ttl_s = 5;
    o.tick_ms = 20;
    auto r = std::make_unique<ckpt::fs::EtcdRecords>(o, [] {
      return std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    });
    r->SetReducer([mu, seen](const std::vector<std::pair<std::string, std::string>>& recs, int64_t) {
      ckpt::MutexLock lk(mu);
      seen->clear();
      for (const auto& [n, v] : recs) seen->push_back(n + "=" + v);
      return ckpt::fs::Reduction{};
    });
    return r;
  };
  ckpt::Mutex mu;
  std::vector<std::string> seen, unused;
  ckpt::Mutex mu2;
  auto a = open("a", &mu, &seen);
  cr_assert(a->Open().has_value(), "%s", a->LastError().c_str());
  cr_assert(a->Put("a", "1").has_value());
  cr_assert(WaitFor([&] { return a->leader(); }, 5000), "a was not elected");
  auto b = open("b", &mu2, &unused);
  cr_assert(b->Open().has_value());
  auto sees = [&](std::vector<std::string> want) {
    return WaitFor(
        [&] {
          ckpt::MutexLock lk(&mu);
          return seen == want;
        },
        5000);
  };
  for (int i = 0; i < 20; i++) {
    cr_assert(b->Put("b", std::to_string(i)).has_value());
    cr_assert(sees({"a=1", "b=" + std::to_string(i)}), "the elected member did not see b's record %d", i);
  }
  // A key under members/ with a lease but a name no member can have (a
  // newline in it would reach logs and status raw): not a member.
  Client raw(Opts(eps));
  auto lease = raw.Grant(30);
  cr_assert(lease.has_value());
  cr_assert(raw.Put("/ckptfs/job/members/x\ny", "{}", *lease).has_value());
  cr_assert(b->Put("b", "last").has_value());
  cr_assert(sees({"a=1", "b=last"}), "a key with a name no member can have is in the view");
  b->Close(true);  // b leaves: its lease revoked, its record gone
  cr_assert(sees({"a=1"}), "b's removed record is still in the elected member's view");
  cr_assert(a->Put("a", "2").has_value());
  cr_assert(sees({"a=2"}));
  auto st = a->Stats();
  cr_expect_leq(st.ranges, 3u, "%llu full reads for %llu reductions", (unsigned long long)st.ranges,
                (unsigned long long)st.reductions);
  cr_expect_geq(st.deltas + st.from_watch, 10u, "%llu reads of changes, %llu reductions of the watch's view",
                (unsigned long long)st.deltas, (unsigned long long)st.from_watch);
  a->Close(true);
}

// A reducer whose summary is every record as NAME=VALUE;.
static ckpt::fs::Reduction NamesAndValues(const std::vector<std::pair<std::string, std::string>>& recs, int64_t) {
  ckpt::fs::Reduction red;
  for (const auto& [n, v] : recs) red.summary += n + "=" + v + ";";
  return red;
}

// A member opened while etcd is down (a mount made before the store came
// up): Open fails, and the member still joins once the store answers — its
// record put under a lease the keep-alive renews past the TTL, elected
// (there is no other), its reduction written and read back as the digest.
Test(etcd_client, a_member_opened_while_the_store_is_down_joins_when_it_answers, .timeout = 90) {
  auto eps = Start(1);
  int rc = 0;
  Run(g_script + " stop " + g_dir, &rc);
  ckpt::fs::EtcdRecordsOptions o = RecordsOpts(eps, "a", 2);
  o.tick_ms = 20;
  ckpt::fs::EtcdRecords r(o, [] { return int64_t{1}; });
  r.SetReducer(NamesAndValues);
  cr_assert(!r.Open().has_value(), "Open succeeded with the store down");
  Run(g_script + " restart " + g_dir + " 0", &rc);
  cr_assert_eq(rc, 0, "etcd did not restart");
  cr_assert(WaitFor([&] { return r.Put("a", "1").has_value(); }, 20000), "%s", r.LastError().c_str());
  cr_assert(WaitFor([&] { return r.leader(); }, 10000), "a was never elected");
  cr_assert(WaitFor([&] { return r.Digest().value_or("") == "a=1;"; }, 10000), "digest: '%s'",
            r.Digest().value_or("").c_str());
  // Past two TTLs: the record is still there, so the lease was kept alive.
  std::this_thread::sleep_for(std::chrono::seconds(5));
  Client raw(Opts(eps));
  auto k = raw.Range("/ckptfs/job/members/a");
  cr_assert(k.has_value());
  cr_assert_eq(k->kvs.size(), 1u, "a's record expired: its lease was not kept alive");
  cr_expect_geq(r.Stats().keepalives, 3u);
  r.Close(true);
}

// The elected member reads the records whole, then follows them with a
// watch. A watch from "now" starts whenever its stream connects: a record
// put between the read and then was in neither, and nothing reduced it
// until the next change (CI: once under ASan, the late-join case above).
// The watch now starts just after the read's revision.
Test(etcd_client, a_record_put_while_the_elected_members_watch_connects_is_reduced, .timeout = 60) {
  auto eps = Start(1);
  Watch::DelayConnectForTest("/ckptfs/job/members/", 3000);
  ckpt::fs::EtcdRecordsOptions o = RecordsOpts(eps, "a", 5);
  o.tick_ms = 20;
  ckpt::fs::EtcdRecords r(o, [] { return int64_t{1}; });
  r.SetReducer(NamesAndValues);
  cr_assert(r.Open().has_value(), "%s", r.LastError().c_str());
  // Elected with no record yet, and the view read once (before, or as, its
  // watch was asked for): the record goes in while that watch connects.
  cr_assert(WaitFor([&] { return r.leader() && r.Stats().ranges >= 1; }, 10000), "a was never elected");
  cr_assert(r.Put("a", "1").has_value(), "%s", r.LastError().c_str());
  cr_assert(WaitFor([&] { return r.Digest().value_or("") == "a=1;"; }, 8000), "digest: '%s'",
            r.Digest().value_or("").c_str());
  r.Close(true);
}

// Standing: a member whose lease has not been confirmed for two thirds of
// its TTL (etcd gone quiet) says so before the keep-alive gives up on the
// lease, so its cluster publishes nothing the others may order without it.
Test(etcd_client, a_member_cut_off_stops_standing_before_its_lease_ends, .timeout = 90) {
  auto eps = Start(1);
  ckpt::fs::EtcdRecordsOptions o = RecordsOpts(eps, "a", 3);
  ckpt::fs::EtcdRecords r(o, [] { return int64_t{1}; });
  cr_assert(r.Open().has_value(), "%s", r.LastError().c_str());
  cr_assert(r.Put("a", "1").has_value());
  cr_expect(r.Standing().empty(), "%s", r.Standing().c_str());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a keep-alive answered meanwhile
  const std::string stands = r.Standing();
  cr_expect(stands.empty(), "a member whose keep-alives are answered stands: %s", stands.c_str());
  int rc = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Run(g_script + " stop " + g_dir, &rc);
  cr_assert(WaitFor([&] { return !r.Standing().empty(); }, 4000), "still standing with etcd stopped");
  const auto took = std::chrono::steady_clock::now() - t0;
  cr_expect_lt(took, std::chrono::milliseconds(2800), "stood %lld ms after etcd stopped (TTL 3 s)",
               (long long)std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
  cr_expect(
      r.Standing().find("last confirmed") != std::string::npos || r.Standing().find("expired") != std::string::npos,
      "%s", r.Standing().c_str());
  // etcd back (it keeps leases across a restart): standing again once a
  // keep-alive answers.
  Run(g_script + " restart " + g_dir + " 0", &rc);
  cr_assert_eq(rc, 0, "etcd did not restart");
  cr_assert(WaitFor([&] { return r.Put("a", "2").has_value(); }, 20000), "%s", r.LastError().c_str());
  cr_assert(WaitFor([&] { return r.Standing().empty(); }, 5000), "%s", r.Standing().c_str());
  // The lease gone (revoked here: as if it expired), and a new one taken
  // by another caller (a name, the replica link): not standing until this
  // node's record is put under it.
  auto old = r.Lease();
  cr_assert(old.has_value());
  Client raw(Opts(eps));
  cr_assert(raw.Revoke(*old).has_value());
  cr_assert(WaitFor([&] { return !r.Standing().empty(); }, 5000), "standing with its lease revoked");
  auto fresh = r.Lease();
  cr_assert(fresh.has_value() && *fresh != *old, "no new lease");
  cr_expect(!r.Standing().empty(), "standing on a new lease with no record under it");
  cr_assert(r.Put("a", "3").has_value(), "%s", r.LastError().c_str());
  const std::string standing = r.Standing();
  cr_expect(standing.empty(), "%s", standing.c_str());
  r.Close(false);
}

// A holder's claims on a dead writer's entries (taken/): put only while
// the writer's record is absent (or as the holder read it); the writer's
// run, back, is told with its first record what was done in its place and
// what a live holder claimed and has not done yet (its drain waits for
// those), not another run's claims, nor those of a holder gone since; a
// holder's outcome, marked later, is told at the next refresh.
Test(etcd_client, a_run_back_is_told_what_its_holders_took) {
  auto eps = Start(1);
  auto opts = [&](const std::string& node, const std::string& run) { return RecordsOpts(eps, node, 5, run); };
  using R = ckpt::fs::EtcdRecords;
  auto clock = [] { return int64_t{1}; };
  R h(opts("h", "00000000000000hh"), clock), h2(opts("h2", "0000000000000022"), clock),
      h3(opts("h3", "0000000000000033"), clock);
  R w(opts("w", "00000000000000aa"), clock);
  cr_assert(h.Open().has_value() && h2.Open().has_value() && h3.Open().has_value());
  cr_assert(h.Put("h", "{}").has_value() && h2.Put("h2", "{}").has_value());  // live; h3 has no record
  // Each claim, then what became of it (a claim is one key: claimed, then marked).
  auto claim = [](R& holder, const std::string& run, const R::Claims& claims) {
    for (const auto& [seq, status] : claims) {
      auto ok = holder.ClaimTaken("w", run, seq, 0);
      if (!ok || !*ok) return false;
      if (status != R::kClaimed && !holder.MarkTaken("w", run, seq, status)) return false;
    }
    return true;
  };
  cr_assert(claim(h, "00000000000000aa", {{3, R::kDone}, {5, R::kClaimed}, {6, R::kGaveUp}}),
            "a claim with the writer's record absent was refused");
  cr_assert(claim(h2, "00000000000000bb", {{4, R::kDone}}));                    // an earlier run of the id: not w's
  cr_assert(claim(h3, "00000000000000aa", {{8, R::kClaimed}, {9, R::kDone}}));  // h3: gone
  R::Taken told;
  int calls = 0;
  w.SetOnTaken([&](const R::Taken& t) {
    told = t;
    calls++;
  });
  cr_assert(w.Open().has_value());
  cr_assert_eq(calls, 0, "told before its first record");
  cr_assert(w.Put("w", "{}").has_value());
  std::sort(told.done.begin(), told.done.end());
  cr_expect(told.done == std::vector<uint64_t>({3, 9}), "told %zu done", told.done.size());
  cr_expect(told.claimed == std::vector<uint64_t>({5}), "told %zu claimed", told.claimed.size());
  auto ok = h.ClaimTaken("w", "00000000000000aa", 7, 0);
  cr_assert(ok.has_value());
  cr_expect(!*ok, "a claim was put after the writer's run was back");
  auto own = h.OwnClaims("w", "00000000000000aa");
  cr_assert(own.has_value());
  cr_expect(*own == R::Claims({{3, R::kDone}, {5, R::kClaimed}, {6, R::kGaveUp}}), "%zu claims read back", own->size());
  cr_assert(h.MarkTaken("w", "00000000000000aa", 5, R::kDone).has_value());
  cr_assert(w.RefreshTaken().has_value());
  std::sort(told.done.begin(), told.done.end());
  cr_expect(told.done == std::vector<uint64_t>({3, 5, 9}) && told.claimed.empty(),
            "after the mark: %zu done, %zu claimed", told.done.size(), told.claimed.size());
  calls = 0;
  cr_assert(w.Put("w", "{}").has_value());
  cr_expect_eq(calls, 0, "told again without a new lease");
  w.Close(true);
  h.Close(true);
  h2.Close(true);
  h3.Close(true);
}

// Two holders, h and h2, standing in etcd (their records put), and w, the
// writer of run kRun, not opened yet.
struct TwoHolders {
  static constexpr char kRun[] = "00000000000000aa";
  explicit TwoHolders(const std::vector<std::string>& endpoints)
      : eps(endpoints),
        h(RecordsOpts(eps, "h", 5, "00000000000000hh"), Clock),
        h2(RecordsOpts(eps, "h2", 5, "000000000000h2h2"), Clock),
        w(RecordsOpts(eps, "w", 5, kRun), Clock) {
    cr_assert(h.Open().has_value());
    cr_assert(h2.Open().has_value());
    cr_assert(h.Put("h", "{}").has_value());
    cr_assert(h2.Put("h2", "{}").has_value());
  }
  static int64_t Clock() { return 1; }
  std::vector<std::string> eps;
  ckpt::fs::EtcdRecords h, h2, w;
};

// A claim is one key of its own (taken/WRITER/RUN/HOLDER/SEQ), its value
// the status alone: claiming or marking one entry rewrites no other (the
// whole list rewritten each time was O(n^2) bytes over a run, and one
// value past etcd's 1.5 MiB request limit near 150,000 entries). The
// writer's run back deletes the claims its drain went past (its record's
// applied_seq): etcd does not grow with every takeover for the job's life.
// A mark on a deleted claim does not put it back; a holder reading its
// claims back gets those left; another run's claims are not the writer's.
// A give-up's names go beside its '!' mark (one transaction, the same
// guard), for the other holders to read: another holder's "+" for the
// same entry says it applied it (it poisons nothing); a mark on a claim
// no longer this holder's puts no names; the writer's prune deletes them
// with the claims (docs/design-holder-give-up.md §1).
Test(etcd_client, a_give_up_names_its_paths_for_the_other_holders) {
  TwoHolders t(Start(1));
  using R = ckpt::fs::EtcdRecords;
  namespace rp = ckpt::fs::replica;
  R &h = t.h, &h2 = t.h2, &w = t.w;
  const std::string run = TwoHolders::kRun;
  for (uint64_t seq : {5, 6, 7}) {
    auto ok = h.ClaimTaken("w", run, seq, 0);
    cr_assert(ok.has_value() && *ok);
  }
  auto ok2 = h2.ClaimTaken("w", run, 6, 0);
  cr_assert(ok2.has_value() && *ok2);
  rp::Poison p;
  p.names = {"d1/f", "latest"};
  p.inos = {42};
  const std::string names = rp::EncodePoison(p);
  cr_assert(h.MarkTaken("w", run, 5, R::kGaveUp, &names).has_value());
  const std::string all = rp::EncodePoison(rp::Poison::All());
  cr_assert(h.MarkTaken("w", run, 6, R::kGaveUp, &all).has_value());
  const std::string applied = rp::kAppliedText;
  cr_assert(h2.MarkTaken("w", run, 6, R::kDone, &applied).has_value());
  rp::GaveUps read;
  int64_t rev = 0;
  auto came = h2.ReadGaveUp("w", run, &read, &rev);
  cr_assert(came.has_value());
  cr_expect_eq(*came, 3u, "%zu keys", *came);
  cr_assert_eq(read.size(), 2u, "%zu seqs given up", read.size());
  cr_expect(read.at(6).size() == 2 && read.at(6).at("h") == all && read.at(6).at("h2") == "+");
  const rp::PoisonView v = rp::PoisonFromHolders(read);
  cr_assert_eq(v.by_seq.size(), 1u, "6 was applied by h2: it poisons nothing");
  const rp::Poison& got = v.by_seq.at(5);
  cr_expect(!got.all && got.names == p.names && got.inos == p.inos);
  // The claim is still a claim as the holder reads it back.
  auto own = h.OwnClaims("w", run);
  cr_assert(own.has_value());
  cr_expect_eq(own->at(5), R::kGaveUp);
  // A mark on a claim that is not this run's any more (revoked, pruned,
  // never made) puts no names.
  cr_assert(h.MarkTaken("w", run, 9, R::kGaveUp, &names).has_value());
  // Read since the last revision: only what was put since (nothing).
  came = h2.ReadGaveUp("w", run, &read, &rev);
  cr_assert(came.has_value());
  cr_expect_eq(*came, 0u, "a read since the last one brought %zu keys", *came);
  cr_expect(!read.count(9), "names put without a claim");
  // A give-up put since comes alone.
  auto ok7 = h2.ClaimTaken("w", run, 7, 0);
  cr_assert(ok7.has_value() && *ok7);
  cr_assert(h2.MarkTaken("w", run, 7, R::kGaveUp, &all).has_value());
  came = h2.ReadGaveUp("w", run, &read, &rev);
  cr_assert(came.has_value());
  cr_expect_eq(*came, 1u);
  cr_expect(read.count(7) == 1 && read.size() == 3);
  // The writer's drain past 6: the names of 5 and 6 go with the claims.
  cr_assert(w.Open().has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":2})").has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":6})").has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":7})").has_value());
  read.clear();
  rev = 0;
  came = h2.ReadGaveUp("w", run, &read, &rev);
  cr_assert(came.has_value());
  cr_expect(read.empty(), "%zu seqs' names left after the drain went past them", read.size());
  h.Close(true);
  h2.Close(true);
  w.Close(true);
}

// Done wins whichever mark lands first (K > 1): a done mark also says so
// by seq (applied/), where a holder about to give a later entry up for
// another holder's give-up of this one asks (AppliedBy); not among the
// give-ups, which every holder reads at every entry (before, a done mark
// put "+" only if its holder had read the other's give-up first: marked
// first, it left the give-up's names to poison every later entry on them
// at every holder). The writer's prune deletes them with the claims, and
// a give-up gone so is applied too (before, a holder that had read the
// give-up and asked after the prune gave a later entry up for nothing).
Test(etcd_client, a_done_mark_wins_over_a_give_up_marked_after_it) {
  TwoHolders t(Start(1));
  using R = ckpt::fs::EtcdRecords;
  using A = R::Applied;
  namespace rp = ckpt::fs::replica;
  R &h = t.h, &h2 = t.h2, &w = t.w;
  const std::string run = TwoHolders::kRun;
  for (R* x : {&h, &h2}) {
    auto ok = x->ClaimTaken("w", run, 8, 0);
    cr_assert(ok.has_value() && *ok);
  }
  auto nine = h.ClaimTaken("w", run, 9, 0);
  cr_assert(nine.has_value() && *nine);
  auto asked = [&](uint64_t seq) {
    auto a = h.AppliedBy("w", run, seq);
    cr_assert(a.has_value(), "AppliedBy(%llu) failed", (unsigned long long)seq);
    return *a;
  };
  rp::Poison p;
  p.names = {"latest"};
  const std::string names = rp::EncodePoison(p);
  cr_assert(h2.MarkTaken("w", run, 8, R::kDone).has_value());
  cr_assert(h.MarkTaken("w", run, 8, R::kGaveUp, &names).has_value());
  cr_assert(h.MarkTaken("w", run, 9, R::kGaveUp, &names).has_value());
  cr_expect(asked(8) == A::kByHolder, "h2's done mark of 8 is not found by seq");
  cr_expect(asked(9) == A::kNo, "9, given up by h alone, reads as applied");
  // Nothing of 80 (a seq sharing 8's digits) is there: etcd cannot tell
  // pruned from never marked; the holder counts it applied only for a
  // give-up it read there (Takeover::Act).
  cr_expect(asked(80) == A::kPruned, "80 reads as given up or applied");
  // The give-ups every holder reads at every entry stay give-ups only.
  rp::GaveUps read;
  int64_t rev = 0;
  cr_assert(h.ReadGaveUp("w", run, &read, &rev).has_value());
  cr_expect(read.size() == 2 && read.at(8).size() == 1 && read.at(8).count("h"));
  auto own = h2.OwnClaims("w", run);
  cr_assert(own.has_value());
  cr_expect_eq(own->at(8), R::kDone);
  // The writer's drain past 9: the done mark by seq goes with the claims,
  // and so do the give-ups, so both read as applied (by the writer).
  cr_assert(w.Open().has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":2})").has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":9})").has_value());
  cr_expect(asked(8) == A::kPruned, "8's marks outlived the claims");
  cr_expect(asked(9) == A::kPruned,
            "9's give-up outlived the writer's prune: a later entry on it is given up for nothing");
  Client raw(Opts(t.eps));
  auto left = raw.Range("/ckptfs/job/applied/", PrefixEnd("/ckptfs/job/applied/"));
  cr_assert(left.has_value());
  cr_expect(left->kvs.empty(), "the done mark by seq outlived the claims");
  h.Close(true);
  h2.Close(true);
  w.Close(true);
}

Test(etcd_client, claims_are_a_key_each_and_the_run_back_deletes_those_it_went_past) {
  auto eps = Start(1);
  auto opts = [&](const std::string& node, const std::string& run) { return RecordsOpts(eps, node, 5, run); };
  using R = ckpt::fs::EtcdRecords;
  auto clock = [] { return int64_t{1}; };
  R h(opts("h", "00000000000000hh"), clock), w(opts("w", "00000000000000aa"), clock);
  cr_assert(h.Open().has_value());
  cr_assert(h.Put("h", "{}").has_value());
  Client raw(Opts(eps));
  const std::string dir = "/ckptfs/job/taken/w/";
  auto keys = [&] {
    auto r = raw.Range(dir, PrefixEnd(dir));
    cr_assert(r.has_value());
    return r->kvs;
  };
  // Claimed one at a time, as a holder does, each outcome marked after.
  for (uint64_t seq : {3, 4, 8}) {
    auto ok = h.ClaimTaken("w", "00000000000000aa", seq, 0);
    cr_assert(ok.has_value() && *ok, "claim of %llu refused", (unsigned long long)seq);
  }
  auto first = keys();
  cr_assert(h.MarkTaken("w", "00000000000000aa", 3, R::kDone).has_value());
  cr_assert(h.MarkTaken("w", "00000000000000aa", 4, R::kGaveUp).has_value());
  auto ok = h.ClaimTaken("w", "00000000000000bb", 2, 0);  // an earlier run of the id
  cr_assert(ok.has_value() && *ok);
  auto all = keys();
  cr_assert_eq(all.size(), 4u, "%zu keys for 4 claims", all.size());
  const std::string run = dir + "00000000000000aa/h/";
  cr_expect(all[0].key == run + "00000000000000000003", "%s", all[0].key.c_str());
  cr_expect(all[1].key == run + "00000000000000000004", "%s", all[1].key.c_str());
  cr_expect(all[2].key == run + "00000000000000000008", "%s", all[2].key.c_str());
  cr_expect(all[3].key == dir + "00000000000000bb/h/00000000000000000002", "%s", all[3].key.c_str());
  // The status, then the holder's run (whose claim it is: another run of
  // the holder's id is not it).
  cr_expect(all[0].value == "+00000000000000hh" && all[1].value == "!00000000000000hh" &&
                all[2].value == " 00000000000000hh" && all[3].value == " 00000000000000hh",
            "values '%s' '%s' '%s' '%s'", all[0].value.c_str(), all[1].value.c_str(), all[2].value.c_str(),
            all[3].value.c_str());
  // The claim of 8 and the marks of 3 and 4 left the others as they were.
  cr_assert_eq(first.size(), 3u, "%zu keys after 3 claims", first.size());
  cr_expect_eq(all[2].mod_revision, first[2].mod_revision, "claim 8 rewritten by the marks");
  cr_expect_eq(all[0].version, 2, "claim 3 written %lld times (claimed, marked)", (long long)all[0].version);
  // The writer's run back: told, then its drain past 4 (applied_seq 5): 3
  // and 4 are deleted, 8 (claimed, not done: the drain waits there) stays,
  // and so does the other run's.
  R::Taken told;
  w.SetOnTaken([&](const R::Taken& t) { told = t; });
  cr_assert(w.Open().has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":2})").has_value());
  cr_expect(told.done == std::vector<uint64_t>({3}) && told.claimed == std::vector<uint64_t>({8}));
  cr_expect_eq(keys().size(), 4u, "claims above applied_seq deleted");
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":5})").has_value());
  all = keys();
  cr_assert_eq(all.size(), 2u, "%zu keys left after the drain went past 3 and 4", all.size());
  cr_expect(all[0].key == run + "00000000000000000008", "%s", all[0].key.c_str());
  cr_expect(all[1].key == dir + "00000000000000bb/h/00000000000000000002", "%s", all[1].key.c_str());
  // A mark that comes after the deletion does not put the claim back.
  cr_assert(h.MarkTaken("w", "00000000000000aa", 3, R::kDone).has_value());
  cr_expect_eq(keys().size(), 2u, "a mark put a deleted claim back");
  auto own = h.OwnClaims("w", "00000000000000aa");
  cr_assert(own.has_value());
  cr_expect(*own == R::Claims({{8, R::kClaimed}}), "%zu claims read back", own->size());
  // Marked done, then passed: none of this run's is left.
  cr_assert(h.MarkTaken("w", "00000000000000aa", 8, R::kDone).has_value());
  cr_assert(w.RefreshTaken().has_value());
  cr_assert(w.Put("w", R"({"incarnation":"00000000000000aa","applied_seq":9})").has_value());
  all = keys();
  cr_assert_eq(all.size(), 1u, "%zu keys left", all.size());
  cr_expect(all[0].key == dir + "00000000000000bb/h/00000000000000000002", "%s", all[0].key.c_str());
  w.Close(true);
  h.Close(true);
}

// A holder whose run is gone — its record expired (its lease lapsed: etcd
// cut off, or its restart longer than the TTL) — while the writer's run
// back waits at its claim: the writer revokes the claim (kRevoked) and only
// then applies the entry itself; a holder whose record is back first keeps
// it (the revocation is guarded on the record's absence, as of the read).
// The holder, standing again (Standings moves), reads kRevoked back, and
// its mark does not turn it into a done entry. Without the revocation both
// applied it (a `latest.tmp` renamed over `latest` twice).
Test(etcd_client, a_gone_holders_claim_is_revoked_before_the_writer_applies_it, .timeout = 90) {
  auto eps = Start(1);
  auto opts = [&](const std::string& node, const std::string& run) { return RecordsOpts(eps, node, 5, run); };
  using R = ckpt::fs::EtcdRecords;
  auto clock = [] { return int64_t{1}; };
  const std::string run = "00000000000000aa", hrec = R"({"incarnation":"00000000000000hh"})";
  R h(opts("h", "00000000000000hh"), clock), w(opts("w", run), clock);
  cr_assert(h.Open().has_value());
  cr_assert(h.Put("h", hrec).has_value());
  for (uint64_t seq : {5, 6}) {
    auto ok = h.ClaimTaken("w", run, seq, 0);
    cr_assert(ok.has_value() && *ok);
  }
  R::Taken told;
  w.SetOnTaken([&](const R::Taken& t) { told = t; });
  cr_assert(w.Open().has_value());
  cr_assert(w.Put("w", "{}").has_value());
  cr_expect(told.claimed == std::vector<uint64_t>({5, 6}), "a live holder's claims are waited for");
  Client raw(Opts(eps));
  const std::string key5 = "/ckptfs/job/taken/w/" + run + "/h/00000000000000000005";
  auto value = [&](const std::string& key) {
    auto r = raw.Range(key);
    cr_assert(r.has_value());
    return r->kvs.empty() ? std::string("(none)") : r->kvs[0].value;
  };
  // A revocation guarded on the holder's record being absent is refused while it is there.
  auto g = raw.PutIfRevisions(key5, "x", {{"/ckptfs/job/members/h", 0}});
  cr_assert(g.has_value());
  cr_expect(!g->succeeded && value(key5) == " 00000000000000hh", "revoked while the holder's record is there");
  cr_assert(h.MarkTaken("w", run, 6, R::kDone).has_value());
  // The holder's lease lapses (revoked here: its record goes, as at expiry);
  // it stands again before the writer looked: its claim is still its own.
  auto lapse = [&] {
    auto lease = h.Lease();
    cr_assert(lease.has_value());
    cr_assert(raw.Revoke(*lease).has_value());
  };
  const uint64_t stood = h.Standings();
  lapse();
  cr_assert(WaitFor([&] { return h.Put("h", hrec).has_value(); }, 10000), "the holder did not stand again");
  cr_expect_gt(h.Standings(), stood, "standing again under a new lease is not told");
  cr_assert(w.RefreshTaken().has_value());
  cr_expect(told.claimed == std::vector<uint64_t>({5}) && told.done == std::vector<uint64_t>({6}),
            "a holder back before the writer looked lost its claim");
  cr_expect_eq(value(key5), " 00000000000000hh");
  // It lapses again and the writer looks first: revoked, the writer's to apply.
  lapse();
  cr_assert(w.RefreshTaken().has_value());
  cr_expect(told.claimed.empty() && told.done == std::vector<uint64_t>({6}), "%zu claimed after the holder went",
            told.claimed.size());
  cr_expect_eq(value(key5), "x00000000000000hh", "not revoked: '%s'", value(key5).c_str());
  cr_assert(WaitFor([&] { return h.Put("h", hrec).has_value(); }, 10000));
  cr_assert(h.MarkTaken("w", run, 5, R::kDone).has_value());
  cr_expect_eq(value(key5), "x00000000000000hh", "a holder's late mark turned a revoked claim into a done one");
  auto own = h.OwnClaims("w", run);
  cr_assert(own.has_value());
  cr_expect(*own == R::Claims({{5, R::kRevoked}, {6, R::kDone}}), "%zu claims read back", own->size());
  auto all = h.AllOwnClaims();
  cr_assert(all.has_value());
  cr_expect(all->size() == 1 && all->begin()->first == std::make_pair(std::string("w"), run) &&
            all->begin()->second == *own);
  w.Close(true);
  h.Close(true);
}

// A claim by a run of the holder's id that is not the one whose record is
// there (a new machine mounted under the id, or its state dir lost): that
// run is gone, its claim revoked and the entry the writer's again, the
// record notwithstanding. The new run does not read it as its own.
Test(etcd_client, a_claim_of_another_run_of_the_holder_counts_as_gone) {
  auto eps = Start(1);
  auto opts = [&](const std::string& node, const std::string& run) { return RecordsOpts(eps, node, 5, run); };
  using R = ckpt::fs::EtcdRecords;
  auto clock = [] { return int64_t{1}; };
  const std::string run = "00000000000000aa";
  R old_h(opts("h", "00000000000000hh"), clock), new_h(opts("h", "0000000000000011"), clock), w(opts("w", run), clock);
  cr_assert(old_h.Open().has_value() && new_h.Open().has_value());
  auto ok = old_h.ClaimTaken("w", run, 3, 0);
  cr_assert(ok.has_value() && *ok);
  cr_assert(new_h.Put("h", R"({"incarnation":"0000000000000011"})").has_value());
  R::Taken told;
  w.SetOnTaken([&](const R::Taken& t) { told = t; });
  cr_assert(w.Open().has_value());
  cr_assert(w.Put("w", "{}").has_value());
  cr_expect(told.claimed.empty(), "the drain waits for a claim of a run that is gone");
  Client raw(Opts(eps));
  auto r = raw.Range("/ckptfs/job/taken/w/" + run + "/h/00000000000000000003");
  cr_assert(r.has_value() && r->kvs.size() == 1);
  cr_expect_eq(r->kvs[0].value, "x00000000000000hh");
  R::OthersClaims others;
  auto all = new_h.AllOwnClaims(&others);
  cr_assert(all.has_value());
  cr_expect(all->empty(), "another run's claims read back as this run's");
  cr_expect(others == R::OthersClaims({{{"w", run}, {.last = 3}}}), "another run of the id is another holder");
  w.Close(true);
  old_h.Close(true);
  new_h.Close(true);
}

// What a holder reads back names, beside its own claims, the last entry of
// each run another holder claimed, and which they marked done: a holder
// back whose claim another went past (its lease ran out meanwhile) must not
// publish it again, and one another holder of it did is done
// (Takeover::PassedOver). Whatever became of their claims, and of runs
// this holder claimed nothing of.
Test(etcd_client, a_holder_reads_how_far_the_others_claimed) {
  auto eps = Start(1);
  using R = ckpt::fs::EtcdRecords;
  auto clock = [] { return int64_t{1}; };
  const std::string run = "00000000000000aa", run2 = "00000000000000bb";
  R h(RecordsOpts(eps, "h", 5, "00000000000000hh"), clock), g(RecordsOpts(eps, "g", 5, "00000000000000gg"), clock);
  cr_assert(h.Open().has_value() && g.Open().has_value());
  for (auto [who, writer_run, seq] :
       {std::tuple{&h, run, 4}, {&g, run, 5}, {&g, run, 7}, {&h, run, 9}, {&g, run2, 2}}) {
    auto ok = who->ClaimTaken("w", writer_run, seq, 0);
    cr_assert(ok.has_value() && *ok);
  }
  cr_assert(g.MarkTaken("w", run, 7, R::kDone).has_value());
  cr_assert(g.MarkTaken("w", run, 5, R::kGaveUp).has_value());
  R::OthersClaims others;
  auto all = h.AllOwnClaims(&others);
  cr_assert(all.has_value());
  cr_expect(all->size() == 1 && all->begin()->second == R::Claims({{4, R::kClaimed}, {9, R::kClaimed}}));
  cr_expect(others == R::OthersClaims({{{"w", run}, {.last = 7, .done = {7}}}, {{"w", run2}, {.last = 2}}}), "%zu runs",
            others.size());
  h.Close(true);
  g.Close(true);
}

// A holder back (restarted on its state dir) reads its claims back and
// reconciles them with the replicas it holds before it publishes anything:
// one published whose mark never landed is marked done; one with nothing
// behind it (its tmpfs lost) given up, so the writer's drain, waiting
// there, applies it itself; a revoked one's replica, unpublished, is
// dropped, never published. Without it the writer waited for ever (the
// claims stayed claimed) or the holder published the revoked entry again.
Test(etcd_client, a_holder_back_reconciles_its_claims_with_its_replicas) {
  using ckpt::fs::replica::Held;
  using ckpt::fs::replica::Store;
  auto eps = Start(1);
  ckpt::fs::EtcdRecordsOptions o = RecordsOpts(eps, "h", 5);
  o.incarnation = "00000000000000hh";
  using R = ckpt::fs::EtcdRecords;
  R h(o, [] { return int64_t{1}; });
  cr_assert(h.Open().has_value());
  cr_assert(h.Put("h", R"({"incarnation":"00000000000000hh"})").has_value());
  const std::string run = "00000000000000aa";
  for (uint64_t seq : {4, 5, 6}) {
    auto ok = h.ClaimTaken("w", run, seq, 0);
    cr_assert(ok.has_value() && *ok);
  }
  Client raw(Opts(eps));
  cr_assert(raw.Put("/ckptfs/job/taken/w/" + run + "/h/00000000000000000004", "x00000000000000hh").has_value());
  char tmpl[] = "/tmp/ckpt-takeover-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  auto st = Store::Open(std::string(tmpl) + "/r", 1 << 20);
  cr_assert(st.has_value());
  auto put = [&](uint64_t ino, uint64_t seq) {
    const std::string data = "bytes";
    auto sum = ckpt::backend::ContentChecksum(data.data(), data.size());
    Held hd{.key = {.writer = "w", .ino = ino, .version = 1},
            .size = data.size(),
            .gate_us = 100 + seq,
            .hash_hi = sum.first,
            .hash_lo = sum.second,
            .meta = ckpt::fs::replica::EncodeMeta({.seq = seq, .incarnation = run, .path = "f" + std::to_string(seq)})};
    auto in = (*st)->Begin(hd);
    cr_assert(in.has_value());
    cr_assert_eq((*in)->Write(0, data.data(), data.size()), 0);
    cr_assert((*st)->Commit(std::move(*in)).has_value());
  };
  put(14, 4);  // revoked
  put(15, 5);  // published, its mark lost
  cr_assert((*st)->Retire({.writer = "w", .ino = 15, .version = 1}));
  // (6: nothing)
  ckpt::fs::replica::Takeover t("h", st->get(), nullptr, &h, nullptr, nullptr);
  t.Start();
  R::Claims got;
  const bool ok = WaitFor(
      [&] {
        auto own = h.OwnClaims("w", run);
        if (own) got = *own;
        return got == R::Claims({{4, R::kRevoked}, {5, R::kDone}, {6, R::kGaveUp}});
      },
      10000);
  t.Stop();
  cr_expect(ok, "claims after the holder's start: 4 '%c' 5 '%c' 6 '%c'", got.count(4) ? got[4] : '?',
            got.count(5) ? got[5] : '?', got.count(6) ? got[6] : '?');
  std::set<uint64_t> inos;
  for (const Held& x : (*st)->List()) inos.insert(x.key.ino);
  cr_expect(!inos.count(14), "a revoked claim's replica is still held");
  cr_expect(inos.count(15), "the published replica was dropped");
  cr_expect_eq(t.stats().published, 0u);
  h.Close(true);
  std::filesystem::remove_all(tmpl);
}

// A claim whose reply was lost (the put landed, the holder never heard):
// its retry, refused once the writer's record is back, reads the key back
// and finds this run's claim there: the holder goes on to publish and mark
// it. Without, it never did, and the writer's drain waited for ever.
Test(etcd_client, a_claim_whose_reply_was_lost_is_read_back) {
  auto eps = Start(1);
  ckpt::fs::EtcdRecordsOptions o = RecordsOpts(eps, "h", 5);
  o.incarnation = "00000000000000hh";
  using R = ckpt::fs::EtcdRecords;
  R h(o, [] { return int64_t{1}; });
  cr_assert(h.Open().has_value());
  const std::string run = "00000000000000aa", dir = "/ckptfs/job/taken/w/" + run + "/";
  Client raw(Opts(eps));
  // The first try's put, as it landed; then the writer is back.
  cr_assert(raw.Put(dir + "h/00000000000000000005", " 00000000000000hh").has_value());
  cr_assert(raw.Put("/ckptfs/job/members/w", "{}").has_value());
  auto ok = h.ClaimTaken("w", run, 5, 0);
  cr_assert(ok.has_value());
  cr_expect(*ok, "this run's claim, there already, was not taken for one");
  // Another run's claim there, or a revoked one, is not this run's.
  cr_assert(raw.Put(dir + "h/00000000000000000006", " 0000000000000011").has_value());
  cr_assert(raw.Put(dir + "h/00000000000000000007", "x00000000000000hh").has_value());
  for (uint64_t seq : {6, 7}) {
    ok = h.ClaimTaken("w", run, seq, 0);
    cr_assert(ok.has_value());
    cr_expect(!*ok, "claim %llu taken for this run's", (unsigned long long)seq);
  }
  h.Close(true);
}
