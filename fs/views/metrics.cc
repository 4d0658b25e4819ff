// metrics.cc — Prometheus metrics (fs/views/metrics.h).
#include "fs/views/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/io.h"
#include "common/log.h"
#include "fs/cluster/etcd_records.h"
#include "fs/cluster/peer_loads.h"
#include "fs/cluster/replica_store.h"
#include "fs/cluster/replicator.h"
#include "fs/cluster/takeover.h"
#include "fs/daemon.h"

namespace ckpt::fs {

namespace {

// One family: HELP and TYPE lines, then the samples.
class Text {
 public:
  void Family(const char* name, const char* type, const char* help) {
    out_ += fmt::format("# HELP ckptfs_{} {}\n# TYPE ckptfs_{} {}\n", name, help, name, type);
  }
  void Sample(const char* name, double v, const std::string& labels = "") {
    out_ += fmt::format("ckptfs_{}{} {}\n", name, labels.empty() ? "" : "{" + labels + "}", v);
  }
  void One(const char* name, const char* type, const char* help, double v) {
    Family(name, type, help);
    Sample(name, v);
  }
  std::string str() && { return std::move(out_); }

 private:
  std::string out_;
};

// --replicas and loads from peers (issue #30), when this node has a
// replica link: what it holds for others, what it sent, what it loaded.
void ReplicaMetrics(Daemon* d, Text* t) {
  if (!d->replica_store) return;
  size_t held = 0;
  for (const auto& h : d->replica_store->List()) held += !h.published && h.key.ino != replica::kEntryIno;
  t->One("tier_replica_bytes", "gauge", "Bytes of the tier's budget other members' replicas hold (df: not available).",
         static_cast<double>(d->tier->Stats().outside));
  t->One("replicas_held_files", "gauge", "Other members' files this node holds until they are persisted.",
         static_cast<double>(held));
  t->One(
      "replicas_kept_for_marks_bytes", "gauge",
      "Published copies of dead members' files and entries kept until their done marks reach etcd (not given back for "
      "room).",
      static_cast<double>(d->replica_store->KeptNow().bytes));
  if (d->replicator) {
    const replica::Replicator::Stats rs = d->replicator->stats();
    t->One("replicas_replicated_files_total", "counter", "This node's files held by --replicas K members (replicated).",
           static_cast<double>(rs.replicated_files));
    t->One("replicas_replicated_bytes_total", "counter", "Their bytes.", static_cast<double>(rs.replicated_bytes));
    t->One("replicas_queued", "gauge", "This node's closed files and entries not yet replicated.",
           static_cast<double>(rs.queued));
    t->One("replicas_failures_total", "counter", "Sends that failed (a member refused, left or lied).",
           static_cast<double>(rs.failures));
  }
  if (d->takeover)
    t->One("replicas_published_for_dead_total", "counter", "Dead members' files this node published in their place.",
           static_cast<double>(d->takeover->stats().published));
  if (d->peer_loads) {
    const replica::PeerLoads::Stats ps = d->peer_loads->stats();
    t->One("loads_from_peers_total", "counter", "Files loaded from another member's RAM.",
           static_cast<double>(ps.from_peers));
    t->One("loads_to_backend_total", "counter", "Loads left to the backend.", static_cast<double>(ps.to_backend));
    t->One("loads_sent_elsewhere_total", "counter", "Members loading a file this node sent to one that has it.",
           static_cast<double>(ps.sent_elsewhere));
  }
}

}  // namespace

std::string MetricsText(Daemon* d) {
  Text t;
  const cache::TierStats ts = d->tier->Stats();
  t.One("tier_budget_bytes", "gauge", "The memory tier's budget (--cache-size).", static_cast<double>(ts.budget));
  t.One("tier_used_bytes", "gauge", "Bytes the memory tier's files hold.", static_cast<double>(ts.used));
  t.One("tier_writer_waits_total", "counter", "Writes that waited for tier space.", static_cast<double>(ts.waits));
  const DataStats ds = d->table->DataStatistics();
  static const char* kStates[] = {"dirty", "draining", "persisted", "remote", "failed", "memory-only"};
  static_assert(std::size(kStates) == meta::kDataStates);
  t.Family("files", "gauge", "Files by state (dirty: in RAM only; persisted: in the backend and RAM).");
  for (size_t i = 0; i < meta::kDataStates; i++) t.Sample("files", static_cast<double>(ds.files[i]), fmt::format("state=\"{}\"", kStates[i]));
  t.Family("bytes", "gauge", "Bytes of files by state.");
  for (size_t i = 0; i < meta::kDataStates; i++) t.Sample("bytes", static_cast<double>(ds.bytes[i]), fmt::format("state=\"{}\"", kStates[i]));
  const DrainStats dr = d->drainer->Stats();
  t.One("drain_queue_entries", "gauge", "Log entries not yet applied to the backend.", static_cast<double>(ds.log_len));
  t.One("drain_rate_bytes_per_second", "gauge", "Drain throughput over the last seconds.", dr.rate > 0 ? dr.rate : 0);
  t.One("drain_persisted_bytes_total", "counter", "Bytes published to the backend since mount.",
        static_cast<double>(dr.bytes_persisted));
  t.One("drain_persisted_files_total", "counter", "Files published to the backend since mount.",
        static_cast<double>(dr.files_persisted));
  t.One("drain_retries_total", "counter", "Backend operations retried after an error.", static_cast<double>(dr.retries));
  t.One("drain_failed_entries_total", "counter", "Entries the backend refused for good.",
        static_cast<double>(dr.entries_failed));
  t.One("backend_up", "gauge", "0 while the backend answers with errors (the drain retries).", dr.in_error ? 0 : 1);
  t.One("read_only", "gauge", "1 once a metadata write failed (the mount is read-only).",
        d->table->core().ReadOnlyReason().empty() ? 0 : 1);
  t.One("drain_held", "gauge",
        "1 while the drain holds at an entry the backend refuses for good (ckptfs status names it; ckptfs skip).",
        d->table->core().oplog.Held() ? 1 : 0);
  t.One("lost_files", "gauge", "Files in the lost list (ckptfs lost).",
        static_cast<double>(d->table->core().oplog.LostFiles().size()));
  if (d->cluster)
    t.One("cluster_kept_removals_total", "counter",
          "Removals not applied to the backend: ordered after a lost member's lost entries (ckptfs status).",
          static_cast<double>(d->cluster->Status().kept_removals));
  if (d->etcd_records) {
    const EtcdRecordsStats es = d->etcd_records->Stats();
    t.One("cluster_turns_total", "counter", "Turns this node wrote as the elected member (one step of a chain each).",
          static_cast<double>(es.turns));
    t.One("cluster_batons_handed_total", "counter",
          "Batons this node handed on with its record (a step of a chain without the elected member).",
          static_cast<double>(es.handoffs));
  }
  const PressureStats mp = d->table->core().residency.MemoryPressure();
  t.One("memory_available_bytes", "gauge", "Headroom the memory watch read last (MemAvailable or the cgroup's).",
        static_cast<double>(mp.available));
  t.One("memory_pressure", "gauge", "1 while the headroom is under --min-free.", mp.active ? 1 : 0);
  t.One("memory_evicted_files_total", "counter", "Persisted files evicted under memory pressure.",
        static_cast<double>(mp.evicted_files));
  t.One("written_bytes_total", "counter", "Bytes written through the daemon (not passthrough).",
        static_cast<double>(d->bytes_written.load()));
  t.One("read_bytes_total", "counter", "Bytes read through the daemon (not passthrough).",
        static_cast<double>(d->bytes_read.load()));
  ReplicaMetrics(d, &t);
  // The newest checkpoint written during this mount that is all in the
  // backend: its times.
  auto list = d->table->Checkpoints(d->checkpoint_pattern);
  const CheckpointInfo* last = nullptr;
  for (const auto& c : list)
    if (c.Timed()) last = &c;
  t.One("checkpoints", "gauge", "Checkpoints (names matching --checkpoint-regex).", static_cast<double>(list.size()));
  if (last) {
    t.One("last_checkpoint_bytes", "gauge", "Bytes of the newest persisted checkpoint.", static_cast<double>(last->bytes));
    t.One("last_checkpoint_time_to_ram_seconds", "gauge", "Its first change to last close.",
          static_cast<double>(last->last_seal_ns - last->first_change_ns) / 1e9);
    t.One("last_checkpoint_time_to_durable_seconds", "gauge", "Its last close to last publish.",
          static_cast<double>(last->last_publish_ns - last->last_seal_ns) / 1e9);
  }
  return std::move(t).str();
}

std::expected<std::pair<std::string, uint16_t>, std::string> ParseMetricsAddress(const std::string& s) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) return std::unexpected("--metrics: want HOST:PORT (e.g. 127.0.0.1:9105), not '" + s + "'");
  std::string host = s.substr(0, colon), port = s.substr(colon + 1);
  if (host.empty()) host = "127.0.0.1";
  in_addr a;
  if (inet_pton(AF_INET, host.c_str(), &a) != 1)
    return std::unexpected("--metrics: '" + host + "' is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)");
  char* end = nullptr;
  unsigned long p = strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p == 0 || p > 65535)
    return std::unexpected("--metrics: '" + port + "' is not a port (1-65535)");
  return std::make_pair(host, static_cast<uint16_t>(p));
}

