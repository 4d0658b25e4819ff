// shared.h — the shared namespace: several mounts (nodes), each with its
// own state dir and tier, over one backend, see each other's persisted
// files. A name missing here is looked up in the backend, a directory's
// listing is merged, and a clean file changed there is fetched again;
// each answer of the backend is reused for the TTL (--shared-ttl), the
// bound on how stale a view is. Who wins, and what it gives up: shared.cc
// and docs/consistency.md, "Shared namespace". The first mount of a state
// dir imports what the backend holds (ImportBackend).
//
// It works over the core's parts (fs/core/core.h) and their rules, and
// keeps only its own: the TTL, the names the backend said ENOENT for, and
// when each entry was last compared (Inode::checked_ns, listed_ns).
// Every call that asks the backend does so without the namespace lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "backend/backend.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/core/core.h"

namespace ckpt::fs {

// The names a cluster store holds (--cluster-store: fs/cluster/etcd_names.h):
// what the nodes made lately, before (or just after) it reached the backend.
class NameStore {
 public:
  struct Name {
    backend::Entry entry;  // its type, mode, mtime; a symlink's target
    int64_t revision = 0;  // the store's revision of the change
    // Removed (unlinked, rmdir'ed or renamed away) on a node, maybe not yet
    // in the backend: a lookup that misses here answers ENOENT, whatever
    // the backend still holds.
    bool gone = false;
  };
  virtual ~NameStore() = default;
  // What the store holds for `path` now (nullopt: nothing); an error if it
  // cannot be asked (the caller goes on as without a store).
  virtual Result<std::optional<Name>> Get(const std::string& path) = 0;
};

class SharedNamespace {
 public:
  explicit SharedNamespace(Core* core) : core_(*core) {}
  SharedNamespace(const SharedNamespace&) = delete;
  SharedNamespace& operator=(const SharedNamespace&) = delete;

  // On the first mount of a state dir, shows what the backend already holds
  // (state remote). Later mounts do nothing.
  [[nodiscard]] Status ImportBackend();

  // The TTL: each answer of the backend is reused for it. Set before Load;
  // 0 (the default here) turns the shared namespace off.
  // Unit tests: moves the shared namespace's clock forward, so a test can
  // pass a TTL without sleeping and use a TTL long enough that a busy
  // machine never passes it by accident (a 100 ms TTL failed in CI).
  static void AdvanceClockForTest(std::chrono::nanoseconds d) { clock_skew_ns_ += d.count(); }
  void set_ttl(std::chrono::milliseconds ttl) { ttl_ns_ = ttl.count() * 1000000; }
  bool enabled() const { return ttl_ns_ > 0 && core_.backend() != nullptr; }
  // With a cluster store (set before Load): a miss in a shared directory is
  // asked of it every time (a negative answer is never trusted past the
  // store's revision): a directory made on another node is taken from it
  // (before it reaches the backend), a file it names is asked of the
  // backend at once, whatever the TTL; an open of a clean file whose name
  // the store holds in a newer revision compares it with the backend at
  // once. docs/consistency.md, "Close-to-open across nodes".
  void set_names(NameStore* n) { names_ = n; }
  // Lookup, shared: a name missing here is asked of the backend (Stat) and
  // imported as ImportBackend would (a file remote, a directory or symlink
  // persisted) — unless this mount's log still holds its removal (the local
  // log wins), or the backend said ENOENT for it less than a TTL ago. A
  // clean entry found here and not compared with the backend for a TTL is
  // compared now, and follows it (FollowBackend). Names under a memory-only
  // checkpoint, and reserved names, are never asked. A backend that fails
  // leaves the local view as it is (logged at debug). Blocks on the backend
  // without the lock held: call it from a thread that may wait (the
  // fetcher), never a FUSE worker. Errors: as InodeTable::Lookup's.
  [[nodiscard]] Result<InodeRecord> Lookup(uint64_t parent, std::string_view name) EXCLUDES(mu());
  // Would Lookup ask the backend now? Cheap; for a FUSE worker that
  // decides whether to hand the lookup to the fetcher.
  bool LookupNeedsBackend(uint64_t parent, std::string_view name) EXCLUDES(mu());
  // Merges the backend's one-level listing of directory `ino` into the
  // namespace, at most once per TTL: names only the backend holds are
  // imported (unless their removal is pending here), clean entries follow
  // the backend (FollowBackend), clean entries the backend no longer holds
  // leave the namespace. Blocks on the backend (see Lookup).
  void MergeDir(uint64_t ino) EXCLUDES(mu());
  bool MergeDue(uint64_t ino) EXCLUDES(mu());
  // At open: a clean file (persisted or remote, no handle open, no change
  // of this mount waiting for the drain) not compared with the backend for
  // a TTL is compared now; if the backend's copy differs (checksum, else
  // size or mtime) it becomes remote and the open fetches it. O_TRUNC opens
  // skip it (the bytes are replaced anyway). Blocks (see Lookup).
  void RevalidateForOpen(uint64_t ino, int flags) EXCLUDES(mu());
  bool RevalidateDue(uint64_t ino, int flags) EXCLUDES(mu());
  // True once after the backend's copy replaced the file's bytes: pages
  // the kernel cached for it are stale, the next open drops them.
  bool TakeBackendChanged(uint64_t ino) EXCLUDES(mu());

