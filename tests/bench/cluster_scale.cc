// cluster_scale.cc — many --cluster members on one machine, against a real
// S3 server (docs/scale.md): what the protocol's records cost as the
// cluster grows.
//
//   build/cluster_scale --endpoint http://127.0.0.1:PORT [--bucket ckptfs-test]
//                       [--members 4,16,64] [--seconds 10] [--heartbeat-ms 500]
//   build/cluster_scale --posix DIR ...      (records in a directory instead)
//   build/cluster_scale --etcd HOST:PORT[,...] [--etcd-dir DIR] [--members 100,1000]
//                       [--seconds 60] [--period-ms 10000]
//                       [--sample-ms 20] [--tick-ms 100] [--lease-s 10]
//                       [--stage-ms 500]  (a shard's transfer: 100 ms to this; 0: none,
//                                          to time the publication chain alone)
//                       (a member's timers: slower ones let 1,000 members
//                        share 2 cores; a real node runs one member)
//                       (--cluster-store etcd: the checkpoint workload below;
//                        --etcd-dir: tests/etcd/etcd.sh's DIR, for etcd's CPU)
//   ... --posix DIR --checkpoints   (the checkpoint workload over the backend's records)
//
// Each member is a real fs::Cluster (its sampler and heartbeat threads,
// its records through the S3 backend's PutRecord/ListRecords) over a fake
// drain log that logs an entry every 200 ms and applies it 100 ms later,
// so every record has something pending and the gate is exercised. Per
// member count it prints: the record writes and reads per second (one
// ListRecords is a LIST plus a GET per member on S3), the heartbeats
// achieved against the target, the time one heartbeat's writes and reads
// took (median and max), and how stale each member's view of the others
// was at the end (the oldest record age any member saw).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/s3_backend.h"
#include "common/mutex.h"
#include "fs/cluster/cluster.h"
#include "fs/cluster/etcd_records.h"

using namespace ckpt;

namespace {

int64_t NowMs() { return fs::Cluster::WallClockUs() / 1000; }

class FakeLog final : public fs::LogView {
 public:
  FakeLog() : start_(NowMs()) {}
  uint64_t LoggedSeq() override { return static_cast<uint64_t>((NowMs() - start_) / 200) + 1; }
  uint64_t AppliedSeq() override {
    int64_t t = NowMs() - start_ - 100;
    return t < 0 ? 0 : static_cast<uint64_t>(t / 200);
  }
  uint64_t DurableAppliedSeq() override { return AppliedSeq(); }  // nothing behind it to sync
  std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) override {
    uint64_t n = LoggedSeq() - AppliedSeq();
    std::vector<std::string> paths;
    for (uint64_t i = 0; i < n && i < max; i++) paths.push_back("global_step" + std::to_string(AppliedSeq() + i + 1) + "/shard");
    return {n, paths};
  }

 private:
  const int64_t start_;
};

// Counts what a member asks of the store, and how long it takes.
class CountingStore final : public fs::RecordStore {
 public:
  explicit CountingStore(std::unique_ptr<fs::RecordStore> inner) : inner_(std::move(inner)) {}
  Status Put(const std::string& node, const std::string& bytes) override {
    auto t0 = std::chrono::steady_clock::now();
    auto st = inner_->Put(node, bytes);
    Note(t0, st.has_value(), 1, 0);
    return st;
  }
  Result<std::vector<std::pair<std::string, std::string>>> List() override {
    auto t0 = std::chrono::steady_clock::now();
    auto r = inner_->List();
    Note(t0, r.has_value(), 0, r ? r->size() : 0);
    return r;
  }
  std::atomic<uint64_t> puts{0}, lists{0}, records{0}, errors{0};
  Mutex mu;
  std::vector<double> ms GUARDED_BY(mu);

 private:
  void Note(std::chrono::steady_clock::time_point t0, bool ok, int put, size_t recs) {
    double d = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (put) puts++;
    else lists++, records += recs;
    if (!ok) errors++;
    MutexLock lk(&mu);
    ms.push_back(d);
  }
  std::unique_ptr<fs::RecordStore> inner_;
};

