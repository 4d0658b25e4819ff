// uring.h — a small owner for one io_uring instance.
//
// Ring wraps liburing's queue set-up and tear-down so a ring can never leak
// (the destructor calls io_uring_queue_exit), retries the calls that may be
// interrupted by a signal, and tells callers up front whether io_uring can be
// used at all: a sandbox (seccomp, io_uring_disabled, an old kernel without
// IORING_OP_READ/WRITE) makes Create fail, and callers fall back to plain
// pread/pwrite. It gives up any sharing: each ring belongs to the one thread
// that created it, and no method is thread-safe.
#pragma once

#include <liburing.h>

#include <memory>

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

}  // namespace ckpt::backend
