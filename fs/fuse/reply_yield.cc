// reply_yield.cc — see reply_yield.h.
#include "fs/fuse/reply_yield.h"

#include <sched.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/result.h"

namespace ckpt::fs::reply_yield {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mu;  // g_why; the groups, and a member's exit against the watch
std::string g_why = "not set up";
std::atomic<uint64_t> g_rescued{0};
std::atomic<uint64_t> g_wakes{0};
thread_local Group::Slot* t_slot = nullptr;

bool SetPolicy(pid_t tid, int policy) {
  sched_param sp{};
  return sched_setscheduler(tid, policy, &sp) == 0;  // 0: this thread
}

int64_t Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A member found idle since `since` goes back to SCHED_OTHER, unless it
// came back on its own meanwhile (then `since` changed). It may be idle
// again by the time the call lands: one yield lost, nothing worse.
bool Rescue(Group::Slot& s, int64_t since) {
  if (!s.since.compare_exchange_strong(since, 0)) return false;
  const pid_t tid = s.tid.load();
  return tid != 0 && SetPolicy(tid, SCHED_OTHER);
}

}  // namespace

// Wakes kWatchNs after a member yields, while members yield, and hands
// back those idle for longer than kStuckNs. One for the process, running
// while a Group exists.
class Watch {
 public:
  static void Join(Group* g) {
    auto& w = Get();
    std::lock_guard life(w.life_mu_);
    bool first;
    {
      std::lock_guard lk(g_mu);
      w.groups_.push_back(g);
      first = w.groups_.size() == 1;
    }
    if (first) w.Start();
  }
  static void Leave(Group* g) {
    auto& w = Get();
    std::lock_guard life(w.life_mu_);
    bool last;
    {
      std::lock_guard lk(g_mu);
      std::erase(w.groups_, g);
      last = w.groups_.empty();
    }
    if (last) w.Stop();  // without g_mu: the watch takes it on each wake
  }
  // After a member went idle at `now`: the timer runs, if it does not yet.
  static void Arm(int64_t now) {
    auto& w = Get();
    const int64_t at = now + kWatchNs;
    int64_t none = 0;
    if (w.deadline_.load() != 0 || !w.deadline_.compare_exchange_strong(none, at)) return;
    itimerspec its{};
    its.it_value.tv_sec = at / 1'000'000'000;
    its.it_value.tv_nsec = at % 1'000'000'000;
    if (const int fd = w.fd_.load(); fd >= 0) (void)timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, nullptr);
  }

 private:
  static Watch& Get() {
    static Watch* w = new Watch;  // never destroyed: members may outlive static destructors
    return *w;
  }

  void Start() {
    const int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    if (fd < 0) {
      LOG_WARN("fuse: no timer to watch yielded threads ({}); replies yield without it", ErrStr(errno));
      return;
    }
    stop_.store(false);
    deadline_.store(0);
    fd_.store(fd);
    thread_ = std::thread([this, fd] { Loop(fd); });
  }

  void Stop() {
    const int fd = fd_.load();
    if (fd < 0) return;
    stop_.store(true);
    itimerspec its{};
    its.it_value.tv_nsec = 1;  // fire now
    (void)timerfd_settime(fd, 0, &its, nullptr);
    thread_.join();
    fd_.store(-1);
    close(fd);
  }

  void Loop(int fd) {
    for (;;) {
      uint64_t fired;
      if (read(fd, &fired, sizeof fired) < 0 && errno == EINTR) continue;
      if (stop_.load()) return;
      g_wakes.fetch_add(1, std::memory_order_relaxed);
      deadline_.store(0);
      const int64_t now = Now();
      bool more = false;
      {
        std::lock_guard lk(g_mu);
        for (Group* g : groups_)
          for (int i = 0, n = std::min(g->used_.load(), Group::kMaxMembers); i < n; i++) {
            Group::Slot& s = g->slots_[i];
            const int64_t since = s.since.load();
            if (since == 0) continue;
            if (now - since < kStuckNs) more = true;
            else if (Rescue(s, since)) g_rescued.fetch_add(1, std::memory_order_relaxed);
          }
      }
      if (more) Arm(now);
    }
  }

  std::mutex life_mu_;          // Start and Stop
  std::vector<Group*> groups_;  // guarded by g_mu
  std::atomic<int> fd_{-1};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> deadline_{0};  // when the timer fires; 0: not armed
  std::thread thread_;
};

bool Setup(bool want) {
  std::lock_guard lk(g_mu);
  if (!want) {
    g_on.store(false);
    g_why = "off (-o reply_yield=off)";
    return false;
  }
  // A thread of its own: if it cannot come back from SCHED_IDLE, it ends
  // there and nothing else is left idle.
  int err = 0;
  std::thread([&err] {
    if (!SetPolicy(0, SCHED_IDLE)) err = errno;
    else if (!SetPolicy(0, SCHED_OTHER)) err = errno;
  }).join();
  if (err) {
    g_on.store(false);
    g_why = err == EPERM ? "not permitted to leave SCHED_IDLE again (needs CAP_SYS_NICE)" : ErrStr(err);
    LOG_INFO("fuse: replies do not yield the CPU to their callers: {}", g_why);
    return false;
  }
  g_why.clear();
  g_on.store(true);
  return true;
}

bool On() { return g_on.load(std::memory_order_relaxed); }

std::string WhyNot() {
  std::lock_guard lk(g_mu);
  return g_on.load() ? std::string() : g_why;
}

uint64_t Rescued() { return g_rescued.load(std::memory_order_relaxed); }
uint64_t WatchWakes() { return g_wakes.load(std::memory_order_relaxed); }

Group::Group() { Watch::Join(this); }
Group::~Group() { Watch::Leave(this); }

Group::Member::Member(Group& g) {
  const int i = g.used_.fetch_add(1);
  if (i >= kMaxMembers) return;
  g.slots_[i].tid.store(gettid());
  t_slot = &g.slots_[i];
}

Group::Member::~Member() {
  if (!t_slot) return;
  std::lock_guard lk(g_mu);  // not while the watch hands this thread back
  t_slot->since.store(0);
  t_slot->tid.store(0);
  t_slot = nullptr;
}

Scope::Scope() {
  if (!t_slot || !On() || !SetPolicy(0, SCHED_IDLE)) return;
  slot_ = t_slot;
  const int64_t now = Now();
  slot_->since.store(now);
  Watch::Arm(now);
}

Scope::~Scope() {
  if (!slot_) return;
  slot_->since.store(0);
  if (SetPolicy(0, SCHED_OTHER)) return;
  // Probed at Setup, so not expected: stop yielding for good rather than
  // leave more threads at SCHED_IDLE (this one stays there).
  int err = errno;
  if (g_on.exchange(false)) {
    std::lock_guard lk(g_mu);
    g_why = "a thread could not leave SCHED_IDLE: " + ErrStr(err);
    LOG_ERROR("fuse: {}; replies no longer yield", g_why);
  }
}

}  // namespace ckpt::fs::reply_yield
