// warmup.cc — `ckptfs warmup PATH...`: brings files that are only in the
// backend (`remote`: evicted, released at unmount, or imported) back into
// the memory tier ahead of a restart, so the trainer's torch.load reads
// RAM (JuiceFS has the same command).
//
// It works through the mount, as a reader would: opening a remote file
// makes the daemon fetch it whole (checksum-verified) before the open
// returns, so nothing here touches the backend or the tier directly. Four
// opens are in flight at once (the daemon fetches with four threads). The
// files are taken in the order given (directories walked in name order)
// and only as many as fit the budget beside what is dirty: warming more
// would evict what was just warmed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "common/config.h"
#include "fs/daemon.h"

namespace ckpt::cli {

namespace {

namespace stdfs = std::filesystem;

// The root of the ckptfs mount holding `path` (the directory whose status
// xattr answers), or "" if none does.
std::string MountRootOf(const std::string& path) {
  std::error_code ec;
  stdfs::path p = stdfs::canonical(path, ec);
  if (ec) return "";
  for (;;) {
    if (lgetxattr(p.c_str(), fs::kStatusXattr, nullptr, 0) > 0) return p.string();
    if (!p.has_relative_path()) return "";
    p = p.parent_path();
  }
}

// A mount holds paths of any length (docs/consistency.md), and with the
// mount point before them they pass PATH_MAX, which bounds the path of one
// system call: such paths are opened in pieces, and examined through the
// directory that holds them.

// open(2) of `path` (absolute), cut at a '/' into pieces that each fit
// PATH_MAX when it is longer, each opened beneath the directory the one
// before opened. -1 with errno set.
int OpenLong(const std::string& path, int flags) {
  int dir = AT_FDCWD;
  std::string_view rest(path);
  for (;;) {
    const bool last = rest.size() < PATH_MAX;
    const size_t cut = last ? rest.size() : rest.rfind('/', PATH_MAX - 1);
    int fd = -1, e = ENAMETOOLONG;  // no '/' in PATH_MAX bytes: a name no directory holds
    if (cut != std::string_view::npos && cut > 0) {
      fd = openat(dir, std::string(rest.substr(0, cut)).c_str(), (last ? flags : O_PATH | O_DIRECTORY) | O_CLOEXEC);
      e = errno;
    }
    if (dir != AT_FDCWD) close(dir);
    if (fd < 0 || last) {
      errno = e;
      return fd;
    }
    dir = fd;
    rest.remove_prefix(cut + 1);
  }
}

// The entry `path` names, as a path of a few bytes: its directory opened
// (*dir, O_PATH, for the caller to close) and the entry beneath it in
// /proc/self/fd. "" with errno set.
std::string ShortPath(const std::string& path, int* dir) {
  *dir = -1;
  if (path.size() < PATH_MAX) return path;
  const size_t slash = path.rfind('/');
  *dir = OpenLong(path.substr(0, slash), O_PATH | O_DIRECTORY);
  if (*dir < 0) return "";
  return "/proc/self/fd/" + std::to_string(*dir) + path.substr(slash);
}

std::string StateOf(const std::string& path) {
  char buf[64];
  int dir;
  std::string p = ShortPath(path, &dir);
  ssize_t n = p.empty() ? -1 : lgetxattr(p.c_str(), "user.ckptfs.state", buf, sizeof buf);
  if (dir >= 0) close(dir);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

struct Item {
  std::string path;
  uint64_t size;
};

// Regular files under `path` (or `path` itself), in name order; symlinks
// are not followed.
void Collect(const std::string& path, std::vector<Item>* out) {
  struct stat st;
  int dir;
  std::string p = ShortPath(path, &dir);
  int rc = p.empty() ? -1 : lstat(p.c_str(), &st);
  if (dir >= 0) close(dir);
  if (rc != 0) return;
  if (S_ISREG(st.st_mode)) {
    out->push_back({path, static_cast<uint64_t>(st.st_size)});
    return;
  }
  if (!S_ISDIR(st.st_mode)) return;
  std::vector<std::string> names;
  int fd = OpenLong(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  DIR* d = fd >= 0 ? fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  while (dirent* e = readdir(d))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      names.push_back((stdfs::path(path) / e->d_name).string());
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) Collect(n, out);
}

}  // namespace

int CmdWarmup(const std::vector<std::string>& paths_in) {
  std::string root;
  std::vector<Item> all;
  for (const std::string& p : paths_in) {
    std::string a = Absolute(p);
    struct stat st;
    if (lstat(a.c_str(), &st) != 0) Die("warmup: " + EscapeName(a) + ": " + ErrStr(errno));
    std::string r = MountRootOf(a);
    if (r.empty()) Die("warmup: " + EscapeName(a) + " is not in a ckptfs mount");
    if (!root.empty() && r != root) Die("warmup: the paths are in two mounts (" + root + ", " + r + "); one at a time");
    root = r;
    Collect(a, &all);
  }
  // What is remote, and what the budget has room for beside dirty data.
  std::vector<Item> todo;
  uint64_t want = 0;
  size_t remote = 0;
  for (const Item& it : all)
    if (StateOf(it.path) == "remote") {
      todo.push_back(it);
      want += it.size;
      remote++;
    }
  Json j = StatusOrDie(root);
  auto num = [&](const char* obj, const char* key) { return U64(Obj(j, obj), key); };
  const uint64_t budget = num("tier", "budget");
  const uint64_t pinned = num("dirty", "bytes") + num("draining", "bytes") + num("failed_files", "bytes");
  const uint64_t room = budget > pinned ? budget - pinned : 0;
  size_t fit = 0;
  uint64_t fit_bytes = 0;
  while (fit < todo.size() && fit_bytes + todo[fit].size <= room) fit_bytes += todo[fit++].size;
  if (fit < todo.size())
    fprintf(stderr,
            "ckptfs: warning: warmup: %zu files (%s) do not fit the budget (%s, %s of it dirty); warming the first "
            "%zu (%s)\n",
            todo.size() - fit, HumanBytes(want - fit_bytes).c_str(), HumanBytes(budget).c_str(),
            HumanBytes(pinned).c_str(), fit, HumanBytes(fit_bytes).c_str());
  todo.resize(fit);

  std::atomic<size_t> next{0}, done{0}, failed{0};
  std::atomic<uint64_t> bytes{0};
  std::mutex err_mu;
  auto worker = [&] {
    for (size_t i; (i = next++) < todo.size();) {
      const Item& it = todo[i];
      int fd = OpenLong(it.path, O_RDONLY | O_NOFOLLOW);  // the daemon fetches before answering
      if (fd < 0) {
        std::lock_guard lk(err_mu);
        fprintf(stderr, "\nckptfs: warmup: %s: %s\n", EscapeName(it.path).c_str(), ErrStr(errno).c_str());
        failed++;
        continue;
      }
      close(fd);
      bytes += it.size;
      done++;
    }
  };
  const bool tty = isatty(STDERR_FILENO);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++) threads.emplace_back(worker);
  auto show = [&](bool last) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double rate = s > 0 ? static_cast<double>(bytes.load()) / s : 0;
    fprintf(stderr, "%swarmup: %s of %s in RAM, %zu of %zu files, %s/s%s", tty ? "\r" : "", HumanBytes(bytes).c_str(),
            HumanBytes(fit_bytes).c_str(), done.load(), todo.size(), HumanBytes(static_cast<uint64_t>(rate)).c_str(),
            tty && !last ? "" : "\n");
  };
  double last_plain = 0;
  while (done + failed < todo.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (tty || s - last_plain >= 5) {
      show(false);
      last_plain = s;
    }
  }
  for (auto& t : threads) t.join();
  show(true);
  std::string tail;
  if (remote > todo.size()) tail += ", " + std::to_string(remote - todo.size()) + " left remote (no room)";
  if (failed > 0) tail += ", " + std::to_string(failed.load()) + " failed";
  printf("ckptfs: warmup: %zu files (%s) fetched into RAM, %zu were there already%s\n", done.load(),
         HumanBytes(bytes).c_str(), all.size() - remote, tail.c_str());
  return failed > 0 ? 1 : 0;
}

}  // namespace ckpt::cli
