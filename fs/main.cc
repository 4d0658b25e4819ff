// main.cc — the ckptfs command: `mount` starts a daemon and returns once the
// mount is ready (or prints why not); `umount` and `status` talk to a
// running daemon through its mount point.
//
// Every user error is one line on stderr and a non-zero exit, and leaves
// nothing mounted. The daemon reports its start-up result to the waiting
// parent over a pipe, so failures after the fork still reach the user.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "backend/s3_backend.h"
#include "fs/common/failpoint.h"
#include "fs/common/log.h"
#include "fs/daemon.h"

namespace ckpt {
namespace {

namespace stdfs = std::filesystem;

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "ckptfs: %s\n", msg.c_str());
  exit(1);
}

std::string Errno(int e) { return strerror(e); }

// Unescapes the octal escapes of /proc/self/mounts fields.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 3 < s.size() + 0 && isdigit(s[i + 1])) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The filesystem type mounted at `path`, or "" if none.
std::string MountedType(const std::string& path) {
  std::ifstream in("/proc/self/mounts");
  std::string dev, mnt, type, rest, found;
  while (in >> dev >> mnt >> type && std::getline(in, rest))
    if (Unescape(mnt) == path) found = type;
  return found;
}

using Json = nlohmann::json;

// Reads the daemon's status document (the root's user.ckptfs.status xattr).
bool ReadStatus(const std::string& mnt, Json* out) {
  std::string buf(256 * 1024, '\0');
  ssize_t n = getxattr(mnt.c_str(), fs::kStatusXattr, buf.data(), buf.size());
  if (n < 0) return false;
  buf.resize(static_cast<size_t>(n));
  *out = Json::parse(buf, nullptr, false);
  return !out->is_discarded();
}

Json StatusOrDie(const std::string& mnt) {
  Json j;
  if (!ReadStatus(mnt, &j)) Die(mnt + " is not a ckptfs mount (" + Errno(errno) + ")");
  return j;
}

std::string HexHash(const std::string& s) {
  char buf[17];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(XXH3_64bits(s.data(), s.size())));
  return buf;
}

std::string DefaultStateDir(const std::string& mnt) {
  std::string base;
  if (geteuid() == 0) base = "/var/lib/ckptfs";
  else if (const char* x = getenv("XDG_STATE_HOME")) base = std::string(x) + "/ckptfs";
  else base = std::string(getenv("HOME") ? getenv("HOME") : "/tmp") + "/.local/state/ckptfs";
  return base + "/" + HexHash(mnt);
}

// Checks the mount point: an existing, empty directory with nothing mounted
// on it. A dead ckptfs mount (daemon killed) is cleaned up here.
void CheckMountpoint(const std::string& mnt) {
  // A killed daemon leaves its mount behind. stat() may still answer from
  // the kernel's attribute cache; statfs always goes to the daemon, so it
  // tells a dead mount (ENOTCONN) from a live one.
  if (MountedType(mnt) == "fuse.ckptfs") {
    struct statvfs sv;
    if (statvfs(mnt.c_str(), &sv) == 0 || errno != ENOTCONN)
      Die("mount point " + mnt + " is already mounted (fuse.ckptfs)");
    std::string cmd = "fusermount3 -uz '" + mnt + "' 2>/dev/null || umount -l '" + mnt + "' 2>/dev/null";
    if (system(cmd.c_str()) != 0 || !MountedType(mnt).empty())
      Die("mount point " + mnt + " is a dead ckptfs mount and could not be detached; run: fusermount3 -uz " + mnt);
    fprintf(stderr, "ckptfs: detached the dead ckptfs mount at %s\n", mnt.c_str());
  }
  struct stat st;
  if (stat(mnt.c_str(), &st) != 0) {
    int e = errno;
    if (e == ENOENT) Die("mount point " + mnt + " does not exist");
    Die("mount point " + mnt + ": " + Errno(e));
  }
  if (!S_ISDIR(st.st_mode)) Die("mount point " + mnt + " is not a directory");
  std::string type = MountedType(mnt);
  if (!type.empty()) Die("mount point " + mnt + " is already mounted (" + type + ")");
  std::error_code ec;
  auto it = stdfs::directory_iterator(mnt, ec);
  if (ec) Die("mount point " + mnt + ": " + ec.message());
  if (it != stdfs::directory_iterator()) Die("mount point " + mnt + " is not empty");
}

