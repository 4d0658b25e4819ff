// drain_port.h — the core's side of the drain: which bytes a persist
// entry stages (the sealed version, in its snapshot or the live file), and
// what each outcome does to the file (its state, its checksum, its
// snapshot) and to the log. The log's half — order, outcomes, waiters — is
// OpLog (fs/core/oplog.h); each completion here is one RocksDB batch that
// holds both halves, under the namespace lock, so a waiter hears the
// outcome the store recorded.
//
// The drainer (fs/drain/drain.h) sees the core through this and the OpLog
// alone. Every call takes the namespace lock itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fs/core/core.h"  // backend::Staged, Result, the thread annotations

namespace ckpt::fs {

class DrainPort {
  Core& core_;

 public:
  explicit DrainPort(Core* core) : core_(*core) {}
  DrainPort(const DrainPort&) = delete;
  DrainPort& operator=(const DrainPort&) = delete;

  // The ordered log the drain reads and completes.
  OpLog& log() { return core_.oplog; }
  // Why the mount is read-only (nothing is applied then); empty if not.
  std::string ReadOnlyReason() { return core_.ReadOnlyReason(); }

  // Starts draining a persist entry: finds the sealed version's bytes (in
  // its snapshot, or in the live tier file if the file has not changed
  // since) and marks the inode draining. ENODATA if the bytes are gone
  // (the tier was lost, e.g. a node reboot): see RecordLost. ESTALE if a
  // newer version superseded the entry (the drain skips it). EINPROGRESS
  // if it was sealed in place (an fsync) under a passthrough writer that
  // still has the file open: its bytes are the live file's, which the
  // kernel may still change (see CopyAsideSealedInPlace).
  [[nodiscard]] Result<PersistSource> BeginPersist(const meta::LogEntry& e);
  // The same bytes for a replica (fs/cluster/replicator.h), without moving
  // the file's state: the drain owns that.
  [[nodiscard]] Result<PersistSource> ReplicaSource(const meta::LogEntry& e);

  // For an entry BeginPersist says EINPROGRESS to, at the head of the log
  // with entries waiting behind it: copies the version aside, so that the
  // drain stages the copy and goes on instead of waiting for the writer's
  // close. The kernel's writes bypass the daemon and its data lock, so the
  // copy is kept only if provably untorn: taken once no write(2) is in
  // progress and the file was not written for 100 ms (its mtime, which
  // every later write moves), and dropped, the version superseded (the
  // close's seal carries the bytes), if the file changed by its end. Not
  // for a file with an O_RDWR passthrough handle, which may store through
  // a shared mapping (no mtime). Copies the whole file: the drain's
  // stagers only, never a FUSE thread.
  // Returns {} when BeginPersist has a new answer (the copy, ESTALE, or
  // the writer closed); EINPROGRESS: not now (not the head, nothing
  // behind it, written just now, O_RDWR); ENOSPC: no room for the copy now
  // (nothing waits for room: the caller tries again later).
  Status CopyAsideSealedInPlace(const meta::LogEntry& e);

  // Ends a persist that did not complete (error, stop): the state goes
  // back to dirty if the version is still current.
  void AbortPersist(const meta::LogEntry& e);

  // After a stage from the live tier file: false if the version was copied
  // aside meanwhile (CopyOut, for a writer beside passthrough handles),
  // after which the live file may have changed under the transfer: the
  // staged bytes are not to be trusted, and a new stage takes the copy.
  // A rename aside (MoveAside, Snapshot) keeps the bytes under the
  // stager's descriptor: true.
  bool StagedBytesHeld(const meta::LogEntry& e, const PersistSource& src);

  // Records that e's bytes are lost (listed by LostFiles) and drops e's
  // snapshot if any. The caller then completes the entry.
  void RecordLost(const meta::LogEntry& e, std::string_view reason);

  // Forgets every lost file (`ckptfs lost --clear`): deletes their records
  // and empties LostFiles. Errors: the store's errno (nothing cleared).
  [[nodiscard]] Status ClearLost() EXCLUDES(mu());

  // The backend refused `e` for good (`err` is permanent: see
  // drain.cc IsPermanent): records it (status, and state `failed` for a
  // persist whose version is still current) and removes it from the log,
  // so the drain goes on with the next entry. REQUIRES: e is the oldest
  // pending entry.
  [[nodiscard]] Status FailEntry(const meta::LogEntry& e, std::string_view reason);

  // The entry's bytes are published: records the checksum and, if the
  // version is still current, the persisted state; removes the entry.
  // REQUIRES: e is the oldest pending entry.
  [[nodiscard]] Status CompletePersist(const meta::LogEntry& e, const backend::Staged& s, uint64_t gen);

  // Removes the oldest pending entry (applied or skipped).
  [[nodiscard]] Status CompleteEntry(const meta::LogEntry& e);

 private:
  ckpt::Mutex& mu() const RETURN_CAPABILITY(core_.mu()) { return core_.mu(); }
  Result<PersistSource> Source(const meta::LogEntry& e, bool stage);
};

}  // namespace ckpt::fs
