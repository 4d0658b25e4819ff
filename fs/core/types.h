// types.h — the core's public types and limits: who asks (Caller), what a
// listing, an open and a SetAttr carry, what status counts, and the names
// and sizes the mount accepts. Shared by the core's objects (core.h) and
// its facade (inode_table.h); no behaviour.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

// Who is asking: from fuse_req_ctx().
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

struct DirEntry {
  std::string name;
  uint64_t ino;
  uint32_t mode;  // type bits only are meaningful
};

// How an open handle reaches its bytes.
struct OpenResult {
  int fd = -1;         // the tier file (owned by the tier while pinned)
  int backing_id = 0;  // > 0: passthrough; the kernel serves I/O from the tier file under this id
  uint64_t gen = 0;    // the file's data generation once opened (O_TRUNC included): Flush's reference
};

// Registers tier files with the kernel for passthrough (fs/fuse/channel.h);
// the table decides which opens use it, per inode.
class BackingFiles {
 public:
  virtual ~BackingFiles() = default;
  virtual bool active() const = 0;
  [[nodiscard]] virtual Result<int> OpenBacking(int fd) = 0;
  virtual void CloseBacking(int id) = 0;
};

// Which fields SetAttr changes.
enum : int { kSetMode = 1, kSetUid = 2, kSetGid = 4, kSetSize = 8, kSetAtime = 16, kSetMtime = 32 };

struct AttrChange {
  int to_set = 0;
  uint32_t mode = 0, uid = 0, gid = 0;
  uint64_t size = 0;
  meta::Timespec atime, mtime;  // already resolved (UTIME_NOW handled by caller)
};

// Files and bytes per data state, and the drain log's position.
struct DataStats {
  uint64_t files[meta::kDataStates] = {};  // indexed by meta::DataState
  uint64_t bytes[meta::kDataStates] = {};
  uint64_t log_len = 0;
  uint64_t head_seq = 0;     // the newest log entry (0 if none ever)
  uint64_t applied_seq = 0;  // every entry up to here is in the backend
};

// What names and sizes the mount accepts, so that nothing it acknowledges
// is something the backend cannot hold (checked at create, link, rename,
// truncate and write, where it is knowable).
struct Limits {
  // Bytes of a path relative to the backend root: S3 keys are bounded; a
  // POSIX backend holds any path (names up to kMaxName), as tmpfs does.
  size_t max_path = SIZE_MAX;
  bool utf8_names = false;              // names must be valid UTF-8 (S3 keys)
  uint64_t max_file_size = UINT64_MAX;  // EFBIG beyond (bounds what a drain sends)
};

// Names at the mount root that the daemon keeps for itself: the backend's
// staging area (.ckptfs-tmp) and probes. Creating one is EPERM.
inline constexpr char kReservedRootPrefix[] = ".ckptfs";

inline constexpr size_t kMaxName = 255;
// The file type of a directory entry (DT_*) from a mode.
inline uint8_t DirentType(uint32_t mode) { return static_cast<uint8_t>((mode & S_IFMT) >> 12); }
inline constexpr size_t kMaxXattrValue = 64 * 1024;
// All of one inode's xattr names and values (InodeTable::SetXattr: ENOSPC past it).
inline constexpr size_t kMaxXattrBytes = 256 * 1024;
inline constexpr char kStateXattr[] = "user.ckptfs.state";
// How the file's open handles reach its bytes: "passthrough", "daemon" or
// "closed".
inline constexpr char kIoXattr[] = "user.ckptfs.io";

}  // namespace ckpt::fs
