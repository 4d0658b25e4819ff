// inode_table.h — the core's facade: every file-system operation, built
// from the namespace (Namespace: inodes, entries, lookup counts, and the
// namespace lock), the ordered drain log (OpLog) and residency (Residency),
// each an object with its own lock, over the metadata store and the tier.
//
// Every operation validates, builds its Batch, commits it, and only then
// changes the in-memory copy, so a failed RocksDB write leaves both as they
// were. Metadata runs under the namespace lock: with operations a few
// microseconds long, a finer scheme buys nothing yet. File bytes are never
// touched under it: writes, truncates and the copy-on-write of a sealed
// version run under the inode's own data lock (Inode::data_mu), so a long
// copy delays only that file. The class is split across files by
// responsibility: inode_table.cc (entries, attributes, xattrs),
// file_state.cc (write path, seal, copy-on-write), persist.cc (the file's
// side of each drain outcome), recovery.cc (start-up), evict_fetch.cc
// (evictor, fetch), shared.cc (shared namespace), checkpoints.cc.
//
// This layer knows nothing of FUSE: fuse_ops.cc turns requests into calls
// here and results into replies. Errors are positive errno values.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "cache/tier.h"
#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/core/checkpoints.h"
#include "fs/core/core.h"
#include "fs/core/drain_port.h"
#include "fs/core/file_state.h"
#include "fs/core/namespace.h"
#include "fs/core/oplog.h"
#include "fs/core/recovery.h"
#include "fs/core/residency.h"
#include "fs/core/shared.h"
#include "fs/core/types.h"
#include "fs/core/versions.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

class InodeTable {
 public:
  // `backend` may be null (unit tests of the namespace alone): then remote
  // files cannot be fetched and the log is only recorded.
  InodeTable(meta::MetaStore* store, cache::Tier* tier, backend::Backend* backend = nullptr)
      : core_(store, tier, backend) {
    core_.residency.set_evictor(
        [this](uint64_t need, bool all, bool spare_kept) { return Evict(need, all, spare_kept); });
  }
  InodeTable(const InodeTable&) = delete;
  InodeTable& operator=(const InodeTable&) = delete;

  // Before Load: what makes a checkpoint and the memory/persist policies
  // (fs/core/checkpoints.h).
  void set_checkpoint_policy(CheckpointPolicy p) EXCLUDES(mu());
  // Every checkpoint, oldest first (by mtime_ns, then path).
  std::vector<CheckpointInfo> Checkpoints(const std::regex& pattern) EXCLUDES(mu());
  // --replicas: which versions the peers hold (Core::replicated, and the
  // checkpoints' `safe`). Set before the mount serves.
  void SetReplicated(std::function<bool(uint64_t ino, uint64_t version)> fn) EXCLUDES(mu());

  // `ckptfs persist`: the memory-only checkpoint holding `ino` drains after
  // all: the flag goes, and its directories, symlinks and sealed files are
  // logged for the backend, in order after everything logged before.
  // Files open for writing are logged at their close. EALREADY: `ino` is in
  // no memory-only checkpoint (it drains already); EPERM: the caller is
  // neither the checkpoint's owner nor root nor the daemon's user.
  struct PersistQueued {
    std::string path;  // the checkpoint, relative to the mount root
    uint64_t files = 0, bytes = 0;
  };
  [[nodiscard]] Result<PersistQueued> PersistCheckpoint(uint64_t ino, Caller who) EXCLUDES(mu());

  // Loads the namespace from the store (creating the root on first use),
  // purges orphans (nlink 0) and moves tier files with no inode to the
  // tier's orphans/. EIO if the store holds undecodable records, EUCLEAN if
  // the parent pointers form a cycle.
  [[nodiscard]] Status Load(Caller root_owner) { return Recover(core_, root_owner, shared_.enabled()); }

  // Fills `st` from the record (st_blocks from the tier allocation).
  void FillStat(const InodeRecord& r, struct stat* st);

  // Lookups and the kernel's reference counts. Each successful call that
  // hands an inode to the kernel (Lookup, Create, Mknod, Mkdir, Symlink,
  // Link, readdirplus entries) adds one lookup; Forget drops n.
  [[nodiscard]] Result<InodeRecord> Lookup(uint64_t parent, std::string_view name) {
    return core_.LookupAndCount(parent, name);
  }
  void Forget(uint64_t ino, uint64_t n);

