// uring.cc — Ring: io_uring set-up, probing, submit and wait.
#include "backend/uring.h"

#include <atomic>

namespace ckpt::backend {

namespace {

// Whether the kernel has the opcodes the backend uses: probed once per
// process (a probe is a syscall; the answer never changes).
// 0 unknown, 1 yes, 2 no.
std::atomic<int> g_ops_supported{0};

bool OpsSupported(io_uring* ring) {
  int known = g_ops_supported.load(std::memory_order_relaxed);
  if (known) return known == 1;
  io_uring_probe* probe = io_uring_get_probe_ring(ring);
  // No probe (kernels before 5.6) also means no IORING_OP_READ/WRITE.
  bool ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
            io_uring_opcode_supported(probe, IORING_OP_WRITE);
  if (probe) io_uring_free_probe(probe);
  g_ops_supported.store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

}  // namespace

Result<std::unique_ptr<Ring>> Ring::Create(unsigned depth) {
  std::unique_ptr<Ring> r(new Ring());
  int rc = io_uring_queue_init(depth, &r->ring_, 0);
  if (rc < 0) return Err(-rc);
  r->live_ = true;
  if (!OpsSupported(&r->ring_)) return Err(EOPNOTSUPP);
  return r;
}

Ring::~Ring() {
  if (live_) io_uring_queue_exit(&ring_);
}

Status Ring::Submit() {
  for (;;) {
    int rc = io_uring_submit(&ring_);
    if (rc >= 0) return {};
    if (rc != -EINTR && rc != -EAGAIN) return Err(-rc);
  }
}

Result<io_uring_cqe*> Ring::Wait() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc == 0) return cqe;
    if (rc != -EINTR && rc != -EAGAIN) return Err(-rc);
  }
}

}  // namespace ckpt::backend
