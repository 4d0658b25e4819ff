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
#include "backend/posix_copy.h"
#include "backend/posix_walk.h"
#include "backend/uring.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/mutex.h"

namespace ckpt::backend {

namespace {

using namespace posix;

constexpr char kProbePrefix[] = ".ckptfs-probe-";
constexpr int kMaxTreeDepth = 256;  // Rmdir: deeper trees are refused (ENAMETOOLONG)
constexpr char kLockPrefix[] = "lk-";  // <staging area>/lk-NONCE: flock'd while its backend lives

// The nonce in a staging-area name: lk-NONCE, or XX-PID-NONCE-N (UniqueName).
std::optional<uint64_t> StagedOwner(std::string_view n) {
  if (n.starts_with(kLockPrefix)) return Hex64(n.substr(sizeof kLockPrefix - 1));
  return StagedNonce(n);
}

// Returns the errno, with a debug line naming the operation and the path.
// The caller decides what is worth an error line: the drainer logs one per
// episode of failures, and ENOENT is often an expected answer.
std::unexpected<int> Fail(int e, std::string_view what, std::string_view path) {
  LOG_DEBUG("posix backend: {} '{}': {}", what, path, ErrStr(e));
  return Err(e);
}

// Whether `path` is a relative path this backend accepts: no leading '/',
// no empty, "." or ".." component, nothing in the reserved names at the top.
bool ValidPath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  size_t pos = 0;
  bool first = true;
  for (;;) {
    size_t slash = path.find('/', pos);
    std::string_view comp(path.data() + pos, (slash == std::string::npos ? path.size() : slash) - pos);
    if (comp.empty() || comp == "." || comp == "..") return false;
    if (first && (comp == kTmpDir || comp == kClusterDir || comp.starts_with(kProbePrefix))) return false;
    first = false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

// Makes a directory durable: its entries survive a crash. A directory
// opened O_PATH (no read permission, daemon not root) cannot be fsynced:
// its entries reach the store when it writes them back.
Status FsyncDirFd(int fd, std::string_view what) {
  if (fsync(fd) != 0 && errno != EINVAL && errno != EBADF) return Fail(errno, "fsync directory", what);
  return {};
}

// The parent directory of an entry, open, and the entry's name in it.
struct Parent {
  Fd dir;
  std::string name;
};

class PosixBackend final : public Backend {
 public:
  PosixBackend(std::string root, std::string canon, const struct stat& st)
      : root_(std::move(root)),
        canon_(std::move(canon)),
        root_dev_(st.st_dev),
        root_ino_(st.st_ino),
        root_uid_(st.st_uid),
        apply_owner_(geteuid() == 0),
        nonce_(Nonce()) {}

  std::string Describe() const override { return "posix:" + root_; }

  Status Check() override {
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
    if (int e = RemoveLeftovers(tmp->get(), &removed, &kept))
      return Fail(e, "check: remove leftovers in", Show(kTmpDir));
    if (removed) {
      LOG_INFO("posix backend: removed {} leftover staged files from {}{}", removed, Show(kTmpDir),
               kept ? fmt::format(" ({} of live daemons kept)", kept) : "");
      if (auto s = FsyncDirFd(tmp->get(), kTmpDir); !s) return s;
    }
    return {};
  }

  Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) override {
    struct stat st;
    if (fstat(src_fd, &st) != 0) return Fail(errno, "stage: fstat source fd", std::to_string(src_fd));
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < size) {
      LOG_ERROR("posix backend: stage: source fd {} holds {} bytes, {} expected", src_fd, st.st_size, size);
      return Err(EIO);
    }
    auto root = Root();
    if (!root) return Err(root.error());
    auto tmp = OpenTmp(root->get(), /*create=*/true);
    if (!tmp) {
      // Not the entry's fault: a transient error, retried.
      int e = tmp.error();
      return Err(e == ELOOP || e == ENOTDIR ? EACCES : e);
    }
    std::string name;
    int raw = -1;
    for (int tries = 0; raw < 0; tries++) {
      name = UniqueName("st-");
      raw = openat(tmp->get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (raw < 0 && (errno != EEXIST || tries >= 8)) return Fail(errno, "stage: create", Show(kTmpDir, name));
    }
    Fd fd(raw);
    auto drop = [&] { unlinkat(tmp->get(), name.c_str(), 0); };
    ContentHash hash;
    if (!hash.ok()) {
      drop();
      return Fail(ENOMEM, "stage: hash state for", Show(kTmpDir, name));
    }

    int err = 0;
    bool read_failed = false;
    Extents ext(src_fd, size);
    std::unique_ptr<Ring> ring = size > 0 ? MakeRing() : nullptr;
    if (ring) {
      err = RingStage(*ring, src_fd, ext, fd.get(), cancelled, &hash, &read_failed);
      ring.reset();  // nothing stays in flight past here
    } else if (size > 0) {
      bool first = true;
      err = BufferedReadChunks(src_fd, ext, cancelled, &read_failed, [&](uint64_t off, uint64_t len, const char* p) {
        hash.Update(off, p, len);
        int e = PwriteFull(fd.get(), p, len, off);
        if (first && !e) FAILPOINT("drain.mid_transfer");
        first = false;
        return e;
      });
    }
    // Holes at the end (or all over) are made by the size alone.
    if (!err && ftruncate(fd.get(), static_cast<off_t>(size)) != 0) err = errno;
    if (!err && fdatasync(fd.get()) != 0) err = errno;
    if (!err) DropCache(fd.get());
    if (err) {
      drop();
      if (err == ECANCELED) {
        LOG_DEBUG("posix backend: stage of {} bytes into {} cancelled", size, Show(kTmpDir, name));
        return Err(err);
      }
      return Fail(err, read_failed ? "stage: read source for" : "stage: write", Show(kTmpDir, name));
    }
    auto [hi, lo] = hash.Finish(size);
    return Staged{name, size, hi, lo};
  }

  Status Publish(const Staged& s, const std::string& path, const Attrs& a) override {
    if (!ValidPath(path)) return Fail(EINVAL, "publish: invalid path", path);
    if (!ValidToken(s.token)) return Fail(EINVAL, "publish: invalid staged token", s.token);
    if (a.mtime_nsec >= 1000000000u) return Fail(EINVAL, "publish: invalid mtime nsec for", path);
    auto root = Root();
    if (!root) return Err(root.error());
    auto tmp = OpenTmp(root->get(), /*create=*/false);
    if (!tmp) {
      if (tmp.error() == ENOENT) return Fail(ESTALE, "publish: staging area gone; stage again:", path);
      int e = tmp.error();
      return Err(e == ELOOP || e == ENOTDIR ? EACCES : e);
    }
    Fd fd(openat(tmp->get(), s.token.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.ok()) {
      if (errno == ENOENT) return Fail(ESTALE, "publish: staged file gone; stage again:", Show(kTmpDir, s.token));
      return Fail(errno, "publish: open staged", Show(kTmpDir, s.token));
    }
    std::string staged = Show(kTmpDir, s.token);

    // The xattr first: setting a user.* xattr needs write permission, which
    // the final mode may not grant. The owner before the mode: chown clears
    // the set-user-ID and set-group-ID bits.
    std::string hex = ChecksumHex(s.checksum_hi, s.checksum_lo);
    if (fsetxattr(fd.get(), kChecksumXattr, hex.data(), hex.size(), 0) != 0 && errno != ENOTSUP)
      return Fail(errno, "publish: set checksum xattr on", staged);
    timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(a.mtime_sec), static_cast<long>(a.mtime_nsec)}};
    if (futimens(fd.get(), times) != 0) return Fail(errno, "publish: set mtime on", staged);
    if (int e = ApplyOwner(fd.get(), "", AT_EMPTY_PATH, a, path)) return Fail(e, "publish: chown", staged);
    if (a.mode != 0 && fchmod(fd.get(), a.mode & 07777) != 0) return Fail(errno, "publish: chmod", staged);
    if (fsync(fd.get()) != 0) return Fail(errno, "publish: fsync", staged);

    auto parent = OpenParent(root->get(), path, /*create=*/true, "publish");
    if (!parent) return Err(parent.error());
    if (renameat(tmp->get(), s.token.c_str(), parent->dir.get(), parent->name.c_str()) != 0) {
      int e = errno;
      struct stat st;
      if (e == ENOENT && fstatat(tmp->get(), s.token.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        return Fail(ESTALE, "publish: staged file gone; stage again:", staged);
      if (e == EISDIR || e == ENOTDIR) return Refuse(e, "publish", path, "a directory is in the way");
      return Fail(e, "publish: rename to", Show(path));
    }
    return FsyncDirFd(parent->dir.get(), Show(ParentOf(path)));
  }

  void Abort(const Staged& s) override {
    if (!ValidToken(s.token)) return;
    auto root = Root();
    if (!root) return;
    auto tmp = OpenTmp(root->get(), /*create=*/false);
    if (!tmp) return;
    if (unlinkat(tmp->get(), s.token.c_str(), 0) != 0 && errno != ENOENT)
      LOG_WARN("posix backend: abort: unlink '{}': {}", Show(kTmpDir, s.token), ErrStr(errno));
  }

  Status Mkdir(const std::string& path, const Attrs& a) override {
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

  Status Rmdir(const std::string& path) override {
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

  Status Remove(const std::string& path) override {
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

  Status Rename(const std::string& from, const std::string& to, bool exchange) override {
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
    if (renameat2(pf->dir.get(), pf->name.c_str(), pt->dir.get(), pt->name.c_str(), exchange ? RENAME_EXCHANGE : 0) !=
        0)
      return Fail(errno, exchange ? "rename: exchange with" : "rename: to", Show(from) + "' -> '" + Show(to));
    if (auto s = FsyncDirFd(pt->dir.get(), Show(ParentOf(to))); !s) return s;
    if (ParentOf(from) != ParentOf(to)) return FsyncDirFd(pf->dir.get(), Show(ParentOf(from)));
    return {};
  }

  Status Symlink(const std::string& path, const std::string& target, const Attrs& a) override {
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

  Status Link(const std::string& from, const std::string& to) override {
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

  Status SetAttr(const std::string& path, const Attrs& a) override {
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
    if (a.mode != 0 && fchmodat(AT_FDCWD, proc, a.mode & 07777, 0) != 0)
      return Fail(errno, "setattr: chmod", Show(path));
    if (utimensat(AT_FDCWD, proc, times, 0) != 0) return Fail(errno, "setattr: utimes", Show(path));
    return {};  // not fsynced: the store writes the change back in time
  }

  Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd, uint64_t size) override {
    if (!ValidPath(path)) return Fail(EINVAL, "fetch: invalid path", path);
    auto root = Root();
    if (!root) return Err(root.error());
    auto parent = OpenParent(root->get(), path, /*create=*/false, "fetch");
    if (!parent) return Err(parent.error());
    // O_NONBLOCK: a FIFO planted under the name must not hang the open.
    Fd fd(openat(parent->dir.get(), parent->name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!fd.ok()) {
      if (errno == ELOOP) return Refuse(ELOOP, "fetch", path, "a symlink; not followed");
      return Fail(errno, "fetch: open", Show(path));
    }
    std::string p = Show(path);
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return Fail(errno, "fetch: fstat", p);
    if (!S_ISREG(st.st_mode)) return Fail(EIO, "fetch: not a regular file:", p);
    if (static_cast<uint64_t>(st.st_size) != size) {
      LOG_ERROR("posix backend: fetch '{}': holds {} bytes, {} expected", p, st.st_size, size);
      return Err(EIO);
    }
    struct stat dst;
    if (fstat(dst_fd, &dst) != 0) return Fail(errno, "fetch: fstat destination for", p);
    if (static_cast<uint64_t>(dst.st_size) < size) {
      LOG_ERROR("posix backend: fetch '{}': destination holds {} bytes, {} needed", p, dst.st_size, size);
      return Err(EINVAL);
    }
    ContentHash hash;
    if (!hash.ok()) return Fail(ENOMEM, "fetch: hash state for", p);
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);

    int err = 0;
    bool read_failed = false;
    Extents ext(fd.get(), size);
    auto deliver = [&](uint64_t off, uint64_t len, const char* data) -> int {
      hash.Update(off, data, len);
      return WriteNonZero(dst_fd, data, len, off, kChecksumBlock);
    };
    std::unique_ptr<Ring> ring = size > 0 ? MakeRing() : nullptr;
    if (ring) {
      err = RingReadChunks(*ring, fd.get(), ext, &read_failed, deliver);
      ring.reset();
    } else if (size > 0) {
      err = BufferedReadChunks(fd.get(), ext, {}, &read_failed, deliver);
    }
    if (err) return Fail(err, read_failed ? "fetch: read" : "fetch: write destination for", p);
    DropCache(fd.get());  // the tier holds the bytes now
    return hash.Finish(size);
  }

  Status List(const std::function<void(const Entry&)>& fn) override {
    auto root = Root();
    if (!root) return Err(root.error());
    int fd = openat(root->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Fail(errno, "list: open", root_);
    return Walk(fd, "", fn);
  }

  Result<Entry> Stat(const std::string& path) override {
    if (!ValidPath(path)) return Fail(EINVAL, "stat: invalid path", path);
    auto root = Root();
    if (!root) return Err(root.error());
    // O_PATH is enough to fstatat, readlinkat and openat beneath it, and
    // needs no read permission on the directories on the way.
    Resolved r = OpenDirBeneath(root->get(), ParentOf(path), O_PATH, 0);
    if (!r.fd.ok()) return Fail(r.err == EXDEV ? ELOOP : r.err, "stat: open parent of", Show(path));
    auto e = EntryAt(r.fd.get(), LeafOf(path), path);
    if (!e) return Fail(e.error() == ENOTSUP ? EINVAL : e.error(), "stat", Show(path));
    return e;
  }

  Result<std::vector<Entry>> ListDir(const std::string& dir) override {
    if (!dir.empty() && !ValidPath(dir)) return Fail(EINVAL, "listdir: invalid path", dir);
    auto root = Root();
    if (!root) return Err(root.error());
    Resolved r = OpenDirBeneath(root->get(), dir, O_RDONLY, 0);
    if (!r.fd.ok()) return Fail(r.err == EXDEV ? ELOOP : r.err, "listdir: open", Show(dir));
    std::vector<std::string> names;
    if (int e = ReadNames(r.fd.get(), dir.empty(), &names)) return Fail(e, "listdir: readdir", Show(dir));
    std::vector<Entry> out;
    out.reserve(names.size());
    for (const auto& name : names) {
      auto e = EntryAt(r.fd.get(), name, dir.empty() ? name : dir + "/" + name);
      if (!e && (e.error() == ENOENT || e.error() == ENOTSUP)) continue;  // gone meanwhile, or a fifo...
      if (!e) return Fail(e.error(), "listdir", Show(dir, name));
      out.push_back(std::move(*e));
    }
    return out;
  }

  Status PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) override {
    if (!ValidRecordName(dir) || !ValidRecordName(name)) return Fail(EINVAL, "put record: invalid name", dir + "/" + name);
    if (bytes.size() > kMaxRecordBytes) return Fail(EFBIG, "put record: too large", dir + "/" + name);
    auto root = Root();
    if (!root) return Err(root.error());
    auto d = OpenRecordDir(root->get(), dir, /*create=*/true);
    if (!d) return Err(d.error());
    const std::string where = Show(std::string(kClusterDir) + "/" + dir, name);
    std::string tmp;
    int raw = -1;
    for (int tries = 0; raw < 0; tries++) {
      tmp = UniqueName(".tmp-");
      raw = openat(d->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (raw < 0 && (errno != EEXIST || tries >= 8)) return Fail(errno, "put record: create temporary for", where);
    }
    Fd fd(raw);
    int err = PwriteFull(fd.get(), bytes.data(), bytes.size(), 0);
    if (!err && fsync(fd.get()) != 0) err = errno;
    if (!err && renameat(d->get(), tmp.c_str(), d->get(), name.c_str()) != 0) err = errno;
    if (err) {
      unlinkat(d->get(), tmp.c_str(), 0);
      return Fail(err, "put record", where);
    }
    return FsyncDirFd(d->get(), where);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& dir) override {
    if (!ValidRecordName(dir)) return Fail(EINVAL, "list records: invalid name", dir);
    auto root = Root();
    if (!root) return Err(root.error());
    std::vector<std::pair<std::string, std::string>> out;
    auto d = OpenRecordDir(root->get(), dir, /*create=*/false);
    if (!d && d.error() == ENOENT) return out;
    if (!d) return Err(d.error());
    std::vector<std::string> names;
    if (int e = ReadNames(d->get(), false, &names)) return Fail(e, "list records: readdir", Show(kClusterDir, dir));
    for (const std::string& n : names) {
      if (!ValidRecordName(n)) continue;  // temporaries (".tmp-...") and anything not a record's name
      Fd fd(openat(d->get(), n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
      if (!fd.ok()) {
        if (errno == ENOENT || errno == ELOOP) continue;  // replaced meanwhile, or a symlink: not a record
        return Fail(errno, "list records: open", Show(std::string(kClusterDir) + "/" + dir, n));
      }
      struct stat st;
      if (fstat(fd.get(), &st) != 0) return Fail(errno, "list records: stat", Show(kClusterDir, dir));
      if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxRecordBytes) {
        LOG_DEBUG("posix backend: list records: '{}' is not a regular file of at most {} bytes; skipped", n,
                  kMaxRecordBytes);
        continue;
      }
      std::string bytes(static_cast<size_t>(st.st_size), '\0');
      ssize_t got = pread(fd.get(), bytes.data(), bytes.size(), 0);
      if (got < 0) return Fail(errno, "list records: read", Show(std::string(kClusterDir) + "/" + dir, n));
      bytes.resize(static_cast<size_t>(got));
      out.emplace_back(n, std::move(bytes));
    }
    return out;
  }

 private:
  // The path of `rel` for log lines ("<root>/a/b"); of the root when empty.
  std::string Show(std::string_view rel) const {
    return rel.empty() ? root_ : (root_ == "/" ? "" : root_) + "/" + std::string(rel);
  }
  std::string Show(std::string_view dir, std::string_view name) const {
    return Show(std::string(dir) + "/" + std::string(name));
  }

  // A permanent error for one entry: one warning line with the path.
  // One warning per refusal, not one per retry: the drain retries a
  // refused entry while it holds at it (fs/drain/drain.h), and says so itself.
  std::unexpected<int> Refuse(int e, std::string_view op, const std::string& rel, std::string_view why) const {
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
  mutable std::mutex refused_mu_;
  mutable std::string last_refusal_;  // the last refusal warned of (under refused_mu_)

  static uint64_t Nonce() {
    std::random_device rd;
    return static_cast<uint64_t>(rd()) << 32 | rd();
  }

  static bool ValidToken(const std::string& t) {
    return !t.empty() && t != "." && t != ".." && t.find('/') == std::string::npos && t.find('\0') == std::string::npos;
  }

  // A name no other call of this process, nor (with the random nonce)
  // another daemon on the same store, picks.
  std::string UniqueName(std::string_view prefix) {
    char buf[80];
    std::snprintf(buf, sizeof buf, "%.*s%x-%llx-%llx", static_cast<int>(prefix.size()), prefix.data(),
                  static_cast<unsigned>(getpid()), static_cast<unsigned long long>(nonce_),
                  static_cast<unsigned long long>(counter_.fetch_add(1, std::memory_order_relaxed)));
    return buf;
  }

  // The root, opened O_PATH by its canonical path without following
  // symlinks; see the file comment. EIO (logged once per episode) while
  // it is missing, not a directory, or not the directory it was.
  Result<Fd> Root() EXCLUDES(root_mu_) {
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

  std::unexpected<int> RootMissing(int e, std::string_view what) EXCLUDES(root_mu_) {
    MutexLock lk(&root_mu_);
    if (!root_missing_) {
      // Info, not a warning: the drainer logs the failure itself, once per
      // episode; this line says why.
      LOG_INFO("posix backend: root '{}' {} ({}); the store is unavailable until it is back", root_, what, ErrStr(e));
      root_missing_ = true;
    }
    return Err(EIO);
  }

  // The staging area, open. With `create`, a missing one is made (0700).
  // Refused, and left as it is: a symlink (ELOOP), a non-directory
  // (ENOTDIR), a directory owned by another user (EACCES). Logged once per
  // episode; ENOENT (without `create`) is not logged.
  Result<Fd> OpenTmp(int root, bool create) {
    for (int tries = 0;; tries++) {
      Fd fd(openat(root, kTmpDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.ok()) {
        int e = errno;
        if (e == ENOENT && create && tries < 2) {
          if (mkdirat(root, kTmpDir, 0700) == 0) {
            LOG_INFO("posix backend: staging area {} (re-)created", Show(kTmpDir));
            Fd r(openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
            if (r.ok()) (void)fsync(r.get());
          } else if (errno != EEXIST) {
            return Fail(errno, "mkdir staging area", Show(kTmpDir));
          }
          continue;
        }
        e = Classify(root, kTmpDir, e);
        if (e == ELOOP) return TmpBad(ELOOP, "is a symlink");
        if (e == ENOTDIR) return TmpBad(ENOTDIR, "is not a directory");
        return Fail(e, "open staging area", Show(kTmpDir));
      }
      struct stat st;
      if (fstat(fd.get(), &st) != 0) return Fail(errno, "stat staging area", Show(kTmpDir));
      if (st.st_uid != geteuid()) return TmpBad(EACCES, fmt::format("is owned by uid {}, not the daemon's", st.st_uid));
      if ((st.st_mode & 077) != 0) {
        LOG_WARN("posix backend: staging area {} had mode {:o}; set to 0700", Show(kTmpDir), st.st_mode & 07777);
        if (fchmod(fd.get(), 0700) != 0) return Fail(errno, "chmod staging area", Show(kTmpDir));
      }
      tmp_bad_.store(false, std::memory_order_relaxed);
      if (create) HoldLock(fd.get());  // before anything is staged there
      return fd;
    }
  }

  // This backend's lk-NONCE in the staging area `tmp`, flock'd: made when
  // there is none yet or the area was removed with it (no links left).
  // Without it (a store without flock) this daemon's entries are judged by
  // age by the others (one warning).
  void HoldLock(int tmp) EXCLUDES(lock_mu_) {
    MutexLock lk(&lock_mu_);
    struct stat st;
    if (lock_.ok() && fstat(lock_.get(), &st) == 0 && st.st_nlink > 0) return;
    std::string name = fmt::format("{}{:x}", kLockPrefix, nonce_);
    Fd fd(openat(tmp, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    int e = fd.ok() && flock(fd.get(), LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    if (e && !lock_warned_) {
      lock_warned_ = true;
      LOG_WARN("posix backend: cannot lock {} ({}): other daemons on this backend remove this one's staged files "
               "only once an hour old",
               Show(kTmpDir, name), ErrStr(e));
    }
    lock_ = std::move(fd);
  }

  // Removes, from the staging area `tmp`, the entries of daemons that are
  // gone: those of a nonce whose lock file can be locked (then the lock
  // file too), and those of no known owner once kStaleStagedSec old. This
  // daemon's and live daemons' entries stay (counted in *kept).
  int RemoveLeftovers(int tmp, size_t* removed, size_t* kept) {
    std::vector<std::string> names;
    if (int e = ReadNames(tmp, /*at_root=*/false, &names)) return e;
    std::map<uint64_t, std::vector<std::string>> by_owner;
    std::vector<std::string> unowned;
    for (auto& n : names) {
      if (auto o = StagedOwner(n)) {
        by_owner[*o].push_back(std::move(n));
      } else {
        unowned.push_back(std::move(n));
      }
    }
    const int64_t stale_before = static_cast<int64_t>(time(nullptr)) - kStaleStagedSec;
    auto stale = [&](const std::string& n) {
      struct stat st;
      return fstatat(tmp, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_mtime < stale_before;
    };
    auto remove_if = [&](const std::vector<std::string>& list, bool all) -> int {
      for (const auto& n : list) {
        if (!all && !stale(n)) {
          ++*kept;
          continue;
        }
        if (int e = RemoveName(tmp, n, 0)) return e;
        ++*removed;
      }
      return 0;
    };
    for (auto& [owner, list] : by_owner) {
      if (owner == nonce_) continue;
      std::string lock = fmt::format("{}{:x}", kLockPrefix, owner);
      std::erase(list, lock);
      // O_NONBLOCK: a FIFO planted under that name must not stall the mount.
      Fd fd(openat(tmp, lock.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      int e = !fd.ok() ? errno : flock(fd.get(), LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
      if (e == 0) {
        // Gone: its entries, then its lock file (unlinked while held).
        if (int r = remove_if(list, /*all=*/true)) return r;
        if (unlinkat(tmp, lock.c_str(), 0) != 0 && errno != ENOENT) return errno;
      } else if (e == EWOULDBLOCK) {
        *kept += list.size();  // live
      } else if (int r = remove_if(list, /*all=*/false)) {  // no lock file, or no flock here
        return r;
      }
    }
    return remove_if(unowned, /*all=*/false);
  }

  // The records' directory `dir` of the cluster area, open, beneath `root`
  // and never through a symlink. With `create`, the area and `dir` are made
  // (0700) when missing. An area or `dir` that is a symlink (ELOOP), not a
  // directory (ENOTDIR) or not the daemon's user's (EACCES) is refused: no
  // one else can have written records there. ENOENT (without `create`):
  // no records yet.
  Result<Fd> OpenRecordDir(int root, const std::string& dir, bool create) {
    Fd cur(openat(root, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!cur.ok()) return Fail(errno, "records: open root", root_);
    std::string done;
    for (const std::string& c : {std::string(kClusterDir), dir}) {
      done += done.empty() ? c : "/" + c;
      Fd fd(openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.ok() && errno == ENOENT && create) {
        if (mkdirat(cur.get(), c.c_str(), 0700) != 0 && errno != EEXIST) return Fail(errno, "records: mkdir", Show(done));
        fd = Fd(openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        Fd sync(openat(cur.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (sync.ok()) (void)fsync(sync.get());
      }
      if (!fd.ok()) {
        int e = errno;
        return Fail(e == ENOENT ? ENOENT : Classify(cur.get(), c, e), "records: open", Show(done));
      }
      struct stat st;
      if (fstat(fd.get(), &st) != 0) return Fail(errno, "records: stat", Show(done));
      if (st.st_uid != geteuid()) {
        LOG_WARN("posix backend: '{}' is owned by uid {}, not the daemon's; cluster records there are not used",
                 Show(done), st.st_uid);
        return Err(EACCES);
      }
      cur = std::move(fd);
    }
    return cur;
  }

  std::unexpected<int> TmpBad(int e, std::string_view why) {
    if (!tmp_bad_.exchange(true))
      LOG_ERROR("posix backend: staging area {} {}; refusing it (remove it to resume staging)", Show(kTmpDir), why);
    return Err(e);
  }

  // The parent directory of `rel`, beneath `root`, without following any
  // symlink; with `create`, missing directories are made (0755, the
  // daemon's owner). A symlink or non-directory on the way is refused
  // (ELOOP/ENOTDIR, one warning line).
  Result<Parent> OpenParent(int root, const std::string& rel, bool create, std::string_view op) {
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

  // Sets a's owner on the entry (`name` in `dirfd`, or `dirfd` itself with
  // AT_EMPTY_PATH) when the daemon runs as root. 0, or the errno to fail
  // with; EPERM/EINVAL (a store that keeps no owners: root-squashed NFS)
  // are logged once per mount and ignored.
  int ApplyOwner(int dirfd, const char* name, int flags, const Attrs& a, const std::string& rel) {
    if (!apply_owner_ || !a.has_owner) return 0;
    if (fchownat(dirfd, name, a.uid, a.gid, flags) == 0) return 0;
    int e = errno;
    if (e != EPERM && e != EINVAL) return e;
    if (!owner_warned_.exchange(true))
      LOG_WARN(
          "posix backend: the store refuses owners ({} for '{}'); files keep the daemon's owner, modes are "
          "still applied (root-squashed NFS?). Warned once per mount.",
          ErrStr(e), Show(rel));
    return 0;
  }

  // Renames the staging-area entry `tmp_name` over `rel` and makes it
  // durable; the temporary is gone afterwards whatever happened.
  Status ReplaceWith(int tmp, const std::string& tmp_name, const Parent& dst, const std::string& rel,
                     std::string_view op) {
    if (renameat(tmp, tmp_name.c_str(), dst.dir.get(), dst.name.c_str()) != 0) {
      int e = errno;
      unlinkat(tmp, tmp_name.c_str(), 0);
      if (e == EISDIR || e == ENOTDIR) return Refuse(e, op, rel, "a directory is in the way");
      return Fail(e, std::string(op) + ": replace", Show(rel));
    }
    // rename() of two links to one inode does nothing and leaves the temporary.
    unlinkat(tmp, tmp_name.c_str(), 0);
    return FsyncDirFd(dst.dir.get(), Show(ParentOf(rel)));
  }

  // Removes everything in the directory open as `dfd`, through descriptors:
  // symlinks are unlinked, never followed. 0 or an errno (ENAMETOOLONG past
  // kMaxTreeDepth levels). `*removed` counts top-level entries.
  static int RemoveContents(int dfd, int depth, size_t* removed) {
    if (depth > kMaxTreeDepth) return ENAMETOOLONG;
    std::vector<std::string> names;
    if (int e = ReadNames(dfd, /*at_root=*/false, &names)) return e;
    for (const auto& n : names) {
      if (int e = RemoveName(dfd, n, depth)) return e;
      ++*removed;
    }
    return 0;
  }

  // Removes `n` from directory `dfd`, a whole tree if it is a directory
  // (at `depth`); gone already is fine.
  static int RemoveName(int dfd, const std::string& n, int depth) {
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

  // The names in the directory open as `fd` (not taken over), sorted,
  // without "." and ".." (and, at the root, the staging area, the cluster
  // records' area and probes).
  // 0 or an errno.
  static int ReadNames(int fd, bool at_root, std::vector<std::string>* names) {
    int dup_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dup_fd < 0) return errno;
    DIR* d = fdopendir(dup_fd);
    if (!d) {
      int e = errno;
      close(dup_fd);
      return e;
    }
    std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
    errno = 0;
    while (dirent* de = readdir(d)) {
      std::string_view n = de->d_name;
      if (n == "." || n == "..") continue;
      if (at_root && (n == kTmpDir || n == kClusterDir || n.starts_with(kProbePrefix))) continue;
      names->emplace_back(n);
    }
    if (errno != 0) return errno;
    std::sort(names->begin(), names->end());
    return 0;
  }

  // The entry `name` in the directory open as `dfd` (O_PATH will do), whose
  // path is `rel`, never followed: its type, mode, mtime and, for a file,
  // size and checksum xattr, for a symlink its target. ENOENT if it is gone,
  // ENOTSUP if it is not a file, directory or symlink, else an errno.
  static Result<Entry> EntryAt(int dfd, const std::string& name, const std::string& rel) {
    struct stat st;
    if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Err(errno);
    Entry e{};
    e.path = rel;
    e.mode = st.st_mode & 07777;
    e.mtime_sec = st.st_mtim.tv_sec;
    e.mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
    if (S_ISDIR(st.st_mode)) {
      e.type = Entry::Type::kDir;
    } else if (S_ISREG(st.st_mode)) {
      e.type = Entry::Type::kFile;
      e.size = static_cast<uint64_t>(st.st_size);
      // O_NONBLOCK: a file swapped for a fifo meanwhile must not hang us.
      Fd f(openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
      char buf[64];
      ssize_t n = f.ok() ? fgetxattr(f.get(), kChecksumXattr, buf, sizeof buf) : -1;
      if (n > 0) e.has_checksum = ParseChecksumHex(std::string_view(buf, n), &e.checksum_hi, &e.checksum_lo);
    } else if (S_ISLNK(st.st_mode)) {
      e.type = Entry::Type::kSymlink;
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      for (;;) {
        ssize_t n = readlinkat(dfd, name.c_str(), target.data(), target.size());
        if (n < 0) return Err(errno);
        if (static_cast<size_t>(n) < target.size()) {
          target.resize(static_cast<size_t>(n));
          e.target = std::move(target);
          break;
        }
        target.resize(target.size() * 2);  // grew since the stat
      }
    } else {
      return Err(ENOTSUP);
    }
    return e;
  }

  // Reports the entries of the directory open as `fd` (taken over), whose
  // path is `rel`, sorted by name, each directory before what it holds.
  Status Walk(int fd, const std::string& rel, const std::function<void(const Entry&)>& fn) {
    Fd dir(fd);
    std::vector<std::string> names;
    if (int e = ReadNames(dir.get(), rel.empty(), &names)) return Fail(e, "list: readdir", Show(rel));
    for (const auto& name : names) {
      std::string child = rel.empty() ? name : rel + "/" + name;
      auto e = EntryAt(dir.get(), name, child);
      if (!e) {
        if (e.error() == ENOENT) continue;  // removed while we walked
        if (e.error() == ENOTSUP) {
          LOG_WARN("posix backend: list: skipping '{}': not a file, directory or symlink", Show(child));
          continue;
        }
        return Fail(e.error(), "list: stat", Show(child));
      }
      fn(*e);
      if (e->type != Entry::Type::kDir) continue;
      int sub = openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) {
        if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;  // changed while we walked
        return Fail(errno, "list: open", Show(child));
      }
      if (auto s = Walk(sub, child, fn); !s) return s;
    }
    return {};
  }

  const std::string root_;               // as configured (absolute, normalized): for logs
  const std::string canon_;              // its canonical path at open: what is opened
  Mutex root_mu_;                        // a leaf
  dev_t root_dev_ GUARDED_BY(root_mu_);  // the root directory in use
  ino_t root_ino_ GUARDED_BY(root_mu_);
  const uid_t root_uid_;                            // its owner at open; a replacement must match it
  bool root_missing_ GUARDED_BY(root_mu_) = false;  // an episode is being logged
  bool foreign_noted_ GUARDED_BY(root_mu_) = false;  // a degraded mount's root refused (logged once)
  const bool apply_owner_;                          // running as root: owners are applied
  std::atomic<bool> owner_warned_{false};
  std::atomic<bool> tmp_bad_{false};
  const uint64_t nonce_;
  std::atomic<uint64_t> counter_{0};
  Mutex lock_mu_;  // a leaf
  Fd lock_ GUARDED_BY(lock_mu_);  // lk-NONCE, flock'd (HoldLock)
  bool lock_warned_ GUARDED_BY(lock_mu_) = false;
};

}  // namespace

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
    return std::make_unique<PosixBackend>(std::move(r), std::move(canon), st);
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
    return std::make_unique<PosixBackend>(std::move(r), std::move(canon), never);
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

}  // namespace ckpt::backend
