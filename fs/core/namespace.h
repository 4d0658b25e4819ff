// namespace.h — the inodes and directory entries in memory, and the lock
// that guards them: the namespace lock.
//
// Namespace is the map from inode number to Inode, the tree the `children`
// maps make, the kernel's lookup counts (Inode::nlookup) and the next inode
// number. It answers the questions every operation asks of the tree (which
// inode, which child, which path, is one above the other) and changes only
// where the caller says: it commits nothing and logs nothing. InodeTable
// builds each operation from it: validates, commits one RocksDB batch, then
// changes the Namespace, all under the namespace lock (mu()).
//
// Lock order: Inode::data_mu, then the namespace lock, then the leaves
// (OpLog, Residency, cache::Tier): docs/architecture.md, "Locks".
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/mutex.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

using meta::InodeRecord;

struct NamespaceStats {
  uint64_t inodes = 0;
  uint64_t files = 0;
  uint64_t dirs = 0;
  uint64_t bytes = 0;  // sum of regular file sizes
};

// One inode as the daemon holds it: its record (what RocksDB holds), its
// entries if a directory, and the in-memory state of its bytes and
// handles. Every field is guarded by the namespace lock but data_mu.
struct Inode {
  InodeRecord rec;
  std::map<std::string, uint64_t, std::less<>> children;  // directories
  std::map<std::string, std::string, std::less<>> xattrs;
  uint64_t nlookup = 0;
  uint32_t opens = 0;
  bool size_dirty = false;  // size/times changed since last commit
  uint64_t data_gen = 0;    // bumped by every change of the bytes
  uint64_t sealed_gen = 0;  // data_gen at the last seal
  uint64_t seal_seq = 0;    // log seq of the last seal's persist entry
  bool fetching = false;    // a fetch from the backend is under way
  // Passthrough: handles, those open for writing, the kernel's id for
  // the tier file while any is open, and the tier file's size and mtime
  // when last taken in (Absorb).
  uint32_t pt_opens = 0, pt_writers = 0, pt_rdwr = 0;  // pt_rdwr: O_RDWR ones (may map it shared)
  int backing_id = 0;
  uint64_t pt_size = 0;
  int64_t pt_mtime_ns = 0;
  bool pt_oversize = false;  // taken in past --max-file-size (Core::CutToLimit)
  uint32_t writers = 0;      // opens for writing
  bool open_marked = false;  // state recorded dirty by an open for writing
  // Wall-clock ns (in memory only; 0: not seen since mount): the first
  // change after the last publish, the last seal, the last publish. They
  // time checkpoints (`ckptfs ls`: time to RAM, time to durable).
  int64_t t_change_ns = 0, t_seal_ns = 0, t_publish_ns = 0;
  meta::DataState pre_open_state = meta::DataState::kDirty;
  // Where the backend holds this file's persisted bytes as of the last
  // applied log entry ("" when unknown), so a fetch goes there without
  // waiting for unrelated entries (a pending `latest.tmp` -> `latest`).
  std::string backend_path;
  // The data lock: held shared by every change of the file's bytes (a
  // write, fallocate, truncate) from its copy-on-write check to its
  // size update, and exclusive by a seal and by the copy-on-write copy,
  // so a version is never sealed with a write half done and a copy never
  // sees bytes change under it. Never taken while holding the namespace
  // lock (lock order: data_mu, then it); shared_ptr so a holder outlives an inode
  // erased meanwhile.
  std::shared_ptr<std::shared_mutex> data_mu = std::make_shared<std::shared_mutex>();
  // The shared namespace (in memory only; steady-clock ns, 0: never):
  // when the entry was last compared with the backend, and, for a
  // directory, when its listing was last merged (`listed_ns`: begun,
  // `listed_ok_ns`: when a listing that came back, or found no such
  // directory there, began: names it lacks are not in the backend).
  // `backend_changed`: the bytes were replaced by the backend's copy
  // since the last open.
  int64_t checked_ns = 0;
  int64_t store_rev = 0;  // the cluster store's revision of its name, when last compared (SharedNamespace)
  int64_t listed_ns = 0;
  int64_t listed_ok_ns = 0;
  size_t listed_count = 0;  // entries in that listing
  bool backend_changed = false;
  bool is_dir() const { return S_ISDIR(rec.mode); }
};

class Namespace {
 public:
  using Map = std::unordered_map<uint64_t, std::unique_ptr<Inode>>;

  Namespace() = default;
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  // The namespace lock.
  ckpt::Mutex& mu() const RETURN_CAPABILITY(mu_) { return mu_; }

  // The inode, or null.
  Inode* Find(uint64_t ino) const REQUIRES(mu_);
  // The directory `ino`: ENOENT, or ENOTDIR for another type.
  Result<Inode*> FindDir(uint64_t ino) const REQUIRES(mu_);
  // The entry `name` of `dir`: ENOENT if none (an entry without its inode
  // is a broken invariant: abort).
  Result<Inode*> Child(const Inode* dir, std::string_view name) const REQUIRES(mu_);
  // Adds `n` (its rec.ino set) and returns it; the number must be unused.
  Inode* Insert(std::unique_ptr<Inode> n) REQUIRES(mu_);
  // Removes `ino` and frees its Inode.
  void Erase(uint64_t ino) REQUIRES(mu_);
  // Every inode, for the walks of recovery, status and the evictor.
  const Map& all() const REQUIRES(mu_) { return inodes_; }
  size_t size() const REQUIRES(mu_) { return inodes_.size(); }

  // The number the next new inode gets (kNextInoCounter in the store).
  uint64_t next_ino() const REQUIRES(mu_) { return next_ino_; }
  // Raises it to at least `ino` (never lowers it: numbers are not reused).
  void ReserveUpTo(uint64_t ino) REQUIRES(mu_) { next_ino_ = std::max(next_ino_, ino); }
  // Takes the next number.
  uint64_t TakeIno() REQUIRES(mu_) { return next_ino_++; }

  // Is `maybe_ancestor` the inode `ino` or a directory above it?
  bool IsAncestor(uint64_t maybe_ancestor, uint64_t ino) const REQUIRES(mu_);
  // Paths relative to the mount root ("" for the root), for log entries
  // and messages.
  std::string DirPath(uint64_t dir_ino) const REQUIRES(mu_);
  std::string EntryPath(uint64_t parent, std::string_view name) const REQUIRES(mu_);
  // The longest path under directory `n`, relative to it (0: empty or
  // not a directory).
  size_t SubtreePathLen(const Inode* n) const REQUIRES(mu_);

  NamespaceStats Stats() EXCLUDES(mu_);

 private:
  mutable ckpt::Mutex mu_;
  Map inodes_ GUARDED_BY(mu_);
  uint64_t next_ino_ GUARDED_BY(mu_) = meta::kRootIno + 1;
};

}  // namespace ckpt::fs