  [[nodiscard]] Result<InodeRecord> GetAttr(uint64_t ino);
  [[nodiscard]] Result<InodeRecord> SetAttr(uint64_t ino, const AttrChange& c);

  // Creates a regular file, fifo, socket or device node; EEXIST if present. `seal`: seals a file empty (mknod(2)).
  [[nodiscard]] Result<InodeRecord> Mknod(uint64_t parent, std::string_view name, uint32_t mode, uint64_t rdev,
                                          Caller who, bool seal = false);
  [[nodiscard]] Result<InodeRecord> Mkdir(uint64_t parent, std::string_view name, uint32_t mode, Caller who);
  [[nodiscard]] Result<InodeRecord> Symlink(uint64_t parent, std::string_view name, std::string_view target,
                                            Caller who);
  [[nodiscard]] Result<InodeRecord> Link(uint64_t ino, uint64_t newparent, std::string_view newname);
  [[nodiscard]] Result<std::string> Readlink(uint64_t ino);
  [[nodiscard]] Status Unlink(uint64_t parent, std::string_view name);
  [[nodiscard]] Status Rmdir(uint64_t parent, std::string_view name);
  // flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
  [[nodiscard]] Status Rename(uint64_t parent, std::string_view name, uint64_t newparent, std::string_view newname,
                              unsigned flags);

  // A snapshot of the directory, with "." and ".." first.
  [[nodiscard]] Result<std::vector<DirEntry>> ListDir(uint64_t ino);
  // Adds a lookup for a readdirplus entry and returns its attributes.
  [[nodiscard]] Result<InodeRecord> LookupForReaddir(uint64_t ino);

