// thread_annotations.h — Clang's thread-safety attributes, as macros.
//
// They turn the lock comments ("GUARDED_BY(mu_)", "REQUIRES: mu_ held")
// into declarations clang++ -Wthread-safety checks at compile time
// (`make analyze`): reading a guarded member without its mutex, calling a
// REQUIRES function without it, or returning with it still held is then a
// compile error. The set and its spelling follow LevelDB's
// port/thread_annotations.h and Clang's ThreadSafetyAnalysis documentation.
// Under g++ (the normal build) every macro expands to nothing.
//
// The attributes only mean something on a type declared a CAPABILITY:
// libstdc++'s std::mutex carries none, so guard state with the wrappers in
// common/mutex.h (ckpt::Mutex, ckpt::SharedMutex), not std::mutex.
#pragma once

#if defined(__clang__)
#define CKPT_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define CKPT_THREAD_ANNOTATION_(x)
#endif

// A type that is a lock: CAPABILITY("mutex").
#define CAPABILITY(x) CKPT_THREAD_ANNOTATION_(capability(x))
// An RAII type that holds a capability for its scope (MutexLock).
#define SCOPED_CAPABILITY CKPT_THREAD_ANNOTATION_(scoped_lockable)

// A data member read or written only with the mutex held (reads: held at
// least shared).
#define GUARDED_BY(x) CKPT_THREAD_ANNOTATION_(guarded_by(x))
// A pointer member whose pointee is guarded (the pointer itself is not).
#define PT_GUARDED_BY(x) CKPT_THREAD_ANNOTATION_(pt_guarded_by(x))

// Lock order, checked only with -Wthread-safety-beta: this mutex is taken
// after / before the ones named.
#define ACQUIRED_AFTER(...) CKPT_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) CKPT_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))

// The caller must hold the capability (exclusively / at least shared).
#define REQUIRES(...) CKPT_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) CKPT_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))

// The function takes / gives back the capability (no argument on a member
// of the capability type itself: `this`).
#define ACQUIRE(...) CKPT_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) CKPT_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) CKPT_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) CKPT_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
// Takes it only if it returns the first argument (true for try_lock).
#define TRY_ACQUIRE(...) CKPT_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) CKPT_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))

// The caller must not hold it (the function takes it itself). Checked
// where the analysis knows the caller holds it.
#define EXCLUDES(...) CKPT_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// Tells the analysis the capability is held here (checked at run time, if
// at all, by the function itself).
#define ASSERT_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(assert_shared_capability(x))

// The function returns a reference to the capability named (an accessor).
#define RETURN_CAPABILITY(x) CKPT_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function: for locking the analysis cannot
// follow. Say why beside each use.
#define NO_THREAD_SAFETY_ANALYSIS CKPT_THREAD_ANNOTATION_(no_thread_safety_analysis)
