// offload_queue.cc — the threads that run requests a FUSE worker must not wait for.
#include "fs/fuse/offload_queue.h"

#include <algorithm>

namespace ckpt::fs {

OffloadQueue::OffloadQueue(int threads, size_t max_bytes) : max_bytes_(max_bytes) {
  for (int i = 0; i < std::max(1, threads); i++) threads_.emplace_back([this] { Run(); });
}

OffloadQueue::~OffloadQueue() { Stop(); }

bool OffloadQueue::Submit(Job job, size_t bytes, std::chrono::milliseconds wait_for_room) {
  {
    MutexLock lk(&mu_);
    // Full: the job would take the queue past max_bytes_. A job alone in
    // it, or one that holds no copy (a fetch, a fallocate), always fits.
    auto full = [&] {
      mu_.AssertHeld();  // the caller's
      return bytes > 0 && bytes_ > 0 && bytes_ + bytes > max_bytes_;
    };
    const auto deadline = std::chrono::steady_clock::now() + wait_for_room;
    while (!stop_ && full())
      if (!room_cv_.WaitUntil(&mu_, deadline)) break;
    if (stop_ || full()) return false;
    bytes_ += bytes;
    jobs_.emplace_back(std::move(job), bytes);
    queued_++;
  }
  cv_.NotifyOne();
  return true;
}

void OffloadQueue::Run() {
  MutexLock lk(&mu_);
  for (;;) {
    while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
    if (jobs_.empty()) return;  // stopped, nothing left
    auto [job, bytes] = std::move(jobs_.front());
    jobs_.pop_front();
    bool cancelled = stop_;
    lk.Unlock();
    job(cancelled);
    lk.Lock();
    bytes_ -= bytes;
    queued_--;
    room_cv_.NotifyAll();
  }
}

void OffloadQueue::Stop() {
  {
    MutexLock lk(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  room_cv_.NotifyAll();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

}  // namespace ckpt::fs
