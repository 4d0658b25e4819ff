// daemon.cc — the daemon's start: RunDaemon opens the log, the metadata
// store, the memory tier and the backend, loads the namespace, mounts and
// serves until unmounted. `ckptfs mount` (cli/mount.cc) checks the command
// line, forks and calls it in the child; with --foreground it runs in the
// command's own process.
//
// Every start-up failure is one line for the user: to the parent waiting on
// `report_fd`, or to stderr in the foreground, and to the log once it is
// open. Nothing is left mounted after one. S3 credentials never appear in a
// message: only the bucket, prefix and endpoint do.
#include "fs/daemon.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/s3_backend.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/text.h"
#include "fs/cluster/replica_wire.h"
#include "fs/cluster/sent_sums.h"
#include "fs/core/memory_watch.h"
#include "fs/core/peer_copy.h"
#include "fs/core/recovery.h"
#include "fs/fuse/reply_yield.h"

namespace ckpt::fs {
namespace {

// Who stages into an S3 backend (S3Config::owner): one per machine and
// state dir, so a restarted daemon knows its predecessor's leftovers.
std::string StagingOwner(const std::string& state_dir) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  return HexHash(std::string(host) + '\n' + state_dir);
}

// Opens the backend `cfg` names and checks it (reachable, writable, leftovers
// of daemons that are gone cleaned up: staged files, S3 multipart uploads), or
// returns the one-line message for the user. S3 credentials never appear in
// a message: only the bucket, prefix and endpoint do.
// `check` false: the backend object only, for a degraded mount (a POSIX
// root that does not resolve is opened as missing, to be adopted when a
// directory of `owner` appears there).
std::expected<std::unique_ptr<backend::Backend>, std::string> OpenBackend(const Config& cfg, bool check = true,
                                                                          uid_t owner = 0) {
  const std::string& url = cfg.backend_display;
  if (cfg.backend.kind == BackendUrl::Kind::kPosix) {
    auto be = backend::OpenPosixBackend(cfg.backend.path);
    if (!be && !check) be = backend::OpenMissingPosixBackend(cfg.backend.path, owner);
    if (!be) return std::unexpected("cannot open backend " + url + ": " + ErrStr(be.error()));
    if (!check) return std::move(*be);
    if (auto st = (*be)->Check(); !st)
      return std::unexpected("backend " + url + " is not usable: " + ErrStr(st.error()));
    return std::move(*be);
  }
  std::string why;
  auto s3cfg = backend::LoadS3Config(cfg.backend.bucket, cfg.backend.prefix, cfg.s3_endpoint, &why);
  if (!s3cfg) return std::unexpected("backend " + url + ": " + why);
  s3cfg->owner = StagingOwner(cfg.state_dir);
  auto be = backend::OpenS3Backend(*s3cfg);
  if (!be) return std::unexpected("cannot open backend " + url + ": " + ErrStr(be.error()));
  if (!check) return std::move(*be);
  auto st = (*be)->Check();
  if (st) return std::move(*be);
  const std::string& ep = s3cfg->endpoint;
  switch (st.error()) {
    case EACCES:
      return std::unexpected("backend " + url + ": access denied by " + ep +
                             " (wrong credentials, or no access to bucket '" + s3cfg->bucket +
                             "'); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE");
    case ENOENT: return std::unexpected("backend " + url + ": no bucket '" + s3cfg->bucket + "' at " + ep);
    default:
      return std::unexpected("backend " + url + ": cannot use " + ep + ": " + ErrStr(st.error()) +
                             " (unreachable, or an unexpected reply; see " + cfg.state_dir + "/ckptfs.log)");
  }
}

// What the mount accepts, from what its backend can hold: S3 keys are at
// most 1024 bytes of UTF-8 (the prefix and a directory marker's '/'
// included). A POSIX backend resolves paths through directory descriptors,
// so it holds a path of any length, as tmpfs and ext4 do: PATH_MAX bounds
// the path of one system call, relative to its working directory, and
// pjdfstest makes 4095-byte paths from a directory below the mount's root.
// The members' records in etcd (--cluster-store), with the credentials read
// from their files; an error line if they cannot be read.
std::expected<std::unique_ptr<EtcdRecords>, std::string> OpenEtcdRecords(const Config& cfg,
                                                                         const std::string& incarnation) {
  EtcdRecordsOptions eo;
  auto eps = etcd::ParseStoreUrl(cfg.cluster_store);
  if (!eps) return std::unexpected("--cluster-store: " + eps.error());
  eo.client.endpoints = *eps;
  eo.client.user = cfg.cluster_store_user;
  if (!cfg.cluster_store_password_file.empty()) {
    std::ifstream in(cfg.cluster_store_password_file);
    std::string pw;
    if (!in || !std::getline(in, pw) || pw.size() > 4096)
      return std::unexpected("--cluster-store-password-file: cannot read a password from " +
                             cfg.cluster_store_password_file);
    while (!pw.empty() && pw.back() == '\r') pw.pop_back();
    eo.client.password = pw;
  }
  eo.client.ca_file = cfg.cluster_store_ca;
  eo.client.cert_file = cfg.cluster_store_cert;
  eo.client.key_file = cfg.cluster_store_key;
  eo.url = cfg.cluster_store;
  eo.cluster = cfg.cluster;
  eo.node = cfg.node;
  eo.incarnation = incarnation;
  eo.lease_ttl_s = static_cast<int64_t>(cfg.member_timeout_s);
  return std::make_unique<EtcdRecords>(std::move(eo), Cluster::WallClockUs);
}

Limits MountLimits(const Config& cfg) {
  Limits l;
  if (cfg.backend.kind == BackendUrl::Kind::kS3) {
    size_t prefix = cfg.backend.prefix.empty() ? 0 : cfg.backend.prefix.size() + 1;
    l.max_path = 1024 - 1 - std::min<size_t>(prefix, 1000);
    l.utf8_names = true;
  }
  l.max_file_size = cfg.max_file_size ? cfg.max_file_size : 4 * cfg.cache_size;
  return l;
}

// How long the part of a shutdown that may wait on the backend (fetches
// under way, the drain, the cluster's records) may take in all; below the
// minute `ckptfs umount` waits for the daemon to exit.
constexpr std::chrono::seconds kShutdownBound{30};

// Watches that part of a shutdown: a backend that does not answer (a
// hard-mounted NFS server gone) would otherwise keep the daemon, and
// `ckptfs umount` waiting for it, there for ever. After `bound` it logs
// why, unmounts and ends the process (the threads stuck in the backend
// with it); the log keeps every entry not applied, for the next mount.
class ShutdownWatch {
 public:
  ShutdownWatch(std::chrono::seconds bound, fuse_session* se, std::string mountpoint)
      : thread_([this, bound, se, mp = std::move(mountpoint)] {
          std::unique_lock lk(mu_);
          if (cv_.wait_for(lk, bound, [this] { return done_; })) return;
          // mu_ stays held: Done() cannot return, and the main thread
          // reaches its own unmount only after Done().
          LOG_ERROR("shutdown: still waiting on the backend after {} s (a call that does not return); exiting "
                    "without it: entries not applied stay in the log for the next mount",
                    bound.count());
          fuse_session_unmount(se);
          LOG_INFO("unmounted {}", mp);
          spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
          _exit(1);
        }) {}
  ~ShutdownWatch() { Done(); }
  void Done() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started once the others exist
};

}  // namespace

