// cuda_copier.cc — the Copier of CUDA=1 builds (copier.h): the CUDA runtime's
// asynchronous copies on one non-blocking stream, an event per slot for
// the marks, and page-locked memory from cudaHostAlloc.
//
// cudaMemcpyDefault lets the runtime tell device from host addresses by
// unified virtual addressing, so any framework's device pointer (torch's
// data_ptr(), CuPy, a JAX buffer through DLPack) is accepted as it is, and a
// host pointer too. Copies into or out of pinned memory are truly
// asynchronous (DMA at PCIe speed) — the reason the staging buffers are
// pinned: a pageable destination would make the runtime stage through its
// own bounce buffer, synchronously. Nothing else in the library includes a
// CUDA header; the default build compiles this file to nothing.
#ifdef CKPT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <array>

#include "gpu/copier.h"

namespace ckpt::gpu {
namespace {

constexpr int kSlots = 64;

// errno for a CUDA error: a bad address or argument is EFAULT/EINVAL (the
// caller's), no memory ENOMEM, everything else EIO (the device's).
int ErrnoOf(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return 0;
    case cudaErrorInvalidValue: return EFAULT;
    case cudaErrorMemoryAllocation: return ENOMEM;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return ENODEV;
    default: return EIO;
  }
}

class CudaCopier final : public Copier {
 public:
  CudaCopier(int device, cudaStream_t s) : device_(device), stream_(s) {}

  ~CudaCopier() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_)
      if (e) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override { return "cuda"; }

  Result<void*> AllocPinned(size_t n) override {
    void* p = nullptr;
    cudaSetDevice(device_);
    // Portable: usable by copies of every device's stream, not only this one.
    if (cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable); e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      return Err(ErrnoOf(e) ? ErrnoOf(e) : ENOMEM);
    }
    return p;
  }
  void FreePinned(void* p) override {
    if (p) cudaFreeHost(p);
  }

  Status ToHost(void* dst, uint64_t src, size_t n) override {
    return Check(cudaMemcpyAsync(dst, reinterpret_cast<const void*>(src), n, cudaMemcpyDefault, stream_));
  }
  Status ToDevice(uint64_t dst, const void* src, size_t n) override {
    return Check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, n, cudaMemcpyDefault, stream_));
  }

  Status Record(int slot) override {
    if (slot < 0 || slot >= kSlots) return Err(EINVAL);
    if (!events_[slot]) {
      if (auto st = Check(cudaEventCreateWithFlags(&events_[slot], cudaEventDisableTiming)); !st) return st;
    }
    return Check(cudaEventRecord(events_[slot], stream_));
  }

  Status Wait(int slot) override {
    if (slot < 0 || slot >= kSlots) return Err(EINVAL);
    if (!events_[slot]) return {};
    return Check(cudaEventSynchronize(events_[slot]));
  }

 private:
  static Status Check(cudaError_t e) {
    if (e == cudaSuccess) return {};
    cudaGetLastError();
    return Err(ErrnoOf(e));
  }

  const int device_;
  cudaStream_t stream_;
  // Created by the enqueuing thread before the slot's first Record; Wait
  // only reads an entry its caller saw recorded.
  std::array<cudaEvent_t, kSlots> events_{};
};

}  // namespace

Result<std::unique_ptr<Copier>> MakeCudaCopier(std::string* why) {
  int device = 0;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count == 0) e = cudaErrorNoDevice;
  if (e == cudaSuccess) e = cudaGetDevice(&device);
  cudaStream_t s = nullptr;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    *why = std::string("CUDA: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return Err(ENODEV);
  }
  return std::unique_ptr<Copier>(std::make_unique<CudaCopier>(device, s));
}

}  // namespace ckpt::gpu

#endif  // CKPT_HAVE_CUDA
