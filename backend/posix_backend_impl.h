// posix_backend_impl.h — the POSIX Backend's class, shared by the files
// that implement it: posix_backend.cc (the root, the namespace changes:
// mkdir, rmdir, remove, rename, symlink, link, setattr), posix_stage.cc
// (staging, publish, fetch, the staging area and its leftovers) and
// posix_list.cc (List, Stat, ListDir, cluster records). Paths resolve
// through posix_walk.h, bytes move through posix_copy.h. Included by those
// files only; everyone else sees OpenPosixBackend (backend.h).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/posix_walk.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/result.h"

namespace ckpt::backend::posiximpl {

using namespace posix;

inline constexpr char kProbePrefix[] = ".ckptfs-probe-";
inline constexpr int kMaxTreeDepth = 256;     // Rmdir: deeper trees are refused (ENAMETOOLONG); List: not entered
inline constexpr char kLockPrefix[] = "lk-";  // <staging area>/lk-NONCE: flock'd while its backend lives

// The nonce in a staging-area name: lk-NONCE, or XX-PID-NONCE-N (UniqueName).
inline std::optional<uint64_t> StagedOwner(std::string_view n) {
  if (n.starts_with(kLockPrefix)) return Hex64(n.substr(sizeof kLockPrefix - 1));
  return StagedNonce(n);
}

// Returns the errno, with a debug line naming the operation and the path.
// The caller decides what is worth an error line: the drainer logs one per
// episode of failures, and ENOENT is often an expected answer.
inline std::unexpected<int> Fail(int e, std::string_view what, std::string_view path) {
  LOG_DEBUG("posix backend: {} '{}': {}", what, path, ErrStr(e));
  return Err(e);
}

// Whether `path` is a relative path this backend accepts: no leading '/',
// no empty, "." or ".." component, nothing in the reserved names at the top.
inline bool ValidPath(const std::string& path) {
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
inline Status FsyncDirFd(int fd, std::string_view what) {
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

  Status Check() override;

  Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) override;

  Status Publish(const Staged& s, const std::string& path, const Attrs& a) override;

  void Abort(const Staged& s) override;

  Status Mkdir(const std::string& path, const Attrs& a) override;

  Status Rmdir(const std::string& path) override;

  Status Remove(const std::string& path) override;

  Status Rename(const std::string& from, const std::string& to, bool exchange) override;

  Status Symlink(const std::string& path, const std::string& target, const Attrs& a) override;

  Status Link(const std::string& from, const std::string& to) override;

  Status SetAttr(const std::string& path, const Attrs& a) override;

  Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd, uint64_t size) override;

  Status List(const std::function<void(const Entry&)>& fn) override;

  Result<Entry> Stat(const std::string& path) override;

  Result<std::vector<Entry>> ListDir(const std::string& dir) override;

