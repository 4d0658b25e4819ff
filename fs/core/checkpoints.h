// checkpoints.h — checkpoints as units: which entries of the namespace are
// checkpoints, their numbers, what each one's files add up to (`ckptfs
// ls`, `ckptfs latest`), and the policies that act on them
// (--persist-every, --persist-interval, --keep-in-memory; docs/operations.md,
// "Checkpoint policies").
//
// A checkpoint is a directory or file whose name matches the mount's
// pattern with no matching name above it, at most 8 levels down. It is
// numbered when it is created (or renamed into such a name), in order,
// across restarts (InodeRecord::ckpt_ord; the next number is the store's
// kCheckpointCounter). CheckpointCatalog reads the Namespace it is given
// (under its lock: each such call REQUIRES it) and keeps only the policy
// and the numbering, which its owner guards (InodeTable: the namespace
// lock, GUARDED_BY checked); it changes no inode. InodeTable asks it at create and rename, the evictor at every
// eviction, and `ckptfs persist` (InodeTable::PersistCheckpoint) to find
// what a memory-only checkpoint holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_annotations.h"
#include "fs/core/namespace.h"

namespace ckpt::fs {

struct CheckpointPolicy {
  std::optional<std::regex> pattern;  // none: nothing is a checkpoint
  uint64_t persist_every = 0;         // N > 0: only checkpoints number N, 2N, ... drain
  uint64_t persist_interval_s = 0;    // S > 0: one drains if S seconds passed since the last that did
  uint64_t keep_in_memory = 0;        // K > 0: the newest K checkpoints are evicted last
  bool selective() const { return persist_every > 0 || persist_interval_s > 0; }
};

// A checkpoint, with what its files add up to.
struct CheckpointInfo {
  std::string path;  // relative to the mount root
  bool dir = false;
  uint64_t files = 0, bytes = 0;
  uint64_t state_files[meta::kDataStates] = {}, state_bytes[meta::kDataStates] = {};  // by meta::DataState
  uint64_t open = 0;     // files being written (open for writing, or changed since their seal)
  uint64_t replicated = 0;  // of the files not persisted, those held by --replicas K peers
  uint64_t lost = 0;     // files under it in the lost list
  int64_t mtime_ns = 0;  // the newest file's mtime: orders checkpoints
  int64_t first_change_ns = 0, last_seal_ns = 0, last_publish_ns = 0;  // 0: unknown
  bool times_known = true;                                             // every file's times were seen since the mount
  bool memory_only = false;  // a memory-only checkpoint (--persist-every): it does not drain
  uint64_t ord = 0;          // its number in order of creation (0: made before numbering)
  uint64_t Files(meta::DataState s) const { return state_files[static_cast<size_t>(s)]; }
  // Every file closed, none failed or lost.
  bool Complete() const { return files > 0 && open == 0 && lost == 0 && Files(meta::DataState::kFailed) == 0; }
  // Complete, and every file in the backend.
  bool Persisted() const {
    return Complete() && Files(meta::DataState::kDirty) == 0 && Files(meta::DataState::kDraining) == 0 &&
           Files(meta::DataState::kMemoryOnly) == 0;
  }
  // Complete, and every file persisted or replicated (--replicas): it
  // survives the loss of this node (`ckptfs latest --safe`).
  bool Safe() const {
    return Complete() && !memory_only && Files(meta::DataState::kMemoryOnly) == 0 &&
           Files(meta::DataState::kDirty) + Files(meta::DataState::kDraining) <= replicated;
  }
  // Persisted during this mount: its times to RAM and to durable are known.
  bool Timed() const { return Persisted() && times_known && last_seal_ns > 0 && last_publish_ns >= last_seal_ns; }
};

class CheckpointCatalog {
 public:
  CheckpointCatalog() = default;
  CheckpointCatalog(const CheckpointCatalog&) = delete;
  CheckpointCatalog& operator=(const CheckpointCatalog&) = delete;

  void set_policy(CheckpointPolicy p) { policy_ = std::move(p); }

  // The number the next checkpoint gets; raised past every number given
  // (never lowered).
  uint64_t next() const { return next_; }
  void ReserveUpTo(uint64_t next) { next_ = std::max(next_, next); }

  // The entry `name` made in `parent` would be a checkpoint: its name
  // matches, no name above it does, and it is at most 8 levels down.
  bool Starts(const Namespace& ns, uint64_t parent, std::string_view name) REQUIRES(ns.mu());
  // Whether the checkpoint numbered `ord`, made now, is memory-only.
  bool ChooseMemoryOnly(uint64_t ord);
  // The directory `dir` is, or is inside, a memory-only checkpoint: what
  // happens there is not logged for the backend.
  bool UnderMemoryOnly(const Namespace& ns, uint64_t dir) REQUIRES(ns.mu());
  // The entry `n`, named in `parent`, is memory-only (itself or above).
  bool MemoryOnlyAt(const Namespace& ns, const Inode* n, uint64_t parent) REQUIRES(ns.mu()) {
    return n->rec.memory_only || UnderMemoryOnly(ns, parent);
  }
  // The number of the checkpoint holding `n` (0: none), walking up.
  uint64_t Of(const Namespace& ns, const Inode* n) REQUIRES(ns.mu());
  // The newest `keep_in_memory` complete checkpoints' numbers are >= this
  // (0: none kept). Complete: it holds a file and none is being written.
  // One being saved is not counted, so it never displaces the last one a
  // restart would load (it is newer, and >= this: kept as well).
  // `saving`: a save is under way (Residency::SaveUnderWay), so the newest
  // checkpoint is not complete yet even between two of its files, when
  // none is open (the model sealed, its optimizer state to come).
  uint64_t KeptFrom(const Namespace& ns, bool saving = false) REQUIRES(ns.mu());

  // Every checkpoint whose name matches `pattern` (or that is numbered),
  // in the namespace's order; `lost_under(path)` counts the lost files
  // below one.
  std::vector<CheckpointInfo> List(const Namespace& ns, const std::regex& pattern,
                                   const std::function<uint64_t(const std::string&)>& lost_under) REQUIRES(ns.mu());

  // --replicas: whether a version is replicated (fs/cluster/replicator.h);
  // set before the mount serves. Empty: no replicas.
  std::function<bool(uint64_t ino, uint64_t version)> replicated;

 private:
  // Adds the files under `n` to `c`; walks `dir` for names matching `pattern`.
  void Add(const Namespace& ns, const Inode* n, CheckpointInfo* c, int depth) REQUIRES(ns.mu());
  void Find(const Namespace& ns, const Inode* dir, const std::string& prefix, const std::regex& pattern, int depth,
            const std::function<uint64_t(const std::string&)>& lost_under, std::vector<CheckpointInfo>* out)
      REQUIRES(ns.mu());

  CheckpointPolicy policy_;
  uint64_t next_ = 1;           // kCheckpointCounter
  int64_t last_drained_s_ = 0;  // --persist-interval: when the last drained one was made
};

}  // namespace ckpt::fs
