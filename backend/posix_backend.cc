// posix_backend.cc — the Backend over a POSIX directory: NFS, Lustre or a
// local disk, typically a shared team directory that other users can write
// to while the daemon runs as root.
//
// Paths: resolved beneath the root, never following a symlink
// (backend/posix_walk.h).
//
// The root. Its path is trusted (the operator chose it) and is resolved to
// a canonical path once at open; every operation opens that path again,
// without following symlinks, and requires the directory opened at mount —
// or, if that one was replaced (an export re-created), a directory with the
// same owner. A root that is missing fails every operation with EIO (not
// ENOENT, which would read as "nothing to do"), logged (info) once per episode,
// so a backend that goes away and comes back needs no remount.
//
// Staging. A file is staged as <root>/.ckptfs-tmp/<unique name> (O_EXCL,
// 0600). The staging area is the daemon's own 0700 directory, re-created by
// Stage when it is missing; one that is a symlink, not a directory, or
// owned by another user is refused (EACCES, a transient error, logged once
// per episode) and left in place. Only the source's data extents
// (SEEK_DATA/SEEK_HOLE) are read, hashed (backend/checksum.h) and written
// with io_uring, up to 4 writes of 4 MiB in flight; ftruncate sets the
// size, so holes stay holes, then fdatasync. Publish sets the checksum
// xattr, mtime, owner (daemon running as root only) and mode on the staged
// file, fsyncs it and renames it over the final name, then fsyncs the
// parent directory; a reader of the root therefore sees either the old
// file or the whole new one, never one with the wrong owner. A staged file
// that vanished before its Publish gives ESTALE: stage again.
//
// Several daemons may stage into one backend (a --cluster job, mounts
// sharing a namespace, a CLI command): every staged name carries the
// backend object's random nonce (st-PID-NONCE-N), and each object holds
// an flock on <root>/.ckptfs-tmp/lk-NONCE while it lives. Check (at mount,
// and when the drain probes a failed backend) removes the entries of
// nonces whose lock it can take — their daemon is gone — and keeps those
// of live daemons; entries whose owner cannot be told (no lock file, a
// store without flock, names of an older version) are removed once an
// hour old. (Removing every staged entry, as before, made a restarting
// node delete the files another node was about to publish: ESTALE, a
// retry and an error line, seen in multinode_jobs.) On NFS, flock is a
// lock the server knows (NLM or NFSv4) unless the export is mounted
// `nolock`/`local_lock=flock`: then another node's live entries look
// gone, and its publish is retried (ESTALE), as before. Mkdir and
// Symlink likewise make the new entry in the staging area, with its owner
// and mode, and rename it into place; an existing directory is left as it
// is (never re-owned: it may be another user's). Every namespace change
// fsyncs the directories it touched. Fetch reads the
// backend file's data extents with io_uring into buffers, hashes them and
// writes the blocks that are not all zeros into the destination, so a
// sparse file stays sparse in the tier even on an NFS without SEEK_DATA.
//
// Stat and ListDir (the shared namespace) resolve like everything else:
// the parent (or the directory listed) beneath the root with no symlink
// followed, then fstatat(AT_SYMLINK_NOFOLLOW) of each name; a symlink on
// the way is ELOOP, with no warning (a lookup is not an entry of the log).
//
// Ownership. As root, files, directories made by Mkdir and symlinks get
// the owner and group of the entry (Attrs); directories created implicitly
// as missing parents belong to the daemon (0755): their owner on the mount
// is not known here, and their own mkdir entry, earlier in the log, made
// them already unless it failed. Where the store refuses chown (EPERM or
// EINVAL: a root-squashed NFS) one warning per mount is logged and files
// are published with the daemon's owner, modes still applied. A daemon not
// running as root applies no owner at all and logs nothing about it.
//
// What it gives up: one ring per Stage/Fetch call (a few tens of µs, small
// next to an fsync) instead of a long-lived ring per thread, so nothing is
// shared between threads; where io_uring is unavailable it copies through a
// 4 MiB buffer with pread/pwrite. Two extra syscalls per operation to check
// the root. RENAME_EXCHANGE is passed to the store as is: stores without it
// (NFS) fail the exchange with EINVAL rather than emulate it non-atomically.
// The name ".ckptfs-tmp" (and ".ckptfs-probe-*") at the top of the root is
// reserved: paths under it are rejected with EINVAL. Modes are applied as
// given, so a directory made read-only before a file under it is published
// refuses the publish (EACCES) unless the daemon runs as root.
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/checksum.h"
#include "backend/posix_backend_impl.h"
#include "backend/posix_copy.h"
#include "backend/posix_walk.h"
#include "backend/uring.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/mutex.h"

