// core.h — the parts the core's objects share, and the rules of changing
// them: LevelDB's DBImpl hands work to VersionSet, log::Writer and
// MemTable; here the facade (InodeTable) and the shared namespace
// (SharedNamespace) hand it to these:
//
//   Namespace          the inodes, the tree, lookup counts, the namespace lock
//   OpLog              the ordered drain log, its outcomes and waiters
//   VersionStore       seal, copy-on-write, snapshots, the version rules
//   Residency          what stays in RAM, spares, memory pressure
//   CheckpointCatalog  which entries are checkpoints, their policies
//   PassthroughFiles   the files the kernel reads and writes directly
//   SaveActivity       whether a save is under way (the drain yields)
//
// Core owns them, with the metadata store, the tier and the backend they
// work over, and keeps the rules every change follows: validate, build one
// Batch, Commit it (a refused write turns the mount read-only, for good),
// and only then change memory; a change that logs entries publishes them
// after the commit (CommitWithLog). It also keeps where the backend holds
// each file's bytes (SetBackendPath), which the fetch and the drain read.
//
// Every REQUIRES(mu()) here is the namespace lock. Lock order: Drainer's
// lock, Inode::data_mu, the namespace lock, then the leaves (OpLog,
// Residency, cache::Tier, the read-only reason): docs/architecture.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "cache/tier.h"
#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/core/checkpoints.h"
#include "fs/core/namespace.h"
#include "fs/core/oplog.h"
#include "fs/core/passthrough_files.h"
#include "fs/core/residency.h"
#include "fs/core/save_activity.h"
#include "fs/core/types.h"
#include "fs/core/versions.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

class Core {
  // First: the parts below are built over them.
  meta::MetaStore* const store_;
  cache::Tier* const tier_;
  backend::Backend* const backend_;