void CheckWritableDir(const std::string& what, const std::string& dir, bool create) {
  std::error_code ec;
  if (create) stdfs::create_directories(dir, ec);
  if (ec) Die("cannot create " + what + " " + dir + ": " + ec.message());
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) Die(what + " " + dir + " does not exist");
  if (!S_ISDIR(st.st_mode)) Die(what + " " + dir + " is not a directory");
  std::string probe = dir + "/.ckptfs-probe-" + std::to_string(getpid());
  int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0600);
  if (fd < 0) Die(what + " " + dir + " is not writable: " + Errno(errno));
  close(fd);
  unlink(probe.c_str());
}

std::string Absolute(const std::string& p) {
  std::error_code ec;
  auto a = stdfs::absolute(p, ec);
  if (ec) Die("bad path " + p);
  return a.lexically_normal().string();
}

// Opens the backend `cfg` names and checks it (reachable, writable, leftovers
// of an earlier daemon cleaned up: staged files, S3 multipart uploads), or
// returns the one-line message for the user. S3 credentials never appear in
// a message: only the bucket, prefix and endpoint do.
std::expected<std::unique_ptr<backend::Backend>, std::string> OpenBackend(const Config& cfg) {
  const std::string& url = cfg.backend_raw;
  if (cfg.backend.kind == BackendUrl::Kind::kPosix) {
    auto be = backend::OpenPosixBackend(cfg.backend.path);
    if (!be) return std::unexpected("cannot open backend " + url + ": " + Errno(be.error()));
    if (auto st = (*be)->Check(); !st) return std::unexpected("backend " + url + " is not usable: " + Errno(st.error()));
    return std::move(*be);
  }
  std::string why;
  auto s3cfg = backend::LoadS3Config(cfg.backend.bucket, cfg.backend.prefix, cfg.s3_endpoint, &why);
  if (!s3cfg) return std::unexpected("backend " + url + ": " + why);
  auto be = backend::OpenS3Backend(*s3cfg);
  if (!be) return std::unexpected("cannot open backend " + url + ": " + Errno(be.error()));
  auto st = (*be)->Check();
  if (st) return std::move(*be);
  const std::string& ep = s3cfg->endpoint;
  switch (st.error()) {
    case EACCES:
      return std::unexpected("backend " + url + ": access denied by " + ep + " (wrong credentials, or no access to bucket '" +
                             s3cfg->bucket + "'); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE");
    case ENOENT:
      return std::unexpected("backend " + url + ": no bucket '" + s3cfg->bucket + "' at " + ep);
    default:
      return std::unexpected("backend " + url + ": cannot use " + ep + ": " + Errno(st.error()) +
                             " (unreachable, or an unexpected reply; see " + cfg.state_dir + "/ckptfs.log)");
  }
}

// What the mount accepts, from what its backend can hold: S3 keys are at
// most 1024 bytes of UTF-8 (the prefix and a directory marker's '/'
// included); a POSIX backend takes relative paths below PATH_MAX.
fs::Limits MountLimits(const Config& cfg) {
  fs::Limits l;
  if (cfg.backend.kind == BackendUrl::Kind::kS3) {
    size_t prefix = cfg.backend.prefix.empty() ? 0 : cfg.backend.prefix.size() + 1;
    l.max_path = 1024 - 1 - std::min<size_t>(prefix, 1000);
    l.utf8_names = true;
  }
  l.max_file_size = 4 * cfg.cache_size;
  return l;
}

