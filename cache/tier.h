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

#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"

namespace ckpt::cache {

// An open tier file descriptor, closed when the last reference goes. Readers
// and the drainer hold one across a transfer, so a snapshot or removal that
// happens meanwhile never closes a descriptor under them.
struct FdHolder {
  int fd = -1;
  explicit FdHolder(int f) : fd(f) {}
  ~FdHolder();
  FdHolder(const FdHolder&) = delete;
  FdHolder& operator=(const FdHolder&) = delete;
};
using FdRef = std::shared_ptr<const FdHolder>;

// Keys of snapshot files (see Tier::Snapshot): the top bit set, then the
// inode number (43 bits) and the low 20 bits of the version. Two pending
// versions of one file collide only after a million seals in a row.
inline constexpr uint64_t kSnapBit = 1ULL << 63;
inline uint64_t SnapKey(uint64_t ino, uint64_t version) {
  return kSnapBit | ((ino & ((1ULL << 43) - 1)) << 20) | (version & 0xFFFFF);
}
inline bool IsSnapKey(uint64_t key) { return (key & kSnapBit) != 0; }
inline uint64_t SnapIno(uint64_t key) { return (key & ~kSnapBit) >> 20; }
inline bool SnapMatches(uint64_t key, uint64_t ino, uint64_t version) { return key == SnapKey(ino, version); }

// When a wait for space ends. Empty: the wait limit from when the wait
// starts. A request queued before it may wait (the daemon's space waiter)
// passes its arrival plus the limit, so a queue does not add a wait limit
// per writer ahead of it. Never later than a limit from the wait's start.
using Deadline = std::optional<std::chrono::steady_clock::time_point>;

struct TierStats {
  uint64_t budget = 0;
  uint64_t used = 0;      // bytes allocated by tier files
  uint64_t reserved = 0;  // bytes promised to writes in flight
  uint64_t files = 0;     // tier files present
  uint64_t waits = 0;     // writes that had to wait for space
  uint64_t orphans = 0;   // files in <dir>/orphans (bytes of no known inode)
  uint64_t outside = 0;   // bytes of the budget held outside the tier's files (TakeOutside)
  // What the tier's files may hold: the budget less what is held outside.
  uint64_t for_files() const { return budget - std::min(budget, outside); }
};

class Tier {
 public:
  // Opens (creating with mode 0700) the tier directory, locks it for the
  // Tier's life (flock on <dir>/.lock) and re-attaches the files already
  // there. Every later access goes through the directory's descriptor with
  // O_NOFOLLOW. Refuses, with the reason in *why: EBUSY if another daemon
  // holds the lock, EPERM if the directory belongs to another user, ENOTDIR
  // if it is not a directory (or a symlink), EEXIST if it holds anything
  // but this module's own regular files (a symlink, a device, another
  // user's file, a foreign name) — nothing is deleted then.
  [[nodiscard]] static Result<std::unique_ptr<Tier>> Open(const std::string& dir, uint64_t budget,
                                                          std::string* why = nullptr);

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

  // A reference to the file's current descriptor (opened for the caller if
  // nobody has it pinned). ENOENT if the file does not exist. The holder
  // keeps reading the same bytes even if the key is snapshotted or removed
  // meanwhile.
  [[nodiscard]] Result<FdRef> Ref(uint64_t key);

  // Copy-on-write of a sealed version: the bytes now under `ino` go to
  // `snap_key` (an immutable snapshot the drainer publishes later), and
  // `ino` gets a new file: empty if `copy` is false (an O_TRUNC, an unlink:
  // a rename, no bytes copied), otherwise a copy of the old bytes (holes
  // stay holes). A copy reserves the pages it allocates first, like a write
  // (`wait` false: EAGAIN instead of waiting for space), so it never takes
  // the tier over its budget; the caller must not hold a lock the evictor
  // needs. Pins on `ino` stay with `ino`; references already handed out
  // keep the old bytes. A crash part way leaves either the old state or the
  // snapshot plus a live file (a copy in progress is named *.tmp and
  // removed at the next Open).
  [[nodiscard]] Status Snapshot(uint64_t ino, uint64_t snap_key, bool copy, bool wait = true, Deadline deadline = {});

