// versions.h — the versions of each file's bytes: the seal that makes one,
// the copy-on-write that keeps it while the live file changes, the
// snapshots that hold it until the backend has it, and the rules all of
// that keeps.
//
// The rules, in one place (the ones recovery checks at start-up):
//   - A version is sealed when the file's data_gen equals its sealed_gen:
//     no change since the seal.
//   - It is pending while its persist entry is not applied
//     (seal_seq > OpLog::AppliedSeq()): the backend holds the version
//     before it, or none.
//   - A pending version's bytes are in its snapshot (cache::SnapKey(ino,
//     version)) if one exists, else in the live tier file, unchanged; the
//     first change of the live bytes after a seal first copies or moves
//     them to the snapshot (NeedsCopy, MoveAside), so the drain never
//     stages a torn version.
//   - A pending version that a newer seal makes pointless (nothing logged
//     after it, or its bytes changed in place under a passthrough writer)
//     is superseded: the drain skips it and its snapshot goes.
//
// VersionStore keeps no state of its own: versions live in each Inode
// (rec.version, data_gen, sealed_gen, seal_seq) and in the tier, and every
// call runs under the namespace lock (its owner, InodeTable, holds it as
// GUARDED_BY; the calls that read the tree take the Namespace and REQUIRE
// its lock). A file's bytes change under its data lock (Inode::data_mu):
// InodeTable::LockForMutation is where copy-on-write is asked for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/tier.h"
#include "common/result.h"
#include "fs/core/file_state.h"
#include "fs/core/namespace.h"
#include "fs/core/oplog.h"
#include "fs/core/residency.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

// What the drainer needs to stage one persist entry: the sealed version's
// bytes, which nothing changes any more (a writer that reopens the file
// first moves or copies them to a snapshot; see MoveAside, LockForMutation).
struct PersistSource {
  cache::FdRef ref;  // keeps the descriptor open for the transfer
  int fd = -1;
  uint64_t size = 0;
  uint64_t gen = 0;  // the data generation the bytes belong to
  uint32_t mode = 0;
  meta::Timespec mtime;
  uint32_t uid = 0, gid = 0;  // the owner the backend copy gets
  bool has_owner = false;     // false: unknown (the file is gone, old log entry)
  bool live = false;          // the live tier file, not a snapshot: see StagedBytesHeld
};

// CLOCK_REALTIME in ns.
int64_t WallNs();

// Moves `n` along the state table (fs/core/file_state.h); an event the
// table does not allow in n's state is logged and changes nothing. Keeps
// the file's checkpoint times (first change, publish). REQUIRES: the
// namespace lock.
void Transition(Inode* n, FileEvent e);

class VersionStore {
 public:
  VersionStore(cache::Tier* tier, OpLog* log, Residency* residency) : tier_(tier), log_(log), residency_(residency) {}
  VersionStore(const VersionStore&) = delete;
  VersionStore& operator=(const VersionStore&) = delete;

  // Is the file's current version sealed and not yet applied by the drain?
  bool SealPending(const Inode* n) const { return n->seal_seq > log_->AppliedSeq(); }
  // Must the sealed version be copied aside before the live bytes change?
  bool NeedsCopy(const Inode* n) const;

  // Seals the file's current bytes as a new version. If the previous
  // version's entry is the last in the log, it is superseded: deleted from
  // the store in `b`, and its seq returned (0 if none) for Supersede once
  // `b` is committed. `memory_only` (a memory-only checkpoint's file): the
  // version stays in RAM, state memory-only, nothing logged. REQUIRES: the
  // data lock exclusive (or the file not open).
  uint64_t Seal(const Namespace& ns, Inode* n, bool memory_only, meta::Batch* b, std::vector<meta::LogEntry>* out)
      REQUIRES(ns.mu());
  // After the commit of a Seal that superseded entry `seq` (0: none) of
  // `version`: the drain skips it, its copy is dropped.
  void Supersede(uint64_t seq, uint64_t ino, uint64_t version);
  // A pending version sealed in place whose bytes changed (or may have):
  // superseded, so the drain skips it and the next seal carries the bytes.
  void SupersedeInPlace(Inode* n);

  // The persist entry of the file's current version (every name of it).
  meta::LogEntry PersistEntry(const Namespace& ns, const Inode* n) REQUIRES(ns.mu());
  // The mkdir or symlink entry that makes the directory or symlink `r` at `path`.
  static meta::LogEntry MakeEntry(const meta::InodeRecord& r, std::string path);

  // Before the live bytes are dropped or emptied (O_TRUNC, truncate to 0,
  // the last name gone): moves a pending sealed version to its snapshot (a
  // rename; the live file starts empty), or copies it where passthrough
  // handles read the live file. No-op if not needed. A change that keeps
  // bytes copies instead (InodeTable::LockForMutation). REQUIRES: no change
  // of the bytes in flight.
  Status MoveAside(const Namespace& ns, Inode* n) REQUIRES(ns.mu());

  // After a stage from the live tier file: false if the version was copied
  // aside meanwhile (a writer beside passthrough handles), after which the
  // live file may have changed under the transfer: the staged bytes are
  // not to be trusted. A rename aside keeps the bytes under the stager's
  // descriptor: true.
  bool StagedBytesHeld(const meta::LogEntry& e, const PersistSource& src) const;

 private:
  cache::Tier* const tier_;
  OpLog* const log_;
  Residency* const residency_;
};

}  // namespace ckpt::fs
