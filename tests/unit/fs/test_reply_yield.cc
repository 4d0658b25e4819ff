// test_reply_yield.cc — a thread runs at SCHED_IDLE while a reply_yield::Scope
// lives and at SCHED_OTHER again after it (fs/reply_yield.h); off by option,
// and a Scope does nothing then; where the process may not leave SCHED_IDLE
// (no CAP_SYS_NICE), Setup says so and stays off.
#include <criterion/criterion.h>
#include <sched.h>
#include <unistd.h>

#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "fs/reply_yield.h"

namespace ry = ckpt::fs::reply_yield;

Test(reply_yield, off_by_option) {
  cr_assert(!ry::Setup(false));
  cr_assert(!ry::On());
  const std::string why = ry::WhyNot();
  cr_assert_str_eq(why.c_str(), "off (-o reply_yield=on turns it on)");
  const int before = sched_getscheduler(0);
  {
    ry::Scope s;
    cr_assert_eq(sched_getscheduler(0), before, "a Scope changed the policy while off");
  }
}

Test(reply_yield, a_scope_idles_the_thread_and_gives_it_back) {
  bool on = ry::Setup(true);
  if (geteuid() != 0 && !on) {
    // Unprivileged: the probe could not come back from SCHED_IDLE.
    const std::string why = ry::WhyNot();
    cr_assert(why.find("SCHED_IDLE") != std::string::npos, "why: %s", why.c_str());
    return;
  }
  const std::string why = ry::WhyNot();
  cr_assert(on, "root may leave SCHED_IDLE, yet: %s", why.c_str());
  cr_assert(ry::On());
  cr_assert(why.empty(), "why: %s", why.c_str());
  // On threads of their own: the test runner's thread keeps its policy.
  int inside = -1, after = -1;
  std::thread([&] {
    {
      ry::Scope s;
      inside = sched_getscheduler(0);
    }
    after = sched_getscheduler(0);
  }).join();
  cr_assert_eq(inside, SCHED_IDLE);
  cr_assert_eq(after, SCHED_OTHER);
  // Many scopes on many threads at once: every thread comes back.
  int stuck = 0;
  std::vector<std::thread> ts;
  std::mutex mu;
  for (int t = 0; t < 8; t++)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; i++) ry::Scope s;
      std::lock_guard lk(mu);
      stuck += sched_getscheduler(0) != SCHED_OTHER;
    });
  for (auto& t : ts) t.join();
  cr_assert_eq(stuck, 0, "%d threads left at SCHED_IDLE", stuck);
  cr_assert_eq(sched_getscheduler(0), SCHED_OTHER, "the probe changed the caller's policy");
  ry::Setup(false);
}