// Runs the daemon in this process. Reports "OK" or the error to `report_fd`
// (if >= 0) once the mount is ready, then serves until unmounted.
int RunDaemon(Config cfg, int report_fd) {
  auto fail = [&](const std::string& msg) {
    LOG_ERROR("{}", msg);
    if (report_fd >= 0) {
      (void)!write(report_fd, msg.data(), msg.size());
      close(report_fd);
    } else {
      fprintf(stderr, "ckptfs: %s\n", msg.c_str());
    }
    return 1;
  };
  if (auto st = InitLogging(cfg.state_dir + "/ckptfs.log", cfg.log_level, cfg.foreground); !st)
    return fail("cannot open log file in " + cfg.state_dir);
  InitFailpoints();

  auto d = std::make_unique<fs::Daemon>();
  d->cfg = cfg;
  std::string kv_why;
  auto kv = meta::OpenRocksKv(cfg.state_dir + "/meta", &kv_why);
  if (!kv) {
    if (kv.error() == EBUSY) return fail("state dir " + cfg.state_dir + " is in use by another ckptfs daemon");
    if (kv.error() == EUCLEAN)
      return fail("metadata in " + cfg.state_dir + "/meta is damaged (" + kv_why +
                  "); nothing was mounted or changed. See docs/operations.md, \"Damaged metadata\"");
    return fail("cannot open metadata in " + cfg.state_dir + "/meta: " + Errno(kv.error()) +
                " (see " + cfg.state_dir + "/ckptfs.log)");
  }
  d->store = std::make_unique<meta::MetaStore>(std::move(*kv));
  auto id = d->store->EnsureFormat();
  if (!id) return fail("state dir " + cfg.state_dir + " holds metadata of an unknown format");
  d->fs_id = *id;
  std::string tier_why;
  auto tier = cache::Tier::Open(cfg.tier_dir, cfg.cache_size, &tier_why);
  if (!tier) return fail("cannot use tier directory " + cfg.tier_dir + ": " + tier_why);
  d->tier = std::move(*tier);
  auto be = OpenBackend(cfg);
  if (!be) return fail(be.error());
  d->backend = std::move(*be);
  // A state dir describes one backend's history: mounting it over another
  // would drain that history into the wrong place. Bound only once the
  // backend proved usable, so a failed first mount leaves the dir free.
  std::string canon = cfg.backend.kind == BackendUrl::Kind::kS3
                          ? "s3://" + cfg.backend.bucket + "/" + cfg.backend.prefix
                          : cfg.backend.path;
  std::string bound;
  if (auto st = d->store->BindBackend(canon, &bound); !st)
    return fail(st.error() == EXDEV ? "state dir " + cfg.state_dir + " belongs to backend " + bound + ", not " +
                                          canon + "; use another --state-dir"
                                    : "cannot record the backend in " + cfg.state_dir + ": " + Errno(st.error()));
  d->table = std::make_unique<fs::InodeTable>(d->store.get(), d->tier.get(), d->backend.get());
  d->table->set_limits(MountLimits(cfg));
  if (auto st = d->table->Load(fs::Caller{geteuid(), getegid()}); !st)
    return fail(st.error() == EUCLEAN ? "metadata in " + cfg.state_dir +
                                            "/meta is damaged (a directory cycle; see the log); nothing was mounted"
                                      : "cannot load metadata from " + cfg.state_dir + ": " + Errno(st.error()));
  if (auto st = d->table->ImportBackend(); !st)
    return fail("cannot list what backend " + cfg.backend_raw + " holds: " + Errno(st.error()));
  // Writers that outgrow the budget wait for the drain (backpressure) and
  // for eviction of clean files; they fail only when nothing can ever free
  // space, or after this long.
  fs::InodeTable* table = d->table.get();
  d->tier->set_evictor([table](uint64_t need) { return table->Evict(need); });
  d->tier->set_wait_limit(std::chrono::minutes(10));
  d->drainer = std::make_unique<fs::Drainer>(d->table.get(), d->backend.get(), 4);
  d->space_waiter = std::make_unique<fs::SpaceWaiter>();

  std::string opts = "fsname=ckptfs:" + cfg.backend_raw + ",subtype=ckptfs,default_permissions";
  if (geteuid() == 0) opts += ",allow_other";
  std::vector<std::string> args = {"ckptfs", "-o", opts};
  if (!cfg.fuse_opts.empty()) {
    args.push_back("-o");
    args.push_back(cfg.fuse_opts);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&fargs, &fs::FuseOps(), sizeof(fuse_lowlevel_ops), d.get());
  if (!se) return fail("invalid FUSE options: " + cfg.fuse_opts);
  if (fuse_set_signal_handlers(se) != 0) return fail("cannot install signal handlers");
  if (fuse_session_mount(se, cfg.mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return fail("cannot mount at " + cfg.mountpoint + " (is /dev/fuse available? see " + cfg.state_dir +
                "/ckptfs.log)");
  }
  cache::TierStats ts = d->tier->Stats();
  LOG_INFO("mounted {} backend={} state={} tier={} budget={} in tier={}", cfg.mountpoint, cfg.backend_raw,
           cfg.state_dir, cfg.tier_dir, ts.budget, ts.used);
  if (report_fd >= 0) {
    (void)!write(report_fd, "OK", 2);
    close(report_fd);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    if (null > 2) close(null);
  }
  d->drainer->Start();
  fuse_loop_config* lc = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(lc, 0);
  fuse_loop_cfg_set_max_threads(lc, 16);
  int rc = fuse_session_loop_mt(se, lc);
  fuse_loop_cfg_destroy(lc);
  d->tier->Close();  // writes still waiting for space give up
  if (d->space_waiter) d->space_waiter->Stop();
  d->table->Shutdown();
  d->drainer->Stop();
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  LOG_INFO("unmounted {}", cfg.mountpoint);
  spdlog::shutdown();
  return rc == 0 ? 0 : 1;
}

int CmdMount(Config cfg, const std::string& cache_size) {
  cfg.mountpoint = Absolute(cfg.mountpoint);
  CheckMountpoint(cfg.mountpoint);
  auto url = ParseBackendUrl(cfg.backend_raw);
  if (!url) Die(url.error());
  cfg.backend = *url;
  if (cfg.backend.kind == BackendUrl::Kind::kPosix) {
    if (!cfg.s3_endpoint.empty()) Die("--s3-endpoint is for s3:// backends, not " + cfg.backend_raw);
    CheckWritableDir("backend", cfg.backend.path, false);
  } else {
    // The daemon chdirs to /: relative AWS file paths must not change meaning.
    for (const char* v : {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"})
      if (const char* p = getenv(v); p && *p && *p != '/') setenv(v, Absolute(p).c_str(), 1);
  }
  if (!ValidLogLevel(cfg.log_level)) Die("invalid log level '" + cfg.log_level + "'");
  cfg.state_dir = cfg.state_dir.empty() ? DefaultStateDir(cfg.mountpoint) : Absolute(cfg.state_dir);
  CheckWritableDir("state dir", cfg.state_dir, true);
  if (cfg.tier_dir.empty()) cfg.tier_dir = "/dev/shm/ckptfs-" + HexHash(cfg.state_dir);
  cfg.tier_dir = Absolute(cfg.tier_dir);
  std::string tier_parent = stdfs::path(cfg.tier_dir).parent_path().string();
  if (!cache_size.empty()) {
    auto sz = ParseSize(cache_size);
    if (!sz) Die(sz.error());
    cfg.cache_size = *sz;
  } else {
    cfg.cache_size = DefaultCacheSize(tier_parent);
  }
  if (cfg.cache_size < (1u << 20)) Die("cache size " + cache_size + " is too small (minimum 1M)");

  if (cfg.foreground) return RunDaemon(cfg, -1);

  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) Die("pipe: " + Errno(errno));
  pid_t pid = fork();
  if (pid < 0) Die("fork: " + Errno(errno));
  if (pid == 0) {
    close(pfd[0]);
    setsid();
    if (fork() > 0) _exit(0);  // the daemon is not a session leader, and not our child
    (void)!chdir("/");
    _exit(RunDaemon(cfg, pfd[1]));
  }
  close(pfd[1]);
  waitpid(pid, nullptr, 0);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = read(pfd[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  if (msg != "OK") Die(msg.empty() ? "the daemon exited during start-up (see " + cfg.state_dir + "/ckptfs.log)" : msg);
  printf("ckptfs: mounted %s (backend %s, tier %s in %s, state %s)\n", cfg.mountpoint.c_str(),
         cfg.backend_raw.c_str(), HumanBytes(cfg.cache_size).c_str(), cfg.tier_dir.c_str(), cfg.state_dir.c_str());
  return 0;
}

std::string Eta(double seconds) {
  if (seconds < 0 || seconds > 1e7) return "--:--";
  int t = static_cast<int>(seconds);
  return fmt::format("{:02d}:{:02d}:{:02d}", t / 3600, t / 60 % 60, t % 60);
}

// Waits until everything logged when it started is in the backend. Returns
// 0 when done, 1 on timeout (with a message).
int WaitDrained(const std::string& mnt, double timeout_s) {
  Json j = StatusOrDie(mnt);
  uint64_t target = j["drain"]["head_seq"].get<uint64_t>();
  bool tty = isatty(STDERR_FILENO);
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  double last_plain = -10;
  for (;;) {
    uint64_t applied = j["drain"]["applied_seq"].get<uint64_t>();
    uint64_t pending = j["dirty"]["bytes"].get<uint64_t>() + j["draining"]["bytes"].get<uint64_t>();
    total = std::max(total, pending);
    double rate = j["drain"]["rate"].get<double>();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bool done = applied >= target;
    std::string err = j["drain"]["in_error"].get<bool>() ? "  backend error: " + j["drain"]["last_error"].get<std::string>() : "";
    std::string line = fmt::format("drain: {} to go, {}/s, ETA {}, {} entries queued{}", HumanBytes(pending),
                                   HumanBytes(static_cast<uint64_t>(rate)), Eta(rate > 0 ? pending / rate : -1),
                                   j["drain"]["queue"].get<uint64_t>(), err);
    if (tty) {
      int width = 30;
      int fill = total ? static_cast<int>(width * (1.0 - static_cast<double>(pending) / static_cast<double>(total))) : width;
      if (done) fill = width;
      fprintf(stderr, "\r[%s%s] %s\033[K", std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), line.c_str());
    } else if (elapsed - last_plain >= 5 || done) {
      fprintf(stderr, "%s\n", line.c_str());
      last_plain = elapsed;
    }
    if (done) {
      if (tty) fprintf(stderr, "\n");
      fprintf(stderr, "drain: everything closed before the drain began is persisted (%.1f s)\n", elapsed);
      return 0;
    }
    if (timeout_s > 0 && elapsed > timeout_s) {
      if (tty) fprintf(stderr, "\n");
      fprintf(stderr, "ckptfs: drain timed out after %.0f s with %s still to persist%s\n", timeout_s,
              HumanBytes(pending).c_str(), err.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 200 : 500));
    j = StatusOrDie(mnt);
  }
}

int CmdDrain(const std::string& mnt_in, double timeout_s) { return WaitDrained(Absolute(mnt_in), timeout_s); }

int CmdUmount(const std::string& mnt_in, bool no_drain, bool lazy) {
  std::string mnt = Absolute(mnt_in);
  std::string type = MountedType(mnt);
  if (type.empty()) Die(mnt + " is not mounted");
  if (type != "fuse.ckptfs") Die(mnt + " is not a ckptfs mount (" + type + ")");
  Json status;
  long long pid = ReadStatus(mnt, &status) ? status["pid"].get<long long>() : -1;
  if (!no_drain && pid > 0 && WaitDrained(mnt, 0) != 0) return 1;
  std::string cmd = std::string("fusermount3 -u") + (lazy ? "z" : "") + " '" + mnt + "'";
  if (system(cmd.c_str()) != 0) Die("cannot unmount " + mnt + " (busy? close files using it, or use --lazy)");
  // Wait for the daemon to close its metadata, so a new mount can open it.
  for (int i = 0; pid > 0 && i < 1200 && kill(static_cast<pid_t>(pid), 0) == 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (pid > 0 && kill(static_cast<pid_t>(pid), 0) == 0)
    Die("unmounted, but the daemon (pid " + std::to_string(pid) + ") has not exited");
  return 0;
}

int CmdStatus(const std::string& mnt_in, bool json) {
  std::string mnt = Absolute(mnt_in);
  Json j = StatusOrDie(mnt);
  if (json) {
    printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  auto hb = [](const Json& v) { return HumanBytes(v.get<uint64_t>()); };
  const Json& t = j["tier"];
  double pct = t["budget"].get<double>() > 0 ? 100.0 * t["used"].get<double>() / t["budget"].get<double>() : 0;
  printf("mount      %s -> %s (fsync=%s)\n", mnt.c_str(), j["backend"].get<std::string>().c_str(),
         j["fsync"].get<std::string>().c_str());
  printf("memory     %s of %s (%.1f%%), %llu writer waits\n", hb(t["used"]).c_str(), hb(t["budget"]).c_str(), pct,
         static_cast<unsigned long long>(t["waits"].get<uint64_t>()));
  for (const char* s : {"dirty", "draining", "persisted", "remote"})
    printf("%-10s %llu files, %s\n", s, static_cast<unsigned long long>(j[s]["files"].get<uint64_t>()),
           hb(j[s]["bytes"]).c_str());
  const Json& d = j["drain"];
  printf("drain      %llu queued, %s/s, %s persisted since mount, %llu skipped as undone\n",
         static_cast<unsigned long long>(d["queue"].get<uint64_t>()), HumanBytes(d["rate"].get<uint64_t>()).c_str(),
         hb(d["bytes_persisted"]).c_str(), static_cast<unsigned long long>(d["skipped"].get<uint64_t>()));
  if (d["in_error"].get<bool>())
    printf("error      %s (retrying)\n", d["last_error"].get<std::string>().c_str());
  printf("lost       %zu files\n", j["lost"].size());
  for (const auto& l : j["lost"]) printf("  lost: %s\n", l.get<std::string>().c_str());
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  using namespace ckpt;
  CLI::App app{"ckptfs: a checkpoint filesystem that acknowledges writes at memory speed"};
  app.require_subcommand(1);
  Config cfg;
  std::string cache_size, fsync_mode = "memory";
  auto* mount = app.add_subcommand("mount", "mount ckptfs at MOUNTPOINT");
  mount->add_option("mountpoint", cfg.mountpoint, "where to mount")->required();
  mount->add_option("--backend", cfg.backend_raw, "backend: /path, file:///path or s3://bucket/prefix")->required();
  mount->add_option("--cache-size", cache_size, "memory tier budget (e.g. 8G, 25%); default 1/4 of RAM");
  mount->add_option("--state-dir", cfg.state_dir, "metadata and log directory");
  mount->add_option("--tier-dir", cfg.tier_dir, "memory tier directory (default /dev/shm/ckptfs-<id>)");
  mount->add_option("--fsync", fsync_mode, "memory|backend")->check(CLI::IsMember({"memory", "backend"}));
  mount->add_flag("--foreground,-f", cfg.foreground, "do not daemonize; log to stderr too");
  mount->add_option("-o", cfg.fuse_opts, "extra FUSE mount options");
  mount->add_option("--log-level", cfg.log_level, "trace|debug|info|warn|error");
  mount->add_option("--s3-endpoint", cfg.s3_endpoint,
                    "S3 endpoint URL, e.g. http://127.0.0.1:9000 (default: AWS_ENDPOINT_URL, else AWS)");

  std::string target;
  bool no_drain = false, lazy = false, json = false;
  double timeout_s = 0;
  auto* umount = app.add_subcommand("umount", "unmount a ckptfs mount");
  umount->add_option("mountpoint", target)->required();
  umount->add_flag("--no-drain", no_drain, "do not wait for the drain");
  umount->add_flag("--lazy,-l", lazy, "detach even if busy");
  auto* status = app.add_subcommand("status", "show what is in memory, draining and safe");
  status->add_option("mountpoint", target)->required();
  status->add_flag("--json", json, "machine-readable output");
  auto* drain = app.add_subcommand("drain", "wait until everything closed so far is persisted");
  drain->add_option("mountpoint", target)->required();
  drain->add_option("--timeout", timeout_s, "give up after SECONDS (exit 1)")->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fprintf(stderr, "ckptfs: %s (see ckptfs --help)\n", e.what());
    return 2;
  }
  cfg.fsync = fsync_mode == "backend" ? FsyncMode::kBackend : FsyncMode::kMemory;
  if (*mount) return CmdMount(cfg, cache_size);
  if (*umount) return CmdUmount(target, no_drain, lazy);
  if (*drain) return CmdDrain(target, timeout_s);
  if (*status) return CmdStatus(target, json);
  return 2;
}