MHD_Result MetricsServer::Handle(void* cls, MHD_Connection* c, const char* url, const char* method, const char*,
                                 const char*, size_t*, void**) {
  auto* self = static_cast<MetricsServer*>(cls);
  std::string body;
  unsigned code = MHD_HTTP_OK;
  const char* type = "text/plain; version=0.0.4; charset=utf-8";
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
    body = "GET /metrics\n";
  } else if (strcmp(url, "/metrics") != 0) {
    code = MHD_HTTP_NOT_FOUND;
    body = "ckptfs serves /metrics\n";
  } else {
    try {
      body = MetricsText(self->d_);
    } catch (const std::exception& e) {
      code = MHD_HTTP_INTERNAL_SERVER_ERROR;
      body = "internal error\n";
      LOG_ERROR("metrics: internal error: {}", e.what());
    }
  }
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  MHD_Result ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

Status MetricsServer::Start(const std::string& host, uint16_t port, std::string* why) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    *why = "not an IPv4 address: " + host;
    return Err(EINVAL);
  }
  mhd_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, port, nullptr, nullptr, &Handle, this,
                          MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_LIMIT, 16U, MHD_OPTION_CONNECTION_TIMEOUT,
                          10U, MHD_OPTION_END);
  if (!mhd_) {
    int e = errno ? errno : EADDRINUSE;
    *why = fmt::format("cannot listen on {}:{}: {}", host, port, strerror(e));
    return Err(e);
  }
  return {};
}

void MetricsServer::Stop() {
  if (mhd_) MHD_stop_daemon(mhd_);
  mhd_ = nullptr;
}

Status WriteMetricsTextfile(Daemon* d, const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::string text = MetricsText(d);
  // A fresh file (O_EXCL): never one planted at the name in a shared
  // collector directory, linked or not.
  unlink(tmp.c_str());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrFromErrno();
  int e = PwriteFull(fd, text.data(), text.size(), 0);
  if (e == 0 && fchmod(fd, 0644) != 0) e = errno;  // node_exporter reads it; the daemon's umask is 077
  close(fd);
  if (e == 0 && rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e != 0) {
    unlink(tmp.c_str());
    return Err(e);
  }
  return {};
}

}  // namespace ckpt::fs
