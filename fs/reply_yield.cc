// reply_yield.cc — see reply_yield.h.
#include "fs/reply_yield.h"

#include <sched.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/result.h"

namespace ckpt::fs::reply_yield {
namespace {

std::atomic<bool> g_on{false};
std::mutex g_mu;
std::string g_why = "not set up";

bool SetPolicy(int policy) {
  sched_param sp{};
  return sched_setscheduler(0, policy, &sp) == 0;  // 0: this thread
}

}  // namespace

bool Setup(bool want) {
  std::lock_guard lk(g_mu);
  if (!want) {
    g_on.store(false);
    g_why = "off (-o reply_yield=on turns it on)";
    return false;
  }
  // A thread of its own: if it cannot come back from SCHED_IDLE, it ends
  // there and nothing else is left idle.
  int err = 0;
  std::thread([&err] {
    if (!SetPolicy(SCHED_IDLE)) err = errno;
    else if (!SetPolicy(SCHED_OTHER)) err = errno;
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

Scope::Scope() {
  if (On()) idle_ = SetPolicy(SCHED_IDLE);
}

Scope::~Scope() {
  if (!idle_ || SetPolicy(SCHED_OTHER)) return;
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
