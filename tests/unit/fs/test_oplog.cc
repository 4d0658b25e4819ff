// test_oplog.cc — the ordered drain log on its own (fs/core/oplog.h): order,
// the outcome each waiter is told, holding at a refusal, the failed and lost
// records, and the path questions the shared namespace and the fetcher ask.
#include <criterion/criterion.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "fs/core/oplog.h"

using ckpt::fs::OpLog;
using ckpt::meta::Batch;
using ckpt::meta::LogEntry;
using ckpt::meta::LogOp;

namespace {

LogEntry Entry(LogOp op, std::string path, uint64_t ino = 0, std::string path2 = "") {
  LogEntry e;
  e.op = op;
  e.path = std::move(path);
  e.path2 = std::move(path2);
  e.ino = ino;
  e.version = 1;
  return e;
}

// Appends and publishes one entry, as InodeTable does around its commit.
LogEntry Log(OpLog* log, LogEntry e) {
  Batch b;
  std::vector<LogEntry> out;
  log->Append(&b, std::move(e), &out);
  cr_assert_eq(b.size(), 1u, "the entry goes into the caller's batch");
  LogEntry logged = out.at(0);
  log->Publish(std::move(out));
  return logged;
}

void Done(OpLog* log, const LogEntry& e, OpLog::Outcome o = OpLog::Outcome::kApplied, std::string_view why = "",
          bool heals = false) {
  OpLog::Due due;
  Batch b;
  auto c = log->Complete(e, o, why, &b, heals);
  log->Finish(std::move(c), &due);
}

// A waiter's answer, -1 until it comes.
struct Answer {
  std::atomic<int> err{-1};
  std::function<void(int)> fn() {
    return [this](int e) { err = e; };
  }
};

}  // namespace

Test(oplog, entries_come_out_in_the_order_they_were_given) {
  OpLog log;
  auto a = Log(&log, Entry(LogOp::kMkdir, "d"));
  auto b = Log(&log, Entry(LogOp::kPersist, "d/f", 5));
  cr_assert_lt(a.seq, b.seq);
  cr_assert_eq(log.LoggedSeq(), b.seq);
  auto p = log.Pending(10);
  cr_assert_eq(p.size(), 2u);
  cr_assert_eq(p[0].seq, a.seq);
  cr_assert(log.HeadWithFollowers(a.seq));
  cr_assert_not(log.HeadWithFollowers(b.seq));
  Done(&log, a);
  cr_assert_eq(log.AppliedSeq(), a.seq);
  cr_assert_eq(log.Pending(10).size(), 1u);
  cr_assert_eq(log.UnpersistedFiles(10).first, 1u);
  cr_assert_eq(log.UnpersistedFiles(10).second.at(0), "d/f");
}

Test(oplog, a_seq_whose_commit_failed_is_never_waited_for) {
  OpLog log;
  auto a = Log(&log, Entry(LogOp::kMkdir, "a"));
  Batch b;
  std::vector<LogEntry> out;
  log.Append(&b, Entry(LogOp::kMkdir, "b"), &out);  // its commit fails: never published
  cr_assert_eq(log.LoggedSeq(), a.seq, "a drain begun now waits for what is in the log");
  auto c = Log(&log, Entry(LogOp::kMkdir, "c"));
  cr_assert_eq(log.LoggedSeq(), c.seq);
  cr_assert_eq(log.Pending(10).size(), 2u);
}

Test(oplog, completing_out_of_order_aborts, .signal = SIGABRT) {
  OpLog log;
  Log(&log, Entry(LogOp::kMkdir, "a"));
  auto b = Log(&log, Entry(LogOp::kMkdir, "b"));
  Batch batch;
  (void)log.Complete(b, OpLog::Outcome::kApplied, "", &batch);  // not the head
}

Test(oplog, a_waiter_hears_a_failure_in_its_range_and_only_there) {
  OpLog log;
  auto shard = Log(&log, Entry(LogOp::kPersist, "step1/shard0.pt", 7));
  auto latest = Log(&log, Entry(LogOp::kPersist, "latest", 8));
  Answer covering;
  log.WhenApplied(latest.seq, covering.fn());
  cr_assert_eq(covering.err.load(), -1, "not answered before the entries are applied");
  Done(&log, shard, OpLog::Outcome::kFailed, "persist: Is a directory");
  cr_assert_eq(covering.err.load(), -1);
  Done(&log, latest);
  cr_assert_eq(covering.err.load(), EIO, "a refused shard before `latest` makes the wait fail");
  // A wait that begins after the failure is not answered with it.
  auto next = Log(&log, Entry(LogOp::kPersist, "step2/shard0.pt", 9));
  Answer later;
  log.WhenApplied(next.seq, later.fn());
  Done(&log, next);
  cr_assert_eq(later.err.load(), 0);
  cr_assert_eq(log.FailedEntries().size(), 1u);
  cr_assert_eq(log.FailedEntries().at(0).path, "step1/shard0.pt");
}

