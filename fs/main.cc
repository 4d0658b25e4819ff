// main.cc — the ckptfs command: `mount` starts a daemon and returns once the
// mount is ready (or prints why not); `umount`, `status`, `drain` and `lost`
// talk to a running daemon through xattrs on its mount root.
//
// Every user error is one line on stderr and a non-zero exit, and leaves
// nothing mounted. The daemon reports its start-up result to the waiting
// parent over a pipe, so failures after the fork still reach the user.
//
// The daemon runs as root on shared nodes, so every input is hostile until
// checked: no path goes through a shell (RunCommand), credentials in the
// backend URL are refused without being echoed and only the URL's display
// form is ever shown, the state dir and its files are private (0700/0600,
// umask 077), and names that come back from the daemon (lost files, errors)
// are printed escaped, never as raw bytes to a terminal.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <dirent.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "backend/s3_backend.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/spawn.h"
#include "common/text.h"
#include "fs/daemon.h"

namespace ckpt {
namespace {

namespace stdfs = std::filesystem;

[[noreturn]] void Die(const std::string& msg) {
  fprintf(stderr, "ckptfs: %s\n", msg.c_str());
  exit(1);
}

std::string Errno(int e) { return strerror(e); }

// The filesystem type mounted at `path`, or "" if none.
std::string MountedType(const std::string& path) {
  std::ifstream in("/proc/self/mounts");
  std::string dev, mnt, type, rest, found;
  while (in >> dev >> mnt >> type && std::getline(in, rest))
    if (UnescapeMountinfo(mnt) == path) found = type;
  return found;
}

using Json = nlohmann::json;

// Reads the daemon's status document (the root's user.ckptfs.status xattr).
// Returns 0, or the errno of the read (EBADMSG: not a JSON object).
int ReadStatus(const std::string& mnt, Json* out) {
  std::string buf(256 * 1024, '\0');
  ssize_t n = getxattr(mnt.c_str(), fs::kStatusXattr, buf.data(), buf.size());
  if (n < 0) return errno;
  buf.resize(static_cast<size_t>(n));
  *out = Json::parse(buf, nullptr, false);
  return out->is_object() ? 0 : EBADMSG;
}

Json StatusOrDie(const std::string& mnt) {
  Json j;
  if (int e = ReadStatus(mnt, &j); e != 0) {
    if (e == ENODATA || e == ENOTSUP) Die(mnt + " is not a ckptfs mount (" + Errno(e) + ")");
    Die("cannot read the status of " + mnt + ": " + Errno(e));
  }
  return j;
}

// Field readers that take a missing field (an older or newer daemon) as
// its default instead of throwing.
uint64_t U64(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<uint64_t>() : 0;
}
double Dbl(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}
std::string Str(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool Bool(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}
const Json& Obj(const Json& j, const char* key) {
  static const Json kEmpty = Json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
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
    if ((RunCommand({"fusermount3", "-uz", mnt}) != 0 && RunCommand({"umount", "-l", mnt}) != 0) ||
        !MountedType(mnt).empty())
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

void CheckWritableDir(const std::string& what, const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) Die(what + " " + dir + " does not exist");
  if (!S_ISDIR(st.st_mode)) Die(what + " " + dir + " is not a directory");
  std::string probe = dir + "/.ckptfs-probe-" + std::to_string(getpid());
  int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) Die(what + " " + dir + " is not writable: " + Errno(errno));
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
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) Die("cannot create state dir " + dir + ": " + Errno(errno));
  struct stat lst;
  if (lstat(dir.c_str(), &lst) != 0) Die("state dir " + dir + ": " + Errno(errno));
  if (S_ISLNK(lst.st_mode) && lst.st_uid != geteuid() && lst.st_uid != 0)
    Die("state dir " + dir + " is a symbolic link owned by uid " + std::to_string(lst.st_uid) +
        "; give the directory itself");
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) Die(errno == ENOTDIR ? "state dir " + dir + " is not a directory" : "state dir " + dir + ": " + Errno(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) Die("state dir " + dir + ": " + Errno(errno));
  if (st.st_uid != geteuid())
    Die("state dir " + dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this daemon (uid " +
        std::to_string(geteuid()) + ")");
  if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) != 0)
    Die("cannot make state dir " + dir + " private (chmod 0700): " + Errno(errno));
  TightenTree(fd, 1);
  close(fd);
  CheckWritableDir("state dir", dir);
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
  const std::string& url = cfg.backend_display;
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
  l.max_file_size = cfg.max_file_size ? cfg.max_file_size : 4 * cfg.cache_size;
  return l;
}

