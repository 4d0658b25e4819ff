// save_activity.h — is a save in progress? The drain's question before it
// starts copying a file out.
//
// A drain that copies checkpoint N while the trainer writes checkpoint N+1
// takes CPU and memory bandwidth from the save: on a 2-core node a DCP save
// of 96 fsynced 2 MiB files took 2.4x the tmpfs time with the drain running
// beside it and 1.3x with the drain held back (docs/benchmarks.md). The
// stagers' lower nice value does not help there: the daemon runs in an
// autogroup of its own (it calls setsid), and autogroups share the CPU
// equally whatever their threads' nice values.
//
// So the drain yields: it starts no new transfer while a save looks under
// way — a mutating request (create, open for writing, write, fsync, close
// of a writer, rename, unlink, mkdir, setattr) in the last `quiet`, or a
// file opened for writing within the last `hold` and still open (a
// passthrough writer sends nothing while it writes). The hold is bounded:
// HoldDrain lets the transfers go once a busy stretch (activity with no
// quiet moment in it) has lasted `hold`, so a node that never stops
// writing drains as before, just that much later. See docs/architecture.md ("The drain yields to saves").
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <mutex>
#include <set>

namespace ckpt::fs {

class SaveActivity {
 public:
  static constexpr std::chrono::milliseconds kQuiet{50};

  // hold 0 (the default): the drain never yields. Set before the mount.
  void set_hold(std::chrono::milliseconds hold, std::chrono::milliseconds quiet = kQuiet) {
    hold_ns_ = hold.count() * 1000000;
    quiet_ns_ = quiet.count() * 1000000;
  }

  // A mutating request. One after a quiet moment begins a busy stretch.
  void Touch() { Note(MonoNs()); }
  // A file opened for writing; returns the token its close hands back.
  int64_t WriterOpened() {
    int64_t now = MonoNs();
    Note(now);
    std::lock_guard lk(mu_);
    open_.insert(now);
    return now;
  }
  void WriterClosed(int64_t token) {
    {
      std::lock_guard lk(mu_);
      if (auto it = open_.find(token); it != open_.end()) open_.erase(it);
    }
    Touch();
  }

  // Should the drain wait? Busy now, and this busy stretch began less than
  // `hold` ago.
  bool HoldDrain() const {
    if (hold_ns_ == 0) return false;
    int64_t now = MonoNs();
    return BusyAt(now) && now - stretch_ns_.load(std::memory_order_relaxed) < hold_ns_;
  }
  std::chrono::milliseconds hold() const { return std::chrono::milliseconds(hold_ns_ / 1000000); }

 private:
  bool BusyAt(int64_t now) const {
    if (now - last_ns_.load(std::memory_order_relaxed) < quiet_ns_) return true;
    std::lock_guard lk(mu_);
    return !open_.empty() && now - *open_.rbegin() < hold_ns_;  // the newest writer still open
  }
  void Note(int64_t now) {
    if (!BusyAt(now)) stretch_ns_.store(now, std::memory_order_relaxed);
    last_ns_.store(now, std::memory_order_relaxed);
  }
  static int64_t MonoNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
  }
  static constexpr int64_t kLongAgo = INT64_MIN / 2;
  int64_t hold_ns_ = 0;
  int64_t quiet_ns_ = kQuiet.count() * 1000000;
  std::atomic<int64_t> last_ns_{kLongAgo};
  std::atomic<int64_t> stretch_ns_{kLongAgo};  // when the busy stretch began
  mutable std::mutex mu_;
  std::multiset<int64_t> open_;  // when each writer still open was opened
};

}  // namespace ckpt::fs
