// mount.cc — the parent side of `ckptfs mount`: checks the command line,
// the mount point, the backend directory and the sizes, makes the state dir
// private, then forks the daemon (fs/daemon.cc, RunDaemon) and returns once
// it reports the mount ready, or prints why not.
//
// Every user error is one line on stderr and a non-zero exit, and leaves
// nothing mounted. The daemon reports its start-up result to the waiting
// parent over a pipe, so failures after the fork still reach the user.
//
// The daemon runs as root on shared nodes, so every input is hostile until
// checked: no path goes through a shell (RunCommand), credentials in the
// backend URL are refused without being echoed and only the URL's display
// form is ever shown, and the state dir and its files are private
// (0700/0600, umask 077).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "cli/commands.h"
#include "common/log.h"
#include "common/spawn.h"
#include "common/text.h"
#include "fs/cluster/etcd_client.h"
#include "fs/cluster/replica_wire.h"
#include "fs/daemon.h"
#include "fs/views/metrics.h"

namespace ckpt::cli {
namespace {

namespace stdfs = std::filesystem;

std::string DefaultStateDir(const std::string& mnt) {
  std::string base;
  if (geteuid() == 0) base = "/var/lib/ckptfs";
  else if (const char* x = getenv("XDG_STATE_HOME")) base = std::string(x) + "/ckptfs";
  else base = std::string(getenv("HOME") ? getenv("HOME") : "/tmp") + "/.local/state/ckptfs";
  return base + "/" + HexHash(mnt);
}

// A command-line error about an option's value: one line, exit 2 (as the
// parser's own errors in main.cc).
[[noreturn]] void BadOption(const std::string& msg) {
  fprintf(stderr, "ckptfs: %s\n", msg.c_str());
  exit(2);
}

// --replicas, --replica-listen and --cluster-secret (issue #30): one line
// and exit 2 for anything wrong with them. Replicas need the etcd store
// (it tells where the members listen); a node may hold other members'
// replicas (--replica-listen) without sending its own (--replicas 0).
void CheckReplicas(Config& cfg) {
  const bool any = cfg.replicas > 0 || !cfg.replica_listen.empty() || !cfg.cluster_secret.empty();
  if (!any) return;
  if (cfg.cluster_store.empty())
    BadOption("--replicas, --replica-listen and --cluster-secret need --cluster-store etcd://...");
  if (cfg.replicas > 8) BadOption("--replicas: at most 8, not " + std::to_string(cfg.replicas));
  if (cfg.replica_listen.empty()) BadOption("--replicas and --cluster-secret need --replica-listen HOST:PORT");
  if (cfg.cluster_secret.empty()) BadOption("--replica-listen needs --cluster-secret FILE");
  const std::string& l = cfg.replica_listen;
  const size_t colon = l.rfind(':');
  std::string host = colon == std::string::npos ? "" : l.substr(0, colon), port = l.substr(colon + 1);
  bool port_ok = colon != std::string::npos && !port.empty() && port.size() <= 5 &&
                 port.find_first_not_of("0123456789") == std::string::npos && std::stoul(port) <= 65535;
  if (host.empty() || !port_ok) BadOption("--replica-listen: want HOST:PORT, not '" + EscapeName(l) + "'");
  if (host == "0.0.0.0" || host == "[::]" || host == "::")
    BadOption("--replica-listen: " + host + " is advertised to the other members as is: give an address they reach");
  cfg.cluster_secret = Absolute(cfg.cluster_secret);
  if (auto sec = fs::replica::LoadSecret(cfg.cluster_secret); !sec)
    BadOption("--cluster-secret: " + EscapeName(cfg.cluster_secret) + " " + sec.error());
}

// --cluster-store and its credentials: one line and exit 2 for anything
// wrong with them, before anything is mounted. Secrets come from files that
// only their owner may read; their paths are made absolute (the daemon
// reads them after it daemonizes).
void CheckClusterStore(Config& cfg) {
  const bool creds = !cfg.cluster_store_user.empty() || !cfg.cluster_store_password_file.empty() ||
                     !cfg.cluster_store_ca.empty() || !cfg.cluster_store_cert.empty() || !cfg.cluster_store_key.empty();
  if (cfg.cluster_store.empty()) {
    if (creds) BadOption("--cluster-store-user, -password-file, -ca, -cert and -key need --cluster-store");
    return;
  }
  auto eps = fs::etcd::ParseStoreUrl(cfg.cluster_store);
  if (!eps) BadOption("--cluster-store: " + EscapeName(eps.error()));
  const bool tls = cfg.cluster_store.starts_with("etcds://");
  if (!tls && (!cfg.cluster_store_ca.empty() || !cfg.cluster_store_cert.empty() || !cfg.cluster_store_key.empty()))
    BadOption("--cluster-store-ca, -cert and -key need an etcds:// (TLS) --cluster-store");
  if (cfg.cluster_store_user.empty() != cfg.cluster_store_password_file.empty())
    BadOption("--cluster-store-user and --cluster-store-password-file go together");
  if (cfg.cluster_store_cert.empty() != cfg.cluster_store_key.empty())
    BadOption("--cluster-store-cert and --cluster-store-key go together");
  auto check = [](const char* flag, std::string* path, bool secret) {
    if (path->empty()) return;
    *path = Absolute(*path);
    struct stat st;
    if (stat(path->c_str(), &st) != 0) BadOption(std::string(flag) + ": " + EscapeName(*path) + ": " + ErrStr(errno));
    if (!S_ISREG(st.st_mode)) BadOption(std::string(flag) + ": " + EscapeName(*path) + " is not a file");
    if (access(path->c_str(), R_OK) != 0)
      BadOption(std::string(flag) + ": " + EscapeName(*path) + ": " + ErrStr(errno));
    if (secret && (st.st_mode & 077))
      BadOption(std::string(flag) + ": " + EscapeName(*path) + " can be read by others than its owner (chmod 600 it)");
  };
  check("--cluster-store-password-file", &cfg.cluster_store_password_file, true);
  check("--cluster-store-key", &cfg.cluster_store_key, true);
  check("--cluster-store-cert", &cfg.cluster_store_cert, false);
  check("--cluster-store-ca", &cfg.cluster_store_ca, false);
}

// The default node id of a cluster member: the hostname (what fits of it,
// characters outside the id alphabet as '_') and 8 hex digits of a hash of
// the state dir's path, so several mounts on one machine differ and a
// remount with the same state dir is the same member.
std::string DefaultNodeId(const std::string& state_dir) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "node");
  std::string h;
  for (const char* p = host; *p && h.size() < 55; p++)
    h += isalnum(static_cast<unsigned char>(*p)) || *p == '.' || *p == '-' || *p == '_' ? *p : '_';
  if (!isalnum(static_cast<unsigned char>(h[0]))) h = "n" + h.substr(0, 54);
  return h + "-" + HexHash(state_dir).substr(0, 8);
}

