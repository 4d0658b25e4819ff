// posix_walk.h — resolving paths beneath a directory without ever
// following a symlink: the POSIX backend's only way to reach an entry.
//
// Paths. Nothing under the root is trusted: any component may be replaced
// by a symlink, a file or another directory at any moment. So no operation
// ever walks a path string from "/": each one opens the root, resolves the
// entry's parent directory beneath it with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) — or, where the kernel has
// no openat2 (ENOSYS), a walk of openat(O_NOFOLLOW | O_DIRECTORY) one
// component at a time — and then acts with *at() calls on that directory's
// descriptor: renameat2, unlinkat, mkdirat, symlinkat, linkat (never
// AT_SYMLINK_FOLLOW), fchown/fchmod/futimens on an fd opened O_NOFOLLOW.
// No path is limited to PATH_MAX, neither with the root's own path before
// it nor alone: a parent path that long is resolved in pieces, each beneath
// the directory the one before opened (the mount makes such paths as tmpfs
// does: PATH_MAX bounds one system call's path, relative to its working
// directory, not how deep a tree goes).
// A symlink where a directory should be is never followed: the operation
// fails with ELOOP (ENOTDIR for a non-directory), a permanent error for that
// entry (backend.h), with one warning line naming the path. Entries that
// are themselves symlinks (made by Symlink) are acted on as links. Rmdir
// removes a tree through descriptors and unlinks the symlinks it meets.
// Hard links planted by other users are not detected; the kernel's
// fs.protected_hardlinks (default on) keeps them from linking files they
// do not own.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckpt::backend::posix {

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Is openat2 in use (not disabled by CKPTFS_BACKEND_NO_OPENAT2=1 for tests,
// and not found missing)?
bool UseOpenat2();

// openat2 beneath `dirfd` with no symlink resolution. -1 with errno set;
// ENOSYS (remembered) when the kernel lacks it.
int Openat2(int dirfd, const char* path, int flags);

// Opens the directory at the absolute path `abs` O_PATH, following no
// symlink on the way (openat2 from "/", else a walk). -1 with errno set.
int OpenDirNoSymlinks(const std::string& abs);

// Why a component could not be opened as a directory: ELOOP for a symlink,
// ENOTDIR for anything else that is not a directory, else `e`.
int Classify(int dirfd, const std::string& name, int e);

// Splits "a/b/c" into its components.
std::vector<std::string> Components(std::string_view rel);

// The outcome of a resolution: an fd, or an errno and, for ELOOP/ENOTDIR,
// the prefix of the path that is the symlink or non-directory.
struct Resolved {
  Fd fd;
  int err = 0;
  std::string bad;  // e.g. "team" for "team/sub/f"
};

// Opens the directory `rel` ("" = `base` itself) beneath `base` with
// `flags`, creating missing components when `create_mode` is not 0 (then
// exactly that mode, each new entry made durable by an fsync of its
// parent): openat2 first (in PATH_MAX pieces), else one component at a
// time with O_NOFOLLOW.
Resolved OpenDirBeneath(int base, std::string_view rel, int flags, mode_t create_mode);

// "a/b/c" → "a/b"; "c" → "".
std::string ParentOf(const std::string& rel);

// "a/b/c" → "c".
std::string LeafOf(const std::string& rel);

}  // namespace ckpt::backend::posix
