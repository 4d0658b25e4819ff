// backend.h — where drained files end up: one interface, several stores
// (posix_backend.cc: a directory on NFS, Lustre or local disk; the S3 store
// later). Paths are relative to the backend root, '/'-separated, never empty
// components or "..".
//
// Atomicity: a file's bytes are first staged (POSIX: a temporary file under
// <root>/.ckptfs-tmp, fsynced; S3: upload parts) and then published under the
// final name in one step (rename; multipart complete), so no reader of the
// backend ever sees a partial file under a final name. Staging may run for
// many files in parallel; the drainer publishes them in log order.
//
// Errors are positive errno values, in two classes the drainer tells apart:
//
//  - PERMANENT for one entry (retrying cannot help; the drainer marks that
//    entry failed and goes on with the next): exactly ELOOP (a symlink
//    where a directory or the entry should be: never followed), ENOTDIR (a
//    non-directory where a directory should be), ENAMETOOLONG, EINVAL (a
//    path the store refuses, e.g. "..", or a bad argument), EILSEQ (a name
//    the store cannot encode), EFBIG (too large for the store), EISDIR (a
//    directory where a file should be). The POSIX backend logs one warning
//    line with the path for each.
//  - TRANSIENT (the drainer retries with backoff): everything else, e.g.
//    EIO (the store failed, or its root is missing: see posix_backend.cc),
//    EACCES/EPERM/EROFS (not writable; also a staging area that is not the
//    daemon's own directory), ENOSPC/EDQUOT (full), ENOENT, EAGAIN.
//  - ESTALE from Publish only: the staged object is gone (deleted by
//    someone else, or the store came back without it). Not an error of the
//    entry: Abort() it, Stage the bytes again and Publish the new one.
//
// ENOENT from a namespace replay (Remove, Rmdir, Rename's source, Link's
// source, SetAttr) means the entry is not in the store; the drainer treats
// that as nothing to do. So a store that is unreachable as a whole must not
// answer ENOENT: the POSIX backend answers EIO while its root is missing.
// This module knows nothing of FUSE, RocksDB or cache/.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/result.h"
#include "common/text.h"

