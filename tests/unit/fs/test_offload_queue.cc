// test_offload_queue.cc — the queue where writes wait for tier space: its
// bound, and how long a caller waits for room in it.
#include <criterion/criterion.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "fs/fuse/offload_queue.h"

using ckpt::fs::OffloadQueue;
using namespace std::chrono_literals;

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// A full queue refuses a job after waiting for room at most as long as
// asked, and takes it as soon as a job ahead of it ends. A job alone in
// the queue fits whatever its size; one without bytes always fits.
Test(space_waiter, full_queue_waits_for_room_a_bounded_time) {
  OffloadQueue w(1, 100);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto held = [&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
    ran++;
  };
  cr_assert(w.Submit(held, 150), "a job alone in the queue fits, however large");
  cr_assert(w.Busy());
  auto start = std::chrono::steady_clock::now();
  cr_assert(!w.Submit([&](bool) { ran++; }, 10, 300ms), "the queue is full");
  double waited = SecondsSince(start);
  cr_assert(waited >= 0.25 && waited < 3, "waited %.2f s for room", waited);
  cr_assert(w.Submit([&](bool) { ran++; }, 0), "a job with no bytes always fits");
  std::thread t([&] {
    std::this_thread::sleep_for(200ms);
    release = true;
  });
  start = std::chrono::steady_clock::now();
  cr_assert(w.Submit([&](bool) { ran++; }, 10, 10s), "room once the job ahead ended");
  waited = SecondsSince(start);
  cr_assert(waited < 5, "waited %.2f s: not woken when room came", waited);
  t.join();
  w.Stop();
  cr_assert_eq(ran.load(), 3);
}

// Stop wakes a caller waiting for room: it is refused at once.
Test(space_waiter, stop_ends_a_wait_for_room, .timeout = 30) {
  OffloadQueue w(1, 100);
  std::atomic<bool> release{false};
  cr_assert(w.Submit([&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
  }, 100));
  std::atomic<bool> refused{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread t([&] { refused = !w.Submit([](bool) {}, 10, 60s); });
  std::this_thread::sleep_for(100ms);
  std::thread stopper([&] { w.Stop(); });
  t.join();        // woken by Stop, the job ahead still running
  release = true;  // it ends, so Stop can join
  stopper.join();
  cr_assert(refused.load());
  cr_assert(SecondsSince(start) < 10);
}