// The contract is in daemon.h.
inline constexpr char kBackendOwnerCounter[] = "backend_uid";  // uid + 1 of the POSIX root

// What <tier>/.owner says: whose memory this is, for `ckptfs gc`.
std::string OwnerJson(const Config& cfg) {
  nlohmann::json j;
  j["state_dir"] = cfg.state_dir;
  j["mountpoint"] = cfg.mountpoint;
  j["backend"] = cfg.backend_display;
  j["pid"] = static_cast<long long>(getpid());
  j["mounted_at"] = static_cast<long long>(time(nullptr));
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// A clean unmount gives the tier's memory back once everything in it is
// in the backend (`ckptfs umount` asks; --keep-cache does not). The files
// become remote, fetched again on the next read after a remount.
void ReleaseTier(Daemon* d) {
  std::string why;
  auto r = d->table->ReleaseTier(&why);
  if (r) {
    LOG_INFO("tier {} released: {} bytes given back", d->cfg.tier_dir, *r);
  } else if (uint64_t mo = d->table->DataStatistics().files[static_cast<size_t>(meta::DataState::kMemoryOnly)]; mo > 0) {
    // As the policy wants: memory-only checkpoints live only here.
    LOG_INFO("tier {} kept: {} files of memory-only checkpoints are only there ({})", d->cfg.tier_dir, mo, why);
  } else {
    LOG_WARN("tier {} kept: {}", d->cfg.tier_dir, why);
  }
}

// A replica found the tier full (replica::Store::TakeWanted): persisted
// files make room, least recently used first, as for a spare — never the
// last save's files nor the newest --keep-in-memory checkpoints, and only
// if that covers it. Other members' unpersisted bytes are worth more than
// this node's copies of what the backend holds. When that cannot, this
// node's spares (pages for its next save, nobody's bytes) go: they were
// left standing, and a holder whose budget was mostly its spare answered
// WAIT for ever (stop 70, tests/mount/cases/replicas_budget_spares.sh).
static void MakeRoomForReplicas(Daemon* d) {
  const uint64_t want = d->replica_store->TakeWanted();
  if (want == 0) return;
  cache::TierStats s = d->tier->Stats();
  if (s.used + s.reserved + want <= s.for_files()) return;
  if (d->table->Evict(s.used + s.reserved + want - s.for_files(), /*all_or_nothing=*/true, /*spare_kept=*/true) ==
      cache::Tier::Relief::kFreed)
    return;
  // Held first: made again within 50 ms, they took the room back before
  // the writer's next try (0.5-5 s), WAIT after WAIT (review, stop 70).
  d->table->core().residency.HoldSpares(std::chrono::seconds(10));
  if (const uint64_t spares = d->tier->Spares().first; spares > 0) {
    d->tier->DropSpares();
    LOG_INFO("replicas: dropped {} bytes of pre-allocated spares for a replica ({} bytes wanted)", spares, want);
  }
}

// This run's incarnation in the cluster: the state dir's random id (made
// with its metadata), so a daemon restarted on its state dir is the same
// member, and a new machine under the same --node id is another.
static std::string Incarnation(const Daemon& d) { return replica::IncarnationText(d.fs_id); }

// --replica-listen and --replicas (issue #30, fs/cluster/replicator.h):
// the store of other members' replicas beside the tier, the link, where
// the members listen, and the replicator of this node's closed files. ""
// or why not (one line).
static std::string OpenReplicas(Daemon* d) {
  const Config& cfg = d->cfg;
  auto secret = replica::LoadSecret(cfg.cluster_secret);
  if (!secret) return "--cluster-secret " + cfg.cluster_secret + " " + secret.error();
  auto store = replica::Store::Open(cfg.tier_dir + "-replicas", cfg.replica_budget);
  if (!store) return "replicas: cannot open " + cfg.tier_dir + "-replicas: " + ErrStr(store.error());
  d->replica_store = std::move(*store);
  // Copies published in dead writers' places stay until the takeover's
  // first read-back of its claims says which marks are still owed.
  d->replica_store->KeepPublished();
  // One budget (--cache-size) for this node's files and the replicas it
  // holds: a replica takes the tier's room, and gives its spare pages and
  // published copies back first when the node's own writes need it.
  cache::Tier* tier = d->tier.get();
  replica::Store* rs = d->replica_store.get();
  rs->ShareRoom({.take = [tier](uint64_t n, bool force) { return tier->TakeOutside(n, force); },
                 .give = [tier](uint64_t n) { tier->GiveOutside(n); }});
  tier->set_outside_relief([rs](uint64_t need) { return rs->Relieve(need); });
  InodeTable* table = d->table.get();
  d->peer_loads = std::make_unique<replica::PeerLoads>(
      cfg.node, d->replica_store.get(),
      [table](const replica::Content& c, bool fetch) {
        return LocalCopyForPeer(table, c.path, c.size, c.hi, c.lo, fetch);
      },
      cfg.peer_fanout);
  replica::PeerLoads* loads = d->peer_loads.get();
  auto link = replica::Link::Open({.node_id = cfg.node,
                                   .secret = *secret,
                                   .listen = cfg.replica_listen,
                                   .serve = [loads](const replica::Content& c, const std::string& asker,
                                                    replica::Link::Ask ask) { return loads->Serve(c, asker, ask); }},
                                  d->replica_store.get());
  if (!link) return "replicas: " + link.error();
  d->replica_link = std::move(*link);
  d->replica_peers =
      std::make_unique<replica::Peers>(d->etcd_records, cfg.node, d->replica_link->address(), cfg.replica_group);
  loads->Attach(d->replica_link.get(), d->replica_peers.get());
  table->core().peer_fetch = [loads](const std::string& path, int fd, uint64_t size, uint64_t hi, uint64_t lo) {
    return loads->Load(replica::Content{.path = path, .size = size, .hi = hi, .lo = lo}, fd);
  };
  d->takeover = std::make_unique<replica::Takeover>(cfg.node, d->replica_store.get(), d->cluster.get(), d->etcd_records,
                                                    d->replica_peers.get(), d->backend.get());
  replica::Takeover* takeover = d->takeover.get();
  d->cluster->SetHeldGate([takeover](bool dead_too) { return takeover->Holding(dead_too); });
  LOG_INFO(
      "replicas: listening at {} for other members' replicas ({} at most, {} held); this node's files go to {} "
      "other member(s)",
      d->replica_link->address(), HumanBytes(cfg.replica_budget), d->replica_store->List().size(), cfg.replicas);
  if (cfg.replicas == 0) return "";
  Daemon* dp = d;
  replica::Replicator::Ports ports;
  ports.source = [table](const meta::LogEntry& e) -> Result<replica::Replicator::Source> {
    auto src = table->drain_port().ReplicaSource(e);
    if (!src) return Err(src.error());
    return replica::Replicator::Source{src->ref, src->fd, src->size,
                                       [table, e, s = *src] { return table->drain_port().StagedBytesHeld(e, s); }};
  };
  // An entry recovered at a restart has no exact time: the gate its
  // record names then (from the samples), which a holder takes for it.
  ports.gate_us = [table, c = d->cluster.get()](uint64_t seq) -> int64_t {
    auto t = table->core().oplog.LoggedTimes(seq, seq);
    return !t.empty() ? t.front().second : c->GateTime(seq).value_or(0);
  };
  ports.when_applied = [table](uint64_t seq, std::function<void(int)> fn) {
    table->core().oplog.WhenApplied(seq, std::move(fn));
  };
  ports.applied_seq = [table] { return table->core().oplog.AppliedSeq(); };
  ports.durable_applied = [log = d->cluster_log.get()] { return log->DurableAppliedSeq(); };
  ports.hold = [dp] { return dp->table->core().saves.HoldDrain(); };
  ports.observed = [c = d->cluster.get()] { c->Poke(); };
  ports.incarnation = Incarnation(*d);
  // Kept for a restart's read-back (sent_sums.h) before any holder holds
  // the version; a failed put is logged, and the version sent again later.
  ports.sent = [kv = d->store->kv()](uint64_t ino, uint64_t version, uint64_t hi, uint64_t lo) {
    auto st = replica::RememberSentSum(kv, ino, version, hi, lo);
    if (!st)
      LOG_WARN(
          "replicas: ino {} version {}: its checksum could not be kept ({}): not replicated now, tried again later",
          ino, version, ErrStr(st.error()));
    return st.has_value();
  };
  ports.dropped = [kv = d->store->kv()](uint64_t ino, uint64_t version) {
    (void)replica::ForgetSentSum(kv, ino, version);
  };
  d->replicator = std::make_unique<replica::Replicator>(cfg.node, static_cast<int>(cfg.replicas), d->replica_link.get(),
                                                        d->replica_peers.get(), ports);
  replica::Replicator* repl = d->replicator.get();
  table->SetReplicated([repl](uint64_t ino, uint64_t version) { return repl->Replicated(ino, version); });
  table->core().residency.set_busy([repl] { return repl->Sending(); });
  d->cluster->SetReplicas([repl] { return repl->UnsafeFrom(); },
                          [repl](uint64_t ino, uint64_t version) { return repl->Replicated(ino, version); });
  return "";
}

int RunDaemon(Config cfg, int report_fd, const std::vector<std::string>& warnings) {
  // Everything the daemon creates is its own: RocksDB creates its files
  // 0644 & ~umask, and the state dir's mode alone would guard them. Tier
  // files, and the backend's files and directories, are given their modes
  // explicitly (only a backend parent directory made with no mode of its
  // own would come out 0700).
  umask(077);
  bool logging = false;
  auto fail = [&](const std::string& msg) {
    if (logging) LOG_ERROR("{}", msg);
    if (report_fd >= 0) {
      (void)!write(report_fd, msg.data(), msg.size());
      close(report_fd);
    } else {
      fprintf(stderr, "ckptfs: %s\n", msg.c_str());
    }
    return 1;
  };
  std::string log_file = cfg.state_dir + "/ckptfs.log";
  if (auto st = InitLogging(log_file, cfg.log_level, cfg.foreground); !st) {
    if (st.error() == ELOOP) return fail("log file " + log_file + " is a symbolic link; refusing to follow it");
    if (st.error() == EPERM)
      return fail("log file " + log_file + " is not a regular file of this daemon's user with one link; refusing it");
    return fail("cannot open log file " + log_file + ": " + ErrStr(st.error()));
  }
  logging = true;
  for (const std::string& w : warnings) LOG_WARN("{}", w);
  InitFailpoints();

  auto d = std::make_unique<Daemon>();
  // fail, and once the cluster's threads may run, their teardown first (set there).
  std::function<int(const std::string&)> fail_joined = fail;
  d->cfg = cfg;
  try {
    d->checkpoint_pattern = std::regex(cfg.checkpoint_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return fail("invalid --checkpoint-regex '" + cfg.checkpoint_regex + "': " + e.what());
  }
  std::string kv_why;
  auto kv = meta::OpenRocksKv(cfg.state_dir + "/meta", &kv_why);
  if (!kv) {
    if (kv.error() == EBUSY) return fail("state dir " + cfg.state_dir + " is in use by another ckptfs daemon");
    if (kv.error() == EUCLEAN)
      return fail("metadata in " + cfg.state_dir + "/meta is damaged (" + kv_why +
                  "); nothing was mounted or changed. See docs/operations.md, \"Damaged metadata\"");
    return fail("cannot open metadata in " + cfg.state_dir + "/meta: " + ErrStr(kv.error()) + " (see " + cfg.state_dir +
                "/ckptfs.log)");
  }
  d->store = std::make_unique<meta::MetaStore>(std::move(*kv));
  auto id = d->store->EnsureFormat();
  if (!id) return fail("state dir " + cfg.state_dir + " holds metadata of an unknown format");
  d->fs_id = *id;
  // Huge pages first: the tmpfs is mounted on the directory before the
  // tier looks into it (cache/tier_mount.h).
  d->huge = cfg.tier_huge ? cache::PrepareHugeTier(cfg.tier_dir)
                          : cache::HugeTier{cache::HasHugePages(cfg.tier_dir), "off (--tier-huge off)"};
  if (d->huge.on)
    LOG_INFO("tier {}: a tmpfs of its own with huge pages (--tier-huge)", cfg.tier_dir);
  else
    LOG_INFO("tier {}: 4 KiB pages: {}", cfg.tier_dir, d->huge.why);
  std::string tier_why;
  auto tier = cache::Tier::Open(cfg.tier_dir, cfg.cache_size, &tier_why);
  if (!tier) return fail("cannot use tier directory " + cfg.tier_dir + ": " + tier_why);
  d->tier = std::move(*tier);
  // A state dir describes one backend's history: mounting it over another
  // would drain that history into the wrong place. Bound only once the
  // backend proved usable, so a failed first mount leaves the dir free.
  std::string canon = cfg.backend.kind == BackendUrl::Kind::kS3
                          ? "s3://" + cfg.backend.bucket + "/" + cfg.backend.prefix
                          : cfg.backend.path;
  auto be = OpenBackend(cfg);
  std::string unreachable;  // non-empty: mounted degraded, with this reason
  if (!be) {
    // A state dir with history serves its tier while the backend is away
    // (the trainer needs its checkpoint from RAM exactly then); a fresh one
    // is refused, so a typo never looks like an empty backend.
    auto bound = d->store->BoundBackend();
    if (!bound || *bound != canon) return fail(be.error());
    auto owner = d->store->GetCounter(kBackendOwnerCounter);
    unreachable = be.error();
    be = OpenBackend(cfg, /*check=*/false, owner && *owner > 0 ? static_cast<uid_t>(*owner - 1) : geteuid());
    if (!be) return fail(unreachable);
  }
  d->backend = std::move(*be);
  std::string bound;
  if (auto st = d->store->BindBackend(canon, &bound); !st)
    return fail(st.error() == EXDEV ? "state dir " + cfg.state_dir + " belongs to backend " + bound + ", not " + canon +
                                          "; use another --state-dir"
                                    : "cannot record the backend in " + cfg.state_dir + ": " + ErrStr(st.error()));
  if (struct stat bst; unreachable.empty() && cfg.backend.kind == BackendUrl::Kind::kPosix &&
                       stat(cfg.backend.path.c_str(), &bst) == 0) {
    // Who owns the backend's root: a degraded mount adopts only a root of
    // this owner when it appears.
    meta::Batch b;
    meta::MetaStore::PutCounter(&b, kBackendOwnerCounter, static_cast<uint64_t>(bst.st_uid) + 1);
    if (auto st = d->store->Commit(b); !st) return fail("cannot record the backend's owner: " + ErrStr(st.error()));
  }
  d->table = std::make_unique<InodeTable>(d->store.get(), d->tier.get(), d->backend.get());
  d->table->core().set_limits(MountLimits(cfg));
  d->table->set_checkpoint_policy({d->checkpoint_pattern, cfg.persist_every, cfg.persist_interval_s, cfg.keep_in_memory});
  d->table->shared_ns().set_ttl(std::chrono::seconds(cfg.shared_ttl_s));
  if (cfg.shared_ttl_s > 0) {
    // Other nodes change the namespace too: the kernel may trust a name or
    // an attribute for no longer than the shared namespace's TTL.
    d->attr_timeout = d->entry_timeout = std::min(d->attr_timeout, static_cast<double>(cfg.shared_ttl_s));
    LOG_INFO("shared namespace: on, ttl {} s (--shared-ttl)", cfg.shared_ttl_s);
  }
  // --replicas: pending files the tier lost are asked of their holders
  // before they count as lost (RestoreFromPeers).
  {
    Core& core = d->table->core();
    MutexLock lk(&core.mu());
    core.keep_lost_for_peers =
        !cfg.cluster.empty() && !cfg.cluster_store.empty() && cfg.replicas > 0 && !cfg.replica_listen.empty();
  }
  if (auto st = d->table->Load(Caller{geteuid(), getegid()}); !st)
    return fail(st.error() == EUCLEAN ? "metadata in " + cfg.state_dir +
                                            "/meta is damaged (a directory cycle; see the log); nothing was mounted"
                                      : "cannot load metadata from " + cfg.state_dir + ": " + ErrStr(st.error()));
  if (auto st = d->table->shared_ns().ImportBackend(); !st)
    return fail("cannot list what backend " + cfg.backend_display + " holds: " + ErrStr(st.error()));
  // Writers that outgrow the budget wait for the drain (backpressure) and
  // for eviction of clean files; they fail only when nothing can ever free
  // space, or after this long.
  InodeTable* table = d->table.get();
  d->tier->set_evictor([table](uint64_t need) { return table->Evict(need); });
  d->tier->set_wait_limit(std::chrono::minutes(10));
  d->drainer = std::make_unique<Drainer>(&d->table->drain_port(), d->backend.get(), 4);
  d->drainer->set_refusal_skip(d->cfg.refusal_skip);
  // Test knob: CKPTFS_WRITE_QUEUE_BYTES=N bounds the bytes of writes queued
  // for space at N instead of 256 MiB, so a mounted case can fill the queue.
  const char* queue_bytes = getenv("CKPTFS_WRITE_QUEUE_BYTES");
  d->space_waiter = std::make_unique<OffloadQueue>(
      1, queue_bytes ? std::strtoull(queue_bytes, nullptr, 10) : OffloadQueue::kMaxQueuedBytes);
  d->fetcher = std::make_unique<OffloadQueue>(4);
  d->copier = std::make_unique<OffloadQueue>(2);
  if (cfg.drain_yield_ms > 0) {
    // The drain starts no transfer while a save is under way, for at most
    // --drain-yield in one busy stretch; never while someone waits for it
    // (an fsync with --fsync=backend, a writer short of tier space).
    d->table->core().saves.set_hold(std::chrono::milliseconds(cfg.drain_yield_ms));
    Daemon* dp = d.get();
    d->drainer->set_yield([dp] {
      return dp->table->core().saves.HoldDrain() && !dp->space_waiter->Busy() && !dp->tier->Tight() &&
             !dp->table->core().oplog.DurabilityAwaited();
    });
  }
  if (!cfg.cluster.empty()) {
    ClusterOptions co;
    co.name = cfg.cluster;
    co.node = cfg.node;
    co.incarnation = Incarnation(*d);
    co.member_timeout_ms = static_cast<int64_t>(cfg.member_timeout_s) * 1000;
    co.max_skew_ms = static_cast<int64_t>(cfg.max_clock_skew_ms);
    // How soon a record follows progress while the cluster is busy: each
    // step of a chain of files closed alternately on two nodes costs about
    // two ticks. A directory answers in microseconds; an object store's
    // PUT and LIST cost money and tens of milliseconds.
    co.tick_ms = cfg.backend.kind == BackendUrl::Kind::kS3 ? 100 : 25;
    d->cluster_log = LocalLog(&d->table->core().oplog, d->store->kv());
    if (cfg.cluster_store.empty()) {
      d->cluster_store = BackendRecords(d->backend.get(), cfg.cluster);
    } else {
      auto store = OpenEtcdRecords(cfg, Incarnation(*d));
      if (!store) {
        LOG_ERROR("{}", store.error());
        return 2;
      }
      d->etcd_records = store->get();
      d->cluster_store = std::move(*store);
    }
    d->cluster = std::make_unique<Cluster>(co, d->cluster_store.get(), d->cluster_log.get(),
                                           cfg.state_dir + "/cluster-samples");
    if (d->etcd_records) {
      Cluster* c = d->cluster.get();
      d->etcd_records->SetReducer([c](const auto& records, int64_t as_of) { return c->Reduce(records, as_of); });
      d->etcd_records->SetOnDigest([c] { c->Poke(); });
      Drainer* dr = d->drainer.get();
      d->etcd_records->SetOnTaken([dr](const EtcdRecords::Taken& t) { dr->SkipTaken(t.done, t.claimed); });
      EtcdRecords* er = d->etcd_records;
      dr->set_refresh_taken([er] { (void)er->RefreshTaken(); });
      if (auto st = d->etcd_records->Open(); !st)
        LOG_WARN("cluster {}: etcd at {} not reachable yet ({}); retried every tick", cfg.cluster, cfg.cluster_store,
                 d->etcd_records->LastError());
    }
    // A mount that fails from here on is taken down as a shutdown does: the
    // link's threads (they serve other members through peer_loads and the
    // peers), then etcd's (keepalive, watches, the reducer: they call into
    // the cluster, destroyed before the store on return), this run's lease
    // revoked (an election it won would hold the others' digest for a lease).
    fail_joined = [&](const std::string& why) {
      if (d->replica_peers) d->replica_peers->Stop();
      if (d->peer_loads) d->peer_loads->Attach(nullptr, nullptr);
      d->replica_link.reset();
      if (d->etcd_records) d->etcd_records->Close(true);
      return fail(why);
    };
    if (d->etcd_records && !cfg.replica_listen.empty()) {
      if (auto err = OpenReplicas(d.get()); !err.empty()) {
        (void)fail_joined(err);
        return 2;
      }
    }
    if (d->etcd_records && cfg.shared_ttl_s > 0) {
      // Close-to-open across nodes (fs/cluster/etcd_names.h): the names this
      // node changes, in etcd before each change's reply; a miss or an open
      // here asks etcd first.
      d->etcd_names = std::make_unique<EtcdNames>(d->etcd_records, &d->table->core().oplog, cfg.node,
                                                  static_cast<int64_t>(cfg.shared_ttl_s) * 1000 + 1000);
      EtcdNames* names = d->etcd_names.get();
      replica::Replicator* repl = d->replicator.get();
      d->table->core().oplog.set_observer([names, repl](const auto& entries) {
        names->Observe(entries);
        if (repl) repl->Observe(entries);
      });
      d->table->core().announce_names = [names] { names->Announce(); };
      d->table->shared_ns().set_names(names);
    }
    if (d->replicator && !d->etcd_names) {
      replica::Replicator* repl = d->replicator.get();
      d->table->core().oplog.set_observer([repl](const auto& entries) { repl->Observe(entries); });
    }
    // Before this node's first record: one written after the restart names
    // its recovered entries' gates from the samples, later than the exact
    // times its replicas carry, and a holder that reads it takes them for
    // applied and drops them (seen: a failed attempt's record did).
    if (std::string why = RestoreFromPeers(d.get()); !why.empty()) return fail_joined(why);
    // What the last run left pending is sent again (a holder that kept it
    // answers at once): the log observer sees only new entries. After the
    // restore, which brings back the bytes to send.
    if (d->replicator) d->replicator->Observe(d->table->core().oplog.Pending(SIZE_MAX));
    d->cluster->Init();
    // Known to the other members before it serves a write. A degraded
    // mount (backend unreachable) does not wait for that here: it joins at
    // its first heartbeat that reaches the backend, and its drain waits
    // until then (Cluster::MayPublish; docs/consistency.md, "Joining").
    if (!unreachable.empty() || !d->cluster->Join())
      LOG_WARN("cluster {}: node {} has not joined ({}); it serves its memory tier, and its drain waits until it "
               "has (retried every heartbeat)",
               cfg.cluster, cfg.node, d->cluster->Status().publish_blocked_reason);
    d->drainer->set_cluster(d->cluster.get());
    Drainer* dr = d->drainer.get();
    d->cluster->SetOnChange([dr] { dr->ClusterChanged(); });
  }

  // fsname is what /proc/mounts shows: the display form, with the ',' and
  // '\\' that libfuse's option parser would split on escaped.
  std::string fsname = "ckptfs:";
  for (char c : cfg.backend_display) {
    if (c == ',' || c == '\\') fsname += '\\';
    fsname += c;
  }
  std::string opts = "fsname=" + fsname + ",subtype=ckptfs,default_permissions";
  if (geteuid() == 0) opts += ",allow_other";
  std::vector<std::string> args = {"ckptfs", "-o", opts};
  if (!cfg.fuse_opts.empty()) {
    args.push_back("-o");
    args.push_back(cfg.fuse_opts);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &FuseOps(), sizeof(fuse_lowlevel_ops), d.get());
  if (!se) return fail_joined("invalid FUSE options: " + cfg.fuse_opts);
  if (fuse_set_signal_handlers(se) != 0) return fail_joined("cannot install signal handlers");
  // The kernel offers io_uring in the INIT it sends while mounting.
  if (cfg.io_uring) (void)FuseUring::Enable();
  reply_yield::Setup(cfg.reply_yield);
  if (fuse_session_mount(se, cfg.mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return fail_joined("cannot mount at " + cfg.mountpoint + " (is /dev/fuse available? see " + cfg.state_dir +
                       "/ckptfs.log)");
  }
  // Passthrough is negotiated at INIT, through libfuse's custom I/O hooks.
  d->channel = std::make_unique<FuseChannel>(se, cfg.passthrough, cfg.io_uring);
  if (d->channel->Install()) d->table->set_backing(d->channel.get());
  static_assert(Config::kPreallocAuto == InodeTable::kPreallocAuto, "--prealloc auto means the same to both");
  d->table->core().residency.set_prealloc(cfg.prealloc);
  if (auto st = d->tier->WriteOwner(OwnerJson(cfg)); !st)
    LOG_WARN("tier {}: cannot record its owner: {} (`ckptfs gc` will not know it)", cfg.tier_dir, strerror(st.error()));
  cache::TierStats ts = d->tier->Stats();
  LOG_INFO("mounted {} backend={} state={} tier={} budget={} in tier={} max_file_size={}", cfg.mountpoint,
           cfg.backend_display, cfg.state_dir, cfg.tier_dir, ts.budget, ts.used, cfg.max_file_size);
  if (cfg.persist_every > 0 || cfg.persist_interval_s > 0 || cfg.keep_in_memory > 0)
    LOG_INFO("checkpoint policies: persist every {} / every {} s, keep {} in memory (0: off)", cfg.persist_every,
             cfg.persist_interval_s, cfg.keep_in_memory);
  if (!cfg.metrics.empty()) {
    auto a = ParseMetricsAddress(cfg.metrics);
    if (!a) return fail_joined(a.error());
    d->metrics = std::make_unique<MetricsServer>(d.get());
    std::string why;
    if (auto st = d->metrics->Start(a->first, a->second, &why); !st) {
      fuse_session_unmount(se);
      fuse_remove_signal_handlers(se);
      fuse_session_destroy(se);
      return fail_joined("--metrics: " + why);
    }
    LOG_INFO("metrics: http://{}:{}/metrics", a->first, a->second);
  }
  std::string report = "OK";
  if (!unreachable.empty()) {
    std::string w = "backend unreachable (" + unreachable +
                    "); mounted degraded: everything in the memory tier is served, new writes are kept, and the "
                    "drain retries until the backend is back (`ckptfs status`)";
    LOG_WARN("{}", w);
    d->drainer->MarkUnreachable(unreachable);
    report += "\nwarning: " + w;
  }
  if (report_fd >= 0) {
    (void)!write(report_fd, report.data(), report.size());
    close(report_fd);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    // Test knob: CKPTFS_DAEMON_STDERR=PREFIX keeps stderr, appended to
    // PREFIX.<pid>. UBSan beside ASan (make SAN=address) reports only there:
    // it ignores log_path, which its copy of the sanitizer runtime loses to
    // ASan's (docs/testing.md).
    int err = -1;
    if (const char* p = getenv("CKPTFS_DAEMON_STDERR"); p && *p)
      err = open((std::string(p) + "." + std::to_string(getpid())).c_str(),
                 O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    dup2(err >= 0 ? err : null, 2);
    if (err > 2) close(err);
    if (null > 2) close(null);
  }
  if (d->cluster) {
    LOG_INFO("cluster {}: node {} (heartbeat 500 ms, {} ms while busy, member timeout {} s, max clock skew {} ms)",
             cfg.cluster, cfg.node, cfg.backend.kind == BackendUrl::Kind::kS3 ? 100 : 25, cfg.member_timeout_s,
             cfg.max_clock_skew_ms);
    d->cluster->Start();
    if (d->etcd_names) d->etcd_names->Start();
    if (d->replica_peers) d->replica_peers->Start();
    if (d->replicator) d->replicator->Start();
    if (d->takeover) d->takeover->Start();
  }
  d->drainer->Start();
  const uint64_t min_free = cfg.min_free == Config::kMinFreeAuto ? DefaultMinFree() : cfg.min_free;
  if (min_free > 0) {
    d->memory_watch = std::make_unique<MemoryWatch>(&d->table->core().residency, min_free);
    d->memory_watch->Start();
  }
  // The housekeeper, every 50 ms: passthrough writers fill the tier
  // without the daemon, so what they wrote is counted and clean files are
  // evicted if the tier is over its budget (also after they closed: what
  // they left is evictable once drained); every 5 s the metrics textfile;
  // every second, if the drain applied anything, the checkpoints that
  // became persisted go to history.csv.
  std::atomic<bool> stop_watch{false};
  d->history = std::make_unique<History>(cfg.state_dir + "/history.csv");
  std::thread housekeeper([&] {
    uint64_t history_seen = 0;
    bool textfile_warned = false;
    for (uint64_t tick = 0; !stop_watch.load(); tick++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      try {
        d->table->RelieveOverBudget();
        if (d->replica_store) MakeRoomForReplicas(d.get());
        if (!cfg.metrics_textfile.empty() && tick % 100 == 0)  // every 5 s
          if (auto st = WriteMetricsTextfile(d.get(), cfg.metrics_textfile); !st && !textfile_warned) {
            textfile_warned = true;
            LOG_WARN("metrics: cannot write {}: {}", cfg.metrics_textfile, strerror(st.error()));
          }
        if (uint64_t applied = d->table->core().oplog.AppliedSeq(); tick % 20 == 0 && applied != history_seen) {
          history_seen = applied;
          d->history->Observe(d->table->Checkpoints(d->checkpoint_pattern));
        }
      } catch (const std::exception& e) {
        LOG_ERROR("internal error in the housekeeper: {}", e.what());
      }
    }
  });
  // Spares (RefillSpares) are made on a thread of their own at the
  // stagers' lower priority: warming their pages is a pass over memory
  // that must never take a CPU from a trainer's step or a FUSE reply, and
  // that must not hold up the housekeeper above for as long as it runs.
  std::thread spare_maker([&] {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kStagerNice) != 0)
      LOG_DEBUG("spares: cannot lower the thread's priority: {}", strerror(errno));
    while (!stop_watch.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      try {
        d->table->RefillSpares();  // not beside a writer that is writing (Residency::WritersIdle)
      } catch (const std::exception& e) {
        LOG_ERROR("internal error in the spare maker: {}", e.what());
      }
    }
  });
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(lc, 0);
  fuse_loop_cfg_set_max_threads(lc, 16);
  int rc = fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  // No request is handled from here on, from /dev/fuse or the rings; the
  // rings still carry the replies of those answered later, which the
  // stops below give up (an error to each caller).
  d->channel->StopUringDispatch();
  stop_watch = true;
  housekeeper.join();
  spare_maker.join();
  if (d->memory_watch) d->memory_watch->Stop();
  if (d->metrics) d->metrics->Stop();
  d->tier->Close();  // writes still waiting for space give up
  if (d->space_waiter) d->space_waiter->Stop();
  if (d->copier) d->copier->Stop();
  d->table->Shutdown();  // fetches and fsync waits still pending give up
  // From here on a thread may be stuck in a backend call: bounded.
  ShutdownWatch watch(kShutdownBound, se, cfg.mountpoint);
  if (d->fetcher) d->fetcher->Stop();
  // False: drain threads are still in backend calls, and may use the
  // table, the store and the backend when a call returns: nothing of the
  // daemon is destroyed, and the process ends below.
  const bool drain_stopped = d->drainer->Stop();
  // Every thread that replies has stopped (the space waiter, copier,
  // fetchers and drain above; libfuse's workers with the loop): the rings
  // can go. Freed at the end of the loop, they were written after free by
  // the replies of those stops. With a drain thread stuck in the backend
  // they stay (the process ends without freeing anything).
  if (drain_stopped) d->channel->StopUring();
  if (d->cluster) {
    // Nothing pending: the others need not wait for this node any more.
    // Else its record stays live and ages into dead (its files listed lost
    // by the others) unless it mounts again first.
    d->cluster->Stop();
    const bool left = drain_stopped && d->cluster->Leave();
    if (d->replicator) {
      if (!d->etcd_names) d->table->core().oplog.set_observer(nullptr);
      d->table->SetReplicated(nullptr);
      d->table->core().residency.set_busy(nullptr);
      d->replicator->Stop();
    }
    if (d->takeover) d->takeover->Stop();
    if (d->replica_peers) d->replica_peers->Stop();
    if (d->peer_loads) d->peer_loads->Attach(nullptr, nullptr);  // waits for this node's loads in flight
    d->replica_link.reset();  // other members' requests stop here; what it holds stays for a restart
    if (d->etcd_names) {
      d->table->core().oplog.set_observer(nullptr);  // nothing is logged any more: the loop ended
      d->table->core().announce_names = nullptr;
      d->etcd_names->Stop();
      d->etcd_names->Sweep();  // the names of files persisted at the end
    }
    if (d->etcd_records) d->etcd_records->Close(left);  // left: its lease revoked, its record gone
    if (left) LOG_INFO("cluster {}: node {} left (nothing pending)", cfg.cluster, cfg.node);
    else
      LOG_INFO("cluster {}: node {} stopped with files not persisted; the other members wait for it until it is back "
               "or its heartbeat is {} s old", cfg.cluster, cfg.node, cfg.member_timeout_s);
  }
  if (d->release_tier && drain_stopped) ReleaseTier(d.get());
  watch.Done();
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  LOG_INFO("unmounted {}", cfg.mountpoint);
  if (!drain_stopped) {
    (void)d.release();  // see drain_stopped
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
    _exit(1);
  }
  spdlog::shutdown();
  return rc == 0 ? 0 : 1;
}

}  // namespace ckpt::fs
