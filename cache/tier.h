// tier.h — the memory tier: file bytes on a tmpfs (by default /dev/shm),
// under a budget.
//
// Each inode's bytes live in one file, <dir>/<ino as 16 hex digits>, mode
// 0600, in a per-mount directory (mode 0700). Files on tmpfs outlive the
// daemon, so a restarted daemon re-attaches them (Open scans the directory).
// What this gives up: each save pays tmpfs's page-fault cost for fresh
// pages; a segment allocator with pre-faulted, recycled pages would not. The
// benchmark issue measures whether that is worth its complexity.
//
// The budget counts the pages actually allocated (st_blocks), so holes in
// sparse files are free. A write that would go over the budget waits up to
// the configured time for space (backpressure, released by eviction or
// removal), then fails with ENOSPC.
//
// This module knows nothing of FUSE or RocksDB. Thread-safety: all methods
// may be called from any thread; per-inode data writes to different offsets
// may run concurrently (they are pwrite/splice on a shared fd).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fs/common/result.h"

namespace ckpt::cache {

struct TierStats {
  uint64_t budget = 0;
  uint64_t used = 0;      // bytes allocated by tier files
  uint64_t reserved = 0;  // bytes promised to writes in flight
  uint64_t files = 0;     // tier files present
  uint64_t waits = 0;     // writes that had to wait for space
};

class Tier {
 public:
  // Opens (creating with mode 0700) the tier directory and re-attaches the
  // files already there. Errors: EACCES if the directory cannot be created
  // or is owned by another user, ENOTDIR if it is not a directory.
  [[nodiscard]] static Result<std::unique_ptr<Tier>> Open(const std::string& dir, uint64_t budget);

  ~Tier();
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  const std::string& dir() const { return dir_; }

  // The inodes that have a tier file, and each file's size (st_size), as
  // found at Open.
  const std::vector<std::pair<uint64_t, uint64_t>>& attached() const { return attached_; }

  // Opens the inode's tier file, creating it if `create`, and pins its fd
  // until the matching Unpin. Returns the fd (owned by the tier), ENOENT if
  // absent and !create.
  [[nodiscard]] Result<int> Pin(uint64_t ino, bool create);
  void Unpin(uint64_t ino);

  // Writes through `fn(fd)` (which must write `len` bytes at `off` and
  // return the count or a negative errno), reserving the space first.
  // REQUIRES: the inode is pinned.
  [[nodiscard]] Result<size_t> Write(uint64_t ino, uint64_t off, size_t len,
                                     const std::function<ssize_t(int fd)>& fn);

  // Sets the file's size (creating the file if needed). Shrinking frees pages.
  [[nodiscard]] Status Truncate(uint64_t ino, uint64_t size);

  // fallocate(2) on the tier file, reserving `len` bytes first.
  [[nodiscard]] Status Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len);

  // Deletes the inode's tier file and returns its pages to the budget.
  // Missing files are not an error.
  void Remove(uint64_t ino);

  // Does the inode have a tier file?
  bool Has(uint64_t ino);

  // Bytes of the budget the inode's tier file holds (0 if none).
  uint64_t AllocatedBytes(uint64_t ino);

  TierStats Stats();

  // How long a write waits for space before ENOSPC. Default 0 (fail at once).
  void set_wait_limit(std::chrono::milliseconds d) { wait_limit_ = d; }

  // What an evictor could do for a writer that needs space.
  enum class Relief {
    kFreed,     // removed files; try again
    kWait,      // nothing to evict now, but the drain will make some clean
    kHopeless,  // nothing will ever free space (e.g. it is all open and dirty)
  };
  // Called (without the tier's lock) when a reservation does not fit, with
  // the number of bytes missing. Install before any writes.
  void set_evictor(std::function<Relief(uint64_t need)> fn) { evictor_ = std::move(fn); }

  // Creates (or replaces) the inode's tier file with `size` bytes, reserving
  // the space first, and fills it through fn(fd) (which returns 0 or an
  // errno). On failure the file is removed. Used to fetch evicted files.
  [[nodiscard]] Status Fill(uint64_t ino, uint64_t size, const std::function<int(int fd)>& fn);

  // Wakes writers waiting for space (call after freeing space elsewhere).
  void NotifySpace();

  std::string PathOf(uint64_t ino) const;

 private:
  Tier(std::string dir, uint64_t budget) : dir_(std::move(dir)), budget_(budget) {}

  struct File {
    int fd = -1;
    int pins = 0;
    uint64_t charged = 0;  // bytes of `used_` this file accounts for
  };

  // Reserves `n` bytes, waiting for space up to wait_limit_. ENOSPC if the
  // request can never fit or the wait runs out.
  Status Reserve(uint64_t n);
  void Unreserve(uint64_t n);
  // Re-reads the file's allocation and adjusts used_. REQUIRES: mu_ held.
  void Recharge(File* f);
  Result<File*> OpenLocked(uint64_t ino, bool create);

  const std::string dir_;
  const uint64_t budget_;
  std::chrono::milliseconds wait_limit_{0};
  std::function<Relief(uint64_t)> evictor_;
  std::vector<std::pair<uint64_t, uint64_t>> attached_;

  std::mutex mu_;  // lock order: taken after any fs/ inode lock
  std::condition_variable space_cv_;
  std::unordered_map<uint64_t, File> files_;  // GUARDED_BY(mu_)
  uint64_t used_ = 0;                         // GUARDED_BY(mu_)
  uint64_t reserved_ = 0;                     // GUARDED_BY(mu_)
  uint64_t waits_ = 0;                        // GUARDED_BY(mu_)
};

}  // namespace ckpt::cache