Test(oplog, a_loss_is_eio_and_listed_once) {
  OpLog log;
  auto e = Log(&log, Entry(LogOp::kPersist, "f", 3));
  Answer w;
  log.WhenApplied(e.seq, w.fn());
  Batch b;
  log.RecordLost(e, "its bytes are not in the memory tier", &b);
  cr_assert_eq(b.size(), 1u, "the loss is recorded in the caller's batch");
  Done(&log, e, OpLog::Outcome::kLost);
  cr_assert_eq(w.err.load(), EIO);
  cr_assert_eq(log.LostFiles().size(), 1u);
  cr_assert_eq(log.LostUnder(""), 0u, "an empty path names no directory");
  cr_assert_eq(log.LostUnder("f"), 1u);
}

Test(oplog, a_hold_answers_the_waiters_it_covers_at_once) {
  OpLog log;
  auto bad = Log(&log, Entry(LogOp::kPersist, "bad.pt", 4));
  auto good = Log(&log, Entry(LogOp::kPersist, "good.pt", 5));
  Answer before, after;
  log.WhenApplied(good.seq, before.fn());
  log.Hold(bad, "refused");
  cr_assert_eq(before.err.load(), EIO, "a waiter behind a held entry is not left waiting");
  log.WhenApplied(good.seq, after.fn());
  cr_assert_eq(after.err.load(), EIO, "nor is one that comes while it holds");
  auto h = log.Held();
  cr_assert(h.has_value());
  cr_assert_eq(h->path, "bad.pt");
  cr_assert_eq(h->behind, 1u);
  cr_assert(log.HoldsVersion(4, 1));
  cr_assert_eq(log.RequestSkip("good.pt").error(), ENOENT, "only the held entry can be skipped");
  cr_assert(log.RequestSkip("bad.pt").has_value());
  cr_assert(log.SkipRequested(bad.seq));
  Done(&log, bad, OpLog::Outcome::kFailed, "skipped by the operator");
  cr_assert_not(log.Held().has_value(), "the drain goes on once the held entry is failed");
  cr_assert_not(log.SkipRequested(bad.seq));
}

Test(oplog, a_persist_or_an_unlink_heals_the_failed_records_of_its_path) {
  OpLog log;
  auto a = Log(&log, Entry(LogOp::kPersist, "x.pt", 1));
  Done(&log, a, OpLog::Outcome::kFailed, "refused");
  auto again = Log(&log, Entry(LogOp::kPersist, "x.pt", 1));
  Done(&log, again, OpLog::Outcome::kApplied, "", /*heals=*/false);  // skipped as superseded: not in the backend
  cr_assert_eq(log.FailedEntries().size(), 1u);
  auto persisted = Log(&log, Entry(LogOp::kPersist, "x.pt", 1));
  Done(&log, persisted, OpLog::Outcome::kApplied, "", /*heals=*/true);
  cr_assert(log.FailedEntries().empty(), "in the backend now");
  auto b = Log(&log, Entry(LogOp::kPersist, "y.pt", 2));
  Done(&log, b, OpLog::Outcome::kFailed, "refused");
  auto gone = Log(&log, Entry(LogOp::kUnlink, "y.pt", 2));
  Done(&log, gone);
  cr_assert(log.FailedEntries().empty(), "removed from the mount: the backend agrees again");
}

Test(oplog, answers_run_without_the_lock_held) {
  OpLog log;
  auto e = Log(&log, Entry(LogOp::kPersist, "f", 1));
  std::atomic<uint64_t> seen{0};
  // A waiter that asks the log again from its callback would deadlock if
  // it ran under the log's lock.
  log.WhenApplied(e.seq, [&](int) { seen = log.Pending(10).size() + 100 + log.LoggedSeq(); });
  Done(&log, e);
  cr_assert_eq(seen.load(), 100 + e.seq);
  OpLog::Due due;
  log.WhenApplied(e.seq, [&](int err) { seen = 1000 + err; }, &due);
  cr_assert_eq(seen.load(), 100 + e.seq, "an answer known at once waits in the caller's Due");
}

