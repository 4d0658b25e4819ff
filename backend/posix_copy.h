// posix_copy.h — the POSIX backend's data path: a file's data extents
// (holes stay holes) read into buffers and written with io_uring, several
// chunks in flight, or through one buffer with pread/pwrite where io_uring
// cannot be used. Stage copies the tier into the staging file (RingStage);
// Fetch reads a backend file back (RingReadChunks / BufferedReadChunks).
// One ring per call, owned by the calling thread.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "backend/checksum.h"
#include "backend/posix_walk.h"
#include "backend/uring.h"
#include "common/io.h"

namespace ckpt::backend::posix {

inline constexpr uint64_t kChunkSize = 4ull << 20;
inline constexpr unsigned kQueueDepth = 8;  // Fetch: reads in flight

// The ring for one copy, or nullptr when io_uring cannot be used here (a
// warning is logged the first time). CKPTFS_BACKEND_NO_URING=1 in the
// environment forces the fallback (tests, or a kernel with a broken ring).
std::unique_ptr<Ring> MakeRing();

// The data of a file in [0, size) as chunks of at most kChunkSize that
// never cross a hole: the extents SEEK_DATA/SEEK_HOLE report, or the whole
// range where the file system cannot tell (EINVAL). lseek with SEEK_DATA or
// SEEK_HOLE computes from its argument, so sharing the descriptor's offset
// with other users of the fd is harmless.
class Extents {
 public:
  Extents(int fd, uint64_t size) : fd_(fd), size_(size) {}
  // The next chunk; false at the end or on error (then err() is set).
  bool Next(uint64_t* off, uint64_t* len);
  int err() const { return err_; }
  // Next, for a copy loop: at the end sets *more to false, and on an
  // error also *err and *read_failed.
  bool Take(uint64_t* off, uint64_t* len, bool* more, int* err, bool* read_failed) {
    if (Next(off, len)) return true;
    *more = false;
    if (err_) {
      *read_failed = true;
      *err = err_;
    }
    return false;
  }

 private:
  int fd_;
  uint64_t size_;
  uint64_t pos_ = 0, end_ = 0;  // the current extent is [.., end_)
  bool dense_ = false;
  int err_ = 0;
};

// Drops a backend file's clean pages from the page cache. The tier already
// holds the bytes, so caching them twice only costs memory; and measured
// (docs/benchmarks.md), gigabytes of such pages made the first read of a
// freshly drained file through the mount 3-6x slower.
inline void DropCache(int fd) { (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

// Reads the chunks `ext` yields from `fd` with up to kQueueDepth reads in
// flight, and calls on_chunk(off, len, data) for each, in offset order.
// Returns 0, an errno of the read (with *read_failed), or on_chunk's.
template <class OnChunk>
int RingReadChunks(Ring& ring, int fd, Extents& ext, bool* read_failed, OnChunk on_chunk) {
  SlotQueue q(ring, fd, SlotQueue::Op::kRead, kQueueDepth, kChunkSize);
  if (!q.ok()) return ENOMEM;
  uint64_t next_seq = 0, deliver_seq = 0;
  bool more = true;
  int err = 0;
  for (;;) {
    while (!err && more) {
      int i = q.FreeSlot();
      if (i < 0) break;
      uint64_t off, len;
      if (!ext.Take(&off, &len, &more, &err, read_failed)) break;
      q.Start(static_cast<unsigned>(i), next_seq++, off, len);
    }
    if (auto st = q.Submit(); !st) return st.error();  // the owner tears the ring down
    // Deliver what completed, in order.
    for (bool progress = true; progress && !err;) {
      progress = false;
      for (unsigned i = 0; i < q.depth(); i++) {
        SlotQueue::Slot& sl = q[i];
        if (sl.busy && sl.complete && sl.seq == deliver_seq) {
          if (int e = on_chunk(sl.off, sl.len, static_cast<const char*>(sl.buf))) err = e;
          sl.busy = false;
          deliver_seq++;
          progress = true;
        }
      }
    }
    if (q.inflight() == 0 && (err || !more)) break;
    if (q.inflight() == 0) continue;
    auto done = q.Reap(/*retry=*/!err);
    if (!done) return done.error();
    if (done->err && !err) *read_failed = true, err = done->err;
    if (err) q[done->slot].busy = false;
  }
  return err;
}

// The fallback read: chunk by chunk through one buffer.
template <class OnChunk>
int BufferedReadChunks(int fd, Extents& ext, const std::function<bool()>& cancelled, bool* read_failed,
                       OnChunk on_chunk) {
  MappedBuffer buf(kChunkSize);
  if (!buf.get()) return ENOMEM;
  uint64_t off, len;
  while (ext.Next(&off, &len)) {
    if (cancelled && cancelled()) return ECANCELED;
    if (int e = PreadFull(fd, buf.get(), len, off)) {
      *read_failed = true;
      return e;
    }
    if (int e = on_chunk(off, len, static_cast<const char*>(buf.get()))) return e;
  }
  if (ext.err()) *read_failed = true;
  return ext.err();
}

// Stage's copy: reads the data chunks of `in_fd` (the tier) into one of
// kStageDepth buffers, hashes them, and queues an io_uring write of each to
// the staging file at the same offset, up to kStageDepth writes in flight.
// Reading through buffers, not a mapping of the tier file: measured, writes
// sourced from a MAP_SHARED mapping of a tmpfs file ran at a seventh of the
// speed (page faults inside the buffered write path), and a mapping would
// let a tier file truncated meanwhile kill the daemon with SIGBUS. Short
// writes are requeued. 0 or an errno.
//
// Chunks whose offset and length are multiples of kDirectAlign go through
// `direct_fd` (the staging file opened O_DIRECT, -1: none): straight from
// the buffers to the disk, never through the backend's page cache. Measured
// (docs/benchmarks.md, issue #29): buffered, the 4 GiB drain spent most of
// its time copying into page-cache pages that this VM's host had taken
// back (2.5 CPU-seconds a GiB, 0.4 GB/s against the disk's 1.4), and then
// dropped them. The tail that is not aligned, and every chunk once the file
// system refused a direct write (EINVAL), goes through `fd`, buffered; then
// every kWritebackWindow bytes written in order, the kernel is told to start
// writing them back, so the final fdatasync has little left to do.
inline constexpr uint64_t kWritebackWindow = 32ull << 20;
inline constexpr unsigned kStageDepth = 4;          // 16 MiB of buffers per transfer
inline constexpr uint64_t kDirectAlign = 4096;      // offsets, lengths and buffers of direct writes
inline constexpr uint64_t kDirectMin = kChunkSize;  // smaller files are written buffered

struct StageTarget {
  int fd = -1;                  // the staging file, buffered
  int direct_fd = -1;           // the same file opened O_DIRECT, or -1
  uint64_t direct_bytes = 0;    // out: bytes written through direct_fd
  bool direct_refused = false;  // out: a direct write was refused (EINVAL, EOPNOTSUPP)
};

// The staging file `name` in `dir_fd` opened again with O_DIRECT for a
// file of `size` bytes, or an Fd holding -1: the file is smaller than
// kDirectMin, the file system refuses O_DIRECT (tmpfs before Linux 6.6,
// FUSE), or CKPTFS_BACKEND_NO_DIRECT=1 in the environment (then a warning
// is logged once).
Fd OpenDirect(int dir_fd, const char* name, uint64_t size);

int RingStage(Ring& ring, int in_fd, Extents& ext, StageTarget* out, const std::function<bool()>& cancelled,
              ContentHash* hash, bool* read_failed);

}  // namespace ckpt::backend::posix
