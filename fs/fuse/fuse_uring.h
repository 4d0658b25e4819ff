// fuse_uring.h — FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING, the
// fuse module's enable_uring=Y) on libfuse 3.14, which has no API for it.
//
// Why: on /dev/fuse every request wakes a daemon thread that may sleep on
// another CPU and every reply wakes the caller back; on the 2-vCPU machines
// here each of those wake-ups is an inter-processor interrupt, and a
// checkpoint of 96 small files pays six synchronous round trips per file
// (LOOKUP, CREATE, GETXATTR, FSYNC, FLUSH, the parent's GETATTR). Over
// io_uring the kernel queues a request on the queue of the CPU the caller
// runs on, and the daemon threads of that queue run on that CPU: the caller
// goes to sleep and the daemon runs where it was, without an interrupt, and
// the reply and the next fetch are one system call.
//
// How, on libfuse 3.14: after the INIT reply (negotiated in channel.cc's
// hook, flag FUSE_OVER_IO_URING), every CPU's queue gets a few threads
// pinned to that CPU, each with its own ring and entries (a 288-byte header
// and a payload buffer of the connection's max request size; Options says
// how many). A request that
// arrives in an entry is laid out as /dev/fuse would have delivered it
// (header, per-op header and payload are contiguous: the payload buffer has
// room before it) and handed to fuse_session_process_buf(), so every handler
// runs unchanged. Its reply comes back through the session's custom writev
// (FuseChannel::WritevHook), which hands it here: it is copied into the
// entry and committed with FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which also
// re-arms the entry. Only the ring's own thread touches its submission
// queue: a reply from another thread (a fetcher, the space waiter, an fsync
// answered by the drain) is queued and the thread woken through an eventfd.
// FORGET and INTERRUPT still come through /dev/fuse (the kernel sends them
// there), so libfuse's loop keeps running beside the rings.
//
// Shutdown comes in two steps, because requests answered later (writes
// waiting for space, opens waiting for a fetch, fsyncs waiting for the
// drain) are answered by other threads while the daemon stops them:
// StopDispatch() when the session loop has ended (no request is handled any
// more, replies still go out), Stop() once every thread that replies has
// stopped. Stop() used to come first and free the rings those threads then
// replied into: a use after free at every stop with requests queued. A
// reply that still comes after Stop() goes nowhere (the kernel answers its
// caller when the connection ends).
//
// Thread-safety: Reply() may be called from any thread; Start(),
// StopDispatch() and Stop() from one.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "fs/fuse/reply_yield.h"

namespace ckpt::fs {

class FuseUring {
 public:
  struct Options {
    // Threads per CPU queue; 0: from the number of CPUs (Start). A thread
    // runs one handler at a time and a request the kernel put in another
    // of its entries waits for it: so several threads serve a queue.
    unsigned threads_per_queue = 0;
    // Entries per CPU queue, shared among its threads; 0: from the number
    // of CPUs (Start: 256 up to 4 CPUs, at least 32). An entry whose reply
    // comes later (a fetch, an fsync waiting for the backend, a write
    // waiting for space) is held by the kernel until then, so these bound
    // how many such requests one CPU's callers can have waiting before
    // their other requests wait too. All are registered at Start, none
    // later: the kernel hands a request it queued while every entry was
    // taken only to an entry that is committed, never to one registered
    // after it (fs/fuse/dev_uring.c: fuse_uring_do_register makes the
    // entry available and looks at no queue), and with every entry of the
    // queue then held by requests answered later, it waited for as long as
    // they did — an `ls` behind writes waiting for a paused drain.
    unsigned entries_per_queue = 0;
    size_t payload = 1 << 20;  // >= the kernel's max request payload
  };
  // `saw_request` sees every request before it is dispatched (the
  // passthrough shim notes OPEN and CREATE there).
  FuseUring(fuse_session* se, int fuse_fd, Options opt, std::function<void(const void*, size_t)> saw_request);
  ~FuseUring();
  FuseUring(const FuseUring&) = delete;
  FuseUring& operator=(const FuseUring&) = delete;

  // Creates the rings, registers every entry of every CPU's queue and
  // starts the threads. After the INIT reply, never before (the kernel
  // refuses registration until then).
  Status Start();
  // Handles no more requests (after the session loop ended, as /dev/fuse
  // is not read any more either): one the kernel puts in an entry from now
  // on stays there until the connection ends. Returns once no ring thread
  // is in a handler, as libfuse's loop returns once its workers are out of
  // theirs. Replies still go out.
  void StopDispatch();
  // Stops the threads and frees the rings. Call it once every thread that
  // may reply has stopped; a reply that comes later anyway is dropped
  // (Reply returns true), and one under way is waited for.
  void Stop();
  bool running() const { return running_.load(std::memory_order_acquire); }

  // A reply written by libfuse (`iov`, as for writev). True if it answers
  // a request that came through a ring: then it is committed there, and
  // `*written` is its length.
  bool Reply(const struct iovec* iov, int count, ssize_t* written);

  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  unsigned queues() const { return nqueues_; }

  // Why io_uring cannot be used on this machine ("" if it can): the kernel
  // lacks it, or the fuse module's enable_uring is off.
  static std::string Unavailable();
  // Turns the fuse module's enable_uring on if it is off (root only). It
  // only lets FUSE servers ask for io_uring at INIT; a server that does not
  // ask is served as before. Before the mount: the kernel offers it then.
  // Returns Unavailable() after the attempt.
  static std::string Enable();

 private:
  struct Ring;
  struct Entry;
  void Loop(Ring* r);
  void Dispatch(Ring* r, Entry* e);
  void PrepCommit(Ring* r, Entry* e);
  Status AddEntry(Ring* r);
  Status Setup(Ring* r, unsigned entries);
  void NoteTaken(Ring* r);  // an armed entry of r's queue took a request
  bool PrepFetch(Ring* r, Entry* e, uint32_t cmd, uint64_t commit_id);

  fuse_session* const se_;
  const int fuse_fd_;
  const Options opt_;
  const std::function<void(const void*, size_t)> saw_request_;
  unsigned nqueues_ = 0;
  unsigned threads_per_queue_ = 0;
  unsigned entries_per_thread_ = 0;
  std::unique_ptr<std::atomic<int>[]> queue_armed_;       // per queue: entries waiting for a request
  std::unique_ptr<std::atomic<int64_t>[]> queue_warned_;  // per queue: when NoteTaken last warned
  std::vector<std::unique_ptr<reply_yield::Group>> groups_;  // one per queue, outliving its threads
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<std::thread> threads_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> requests_{0};

  Mutex mu_;
  std::unordered_map<uint64_t, Entry*> inflight_ GUARDED_BY(mu_);  // request unique -> its entry
  size_t setups_done_ GUARDED_BY(mu_) = 0;                         // threads past Setup
  CondVar setup_cv_;
  bool dispatching_ GUARDED_BY(mu_) = true;  // until StopDispatch()
  int handling_ GUARDED_BY(mu_) = 0;         // ring threads dispatching requests
  CondVar handled_cv_;                       // handling_ fell to 0 after StopDispatch()
  // Set by Stop() before it frees the rings: Reply() then drops its reply.
  bool stopped_ GUARDED_BY(mu_) = false;
  // Replies copying into an entry or handing it to its ring (without mu_):
  // Stop() waits for them to end before freeing the rings.
  int replying_ GUARDED_BY(mu_) = 0;
  CondVar replied_cv_;
};

}  // namespace ckpt::fs
