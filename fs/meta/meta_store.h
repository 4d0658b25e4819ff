// meta_store.h — typed access to the metadata schema of keys.h.
//
// MetaStore turns inodes, directory entries, xattrs and counters into keys
// and values, and loads them back at mount. It owns no in-memory state: the
// namespace (fs/inode_table) keeps the hot copy and calls Commit() with one
// Batch per operation, so each namespace change is atomic on disk.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fs/meta/keys.h"
#include "fs/meta/kv.h"

namespace ckpt::meta {

// Where a file's bytes are. Shown by `getfattr -n user.ckptfs.state`.
enum class DataState : uint8_t {
  kDirty = 0,      // in the tier, not yet in the backend
  kDraining = 1,   // being copied to the backend
  kPersisted = 2,  // in the backend and in the tier
  kRemote = 3,     // in the backend only
  kFailed = 4,     // in the tier only: the backend refused it for good (see the failed list)
  kMemoryOnly = 5, // in the tier only, by policy: a memory-only checkpoint's (--persist-every)
};
inline constexpr size_t kDataStates = 6;

const char* DataStateName(DataState s);

struct Timespec {
  int64_t sec = 0;
  uint32_t nsec = 0;
};

struct InodeRecord {
  uint64_t ino = 0;
  uint64_t parent = 0;  // directories: the parent; files: the first link's parent
  uint32_t mode = 0;    // type and permission bits
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  uint64_t rdev = 0;
  Timespec atime, mtime, ctime;
  uint64_t version = 0;  // bumped on each sealed change of the file's bytes
  DataState state = DataState::kDirty;
  // The checksum of the persisted version (backend/checksum.h); 0, 0 when
  // unknown (records of format 2, whose checksum was of another kind).
  uint64_t checksum_hi = 0, checksum_lo = 0;
  uint64_t sealed_size = 0;  // size of the sealed version (`size` may be ahead of it while open)
  std::string name;          // the first link's name (to find a path for the drainer)
  std::string target;        // symlink target
  // A checkpoint (a name matching --checkpoint-regex, outermost): its
  // number in order of creation, 1 up; 0 for everything else.
  uint64_t ckpt_ord = 0;
  // The checkpoint is memory-only (--persist-every, --persist-interval):
  // nothing at or below it drains until `ckptfs persist`.
  bool memory_only = false;
};

std::string EncodeInode(const InodeRecord& r);
// Returns EIO if the bytes are not a valid record.
[[nodiscard]] Result<InodeRecord> DecodeInode(std::string_view v);

// One entry of the ordered drain log: what happened on the mount, in order,
// with paths as they were at that moment.
enum class LogOp : uint8_t {
  kPersist = 1,  // the bytes of ino@version belong at `path` (and at the NUL-separated other names in path2)
  kMkdir = 2,
  kRmdir = 3,
  kUnlink = 4,
  kRename = 5,   // path -> path2; flags & 1: exchange
  kSymlink = 6,  // path -> target in path2
  kLink = 7,     // new name path2 for existing path
  kSetattr = 8,  // mode, owner and mtime of path
};

const char* LogOpName(LogOp op);

struct LogEntry {
  uint64_t seq = 0;
  LogOp op = LogOp::kPersist;
  uint8_t flags = 0;
  uint64_t ino = 0;
  uint64_t version = 0;
  uint32_t mode = 0;
  Timespec mtime;
  std::string path;
  std::string path2;
  // Owner and group of the entry when it was logged (persist, mkdir,
  // symlink, setattr). has_owner is false for entries logged before owners
  // were recorded (log format 2): the backend then applies none.
  uint32_t uid = 0;
  uint32_t gid = 0;
  bool has_owner = false;
};

std::string EncodeLogEntry(const LogEntry& e);
[[nodiscard]] Result<LogEntry> DecodeLogEntry(std::string_view v);

struct DentryValue {
  uint64_t ino;
  uint8_t type;  // DT_REG, DT_DIR, ...
};

class MetaStore {
 public:
  explicit MetaStore(std::unique_ptr<Kv> kv) : kv_(std::move(kv)) {}