  Status PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) override;

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& dir) override;

 private:
  // The path of `rel` for log lines ("<root>/a/b"); of the root when empty.
  // Escaped (EscapeName): a name with a newline cannot forge a log line.
  std::string Show(std::string_view rel) const {
    return EscapeName(rel.empty() ? root_ : (root_ == "/" ? "" : root_) + "/" + std::string(rel));
  }
  std::string Show(std::string_view dir, std::string_view name) const {
    return Show(std::string(dir) + "/" + std::string(name));
  }

  // A permanent error for one entry: one warning line with the path.
  // One warning per refusal, not one per retry: the drain retries a
  // refused entry while it holds at it (fs/drain/drain.h), and says so itself.
  std::unexpected<int> Refuse(int e, std::string_view op, const std::string& rel, std::string_view why) const;
  mutable std::mutex refused_mu_;
  mutable std::string last_refusal_;  // the last refusal warned of (under refused_mu_)

  static uint64_t Nonce();

  static bool ValidToken(const std::string& t);

  // A name no other call of this process, nor (with the random nonce)
  // another daemon on the same store, picks.
  std::string UniqueName(std::string_view prefix);

  // The root, opened O_PATH by its canonical path without following
  // symlinks; see the file comment. EIO (logged once per episode) while
  // it is missing, not a directory, or not the directory it was.
  Result<Fd> Root() EXCLUDES(root_mu_);

  std::unexpected<int> RootMissing(int e, std::string_view what) EXCLUDES(root_mu_);

  // The staging area, open. With `create`, a missing one is made (0700).
  // Refused, and left as it is: a symlink (ELOOP), a non-directory
  // (ENOTDIR), a directory owned by another user (EACCES). Logged once per
  // episode; ENOENT (without `create`) is not logged.
  Result<Fd> OpenTmp(int root, bool create);

  // This backend's lk-NONCE in the staging area `tmp`, flock'd: made when
  // there is none yet or the area was removed with it (no links left).
  // Without it (a store without flock) this daemon's entries are judged by
  // age by the others (one warning).
  void HoldLock(int tmp) EXCLUDES(lock_mu_);

  // Removes, from the staging area `tmp`, the entries of daemons that are
  // gone: those of a nonce whose lock file can be locked (then the lock
  // file too), and those of no known owner once kStaleStagedSec old. This
  // daemon's and live daemons' entries stay (counted in *kept).
  int RemoveLeftovers(int tmp, size_t* removed, size_t* kept);

  // The records' directory `dir` of the cluster area, open, beneath `root`
  // and never through a symlink. With `create`, the area and `dir` are made
  // (0700) when missing. An area or `dir` that is a symlink (ELOOP), not a
  // directory (ENOTDIR) or not the daemon's user's (EACCES) is refused: no
  // one else can have written records there. ENOENT (without `create`):
  // no records yet.
  Result<Fd> OpenRecordDir(int root, const std::string& dir, bool create);

  std::unexpected<int> TmpBad(int e, std::string_view why);

  // The parent directory of `rel`, beneath `root`, without following any
  // symlink; with `create`, missing directories are made (0755, the
  // daemon's owner). A symlink or non-directory on the way is refused
  // (ELOOP/ENOTDIR, one warning line).
  Result<Parent> OpenParent(int root, const std::string& rel, bool create, std::string_view op);

  // Sets a's owner on the entry (`name` in `dirfd`, or `dirfd` itself with
  // AT_EMPTY_PATH) when the daemon runs as root. 0, or the errno to fail
  // with; EPERM/EINVAL (a store that keeps no owners: root-squashed NFS)
  // are logged once per mount and ignored.
  int ApplyOwner(int dirfd, const char* name, int flags, const Attrs& a, const std::string& rel);

  // Renames the staging-area entry `tmp_name` over `rel` and makes it
  // durable; the temporary is gone afterwards whatever happened.
  Status ReplaceWith(int tmp, const std::string& tmp_name, const Parent& dst, const std::string& rel,
                     std::string_view op);

  // Removes everything in the directory open as `dfd`, through descriptors:
  // symlinks are unlinked, never followed. 0 or an errno (ENAMETOOLONG past
  // kMaxTreeDepth levels). `*removed` counts top-level entries.
  static int RemoveContents(int dfd, int depth, size_t* removed);

  // Removes `n` from directory `dfd`, a whole tree if it is a directory
  // (at `depth`); gone already is fine.
  static int RemoveName(int dfd, const std::string& n, int depth);

  // The names in the directory open as `fd` (not taken over), sorted,
  // without "." and ".." (and, at the root, the staging area, the cluster
  // records' area and probes).
  // 0 or an errno.
  static int ReadNames(int fd, bool at_root, std::vector<std::string>* names);

  // The entry `name` in the directory open as `dfd` (O_PATH will do), whose
  // path is `rel`, never followed: its type, mode, mtime and, for a file,
  // size and checksum xattr, for a symlink its target. ENOENT if it is gone,
  // ENOTSUP if it is not a file, directory or symlink, else an errno.
  static Result<Entry> EntryAt(int dfd, const std::string& name, const std::string& rel);

  // Reports the entries of the directory open as `fd` (taken over), whose
  // path is `rel`, sorted by name, each directory before what it holds;
  // `depth` levels below the root: directories deeper than kMaxTreeDepth
  // are listed, not entered (a warning each), so a planted deep tree costs a
  // mount neither its descriptors nor its stack.
  Status Walk(int fd, const std::string& rel, const std::function<void(const Entry&)>& fn, int depth = 0);

  const std::string root_;               // as configured (absolute, normalized): for logs
  const std::string canon_;              // its canonical path at open: what is opened
  Mutex root_mu_;                        // a leaf
  dev_t root_dev_ GUARDED_BY(root_mu_);  // the root directory in use
  ino_t root_ino_ GUARDED_BY(root_mu_);
  const uid_t root_uid_;                             // its owner at open; a replacement must match it
  bool root_missing_ GUARDED_BY(root_mu_) = false;   // an episode is being logged
  bool foreign_noted_ GUARDED_BY(root_mu_) = false;  // a degraded mount's root refused (logged once)
  const bool apply_owner_;                           // running as root: owners are applied
  std::atomic<bool> owner_warned_{false};
  std::atomic<bool> tmp_bad_{false};
  const uint64_t nonce_;
  std::atomic<uint64_t> counter_{0};
  Mutex lock_mu_;                 // a leaf
  Fd lock_ GUARDED_BY(lock_mu_);  // lk-NONCE, flock'd (HoldLock)
  bool lock_warned_ GUARDED_BY(lock_mu_) = false;
};

}  // namespace ckpt::backend::posiximpl