 private:
  ckpt::Mutex& mu() const RETURN_CAPABILITY(core_.mu()) { return core_.mu(); }
  static int64_t MonoNs();  // CLOCK_MONOTONIC in ns, plus the test skew
  static inline std::atomic<int64_t> clock_skew_ns_{0};
  // Is `dir` a directory whose names the backend may add to (shared on,
  // not in a memory-only checkpoint)? REQUIRES: the namespace lock held.
  // Does a miss or a revalidation in `dir` list it rather than Stat one
  // name (fs/core/shared.cc)?
  bool ListsInsteadOfStat(Inode* dir) REQUIRES(mu());
  bool SharedDir(Inode* dir) REQUIRES(mu());
  // Clean all through: may `n` (at `path`) leave the namespace or be
  // replaced because the backend says so? Files persisted or remote, not
  // open, one name, not being fetched; nothing under it memory-only or
  // named by the pending log. REQUIRES: the namespace lock held.
  bool Droppable(Inode* n, const std::string& path, int depth = 0) REQUIRES(mu());
  // Removes the entry `name` of `p` and everything under it from the
  // namespace, logging nothing (the backend no longer holds it). Its
  // inodes go once the kernel forgets them. REQUIRES: the namespace lock; Droppable.
  Status DropShared(Inode* p, const std::string& name) REQUIRES(mu());
  // Adds the backend entry `e` as `name` in `p` (state remote for a file,
  // persisted otherwise) to memory and to `b`. REQUIRES: the namespace lock; name absent.
  Inode* AdoptEntry(Inode* p, const std::string& name, const backend::Entry& e, meta::Batch* b) REQUIRES(mu());
  // AdoptEntry and commit; the entry is undone if the commit fails.
  Result<Inode*> AdoptShared(Inode* p, const std::string& name, const backend::Entry& e) REQUIRES(mu());
  // The entry `n` (`name` in `p`) as the backend has it now (`e`): a file
  // whose copy there differs becomes remote with the backend's size, mtime
  // and checksum; one of another type (or a symlink with another target)
  // is replaced. Only when Droppable. Returns the entry now at `name`.
  Inode* FollowBackend(Inode* p, const std::string& name, Inode* n, const backend::Entry& e) REQUIRES(mu());

  // The store's answer for a name missing here (Lookup): the entry taken
  // from it (a directory), or nullopt to go on with the backend (the TTL's
  // caches of that name dropped if the store names it).
  std::optional<Result<InodeRecord>> LookupInStore(uint64_t parent, std::string_view name) EXCLUDES(mu());
  // At an open within the TTL: does the store hold a newer revision of the
  // file's name than this node has compared (then it is compared now)?
  bool StoreSaysChanged(uint64_t ino) EXCLUDES(mu());

  Core& core_;
  NameStore* names_ = nullptr;  // set_names
  int64_t ttl_ns_ = 0;  // set before Load, read-only after
  // Names the backend said ENOENT for, (dir ino, name) -> when (steady ns):
  // asked again only after the TTL.
  std::map<std::pair<uint64_t, std::string>, int64_t> negative_ GUARDED_BY(mu());
};

}  // namespace ckpt::fs
