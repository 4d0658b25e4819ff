// passthrough_files.h — which files the kernel reads and writes without
// the daemon (FUSE passthrough, fs/fuse/channel.h): the tier files
// registered with the kernel, the handles open that way, the files a
// passthrough writer has open, and whether a new writer may take that path
// (it fills the tier without asking, so its file must fit the budget).
//
// Every handle of an inode is passthrough, or none is (the kernel fails a
// mix with EIO): InodeTable decides per open, under the namespace lock,
// and tells this object at each handle's start and end. The counts here
// are under a leaf lock of their own (taken after the namespace lock), so
// status and the housekeeper read them without scanning the namespace;
// the per-inode counts (Inode::pt_opens, pt_writers, pt_rdwr, backing_id)
// are the namespace lock's.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cache/tier.h"
#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/core/namespace.h"
#include "fs/core/residency.h"
#include "fs/core/types.h"

namespace ckpt::fs {

class PassthroughFiles {
 public:
  PassthroughFiles(cache::Tier* tier, Residency* residency) : tier_(tier), residency_(residency) {}
  PassthroughFiles(const PassthroughFiles&) = delete;
  PassthroughFiles& operator=(const PassthroughFiles&) = delete;

  // Set before the mount serves requests, read-only after.
  void set_backing(BackingFiles* b) { backing_ = b; }
  // Can the kernel serve a handle from the tier file (passthrough on)?
  bool active() const { return backing_ != nullptr && backing_->active(); }

  // A passthrough handle of `n` opens: registers the tier file with the
  // kernel at the first, counts the handle (and the writer). REQUIRES: the
  // namespace lock, active().
  Status Start(Inode* n, int flags) EXCLUDES(mu_);
  // One ends: the writer's unused pre-allocated pages trimmed, the tier
  // file unregistered after the last. REQUIRES: the namespace lock.
  void End(Inode* n, int flags) EXCLUDES(mu_);

  // Would a new passthrough writer of `n` fit in the budget (its last
  // version's size, with room to spare), and is it expected to stay within
  // `max_file_size`?
  bool Room(const Inode* n, bool trunc, uint64_t max_file_size) const EXCLUDES(mu_);
  // The bytes of free budget a new passthrough writer of `n` lacks (0: none).
  // The writers admitted before it count with what they are expected to
  // write still (the kernel tells nobody how much it wrote): eight ranks
  // opening at once are not each given the same free room.
  uint64_t Shortfall(const Inode* n, bool trunc) const EXCLUDES(mu_);

  // Passthrough handles open now, and inodes with a passthrough writer.
  std::pair<uint64_t, uint64_t> Opens() EXCLUDES(mu_);
  // The inodes a passthrough writer has open.
  std::vector<uint64_t> Writers() EXCLUDES(mu_);
  // Looks at their tier files (size, mtime) and returns the bytes seen
  // written by them so far, a count that only grows (the daemon does not
  // see their writes: Residency::set_unseen_writes). A file grown by
  // Residency::kMovedBytes counts what it grew; one rewritten in place (its size
  // set first: ftruncate, then filled) counts kMovedBytes per change of
  // its mtime; smaller appends (a log's lines) add up until they reach
  // kMovedBytes. A writer of a file of kNeverIdle or more counts as moving
  // at every look: a checkpoint writer paused between tensors, or storing
  // through a shared mapping (no mtime on tmpfs), is never taken for an
  // idle log. The spare thread calls it every 50 ms.
  uint64_t SampleWrites() EXCLUDES(mu_);
  static constexpr uint64_t kNeverIdle = 64ull << 20;

 private:
  cache::Tier* const tier_;
  Residency* const residency_;
  BackingFiles* backing_ = nullptr;
  // The writer's expected size: its last version's, else the largest sealed.
  uint64_t Expected(const Inode* n) const;

  mutable ckpt::Mutex mu_;  // leaf lock
  uint64_t handles_ GUARDED_BY(mu_) = 0;
  // A file with a passthrough writer.
  struct Writer {
    uint64_t expected = 0;  // the bytes it was expected to write when admitted
    // Its size and mtime when it last moved (SampleWrites), and when that
    // was (its admission at first). One that has not moved for the save
    // gap (Residency::save_gap: a log left open) holds only the room of
    // what it wrote, not what it was expected to write (Shortfall).
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    std::chrono::steady_clock::time_point moved_at;
  };
  std::map<uint64_t, Writer> writing_ GUARDED_BY(mu_);
  uint64_t moved_bytes_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point sampled_at_ GUARDED_BY(mu_){};  // SampleWrites' last look
};

}  // namespace ckpt::fs
