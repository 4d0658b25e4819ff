// host_copier.cc — the Copier of the host build (copier.h): memcpy on one
// thread of its own, which stands in for the CUDA stream.
//
// It keeps the stream's semantics the pipeline relies on: copies run in the
// order they were enqueued, after the enqueuing call has returned; a mark
// completes after every copy enqueued before it; an error is reported by the
// first mark after the failing copy (copies after it still run, as CUDA's
// copies do after a failed one).
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "gpu/copier.h"

namespace ckpt::gpu {
namespace {

constexpr int kSlots = 64;

class HostCopier final : public Copier {
 public:
  explicit HostCopier(const HostCopierOptions& o) : opts_(o), stream_([this] { Run(); }) {}

  ~HostCopier() override {
    {
      MutexLock lk(&mu_);
      stop_ = true;
      cv_.NotifyAll();
    }
    stream_.join();
  }

  std::string Name() const override { return "host"; }

  Result<void*> AllocPinned(size_t n) override {
    void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (!p) return Err(ENOMEM);
    return p;
  }
  void FreePinned(void* p) override { std::free(p); }

  Status ToHost(void* dst, uint64_t src, size_t n) override {
    return Enqueue(Op{static_cast<char*>(dst), reinterpret_cast<const char*>(src), n, -1});
  }
  Status ToDevice(uint64_t dst, const void* src, size_t n) override {
    return Enqueue(Op{reinterpret_cast<char*>(dst), static_cast<const char*>(src), n, -1});
  }

  Status Record(int slot) override {
    if (slot < 0 || slot >= kSlots) return Err(EINVAL);
    MutexLock lk(&mu_);
    ops_.push_back(Op{nullptr, nullptr, 0, slot});
    marks_[slot] = ++enqueued_;
    cv_.NotifyAll();
    return {};
  }

  Status Wait(int slot) override {
    if (slot < 0 || slot >= kSlots) return Err(EINVAL);
    MutexLock lk(&mu_);
    uint64_t want = marks_[slot];
    while (done_ < want) cv_.Wait(&mu_);
    if (done_slot_err_[slot]) return Err(done_slot_err_[slot]);
    return {};
  }

 private:
  struct Op {
    char* dst;
    const char* src;
    size_t n;
    int slot;  // >= 0: a mark
  };

  Status Enqueue(Op op) {
    if (op.n && (!op.dst || !op.src)) return Err(EFAULT);
    MutexLock lk(&mu_);
    ops_.push_back(op);
    ++enqueued_;
    cv_.NotifyAll();
    return {};
  }

  void Run() {
    MutexLock lk(&mu_);
    for (;;) {
      while (ops_.empty() && !stop_) cv_.Wait(&mu_);
      if (ops_.empty()) return;
      Op op = ops_.front();
      ops_.pop_front();
      if (op.slot >= 0) {
        done_slot_err_[op.slot] = err_since_mark_;
        err_since_mark_ = 0;
      } else {
        lk.Unlock();
        if (opts_.delay_us) std::this_thread::sleep_for(std::chrono::microseconds(opts_.delay_us));
        bool fail = op.n > opts_.fail_after_bytes - std::min(copied_, opts_.fail_after_bytes);
        if (!fail) std::memcpy(op.dst, op.src, op.n);
        copied_ += op.n;
        lk.Lock();
        if (fail && !err_since_mark_) err_since_mark_ = EFAULT;
      }
      ++done_;
      cv_.NotifyAll();
    }
  }

  const HostCopierOptions opts_;
  uint64_t copied_ = 0;  // the stream thread's own
  Mutex mu_;
  CondVar cv_;
  std::deque<Op> ops_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t enqueued_ GUARDED_BY(mu_) = 0;  // ops ever enqueued
  uint64_t done_ GUARDED_BY(mu_) = 0;      // ops ever finished (in order)
  uint64_t marks_[kSlots] GUARDED_BY(mu_) = {};
  int done_slot_err_[kSlots] GUARDED_BY(mu_) = {};
  int err_since_mark_ GUARDED_BY(mu_) = 0;
  std::thread stream_;  // last: starts after the members above exist
};

}  // namespace

std::unique_ptr<Copier> MakeHostCopier(const HostCopierOptions& o) { return std::make_unique<HostCopier>(o); }

}  // namespace ckpt::gpu
