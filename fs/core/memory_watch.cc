// memory_watch.cc — the headroom readers and the watch thread
// (fs/core/memory_watch.h).
#include "fs/core/memory_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/config.h"
#include "common/log.h"
#include "fs/core/residency.h"

namespace ckpt::fs {

namespace {

// The first line of a small file, or "" if it cannot be read.
std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A number from a file holding one ("max" or unreadable: nullopt-like 0,
// with *ok false).
uint64_t ReadNumber(const std::string& path, bool* ok) {
  std::string s = ReadLine(path);
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s.c_str(), &end, 10);
  *ok = !s.empty() && end && *end == '\0' && errno == 0;
  return *ok ? v : 0;
}

// A key's value in a memory.stat file ("key value" lines); 0 if absent.
uint64_t StatValue(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  unsigned long long v;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Bytes above which a cgroup limit means "no limit" (v1 writes a huge
// page-rounded number for unlimited).
constexpr uint64_t kNoLimit = 1ull << 60;

// This process's memory cgroup: its limit and headroom; false when it has
// no limit (or no cgroup is found).
bool CgroupLimit(uint64_t* limit, uint64_t* headroom, std::string* where) {
  bool v2 = false;
  std::string path = MemoryCgroupPath(ReadAll("/proc/self/cgroup"), &v2);
  if (path.empty() && !v2) return false;
  const std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + path;
  bool ok = false;
  uint64_t lim = ReadNumber(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), &ok);
  if (!ok || lim >= kNoLimit) return false;
  uint64_t usage = ReadNumber(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"), &ok);
  if (!ok) return false;
  std::string stat = ReadAll(dir + "/memory.stat");
  uint64_t cache = v2 ? StatValue(stat, "file") : StatValue(stat, "total_cache");
  uint64_t shmem = v2 ? StatValue(stat, "shmem") : StatValue(stat, "total_shmem");
  if (!v2 && cache == 0) {  // not hierarchical totals: this group's own
    cache = StatValue(stat, "cache");
    shmem = StatValue(stat, "shmem");
  }
  *limit = lim;
  *headroom = CgroupHeadroom(lim, usage, cache, shmem);
  *where = "cgroup " + (path.empty() ? std::string("/") : path);
  return true;
}

}  // namespace

uint64_t CgroupHeadroom(uint64_t limit, uint64_t usage, uint64_t cache, uint64_t shmem) {
  const uint64_t reclaimable = cache - std::min(cache, shmem);
  const uint64_t pinned = usage - std::min(usage, reclaimable);
  return limit - std::min(limit, pinned);
}

std::string MemoryCgroupPath(const std::string& text, bool* v2) {
  std::istringstream in(text);
  std::string line, unified;
  bool have_unified = false;
  while (std::getline(in, line)) {
    // hierarchy-ID:controller-list:path
    size_t a = line.find(':');
    size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::istringstream cs(ctl);
    std::string c;
    while (std::getline(cs, c, ','))
      if (c == "memory") {
        *v2 = false;
        return path == "/" ? "" : path;
      }
    if (line.rfind("0::", 0) == 0) {
      unified = path == "/" ? "" : path;
      have_unified = true;
    }
  }
  *v2 = have_unified;
  return unified;
}

Headroom ReadHeadroom() {
  Headroom h;
  if (uint64_t avail = MemAvailable(); avail > 0) {
    h.available = avail;
    h.where = "MemAvailable";
    h.known = true;
  }
  uint64_t limit = 0, cg = 0;
  std::string where;
  if (CgroupLimit(&limit, &cg, &where) && (!h.known || cg < h.available)) {
    h.available = cg;
    h.where = where;
    h.known = true;
  }
  return h;
}

uint64_t DefaultMinFree() {
  uint64_t base = PhysicalMemory();
  uint64_t limit = 0, cg = 0;
  std::string where;
  if (CgroupLimit(&limit, &cg, &where)) base = std::min(base, limit);
  return std::clamp<uint64_t>(base / 25, 64ull << 20, 2ull << 30);
}

void MemoryWatch::Start() {
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { Run(); });
}

void MemoryWatch::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof one);
  thread_.join();
  close(stop_fd_);
  stop_fd_ = -1;
}

void MemoryWatch::Run() {
  // A PSI trigger wakes the watch when tasks stall on memory (100 ms in a
  // second); not every kernel accepts one (EINVAL here, EPERM for a user
  // without CAP_SYS_RESOURCE on older kernels): the 200 ms poll of the
  // headroom is the watch either way.
  int psi = open("/proc/pressure/memory", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (psi >= 0) {
    static const char kTrigger[] = "some 100000 1000000";
    if (write(psi, kTrigger, sizeof kTrigger) < 0) {
      LOG_DEBUG("memory watch: no PSI trigger ({}); polling every 200 ms", strerror(errno));
      close(psi);
      psi = -1;
    }
  }
  LOG_INFO("memory watch: --min-free {} bytes, {}", min_free_, psi >= 0 ? "PSI trigger armed" : "polling every 200 ms");
  while (!stop_) {
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {psi, POLLPRI, 0}};
    (void)poll(fds, psi >= 0 ? 2 : 1, 200);
    if (stop_) break;
    try {
      Headroom h = ReadHeadroom();
      LOG_DEBUG("memory watch: {} bytes available ({})", h.available, h.where);
      if (h.known) residency_->RelieveMemory(h.available, min_free_, h.where);
    } catch (const std::exception& e) {
      LOG_ERROR("internal error in the memory watch: {}", e.what());
    }
  }
  if (psi >= 0) close(psi);
}

}  // namespace ckpt::fs
