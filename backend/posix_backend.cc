// posix_backend.cc — the Backend over a POSIX directory: NFS, Lustre or a
// local disk.
//
// A file is staged as <root>/.ckptfs-tmp/<unique name> (O_EXCL, 0600): the
// source is mapped read-only and written with io_uring, 8 writes of 4 MiB in
// flight, hashed (XXH3-128) chunk by chunk as the chunks are submitted, then
// fdatasynced. Publish sets the checksum xattr, mtime and mode on the staged
// file, fsyncs it and renames it over the final name, then fsyncs the parent
// directory; a reader of the root therefore sees either the old file or the
// whole new one. Every namespace change fsyncs the directories it touched.
// Fetch is the mirror image: io_uring reads into the mapped destination,
// hashed in order as the chunks complete.
//
// What it gives up: one ring per Stage/Fetch call (a few tens of µs, small
// next to an fsync) instead of a long-lived ring per thread, so nothing is
// shared between threads; where io_uring or mmap is unavailable it copies
// through a 4 MiB buffer with pread/pwrite. RENAME_EXCHANGE is passed to
// the store as is: stores without it (NFS) fail the exchange with EINVAL
// rather than emulate it non-atomically. The name ".ckptfs-tmp" (and
// ".ckptfs-probe-*") at the top of the root is reserved: paths under it are
// rejected with EINVAL. Modes are applied as given, so a directory made
// read-only before a file under it is published refuses the publish
// (EACCES) unless the daemon runs as root.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string_view>
#include <system_error>
#include <vector>

#include "backend/backend.h"
#include "backend/uring.h"
#include "fs/common/failpoint.h"
#include "fs/common/log.h"

