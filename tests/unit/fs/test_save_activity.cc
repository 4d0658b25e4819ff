// test_save_activity.cc — when the drain waits for a save (fs/core/save_activity.h):
// after a mutating request for `quiet`, while a writer opened within `hold`
// is open, and never longer than `hold` in one busy stretch.
#include <criterion/criterion.h>

#include <chrono>
#include <thread>

#include "fs/core/save_activity.h"

using ckpt::fs::SaveActivity;
using namespace std::chrono_literals;

namespace {
void Sleep(std::chrono::milliseconds ms) { std::this_thread::sleep_for(ms); }
}  // namespace

Test(save_activity, off_by_default_and_with_hold_0) {
  SaveActivity a;
  a.Touch();
  (void)a.WriterOpened();
  cr_assert_not(a.HoldDrain());
  a.set_hold(0ms);
  a.Touch();
  cr_assert_not(a.HoldDrain());
}

Test(save_activity, a_request_holds_for_the_quiet_time) {
  SaveActivity a;
  a.set_hold(5000ms, 300ms);
  cr_assert_not(a.HoldDrain(), "nothing happened yet");
  a.Touch();
  cr_assert(a.HoldDrain());
  Sleep(450ms);
  cr_assert_not(a.HoldDrain(), "quiet for longer than `quiet`");
}

// A passthrough writer sends nothing while it writes: an open writer holds
// the drain, but only for `hold` after its open (a log file kept open all
// day holds nothing).
Test(save_activity, an_open_writer_holds_until_hold_after_its_open) {
  SaveActivity a;
  a.set_hold(600ms, 100ms);
  int64_t log = a.WriterOpened();
  Sleep(250ms);
  cr_assert(a.HoldDrain(), "writer open, opened 250 ms ago");
  Sleep(500ms);
  cr_assert_not(a.HoldDrain(), "writer opened longer than `hold` ago");
  // A file written and closed beside the old writer: quiet is enough, the
  // old writer's open is long past.
  a.WriterClosed(a.WriterOpened());
  cr_assert(a.HoldDrain(), "the close is a request");
  Sleep(200ms);
  cr_assert_not(a.HoldDrain(), "the writer still open was opened long ago");
  a.WriterClosed(log);
  Sleep(200ms);
  cr_assert_not(a.HoldDrain(), "no writer open: quiet is enough");
}

// Requests that never pause hold the drain for `hold`, then no longer: the
// drain goes on beside a writer that never stops. A quiet moment ends the
// stretch, and the next request begins a new one.
Test(save_activity, one_busy_stretch_holds_at_most_hold) {
  SaveActivity a;
  a.set_hold(500ms, 200ms);
  auto start = std::chrono::steady_clock::now();
  bool released = false;
  while (std::chrono::steady_clock::now() - start < 1200ms) {
    a.Touch();
    auto t = std::chrono::steady_clock::now() - start;
    if (t < 400ms) cr_assert(a.HoldDrain(), "within hold of the stretch's start");
    if (t > 600ms && !a.HoldDrain()) released = true;
    if (t > 600ms) cr_assert_not(a.HoldDrain(), "past hold: the drain goes on");
    Sleep(20ms);
  }
  cr_assert(released);
  Sleep(300ms);  // quiet: the stretch ends
  a.Touch();
  cr_assert(a.HoldDrain(), "a new stretch holds again");
}
