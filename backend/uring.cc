// uring.cc — Ring: io_uring set-up, probing, submit and wait; SlotQueue:
// chunk transfers in flight on one ring, requeued until whole.
#include "backend/uring.h"

#include "common/tsan_ring.h"

#include <sys/mman.h>

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
  bool ok =
      probe && io_uring_opcode_supported(probe, IORING_OP_READ) && io_uring_opcode_supported(probe, IORING_OP_WRITE);
  if (probe) io_uring_free_probe(probe);
  g_ops_supported.store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

}  // namespace


Result<std::unique_ptr<Ring>> Ring::Create(unsigned depth) {
  std::unique_ptr<Ring> r(new Ring());
  int rc = io_uring_queue_init(depth, &r->ring_, 0);
  if (rc < 0) return Err(-rc);
  RingMapped();
  r->live_ = true;
  if (!OpsSupported(&r->ring_)) return Err(EOPNOTSUPP);
  return r;
}

Ring::~Ring() {
  if (!live_) return;
  RingUnmapped();  // before the munmap: a new ring may get the address right after it
  io_uring_queue_exit(&ring_);
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

MappedBuffer::MappedBuffer(size_t bytes) : size_(bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

MappedBuffer::~MappedBuffer() {
  if (base_) munmap(base_, size_);
}

SlotQueue::SlotQueue(Ring& ring, int fd, Op op, unsigned depth, uint64_t chunk)
    : ring_(ring), fd_(fd), op_(op), mem_(depth * chunk), slots_(depth) {
  if (mem_.get())
    for (unsigned i = 0; i < depth; i++) slots_[i].buf = mem_.get() + i * chunk;
}

int SlotQueue::FreeSlot() const {
  for (unsigned i = 0; i < slots_.size(); i++)
    if (!slots_[i].busy) return static_cast<int>(i);
  return -1;
}

void SlotQueue::Prep(unsigned i) {
  Slot& sl = slots_[i];
  io_uring_sqe* sqe = ring_.GetSqe();
  auto n = static_cast<unsigned>(sl.len - sl.done);
  if (op_ == Op::kRead) io_uring_prep_read(sqe, sl.fd, sl.buf + sl.done, n, sl.off + sl.done);
  else io_uring_prep_write(sqe, sl.fd, sl.buf + sl.done, n, sl.off + sl.done);
  io_uring_sqe_set_data64(sqe, i);
  pending_ = true;
}

void SlotQueue::Start(unsigned i, uint64_t seq, uint64_t off, uint64_t len, int fd) {
  Slot& sl = slots_[i];
  sl.seq = seq, sl.off = off, sl.len = len, sl.done = 0;
  sl.fd = fd >= 0 ? fd : fd_;
  sl.busy = true, sl.complete = false;
  Prep(i);
  inflight_++;
}

void SlotQueue::Resume(unsigned i, int fd) {
  slots_[i].fd = fd;
  slots_[i].complete = false;
  Prep(i);
  inflight_++;
}

Status SlotQueue::Submit() {
  if (!pending_) return {};
  pending_ = false;
  return ring_.Submit();
}

Result<SlotQueue::Done> SlotQueue::Reap(bool retry) {
  for (;;) {
    auto cqe = ring_.Wait();
    if (!cqe) return Err(cqe.error());
    auto i = static_cast<unsigned>(io_uring_cqe_get_data64(*cqe));
    int res = (*cqe)->res;
    ring_.Seen(*cqe);
    Slot& sl = slots_[i];
    if (res > 0) sl.done += static_cast<uint64_t>(res);
    bool again = res == -EINTR || res == -EAGAIN || (res > 0 && sl.done < sl.len);
    if (retry && again) {
      Prep(i);  // interrupted or short: queue the rest
      if (auto st = Submit(); !st) return Err(st.error());
      continue;
    }
    inflight_--;
    int err = res < 0 ? -res : res == 0 || sl.done < sl.len ? EIO : 0;
    sl.complete = err == 0;
    return Done{i, err};
  }
}

}  // namespace ckpt::backend