namespace ckpt::backend {

namespace {

constexpr uint64_t kChunkSize = 4ull << 20;
constexpr unsigned kQueueDepth = 8;
constexpr char kChecksumXattr[] = "user.ckptfs.xxh128";
constexpr char kProbePrefix[] = ".ckptfs-probe-";

// strerror() is not thread-safe; the generic category's message is.
std::string ErrStr(int e) { return std::generic_category().message(e); }

// Returns the errno, with a debug line naming the operation and the path.
// The caller decides what is worth an error line: the drainer logs one per
// episode of failures, and ENOENT is often an expected answer.
std::unexpected<int> Fail(int e, std::string_view what, std::string_view path) {
  LOG_DEBUG("posix backend: {} '{}': {}", what, path, ErrStr(e));
  return Err(e);
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Owns a mapping of a whole file.
class Mapping {
 public:
  // Maps `size` bytes of `fd`; ok() is false (errno set) on failure.
  Mapping(int fd, uint64_t size, int prot) : size_(size) {
    void* p = mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Mapping() {
    if (base_) munmap(base_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  bool ok() const { return base_ != nullptr; }
  char* base() const { return base_; }

 private:
  char* base_ = nullptr;
  uint64_t size_;
};

struct HashStateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using HashState = std::unique_ptr<XXH3_state_t, HashStateDeleter>;

// The ring for one copy, or nullptr when io_uring cannot be used here (a
// warning is logged the first time). CKPTFS_BACKEND_NO_URING=1 in the
// environment forces the fallback (tests, or a kernel with a broken ring).
std::unique_ptr<Ring> MakeRing() {
  static const bool disabled = [] {
    const char* v = std::getenv("CKPTFS_BACKEND_NO_URING");
    return v && *v && std::string_view(v) != "0";
  }();
  static std::once_flag warned;
  if (disabled) {
    std::call_once(warned, [] { LOG_WARN("posix backend: io_uring disabled by CKPTFS_BACKEND_NO_URING"); });
    return nullptr;
  }
  auto ring = Ring::Create(kQueueDepth);
  if (!ring) {
    int e = ring.error();
    std::call_once(warned, [e] {
      LOG_WARN("posix backend: io_uring unavailable ({}); copying with pread/pwrite", ErrStr(e));
    });
    return nullptr;
  }
  return std::move(*ring);
}

// Fetch's copy: reads `size` bytes of `fd` into the mapping at `base` at the
// same offsets, with up to kQueueDepth chunks of kChunkSize in flight.
// `on_done(off, len)` is called in offset order once the chunk and every
// chunk before it completed. `cancelled` (may be empty) is polled before
// each chunk. Returns 0 or an errno (ECANCELED); everything submitted has
// completed by then.
template <class OnDone>
int RingRead(Ring& ring, int fd, char* base, uint64_t size, const std::function<bool()>& cancelled, OnDone on_done) {
  struct Slot {
    uint64_t chunk = 0, off = 0, len = 0, done = 0;
    bool busy = false;
  };
  Slot slots[kQueueDepth];
  const uint64_t nchunks = (size + kChunkSize - 1) / kChunkSize;
  std::vector<bool> complete(nchunks);
  uint64_t next_chunk = 0, next_done = 0;
  unsigned inflight = 0;
  bool pending = false;  // entries prepared but not yet submitted
  int err = 0;

  auto prep = [&](unsigned s) {
    io_uring_sqe* sqe = ring.GetSqe();
    uint64_t off = slots[s].off + slots[s].done;
    auto len = static_cast<unsigned>(slots[s].len - slots[s].done);
    io_uring_prep_read(sqe, fd, base + off, len, off);
    io_uring_sqe_set_data64(sqe, s);
    pending = true;
  };

  for (;;) {
    while (!err && inflight < kQueueDepth && next_chunk < nchunks) {
      if (cancelled && cancelled()) {
        err = ECANCELED;
        break;
      }
      unsigned s = 0;
      while (slots[s].busy) s++;
      uint64_t off = next_chunk * kChunkSize;
      slots[s] = Slot{next_chunk, off, std::min(kChunkSize, size - off), 0, true};
      prep(s);
      inflight++;
      next_chunk++;
    }
    if (pending) {
      // A failed submit leaves the ring in an unknown state; give up on it
      // (its owner tears it down, which cancels what is in flight).
      if (auto st = ring.Submit(); !st) return st.error();
      pending = false;
    }
    if (inflight == 0) break;
    auto cqe = ring.Wait();
    if (!cqe) return cqe.error();
    auto s = static_cast<unsigned>(io_uring_cqe_get_data64(*cqe));
    int res = (*cqe)->res;
    ring.Seen(*cqe);
    Slot& slot = slots[s];
    if (res == -EINTR || res == -EAGAIN) {
      if (!err) {
        prep(s);
        continue;
      }
    } else if (res < 0) {
      if (!err) err = -res;
    } else if (res == 0) {
      if (!err) err = EIO;  // the file ended early, or the store made no progress
    } else {
      slot.done += static_cast<uint64_t>(res);
      if (slot.done < slot.len) {
        if (!err) {
          prep(s);  // short transfer: requeue the remainder
          continue;
        }
      } else {
        complete[slot.chunk] = true;
        while (next_done < nchunks && complete[next_done]) {
          uint64_t off = next_done * kChunkSize;
          on_done(off, std::min(kChunkSize, size - off));
          next_done++;
        }
      }
    }
    slot.busy = false;
    inflight--;
  }
  return err;
}

// Drops a backend file's clean pages from the page cache. The tier already
// holds the bytes, so caching them twice only costs memory; and measured
// (docs/benchmarks.md), gigabytes of such pages made the first read of a
// freshly drained file through the mount 3-6x slower.
void DropCache(int fd) { (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

// Anonymous memory mapped for one transfer and unmapped after it, so the
// buffers never stay in the daemon's heap (malloc keeps freed 4 MiB blocks
// once its mmap threshold has grown, and the daemon's RSS with them).
class Buffers {
 public:
  explicit Buffers(size_t bytes) : size_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Buffers() {
    if (base_) munmap(base_, size_);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  char* get() const { return base_; }

 private:
  char* base_;
  size_t size_;
};

// pread exactly `len` bytes; 0 or an errno (EIO when the file ends early).
int PreadFull(int fd, char* buf, uint64_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    buf += n, len -= static_cast<uint64_t>(n), off += static_cast<uint64_t>(n);
  }
  return 0;
}

int PwriteFull(int fd, const char* buf, uint64_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = pwrite(fd, buf, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    buf += n, len -= static_cast<uint64_t>(n), off += static_cast<uint64_t>(n);
  }
  return 0;
}

// The fallback copy: `size` bytes from in_fd to out_fd through one buffer,
// hashing what was read. `*read_failed` tells the caller which side failed.
int BufferedCopy(int in_fd, int out_fd, uint64_t size, const std::function<bool()>& cancelled,
                 XXH3_state_t* hash, bool* read_failed) {
  Buffers buf(kChunkSize);
  if (!buf.get()) return ENOMEM;
  for (uint64_t off = 0; off < size; off += kChunkSize) {
    if (cancelled && cancelled()) return ECANCELED;
    uint64_t len = std::min(kChunkSize, size - off);
    if (int e = PreadFull(in_fd, buf.get(), len, off)) {
      *read_failed = true;
      return e;
    }
    XXH3_128bits_update(hash, buf.get(), len);
    if (int e = PwriteFull(out_fd, buf.get(), len, off)) return e;
  }
  return 0;
}

// Stage's copy: reads `in_fd` (the tier) chunk by chunk into one of
// kStageDepth buffers, hashes it, and queues an io_uring write of it to
// `out_fd`, up to kStageDepth writes in flight; every kWritebackWindow bytes
// written in order, the kernel is told to start writing them back, so the
// final fdatasync has little left to do. Reading through buffers, not a
// mapping of the tier file: measured, writes sourced from a MAP_SHARED
// mapping of a tmpfs file ran at a seventh of the speed (page faults inside
// the buffered write path). Short writes are requeued. 0 or an errno.
constexpr uint64_t kWritebackWindow = 32ull << 20;
constexpr unsigned kStageDepth = 4;  // 16 MiB of buffers per transfer


int RingStage(Ring& ring, int in_fd, int out_fd, uint64_t size, const std::function<bool()>& cancelled,
              XXH3_state_t* hash, bool* read_failed) {
  struct Slot {
    char* buf = nullptr;
    uint64_t off = 0, len = 0, done = 0;
    bool busy = false;
  };
  Buffers mem(kStageDepth * kChunkSize);
  if (!mem.get()) return ENOMEM;
  std::vector<Slot> slots(kStageDepth);
  for (unsigned i = 0; i < kStageDepth; i++) slots[i].buf = mem.get() + i * kChunkSize;
  const uint64_t nchunks = (size + kChunkSize - 1) / kChunkSize;
  std::vector<bool> written(nchunks);
  uint64_t next = 0, next_written = 0, synced = 0;
  unsigned inflight = 0;
  int err = 0;
  auto prep = [&](unsigned i) {
    Slot& sl = slots[i];
    io_uring_sqe* sqe = ring.GetSqe();
    io_uring_prep_write(sqe, out_fd, sl.buf + sl.done, static_cast<unsigned>(sl.len - sl.done), sl.off + sl.done);
    io_uring_sqe_set_data64(sqe, i);
  };
  for (;;) {
    bool queued = false;
    while (!err && inflight < kStageDepth && next < nchunks) {
      if (cancelled && cancelled()) {
        err = ECANCELED;
        break;
      }
      unsigned i = 0;
      while (slots[i].busy) i++;
      Slot& sl = slots[i];
      sl.off = next * kChunkSize;
      sl.len = std::min(kChunkSize, size - sl.off);
      sl.done = 0;
      if (int e = PreadFull(in_fd, sl.buf, sl.len, sl.off)) {
        *read_failed = true;
        err = e;
        break;
      }
      XXH3_128bits_update(hash, sl.buf, sl.len);
      sl.busy = true;
      prep(i);
      queued = true;
      inflight++;
      next++;
      // The first chunk is queued; the rest (and the fdatasync) are not done.
      if (next == 1) FAILPOINT("drain.mid_transfer");
    }
    if (queued)
      if (auto st = ring.Submit(); !st) return st.error();  // the owner tears the ring down
    if (inflight == 0) break;
    auto cqe = ring.Wait();
    if (!cqe) return cqe.error();
    auto i = static_cast<unsigned>(io_uring_cqe_get_data64(*cqe));
    int res = (*cqe)->res;
    ring.Seen(*cqe);
    Slot& sl = slots[i];
    if ((res == -EINTR || res == -EAGAIN || (res > 0 && sl.done + static_cast<uint64_t>(res) < sl.len)) && !err) {
      if (res > 0) sl.done += static_cast<uint64_t>(res);
      prep(i);  // interrupted or short: queue the rest
      if (auto st = ring.Submit(); !st) return st.error();
      continue;
    }
    if (res < 0 && !err) err = -res;
    if (res == 0 && !err) err = EIO;
    if (res > 0) {
      written[sl.off / kChunkSize] = true;
      while (next_written < nchunks && written[next_written]) next_written++;
      uint64_t done_bytes = std::min(size, next_written * kChunkSize);
      if (done_bytes - synced >= kWritebackWindow) {
        (void)sync_file_range(out_fd, static_cast<off_t>(synced), static_cast<off_t>(done_bytes - synced),
                              SYNC_FILE_RANGE_WRITE);
        synced = done_bytes;
      }
    }
    sl.busy = false;
    inflight--;
  }
  return err;
}

std::string ChecksumHex(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return std::string(buf, 32);
}

bool ParseChecksumHex(std::string_view s, uint64_t* hi, uint64_t* lo) {
  if (s.size() != 32) return false;
  uint64_t v[2] = {0, 0};
  for (size_t i = 0; i < 32; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v[i / 16] = v[i / 16] << 4 | static_cast<uint64_t>(d);
  }
  *hi = v[0], *lo = v[1];
  return true;
}

// "a/b/c" → "a/b"; "c" → "".
std::string ParentOf(const std::string& rel) {
  auto slash = rel.rfind('/');
  return slash == std::string::npos ? std::string() : rel.substr(0, slash);
}

// Whether `path` is a relative path this backend accepts: no leading '/',
// no empty, "." or ".." component, nothing in the reserved names at the top.
bool ValidPath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  size_t pos = 0;
  bool first = true;
  for (;;) {
    size_t slash = path.find('/', pos);
    std::string_view comp(path.data() + pos, (slash == std::string::npos ? path.size() : slash) - pos);
    if (comp.empty() || comp == "." || comp == "..") return false;
    if (first && (comp == kTmpDir || comp.starts_with(kProbePrefix))) return false;
    first = false;
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

class PosixBackend final : public Backend {
 public:
  explicit PosixBackend(std::string root)
      : root_(std::move(root)),
        prefix_(root_ == "/" ? root_ : root_ + "/"),
        tmp_dir_(prefix_ + kTmpDir),
        nonce_(Nonce()) {}

  std::string Describe() const override { return "posix:" + root_; }

  Status Check() override {
    struct stat st;
    if (stat(root_.c_str(), &st) != 0) return Fail(errno, "check: stat root", root_);
    if (!S_ISDIR(st.st_mode)) return Fail(ENOTDIR, "check: root", root_);

    std::string probe = prefix_ + UniqueName(kProbePrefix);
    Fd pfd(open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!pfd.ok()) return Fail(errno, "check: root not writable: create", probe);
    if (unlink(probe.c_str()) != 0) return Fail(errno, "check: unlink probe", probe);

    if (mkdir(tmp_dir_.c_str(), 0700) == 0) {
      if (auto s = FsyncDir(root_); !s) return s;
    } else if (errno != EEXIST) {
      return Fail(errno, "check: mkdir", tmp_dir_);
    } else if (lstat(tmp_dir_.c_str(), &st) != 0) {
      return Fail(errno, "check: stat", tmp_dir_);
    } else if (!S_ISDIR(st.st_mode)) {
      return Fail(ENOTDIR, "check: staging area", tmp_dir_);
    }

    // Whatever is staged now was left by a daemon that died before it
    // published or aborted: nothing refers to it any more.
    DIR* d = opendir(tmp_dir_.c_str());
    if (!d) return Fail(errno, "check: opendir", tmp_dir_);
    std::vector<std::string> names;
    while (dirent* de = readdir(d)) {
      std::string_view n = de->d_name;
      if (n != "." && n != "..") names.emplace_back(n);
    }
    closedir(d);
    for (const auto& n : names) {
      std::error_code ec;
      std::string p = tmp_dir_ + "/" + n;
      std::filesystem::remove_all(p, ec);
      if (ec && ec.value() != ENOENT) return Fail(ec.value(), "check: remove leftover", p);
    }
    if (!names.empty()) {
      LOG_INFO("posix backend: removed {} leftover staged files from {}", names.size(), tmp_dir_);
      if (auto s = FsyncDir(tmp_dir_); !s) return s;
    }
    return {};
  }

  Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) override {
    struct stat st;
    if (fstat(src_fd, &st) != 0) return Fail(errno, "stage: fstat source fd", std::to_string(src_fd));
    // A mapping read past the end of its file raises SIGBUS: refuse early.
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < size) {
      LOG_ERROR("posix backend: stage: source fd {} holds {} bytes, {} expected", src_fd, st.st_size, size);
      return Err(EIO);
    }
    std::string name, path;
    int raw = -1;
    for (int tries = 0; raw < 0; tries++) {
      name = UniqueName("st-");
      path = tmp_dir_ + "/" + name;
      raw = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (raw < 0 && (errno != EEXIST || tries >= 8)) return Fail(errno, "stage: create", path);
    }
    Fd fd(raw);
    HashState hash(XXH3_createState());
    if (!hash) {
      unlink(path.c_str());
      return Fail(ENOMEM, "stage: hash state for", path);
    }
    XXH3_128bits_reset(hash.get());

    int err = 0;
    bool read_failed = false;
    std::unique_ptr<Ring> ring = size > 0 ? MakeRing() : nullptr;
    if (ring) {
      err = RingStage(*ring, src_fd, fd.get(), size, cancelled, hash.get(), &read_failed);
      ring.reset();  // nothing stays in flight past here
    } else if (size > 0) {
      err = BufferedCopy(src_fd, fd.get(), size, cancelled, hash.get(), &read_failed);
    }
    if (!err && fdatasync(fd.get()) != 0) err = errno;
    if (!err) DropCache(fd.get());
    if (err) {
      unlink(path.c_str());
      if (err == ECANCELED) {
        LOG_DEBUG("posix backend: stage of {} bytes into {} cancelled", size, path);
        return Err(err);
      }
      return Fail(err, read_failed ? "stage: read source for" : "stage: write", path);
    }
    XXH128_hash_t h = XXH3_128bits_digest(hash.get());
    return Staged{name, size, h.high64, h.low64};
  }

  Status Publish(const Staged& s, const std::string& path, uint32_t mode, int64_t mtime_sec,
                 uint32_t mtime_nsec) override {
    if (!ValidPath(path)) return Fail(EINVAL, "publish: invalid path", path);
    if (!ValidToken(s.token)) return Fail(EINVAL, "publish: invalid staged token", s.token);
    if (mtime_nsec >= 1000000000u) return Fail(EINVAL, "publish: invalid mtime nsec for", path);
    std::string tmp = tmp_dir_ + "/" + s.token;
    Fd fd(open(tmp.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.ok()) return Fail(errno, "publish: open staged", tmp);

    // The xattr first: setting a user.* xattr needs write permission, which
    // the final mode may not grant.
    std::string hex = ChecksumHex(s.checksum_hi, s.checksum_lo);
    if (fsetxattr(fd.get(), kChecksumXattr, hex.data(), hex.size(), 0) != 0 && errno != ENOTSUP)
      return Fail(errno, "publish: set checksum xattr on", tmp);
    timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(mtime_sec), static_cast<long>(mtime_nsec)}};
    if (futimens(fd.get(), times) != 0) return Fail(errno, "publish: set mtime on", tmp);
    if (mode != 0 && fchmod(fd.get(), mode & 07777) != 0) return Fail(errno, "publish: chmod", tmp);
    if (fsync(fd.get()) != 0) return Fail(errno, "publish: fsync", tmp);

    std::string dst = Abs(path);
    if (rename(tmp.c_str(), dst.c_str()) != 0) {
      // ENOENT: a parent is missing (the staged file is open, so it was there).
      if (errno != ENOENT) return Fail(errno, "publish: rename to", dst);
      if (auto st = EnsureParent(path); !st) return st;
      if (rename(tmp.c_str(), dst.c_str()) != 0) return Fail(errno, "publish: rename to", dst);
    }
    return FsyncDir(AbsDir(ParentOf(path)));
  }

  void Abort(const Staged& s) override {
    if (!ValidToken(s.token)) return;
    std::string tmp = tmp_dir_ + "/" + s.token;
    if (unlink(tmp.c_str()) != 0 && errno != ENOENT)
      LOG_WARN("posix backend: abort: unlink '{}': {}", tmp, ErrStr(errno));
  }

  Status Mkdir(const std::string& path, uint32_t mode) override {
    if (!ValidPath(path)) return Fail(EINVAL, "mkdir: invalid path", path);
    return MkdirOne(path, mode, /*may_create_parents=*/true);
  }

  Status Rmdir(const std::string& path) override {
    if (!ValidPath(path)) return Fail(EINVAL, "rmdir: invalid path", path);
    std::string p = Abs(path);
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return {};
      return Fail(errno, "rmdir: stat", p);
    }
    if (!S_ISDIR(st.st_mode)) return Fail(ENOTDIR, "rmdir", p);
    std::error_code ec;
    std::filesystem::remove_all(p, ec);  // never follows symlinks
    if (ec && ec.value() != ENOENT) return Fail(ec.value(), "rmdir: remove tree", p);
    return FsyncDir(AbsDir(ParentOf(path)));
  }

  Status Remove(const std::string& path) override {
    if (!ValidPath(path)) return Fail(EINVAL, "remove: invalid path", path);
    std::string p = Abs(path);
    if (unlink(p.c_str()) != 0) {
      int e = errno;
      if (e == ENOENT) return {};
      struct stat st;
      if (e == EPERM && lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) e = EISDIR;  // POSIX says EPERM
      return Fail(e, "remove: unlink", p);
    }
    return FsyncDir(AbsDir(ParentOf(path)));
  }

  Status Rename(const std::string& from, const std::string& to, bool exchange) override {
    if (!ValidPath(from)) return Fail(EINVAL, "rename: invalid path", from);
    if (!ValidPath(to)) return Fail(EINVAL, "rename: invalid path", to);
    std::string f = Abs(from), t = Abs(to);
    struct stat st;
    if (lstat(f.c_str(), &st) != 0) return Fail(errno, "rename: stat source", f);
    if (auto s = EnsureParent(to); !s) return s;
    int rc = exchange ? renameat2(AT_FDCWD, f.c_str(), AT_FDCWD, t.c_str(), RENAME_EXCHANGE)
                      : rename(f.c_str(), t.c_str());
    if (rc != 0) return Fail(errno, exchange ? "rename: exchange with" : "rename: to", f + "' -> '" + t);
    std::string pf = ParentOf(from), pt = ParentOf(to);
    if (auto s = FsyncDir(AbsDir(pt)); !s) return s;
    if (pf != pt) return FsyncDir(AbsDir(pf));
    return {};
  }

  Status Symlink(const std::string& path, const std::string& target) override {
    if (!ValidPath(path)) return Fail(EINVAL, "symlink: invalid path", path);
    if (target.empty() || target.find('\0') != std::string::npos)
      return Fail(EINVAL, "symlink: invalid target for", path);
    if (auto s = EnsureParent(path); !s) return s;
    // Made in the staging area and renamed over `path`: an existing entry
    // is replaced in one step.
    std::string tmp = tmp_dir_ + "/" + UniqueName("sl-");
    if (symlink(target.c_str(), tmp.c_str()) != 0) return Fail(errno, "symlink: create", tmp);
    return ReplaceWith(tmp, path, "symlink");
  }

  Status Link(const std::string& from, const std::string& to) override {
    if (!ValidPath(from)) return Fail(EINVAL, "link: invalid path", from);
    if (!ValidPath(to)) return Fail(EINVAL, "link: invalid path", to);
    std::string f = Abs(from);
    struct stat st;
    if (lstat(f.c_str(), &st) != 0) return Fail(errno, "link: stat source", f);
    if (auto s = EnsureParent(to); !s) return s;
    std::string tmp = tmp_dir_ + "/" + UniqueName("ln-");
    if (link(f.c_str(), tmp.c_str()) != 0) return Fail(errno, "link: link", f);
    return ReplaceWith(tmp, to, "link");
  }

  Status SetAttr(const std::string& path, uint32_t mode, int64_t mtime_sec, uint32_t mtime_nsec) override {
    if (!ValidPath(path)) return Fail(EINVAL, "setattr: invalid path", path);
    if (mtime_nsec >= 1000000000u) return Fail(EINVAL, "setattr: invalid mtime nsec for", path);
    std::string p = Abs(path);
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) return Fail(errno, "setattr: stat", p);
    // A symlink's own mode means nothing and cannot be changed on Linux.
    if (mode != 0 && !S_ISLNK(st.st_mode) && fchmodat(AT_FDCWD, p.c_str(), mode & 07777, 0) != 0)
      return Fail(errno, "setattr: chmod", p);
    timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(mtime_sec), static_cast<long>(mtime_nsec)}};
    if (utimensat(AT_FDCWD, p.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) return Fail(errno, "setattr: utimes", p);
    if (S_ISLNK(st.st_mode)) return {};  // a symlink cannot be opened to fsync
    Fd fd(open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!fd.ok()) {
      // A mode without read permission (non-root): the change stays in the
      // page cache until the store writes it back.
      LOG_DEBUG("posix backend: setattr: cannot open '{}' to fsync: {}", p, ErrStr(errno));
      return {};
    }
    if (fsync(fd.get()) != 0) return Fail(errno, "setattr: fsync", p);
    return {};
  }

  Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd, uint64_t size) override {
    if (!ValidPath(path)) return Fail(EINVAL, "fetch: invalid path", path);
    std::string p = Abs(path);
    Fd fd(open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.ok()) return Fail(errno, "fetch: open", p);
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return Fail(errno, "fetch: fstat", p);
    if (!S_ISREG(st.st_mode)) return Fail(EIO, "fetch: not a regular file:", p);
    if (static_cast<uint64_t>(st.st_size) != size) {
      LOG_ERROR("posix backend: fetch '{}': holds {} bytes, {} expected", p, st.st_size, size);
      return Err(EIO);
    }
    struct stat dst;
    if (fstat(dst_fd, &dst) != 0) return Fail(errno, "fetch: fstat destination for", p);
    // Writing through a mapping past the end of the file raises SIGBUS.
    if (static_cast<uint64_t>(dst.st_size) < size) {
      LOG_ERROR("posix backend: fetch '{}': destination holds {} bytes, {} needed", p, dst.st_size, size);
      return Err(EINVAL);
    }
    HashState hash(XXH3_createState());
    if (!hash) return Fail(ENOMEM, "fetch: hash state for", p);
    XXH3_128bits_reset(hash.get());
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);

    int err = 0;
    bool read_failed = false;
    std::unique_ptr<Mapping> map;
    if (size > 0) map = std::make_unique<Mapping>(dst_fd, size, PROT_READ | PROT_WRITE);
    std::unique_ptr<Ring> ring = size > 0 && map->ok() ? MakeRing() : nullptr;
    if (ring) {
      char* base = map->base();
      err = RingRead(*ring, fd.get(), base, size, {},
                     [&](uint64_t off, uint64_t len) { XXH3_128bits_update(hash.get(), base + off, len); });
      read_failed = true;
      ring.reset();
    } else if (size > 0) {
      err = BufferedCopy(fd.get(), dst_fd, size, {}, hash.get(), &read_failed);
    }
    if (err) return Fail(err, read_failed ? "fetch: read" : "fetch: write destination for", p);
    DropCache(fd.get());  // the tier holds the bytes now
    XXH128_hash_t h = XXH3_128bits_digest(hash.get());
    return std::pair<uint64_t, uint64_t>{h.high64, h.low64};
  }

