// reply_yield.h — lets a request's caller wake on the CPU it slept on.
//
// A FUSE round trip wakes its caller from the daemon thread that hands the
// reply to the kernel, while that thread still runs. Linux then prefers an
// idle CPU for the woken caller, and a task that has just moved keeps
// moving (it goes back to the CPU it left while that one is idle): a
// process doing open/fstat/close in a row ping-pongs between CPUs, one move
// per round trip. On a VM whose idle vCPUs halt, each move is an interrupt
// through the host, ~40 µs against a 7 µs round trip (docs/benchmarks.md,
// "Where a load's round trips go").
//
// The scheduler checks first whether the waker's CPU runs only SCHED_IDLE
// tasks, and keeps the woken task there if so. A ring thread of
// fs/fuse_uring.cc — pinned to the CPU its callers sleep on — that runs at
// SCHED_IDLE just while it commits replies is therefore preempted by its
// caller on the spot, on the caller's own CPU, and switches back to
// SCHED_OTHER when it next runs, before it waits for another request.
// Measured: an open after a CPU-bound burst 49 → 10 µs; under 16 busy loops
// on 2 CPUs with 4 callers, the latency tail unchanged. Not on /dev/fuse:
// libfuse's workers are not pinned, so the next request then wakes a worker
// on the idle CPU instead (an open 11 → 56 µs, measured).
//
// Leaving SCHED_IDLE needs CAP_SYS_NICE (or an RLIMIT_NICE of 20): Setup
// probes it on a throwaway thread and stays off where it is missing.
// -o reply_yield=off turns it off.
#pragma once

#include <string>

namespace ckpt::fs::reply_yield {

// Turns yielding on where the process may leave SCHED_IDLE again (probed
// once). Returns whether it is on; WhyNot() says why not.
bool Setup(bool want);
bool On();
std::string WhyNot();

// While one lives, the calling thread runs at SCHED_IDLE (when On()).
class Scope {
 public:
  Scope();
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool idle_ = false;
};

}  // namespace ckpt::fs::reply_yield
