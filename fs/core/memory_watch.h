// memory_watch.h — how much memory the machine (and this daemon's memory
// cgroup) has left, and the thread that gives tier memory back before the
// OOM killer has to choose.
//
// The tier is tmpfs: its pages are never reclaimed, and without swap every
// byte in it is a byte the trainer cannot have. The watch reads the
// headroom every 200 ms (and at once when a PSI memory trigger fires,
// where the kernel allows one): the smaller of MemAvailable and, under a
// memory cgroup limit (v1 or v2), the limit less what is charged and not
// reclaimable. Below --min-free it asks Residency::RelieveMemory to drop
// spares and evict persisted files, and holds new tier writes while dirty
// data alone is the problem (docs/operations.md, "Memory pressure").
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace ckpt::fs {

class Residency;

struct Headroom {
  uint64_t available = 0;  // bytes that can still be had without reclaiming the tier
  std::string where;       // "MemAvailable" or "cgroup <path>"
  bool known = false;
};

// A memory cgroup's headroom from its files' values: limit - (usage -
// reclaimable page cache), where page cache holding tmpfs (shmem) is not
// reclaimable without swap. 0 when over.
uint64_t CgroupHeadroom(uint64_t limit, uint64_t usage, uint64_t cache, uint64_t shmem);

// The memory cgroup this process is in, from /proc/self/cgroup's text:
// the v1 "memory" line's path, else the v2 "0::" path; "" if none.
// `v2` says which hierarchy it came from.
std::string MemoryCgroupPath(const std::string& proc_self_cgroup, bool* v2);

// The headroom now: the smaller of MemAvailable and this process's memory
// cgroup's (when it has a limit).
Headroom ReadHeadroom();

// The default --min-free: 4% of the smaller of RAM and the cgroup limit,
// at least 64 MiB and at most 2 GiB.
uint64_t DefaultMinFree();

class MemoryWatch {
 public:
  MemoryWatch(Residency* residency, uint64_t min_free) : residency_(residency), min_free_(min_free) {}
  ~MemoryWatch() { Stop(); }
  void Start();
  void Stop();

 private:
  void Run();
  Residency* const residency_;  // told how much memory is left
  const uint64_t min_free_;
  std::atomic<bool> stop_{false};
  int stop_fd_ = -1;  // eventfd: wakes Run at Stop
  std::thread thread_;
};

}  // namespace ckpt::fs
