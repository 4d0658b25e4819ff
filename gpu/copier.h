// copier.h — the copy engine under the GPU pipeline (gpu/pipeline.h): the
// one part that differs between the CUDA build and the host build.
//
// A Copier owns one in-order stream. ToHost/ToDevice enqueue a copy and may
// return before it has run; Record(slot) puts a mark after everything
// enqueued so far, and Wait(slot) blocks until the copies before the latest
// mark of that slot have finished, returning the first error any of them
// met. The pipeline keeps one slot per staging buffer: a buffer is reused
// only after Wait on its slot.
//
// Two implementations:
//  - host_copier.cc: memcpy on a thread of its own (the "stream"), so the
//    pipeline's staging, ordering, error and cancellation logic runs, and is
//    tested, on any machine. "Device" addresses are host addresses there.
//  - cuda_copier.cc (CKPT_HAVE_CUDA, CUDA=1 builds only): cudaMemcpyAsync
//    with cudaMemcpyDefault on a non-blocking stream, events for the marks,
//    cudaHostAlloc for pinned memory. Any pointer CUDA's unified addressing
//    knows (device memory of any framework, or host memory) is accepted.
//
// Thread-safety: one thread enqueues and records (the pipeline's caller);
// Wait may be called from any thread, also from two at once on one slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"

namespace ckpt::gpu {

class Copier {
 public:
  virtual ~Copier() = default;

  // "cuda" or "host": what the library reports to its users.
  virtual std::string Name() const = 0;

  // Page-locked host memory of `n` bytes (host build: plain memory). The
  // error is ENOMEM, or ENODEV when no GPU can be used.
  [[nodiscard]] virtual Result<void*> AllocPinned(size_t n) = 0;
  virtual void FreePinned(void* p) = 0;

  // Enqueues one copy. An error here means it was not enqueued (EFAULT for
  // an address the engine refuses); errors while it runs come from Wait.
  [[nodiscard]] virtual Status ToHost(void* dst, uint64_t src, size_t n) = 0;
  [[nodiscard]] virtual Status ToDevice(uint64_t dst, const void* src, size_t n) = 0;

  // Marks the stream for `slot` (0 <= slot < 64), after everything enqueued
  // so far, replacing that slot's previous mark.
  [[nodiscard]] virtual Status Record(int slot) = 0;
  // Waits for the slot's latest mark. 0 when no mark was recorded.
  [[nodiscard]] virtual Status Wait(int slot) = 0;
};

// Test knobs of the host copier (unit tests only): each copy sleeps
// `delay_us` first (so a pipeline that returned before its copies finished
// is caught), and the copy that would take the bytes copied past
// `fail_after_bytes` fails with EFAULT.
struct HostCopierOptions {
  uint32_t delay_us = 0;
  uint64_t fail_after_bytes = UINT64_MAX;
};
std::unique_ptr<Copier> MakeHostCopier(const HostCopierOptions& o = {});

#ifdef CKPT_HAVE_CUDA
// The CUDA copier on the device current to the calling thread. ENODEV (with
// CUDA's message in `why`) when no device can be used.
[[nodiscard]] Result<std::unique_ptr<Copier>> MakeCudaCopier(std::string* why);
#endif

}  // namespace ckpt::gpu