// Checks the mount point: an existing, empty directory with nothing mounted
// on it. A dead ckptfs mount (daemon killed) is cleaned up here.
void CheckMountpoint(const std::string& mnt) {
  // A killed daemon leaves its mount behind. stat() may still answer from
  // the kernel's attribute cache; statfs always goes to the daemon, so it
  // tells a dead mount (ENOTCONN) from a live one.
  if (MountedType(mnt) == "fuse.ckptfs") {
    // A daemon killed a moment ago: its requests are cancelled (ECANCELED
    // over io_uring), then aborted (ECONNABORTED), for a few ms before the
    // connection says ENOTCONN. Measured: 5–10 ms after kill -9.
    struct statvfs sv;
    int rc = statvfs(mnt.c_str(), &sv);
    for (int i = 0; i < 500 && rc != 0 && (errno == ECANCELED || errno == ECONNABORTED); i++) {
      usleep(10000);
      rc = statvfs(mnt.c_str(), &sv);
    }
    if (rc == 0 || errno != ENOTCONN) Die("mount point " + mnt + " is already mounted (fuse.ckptfs)");
    if ((RunCommand({"fusermount3", "-uz", mnt}) != 0 && RunCommand({"umount", "-l", mnt}) != 0) ||
        !MountedType(mnt).empty())
      Die("mount point " + mnt + " is a dead ckptfs mount and could not be detached; run: fusermount3 -uz " + mnt);
    fprintf(stderr, "ckptfs: detached the dead ckptfs mount at %s\n", mnt.c_str());
  }
  struct stat st;
  if (stat(mnt.c_str(), &st) != 0) {
    int e = errno;
    if (e == ENOENT) Die("mount point " + mnt + " does not exist");
    Die("mount point " + mnt + ": " + ErrStr(e));
  }
  if (!S_ISDIR(st.st_mode)) Die("mount point " + mnt + " is not a directory");
  std::string type = MountedType(mnt);
  if (!type.empty()) Die("mount point " + mnt + " is already mounted (" + type + ")");
  std::error_code ec;
  auto it = stdfs::directory_iterator(mnt, ec);
  if (ec) Die("mount point " + mnt + ": " + ec.message());
  if (it != stdfs::directory_iterator()) Die("mount point " + mnt + " is not empty");
}