  Status List(const std::function<void(const Entry&)>& fn) override {
    int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Fail(errno, "list: open", root_);
    return Walk(fd, "", fn);
  }

 private:
  // The absolute path of a relative one; of the root when `rel` is empty.
  std::string Abs(const std::string& rel) const { return prefix_ + rel; }
  std::string AbsDir(const std::string& rel) const { return rel.empty() ? root_ : Abs(rel); }

  static uint64_t Nonce() {
    std::random_device rd;
    return static_cast<uint64_t>(rd()) << 32 | rd();
  }

  static bool ValidToken(const std::string& t) {
    return !t.empty() && t != "." && t != ".." && t.find('/') == std::string::npos &&
           t.find('\0') == std::string::npos;
  }

  // A name no other call of this process, nor (with the random nonce)
  // another daemon on the same store, picks.
  std::string UniqueName(std::string_view prefix) {
    char buf[80];
    std::snprintf(buf, sizeof buf, "%.*s%x-%llx-%llx", static_cast<int>(prefix.size()), prefix.data(),
                  static_cast<unsigned>(getpid()), static_cast<unsigned long long>(nonce_),
                  static_cast<unsigned long long>(counter_.fetch_add(1, std::memory_order_relaxed)));
    return buf;
  }

  // Makes a directory durable: its entries survive a crash.
  static Status FsyncDir(const std::string& dir) {
    Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.ok()) return Fail(errno, "open directory to fsync", dir);
    if (fsync(fd.get()) != 0 && errno != EINVAL) return Fail(errno, "fsync directory", dir);
    return {};
  }