  // xattrs. flags: XATTR_CREATE / XATTR_REPLACE.
  [[nodiscard]] Status SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags);
  [[nodiscard]] Result<std::string> GetXattr(uint64_t ino, std::string_view name);
  [[nodiscard]] Result<std::string> ListXattr(uint64_t ino);  // NUL-separated
  [[nodiscard]] Status RemoveXattr(uint64_t ino, std::string_view name);

  // Data path. Open pins the tier file and returns its fd (creating an empty
  // tier file for a file that has none yet); O_TRUNC truncates.
  [[nodiscard]] Result<int> Open(uint64_t ino, int flags);
  // Open for a FUSE handle: passthrough where `backing` (set_backing) is
  // active and the kernel's rules allow it (passthrough.h): every handle of
  // an inode is passthrough, or none is. A passthrough writer's bytes reach
  // the tier file without the daemon; Flush, Release, SyncSeal and every
  // attribute read take them in (size, mtime, the budget) from the file.
  // The sealed version a passthrough writer could change is copied aside
  // at open (the kernel cannot be stopped at its first write). `created`:
  // the open that made the file (FUSE create): empty, no version, so its
  // writer writes a new version from nothing with or without O_TRUNC
  // (O_CREAT|O_EXCL: cp, tempfile, open(..., "xb")) and may be
  // passthrough; into fresh pages, never an adopted spare (a spare's pages
  // are all there: a sparse file written so took its whole size).
  [[nodiscard]] Result<OpenResult> OpenHandle(uint64_t ino, int flags, bool created = false);
  void set_backing(BackingFiles* b) { core_.passthrough.set_backing(b); }
  // Passthrough writers fill the tier without asking: takes in what they
  // wrote and, if the tier is over its budget, evicts clean files for the
  // difference. Run every 50 ms while one is open, and at their close.
  void RelieveOverBudget() EXCLUDES(mu());
  // The cheap half, at a passthrough writer's close (Release took its
  // bytes in): evicts clean files if the tier is over its budget.
  void EvictIfOverBudget() EXCLUDES(mu());
  // Would Open(ino, flags) first fetch the file from the backend?
  bool NeedsFetch(uint64_t ino, int flags);
  // Would a change of `ino`'s bytes now first copy its sealed version aside
  // (seconds for GiBs)? A hint for where to run the change: it may be
  // false or true a moment later. REQUIRES: the namespace lock not held.
  bool ChangeCopiesAside(uint64_t ino) EXCLUDES(mu());
  // Called once per successful Open, with the same flags. Seals the file if
  // its bytes changed; persists size and times.
  void Release(uint64_t ino, int open_flags, bool passthrough = false);
  // Writes through the tier; updates size and mtime. `wait` false: EAGAIN
  // instead of waiting for space (see cache::Tier::Write); a wait for space
  // (a copy aside's too) ends with ENOSPC at `deadline` (cache::Deadline).
  [[nodiscard]] Result<size_t> Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int fd)>& fn,
                                     bool wait = true, cache::Deadline deadline = {});
  [[nodiscard]] Status Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, bool wait = true,
                                 cache::Deadline deadline = {});
  // close(2) of a handle (FUSE flush). The kernel answers close(2) after
  // this, not after release: so the last writer's flush seals the file (a
  // file whose close returned is never lost), and any flush records size
  // and times durably. EFBIG if a passthrough writer took the file past
  // --max-file-size: it is cut back to the limit (Core::CutToLimit) first.
  // `open_gen`: OpenResult::gen of the handle flushed; a last writer's
  // flush seals only what was written since that open (a shell's `>`
  // closes the descriptor it opened before a byte is written: sealing then
  // would publish an empty version first). ~0 (the default): any change.
  [[nodiscard]] Status Flush(uint64_t ino, int open_flags, uint64_t open_gen = ~0ull);
  // fsync: seals the file if it changed since its last seal, then, if
  // `wait` (fsync=backend), waits until that version and everything logged
  // before it is in the backend. EIO if the table shuts down first.
  [[nodiscard]] Status SyncToBackend(uint64_t ino, bool wait = true);
  // The fsync's seal alone: returns the log seq that must be applied for
  // the file (and everything before it) to be in the backend. EFBIG as
  // for Flush (the cut-back file sealed).
  // `keep` (fsync=backend): a version sealed under a passthrough writer is
  // copied aside, so the drain need not wait for the writer's close.
  [[nodiscard]] Result<uint64_t> SyncSeal(uint64_t ino, bool keep = false, bool writer = true);
  // Calls fn with the outcome once every entry up to `seq` is applied: 0
  // if each of them reached the backend (or was undone by later history),
  // EIO if one that was pending when fn was registered failed, was lost
  // or was skipped by the operator, if the drain holds at a refusal at or
  // before `seq` (OpLog::Hold: answered at once, not when it ends), if
  // inode `ino` (0: none) is in state failed, or at Shutdown. At once (on
  // this thread) if that is already known. fn runs without the table's
  // lock held, on whichever thread applied the entry, so a FUSE request
  // can wait for the backend without holding a worker.
  void WhenApplied(uint64_t seq, uint64_t ino, std::function<void(int err)> fn);

  // ---- The drain's persist entries (fs/core/persist.cc) ----
  // The parts (fs/core/core.h): the ordered log, its outcomes and its
  // waiters (core().oplog); residency, spares and memory pressure (the
  // daemon's spare thread and memory watch); the namespace's Stats; the
  // limits (set before Load) and the read-only reason.
  Core& core() { return core_; }
  static constexpr uint64_t kPreallocAuto = Residency::kPreallocAuto;
  // Residency::RefillSpares, when passthrough (set_backing) is active.
  void RefillSpares() { core_.residency.RefillSpares(core_.passthrough.active()); }

  // Waits as WhenApplied does and returns its outcome (0 or EIO).
  int WaitApplied(uint64_t seq, uint64_t ino = 0);

  // Wakes every waiter; further waits return false.
  void Shutdown();

  // ---- Budget ----
  // The tier's evictor: drops clean, closed files least-recently-used first.
  // `all_or_nothing`: evicts only if the clean files cover `need`.
  // `spare_kept`: room for a spare, not for a write that must go on: the
  // newest --keep-in-memory checkpoints, and every file the last save
  // wrote or anything used since it began, are not touched.
  cache::Tier::Relief Evict(uint64_t need, bool all_or_nothing = false, bool spare_kept = false);

  // At a clean unmount (the FUSE session over, the drain stopped): if
  // every file is in the backend and nothing is left to drain, records the
  // files in the tier as remote (one synced commit) and removes the tier
  // directory. Returns the bytes given back, or an errno with the reason in
  // *why (nothing removed then, but for orphans/, which stays).
  [[nodiscard]] Result<uint64_t> ReleaseTier(std::string* why) EXCLUDES(mu());

  // How long the fetch of an evicted file with no checksum waits for the
  // drain to apply the pending entries that touch its path, when where the
  // backend holds it is not tracked (EnsureLocal); then EIO. Set before
  // the mount serves requests.
  void set_fetch_wait_limit(std::chrono::milliseconds d) { fetch_wait_limit_ = d; }
  static constexpr std::chrono::milliseconds kFetchWaitLimit{30000};
  // The shared namespace (fs/core/shared.h): what other mounts over the
  // backend persisted, and the first mount's import.
  SharedNamespace& shared_ns() { return shared_; }
  // The drain's side of the core (fs/core/drain_port.h).
  DrainPort& drain_port() { return drain_; }

  DataStats DataStatistics();

  // Removes every inode the kernel no longer references and no name holds.
  // Called at unmount (the kernel does not send forgets then).
  void PurgeOrphans();

 private:
  // Before the first handle of an O_TRUNC open of a file with a sealed
  // version: evicts clean files for what PassthroughShortfall says is
  // missing, if evicting can cover all of it (otherwise the writer takes
  // the copying path and nothing goes).
  void EvictForPassthrough(uint64_t ino) EXCLUDES(mu());
  // Counts an O_RDWR passthrough writer's close or fsync as a change of the
  // bytes (if none was seen). REQUIRES: the namespace lock held.
  void MarkChanged(Inode* n) REQUIRES(mu());
  Result<OpenResult> OpenImpl(uint64_t ino, int flags, bool allow_passthrough, bool created = false) EXCLUDES(mu());
  Result<OpenResult> OpenLocked(Inode* n, int flags, bool passthrough) REQUIRES(mu());
  // DirAndChild for Unlink and Rmdir, after the checks they share (the
  // name's length, a writable mount).
  Result<std::pair<Inode*, Inode*>> EntryToRemove(uint64_t parent, std::string_view name) REQUIRES(mu());
  Result<InodeRecord> NewNode(uint64_t parent, std::string_view name, uint32_t mode, Caller who,
                              std::string_view target, uint64_t rdev, bool seal = false) EXCLUDES(mu());
  // Points the record's (parent, name) at some remaining link.
  void RepointPrimary(Inode* n, uint64_t gone_parent, std::string_view gone_name) REQUIRES(mu());
  // Seals and commits in one WriteBatch. REQUIRES: the namespace lock held.
  Status SealNow(Inode* n) REQUIRES(mu());
  // Before the file's bytes change: returns its data lock held shared,
  // after copying the sealed version aside if the drain still needs it
  // (lazy copy-on-write: only the first change after a seal pays). The copy
  // runs with the data lock exclusive and the namespace lock released, so other files'
  // operations go on, and is reserved against the budget (`wait` false:
  // EAGAIN instead of waiting for space; `deadline`: as for Write). ENOENT
  // if the inode is gone. REQUIRES: the namespace lock not held.
  Result<Core::DataShared> LockForMutation(uint64_t ino, bool wait, cache::Deadline deadline = {}) EXCLUDES(mu());
  // Brings a remote file's bytes into the tier. Drops the namespace lock during the
  // fetch and retakes it before returning. REQUIRES: the namespace lock held; regular file.
  Status EnsureLocal(uint64_t ino, int attempt = 0) REQUIRES(mu());

  // The parts and the rules of changing them (fs/core/core.h).
  Core core_;
  ckpt::Mutex& mu() const RETURN_CAPABILITY(core_.mu()) { return core_.mu(); }
  SharedNamespace shared_{&core_};
  DrainPort drain_{&core_};

  std::chrono::milliseconds fetch_wait_limit_{kFetchWaitLimit};  // set before Load
  bool shutdown_ GUARDED_BY(mu()) = false;
  ckpt::CondVar fetch_cv_;  // a fetch finished (with the namespace lock)
};

}  // namespace ckpt::fs