  // Copy-on-write for a file whose live descriptor must stay the same (the
  // kernel serves passthrough handles from it): the bytes now under `ino`
  // are copied to `snap_key` (replacing it), and `ino` is left as it is.
  // Reserves the copy's pages first, as Snapshot does.
  // `evict` false: only free budget is used (no evictor, no wait), for a
  // caller that holds the lock the evictor takes.
  [[nodiscard]] Status CopyOut(uint64_t ino, uint64_t snap_key, bool wait = true, bool evict = true,
                               Deadline deadline = {});

  // Re-reads the allocation of the inode's file into the budget: for bytes
  // written behind the tier's back (passthrough writes by the kernel).
  // Returns the file's size and mtime (ENOENT if it has none).
  [[nodiscard]] Result<struct stat> Refresh(uint64_t ino);

  // Pre-allocated pages (issue #15): spare files whose pages are allocated
  // ahead of time (fallocate KEEP_SIZE), so a new version the kernel writes
  // (passthrough) lands in pages that are already there instead of
  // faulting each one in. Spares count against the budget like any file,
  // are dropped first when a write needs room, and are named *.tmp, so a
  // restarted daemon removes them.
  //
  // Adds one spare of `bytes` if the budget has room for it and `headroom`
  // more without waiting; false if it did not. Runs without the tier's
  // lock, in chunks of kWarmChunk, each warmed first (WarmPages) and then
  // fallocated, so the pages a save later writes are in RAM, not only
  // promised by the host (issue #29). `stop` is asked between chunks (a
  // save began): the part made so far is kept as a smaller spare.
  static constexpr uint64_t kWarmChunk = 32u << 20;
  bool AddSpare(uint64_t bytes, uint64_t headroom, const std::function<bool()>& stop = {});
  // Pages made resident: `bytes` of anonymous memory written (one fault
  // per page, MADV_POPULATE_WRITE where the kernel has it) and freed at
  // once. On a VM that reports free pages to its host (virtio-balloon free
  // page reporting) a page the host took back faults on the host at its
  // first write; fallocate(2) on tmpfs takes pages without writing them, so
  // a spare made of such pages passed that cost to the save that used it
  // (0.8 GB/s against 5 GB/s, docs/benchmarks.md). The page allocator hands
  // out the pages freed last first (per-CPU lists, then the head of the
  // buddy lists), so the fallocate right after takes these: warm, and
  // never reported while they are the spare's. Best effort: nothing
  // guarantees which free pages an allocation takes.
  static void WarmPages(uint64_t bytes);
  // What making spares cost so far: bytes warmed and seconds spent.
  std::pair<uint64_t, double> SpareWarmth();
  // AddSpare's tries that failed with an error (not a refusal for want of
  // room in the budget: that costs nothing), and the last error (0 once a
  // spare was made since).
  std::pair<uint64_t, int> SpareFailures();
  // Puts the smallest spare of at least `want` bytes (else the largest)
  // under the inode's name, replacing its file, which must be unpinned (a
  // new version: O_TRUNC), and pins it, as Pin does: its descriptor.
  // ENOENT if there is no spare, EBUSY if the file is pinned, or the error
  // of opening the spare: then nothing changed (the old file is still
  // there: an open that cannot pin it must not leave it emptied).
  [[nodiscard]] Result<int> AdoptSpare(uint64_t ino, uint64_t want);
  // Frees the pages of the inode's file beyond its end (a spare's unused
  // part) and recounts its charge.
  void TrimBeyondEof(uint64_t ino);
  // Drops every spare (their pages go back to the budget).
  void DropSpares();
  // The bytes the budget counts for the inode's file (0 if it has none).
  uint64_t Charged(uint64_t ino) EXCLUDES(mu_);
  // The stat of the inode's file if it is open (pinned), else nullopt.
  std::optional<struct stat> StatIfOpen(uint64_t ino) EXCLUDES(mu_);
  // Bytes held by spares, and how many there are.
  std::pair<uint64_t, size_t> Spares();
  // When Remove last gave pages back (a file of at least kFreedNoted
  // bytes): a spare made soon after takes those pages while they are still
  // backed by the host. On a VM with free page reporting the guest hands
  // free memory back to the host within seconds, and the first write to a
  // page taken back faults on the host: a spare made 8 s after a 2 GiB
  // free was written at 0.8 GB/s, one made at once at 5 GB/s
  // (docs/benchmarks.md, "Spares from pages just freed").
  static constexpr uint64_t kFreedNoted = 64u << 20;
  std::chrono::steady_clock::time_point LastFreed();