  // mkdir of one relative path: EEXIST of a directory is success; with
  // `may_create_parents`, missing parents are made (0755) first. A created
  // directory gets mode & 07777 exactly (0755 when mode is 0), umask aside.
  Status MkdirOne(const std::string& rel, uint32_t mode, bool may_create_parents) {
    std::string p = Abs(rel);
    mode_t m = mode ? mode & 07777 : 0755;
    if (mkdir(p.c_str(), m) != 0) {
      int e = errno;
      if (e == EEXIST) {
        struct stat st;
        if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return {};
        return Fail(EEXIST, "mkdir: not a directory:", p);
      }
      if (e != ENOENT || !may_create_parents) return Fail(e, "mkdir", p);
      if (auto s = EnsureParent(rel); !s) return s;
      if (mkdir(p.c_str(), m) != 0) {
        if (errno == EEXIST) return MkdirOne(rel, mode, false);  // made by someone else meanwhile
        return Fail(errno, "mkdir", p);
      }
    }
    // mkdir() applies the umask and drops S_ISUID/S_ISGID; the mode is the
    // namespace's, so set it exactly.
    if (mode != 0 && chmod(p.c_str(), m) != 0) return Fail(errno, "mkdir: chmod", p);
    return FsyncDir(AbsDir(ParentOf(rel)));
  }