 public:
  // `backend` may be null (unit tests of the namespace alone).
  Core(meta::MetaStore* store, cache::Tier* tier, backend::Backend* backend)
      : store_(store), tier_(tier), backend_(backend), residency(tier) {
    residency.set_unseen_writes([this] { return passthrough.SampleWrites(); });
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // The namespace lock.
  ckpt::Mutex& mu() const RETURN_CAPABILITY(ns.mu()) { return ns.mu(); }

  meta::MetaStore* store() const { return store_; }
  cache::Tier* tier() const { return tier_; }
  backend::Backend* backend() const { return backend_; }

  // After a mkdir, symlink, link, rename, unlink or rmdir and before its
  // reply (fs/fuse), without the namespace lock: the cluster store learns
  // the names it changed (--cluster-store: fs/cluster/etcd_names.h), so a
  // lookup on another node that starts after the reply sees them. Set
  // before the mount serves anything; empty: nothing to tell.
  std::function<void()> announce_names;
  // Loads from peers (issue #30, fs/cluster/peer_loads.h): copies a remote
  // file's bytes (where the backend holds it, its size and checksum) into
  // the tier file `fd` from another member before the backend is asked
  // (InodeTable::EnsureLocal); any error sends the fetch to the backend,
  // but EBUSY (fd may still be written by the peer's transfer) fails it.
  // Only for files whose checksum is known. Set before the mount serves.
  std::function<Status(const std::string& path, int fd, uint64_t size, uint64_t hi, uint64_t lo)> peer_fetch;
  // --replicas: files recovery found pending and not in the tier (a
  // reboot, a container's new /dev/shm) are kept aside here instead of
  // dropped as lost, for the daemon to read back from their replica
  // holders once the link is up (DropAwaited drops the rest). Set before Load.
  bool keep_lost_for_peers = false;
  std::vector<uint64_t> awaiting_peers GUARDED_BY(mu());
  void AnnounceNames() {
    if (announce_names) announce_names();
  }
  // --replicas: whether version `version` of `ino` is held by the peers it
  // was sent to (fs/cluster/replicator.h): its user.ckptfs.state reads
  // `replicated` until it is persisted. Called with the namespace lock held
  // (it takes only the replicator's leaf lock). Empty: no replicas.
  std::function<bool(uint64_t ino, uint64_t version)> replicated;

  // The parts, public: each keeps its own rules (and its own leaf lock,
  // or REQUIRES the namespace lock), and clang's analysis names their locks
  // only through members, not through accessors.
  // The drain log: a leaf lock of its own, taken after the namespace lock.
  OpLog oplog;
  // What stays in RAM: a leaf lock of its own, taken after the namespace
  // lock. Its evictor is InodeTable::Evict.
  Residency residency;
  // The inodes and entries, and the namespace lock.
  Namespace ns;
  VersionStore versions GUARDED_BY(mu()){tier_, &oplog, &residency};
  CheckpointCatalog ckpts GUARDED_BY(mu());
  // Files the kernel reads and writes without the daemon: a leaf lock of
  // its own, taken after the namespace lock.
  PassthroughFiles passthrough{tier_, &residency};
  // Is a save under way (writers open, or one closed less than --drain-yield
  // ago)? The drain yields to it. A leaf lock of its own.
  SaveActivity saves;

  // Set before Load, read-only after.
  const Limits& limits() const { return limits_; }
  void set_limits(const Limits& l) { limits_ = l; }

  // ---- Changing the state ----
  // EROFS once read-only. Any thread.
  Status Writable() const;
  // Why the mount turned read-only; empty while healthy. Any thread.
  std::string ReadOnlyReason();
  // Commits to the store; a failure turns the mount read-only (sticky:
  // the namespace in memory and the record may differ after it), with one
  // log line.
  Status Commit(const meta::Batch& b, bool sync = false) REQUIRES(mu());
  // Commits `b` with the log entries appended to it (OpLog::Append), then
  // publishes them, before the change that logged them is answered.
  Status CommitWithLog(const meta::Batch& b, std::vector<meta::LogEntry>&& entries) REQUIRES(mu());
  // Can `name` be added in `parent` (reserved names, the backend's path
  // length and encoding)? `subtree` is the longest path below the entry
  // (a directory being renamed).
  Status CheckNewName(uint64_t parent, std::string_view name, size_t subtree = 0) REQUIRES(mu());
  // Deletes the inode (its record, its tier file) if nothing references
  // it: no name, no lookup, no open. A pending sealed version outlives it.
  void MaybeDelete(Inode* n) REQUIRES(mu());
  // Removes `n` from memory and every index (no commit).
  void EraseInode(Inode* n) REQUIRES(mu());
  static meta::Timespec Now();

  // ---- Finding inodes ----
  // The inode, with what a passthrough writer wrote taken in (Absorb).
  Inode* Find(uint64_t ino) REQUIRES(mu());
  // The entry `name` of directory `parent` ("." and ".." too), taken in as
  // Find does; the caller counts the kernel's lookup.
  Result<Inode*> Lookup(uint64_t parent, std::string_view name) REQUIRES(mu());
  // Lookup, with the kernel's lookup counted: the record handed to it.
  Result<InodeRecord> LookupAndCount(uint64_t parent, std::string_view name) EXCLUDES(mu());
  // The entry `name` of `dir` (Namespace::Child), taken in as Find does.
  Result<Inode*> Child(Inode* dir, std::string_view name) REQUIRES(mu());
  // The directory `parent` and its entry `name`: FindDir, then Child.
  Result<std::pair<Inode*, Inode*>> DirAndChild(uint64_t parent, std::string_view name) REQUIRES(mu());
  // Takes in a passthrough writer's changes from the tier file: size,
  // mtime, a new data generation. A sealed version still waiting for the
  // drain in the live file is superseded (its bytes changed in place: the
  // next seal brings them).
  void Absorb(Inode* n) REQUIRES(mu());
  // A passthrough writer's file taken in past --max-file-size (the kernel
  // writes it without asking): cuts the tier file back to the limit and
  // takes that in, as the copying path would have kept it (its writes
  // past the limit fail). EFBIG then, for the close or fsync to report;
  // {} if the file is within the limit; the errno if the cut failed.
  Status CutToLimit(Inode* n) REQUIRES(mu());

  // A held data lock and the mutex it locks (the mutex outlives the inode
  // if that is erased meanwhile). Members in this order: unlock, then drop.
  template <class Lock>
  struct DataLock {
    std::shared_ptr<std::shared_mutex> mu;
    Lock lock;
    bool owns_lock() const { return lock.owns_lock(); }
  };
  using DataShared = DataLock<std::shared_lock<std::shared_mutex>>;
  using DataExclusive = DataLock<std::unique_lock<std::shared_mutex>>;
  // The data lock exclusive, for a seal: no change of the bytes is in
  // flight. An unlocked lock if the inode is gone.
  DataExclusive LockForSeal(uint64_t ino) EXCLUDES(mu());

  // ---- Where the backend holds each file ----
  // Records that the backend holds `n`'s bytes at `path` ("" forgets).
  void SetBackendPath(Inode* n, std::string path) REQUIRES(mu());
  // Follows an applied rename, unlink or rmdir in the backend paths.
  void ApplyToBackendPaths(const meta::LogEntry& e) REQUIRES(mu());
  // Where the backend holds `n`'s bytes now: its current path with the
  // pending entries that moved it there (renames, exchanges, links) undone,
  // newest first, since the backend has applied none of them. nullopt if a
  // pending entry says something else was at that path: unknown.
  std::optional<std::string> BackendPathFromLog(const Inode* n) REQUIRES(mu());

 private:
  std::map<std::string, uint64_t, std::less<>> by_backend_path_ GUARDED_BY(mu());  // Inode::backend_path -> ino
  Limits limits_;
  std::atomic<bool> read_only_{false};
  mutable ckpt::Mutex ro_mu_;  // leaf lock
  std::string ro_reason_ GUARDED_BY(ro_mu_);
};

}  // namespace ckpt::fs