void CheckWritableDir(const std::string& what, const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) Die(what + " " + dir + " does not exist");
  if (!S_ISDIR(st.st_mode)) Die(what + " " + dir + " is not a directory");
  // A random name (mkostemp: O_EXCL, tried again when taken): one made of
  // the pid let anyone who can write there make the mount fail.
  std::string probe = dir + "/.ckptfs-probe-XXXXXX";
  int fd = mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0) Die(what + " " + dir + " is not writable: " + ErrStr(errno));
  close(fd);
  unlink(probe.c_str());
}

// Tightens what an earlier version left readable in the state dir: every
// file directly in `fd`'s directory, or one level down (meta/), owned by us
// becomes 0600, every directory 0700. Symlinks are never followed.
void TightenTree(int dirfd, int depth) {
  int dup = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return;
  DIR* dir = fdopendir(dup);
  if (!dir) {
    close(dup);
    return;
  }
  while (dirent* e = readdir(dir)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    int fd = openat(dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid()) {
      if (S_ISDIR(st.st_mode)) {
        if ((st.st_mode & 07777) != 0700) (void)!fchmod(fd, 0700);
        if (depth > 0) TightenTree(fd, depth - 1);
      } else if (S_ISREG(st.st_mode) && (st.st_mode & 077) != 0) {
        (void)!fchmod(fd, st.st_mode & 0700);
      }
    }
    close(fd);
  }
  closedir(dir);
}

// Makes the state dir private to this daemon's user: created 0700 (its
// parents with the usual mode), an existing one of ours chmod-ed to 0700
// and what it holds tightened. Refused: a state dir owned by another user,
// or one that is itself a symbolic link owned by another user (whoever owns
// the link decides where the metadata and log go; links owned by us or by
// root are followed). Then checks it is writable.
void PrepareStateDir(const std::string& dir) {
  std::error_code ec;
  stdfs::path parent = stdfs::path(dir).parent_path();
  if (!parent.empty()) stdfs::create_directories(parent, ec);
  if (ec) Die("cannot create state dir " + dir + ": " + ec.message());
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) Die("cannot create state dir " + dir + ": " + ErrStr(errno));
  struct stat lst;
  if (lstat(dir.c_str(), &lst) != 0) Die("state dir " + dir + ": " + ErrStr(errno));
  if (S_ISLNK(lst.st_mode) && lst.st_uid != geteuid() && lst.st_uid != 0)
    Die("state dir " + dir + " is a symbolic link owned by uid " + std::to_string(lst.st_uid) +
        "; give the directory itself");
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    Die(errno == ENOTDIR ? "state dir " + dir + " is not a directory" : "state dir " + dir + ": " + ErrStr(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) Die("state dir " + dir + ": " + ErrStr(errno));
  if (st.st_uid != geteuid())
    Die("state dir " + dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this daemon (uid " +
        std::to_string(geteuid()) + ")");
  if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0)
    Die("cannot make state dir " + dir + " private (chmod 0700): " + ErrStr(errno));
  TightenTree(fd, 1);
  close(fd);
  CheckWritableDir("state dir", dir);
}

// Bytes allocated by the files directly in `dir` (a tier left by an
// earlier mount); 0 if it does not exist.
uint64_t DirAllocated(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    struct stat st;
    if (lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) n += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return n;
}

// Whether the state dir already holds metadata (the daemon checks that it
// belongs to this backend). Computed before PrepareStateDir, from the
// default or given path.
bool HasHistory(const Config& cfg) {
  std::string dir = cfg.state_dir.empty() ? DefaultStateDir(Absolute(cfg.mountpoint)) : Absolute(cfg.state_dir);
  struct stat st;
  return stat((dir + "/meta/CURRENT").c_str(), &st) == 0;
}

}  // namespace

