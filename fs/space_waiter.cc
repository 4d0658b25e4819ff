// space_waiter.cc — one thread that runs the requests waiting for tier space.
#include "fs/space_waiter.h"

namespace ckpt::fs {

SpaceWaiter::SpaceWaiter() : thread_([this] { Run(); }) {}

SpaceWaiter::~SpaceWaiter() { Stop(); }

bool SpaceWaiter::Submit(Job job, size_t bytes) {
  {
    std::lock_guard lk(mu_);
    if (stop_ || bytes_ + bytes > kMaxQueuedBytes) return false;
    bytes_ += bytes;
    jobs_.emplace_back(std::move(job), bytes);
    queued_++;
  }
  cv_.notify_one();
  return true;
}

void SpaceWaiter::Run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopped, nothing left
    auto [job, bytes] = std::move(jobs_.front());
    jobs_.pop_front();
    bool cancelled = stop_;
    lk.unlock();
    job(cancelled);
    lk.lock();
    bytes_ -= bytes;
    queued_--;
  }
}

void SpaceWaiter::Stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ckpt::fs