// The checkpoint workload: every period each member logs one shard, which
// its drain may apply `drain_ms` later; 50 ms after the last shard is
// closed (the barrier) member 0 logs `latest`. A driver applies each
// member's head entry once it is ready and the cluster lets it
// (MayPublish), as the drainer does.
class CkptLog final : public fs::LogView {
 public:
  uint64_t Log(int64_t ready_ms) {
    MutexLock lk(&mu_);
    ready_.push_back(ready_ms);
    logged_.push_back(fs::Cluster::WallClockUs());
    return ready_.size();
  }
  uint64_t Head(int64_t now_ms) {
    MutexLock lk(&mu_);
    return applied_ < ready_.size() && ready_[applied_] <= now_ms ? applied_ + 1 : 0;
  }
  void Apply() {
    MutexLock lk(&mu_);
    applied_++;
  }
  uint64_t LoggedSeq() override {
    MutexLock lk(&mu_);
    return ready_.size();
  }
  uint64_t AppliedSeq() override {
    MutexLock lk(&mu_);
    return applied_;
  }
  uint64_t DurableAppliedSeq() override { return AppliedSeq(); }  // nothing behind it to sync
  std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) override {
    MutexLock lk(&mu_);
    std::vector<std::string> paths;
    for (uint64_t i = applied_; i < ready_.size() && paths.size() < max; i++)
      paths.push_back("step/shard" + std::to_string(i));
    return {ready_.size() - applied_, paths};
  }
  std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) override {
    MutexLock lk(&mu_);
    std::vector<std::pair<uint64_t, int64_t>> out;
    for (uint64_t s = std::max<uint64_t>(from, applied_ + 1); s <= to && s <= logged_.size(); s++)
      out.emplace_back(s, logged_[s - 1]);
    return out;
  }

 private:
  Mutex mu_;
  std::vector<int64_t> ready_ GUARDED_BY(mu_), logged_ GUARDED_BY(mu_);
  uint64_t applied_ GUARDED_BY(mu_) = 0;
};