// Runs the daemon in this process. Reports "OK" or the error to `report_fd`
// (if >= 0) once the mount is ready, then serves until unmounted.
// `warnings` (found by the command line before the fork) go to the log.
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
    return fail("cannot open log file " + log_file + ": " + Errno(st.error()));
  }
  logging = true;
  for (const std::string& w : warnings) LOG_WARN("{}", w);
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
    return fail("cannot list what backend " + cfg.backend_display + " holds: " + Errno(st.error()));
  // Writers that outgrow the budget wait for the drain (backpressure) and
  // for eviction of clean files; they fail only when nothing can ever free
  // space, or after this long.
  fs::InodeTable* table = d->table.get();
  d->tier->set_evictor([table](uint64_t need) { return table->Evict(need); });
  d->tier->set_wait_limit(std::chrono::minutes(10));
  d->drainer = std::make_unique<fs::Drainer>(d->table.get(), d->backend.get(), 4);
  d->space_waiter = std::make_unique<fs::SpaceWaiter>();

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
  LOG_INFO("mounted {} backend={} state={} tier={} budget={} in tier={} max_file_size={}", cfg.mountpoint,
           cfg.backend_display, cfg.state_dir, cfg.tier_dir, ts.budget, ts.used, cfg.max_file_size);
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

// Sizes given on the command line; nullopt when the option was not given
// (an empty string given is an error, not the default).
struct SizeArgs {
  std::optional<std::string> cache_size;
  std::optional<std::string> max_file_size;
};