  // Makes every missing directory above `rel`.
  Status EnsureParent(const std::string& rel) {
    std::string parent = ParentOf(rel);
    if (parent.empty()) return {};
    struct stat st;
    if (lstat(Abs(parent).c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return {};
      return Fail(ENOTDIR, "parent is not a directory:", Abs(parent));
    }
    return MkdirOne(parent, 0, true);
  }

  // Renames the staging-area entry `tmp` over `rel` and makes it durable;
  // `tmp` is gone afterwards whatever happened.
  Status ReplaceWith(const std::string& tmp, const std::string& rel, std::string_view op) {
    std::string dst = Abs(rel);
    if (rename(tmp.c_str(), dst.c_str()) != 0) {
      int e = errno;
      unlink(tmp.c_str());
      return Fail(e, std::string(op) + ": replace", dst);
    }
    // rename() of two links to one inode does nothing and leaves `tmp`.
    unlink(tmp.c_str());
    return FsyncDir(AbsDir(ParentOf(rel)));
  }

  // Reports the entries of the directory open as `fd` (taken over), whose
  // path is `rel`, sorted by name, each directory before what it holds.
  Status Walk(int fd, const std::string& rel, const std::function<void(const Entry&)>& fn) {
    DIR* d = fdopendir(fd);
    if (!d) {
      int e = errno;
      close(fd);
      return Fail(e, "list: opendir", AbsDir(rel));
    }
    std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* de = readdir(d)) {
      std::string_view n = de->d_name;
      if (n == "." || n == "..") continue;
      if (rel.empty() && (n == kTmpDir || n.starts_with(kProbePrefix))) continue;
      names.emplace_back(n);
    }
    if (errno != 0) return Fail(errno, "list: readdir", AbsDir(rel));
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      std::string child = rel.empty() ? name : rel + "/" + name;
      struct stat st;
      if (fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed while we walked
        return Fail(errno, "list: stat", Abs(child));
      }
      Entry e{};
      e.path = child;
      e.mode = st.st_mode & 07777;
      e.mtime_sec = st.st_mtim.tv_sec;
      e.mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
      if (S_ISDIR(st.st_mode)) {
        e.type = Entry::Type::kDir;
        fn(e);
        int sub = openat(dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
          if (errno == ENOENT) continue;
          return Fail(errno, "list: open", Abs(child));
        }
        if (auto s = Walk(sub, child, fn); !s) return s;
      } else if (S_ISREG(st.st_mode)) {
        e.type = Entry::Type::kFile;
        e.size = static_cast<uint64_t>(st.st_size);
        char buf[64];
        ssize_t n = lgetxattr(Abs(child).c_str(), kChecksumXattr, buf, sizeof buf);
        if (n > 0) e.has_checksum = ParseChecksumHex(std::string_view(buf, n), &e.checksum_hi, &e.checksum_lo);
        fn(e);
      } else if (S_ISLNK(st.st_mode)) {
        e.type = Entry::Type::kSymlink;
        std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
        for (;;) {
          ssize_t n = readlinkat(dirfd(d), name.c_str(), target.data(), target.size());
          if (n < 0) {
            if (errno == ENOENT) break;
            return Fail(errno, "list: readlink", Abs(child));
          }
          if (static_cast<size_t>(n) < target.size()) {
            target.resize(static_cast<size_t>(n));
            e.target = std::move(target);
            fn(e);
            break;
          }
          target.resize(target.size() * 2);  // grew since the stat
        }
      } else {
        LOG_WARN("posix backend: list: skipping '{}': not a file, directory or symlink", Abs(child));
      }
    }
    return {};
  }

  const std::string root_;    // absolute, no trailing '/' (unless it is "/")
  const std::string prefix_;  // root_ with a trailing '/'
  const std::string tmp_dir_;
  const uint64_t nonce_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace

Result<std::unique_ptr<Backend>> OpenPosixBackend(const std::string& root) {
  if (root.empty()) return Fail(EINVAL, "open: empty root", root);
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(root, ec);
  if (ec) return Fail(ec.value(), "open: resolve", root);
  std::string r = abs.lexically_normal().string();
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  struct stat st;
  if (stat(r.c_str(), &st) != 0) return Fail(errno, "open: stat root", r);
  if (!S_ISDIR(st.st_mode)) return Fail(ENOTDIR, "open: root", r);
  try {
    return std::make_unique<PosixBackend>(std::move(r));
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

}  // namespace ckpt::backend