namespace ckpt::backend {

// kTmpDir and kClusterDir are refused as a component of a backend's root
// or prefix (common/config.cc, ParseBackendUrl).
inline constexpr const char* kTmpDir = kReservedTmpDir;
// The reserved area of cluster records (PutRecord, ListRecords): like the
// staging area, never listed, stat-ed or written through the other methods.
inline constexpr const char* kClusterDir = kReservedClusterDir;
// The largest record PutRecord takes and ListRecords returns.
inline constexpr size_t kMaxRecordBytes = 1 << 20;
// A staged entry that no live daemon can be shown to own is removed once
// this old (Check; see each backend's file comment).
inline constexpr int64_t kStaleStagedSec = 3600;

// 1 to 16 hex digits, or nullopt.
inline std::optional<uint64_t> Hex64(std::string_view h) {
  if (h.empty() || h.size() > 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : h) {
    int d = HexValue(c);
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

// The nonce in a staged entry's name, PREFIX-PID-NONCE-N (hex; each
// backend object draws its nonce at random and names what it stages so);
// nullopt for other names.
inline std::optional<uint64_t> StagedNonce(std::string_view name) {
  size_t n = name.rfind('-');
  size_t nonce = n == 0 || n == name.npos ? name.npos : name.rfind('-', n - 1);
  size_t pid = nonce == 0 || nonce == name.npos ? name.npos : name.rfind('-', nonce - 1);
  if (pid == name.npos || !Hex64(name.substr(n + 1)) || !Hex64(name.substr(pid + 1, nonce - pid - 1)))
    return std::nullopt;
  return Hex64(name.substr(nonce + 1, n - nonce - 1));
}

// What a staged upload produced, passed back to Publish or Abort.
struct Staged {
  std::string token;  // the store's handle: temp path, upload id...
  uint64_t size = 0;
  uint64_t checksum_hi = 0;  // the checksum (backend/checksum.h) of the bytes read
  uint64_t checksum_lo = 0;
};

// What a replayed entry carries besides its name. `mode`: permission bits
// (07777), 0 = leave as is. Owner and group are applied only when
// `has_owner` and the store keeps them (POSIX, daemon running as root);
// S3 ignores them. The mtime is applied by Publish and SetAttr (Mkdir and
// Symlink ignore it).
struct Attrs {
  uint32_t mode = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  bool has_owner = false;
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
};

// One entry found by List.
struct Entry {
  enum class Type { kFile, kDir, kSymlink } type;
  std::string path;
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits, 0 if the store has none
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
  std::string target;  // symlink target
  bool has_checksum = false;
  uint64_t checksum_hi = 0, checksum_lo = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // A short description for logs and status ("posix:/nfs/x").
  virtual std::string Describe() const = 0;

  // Checks that the store is reachable and writable (mount time), and
  // cleans up what an earlier daemon left staged. Errors: see above.
  [[nodiscard]] virtual Status Check() = 0;

  // Copies `size` bytes of `src_fd` (a file readable with pread at any
  // offset) into a staged object and returns it with the checksum
  // (backend/checksum.h) of the bytes copied. Holes of the source
  // (SEEK_DATA/SEEK_HOLE) are not copied where the store keeps holes.
  // `cancelled` is polled between chunks; when it returns true the staging
  // stops with ECANCELED and leaves nothing. It may be called from several
  // threads at once (S3 polls it from each part upload), so it must be
  // thread-safe.
  [[nodiscard]] virtual Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) = 0;

  // Makes a staged object visible at `path` atomically, replacing what was
  // there, creating missing parent directories, durably (fsync of file and
  // directory on POSIX). `a` (mode, owner, mtime) is applied where the store
  // keeps it, before the object appears under its name. ESTALE: the staged
  // object is gone; stage again.
  [[nodiscard]] virtual Status Publish(const Staged& s, const std::string& path, const Attrs& a) = 0;

  // Drops a staged object.
  virtual void Abort(const Staged& s) = 0;

  // Namespace replay. Each is idempotent where it can be: Mkdir of an
  // existing directory, Remove/Rmdir of a missing one succeed.
  // A directory created gets a.mode (0755 if 0) and, see Attrs, its owner;
  // an existing one is left as it is.
  [[nodiscard]] virtual Status Mkdir(const std::string& path, const Attrs& a) = 0;
  // Removes a directory and anything still under it.
  [[nodiscard]] virtual Status Rmdir(const std::string& path) = 0;
  [[nodiscard]] virtual Status Remove(const std::string& path) = 0;
  // Renames a file or directory; `exchange` swaps two existing entries.
  // ENOENT if `from` is missing.
  [[nodiscard]] virtual Status Rename(const std::string& from, const std::string& to, bool exchange) = 0;
  // The link itself gets a's owner (see Attrs); its target is never followed.
  [[nodiscard]] virtual Status Symlink(const std::string& path, const std::string& target, const Attrs& a) = 0;
  // A second name for an existing file (stores without links copy).
  [[nodiscard]] virtual Status Link(const std::string& from, const std::string& to) = 0;
  // Applies mode, owner and mtime to an existing entry (no-op where
  // unsupported; a symlink's mode is never changed).
  [[nodiscard]] virtual Status SetAttr(const std::string& path, const Attrs& a) = 0;

  // Copies the object at `path` into `dst_fd` (already sized to `size`,
  // and holding only holes), in parallel ranges, and returns the checksum
  // (backend/checksum.h) of what it copied. Blocks of zeros may be left as
  // holes in `dst_fd`. ENOENT if missing; EIO if its size is not `size`.
  [[nodiscard]] virtual Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd,
                                                                    uint64_t size) = 0;

  // Calls fn for every directory, file and symlink under the root (not
  // the staging area), parents before children.
  [[nodiscard]] virtual Status List(const std::function<void(const Entry&)>& fn) = 0;

  // The shared namespace (several mounts over one store; docs/consistency.md
  // "Shared namespace") looks at one name or one directory at a time:
  //
  // Stat: the entry at `path` itself, never followed if it is a symlink,
  // with List's fields (`path` is the argument). ENOENT: nothing there, or
  // a directory above it is missing. ELOOP/ENOTDIR: a component above it is
  // a symlink (never followed) or not a directory. EINVAL: a path the store
  // refuses (the staging area's reserved names included), or an entry that
  // is not a file, directory or symlink. EIO: the store as a whole is
  // unreachable (a vanished root), never ENOENT. Nothing is logged above
  // debug: a miss is a normal answer.
  [[nodiscard]] virtual Result<Entry> Stat(const std::string& path) = 0;
  // ListDir: the entries directly in directory `dir` ("" is the root), one
  // level, sorted by name, with List's fields; `path` of each is relative to
  // the root. The staging area is never listed. Errors as Stat's, for
  // `dir` (ENOENT: no such directory; ENOTDIR: not one).
  [[nodiscard]] virtual Result<std::vector<Entry>> ListDir(const std::string& dir) = 0;
  // Up to how many entries one ListDir costs less than a few Stats: a
  // lookup miss in a directory that small lists it (fs/core/shared.cc).
  virtual size_t ListCheaperUpTo() const { return 1000; }

  // Cluster records (fs/cluster/cluster.h; docs/consistency.md "Cross-node
  // ordering"): small documents in the reserved area kClusterDir, which no
  // other method lists, stats or writes, so nothing written through a mount
  // can forge one. `dir` and `name` are single components: not empty, no
  // '/' or NUL, not starting with '.'; anything else is EINVAL.
  //
  // PutRecord: replaces the record `name` of `dir` atomically (POSIX: a
  // temporary file in that directory, fsynced, renamed over it; S3: one
  // PUT), creating the area and `dir` (0700) if missing. EFBIG above
  // kMaxRecordBytes. Other errors as Publish's (transient).
  [[nodiscard]] virtual Status PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) = 0;
  // ListRecords: every record of `dir` as (name, bytes), sorted by name;
  // empty if `dir` does not exist. A record larger than kMaxRecordBytes,
  // or that is not a regular file (POSIX), is left out (debug line).
  [[nodiscard]] virtual Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& dir) = 0;
};

// Whether `s` is a valid component for PutRecord/ListRecords.
bool ValidRecordName(const std::string& s);

// Opens a POSIX directory backend rooted at `root` (must exist).
[[nodiscard]] Result<std::unique_ptr<Backend>> OpenPosixBackend(const std::string& root);

// For a degraded mount (a state dir with history, its backend unreachable
// now): a POSIX backend whose root does not resolve yet. Every operation
// fails as with a vanished root until a directory owned by `owner` appears
// at the path (symlinks in the part that exists now resolved once, as
// OpenPosixBackend does); it is adopted then. A directory of another owner
// is never used.
[[nodiscard]] Result<std::unique_ptr<Backend>> OpenMissingPosixBackend(const std::string& root, uid_t owner);

}  // namespace ckpt::backend
