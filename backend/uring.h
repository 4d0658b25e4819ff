// uring.h — a small owner for one io_uring instance.
//
// Ring wraps liburing's queue set-up and tear-down so a ring can never leak
// (the destructor calls io_uring_queue_exit), retries the calls that may be
// interrupted by a signal, and tells callers up front whether io_uring can be
// used at all: a sandbox (seccomp, io_uring_disabled, an old kernel without
// IORING_OP_READ/WRITE) makes Create fail, and callers fall back to plain
// pread/pwrite. It gives up any sharing: each ring belongs to the one thread
// that created it, and no method is thread-safe.
//
// SlotQueue is the loop both of the POSIX backend's copies share (liburing
// examples/io_uring-cp.c): a fixed set of chunk buffers, one transfer each
// (all reads or all writes on one fd), with interrupted and short transfers
// requeued until they are whole.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/result.h"

namespace ckpt::backend {

class Ring {
 public:
  // Creates a ring with room for `depth` submissions. Errors: the errno of
  // io_uring_queue_init (ENOSYS, EPERM, ENOMEM...), or EOPNOTSUPP when the
  // kernel lacks IORING_OP_READ or IORING_OP_WRITE. Logs nothing.
  [[nodiscard]] static Result<std::unique_ptr<Ring>> Create(unsigned depth);

  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // A free submission entry. REQUIRES: fewer than `depth` entries prepared
  // and not yet submitted (never nullptr then).
  io_uring_sqe* GetSqe() { return io_uring_get_sqe(&ring_); }

  // Submits every prepared entry. Errors: a positive errno.
  [[nodiscard]] Status Submit();

  // Waits for one completion (retrying EINTR); pass it to Seen once read.
  [[nodiscard]] Result<io_uring_cqe*> Wait();
  void Seen(io_uring_cqe* cqe) { io_uring_cqe_seen(&ring_, cqe); }

 private:
  Ring() = default;
  io_uring ring_{};
  bool live_ = false;  // io_uring_queue_init succeeded
};

// Anonymous memory mapped for one transfer and unmapped after it, so the
// buffers never stay in the daemon's heap (malloc keeps freed 4 MiB blocks
// once its mmap threshold has grown, and the daemon's RSS with them).
class MappedBuffer {
 public:
  explicit MappedBuffer(size_t bytes);
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  char* get() const { return base_; }  // nullptr when the mapping failed

 private:
  char* base_;
  size_t size_;
};

// `depth` slots over one ring and one fd, each with a `chunk`-byte buffer
// and at most one transfer (a read into its buffer, or a write from it) in
// flight. The caller picks a free slot, fills it (writes) and Starts it,
// Submits, and Reaps completions one at a time. Thread: the ring's.
class SlotQueue {
 public:
  enum class Op { kRead, kWrite };
  struct Slot {
    char* buf = nullptr;                  // `chunk` bytes, owned by the queue
    uint64_t seq = 0;                     // the caller's order of this transfer
    uint64_t off = 0, len = 0, done = 0;  // file range, and how much of it is transferred
    int fd = -1;                          // the fd of this transfer (Start's, else the queue's)
    bool busy = false;                    // Started and not yet released by the caller
    bool complete = false;                // done == len
  };
  struct Done {
    unsigned slot;
    int err;  // 0: the whole range; else an errno (EIO: a transfer of 0 bytes, the file ended early)
  };

  SlotQueue(Ring& ring, int fd, Op op, unsigned depth, uint64_t chunk);
  // False when the buffers could not be mapped (ENOMEM).
  bool ok() const { return mem_.get() != nullptr; }

  unsigned depth() const { return static_cast<unsigned>(slots_.size()); }
  unsigned inflight() const { return inflight_; }
  Slot& operator[](unsigned i) { return slots_[i]; }
  // A slot that is not busy, or -1.
  int FreeSlot() const;

  // Marks slot `i` busy with transfer `seq` of [off, off + len) and
  // prepares it (len <= chunk), on `fd` (-1: the queue's fd). REQUIRES:
  // slot `i` not busy.
  void Start(unsigned i, uint64_t seq, uint64_t off, uint64_t len, int fd = -1);
  // Prepares what is left of slot `i`'s transfer again, on `fd`: a transfer
  // that one fd refused (an O_DIRECT write the file system will not take:
  // EINVAL) goes on through another fd of the same file. REQUIRES: slot
  // `i` busy and Reaped with an error.
  void Resume(unsigned i, int fd);
  // Submits what Start prepared (nothing: no syscall). A failure leaves the
  // ring in an unknown state: its owner tears it down, which cancels what
  // is in flight.
  [[nodiscard]] Status Submit();
  // Waits until one transfer ends. With `retry`, one that was interrupted
  // (EINTR, EAGAIN) or short is requeued and waited for again; without (the
  // caller has given up), it ends as it is, with an errno. The slot stays
  // busy: the caller releases it (busy = false). Errors: the ring's.
  [[nodiscard]] Result<Done> Reap(bool retry);

 private:
  void Prep(unsigned i);

  Ring& ring_;
  int fd_;
  Op op_;
  MappedBuffer mem_;
  std::vector<Slot> slots_;
  unsigned inflight_ = 0;  // transfers started and not reaped
  bool pending_ = false;   // prepared and not submitted
};

}  // namespace ckpt::backend
