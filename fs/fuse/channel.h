// channel.h — our side of /dev/fuse: FuseChannel owns libfuse's custom I/O
// hooks, through which INIT is negotiated and replies are patched. Two
// kernel features that libfuse 3.14 has no API for go through it: FUSE
// passthrough (below) and FUSE over io_uring, which it starts right after
// the INIT reply that accepted it (fs/fuse/fuse_uring.h).
//
// FUSE passthrough (kernel 6.9+) on libfuse 3.14, which has
// no API for it: the kernel serves read, write and mmap of a passthrough
// handle straight from a backing file the daemon registered (here, the tier
// file), and the daemon sees none of that I/O.
//
// libfuse 3.14 lets a program replace the /dev/fuse reads and writes
// (fuse_session_custom_io); that is all this needs:
//   - INIT: the kernel offers FUSE_PASSTHROUGH; the reply is patched to take
//     it (flags2, max_stack_depth 1: the tier is on tmpfs, depth 0);
//   - OPEN and CREATE: the daemon registers the tier file
//     (FUSE_DEV_IOC_BACKING_OPEN) and the reply's fuse_open_out gets
//     FOPEN_PASSTHROUGH and the backing id. Which reply is an open's is known
//     from the request's `unique`, seen on the way in; the id comes from the
//     handle the reply carries (fh), looked up in a table the open fills.
// With libfuse 3.17+ this file would be fuse_passthrough_open() and
// conn->want_ext; nothing else in ckptfs depends on how it is done.
//
// The kernel's rules the callers must keep (fs/fuse/iomode.c): while an
// inode has a passthrough handle, every new handle of it must be passthrough
// with the same backing id (else the open fails with EIO), and a passthrough
// open fails while the inode has a page-cached handle. InodeTable::Open
// decides per inode with that in mind.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/result.h"
#include "fs/fuse/fuse_uring.h"
#include "fs/core/inode_table.h"

namespace ckpt::fs {

class FuseChannel : public BackingFiles {
 public:
  // `want` false (-o passthrough=off): the hooks still run, nothing is
  // negotiated. Install after fuse_session_mount, before the loop.
  FuseChannel(fuse_session* se, bool want, bool want_uring = false);
  ~FuseChannel();
  FuseChannel(const FuseChannel&) = delete;
  FuseChannel& operator=(const FuseChannel&) = delete;

  // Installs the custom I/O. False (and why() says so) if libfuse refused.
  bool Install();

  // Negotiated at INIT, and not given up since (a registration refused).
  bool active() const override { return active_.load(std::memory_order_acquire); }
  // Why passthrough is not in use ("" while it is).
  std::string why() const;

  // Registers `fd` as a backing file: the id, or an errno. EPERM (no
  // CAP_SYS_ADMIN) or ENOTTY/EINVAL (the kernel lacks it) turn passthrough
  // off for the rest of the mount, with one log line.
  [[nodiscard]] Result<int> OpenBacking(int fd) override;
  void CloseBacking(int id) override;

  // The reply to the open whose handle is `fh` must say passthrough with
  // `backing_id`. Call right before fuse_reply_open/create and Forget(fh)
  // right after, whatever it returned: a mark left behind would be given
  // to a later handle that reuses the value (another inode's bytes).
  // Returns a token for Forget, which drops the mark only if it is still
  // this one (the handle may be released, and its value reused by another
  // open, as soon as the reply is out).
  uint64_t Expect(uint64_t fh, int backing_id);
  void Forget(uint64_t fh, uint64_t token);

  // Counters for status.
  uint64_t opens() const { return opens_.load(std::memory_order_relaxed); }

  // FUSE over io_uring (fs/fuse/fuse_uring.h): the kernel offered it at INIT and
  // it was asked for (then libfuse must not splice replies: ckpt_init).
  bool UringOffered() const;
  // Requests come through the rings; why not ("" when they do).
  bool uring_active() const;
  std::string uring_why() const;
  uint64_t uring_requests() const;
  // The two steps of FuseUring's shutdown (fs/fuse/fuse_uring.h): when the
  // session loop has ended, the rings handle no more requests but still
  // carry replies; once every thread that replies has stopped, they go.
  void StopUringDispatch();
  void StopUring();

 private:
  static ssize_t ReadHook(int fd, void* buf, size_t len, void* self);
  static ssize_t WritevHook(int fd, struct iovec* iov, int count, void* self);
  static ssize_t SpliceSendHook(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned flags,
                                void* self);
  void SawRequest(const void* buf, size_t len);
  void PatchReply(struct iovec* iov, int count);
  void TurnOff(const std::string& why);
  void StartUring();

  fuse_session* const se_;
  const bool want_;
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> opens_{0};

  mutable Mutex mu_;
  std::string why_ GUARDED_BY(mu_);
  // unique of each OPEN/CREATE/INIT request not yet answered -> its opcode.
  std::unordered_map<uint64_t, uint32_t> pending_ GUARDED_BY(mu_);
  std::atomic<size_t> npending_{0};  // pending_.size(), read without mu_ on every reply
  struct Mark {
    int backing_id;
    uint64_t token;
  };
  std::unordered_map<uint64_t, Mark> expected_ GUARDED_BY(mu_);  // fh -> its mark
  uint64_t next_token_ GUARDED_BY(mu_) = 1;
  uint64_t init_flags2_ GUARDED_BY(mu_) = 0;                    // what the kernel offered at INIT
  const bool want_uring_;
  std::atomic<bool> uring_negotiated_{false};  // set in the INIT reply, started right after it
  size_t uring_payload_ GUARDED_BY(mu_) = 1 << 20;
  std::string uring_why_ GUARDED_BY(mu_);
  std::unique_ptr<FuseUring> uring_;  // set once, by the thread that wrote the INIT reply
  std::atomic<FuseUring*> uring_ptr_{nullptr};
};

}  // namespace ckpt::fs
