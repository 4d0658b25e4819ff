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
// fs/fuse/fuse_uring.cc — pinned to the CPU its callers sleep on — that runs at
// SCHED_IDLE just while it commits replies is therefore preempted by its
// caller on the spot, on the caller's own CPU, and switches back to
// SCHED_OTHER when it next runs, before it waits for another request.
// Measured: an open after a CPU-bound burst 49 → 10 µs. Not on /dev/fuse:
// libfuse's workers are not pinned, so the next request then wakes a worker
// on the idle CPU instead (an open 11 → 56 µs, measured).
//
// The hazard: a thread preempted at SCHED_IDLE gets a sliver of a CPU that
// something else keeps busy, while the kernel may hand it the next request
// of its queue (its entry is the one made available last). So a watch
// thread puts any member left at SCHED_IDLE for over kStuckNs back to
// SCHED_OTHER, whatever keeps its CPU busy; it is woken by a timer armed
// only while members yield, so an idle mount costs nothing.
//
// Leaving SCHED_IDLE needs CAP_SYS_NICE (or an RLIMIT_NICE of 20): Setup
// probes it on a throwaway thread and stays off where it is missing.
// On by default; -o reply_yield=off turns it off.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace ckpt::fs::reply_yield {

// Turns yielding on where the process may leave SCHED_IDLE again (probed
// once). Returns whether it is on; WhyNot() says why not.
bool Setup(bool want);
bool On();
std::string WhyNot();

// How often the watch put a member back to SCHED_OTHER, since the process
// started.
uint64_t Rescued();
// How often the watch woke (for tests: it sleeps while nothing yields).
uint64_t WatchWakes();

inline constexpr int64_t kStuckNs = 5'000'000;  // the watch puts back members idle longer
inline constexpr int64_t kWatchNs = 5'000'000;  // the watch's period while members yield

// The threads that serve one CPU's requests (a queue's ring threads), all
// pinned to that CPU. Only members yield. A group outlives its members.
class Group {
 public:
  static constexpr int kMaxMembers = 16;  // later threads join, never yield

  Group();
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // The calling thread is a member while one lives.
  class Member {
   public:
    explicit Member(Group& g);
    ~Member();
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
  };

  struct Slot {
    std::atomic<pid_t> tid{0};
    std::atomic<int64_t> since{0};  // CLOCK_MONOTONIC ns it went idle; 0: not idle
  };

 private:
  friend class Watch;
  Slot slots_[kMaxMembers];
  std::atomic<int> used_{0};
};

// While one lives, the calling thread — a Group member — runs at
// SCHED_IDLE (when On()).
class Scope {
 public:
  Scope();
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Group::Slot* slot_ = nullptr;
};

}  // namespace ckpt::fs::reply_yield
