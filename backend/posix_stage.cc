// posix_stage.cc — the POSIX Backend's data: Stage (into the daemon's
// staging area, .ckptfs-tmp/), Publish (attributes, fsync, rename over the
// final name, fsync of the parent), Abort, Fetch, and the staging area's
// lock and leftovers. See posix_backend.cc's file comment ("Staging").
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
#include <filesystem>
#include <map>
#include <random>

#include "backend/checksum.h"
#include "backend/posix_backend_impl.h"
#include "backend/posix_copy.h"
#include "common/failpoint.h"
#include "common/io.h"

namespace ckpt::backend::posiximpl {

Result<Staged> PosixBackend::Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
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
    // The size first: direct writes then never extend the file (ext4
    // serializes extending ones), and holes at the end are made by it.
    if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) err = errno;
    Fd direct = OpenDirect(tmp->get(), name.c_str(), size);
    StageTarget out{.fd = fd.get(), .direct_fd = direct.get()};
    if (!err) err = RingStage(*ring, src_fd, ext, &out, cancelled, &hash, &read_failed);
    ring.reset();  // nothing stays in flight past here
    if (out.direct_refused) {
      static std::once_flag told;
      std::call_once(
          told, [&] { LOG_INFO("posix backend: {} refuses O_DIRECT writes; draining through the page cache", root_); });
    }
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

Status PosixBackend::Publish(const Staged& s, const std::string& path, const Attrs& a) {
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

void PosixBackend::Abort(const Staged& s) {
  if (!ValidToken(s.token)) return;
  auto root = Root();
  if (!root) return;
  auto tmp = OpenTmp(root->get(), /*create=*/false);
  if (!tmp) return;
  if (unlinkat(tmp->get(), s.token.c_str(), 0) != 0 && errno != ENOENT)
    LOG_WARN("posix backend: abort: unlink '{}': {}", Show(kTmpDir, s.token), ErrStr(errno));
}

Result<std::pair<uint64_t, uint64_t>> PosixBackend::Fetch(const std::string& path, int dst_fd, uint64_t size) {
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

uint64_t PosixBackend::Nonce() {
  std::random_device rd;
  return static_cast<uint64_t>(rd()) << 32 | rd();
}

bool PosixBackend::ValidToken(const std::string& t) {
  return !t.empty() && t != "." && t != ".." && t.find('/') == std::string::npos && t.find('\0') == std::string::npos;
}

std::string PosixBackend::UniqueName(std::string_view prefix) {
  char buf[80];
  std::snprintf(buf, sizeof buf, "%.*s%x-%llx-%llx", static_cast<int>(prefix.size()), prefix.data(),
                static_cast<unsigned>(getpid()), static_cast<unsigned long long>(nonce_),
                static_cast<unsigned long long>(counter_.fetch_add(1, std::memory_order_relaxed)));
  return buf;
}

Result<Fd> PosixBackend::OpenTmp(int root, bool create) {
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

void PosixBackend::HoldLock(int tmp) {
  MutexLock lk(&lock_mu_);
  struct stat st;
  if (lock_.ok() && fstat(lock_.get(), &st) == 0 && st.st_nlink > 0) return;
  std::string name = fmt::format("{}{:x}", kLockPrefix, nonce_);
  Fd fd(openat(tmp, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  int e = fd.ok() && flock(fd.get(), LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
  if (e && !lock_warned_) {
    lock_warned_ = true;
    LOG_WARN(
        "posix backend: cannot lock {} ({}): other daemons on this backend remove this one's staged files "
        "only once an hour old",
        Show(kTmpDir, name), ErrStr(e));
  }
  lock_ = std::move(fd);
}

int PosixBackend::RemoveLeftovers(int tmp, size_t* removed, size_t* kept) {
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
      *kept += list.size();                               // live
    } else if (int r = remove_if(list, /*all=*/false)) {  // no lock file, or no flock here
      return r;
    }
  }
  return remove_if(unowned, /*all=*/false);
}

std::unexpected<int> PosixBackend::TmpBad(int e, std::string_view why) {
  if (!tmp_bad_.exchange(true))
    LOG_ERROR("posix backend: staging area {} {}; refusing it (remove it to resume staging)", Show(kTmpDir), why);
  return Err(e);
}

int PosixBackend::ApplyOwner(int dirfd, const char* name, int flags, const Attrs& a, const std::string& rel) {
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

Status PosixBackend::ReplaceWith(int tmp, const std::string& tmp_name, const Parent& dst, const std::string& rel,
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

}  // namespace ckpt::backend::posiximpl
