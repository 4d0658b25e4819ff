// posix_walk.cc — see posix_walk.h.
#include "backend/posix_walk.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "common/log.h"
#include "common/result.h"

namespace ckpt::backend::posix {

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

namespace {

// 0: openat2 not tried yet or works; 1: unavailable (ENOSYS), walk instead.
std::atomic<int> g_no_openat2{0};

}  // namespace

// CKPTFS_BACKEND_NO_OPENAT2=1 forces the walk (tests).
bool UseOpenat2() {
  static const bool disabled = [] {
    const char* v = std::getenv("CKPTFS_BACKEND_NO_OPENAT2");
    return v && *v && std::string_view(v) != "0";
  }();
  return !disabled && g_no_openat2.load(std::memory_order_relaxed) == 0;
}

// openat2 beneath `dirfd` with no symlink resolution. -1 with errno set;
// ENOSYS (remembered) when the kernel lacks it.
int Openat2(int dirfd, const char* path, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  for (int tries = 0;; tries++) {
    long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    // EAGAIN: a concurrent rename raced the lookup; E2BIG/EINVAL on `how`
    // itself would mean an older openat2: walk instead.
    if (errno == EAGAIN && tries < 8) continue;
    if (errno == ENOSYS || errno == E2BIG) {
      if (g_no_openat2.exchange(1) == 0)
        LOG_INFO("posix backend: openat2 unavailable; resolving paths one component at a time");
      errno = ENOSYS;
    }
    return -1;
  }
}

int Classify(int dirfd, const std::string& name, int e) {
  if (e != ELOOP && e != ENOTDIR) return e;
  struct stat st;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return e;
  if (S_ISLNK(st.st_mode)) return ELOOP;
  return S_ISDIR(st.st_mode) ? e : ENOTDIR;
}

std::vector<std::string> Components(std::string_view rel) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= rel.size() && !rel.empty()) {
    size_t slash = rel.find('/', pos);
    if (slash == std::string_view::npos) slash = rel.size();
    out.emplace_back(rel.substr(pos, slash - pos));
    pos = slash + 1;
  }
  return out;
}

namespace {

// Opens the directory `rel` ("" = `base` itself) beneath `base`, one
// component at a time with O_NOFOLLOW, creating missing components when
// `create_mode` is not 0 (mkdirat, then exactly that mode; the new entry
// made durable by an fsync of its parent). Intermediate components are
// opened O_PATH; the last with `last_flags` (O_RDONLY, or O_PATH).
Resolved WalkDir(int base, std::string_view rel, int last_flags, mode_t create_mode) {
  Resolved r;
  std::vector<std::string> comps = Components(rel);
  Fd cur(openat(base, ".", (comps.empty() ? last_flags : O_PATH) | O_DIRECTORY | O_CLOEXEC));
  if (!cur.ok()) {
    r.err = errno;
    return r;
  }
  std::string done;
  for (size_t i = 0; i < comps.size(); i++) {
    const std::string& c = comps[i];
    const bool last = i + 1 == comps.size();
    const int flags = (last ? last_flags : O_PATH) | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    if (!done.empty()) done.push_back('/');
    done.append(c);
    int fd = openat(cur.get(), c.c_str(), flags);
    if (fd < 0 && errno == ENOENT && create_mode != 0) {
      if (mkdirat(cur.get(), c.c_str(), 0700) == 0) {
        fd = openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0 && fchmod(fd, create_mode) != 0)
          LOG_DEBUG("posix backend: chmod new '{}': {}", done, ErrStr(errno));
        // Durable before anything is put into it.
        Fd sync(openat(cur.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (sync.ok()) (void)fsync(sync.get());
      } else if (errno == EEXIST) {
        fd = openat(cur.get(), c.c_str(), flags);  // made by someone else meanwhile
      } else {
        fd = -1;
      }
    }
    if (fd < 0) {
      r.err = Classify(cur.get(), c, errno);
      if (r.err == ELOOP || r.err == ENOTDIR) r.bad = done;
      return r;
    }
    cur = Fd(fd);
  }
  r.fd = std::move(cur);
  return r;
}

// openat2 of the directory `rel` beneath `base` (see Openat2), in pieces
// that each fit PATH_MAX, cut at a '/': PATH_MAX bounds one call's path,
// not a tree's depth, and the mount holds paths of any length (names up to
// NAME_MAX). Each piece resolves beneath the directory the one before
// opened, so no piece can leave the root or follow a symlink. Pieces before
// the last are opened O_PATH. -1 with errno set; ENAMETOOLONG only for a
// component no directory can hold.
int Openat2Pieces(int base, std::string_view rel, int flags) {
  Fd dir;
  for (;;) {
    const bool last = rel.size() < PATH_MAX;
    const size_t cut = last ? rel.size() : rel.rfind('/', PATH_MAX - 1);
    if (cut == std::string_view::npos || cut == 0) {
      errno = ENAMETOOLONG;
      return -1;
    }
    std::string piece(rel.substr(0, cut));
    int fd = Openat2(dir.ok() ? dir.get() : base, piece.c_str(), (last ? flags : O_PATH) | O_DIRECTORY);
    if (fd < 0 || last) return fd;
    dir = Fd(fd);
    rel.remove_prefix(cut + 1);
  }
}

}  // namespace

// Opens directory `rel` beneath `base` (see WalkDir), trying openat2 first.
Resolved OpenDirBeneath(int base, std::string_view rel, int flags, mode_t create_mode) {
  if (!rel.empty() && UseOpenat2()) {
    int fd = Openat2Pieces(base, rel, flags);
    if (fd >= 0) {
      Resolved r;
      r.fd = Fd(fd);
      return r;
    }
    // Anything but a missing component to create or a refusal to explain
    // is the answer; the walk names the offending component.
    if (errno != ENOSYS && !(errno == ENOENT && create_mode) && errno != ELOOP && errno != ENOTDIR && errno != EXDEV) {
      Resolved r;
      r.err = errno;
      return r;
    }
  }
  return WalkDir(base, rel, flags, create_mode);
}

int OpenDirNoSymlinks(const std::string& abs) {
  if (UseOpenat2()) {
    open_how how{};
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, abs.c_str(), &how, sizeof how));
    if (fd >= 0 || (errno != ENOSYS && errno != E2BIG)) return fd;
    g_no_openat2.store(1);
  }
  Fd top(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!top.ok()) return -1;
  Resolved r = WalkDir(top.get(), std::string_view(abs).substr(1), O_PATH, 0);
  if (!r.fd.ok()) {
    errno = r.err;
    return -1;
  }
  return dup(r.fd.get());
}

std::string ParentOf(const std::string& rel) {
  auto slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

std::string LeafOf(const std::string& rel) {
  auto slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

}  // namespace ckpt::backend::posix