int CmdMount(Config cfg, const SizeArgs& sizes) {
  cfg.mountpoint = Absolute(cfg.mountpoint);
  CheckMountpoint(cfg.mountpoint);
  auto url = ParseBackendUrl(cfg.backend_raw);
  if (!url) Die(url.error());
  cfg.backend = *url;
  cfg.backend_display = BackendDisplay(cfg.backend, cfg.backend_raw);
  if (cfg.backend.kind == BackendUrl::Kind::kPosix) {
    if (!cfg.s3_endpoint.empty()) Die("--s3-endpoint is for s3:// backends, not " + cfg.backend_display);
    // A state dir with history may mount while its backend is away (the
    // daemon decides: degraded); a fresh one needs a usable backend now.
    if (!HasHistory(cfg)) CheckWritableDir("backend", cfg.backend.path);
  } else {
    // The daemon chdirs to /: relative AWS file paths must not change meaning.
    for (const char* v : {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"})
      if (const char* p = getenv(v); p && *p && *p != '/') setenv(v, Absolute(p).c_str(), 1);
  }
  if (!ValidLogLevel(cfg.log_level)) Die("invalid log level '" + cfg.log_level + "'");
  if (!cfg.metrics.empty())
    if (auto a = fs::ParseMetricsAddress(cfg.metrics); !a) Die(a.error());
  if (!cfg.metrics_textfile.empty()) {
    cfg.metrics_textfile = Absolute(cfg.metrics_textfile);
    std::string parent = stdfs::path(cfg.metrics_textfile).parent_path().string();
    struct stat pst;
    if (stat(parent.c_str(), &pst) != 0 || !S_ISDIR(pst.st_mode))
      Die("--metrics-textfile: directory " + parent + " does not exist");
  }
  try {
    if (cfg.checkpoint_regex.empty()) throw std::regex_error(std::regex_constants::error_collate);
    std::regex re(cfg.checkpoint_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    Die("invalid --checkpoint-regex '" + EscapeName(cfg.checkpoint_regex) + "'" +
        (cfg.checkpoint_regex.empty() ? ": empty" : std::string(": ") + e.what()));
  }
  // Cross-node ordering (fs/cluster/cluster.h). With a checkpoint policy each node
  // would pick its own checkpoints to persist (counted from its own
  // mount), and `latest` could name a step whose shards other nodes kept
  // in memory only: refused.
  if (!cfg.cluster.empty()) {
    if (!fs::ValidClusterName(cfg.cluster))
      BadOption("--cluster: want 1 to 64 of A-Z a-z 0-9 . _ - (first a letter or digit), not '" +
                EscapeName(cfg.cluster) + "'");
    if (!cfg.node.empty() && !fs::ValidClusterName(cfg.node))
      BadOption("--node: want 1 to 64 of A-Z a-z 0-9 . _ - (first a letter or digit), not '" + EscapeName(cfg.node) +
                "'");
    if (cfg.persist_every > 0 || cfg.persist_interval_s > 0)
      BadOption("--cluster cannot go with --persist-every or --persist-interval: each node would choose its own "
                "checkpoints to persist");
    CheckClusterStore(cfg);
    CheckReplicas(cfg);
  } else if (cfg.cluster_opts_given) {
    BadOption(
        "--node, --member-timeout, --max-clock-skew, --cluster-store and the replica options need --cluster "
        "NAME");
  }
  // fsync=backend promises that fsync returns once the bytes are in the
  // backend; a memory-only checkpoint's never are.
  if (cfg.fsync == FsyncMode::kBackend && (cfg.persist_every > 0 || cfg.persist_interval_s > 0))
    Die("--fsync backend cannot go with --persist-every or --persist-interval: memory-only checkpoints never reach "
        "the backend");
  cfg.state_dir = cfg.state_dir.empty() ? DefaultStateDir(cfg.mountpoint) : Absolute(cfg.state_dir);
  PrepareStateDir(cfg.state_dir);
  if (!cfg.cluster.empty() && cfg.node.empty()) cfg.node = DefaultNodeId(cfg.state_dir);
  if (cfg.tier_dir.empty()) cfg.tier_dir = "/dev/shm/ckptfs-" + HexHash(cfg.state_dir);
  cfg.tier_dir = Absolute(cfg.tier_dir);
  std::string tier_parent = stdfs::path(cfg.tier_dir).parent_path().string();
  std::string shown_size;  // the budget as the user gave it, for messages
  if (sizes.cache_size) {
    auto sz = ParseSize(*sizes.cache_size);
    if (!sz) Die("--cache-size: " + sz.error());
    cfg.cache_size = *sz;
    shown_size = *sizes.cache_size;
  } else {
    cfg.cache_size = DefaultCacheSize(tier_parent);
    shown_size = HumanBytes(cfg.cache_size);
  }
  // A budget is a claim on RAM the kernel cannot reclaim (tmpfs): the
  // default never claims more than is available now (plus what the tier
  // already holds); a given size is the operator's, but said.
  std::vector<std::string> warnings;
  if (uint64_t avail = MemAvailable(); avail > 0) {
    uint64_t in_tier = DirAllocated(cfg.tier_dir);
    if (uint64_t cap = CapToAvailable(cfg.cache_size, avail, in_tier); cap < cfg.cache_size) {
      std::string w;
      if (sizes.cache_size) {
        w = "cache size " + shown_size + " is more than the memory available now (" + HumanBytes(avail) +
            "); writers will wait for the drain sooner than the budget says";
      } else {
        w = "default cache size " + shown_size + " is more than the memory available now (" + HumanBytes(avail) +
            "); using " + HumanBytes(std::max<uint64_t>(cap, 1u << 20)) + " (--cache-size sets it)";
        cfg.cache_size = std::max<uint64_t>(cap, 1u << 20);
        shown_size = HumanBytes(cfg.cache_size);
      }
      fprintf(stderr, "ckptfs: warning: %s\n", w.c_str());
      warnings.push_back(w);
    }
  }
  if (cfg.cache_size < (1u << 20)) Die("cache size " + shown_size + " is too small (minimum 1M)");
  // A budget the tier's filesystem cannot hold fails writes with ENOSPC
  // while clean files could still have been evicted: cap it.
  if (uint64_t fs_size = FilesystemSize(cfg.tier_dir); fs_size > 0 && cfg.cache_size > TierUsable(fs_size)) {
    uint64_t usable = TierUsable(fs_size);
    if (usable < (1u << 20))
      Die("the filesystem of tier directory " + cfg.tier_dir + " is too small (" + HumanBytes(fs_size) + ")");
    std::string w = "cache size " + shown_size + " is larger than the tier filesystem (" + HumanBytes(fs_size) +
                    "); using " + HumanBytes(usable);
    fprintf(stderr, "ckptfs: warning: %s\n", w.c_str());
    warnings.push_back(w);
    cfg.cache_size = usable;
  }
  if (sizes.replica_budget) {
    auto sz = ParseSize(*sizes.replica_budget);
    if (!sz) Die("--replica-budget: " + sz.error());
    if (*sz < (1u << 20)) Die("--replica-budget " + *sizes.replica_budget + " is too small (minimum 1M)");
    cfg.replica_budget = *sz;
  } else if (!cfg.replica_listen.empty()) {
    cfg.replica_budget = std::max<uint64_t>(cfg.cache_size / 4, 1u << 20);
  }
  if (sizes.max_file_size) {
    if (sizes.max_file_size->find('%') != std::string::npos)
      Die("--max-file-size takes a size such as 64G, not a percentage ('" + *sizes.max_file_size + "')");
    auto sz = ParseSize(*sizes.max_file_size);
    if (!sz) Die("--max-file-size: " + sz.error());
    if (*sz < (1u << 20)) Die("max file size " + *sizes.max_file_size + " is too small (minimum 1M)");
    cfg.max_file_size = *sz;
  } else {
    cfg.max_file_size = std::max<uint64_t>(4 * cfg.cache_size, 1u << 20);
  }

  if (cfg.foreground) return fs::RunDaemon(cfg, -1, warnings);

  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) Die("pipe: " + ErrStr(errno));
  pid_t pid = fork();
  if (pid < 0) Die("fork: " + ErrStr(errno));
  if (pid == 0) {
    close(pfd[0]);
    setsid();
    if (fork() > 0) _exit(0);  // the daemon is not a session leader, and not our child
    (void)!chdir("/");
    _exit(fs::RunDaemon(cfg, pfd[1], warnings));
  }
  close(pfd[1]);
  waitpid(pid, nullptr, 0);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = read(pfd[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  if (msg.rfind("OK", 0) != 0)
    Die(msg.empty() ? "the daemon exited during start-up (see " + cfg.state_dir + "/ckptfs.log)" : msg);
  // "OK", then one warning per line (a degraded mount).
  for (size_t at = msg.find('\n'); at != std::string::npos;) {
    size_t end = msg.find('\n', at + 1);
    fprintf(stderr, "ckptfs: %s\n", msg.substr(at + 1, end == std::string::npos ? end : end - at - 1).c_str());
    at = end;
  }
  printf("ckptfs: mounted %s (backend %s, tier %s in %s, state %s)\n", cfg.mountpoint.c_str(),
         cfg.backend_display.c_str(), HumanBytes(cfg.cache_size).c_str(), cfg.tier_dir.c_str(), cfg.state_dir.c_str());
  return 0;
}

}  // namespace ckpt::cli
