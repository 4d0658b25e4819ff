// pipeline.h — the GPU path's engine: save device memory into a file on the
// mount through bounded pinned staging, and load it back.
//
// Save (the stall a trainer sees is Save's call, nothing more):
//   1. the caller's thread checks the tensors, builds the header
//      (container.h) and creates `<dir>/.<name>.ckptfs-<pid>-<n>` (O_TRUNC:
//      on ckptfs that open takes the passthrough path into pre-allocated
//      tier pages, docs/architecture.md);
//   2. the byte stream (header, then each tensor) is cut into chunks of one
//      staging buffer each; for chunk k the caller waits until buffer k % B
//      is free, enqueues its device-to-host copies on the copier's stream
//      and records buffer k's mark — it never waits for a copy here;
//   3. the engine's writer thread takes the chunks in order, waits for each
//      buffer's mark, pwrites it at its offset and frees the buffer;
//   4. Save returns once every copy has completed: the tensors may change
//      from then on. With a checkpoint larger than the staging (B buffers),
//      step 2 waits for the writer to free buffers, so the stall includes
//      writing all but the last B chunks: size CKPTFS_CUDA_PINNED to the
//      checkpoint for a stall of the copy alone (docs/gpu.md);
//   5. the writer closes the file (on ckptfs: the version is sealed and
//      queued for the drain) and renames it onto `path`, so a reader never
//      sees a partial container under the final name. Wait returns this
//      step's outcome; Cancel stops it and removes the temporary file.
// Load: the file's byte ranges for the wanted tensors are read chunk by
// chunk into the staging buffers (large chunks by several threads at once)
// while the previous chunk's host-to-device copies run.
//
// The staging buffers are allocated at the first operation and reused; one
// operation holds them at a time (a Save until its writer is done), so
// operations from several threads are served in turn.
//
// Errors: a positive errno, and a message naming the path and what is wrong
// in `why`. Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "gpu/container.h"
#include "gpu/copier.h"

namespace ckpt::gpu {

inline constexpr uint64_t kDefaultPinned = 512ull << 20;  // 2 x 256 MiB
inline constexpr int kDefaultBuffers = 2;

struct Options {
  uint64_t pinned_bytes = kDefaultPinned;  // all staging buffers together
  int buffers = kDefaultBuffers;
  int read_threads = 4;  // per chunk, for loads
  // Test knob (unit tests): the writer fails its pwrite of the chunk at this
  // file offset with this errno.
  uint64_t fail_write_at = UINT64_MAX;
  int fail_write_errno = 0;
  uint32_t write_delay_us = 0;  // the writer sleeps this long before each chunk
};

// Options from the environment: CKPTFS_CUDA_PINNED ("512M", "1G", or
// "BxSIZE" such as "4x128M": B buffers of SIZE; one SIZE is cut in 2),
// CKPTFS_CUDA_READ_THREADS (1..64). EINVAL with `why` for a bad value.
[[nodiscard]] Result<Options> OptionsFromEnv(std::string* why);

// One tensor's memory: a device (or, for the host copier, host) address.
struct Tensor {
  TensorSpec spec;  // name, dtype, shape, nbytes
  uint64_t ptr = 0;
};

class SaveJob;

class Engine {
 public:
  Engine(std::unique_ptr<Copier> copier, const Options& o);
  ~Engine();  // waits for the saves in flight
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Copier& copier() const { return *copier_; }
  const Options& options() const { return opts_; }

  // Starts a save; see the top of this file. On error nothing is left
  // behind (no temporary file) and no copy is still running.
  [[nodiscard]] Result<std::shared_ptr<SaveJob>> Save(const std::string& path, const std::vector<Tensor>& tensors,
                                                       const Metadata& meta, std::string* why);
  // The save's outcome, once its file is closed and renamed (or removed).
  // These three need only the job: they stay valid after the engine is
  // destroyed (which waits for every save first).
  [[nodiscard]] static Status Wait(SaveJob& job, std::string* why);
  // Asks the writer to stop; Wait then returns ECANCELED unless the file
  // was already in place. True if the save had not finished.
  static bool Cancel(SaveJob& job);
  // True once the save has finished, either way.
  static bool Done(SaveJob& job);

  // Loads the tensors from `path`: by name when every tensor names one,
  // else in the file's order (then the counts must agree). Sizes must match
  // exactly; EINVAL with `why` otherwise.
  [[nodiscard]] Status Load(const std::string& path, const std::vector<Tensor>& tensors, std::string* why);

  // The header of the container at `path` (needs no engine, nor a GPU).
  [[nodiscard]] static Result<Parsed> ReadHeader(const std::string& path, std::string* why);

 private:
  struct Chunk {
    std::shared_ptr<SaveJob> job;
    int buf = -1;       // -1: the job's last item (close and rename)
    uint64_t off = 0;   // file offset
    uint64_t len = 0;
  };

  // Takes the staging buffers for one operation (allocating them the first
  // time); Release gives them back.
  [[nodiscard]] Status Acquire(std::string* why) EXCLUDES(mu_);
  void Release() EXCLUDES(mu_);
  // Waits until the writer is done with staging buffer `b`.
  void WaitBuffer(int b) EXCLUDES(mu_);
  void Push(Chunk c) EXCLUDES(mu_);
  void WriterLoop() EXCLUDES(mu_);
  void Finish(SaveJob& job) EXCLUDES(mu_);
  // Reads [off, off + len) of `fd` into `dst`, several threads at once for
  // large ranges: 0 or an errno.
  int ParallelRead(int fd, char* dst, uint64_t len, uint64_t off);

  std::unique_ptr<Copier> copier_;
  const Options opts_;
  const uint64_t chunk_;  // bytes per staging buffer

  Mutex mu_;
  CondVar cv_;
  std::vector<char*> bufs_ GUARDED_BY(mu_);  // empty until the first operation
  bool held_ GUARDED_BY(mu_) = false;        // an operation holds the buffers
  std::vector<bool> busy_ GUARDED_BY(mu_);   // buffer handed to the writer
  std::deque<Chunk> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t seq_ GUARDED_BY(mu_) = 0;  // temporary file names
  std::thread writer_;                // last: starts once the rest exists
};

// A save in flight. Opaque to callers: Engine's methods take it.
class SaveJob {
 public:
  const std::string& path() const { return path_; }

 private:
  friend class Engine;
  std::string path_, tmp_;
  int fd_ = -1;
  std::atomic<bool> cancelled_{false};
  // Set by the writer (and, before the job reaches it, by Save): the first
  // error, with its message.
  Mutex mu_;
  CondVar cv_;
  int err_ GUARDED_BY(mu_) = 0;
  std::string why_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
  bool placed_ GUARDED_BY(mu_) = false;  // renamed onto path_

  void Fail(int e, std::string why) EXCLUDES(mu_);
  int Error() EXCLUDES(mu_);
};

}  // namespace ckpt::gpu
