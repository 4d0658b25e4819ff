// tsan_ring.h — telling ThreadSanitizer that an io_uring ring's memory
// changed hands.
//
// liburing maps and unmaps a ring's queues with raw system calls, which
// ThreadSanitizer does not intercept: it keeps the history of a ring's
// memory after the ring is gone, and when a later ring of another thread
// is mapped at the same address, reports that thread's first use of its
// own queue as racing with the old owner. The kernel orders the munmap
// before the mmap that reuses the address; every ring in the daemon (the
// backend's backend::Ring, fs/fuse/fuse_uring's request rings) tells TSan
// so: RingMapped right after io_uring_queue_init*, RingUnmapped right
// before io_uring_queue_exit. Both compile to nothing outside a TSan build.
// In common/ because both backend/ and fs/ have rings, and neither may
// depend on the other.
#pragma once

namespace ckpt {

void RingMapped();
void RingUnmapped();

}  // namespace ckpt