  Kv* kv() { return kv_.get(); }

  // Batch builders.
  static void PutInode(Batch* b, const InodeRecord& r) { b->Put(InodeKey(r.ino), EncodeInode(r)); }
  static void DeleteInode(Batch* b, uint64_t ino) { b->Delete(InodeKey(ino)); }
  static void PutDentry(Batch* b, uint64_t parent, std::string_view name, uint64_t ino, uint8_t type);
  static void DeleteDentry(Batch* b, uint64_t parent, std::string_view name) { b->Delete(DentryKey(parent, name)); }
  static void PutXattr(Batch* b, uint64_t ino, std::string_view name, std::string_view value) {
    b->Put(XattrKey(ino, name), value);
  }
  static void DeleteXattr(Batch* b, uint64_t ino, std::string_view name) { b->Delete(XattrKey(ino, name)); }
  static void PutCounter(Batch* b, std::string_view name, uint64_t v);
  static void PutLog(Batch* b, const LogEntry& e) { b->Put(LogKey(e.seq), EncodeLogEntry(e)); }
  static void DeleteLog(Batch* b, uint64_t seq) { b->Delete(LogKey(seq)); }
  // Files whose promised bytes were lost (the tier vanished with them, e.g.
  // at a node reboot), kept for `ckptfs status` until cleared.
  static void PutLost(Batch* b, uint64_t seq, std::string_view path, std::string_view reason);
  // Log entries the backend refused for good (a name it cannot hold, a
  // symlink where a directory should be): skipped so the drain goes on,
  // kept for `ckptfs status` until the path persists again.
  static void PutFailed(Batch* b, uint64_t seq, std::string_view path, std::string_view reason);
  static void DeleteFailed(Batch* b, uint64_t seq) { b->Delete(FailedKey(seq)); }
  static void DeleteLost(Batch* b, uint64_t seq) { b->Delete(LostKey(seq)); }

  [[nodiscard]] Status Commit(const Batch& b, bool sync = false) { return kv_->Write(b, sync); }

  // Reads a counter; 0 if absent.
  [[nodiscard]] Result<uint64_t> GetCounter(std::string_view name);
  [[nodiscard]] Result<InodeRecord> GetInode(uint64_t ino);

  // Loaders used at mount. Each stops with EIO at the first undecodable value.
  [[nodiscard]] Status ForEachInode(const std::function<void(InodeRecord&&)>& fn);
  [[nodiscard]] Status ForEachDentry(
      const std::function<void(uint64_t parent, std::string_view name, DentryValue)>& fn);
  [[nodiscard]] Status ForEachLogEntry(const std::function<void(LogEntry&&)>& fn);
  [[nodiscard]] Status ForEachLost(
      const std::function<void(uint64_t seq, std::string_view path, std::string_view reason)>& fn) {
    return ScanPathNotes(kLostPrefix, fn);
  }
  [[nodiscard]] Status ForEachFailed(
      const std::function<void(uint64_t seq, std::string_view path, std::string_view reason)>& fn) {
    return ScanPathNotes(kFailedPrefix, fn);
  }
  [[nodiscard]] Status ForEachXattr(
      const std::function<void(uint64_t ino, std::string_view name, std::string_view value)>& fn);

  // The format record: created on first use, checked afterwards. Returns the
  // filesystem id (random, fixed at creation) or EINVAL for a foreign format.
  [[nodiscard]] Result<uint64_t> EnsureFormat();
  // Ties the state dir to one backend: records `url` on first use; EXDEV
  // (with the recorded URL in *bound) if it was made for another backend.
  [[nodiscard]] Status BindBackend(std::string_view url, std::string* bound);
  // The backend URL recorded by BindBackend; ENOENT for a fresh state dir.
  [[nodiscard]] Result<std::string> BoundBackend() { return kv_->Get(kBackendKey); }

 private:
  Status ScanPathNotes(char prefix, const std::function<void(uint64_t, std::string_view, std::string_view)>& fn);

  std::unique_ptr<Kv> kv_;
};

}  // namespace ckpt::meta
