// mutex.h — std::mutex and std::shared_mutex with thread-safety annotations,
// their scoped locks, and a condition variable that waits on them.
//
// Why wrappers: Clang's -Wthread-safety (`make analyze`) checks GUARDED_BY
// and REQUIRES only against a type declared a CAPABILITY, and libstdc++'s
// std::mutex, std::lock_guard and std::unique_lock carry no annotations, so
// state guarded by a std::mutex cannot be checked at all. These classes add
// the annotations and nothing else: each is the std type inside, no
// slower. The shapes follow LevelDB's port::Mutex/MutexLock/CondVar and
// Abseil's absl::Mutex/MutexLock/CondVar.
//
//   ckpt::Mutex mu_;
//   int n_ GUARDED_BY(mu_) = 0;
//   ckpt::CondVar cv_;
//
//   void Put() EXCLUDES(mu_) {
//     ckpt::MutexLock lk(&mu_);
//     n_++;
//     cv_.NotifyAll();
//   }
//   void Take() EXCLUDES(mu_) {
//     ckpt::MutexLock lk(&mu_);
//     while (n_ == 0) cv_.Wait(&mu_);  // a loop, not a predicate: see CondVar
//     n_--;
//   }
//
// What it gives up: no predicate overloads of Wait (a lambda's body is
// analysed on its own, without the caller's locks, so reading guarded state
// in one is flagged); callers write the `while` loop. Mutex and SharedMutex
// still have lock()/unlock() (and the shared forms), so std::scoped_lock or
// std::condition_variable_any work with them, unchecked.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace ckpt {

// An exclusive lock: std::mutex, annotated. Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis the caller holds this mutex (not checked at run time:
  // std::mutex cannot tell). For a callback the analysis cannot follow.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope, like std::unique_lock: Unlock() and Lock()
// let go of it and take it again within the scope (to call out without
// it), and the destructor releases it only if held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() {
    if (locked_) mu_->unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->unlock();
    locked_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->lock();
    locked_ = true;
  }

 private:
  Mutex* const mu_;
  bool locked_ = true;
};

// A reader-writer lock: std::shared_mutex, annotated. Writers hold it
// exclusively (WriterLock), readers shared (SharedLock); a member
// GUARDED_BY it may be read under either, written only under the first.
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void lock_shared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool try_lock_shared() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }

  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() const ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for its scope.
class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~WriterLock() RELEASE() { mu_->unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for its scope.
class SCOPED_CAPABILITY SharedLock {
 public:
  explicit SharedLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->lock_shared(); }
  ~SharedLock() RELEASE() { mu_->unlock_shared(); }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// std::condition_variable for a ckpt::Mutex. Each wait requires the mutex
// held (the analysis checks it), releases it while blocked and holds it
// again on return, as std::condition_variable::wait does; wake-ups may be
// spurious, so wait in a loop on the condition. Notify with or without the
// mutex held.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu->mu_, std::adopt_lock);
    cv_.wait(lk);
    lk.release();  // still held: the caller's lock owns it
  }
  // Waits at most `d`. False if the time ran out, true if woken before.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> d) REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu->mu_, std::adopt_lock);
    std::cv_status s = cv_.wait_for(lk, d);
    lk.release();
    return s == std::cv_status::no_timeout;
  }
  // Waits until `t` at most. False if the time ran out, true if woken before.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> t) REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu->mu_, std::adopt_lock);
    std::cv_status s = cv_.wait_until(lk, t);
    lk.release();
    return s == std::cv_status::no_timeout;
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ckpt
