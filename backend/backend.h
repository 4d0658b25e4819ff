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
// Errors are positive errno values: ENOENT, EACCES/EROFS (not writable),
// ENOSPC/EDQUOT (full), EIO (anything else, with a log line). This module
// knows nothing of FUSE, RocksDB or cache/.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fs/common/result.h"

namespace ckpt::backend {

inline constexpr char kTmpDir[] = ".ckptfs-tmp";

// What a staged upload produced, passed back to Publish or Abort.
struct Staged {
  std::string token;        // the store's handle: temp path, upload id...
  uint64_t size = 0;
  uint64_t checksum_hi = 0;  // XXH3-128 of the bytes as read from the source
  uint64_t checksum_lo = 0;
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
  // offset) into a staged object and returns it with the XXH3-128 checksum
  // of the bytes copied. `cancelled` is polled between chunks; when it
  // returns true the staging stops with ECANCELED and leaves nothing.
  [[nodiscard]] virtual Result<Staged> Stage(int src_fd, uint64_t size,
                                             const std::function<bool()>& cancelled) = 0;

  // Makes a staged object visible at `path` atomically, replacing what was
  // there, creating missing parent directories, durably (fsync of file and
  // directory on POSIX). `mode` and mtime are applied where the store keeps them.
  [[nodiscard]] virtual Status Publish(const Staged& s, const std::string& path, uint32_t mode,
                                       int64_t mtime_sec, uint32_t mtime_nsec) = 0;

  // Drops a staged object.
  virtual void Abort(const Staged& s) = 0;

  // Namespace replay. Each is idempotent where it can be: Mkdir of an
  // existing directory, Remove/Rmdir of a missing one succeed.
  [[nodiscard]] virtual Status Mkdir(const std::string& path, uint32_t mode) = 0;
  // Removes a directory and anything still under it.
  [[nodiscard]] virtual Status Rmdir(const std::string& path) = 0;
  [[nodiscard]] virtual Status Remove(const std::string& path) = 0;
  // Renames a file or directory; `exchange` swaps two existing entries.
  // ENOENT if `from` is missing.
  [[nodiscard]] virtual Status Rename(const std::string& from, const std::string& to, bool exchange) = 0;
  [[nodiscard]] virtual Status Symlink(const std::string& path, const std::string& target) = 0;
  // A second name for an existing file (stores without links copy).
  [[nodiscard]] virtual Status Link(const std::string& from, const std::string& to) = 0;
  // Applies mode and times to an existing entry (no-op where unsupported).
  [[nodiscard]] virtual Status SetAttr(const std::string& path, uint32_t mode, int64_t mtime_sec,
                                       uint32_t mtime_nsec) = 0;

  // Copies the object at `path` into `dst_fd` (already sized to `size`),
  // in parallel ranges, and returns the XXH3-128 of what it copied.
  // ENOENT if missing; EIO if its size is not `size`.
  [[nodiscard]] virtual Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd,
                                                                    uint64_t size) = 0;

  // Calls fn for every directory, file and symlink under the root (not
  // the staging area), parents before children.
  [[nodiscard]] virtual Status List(const std::function<void(const Entry&)>& fn) = 0;
};

// Opens a POSIX directory backend rooted at `root` (must exist).
[[nodiscard]] Result<std::unique_ptr<Backend>> OpenPosixBackend(const std::string& root);

}  // namespace ckpt::backend
