// offload_queue.h — where requests that must wait go, so that no
// FUSE worker does.
//
// libfuse serves requests from a fixed pool of worker threads. A write that
// finds the tier full used to wait for the drain inside its worker; twenty
// such writers took every worker, and then `stat`, `ls` and `ckptfs status`
// hung too. Now the worker tries the write without waiting
// (cache::Tier::Write with wait=false); on EAGAIN it copies the request's
// bytes (at most one request, 1 MiB, per writer) into a job and returns at
// once, and this one thread runs the jobs oldest first, each waiting as long
// as the tier's wait limit allows, and replies from here (docs/style.md: the
// thread that finishes the work replies).
//
// Order: while any job is queued, new writes that need space queue behind
// it (Busy()), so a writer that waited is not overtaken by later ones.
//
// A full queue (kMaxQueuedBytes of copies) holds the next write's worker
// for at most kRoomWait; then that write fails with ENOSPC. It used to wait
// for space in the worker, up to the tier's wait limit (10 minutes).
//
// The daemon has two: one thread for writes waiting for space (FIFO), and
// a few threads for opens that must first fetch an evicted file from the
// backend.
//
// Thread-safety: Submit/Busy from any thread; jobs run on the waiter's
// threads. Stop() runs every job still queued with cancelled=true (each must
// reply) and joins.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace ckpt::fs {

class OffloadQueue {
 public:
  // A job waits for space and replies; `cancelled` means: reply an error now.
  using Job = std::function<void(bool cancelled)>;

  // `threads` > 1 runs jobs side by side (started oldest first): for waits
  // that do not compete, such as fetches of different files. `max_bytes`:
  // the bound on the copied request data queued (kMaxQueuedBytes).
  explicit OffloadQueue(int threads = 1, size_t max_bytes = kMaxQueuedBytes);
  ~OffloadQueue();
  OffloadQueue(const OffloadQueue&) = delete;
  OffloadQueue& operator=(const OffloadQueue&) = delete;

  // Queues a job holding `bytes` of copied request data, unless the queue
  // would then hold more than max_bytes (a bound on the memory copies
  // take, reached only with hundreds of writers at once; a job alone in
  // the queue always fits). A full queue: waits up to `wait_for_room` for
  // jobs to finish. False if it is still full then, or stopping: the
  // caller must not wait much longer itself (a FUSE worker: see
  // kRoomWait) and replies.
  bool Submit(Job job, size_t bytes, std::chrono::milliseconds wait_for_room = {});
  bool Busy() const { return queued_.load() > 0; }
  size_t Queued() const { return queued_.load(); }
  void Stop();

  static constexpr size_t kMaxQueuedBytes = 256u << 20;
  // How long a FUSE worker waits for room in a full queue before its
  // write fails with ENOSPC (docs/operations.md): it is a lost worker
  // meanwhile, and with hundreds of writes already waiting for space the
  // tier is not about to have room for one more.
  static constexpr std::chrono::milliseconds kRoomWait{5000};

 private:
  void Run();

  const size_t max_bytes_;
  Mutex mu_;    // a leaf: jobs run without it
  CondVar cv_;  // a job queued, or Stop()
  CondVar room_cv_;  // a job finished (its bytes left the queue), or Stop()
  std::deque<std::pair<Job, size_t>> jobs_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<size_t> queued_{0};  // jobs queued or running
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::fs
