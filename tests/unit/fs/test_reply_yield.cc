// test_reply_yield.cc — a Group member runs at SCHED_IDLE while a
// reply_yield::Scope lives and at SCHED_OTHER again after it; a thread that
// is no member, or one past kMaxMembers, never yields; the watch puts back
// a member left at SCHED_IDLE for over kStuckNs (a thread preempted there
// would wait behind whatever keeps its CPU busy), and sleeps while nothing
// yields; off by option; where the process may not leave SCHED_IDLE (no
// CAP_SYS_NICE), Setup says so and stays off (fs/fuse/reply_yield.h), and the
// tests that need it on are skipped.
#include <criterion/criterion.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fs/fuse/reply_yield.h"

namespace ry = ckpt::fs::reply_yield;
using Clock = std::chrono::steady_clock;

namespace {

// Setup(true); where this user may not leave SCHED_IDLE, Setup must say so,
// and the test is skipped (counted: it fails the run unless
// tests/unit/expected_skips.txt lists it for that machine).
void OnOrSkip() {
  const bool on = ry::Setup(true);
  if (!on && geteuid() != 0) {
    const std::string why = ry::WhyNot();
    cr_assert(why.find("SCHED_IDLE") != std::string::npos, "why: %s", why.c_str());
    cr_skip_test("not root, and this user may not leave SCHED_IDLE: %s", why.c_str());
  }
  const std::string why = ry::WhyNot();
  cr_assert(on, "root may leave SCHED_IDLE, yet: %s", why.c_str());
  cr_assert(why.empty(), "why: %s", why.c_str());
}

// A member enters a Scope and keeps running inside it until the watch has
// put it back to SCHED_OTHER (or `limit` passed). Returns whether it was.
bool PutBackInside(ry::Group& g, std::chrono::milliseconds limit) {
  bool back = false;
  std::thread([&] {
    ry::Group::Member m(g);
    ry::Scope s;
    cr_assert_eq(sched_getscheduler(0), SCHED_IDLE);
    const auto end = Clock::now() + limit;
    while (!back && Clock::now() < end) back = sched_getscheduler(0) == SCHED_OTHER;
  }).join();
  return back;
}

}  // namespace

Test(reply_yield, off_by_option) {
  cr_assert(!ry::Setup(false));
  cr_assert(!ry::On());
  const std::string why = ry::WhyNot();
  cr_assert_str_eq(why.c_str(), "off (-o reply_yield=off)");
  ry::Group g;
  int inside = -1;
  std::thread([&] {
    ry::Group::Member m(g);
    ry::Scope s;
    inside = sched_getscheduler(0);
  }).join();
  cr_assert_eq(inside, SCHED_OTHER, "a Scope changed the policy while off");
}

Test(reply_yield, a_member_idles_in_a_scope_and_comes_back) {
  OnOrSkip();
  ry::Group g;
  int inside = -1, after = -1, stranger = -1;
  std::thread([&] {
    ry::Group::Member m(g);
    {
      ry::Scope s;
      inside = sched_getscheduler(0);
    }
    after = sched_getscheduler(0);
  }).join();
  cr_assert_eq(inside, SCHED_IDLE);
  cr_assert_eq(after, SCHED_OTHER);
  // A thread of no group never yields: nothing would put it back.
  std::thread([&] {
    ry::Scope s;
    stranger = sched_getscheduler(0);
  }).join();
  cr_assert_eq(stranger, SCHED_OTHER);
  // Many members at once (up to kMaxMembers yield; the rest never do):
  // every thread comes back.
  int stuck = 0, idled = 0;
  std::mutex mu;
  std::vector<std::thread> ts;
  for (int t = 0; t < ry::Group::kMaxMembers + 4; t++)
    ts.emplace_back([&] {
      ry::Group::Member m(g);
      bool was_idle = false;
      for (int i = 0; i < 1000; i++) {
        ry::Scope s;
        was_idle |= sched_getscheduler(0) == SCHED_IDLE;
      }
      std::lock_guard lk(mu);
      stuck += sched_getscheduler(0) != SCHED_OTHER;
      idled += was_idle;
    });
  for (auto& t : ts) t.join();
  cr_assert_eq(stuck, 0, "%d threads left at SCHED_IDLE", stuck);
  // The first member above took a slot too: kMaxMembers - 1 of these.
  cr_assert_eq(idled, ry::Group::kMaxMembers - 1, "%d threads yielded", idled);
  cr_assert_eq(sched_getscheduler(0), SCHED_OTHER, "the probe changed the caller's policy");
}

Test(reply_yield, the_watch_puts_back_a_member_left_idle) {
  OnOrSkip();
  const uint64_t before = ry::Rescued();
  {
    ry::Group g;
    cr_assert(PutBackInside(g, std::chrono::seconds(5)), "still at SCHED_IDLE after 5 s in a Scope");
  }
  cr_assert_geq(ry::Rescued(), before + 1);
  // The watch stops with the last group and starts with the next one.
  {
    ry::Group g;
    cr_assert(PutBackInside(g, std::chrono::seconds(5)), "no watch after a group came and went");
  }
  cr_assert_geq(ry::Rescued(), before + 2);
}

Test(reply_yield, the_watch_sleeps_while_nothing_yields) {
  OnOrSkip();
  ry::Group g;
  std::thread([&] {
    ry::Group::Member m(g);
    for (int i = 0; i < 100; i++) ry::Scope s;
  }).join();
  // The timer armed by those scopes fires once or twice more, then is not
  // armed again.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t wakes = ry::WatchWakes();
  cr_assert_geq(wakes, 1, "the watch never woke after members yielded");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cr_assert_eq(ry::WatchWakes(), wakes, "the watch woke %llu times with nothing idle",
               static_cast<unsigned long long>(ry::WatchWakes() - wakes));
  cr_assert_eq(ry::Rescued(), 0, "short scopes were put back");
}
