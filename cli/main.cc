// main.cc — the ckptfs command: parses the command line (CLI11) and runs one
// of the client commands of cli/commands.h (mount, umount, drain, status,
// lost). The daemon itself starts in fs/daemon.cc (RunDaemon).
//
// A command-line error is one line on stderr (exit 2); no message quotes a
// URL's userinfo back (RedactUserinfo).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <tuple>

#include "cli/commands.h"
#include "common/config.h"

int main(int argc, char** argv) {
  using namespace ckpt;
  using namespace ckpt::cli;
  CLI::App app{"ckptfs: a checkpoint filesystem that acknowledges writes at memory speed"};
  app.require_subcommand(1);
  Config cfg;
  std::string cache_size, max_file_size, fsync_mode = "memory", prealloc = "auto", min_free = "auto";
  auto* mount = app.add_subcommand("mount", "mount ckptfs at MOUNTPOINT");
  mount->add_option("mountpoint", cfg.mountpoint, "where to mount")->required();
  mount->add_option("--backend", cfg.backend_raw, "backend: /path, file:///path or s3://bucket/prefix")->required();
  auto* cache_opt =
      mount->add_option("--cache-size", cache_size, "memory tier budget (e.g. 8G, 25%); default 1/4 of RAM");
  auto* max_file_opt = mount->add_option("--max-file-size", max_file_size,
                                         "largest file (e.g. 64G, at least 1M); default 4 x the budget");
  mount->add_option("--state-dir", cfg.state_dir, "metadata and log directory");
  mount->add_option("--tier-dir", cfg.tier_dir, "memory tier directory (default /dev/shm/ckptfs-<id>)");
  mount->add_option("--fsync", fsync_mode, "memory|backend")->check(CLI::IsMember({"memory", "backend"}));
  mount->add_option("--prealloc", prealloc,
                    "tier pages allocated ahead for passthrough writers: auto (from the files written), a size, or 0");
  std::string tier_huge;
  auto* tier_huge_opt = mount->add_option("--tier-huge", tier_huge,
                    "on: the tier directory gets a tmpfs of its own with 2 MiB pages (as root, on tmpfs): faster reads "
                    "and large writes, slower saves of fresh small files; off (default): 4 KiB pages")->check(CLI::IsMember({"on", "off"}));
  mount->add_option("--min-free", min_free,
                    "available memory to keep: below it persisted files are evicted and writes wait; auto (4% of "
                    "RAM or of the memory cgroup's limit), a size, or 0 (off)");
  mount->add_option("--metrics", cfg.metrics, "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9105)");
  mount->add_option("--metrics-textfile", cfg.metrics_textfile,
                    "write the metrics to PATH every 5 s (node_exporter's textfile collector)");
  mount->add_option("--checkpoint-regex", cfg.checkpoint_regex,
                    "names of checkpoint directories and files, for ckptfs ls/latest (ECMAScript, whole name)");
  std::string keep_in_memory, persist_every, persist_interval;
  auto* keep_opt = mount->add_option("--keep-in-memory", keep_in_memory,
                    "K: the newest K checkpoints stay in RAM when clean; older ones are evicted first");
  auto* every_opt = mount->add_option("--persist-every", persist_every,
                    "N: only every Nth checkpoint (in order of creation) drains; the others stay memory-only");
  auto* interval_opt = mount->add_option("--persist-interval", persist_interval,
                    "SECONDS: a checkpoint drains when SECONDS passed since the last one that did; the others stay "
                    "memory-only");
  std::string shared_ttl;
  auto* shared_ttl_opt = mount->add_option("--shared-ttl", shared_ttl,
                    "SECONDS (default 1): mounts over one backend see each other's persisted files, at most this "
                    "stale (a miss asks the backend, readdir merges its listing); 0: off");
  std::string drain_yield;
  auto* drain_yield_opt = mount->add_option("--drain-yield", drain_yield,
                    "MS (default 1000): the drain starts no transfer while a save is under way, for at most MS in one "
                    "busy stretch; 0: it never waits");
  std::string member_timeout, max_clock_skew;
  auto* cluster_opt = mount->add_option("--cluster", cfg.cluster,
                    "NAME: order persistence with every other mount of this cluster over the same backend (a file "
                    "closed after a barrier reaches it after the files other nodes closed before)");
  auto* node_opt = mount->add_option("--node", cfg.node, "ID of this mount in the cluster (default: hostname-<hash of the state dir>)");
  mount->add_option("--member-timeout", member_timeout,
                    "SECONDS without a heartbeat after which a member is dead: ignored, its unpersisted files lost "
                    "(default 60)");
  mount->add_option("--max-clock-skew", max_clock_skew,
                    "MS: how far apart the nodes' clocks may be (default 50, NTP); the ordering margin");
  auto* store_opt = mount->add_option(
      "--cluster-store", cfg.cluster_store,
      "etcd://HOST:PORT[,HOST:PORT...] (or etcds:// for TLS): keep the cluster's membership and records "
      "in etcd (leases, one digest watched by all) instead of the backend: for hundreds to thousands "
      "of nodes");
  mount->add_option("--cluster-store-user", cfg.cluster_store_user, "USER of the etcd cluster store (auth)");
  mount->add_option("--cluster-store-password-file", cfg.cluster_store_password_file,
                    "FILE holding that user's password (mode 0600; never on the command line)");
  mount->add_option("--cluster-store-ca", cfg.cluster_store_ca, "FILE: CA certificates for etcds://");
  mount->add_option("--cluster-store-cert", cfg.cluster_store_cert, "FILE: TLS client certificate for etcds://");
  mount->add_option("--cluster-store-key", cfg.cluster_store_key, "FILE: its private key (mode 0600)");
  std::string replicas, replica_budget, replica_group, peer_fanout;
  auto* replicas_opt =
      mount->add_option("--replicas", replicas,
                        "K (0 to 8, default 0): stream every closed file into the memory of K other members (needs "
                        "--cluster-store, --replica-listen and --cluster-secret); dropped there once persisted");
  auto* listen_opt = mount->add_option("--replica-listen", cfg.replica_listen,
                                       "HOST:PORT where this node takes other members' replicas (HOST: an address "
                                       "the other nodes reach; advertised through the cluster store)");
  auto* secret_opt = mount->add_option("--cluster-secret", cfg.cluster_secret,
                                       "FILE (mode 0600, 16 bytes or more): the secret every member's replica link "
                                       "proves it holds");
  auto* rbudget_opt = mount->add_option("--replica-budget", replica_budget,
                                        "SIZE of other members' replicas this node holds at most (default: a quarter "
                                        "of --cache-size)");
  auto* rgroup_opt = mount->add_option(
      "--replica-group", replica_group,
      "N (default 8): members whose --node ids end in numbers of one run of N (gpu-0..gpu-7, gpu-8..) share a "
      "rack; a file's copies go to other racks first");
  auto* fanout_opt = mount->add_option(
      "--peer-fanout", peer_fanout,
      "N (default 4; 0: no tree): members loading one file that a member serves itself; the next ones are sent "
      "to members that already have it (a tree: a restart of many nodes reads the backend once, and each member "
      "serves about N copies)");
  mount->add_flag("--foreground,-f", cfg.foreground, "do not daemonize; log to stderr too");
  mount->add_option("-o", cfg.fuse_opts, "FUSE mount options, and passthrough=off (every read and write through the daemon), io_uring=off (requests through /dev/fuse), reply_yield=off (callers may move to an idle CPU at each reply; see docs/operations.md)");
  mount->add_option("--log-level", cfg.log_level, "trace|debug|info|warn|error");
  mount->add_option("--s3-endpoint", cfg.s3_endpoint,
                    "S3 endpoint URL, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL, else AWS)");

  std::string target;
  bool no_drain = false, lazy = false, json = false, clear = false;
  double timeout_s = 0;
  auto* umount = app.add_subcommand("umount", "drain, then unmount a ckptfs mount");
  umount->add_option("mountpoint", target)->required();
  umount->add_flag("--no-drain", no_drain, "do not wait for the drain");
  umount->add_flag("--lazy,-l", lazy, "detach even if busy");
  bool keep_cache = false, force = false, dry_run = false;
  umount->add_flag("--keep-cache", keep_cache, "keep the memory tier for a quick remount (default: give it back)");
  std::vector<std::string> gc_dirs;
  auto* gc = app.add_subcommand("gc", "list memory tiers no daemon holds; remove those whose files are all persisted");
  gc->add_option("tier_dirs", gc_dirs, "tier directories (default: every /dev/shm/ckptfs-*)");
  gc->add_flag("--force", force, "remove them even if they hold files not in the backend (those are lost)");
  gc->add_flag("--dry-run,-n", dry_run, "list only, remove nothing");
  gc->add_flag("--json", json, "machine-readable output");
  auto* ls = app.add_subcommand("ls", "list the checkpoints: files, bytes, state, closed at, time to RAM and durable");
  ls->add_option("mountpoint", target)->required();
  ls->add_flag("--json", json, "machine-readable output");
  bool persisted = false;
  auto* latest = app.add_subcommand("latest", "print the newest complete checkpoint (exit 1 if none)");
  latest->add_option("mountpoint", target)->required();
  latest->add_flag("--persisted", persisted, "the newest one whose files are all in the backend");
  bool safe = false;
  latest->add_flag("--safe", safe,
                   "the newest one whose files are all in the backend or held by --replicas K peers (it survives "
                   "the loss of this node)");
  std::string persist_path;
  bool wait = false;
  auto* persist = app.add_subcommand("persist", "drain a memory-only checkpoint after all (--persist-every)");
  persist->add_option("path", persist_path, "the checkpoint (or a file in it) in a ckptfs mount")->required();
  persist->add_flag("--wait", wait, "wait until it is in the backend (as ckptfs drain)");
  bool csv = false;
  auto* history = app.add_subcommand("history", "checkpoints as they became persisted: times to RAM and durable");
  history->add_option("mountpoint", target)->required();
  history->add_flag("--csv", csv, "the CSV itself (STATE_DIR/history.csv)");
  std::vector<std::string> warm_paths;
  auto* warmup = app.add_subcommand("warmup", "fetch remote files into RAM ahead of a restart (within the budget)");
  warmup->add_option("paths", warm_paths, "files or directories in one ckptfs mount")->required();
  auto* status = app.add_subcommand("status", "show what is in memory, draining and safe");
  status->add_option("mountpoint", target)->required();
  status->add_flag("--json", json, "machine-readable output");
  auto* drain = app.add_subcommand("drain", "wait until everything closed so far is persisted");
  drain->add_option("mountpoint", target)->required();
  // CLI::NonNegativeNumber lets "nan" through (no comparison with it is
  // true): the drain then never timed out.
  const CLI::Validator finite(
      [](std::string& in) {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        return end != in.c_str() && *end == '\0' && std::isfinite(v) && v >= 0
                   ? std::string()
                   : "'" + in + "' is not a number of seconds (0 or more; 0: no limit)";
      },
      "SECONDS");
  drain->add_option("--timeout", timeout_s, "give up after SECONDS (exit 1; 0: never)")->check(finite);
  std::string skip_path;
  auto* skip = app.add_subcommand("skip", "give up on the file the drain holds at (the backend refuses it for good)");
  skip->add_option("mountpoint", target)->required();
  skip->add_option("path", skip_path, "the held file, as `ckptfs status` names it (relative to the mount)")
      ->required();
  auto* lost = app.add_subcommand("lost", "list every file lost at a node reboot (or clear the list)");
  lost->add_option("mountpoint", target)->required();
  lost->add_flag("--json", json, "machine-readable output");
  lost->add_flag("--clear", clear, "clear the list (root or the mount's owner)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 may quote an argument back (an unexpected positional): never
    // a URL's userinfo.
    fprintf(stderr, "ckptfs: %s (see ckptfs --help)\n", RedactUserinfo(e.what()).c_str());
    return 2;
  }
  cfg.fsync = fsync_mode == "backend" ? FsyncMode::kBackend : FsyncMode::kMemory;
  if (*tier_huge_opt) cfg.tier_huge = tier_huge == "on";
  if (prealloc == "0") {
    cfg.prealloc = 0;
  } else if (prealloc != "auto") {
    auto sz = ParseSize(prealloc);
    if (!sz) {
      fprintf(stderr, "ckptfs: --prealloc: %s\n", sz.error().c_str());
      return 2;
    }
    cfg.prealloc = *sz;
  }
  if (min_free != "auto") {
    auto sz = min_free == "0" ? std::expected<uint64_t, std::string>(0) : ParseSize(min_free);
    if (!sz) {
      fprintf(stderr, "ckptfs: --min-free: %s\n", sz.error().c_str());
      return 2;
    }
    cfg.min_free = *sz;
  }
  // The numeric options. The policies, --shared-ttl and --drain-yield
  // given empty ('') are refused, not taken as unset; the cluster's
  // timings given empty are ignored.
  using Parser = std::expected<uint64_t, std::string> (*)(const std::string&);
  struct Number {
    const char* flag;
    bool given;
    const std::string* text;
    Parser parse;
    uint64_t* out;
  };
  for (const Number& o :
       {Number{"--keep-in-memory", keep_opt->count() > 0, &keep_in_memory, ParseCount, &cfg.keep_in_memory},
        Number{"--persist-every", every_opt->count() > 0, &persist_every, ParseCount, &cfg.persist_every},
        Number{"--persist-interval", interval_opt->count() > 0, &persist_interval, ParseCount, &cfg.persist_interval_s},
        Number{"--shared-ttl", shared_ttl_opt->count() > 0, &shared_ttl, ParseTtl, &cfg.shared_ttl_s},
        Number{"--drain-yield", drain_yield_opt->count() > 0, &drain_yield, ParseMillis, &cfg.drain_yield_ms},
        Number{"--member-timeout", !member_timeout.empty(), &member_timeout, ParseCount, &cfg.member_timeout_s},
        Number{"--max-clock-skew", !max_clock_skew.empty(), &max_clock_skew, ParseMillis, &cfg.max_clock_skew_ms},
        Number{"--replicas", replicas_opt->count() > 0, &replicas, ParseCountOrZero, &cfg.replicas},
        Number{"--replica-group", rgroup_opt->count() > 0, &replica_group, ParseCount, &cfg.replica_group},
        Number{"--peer-fanout", fanout_opt->count() > 0, &peer_fanout, ParseCountOrZero, &cfg.peer_fanout}}) {
    if (!o.given) continue;
    auto v = o.parse(*o.text);
    if (!v) {
      fprintf(stderr, "ckptfs: %s: %s\n", o.flag, v.error().c_str());
      return 2;
    }
    *o.out = *v;
  }
  cfg.cluster_opts_given = cfg.cluster_opts_given || node_opt->count() > 0 || !member_timeout.empty() ||
                           !max_clock_skew.empty() || store_opt->count() > 0 || !cfg.cluster_store_user.empty() ||
                           !cfg.cluster_store_password_file.empty() || !cfg.cluster_store_ca.empty() ||
                           !cfg.cluster_store_cert.empty() || !cfg.cluster_store_key.empty() ||
                           replicas_opt->count() > 0 || listen_opt->count() > 0 || secret_opt->count() > 0 ||
                           rbudget_opt->count() > 0 || rgroup_opt->count() > 0 || fanout_opt->count() > 0;
  if (auto own = TakeOwnOptions(&cfg.fuse_opts, &cfg); !own) {
    fprintf(stderr, "ckptfs: %s\n", own.error().c_str());
    return 2;
  }
  for (auto [opt, val, flag] : {std::tuple{cluster_opt, &cfg.cluster, "--cluster"}, std::tuple{node_opt, &cfg.node, "--node"}})
    if (opt->count() > 0 && val->empty() && (opt == cluster_opt || !cfg.cluster.empty())) {
      fprintf(stderr, "ckptfs: %s: want 1 to 64 of A-Z a-z 0-9 . _ - (first a letter or digit), not ''\n", flag);
      return 2;
    }
  try {
    if (*mount) {
      SizeArgs sizes;
      if (cache_opt->count() > 0) sizes.cache_size = cache_size;
      if (max_file_opt->count() > 0) sizes.max_file_size = max_file_size;
      if (rbudget_opt->count() > 0) sizes.replica_budget = replica_budget;
      return CmdMount(cfg, sizes);
    }
    if (*umount) return CmdUmount(target, UmountArgs{no_drain, lazy, keep_cache});
    if (*gc) return CmdGc(gc_dirs, force, dry_run, json);
    if (*warmup) return CmdWarmup(warm_paths);
    if (*ls) return CmdLs(target, json);
    if (*history) return CmdHistory(target, csv);
    if (*latest) {
      if (persisted && safe) {
        fprintf(stderr, "ckptfs: latest: --persisted or --safe, not both\n");
        return 2;
      }
      return CmdLatest(target, persisted ? "persisted" : safe ? "safe" : "complete");
    }
    if (*persist) return CmdPersist(persist_path, wait);
    if (*drain) return CmdDrain(target, timeout_s);
    if (*status) return CmdStatus(target, json);
    if (*lost) return CmdLost(target, json, clear);
    if (*skip) return CmdSkip(target, skip_path);
  } catch (const std::exception& e) {
    // Nothing should throw here; if something does, one line, not an abort.
    fprintf(stderr, "ckptfs: internal error: %s\n", RedactUserinfo(e.what()).c_str());
    return 1;
  }
  return 2;
}
