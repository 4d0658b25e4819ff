// cluster_scale.cc — many --cluster members on one machine, against a real
// S3 server (docs/scale.md): what the protocol's records cost as the
// cluster grows.
//
//   build/cluster_scale --endpoint http://127.0.0.1:PORT [--bucket ckptfs-test]
//                       [--members 4,16,64] [--seconds 10] [--heartbeat-ms 500]
//   build/cluster_scale --posix DIR ...      (records in a directory instead)
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
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/s3_backend.h"
#include "common/mutex.h"
#include "fs/cluster/cluster.h"

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
  std::string endpoint, bucket = "ckptfs-test", posix;
  std::vector<int> members = {4, 16, 64};
  int seconds = 10, heartbeat = 500;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--endpoint") endpoint = next();
    else if (a == "--bucket") bucket = next();
    else if (a == "--posix") posix = next();
    else if (a == "--members") members = ParseList(next());
    else if (a == "--seconds") seconds = std::atoi(next().c_str());
    else if (a == "--heartbeat-ms") heartbeat = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "usage: cluster_scale --endpoint URL [--bucket B] [--members 4,16,64] [--seconds 10] "
                           "[--heartbeat-ms 500]\n");
      return 2;
    }
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