// etcd's CPU seconds (its members' utime + stime) and database size.
double EtcdCpuSeconds(const std::string& dir) {
  double total = 0;
  for (int i = 0; i < 16; i++) {
    std::ifstream pf(dir + "/m" + std::to_string(i) + ".pid");
    long pid = 0;
    if (!(pf >> pid)) break;
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(st, line);
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string f;
    std::vector<std::string> fields;
    while (rest >> f) fields.push_back(f);
    if (fields.size() > 13) total += (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
  }
  return total;
}

double EtcdDbMiB(const std::string& endpoint) {
  std::string cmd = "curl -sf -m 5 " + endpoint + "/metrics | awk '/^etcd_mvcc_db_total_size_in_bytes / {print $2}'";
  FILE* f = popen(cmd.c_str(), "r");
  double v = 0;
  if (f) {
    if (fscanf(f, "%lf", &v) != 1) v = 0;
    pclose(f);
  }
  return v / (1 << 20);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The checkpoint workload with M members over etcd (`etcd`: endpoints) or
// the backend's records (`be`).
// What one simulated member is (its timers; each real node runs one member
// with the defaults, a thousand on two cores need slower ones).
struct MemberKnobs {
  int sample_ms = 20, tick_ms = 100, lease_s = 10;
  int stage_ms = 500;  // a shard is staged (may be published) 100 ms to this after its close; 0: at once
};

void RunCheckpoints(int m, int seconds, int period_ms, const std::string& etcd, const std::string& etcd_dir,
                    backend::Backend* be, const MemberKnobs& knobs) {
  const std::string name = "ckpt-" + std::to_string(m) + "-" + std::to_string(NowMs());
  std::vector<std::unique_ptr<CkptLog>> logs;
  std::vector<std::unique_ptr<fs::RecordStore>> stores;
  std::vector<fs::EtcdRecords*> etcds;
  std::vector<std::unique_ptr<fs::Cluster>> nodes;
  // A member's view changed (Cluster::SetOnChange): its drain asks again
  // now; else every 50 ms, as the daemon's drain polls.
  std::unique_ptr<std::atomic<bool>[]> changed(new std::atomic<bool>[m]());
  for (int i = 0; i < m; i++) {
    logs.push_back(std::make_unique<CkptLog>());
    fs::ClusterOptions o;
    o.name = name;
    o.node = "node" + std::to_string(i);
    o.sample_ms = knobs.sample_ms;
    o.tick_ms = knobs.tick_ms;
    o.member_timeout_ms = knobs.lease_s * 1000LL;
    if (!etcd.empty()) {
      fs::EtcdRecordsOptions eo;
      eo.client.endpoints = *fs::etcd::ParseStoreUrl("etcd://" + etcd);
      eo.url = "etcd://" + etcd;
      eo.cluster = name;
      eo.node = o.node;
      eo.lease_ttl_s = knobs.lease_s;
      eo.tick_ms = knobs.tick_ms;
      auto st = std::make_unique<fs::EtcdRecords>(eo, fs::Cluster::WallClockUs);
      etcds.push_back(st.get());
      stores.push_back(std::move(st));
    } else {
      stores.push_back(fs::BackendRecords(be, name));
      o.tick_ms = 25;
    }
    nodes.push_back(std::make_unique<fs::Cluster>(o, stores.back().get(), logs.back().get(), ""));
    nodes.back()->SetOnChange([&changed, i] { changed[i] = true; });
    if (!etcds.empty()) {
      fs::Cluster* c = nodes.back().get();
      etcds.back()->SetReducer([c](const auto& recs, int64_t as_of) { return c->Reduce(recs, as_of); });
      etcds.back()->SetOnDigest([c] { c->Poke(); });
      if (!etcds.back()->Open()) std::fprintf(stderr, "member %d: %s\n", i, etcds.back()->LastError().c_str());
    }
    nodes.back()->Init();
    (void)nodes.back()->Join();
  }
  const double cpu0 = etcd_dir.empty() ? 0 : EtcdCpuSeconds(etcd_dir);
  for (auto& n : nodes) n->Start();
  // The driver: logs each checkpoint, applies what the cluster lets pass.
  std::atomic<bool> stop{false};
  Mutex mu;
  std::vector<int64_t> shard_done(m, 0);  // this checkpoint's shard applied, ms (0: not yet)
  std::vector<double> latency;            // last shard applied -> latest applied, ms
  std::vector<double> chain;              // checkpoint logged -> its last shard applied, ms
  int64_t logged_at = 0;                  // when this checkpoint's shards were logged, ms
  int out_of_order = 0, ckpts = 0;
  std::vector<uint64_t> latest_seq;  // member 0's `latest` entries
  std::thread applier([&] {
    int64_t next_poll = 0;
    while (!stop) {
      const int64_t now = NowMs();
      const bool poll = now >= next_poll;
      if (poll) next_poll = now + 50;
      for (int i = 0; i < m; i++) {
        if (!changed[i].exchange(false) && !poll) continue;
        for (uint64_t seq; (seq = logs[i]->Head(now)) != 0 && nodes[i]->MayPublish(seq);) {
          logs[i]->Apply();
          nodes[i]->Poke();  // as the drain does after an entry
          MutexLock lk(&mu);
          if (i == 0 && std::find(latest_seq.begin(), latest_seq.end(), seq) != latest_seq.end()) {
            const int64_t last = *std::max_element(shard_done.begin(), shard_done.end());
            if (std::find(shard_done.begin(), shard_done.end(), 0) != shard_done.end()) out_of_order++;
            else {
              latency.push_back(static_cast<double>(now - last));
              chain.push_back(static_cast<double>(last - logged_at));
              std::fprintf(stderr, "cluster_scale: %d members: checkpoint %zu: shards published in %lld ms, latest %lld ms after the last\n",
                           m, chain.size(), static_cast<long long>(last - logged_at), static_cast<long long>(now - last));
            }
            std::fill(shard_done.begin(), shard_done.end(), 0);
          } else {
            shard_done[i] = now;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::mt19937 rng(static_cast<unsigned>(m));
  const int64_t start = NowMs();
  for (int k = 0;; k++) {
    const int64_t t = start + 2000 + static_cast<int64_t>(k) * period_ms;
    if (t + period_ms > start + seconds * 1000LL) break;
    while (NowMs() < t) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    {
      MutexLock lk(&mu);
      logged_at = NowMs();
    }
    for (int i = 0; i < m; i++)
      logs[i]->Log(NowMs() + (knobs.stage_ms <= 100 ? knobs.stage_ms
                                                    : 100 + static_cast<int64_t>(rng() % (knobs.stage_ms - 100))));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the barrier
    uint64_t seq = logs[0]->Log(NowMs() + 5);
    {
      MutexLock lk(&mu);
      latest_seq.push_back(seq);
    }
    ckpts++;
  }
  // The last checkpoint's `latest` reaches the backend, or 30 s pass.
  for (int i = 0; i < 3000 && logs[0]->AppliedSeq() < logs[0]->LoggedSeq(); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double elapsed = static_cast<double>(NowMs() - start) / 1000.0;
  stop = true;
  applier.join();
  auto st0 = nodes[0]->Status();
  uint64_t live = st0.members_total;
  if (st0.waiting) {
    // Still publishing when the run ended: which members hold their
    // shards back (the chain of gates, docs/scale.md), and what member 0's
    // `latest` waits for.
    std::string who;
    for (const auto& w : st0.waiting_for) who += " " + w;
    int behind = 0;
    for (int k = 0; k < m; k++)
      if (logs[k]->AppliedSeq() < logs[k]->LoggedSeq()) behind++;
    std::fprintf(stderr,
                 "cluster_scale: %d members: member 0's drain still waits (entry %llu) for:%s; %d of %d members "
                 "have entries not yet published\n",
                 m, static_cast<unsigned long long>(st0.wait_seq), who.c_str(), behind, m);
  }
  size_t blocked = 0;
  for (auto& n : nodes)
    if (!n->Status().publish_blocked_reason.empty()) blocked++;
  for (auto& n : nodes) n->Stop();
  const double cpu = etcd_dir.empty() ? 0 : EtcdCpuSeconds(etcd_dir) - cpu0;
  fs::EtcdRecordsStats sum;
  for (auto* e : etcds) {
    auto s = e->Stats();
    sum.puts += s.puts, sum.ranges += s.ranges, sum.txns += s.txns, sum.keepalives += s.keepalives;
    sum.grants += s.grants, sum.digests_seen += s.digests_seen, sum.reductions += s.reductions;
    sum.summaries += s.summaries, sum.turns += s.turns, sum.deltas += s.deltas, sum.handoffs += s.handoffs;
  }
  // Closed in parallel after the printing: a watch stops within curl's
  // progress period (about 1 s), two watches a member.
  auto close_all = [&etcds] {
    std::vector<std::thread> closers;
    std::atomic<size_t> next{0};
    for (int t = 0; t < 64; t++)
      closers.emplace_back([&] {
        for (size_t k; (k = next++) < etcds.size();) etcds[k]->Close(true);
      });
    for (auto& t : closers) t.join();
  };
  MutexLock lk(&mu);
  const double per = static_cast<double>(std::max(ckpts, 1)) * m;
  std::printf(
      "%8d %6s %6d %9zu %10.0f %10.0f %10.0f %11.0f %9.2f %9.2f %8.1f %9.1f %10.1f %9llu %8d %8.1f %7.1f %8zu "
      "%9.1f %7.1f %8.1f %8.1f\n",
      m, etcd.empty() ? "posix" : "etcd", ckpts, latency.size(), Percentile(latency, 0.5), Percentile(latency, 0.99),
      latency.empty() ? 0 : *std::max_element(latency.begin(), latency.end()), Percentile(chain, 0.5),
      static_cast<double>(sum.puts + sum.txns) / per, static_cast<double>(sum.keepalives) / per,
      static_cast<double>(sum.digests_seen) / per, static_cast<double>(sum.ranges) / std::max(ckpts, 1),
      static_cast<double>(sum.puts + sum.txns + sum.keepalives + sum.ranges + sum.grants + sum.deltas) / elapsed,
      static_cast<unsigned long long>(live), out_of_order, cpu,
      etcd.empty() ? 0 : EtcdDbMiB("http://" + etcd.substr(0, etcd.find(','))), blocked,
      static_cast<double>(sum.summaries) / std::max(ckpts, 1), static_cast<double>(sum.turns) / std::max(ckpts, 1),
      static_cast<double>(sum.deltas) / std::max(ckpts, 1), static_cast<double>(sum.handoffs) / std::max(ckpts, 1));
  std::fflush(stdout);
  close_all();
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    out.push_back(std::atoi(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos).c_str()));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpoint, bucket = "ckptfs-test", posix, etcd, etcd_dir;
  std::vector<int> members = {4, 16, 64};
  int seconds = 10, heartbeat = 500, period_ms = 10000;
  bool checkpoints = false;
  MemberKnobs knobs;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--endpoint") endpoint = next();
    else if (a == "--bucket") bucket = next();
    else if (a == "--posix") posix = next();
    else if (a == "--members") members = ParseList(next());
    else if (a == "--seconds") seconds = std::atoi(next().c_str());
    else if (a == "--heartbeat-ms") heartbeat = std::atoi(next().c_str());
    else if (a == "--etcd") etcd = next();
    else if (a == "--etcd-dir") etcd_dir = next();
    else if (a == "--period-ms") period_ms = std::atoi(next().c_str());
    else if (a == "--checkpoints") checkpoints = true;
    else if (a == "--sample-ms") knobs.sample_ms = std::atoi(next().c_str());
    else if (a == "--tick-ms") knobs.tick_ms = std::atoi(next().c_str());
    else if (a == "--lease-s") knobs.lease_s = std::atoi(next().c_str());
    else if (a == "--stage-ms") knobs.stage_ms = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "usage: cluster_scale --endpoint URL [--bucket B] [--members 4,16,64] [--seconds 10] "
                           "[--heartbeat-ms 500]\n");
      return 2;
    }
  }
  // A thousand members hold a few thousand sockets.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  if (!etcd.empty() || checkpoints) {
    if (!etcd.empty() && !fs::etcd::ParseStoreUrl("etcd://" + etcd)) {
      std::fprintf(stderr, "cluster_scale: --etcd: want HOST:PORT[,HOST:PORT...]\n");
      return 2;
    }
    std::unique_ptr<backend::Backend> pbe;
    if (etcd.empty()) {
      auto b = backend::OpenPosixBackend(posix);
      if (!b) {
        std::fprintf(stderr, "cluster_scale: --posix DIR is required with --checkpoints\n");
        return 2;
      }
      pbe = std::move(*b);
    }
    std::printf("%8s %6s %6s %9s %10s %10s %10s %11s %9s %9s %8s %9s %10s %9s %8s %8s %7s %8s %9s %7s %8s %8s\n",
                "members", "store", "ckpts", "measured", "p50 ms", "p99 ms", "max ms", "shards p50", "wr/ck/nd",
                "ka/ck/nd", "dg/ck/nd", "rng/ckpt", "store rq/s", "live", "order!", "etcd cpu", "db MiB", "blocked",
                "sum/ckpt", "turn/ck", "dlt/ck", "hand/ck");
    if (knobs.sample_ms < 1 || knobs.tick_ms < 1 || knobs.lease_s < 2) {
      std::fprintf(stderr, "cluster_scale: --sample-ms and --tick-ms >= 1, --lease-s >= 2\n");
      return 2;
    }
    for (int m : members) RunCheckpoints(m, seconds, period_ms, etcd, etcd_dir, pbe.get(), knobs);
    return 0;
  }
  if (endpoint.empty() == posix.empty() || seconds < 1 || heartbeat < 10) {
    std::fprintf(stderr, "cluster_scale: --endpoint or --posix is required; --seconds >= 1, --heartbeat-ms >= 10\n");
    return 2;
  }
  backend::S3Config cfg;
  cfg.endpoint = endpoint;
  cfg.region = "us-east-1";
  cfg.bucket = bucket;
  cfg.prefix = "cluster-scale";
  cfg.access_key = "S3RVER";
  cfg.secret_key = "S3RVER";
  auto be = posix.empty() ? backend::OpenS3Backend(cfg) : backend::OpenPosixBackend(posix);
  if (!be) {
    std::fprintf(stderr, "cluster_scale: cannot open the backend at %s: %s\n", (posix + endpoint).c_str(),
                 ErrStr(be.error()).c_str());
    return 1;
  }
  std::printf("%8s %10s %10s %12s %14s %12s %12s %14s %8s\n", "members", "puts/s", "lists/s", "GETs/s",
              "heartbeats", "op ms med", "op ms max", "stalest view", "errors");
  for (int m : members) {
    std::string name = "sim-" + std::to_string(m) + "-" + std::to_string(NowMs());
    std::vector<std::unique_ptr<FakeLog>> logs;
    std::vector<CountingStore*> stores;
    std::vector<std::unique_ptr<fs::RecordStore>> owned;
    std::vector<std::unique_ptr<fs::Cluster>> nodes;
    for (int i = 0; i < m; i++) {
      logs.push_back(std::make_unique<FakeLog>());
      auto st = std::make_unique<CountingStore>(fs::BackendRecords(be->get(), name));
      stores.push_back(st.get());
      owned.push_back(std::move(st));
      fs::ClusterOptions o;
      o.name = name;
      o.node = "node" + std::to_string(i);
      o.heartbeat_ms = heartbeat;
      nodes.push_back(std::make_unique<fs::Cluster>(o, owned.back().get(), logs.back().get(), ""));
      nodes.back()->Init();
    }
    for (auto& n : nodes) n->Start();
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    int64_t stalest = 0;
    for (auto& n : nodes) {
      auto s = n->Status();
      int seen = 0;
      for (auto& mem : s.members)
        if (!mem.self) seen++, stalest = std::max(stalest, mem.age_ms);
      if (seen < m - 1) stalest = std::max<int64_t>(stalest, seconds * 1000);  // never saw some member
    }
    for (auto& n : nodes) n->Stop();
    uint64_t puts = 0, lists = 0, recs = 0, errs = 0;
    std::vector<double> ms;
    for (auto* s : stores) {
      puts += s->puts, lists += s->lists, recs += s->records, errs += s->errors;
      MutexLock lk(&s->mu);
      ms.insert(ms.end(), s->ms.begin(), s->ms.end());
    }
    std::sort(ms.begin(), ms.end());
    double want = static_cast<double>(m) * seconds * 1000.0 / heartbeat;
    char hb[32];
    std::snprintf(hb, sizeof hb, "%.0f%% of %.0f", 100.0 * static_cast<double>(puts) / want, want);
    std::printf("%8d %10.1f %10.1f %12.1f %14s %12.1f %12.1f %11lld ms %8llu\n", m,
                static_cast<double>(puts) / seconds, static_cast<double>(lists) / seconds,
                static_cast<double>(recs) / seconds, hb, ms.empty() ? 0 : ms[ms.size() / 2],
                ms.empty() ? 0 : ms.back(), static_cast<long long>(stalest), static_cast<unsigned long long>(errs));
    std::fflush(stdout);
  }
  return 0;
}