namespace ckpt::backend {}  // namespace ckpt::backend

namespace ckpt::backend::posiximpl {

Status PosixBackend::Check() {
  auto root = Root();
  if (!root) return Err(root.error());
  std::string probe = UniqueName(kProbePrefix);
  Fd pfd(openat(root->get(), probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!pfd.ok()) return Fail(errno, "check: root not writable: create", Show(probe));
  if (unlinkat(root->get(), probe.c_str(), 0) != 0) return Fail(errno, "check: unlink probe", Show(probe));

  auto tmp = OpenTmp(root->get(), /*create=*/true);
  if (!tmp) return Err(tmp.error());
  // What daemons that are gone left staged (the file comment says how
  // they are told from live ones).
  size_t removed = 0, kept = 0;
  if (int e = RemoveLeftovers(tmp->get(), &removed, &kept)) return Fail(e, "check: remove leftovers in", Show(kTmpDir));
  if (removed) {
    LOG_INFO("posix backend: removed {} leftover staged files from {}{}", removed, Show(kTmpDir),
             kept ? fmt::format(" ({} of live daemons kept)", kept) : "");
    if (auto s = FsyncDirFd(tmp->get(), kTmpDir); !s) return s;
  }
  return {};
}

Status PosixBackend::Mkdir(const std::string& path, const Attrs& a) {
  if (!ValidPath(path)) return Fail(EINVAL, "mkdir: invalid path", path);
  auto root = Root();
  if (!root) return Err(root.error());
  auto parent = OpenParent(root->get(), path, /*create=*/true, "mkdir");
  if (!parent) return Err(parent.error());
  int pfd = parent->dir.get();
  const char* name = parent->name.c_str();
  auto existing = [&]() -> Status {
    struct stat st;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return Fail(errno, "mkdir: stat", Show(path));
    // Replayed, or made as a parent: left as it is. Never re-owned: it
    // may be another user's directory.
    if (S_ISDIR(st.st_mode)) return {};
    if (S_ISLNK(st.st_mode)) return Refuse(ELOOP, "mkdir", path, "a symlink is in the way; not followed");
    return Fail(EEXIST, "mkdir: not a directory:", Show(path));
  };
  struct stat st;
  if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) return existing();
  // Made in the staging area, given its owner and exact mode (mkdir
  // applies the umask and drops S_ISGID), and renamed into place only
  // then: it never shows under its name with the wrong owner or mode,
  // and a failure half-way leaves nothing there for a retry to trust.
  auto tmp = OpenTmp(root->get(), /*create=*/true);
  if (!tmp) return Err(tmp.error() == ELOOP || tmp.error() == ENOTDIR ? EACCES : tmp.error());
  std::string tname = UniqueName("md-");
  if (mkdirat(tmp->get(), tname.c_str(), 0700) != 0) return Fail(errno, "mkdir: create", Show(kTmpDir, tname));
  auto drop = [&] { unlinkat(tmp->get(), tname.c_str(), AT_REMOVEDIR); };
  Fd dir(openat(tmp->get(), tname.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  int e = dir.ok() ? ApplyOwner(dir.get(), "", AT_EMPTY_PATH, a, path) : errno;
  if (!e && fchmod(dir.get(), a.mode ? a.mode & 07777 : 0755) != 0) e = errno;
  if (!e && fsync(dir.get()) != 0 && errno != EINVAL) e = errno;
  if (e) {
    drop();
    return Fail(e, "mkdir: set owner and mode of", Show(path));
  }
  int rc = renameat2(tmp->get(), tname.c_str(), pfd, name, RENAME_NOREPLACE);
  if (rc != 0 && errno == EINVAL)  // no RENAME_NOREPLACE (NFS): absent a moment ago, so a plain rename
    rc = renameat(tmp->get(), tname.c_str(), pfd, name);
  if (rc != 0) {
    e = errno;
    drop();
    if (e == EEXIST || e == ENOTEMPTY || e == ENOTDIR || e == EISDIR) return existing();  // made meanwhile
    return Fail(e, "mkdir: rename into place", Show(path));
  }
  return FsyncDirFd(pfd, Show(ParentOf(path)));
}

Status PosixBackend::Rmdir(const std::string& path) {
  if (!ValidPath(path)) return Fail(EINVAL, "rmdir: invalid path", path);
  auto root = Root();
  if (!root) return Err(root.error());
  auto parent = OpenParent(root->get(), path, /*create=*/false, "rmdir");
  if (!parent) return parent.error() == ENOENT ? Status{} : Err(parent.error());
  int pfd = parent->dir.get();
  const char* name = parent->name.c_str();
  struct stat st;
  if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return Fail(errno, "rmdir: stat", Show(path));
  }
  if (S_ISLNK(st.st_mode)) return Refuse(ELOOP, "rmdir", path, "a symlink, not a directory; not followed");
  if (!S_ISDIR(st.st_mode)) return Fail(ENOTDIR, "rmdir", Show(path));
  Fd dir(openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.ok()) {
    if (errno == ENOENT) return {};
    int e = Classify(pfd, name, errno);
    if (e == ELOOP) return Refuse(ELOOP, "rmdir", path, "a symlink, not a directory; not followed");
    return Fail(e, "rmdir: open", Show(path));
  }
  size_t removed = 0;
  if (int e = RemoveContents(dir.get(), 0, &removed)) {
    if (e == ENAMETOOLONG) return Refuse(e, "rmdir", path, "tree too deep");
    return Fail(e, "rmdir: remove tree", Show(path));
  }
  if (unlinkat(pfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) return Fail(errno, "rmdir", Show(path));
  return FsyncDirFd(pfd, Show(ParentOf(path)));
}

Status PosixBackend::Remove(const std::string& path) {
  if (!ValidPath(path)) return Fail(EINVAL, "remove: invalid path", path);
  auto root = Root();
  if (!root) return Err(root.error());
  auto parent = OpenParent(root->get(), path, /*create=*/false, "remove");
  if (!parent) return parent.error() == ENOENT ? Status{} : Err(parent.error());
  int pfd = parent->dir.get();
  const char* name = parent->name.c_str();
  // unlinkat removes a symlink itself, never its target.
  if (unlinkat(pfd, name, 0) != 0) {
    int e = errno;
    if (e == ENOENT) return {};
    struct stat st;
    if (e == EPERM && fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
      e = EISDIR;  // POSIX says EPERM
    return Fail(e, "remove: unlink", Show(path));
  }
  return FsyncDirFd(pfd, Show(ParentOf(path)));
}

Status PosixBackend::Rename(const std::string& from, const std::string& to, bool exchange) {
  if (!ValidPath(from)) return Fail(EINVAL, "rename: invalid path", from);
  if (!ValidPath(to)) return Fail(EINVAL, "rename: invalid path", to);
  auto root = Root();
  if (!root) return Err(root.error());
  auto pf = OpenParent(root->get(), from, /*create=*/false, "rename");
  if (!pf) return Err(pf.error());
  struct stat st;
  if (fstatat(pf->dir.get(), pf->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return Fail(errno, "rename: stat source", Show(from));
  auto pt = OpenParent(root->get(), to, /*create=*/true, "rename");
  if (!pt) return Err(pt.error());
  if (renameat2(pf->dir.get(), pf->name.c_str(), pt->dir.get(), pt->name.c_str(), exchange ? RENAME_EXCHANGE : 0) != 0)
    return Fail(errno, exchange ? "rename: exchange with" : "rename: to", Show(from) + "' -> '" + Show(to));
  if (auto s = FsyncDirFd(pt->dir.get(), Show(ParentOf(to))); !s) return s;
  if (ParentOf(from) != ParentOf(to)) return FsyncDirFd(pf->dir.get(), Show(ParentOf(from)));
  return {};
}

Status PosixBackend::Symlink(const std::string& path, const std::string& target, const Attrs& a) {
  if (!ValidPath(path)) return Fail(EINVAL, "symlink: invalid path", path);
  if (target.empty() || target.find('\0') != std::string::npos)
    return Fail(EINVAL, "symlink: invalid target for", path);
  auto root = Root();
  if (!root) return Err(root.error());
  auto parent = OpenParent(root->get(), path, /*create=*/true, "symlink");
  if (!parent) return Err(parent.error());
  auto tmp = OpenTmp(root->get(), /*create=*/true);
  if (!tmp) return Err(tmp.error() == ELOOP || tmp.error() == ENOTDIR ? EACCES : tmp.error());
  // Made in the staging area, given its owner, and renamed over `path`:
  // an existing entry is replaced in one step.
  std::string name = UniqueName("sl-");
  if (symlinkat(target.c_str(), tmp->get(), name.c_str()) != 0)
    return Fail(errno, "symlink: create", Show(kTmpDir, name));
  if (int e = ApplyOwner(tmp->get(), name.c_str(), AT_SYMLINK_NOFOLLOW, a, path)) {
    unlinkat(tmp->get(), name.c_str(), 0);
    return Fail(e, "symlink: chown", Show(path));
  }
  return ReplaceWith(tmp->get(), name, *parent, path, "symlink");
}

Status PosixBackend::Link(const std::string& from, const std::string& to) {
  if (!ValidPath(from)) return Fail(EINVAL, "link: invalid path", from);
  if (!ValidPath(to)) return Fail(EINVAL, "link: invalid path", to);
  auto root = Root();
  if (!root) return Err(root.error());
  auto pf = OpenParent(root->get(), from, /*create=*/false, "link");
  if (!pf) return Err(pf.error());
  struct stat st;
  if (fstatat(pf->dir.get(), pf->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return Fail(errno, "link: stat source", Show(from));
  auto pt = OpenParent(root->get(), to, /*create=*/true, "link");
  if (!pt) return Err(pt.error());
  auto tmp = OpenTmp(root->get(), /*create=*/true);
  if (!tmp) return Err(tmp.error() == ELOOP || tmp.error() == ENOTDIR ? EACCES : tmp.error());
  std::string name = UniqueName("ln-");
  // No AT_SYMLINK_FOLLOW: a symlink entry gets a second name, its target nothing.
  if (linkat(pf->dir.get(), pf->name.c_str(), tmp->get(), name.c_str(), 0) != 0)
    return Fail(errno, "link: link", Show(from));
  return ReplaceWith(tmp->get(), name, *pt, to, "link");
}

Status PosixBackend::SetAttr(const std::string& path, const Attrs& a) {
  if (!ValidPath(path)) return Fail(EINVAL, "setattr: invalid path", path);
  if (a.mtime_nsec >= 1000000000u) return Fail(EINVAL, "setattr: invalid mtime nsec for", path);
  auto root = Root();
  if (!root) return Err(root.error());
  auto parent = OpenParent(root->get(), path, /*create=*/false, "setattr");
  if (!parent) return Err(parent.error());
  int pfd = parent->dir.get();
  const char* name = parent->name.c_str();
  // An O_PATH descriptor of the entry itself (a symlink stays a symlink).
  Fd ent(openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!ent.ok()) return Fail(errno, "setattr: open", Show(path));
  struct stat st;
  if (fstat(ent.get(), &st) != 0) return Fail(errno, "setattr: fstat", Show(path));
  timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(a.mtime_sec), static_cast<long>(a.mtime_nsec)}};
  if (S_ISLNK(st.st_mode)) {
    // A symlink's own mode means nothing and cannot be changed on Linux.
    if (int e = ApplyOwner(ent.get(), "", AT_EMPTY_PATH, a, path)) return Fail(e, "setattr: chown", Show(path));
    if (utimensat(pfd, name, times, AT_SYMLINK_NOFOLLOW) != 0) return Fail(errno, "setattr: utimes", Show(path));
    return {};
  }
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return Refuse(EINVAL, "setattr", path, "not a file or directory");
  // A readable descriptor to change and fsync it through; where the mode
  // denies reading (daemon not root), the O_PATH one via /proc.
  Fd fd(openat(pfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  struct stat st2;
  if (fd.ok() && (fstat(fd.get(), &st2) != 0 || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev))
    return Fail(EAGAIN, "setattr: replaced while opened:", Show(path));
  if (int e = ApplyOwner(ent.get(), "", AT_EMPTY_PATH, a, path)) return Fail(e, "setattr: chown", Show(path));
  if (fd.ok()) {
    if (a.mode != 0 && fchmod(fd.get(), a.mode & 07777) != 0) return Fail(errno, "setattr: chmod", Show(path));
    if (futimens(fd.get(), times) != 0) return Fail(errno, "setattr: utimes", Show(path));
    if (fsync(fd.get()) != 0) return Fail(errno, "setattr: fsync", Show(path));
    return {};
  }
  LOG_DEBUG("posix backend: setattr: cannot open '{}' ({}); through /proc", Show(path), ErrStr(errno));
  char proc[64];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", ent.get());
  if (a.mode != 0 && fchmodat(AT_FDCWD, proc, a.mode & 07777, 0) != 0) return Fail(errno, "setattr: chmod", Show(path));
  if (utimensat(AT_FDCWD, proc, times, 0) != 0) return Fail(errno, "setattr: utimes", Show(path));
  return {};  // not fsynced: the store writes the change back in time
}

std::unexpected<int> PosixBackend::Refuse(int e, std::string_view op, const std::string& rel,
                                          std::string_view why) const {
  std::string line = fmt::format("posix backend: {} '{}': {}: {}", op, Show(rel), why, ErrStr(e));
  std::lock_guard lk(refused_mu_);
  if (line == last_refusal_) {
    LOG_DEBUG("{}", line);
  } else {
    LOG_WARN("{}", line);
    last_refusal_ = std::move(line);
  }
  return Err(e);
}

Result<Fd> PosixBackend::Root() {
  int fd = OpenDirNoSymlinks(canon_);
  if (fd < 0) return RootMissing(errno, "cannot be opened");
  Fd root(fd);
  struct stat st;
  if (fstat(root.get(), &st) != 0) return RootMissing(errno, "cannot be examined");
  MutexLock lk(&root_mu_);
  const bool never_seen = root_dev_ == 0 && root_ino_ == 0;  // a degraded mount's root appearing
  if (st.st_dev != root_dev_ || st.st_ino != root_ino_) {
    if (st.st_uid != root_uid_) {
      if (!root_missing_ || (never_seen && !foreign_noted_)) {
        foreign_noted_ = true;
        LOG_ERROR("posix backend: root '{}' was replaced by a directory owned by uid {}, not {}; not using it", root_,
                  st.st_uid, root_uid_);
        root_missing_ = true;
      }
      return Err(EIO);
    }
    if (!never_seen)
      LOG_WARN("posix backend: root '{}' was replaced by another directory (same owner); using the new one", root_);
    root_dev_ = st.st_dev;
    root_ino_ = st.st_ino;
  }
  if (root_missing_) {
    LOG_INFO("posix backend: root '{}' is back", root_);
    root_missing_ = false;
  }
  return root;
}

std::unexpected<int> PosixBackend::RootMissing(int e, std::string_view what) {
  MutexLock lk(&root_mu_);
  if (!root_missing_) {
    // Info, not a warning: the drainer logs the failure itself, once per
    // episode; this line says why.
    LOG_INFO("posix backend: root '{}' {} ({}); the store is unavailable until it is back", root_, what, ErrStr(e));
    root_missing_ = true;
  }
  return Err(EIO);
}

Result<Parent> PosixBackend::OpenParent(int root, const std::string& rel, bool create, std::string_view op) {
  std::string dir = ParentOf(rel);
  Resolved r = OpenDirBeneath(root, dir, O_RDONLY, create ? 0755 : 0);
  if (!r.fd.ok() && r.err == EACCES && !create)  // no read permission (daemon not root): O_PATH will do
    r = OpenDirBeneath(root, dir, O_PATH, 0);
  if (!r.fd.ok()) {
    if (r.err == ELOOP)
      return Refuse(ELOOP, op, rel, fmt::format("'{}' is a symlink; not followed", r.bad.empty() ? dir : r.bad));
    if (r.err == ENOTDIR)
      return Refuse(ENOTDIR, op, rel, fmt::format("'{}' is not a directory", r.bad.empty() ? dir : r.bad));
    if (r.err == EXDEV) return Refuse(ELOOP, op, rel, "resolves outside the root");
    if (r.err == ENAMETOOLONG) return Refuse(r.err, op, rel, "name too long");
    return Fail(r.err, std::string(op) + ": open parent of", Show(rel));
  }
  return Parent{std::move(r.fd), LeafOf(rel)};
}

int PosixBackend::RemoveContents(int dfd, int depth, size_t* removed) {
  if (depth > kMaxTreeDepth) return ENAMETOOLONG;
  std::vector<std::string> names;
  if (int e = ReadNames(dfd, /*at_root=*/false, &names)) return e;
  for (const auto& n : names) {
    if (int e = RemoveName(dfd, n, depth)) return e;
    ++*removed;
  }
  return 0;
}

int PosixBackend::RemoveName(int dfd, const std::string& n, int depth) {
  for (int tries = 0;; tries++) {
    if (unlinkat(dfd, n.c_str(), 0) == 0 || errno == ENOENT) return 0;
    if ((errno != EISDIR && errno != EPERM) || tries > 4) return errno;
    Fd sub(openat(dfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.ok()) {
      if (errno == ENOENT) return 0;
      if (errno == ELOOP || errno == ENOTDIR) continue;  // swapped for a link or file: unlink that
      return errno;
    }
    size_t ignored = 0;
    if (int e = RemoveContents(sub.get(), depth + 1, &ignored)) return e;
    if (unlinkat(dfd, n.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
    if (errno != ENOTEMPTY || tries > 4) return errno;  // refilled meanwhile: again
  }
}

}  // namespace ckpt::backend::posiximpl

namespace ckpt::backend {

using posiximpl::Fail;

bool ValidRecordName(const std::string& s) {
  return !s.empty() && s.size() <= 255 && s[0] != '.' && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

Result<std::unique_ptr<Backend>> OpenPosixBackend(const std::string& root) {
  if (root.empty()) return Fail(EINVAL, "open: empty root", root);
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(root, ec);
  if (ec) return Fail(ec.value(), "open: resolve", root);
  std::string r = abs.lexically_normal().string();
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  // The operator's path may go through symlinks; resolve them once, now.
  char* real = realpath(r.c_str(), nullptr);
  if (!real) return Fail(errno, "open: resolve root", r);
  std::string canon(real);
  free(real);
  struct stat st;
  if (stat(canon.c_str(), &st) != 0) return Fail(errno, "open: stat root", r);
  if (!S_ISDIR(st.st_mode)) return Fail(ENOTDIR, "open: root", r);
  try {
    return std::make_unique<posiximpl::PosixBackend>(std::move(r), std::move(canon), st);
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

Result<std::unique_ptr<Backend>> OpenMissingPosixBackend(const std::string& root, uid_t owner) {
  if (root.empty() || root[0] != '/') return Fail(EINVAL, "open: not an absolute root", root);
  std::string r = std::filesystem::path(root).lexically_normal().string();
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  // Symlinks in the part that exists now are resolved once, as at a normal
  // open; the rest is taken as written (Root refuses symlinks in it).
  std::filesystem::path head(r), tail;
  char* real = nullptr;
  while (!(real = realpath(head.c_str(), nullptr)) && head.has_relative_path()) {
    tail = head.filename() / tail;
    head = head.parent_path();
  }
  std::string canon = real ? (std::filesystem::path(real) / tail).lexically_normal().string() : r;
  free(real);
  while (canon.size() > 1 && canon.back() == '/') canon.pop_back();
  struct stat never{};  // dev 0, ino 0: no directory seen yet
  never.st_uid = owner;
  try {
    return std::make_unique<posiximpl::PosixBackend>(std::move(r), std::move(canon), never);
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

}  // namespace ckpt::backend