Test(oplog, shutdown_answers_every_waiter_and_stops_the_waits) {
  OpLog log;
  auto e = Log(&log, Entry(LogOp::kPersist, "f", 1));
  Answer w;
  log.WhenApplied(e.seq, w.fn());
  std::thread t([&] { log.Shutdown(); });
  t.join();
  cr_assert_eq(w.err.load(), EIO);
  cr_assert_not(log.WaitForEntries(std::chrono::milliseconds(1)));
  cr_assert_eq(log.WaitApplied(e.seq), EIO);
  cr_assert_not(log.WaitAppliedBeyond(0, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
}

Test(oplog, wait_applied_beyond_wakes_at_the_next_completion) {
  OpLog log;
  auto e = Log(&log, Entry(LogOp::kMkdir, "d"));
  std::thread drain([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Done(&log, e);
  });
  cr_assert(log.WaitAppliedBeyond(0, std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  drain.join();
  cr_assert_not(log.WaitAppliedBeyond(e.seq, std::chrono::steady_clock::now() + std::chrono::milliseconds(10)),
                "a timeout is false");
}

Test(oplog, paths_the_pending_log_touches) {
  OpLog log;
  log.set_track_removals(true);
  Log(&log, Entry(LogOp::kRename, "a/old", 0, "b/new"));
  cr_assert(log.Touches("a"));
  cr_assert(log.Touches("b/new/x"));
  cr_assert_not(log.Touches("ab"));
  cr_assert(log.RemovalPending("a/old/f", 0), "a rename away removes the source");
  cr_assert_not(log.RemovalPending("b/new", 0));
  cr_assert_eq(log.PathBeforePending("b/new/f", 9).value_or("?"), "a/old/f", "undone, the rename gives the old path");
  auto rm = Log(&log, Entry(LogOp::kUnlink, "c"));
  cr_assert_not(log.PathBeforePending("c", 9).has_value(), "unknown: something else was there");
  const uint64_t asked_at = log.AppliedSeq();
  Done(&log, log.Pending(1).at(0));
  Done(&log, rm);
  cr_assert(log.RemovalPending("c", asked_at), "applied after the backend was asked: its answer may predate it");
  cr_assert_not(log.RemovalPending("c", rm.seq));
}

// The observer (the replicator) asks for an entry's time as soon as it
// sees it: the time is there (it found none once, and a dead writer's
// unlink was then ordered before the file it removes).
Test(oplog, an_observer_finds_the_times_of_what_it_is_shown) {
  OpLog log;
  size_t seen = 0, timed = 0;
  log.set_observer([&](const std::vector<LogEntry>& entries) {
    for (const LogEntry& e : entries) {
      seen++;
      timed += log.LoggedTimes(e.seq, e.seq).size();
    }
  });
  Batch b;
  std::vector<LogEntry> out;
  log.Append(&b, Entry(LogOp::kPersist, "f", 2), &out);
  log.Append(&b, Entry(LogOp::kUnlink, "f"), &out);
  log.Publish(std::move(out));
  cr_expect_eq(seen, 2u);
  cr_expect_eq(timed, 2u, "every entry shown has its time");
  auto t = log.LoggedTimes(1, 2);
  cr_assert_eq(t.size(), 2u);
  cr_expect_lt(t[0].second, t[1].second, "one batch: one µs apart at least");
}

Test(oplog, logged_times_never_go_back_and_leave_with_their_entries) {
  OpLog log;
  auto a = Log(&log, Entry(LogOp::kMkdir, "a"));
  auto b = Log(&log, Entry(LogOp::kMkdir, "b"));
  auto t = log.LoggedTimes(a.seq, b.seq);
  cr_assert_eq(t.size(), 2u);
  cr_assert_lt(t[0].second, t[1].second, "one µs at least between two entries");
  Done(&log, a);
  cr_assert_eq(log.LoggedTimes(a.seq, b.seq).size(), 1u);
}

Test(oplog, restore_continues_the_sequence) {
  OpLog log;
  std::vector<LogEntry> stored{Entry(LogOp::kMkdir, "d"), Entry(LogOp::kPersist, "d/f", 2)};
  stored[0].seq = 11;
  stored[1].seq = 12;
  log.Restore(10, stored);
  log.RestoreFailed(3, "old.pt", "refused");
  log.RestoreLost(5, "gone.pt");
  cr_assert_eq(log.AppliedSeq(), 10u);
  cr_assert_eq(log.LoggedSeq(), 12u);
  auto next = Log(&log, Entry(LogOp::kMkdir, "e"));
  cr_assert_eq(next.seq, 13u);
  cr_assert(log.Find(12).has_value());
  log.DropRecovered(12);
  cr_assert_not(log.Find(12).has_value());
  cr_assert_eq(log.FailedEntries().size(), 1u);
  cr_assert_eq(log.LostFiles().size(), 1u);
  cr_assert(log.HasPersist() == false);
  cr_assert_not(log.HasMoves());
}