  // Renames the file under `from` to `to` (replacing it). For start-up
  // recovery, when nothing is pinned.
  [[nodiscard]] Status Rekey(uint64_t from, uint64_t to);

  // Writes through `fn(fd)` (which must write `len` bytes at `off` and
  // return the count or a negative errno), reserving the space first.
  // With `wait` false, a reservation that would have to wait for space
  // returns EAGAIN at once (nothing written, nothing charged): the caller
  // queues the write where waiting holds no FUSE worker. A wait ends at
  // `deadline` (see Deadline) with ENOSPC.
  // REQUIRES: the inode is pinned.
  [[nodiscard]] Result<size_t> Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int fd)>& fn,
                                     bool wait = true, Deadline deadline = {});

  // Sets the file's size (creating the file if needed). Shrinking frees pages.
  [[nodiscard]] Status Truncate(uint64_t ino, uint64_t size);

  // fallocate(2) on the tier file, reserving `len` bytes first (`wait`,
  // `deadline`: as for Write).
  [[nodiscard]] Status Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, bool wait = true,
                                 Deadline deadline = {});

  // Deletes the inode's tier file and returns its pages to the budget.
  // Missing files are not an error.
  void Remove(uint64_t ino);

  // Moves the key's file to <dir>/orphans/ (out of the budget) instead of
  // deleting it: for bytes whose inode the metadata does not know, which an
  // operator may still want. EBUSY if pinned.
  [[nodiscard]] Status Orphan(uint64_t key);

  // Does the inode have a tier file?
  bool Has(uint64_t ino);

  // Bytes of the budget the inode's tier file holds (0 if none).
  uint64_t AllocatedBytes(uint64_t ino);

  TierStats Stats();

  // Is the tier short of room: over 3/4 of what it may hold now (the
  // budget, lower under memory pressure) in use or reserved by anything
  // but spare pages? Then the drain must not wait for anything.
  bool Tight();

  // How long a write waits for space before ENOSPC. Default 0 (fail at once).
  // Under the lock: the restore from peers (fs/daemon.cc) changes it while
  // the replica link's threads may reserve room.
  void set_wait_limit(std::chrono::milliseconds d) EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    wait_limit_ = d;
  }
  std::chrono::milliseconds wait_limit() EXCLUDES(mu_) {
    MutexLock lk(&mu_);
    return wait_limit_;
  }

  // Room of the budget held by something beside the tier's own files —
  // the replicas other members keep on this node (fs/cluster/replica_store.h):
  // one budget for all this node's memory. TakeOutside(n) takes n bytes if
  // they fit beside the files and reservations now (nothing evicted, no
  // wait), or always if `force` (replicas found at start); GiveOutside
  // returns them. The outside holder's relief, called without the lock when
  // a reservation or a passthrough writer needs room, gives back what it
  // can (its spare pages, copies it keeps only to serve loads) and says how
  // much; RelieveOutside calls it.
  bool TakeOutside(uint64_t n, bool force = false) EXCLUDES(mu_);
  void GiveOutside(uint64_t n) EXCLUDES(mu_);
  void set_outside_relief(std::function<uint64_t(uint64_t need)> fn) { outside_relief_ = std::move(fn); }
  uint64_t RelieveOutside(uint64_t need) { return outside_relief_ ? outside_relief_(need) : 0; }

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

  // Memory pressure (fs/core/memory_watch.h): new reservations wait while the
  // tier would go past `limit` bytes, below the budget (~0: no limit).
  // Writes already reserved go on; eviction and the drain lower `used`.
  void set_pressure_limit(uint64_t limit);

  // At unmount: every reservation still waiting, and any later one that
  // would wait, fails with ENOSPC at once.
  void Close();

  std::string PathOf(uint64_t ino) const;

  // Who the directory belongs to (a small JSON document: state dir, mount
  // point, pid, backend), written to <dir>/.owner by the daemon at mount
  // and read by `ckptfs gc` for directories no daemon holds. ReadOwner
  // returns "" when there is none.
  [[nodiscard]] Status WriteOwner(std::string_view text);
  std::string ReadOwner() const;

  // Gives the memory back: removes every tier file, the owner and lock
  // files and the directory itself. Refuses (EBUSY) while a file is
  // pinned. Files in orphans/ are the operator's: with any there, they and
  // the directory stay (ENOTEMPTY, after the rest is gone). Returns the
  // bytes freed. The Tier is unusable afterwards.
  [[nodiscard]] Result<uint64_t> RemoveAll();

 private:
  Tier(std::string dir, uint64_t budget, int dirfd) : dir_(std::move(dir)), budget_(budget), dirfd_(dirfd) {}

  static constexpr char kLockName[] = ".lock";
  static constexpr char kOwnerName[] = ".owner";
  static constexpr char kOrphanDir[] = "orphans";
  static std::string NameOf(uint64_t ino);
  // openat(dirfd_, name, flags | O_NOFOLLOW | O_CLOEXEC, 0600).
  int OpenAt(const std::string& name, int flags) const;
  uint64_t CountOrphans();

  struct File {
    FdRef fd;  // held while pinned
    int pins = 0;
    uint64_t charged = 0;  // bytes of `used_` this file accounts for
  };

  // Reserves `n` bytes, waiting for space up to wait_limit_ or `deadline`,
  // whichever comes first (or EAGAIN at the first wait if !wait). ENOSPC if
  // the request can never fit or the wait runs out (at once, after the
  // evictor's try, for a deadline already past).
  // `evict` false: neither the evictor nor a wait (ENOSPC at once).
  Status Reserve(uint64_t n, bool wait, bool evict = true, Deadline deadline = {}) EXCLUDES(mu_);
  void Unreserve(uint64_t n) EXCLUDES(mu_);
  // Re-reads the file's allocation (f is in files_) and adjusts used_.
  void Recharge(File* f) REQUIRES(mu_);
  // The inode's entry with its file open (created if `create`).
  Result<File*> OpenLocked(uint64_t ino, bool create) REQUIRES(mu_);
  // Drops the file's descriptor (f is in files_) if nothing pins it.
  void MaybeClose(File* f) REQUIRES(mu_) {
    if (f->pins == 0) f->fd.reset();
  }

  const std::string dir_;
  const uint64_t budget_;
  uint64_t pressure_limit_ GUARDED_BY(mu_) = ~0ull;
  // The budget in force for the tier's files: the configured one, or lower
  // under memory pressure, less what is held outside them (TakeOutside).
  uint64_t Budget() const REQUIRES(mu_) {
    const uint64_t b = std::min(budget_, pressure_limit_);
    return b - std::min(b, outside_);
  }
  const int dirfd_;   // the directory, opened O_NOFOLLOW; every file op is relative to it
  int lock_fd_ = -1;  // flock'ed for the Tier's life
  std::chrono::milliseconds wait_limit_ GUARDED_BY(mu_){0};
  std::function<Relief(uint64_t)> evictor_;
  std::function<uint64_t(uint64_t)> outside_relief_;
  std::vector<std::pair<uint64_t, uint64_t>> attached_;

  // Lock order: taken after any fs/ inode lock (InodeTable's); a leaf:
  // nothing is locked, and the evictor is not called, while it is held.
  Mutex mu_;
  CondVar space_cv_;  // space freed, or Close()
  std::unordered_map<uint64_t, File> files_ GUARDED_BY(mu_);
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
  uint64_t outside_ GUARDED_BY(mu_) = 0;
  uint64_t waits_ GUARDED_BY(mu_) = 0;
  uint64_t orphans_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
  struct Spare {
    std::string name;
    uint64_t bytes;  // allocated
  };
  std::vector<Spare> spares_ GUARDED_BY(mu_);
  uint64_t warmed_bytes_ GUARDED_BY(mu_) = 0;  // SpareWarmth
  // The bytes AddSpare holds reserved while it makes a spare (0: none), and
  // whether a write waits for that room (AddSpare then stops at its next
  // chunk, and Reserve drops what it made).
  uint64_t making_spare_ GUARDED_BY(mu_) = 0;
  int spare_err_ GUARDED_BY(mu_) = 0;  // AddSpare's last error, logged once until one is made
  uint64_t spare_failures_ GUARDED_BY(mu_) = 0;
  bool room_wanted_ GUARDED_BY(mu_) = false;
  bool RoomWanted() EXCLUDES(mu_);
  double warm_seconds_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_freed_ GUARDED_BY(mu_){};  // LastFreed
  uint64_t next_spare_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::cache