int CmdMount(Config cfg, const SizeArgs& sizes) {
  cfg.mountpoint = Absolute(cfg.mountpoint);
  CheckMountpoint(cfg.mountpoint);
  auto url = ParseBackendUrl(cfg.backend_raw);
  if (!url) Die(url.error());
  cfg.backend = *url;
  cfg.backend_display = BackendDisplay(cfg.backend, cfg.backend_raw);
  if (cfg.backend.kind == BackendUrl::Kind::kPosix) {
    if (!cfg.s3_endpoint.empty()) Die("--s3-endpoint is for s3:// backends, not " + cfg.backend_display);
    CheckWritableDir("backend", cfg.backend.path);
  } else {
    // The daemon chdirs to /: relative AWS file paths must not change meaning.
    for (const char* v : {"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"})
      if (const char* p = getenv(v); p && *p && *p != '/') setenv(v, Absolute(p).c_str(), 1);
  }
  if (!ValidLogLevel(cfg.log_level)) Die("invalid log level '" + cfg.log_level + "'");
  cfg.state_dir = cfg.state_dir.empty() ? DefaultStateDir(cfg.mountpoint) : Absolute(cfg.state_dir);
  PrepareStateDir(cfg.state_dir);
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
  if (cfg.cache_size < (1u << 20)) Die("cache size " + shown_size + " is too small (minimum 1M)");
  // A budget the tier's filesystem cannot hold fails writes with ENOSPC
  // while clean files could still have been evicted: cap it.
  std::vector<std::string> warnings;
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

  if (cfg.foreground) return RunDaemon(cfg, -1, warnings);

  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) Die("pipe: " + Errno(errno));
  pid_t pid = fork();
  if (pid < 0) Die("fork: " + Errno(errno));
  if (pid == 0) {
    close(pfd[0]);
    setsid();
    if (fork() > 0) _exit(0);  // the daemon is not a session leader, and not our child
    (void)!chdir("/");
    _exit(RunDaemon(cfg, pfd[1], warnings));
  }
  close(pfd[1]);
  waitpid(pid, nullptr, 0);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = read(pfd[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  if (msg != "OK") Die(msg.empty() ? "the daemon exited during start-up (see " + cfg.state_dir + "/ckptfs.log)" : msg);
  printf("ckptfs: mounted %s (backend %s, tier %s in %s, state %s)\n", cfg.mountpoint.c_str(),
         cfg.backend_display.c_str(), HumanBytes(cfg.cache_size).c_str(), cfg.tier_dir.c_str(), cfg.state_dir.c_str());
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
  uint64_t target = U64(Obj(j, "drain"), "head_seq");
  bool tty = isatty(STDERR_FILENO);
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  double last_plain = -10;
  for (;;) {
    const Json& dr = Obj(j, "drain");
    uint64_t applied = U64(dr, "applied_seq");
    uint64_t pending = U64(Obj(j, "dirty"), "bytes") + U64(Obj(j, "draining"), "bytes");
    total = std::max(total, pending);
    double rate = Dbl(dr, "rate");
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bool done = applied >= target;
    std::string err = Bool(dr, "in_error") ? "  backend error: " + EscapeName(Str(dr, "last_error")) : "";
    std::string line = fmt::format("drain: {} to go, {}/s, ETA {}, {} entries queued{}", HumanBytes(pending),
                                   HumanBytes(static_cast<uint64_t>(rate)), Eta(rate > 0 ? pending / rate : -1),
                                   U64(dr, "queue"), err);
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

// The mount's type, or a one-line exit when it is not a ckptfs mount.
void RequireCkptfsMount(const std::string& mnt) {
  std::string type = MountedType(mnt);
  if (type.empty()) Die(mnt + " is not mounted");
  if (type != "fuse.ckptfs") Die(mnt + " is not a ckptfs mount (" + type + ")");
}

int CmdUmount(const std::string& mnt_in, bool no_drain, bool lazy) {
  std::string mnt = Absolute(mnt_in);
  RequireCkptfsMount(mnt);
  // Without the status there is no knowing what is still to drain: refuse
  // rather than unmount and report success. --no-drain is the way out (a
  // dead daemon); the next mount resumes the drain either way.
  Json status;
  int err = ReadStatus(mnt, &status);
  if (err != 0 && !no_drain)
    Die("cannot read the status of " + mnt + " (" + Errno(err) + "), so the drain cannot be waited for; nothing " +
        "unmounted (`ckptfs umount --no-drain` unmounts without it; the next mount resumes the drain)");
  long long pid = err == 0 && status.contains("pid") && status["pid"].is_number_integer()
                      ? status["pid"].get<long long>()
                      : -1;
  if (!no_drain && WaitDrained(mnt, 0) != 0) return 1;
  int rc = RunCommand({"fusermount3", lazy ? "-uz" : "-u", mnt});
  if (rc < 0) Die("cannot run fusermount3: " + Errno(errno));
  if (rc != 0) Die("cannot unmount " + mnt + " (busy? close files using it, or use --lazy)");
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
    printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    return 0;
  }
  const Json& t = Obj(j, "tier");
  uint64_t budget = U64(t, "budget"), used = U64(t, "used");
  double pct = budget > 0 ? 100.0 * static_cast<double>(used) / static_cast<double>(budget) : 0;
  printf("mount      %s -> %s (fsync=%s)\n", EscapeName(mnt).c_str(), EscapeName(Str(j, "backend")).c_str(),
         Str(j, "fsync").c_str());
  if (std::string ro = Str(j, "read_only"); !ro.empty()) printf("READ-ONLY  %s\n", EscapeName(ro).c_str());
  printf("memory     %s of %s (%.1f%%), %llu writer waits\n", HumanBytes(used).c_str(), HumanBytes(budget).c_str(), pct,
         static_cast<unsigned long long>(U64(t, "waits")));
  if (uint64_t o = U64(t, "orphans"); o > 0)
    printf("orphans    %llu tier files that no file owns\n", static_cast<unsigned long long>(o));
  for (const char* s : {"dirty", "draining", "persisted", "remote"})
    printf("%-10s %llu files, %s\n", s, static_cast<unsigned long long>(U64(Obj(j, s), "files")),
           HumanBytes(U64(Obj(j, s), "bytes")).c_str());
  const Json& d = Obj(j, "drain");
  printf("drain      %llu queued, %s/s, %s persisted since mount, %llu skipped as undone\n",
         static_cast<unsigned long long>(U64(d, "queue")), HumanBytes(U64(d, "rate")).c_str(),
         HumanBytes(U64(d, "bytes_persisted")).c_str(), static_cast<unsigned long long>(U64(d, "skipped")));
  if (Bool(d, "in_error")) printf("error      %s (retrying)\n", EscapeName(Str(d, "last_error")).c_str());
  const Json& f = Obj(j, "failed");
  if (uint64_t n = U64(f, "count"); n > 0) {
    printf("failed     %llu files the backend refused for good\n", static_cast<unsigned long long>(n));
    size_t shown = 0;
    if (auto it = f.find("first"); it != f.end() && it->is_array())
      for (const Json& e : *it) {
        if (shown++ == 10 || !e.is_object()) break;
        printf("  failed: %s: %s\n", EscapeName(Str(e, "path")).c_str(), EscapeName(Str(e, "reason")).c_str());
      }
    if (n > 10) printf("  ... %llu more\n", static_cast<unsigned long long>(n - 10));
  }
  // lost_count is new; an older daemon sent only the (whole) list.
  auto lit = j.find("lost");
  size_t listed = lit != j.end() && lit->is_array() ? lit->size() : 0;
  uint64_t lost = j.contains("lost_count") ? U64(j, "lost_count") : listed;
  printf("lost       %llu files\n", static_cast<unsigned long long>(lost));
  size_t shown = 0;
  if (listed > 0)
    for (const Json& l : *lit) {
      if (shown++ == 10) break;
      printf("  lost: %s\n", l.is_string() ? EscapeName(l.get<std::string>()).c_str() : "?");
    }
  if (lost > 10) printf("  ... %llu more: ckptfs lost %s\n", static_cast<unsigned long long>(lost - 10), EscapeName(mnt).c_str());
  return 0;
}

// Reads the whole lost list, page by page (user.ckptfs.lost.N). Exits with
// one line when it cannot.
std::vector<std::string> ReadLost(const std::string& mnt) {
  std::vector<std::string> out;
  std::string buf(256 * 1024, '\0');
  for (uint64_t page = 0;; page++) {
    std::string name = fs::kLostXattrPrefix + std::to_string(page);
    ssize_t n = getxattr(mnt.c_str(), name.c_str(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == ENODATA && page > 0) break;
      Die("cannot read the lost list of " + mnt + ": " + Errno(errno) +
          (errno == ENODATA ? " (a daemon older than this command?)" : ""));
    }
    std::string_view v(buf.data(), static_cast<size_t>(n));
    while (!v.empty()) {
      size_t z = v.find('\0');
      out.emplace_back(v.substr(0, z));
      v.remove_prefix(z == std::string_view::npos ? v.size() : z + 1);
    }
    if (n == 0) break;
  }
  return out;
}

int CmdLost(const std::string& mnt_in, bool json, bool clear) {
  std::string mnt = Absolute(mnt_in);
  RequireCkptfsMount(mnt);
  if (clear) {
    Json j = StatusOrDie(mnt);
    if (setxattr(mnt.c_str(), fs::kLostClearXattr, "1", 1, 0) != 0) {
      int e = errno;
      Die("cannot clear the lost list of " + mnt + ": " + Errno(e) +
          (e == EPERM || e == EACCES ? " (only root or the mount's owner may)" : ""));
    }
    fprintf(stderr, "ckptfs: cleared the lost list of %s (%llu entries)\n", EscapeName(mnt).c_str(),
            static_cast<unsigned long long>(U64(j, "lost_count")));
    return 0;
  }
  std::vector<std::string> lost = ReadLost(mnt);
  if (json) {
    Json j = {{"count", lost.size()}, {"lost", lost}};
    printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
    return 0;
  }
  for (const std::string& p : lost) printf("%s\n", EscapeName(p).c_str());
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  using namespace ckpt;
  CLI::App app{"ckptfs: a checkpoint filesystem that acknowledges writes at memory speed"};
  app.require_subcommand(1);
  Config cfg;
  std::string cache_size, max_file_size, fsync_mode = "memory";
  auto* mount = app.add_subcommand("mount", "mount ckptfs at MOUNTPOINT");
  mount->add_option("mountpoint", cfg.mountpoint, "where to mount")->required();
  mount->add_option("--backend", cfg.backend_raw, "backend: /path, file:///path or s3://bucket/prefix")->required();
  auto* cache_opt =
      mount->add_option("--cache-size", cache_size, "memory tier budget (e.g. 8G, 25%); default 1/4 of RAM");
  auto* max_file_opt =
      mount->add_option("--max-file-size", max_file_size, "largest file (e.g. 64G, at least 1M); default 4 x the budget");
  mount->add_option("--state-dir", cfg.state_dir, "metadata and log directory");
  mount->add_option("--tier-dir", cfg.tier_dir, "memory tier directory (default /dev/shm/ckptfs-<id>)");
  mount->add_option("--fsync", fsync_mode, "memory|backend")->check(CLI::IsMember({"memory", "backend"}));
  mount->add_flag("--foreground,-f", cfg.foreground, "do not daemonize; log to stderr too");
  mount->add_option("-o", cfg.fuse_opts, "extra FUSE mount options");
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
  auto* status = app.add_subcommand("status", "show what is in memory, draining and safe");
  status->add_option("mountpoint", target)->required();
  status->add_flag("--json", json, "machine-readable output");
  auto* drain = app.add_subcommand("drain", "wait until everything closed so far is persisted");
  drain->add_option("mountpoint", target)->required();
  drain->add_option("--timeout", timeout_s, "give up after SECONDS (exit 1)")->check(CLI::NonNegativeNumber);
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
  try {
    if (*mount) {
      SizeArgs sizes;
      if (cache_opt->count() > 0) sizes.cache_size = cache_size;
      if (max_file_opt->count() > 0) sizes.max_file_size = max_file_size;
      return CmdMount(cfg, sizes);
    }
    if (*umount) return CmdUmount(target, no_drain, lazy);
    if (*drain) return CmdDrain(target, timeout_s);
    if (*status) return CmdStatus(target, json);
    if (*lost) return CmdLost(target, json, clear);
  } catch (const std::exception& e) {
    // Nothing should throw here; if something does, one line, not an abort.
    fprintf(stderr, "ckptfs: internal error: %s\n", RedactUserinfo(e.what()).c_str());
    return 1;
  }
  return 2;
}
