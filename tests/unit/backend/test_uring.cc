// test_uring.cc — SlotQueue (backend/uring.h): whole reads and writes come
// back complete, a read past EOF is requeued while short and ends with EIO,
// and a transfer not retried ends as it is. Skipped where io_uring is
// unavailable (a sandbox): a counted skip, which fails the run unless
// tests/unit/expected_skips.txt lists it for that machine.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/uring.h"

using namespace ckpt::backend;

namespace {

int TempFile() {
  char path[] = "/tmp/ckpt-uring-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  return fd;
}

// A ring of `depth`, or the test is skipped (no io_uring here).
std::unique_ptr<Ring> RingOrSkip(unsigned depth) {
  auto ring = Ring::Create(depth);
  if (!ring) cr_skip_test("no io_uring here: Ring::Create: %s", strerror(ring.error()));
  return std::move(*ring);
}

}  // namespace

Test(slot_queue, write_then_read_whole_chunks) {
  auto ring = RingOrSkip(4);
  int fd = TempFile();
  constexpr uint64_t kChunk = 64 * 1024;
  {
    SlotQueue q(*ring, fd, SlotQueue::Op::kWrite, 4, kChunk);
    cr_assert(q.ok());
    for (unsigned i = 0; i < 4; i++) {
      int s = q.FreeSlot();
      cr_assert_geq(s, 0);
      memset(q[static_cast<unsigned>(s)].buf, 'a' + static_cast<int>(i), kChunk);
      q.Start(static_cast<unsigned>(s), i, i * kChunk, kChunk);
    }
    cr_assert_eq(q.FreeSlot(), -1);
    cr_assert(q.Submit().has_value());
    for (int n = 0; n < 4; n++) {
      auto d = q.Reap(true);
      cr_assert(d.has_value());
      cr_assert_eq(d->err, 0);
      cr_assert(q[d->slot].complete);
      q[d->slot].busy = false;
    }
    cr_assert_eq(q.inflight(), 0u);
  }
  SlotQueue q(*ring, fd, SlotQueue::Op::kRead, 2, kChunk);
  cr_assert(q.ok());
  q.Start(0, 0, 3 * kChunk, kChunk);
  cr_assert(q.Submit().has_value());
  auto d = q.Reap(true);
  cr_assert(d.has_value());
  cr_assert_eq(d->err, 0);
  cr_assert_eq(q[0].done, kChunk);
  cr_assert_eq(q[0].buf[0], 'd');
  cr_assert_eq(q[0].buf[kChunk - 1], 'd');
  close(fd);
}

Test(slot_queue, read_past_eof_is_eio) {
  auto ring = RingOrSkip(2);
  int fd = TempFile();
  cr_assert_eq(pwrite(fd, "0123456789", 10, 0), 10);
  SlotQueue q(*ring, fd, SlotQueue::Op::kRead, 1, 4096);
  cr_assert(q.ok());
  q.Start(0, 0, 0, 4096);
  cr_assert(q.Submit().has_value());
  auto d = q.Reap(true);  // 10 bytes, requeued, then 0: the file ended early
  cr_assert(d.has_value());
  cr_assert_eq(d->err, EIO);
  cr_assert_eq(q[0].done, 10u);
  cr_assert_not(q[0].complete);
  cr_assert_eq(std::string(q[0].buf, 10), std::string("0123456789"));

  q[0].busy = false;
  q.Start(0, 1, 0, 4096);
  cr_assert(q.Submit().has_value());
  d = q.Reap(false);  // short, not retried: ends as it is
  cr_assert(d.has_value());
  cr_assert_eq(d->err, EIO);
  cr_assert_eq(q[0].done, 10u);
  close(fd);
}
