// channel.cc — see channel.h. The kernel's ABI (include/uapi/linux/
// fuse.h of 6.9+) is spelled out here: Debian 12's headers predate it.
#include "fs/fuse/channel.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "fs/fuse/fuse_abi.h"

namespace ckpt::fs {
namespace {

constexpr uint32_t kOpOpen = 14, kOpInit = 26, kOpCreate = 35;
constexpr uint32_t kInitExt = 1u << 30;          // FUSE_INIT_EXT: flags2 is valid
constexpr uint32_t kWritebackCache = 1u << 16;   // FUSE_WRITEBACK_CACHE: excludes passthrough
constexpr uint32_t kPassthroughFlag2 = 1u << 5;  // FUSE_PASSTHROUGH (1ULL << 37), in flags2
constexpr uint32_t kFopenPassthrough = 1u << 7;  // FOPEN_PASSTHROUGH
constexpr uint32_t kMaxStackDepth = 1;           // the tier is on tmpfs (depth 0)
constexpr uint32_t kOverIoUringFlag2 = 1u << 9;  // FUSE_OVER_IO_URING (1ULL << 41), in flags2

using fuse_abi::InHeader;
using fuse_abi::OutHeader;

struct InitIn {
  uint32_t major, minor, max_readahead, flags, flags2;
};

struct InitOut {
  uint32_t major, minor, max_readahead, flags;
  uint16_t max_background, congestion_threshold;
  uint32_t max_write, time_gran;
  uint16_t max_pages, map_alignment;
  uint32_t flags2, max_stack_depth;
  uint16_t request_timeout, unused[11];
};
static_assert(sizeof(InitOut) == 64);

struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
static_assert(sizeof(OpenOut) == 16);

struct BackingMap {
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
constexpr unsigned long kIocBackingOpen = _IOW(229, 1, BackingMap);
constexpr unsigned long kIocBackingClose = _IOW(229, 2, uint32_t);

// libfuse hands its hooks the session's userdata (the Daemon), not ours:
// one session per process, so the instance is found here.
std::atomic<FuseChannel*> g_instance{nullptr};

}  // namespace

FuseChannel::FuseChannel(fuse_session* se, bool want, bool want_uring)
    : se_(se), want_(want), want_uring_(want_uring) {
  MutexLock lk(&mu_);
  why_ = want ? "not negotiated yet" : "off (-o passthrough=off)";
  uring_why_ = want_uring ? "not negotiated yet" : "off (-o io_uring=off)";
}

FuseChannel::~FuseChannel() { StopUring(); }

bool FuseChannel::UringOffered() const {
  MutexLock lk(&mu_);
  return want_uring_ && (init_flags2_ & kOverIoUringFlag2);
}

bool FuseChannel::uring_active() const {
  FuseUring* u = uring_ptr_.load(std::memory_order_acquire);
  return u && u->running();
}

std::string FuseChannel::uring_why() const {
  MutexLock lk(&mu_);
  return uring_active() ? std::string() : uring_why_;
}

uint64_t FuseChannel::uring_requests() const {
  FuseUring* u = uring_ptr_.load(std::memory_order_acquire);
  return u ? u->requests() : 0;
}

void FuseChannel::StopUringDispatch() {
  if (FuseUring* u = uring_ptr_.load(std::memory_order_acquire)) u->StopDispatch();
}

void FuseChannel::StopUring() {
  if (FuseUring* u = uring_ptr_.load(std::memory_order_acquire)) u->Stop();
}

void FuseChannel::StartUring() {
  size_t payload;
  {
    MutexLock lk(&mu_);
    payload = uring_payload_;
  }
  FuseUring::Options opt;
  opt.payload = payload;
  // Tests: fewer threads per queue make requests queue in the kernel
  // (tests/mount/cases/uring_queued_requests.sh).
  if (const char* v = getenv("CKPTFS_URING_THREADS")) opt.threads_per_queue = static_cast<unsigned>(atoi(v));
  uring_ = std::make_unique<FuseUring>(se_, fuse_session_fd(se_), opt,
                                       [this](const void* buf, size_t len) { SawRequest(buf, len); });
  // Published before the rings start: the first request can arrive through
  // them while Start() is still setting up the last ones, and its reply
  // must find its entry (written to /dev/fuse it would be lost, and the
  // caller would wait forever). It stays allocated even if Start fails.
  uring_ptr_.store(uring_.get(), std::memory_order_release);
  if (auto st = uring_->Start(); !st) {
    // Requests keep coming through /dev/fuse: the kernel uses the rings
    // only once every queue has an entry, and none got one.
    LOG_WARN("fuse: io_uring not used: {}", ErrStr(st.error()));
    MutexLock lk(&mu_);
    uring_why_ = "the kernel refused the rings: " + ErrStr(st.error());
  }
}

bool FuseChannel::Install() {
  fuse_custom_io io{};
  io.read = ReadHook;
  io.writev = WritevHook;
  io.splice_send = SpliceSendHook;
  g_instance.store(this);
  if (int rc = fuse_session_custom_io(se_, &io, fuse_session_fd(se_)); rc != 0) {
    g_instance.store(nullptr);
    TurnOff("libfuse refused custom I/O: " + ErrStr(-rc));
    return false;
  }
  return true;
}

std::string FuseChannel::why() const {
  MutexLock lk(&mu_);
  return active() ? std::string() : why_;
}

void FuseChannel::TurnOff(const std::string& why) {
  MutexLock lk(&mu_);
  if (active_.exchange(false)) LOG_WARN("passthrough off for the rest of this mount: {}", why);
  why_ = why;
}

ssize_t FuseChannel::ReadHook(int fd, void* buf, size_t len, void*) {
  ssize_t n = read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(InHeader)))
    if (FuseChannel* self = g_instance.load(std::memory_order_relaxed)) self->SawRequest(buf, static_cast<size_t>(n));
  return n;
}

ssize_t FuseChannel::WritevHook(int fd, struct iovec* iov, int count, void*) {
  FuseChannel* self = g_instance.load(std::memory_order_relaxed);
  if (!self || count < 1 || iov[0].iov_len < sizeof(OutHeader)) return writev(fd, iov, count);
  if (self->npending_.load(std::memory_order_acquire)) self->PatchReply(iov, count);
  ssize_t n;
  if (FuseUring* u = self->uring_ptr_.load(std::memory_order_acquire); u && u->Reply(iov, count, &n)) return n;
  n = writev(fd, iov, count);
  // The INIT reply is in: the kernel now takes the rings' registration.
  if (n >= 0 && self->uring_negotiated_.exchange(false)) self->StartUring();
  return n;
}

ssize_t FuseChannel::SpliceSendHook(int fdin, off_t* offin, int fdout, off_t* offout, size_t len, unsigned flags,
                                    void*) {
  return splice(fdin, offin, fdout, offout, len, flags);
}

void FuseChannel::SawRequest(const void* buf, size_t len) {
  InHeader h;
  memcpy(&h, buf, sizeof h);
  if (h.opcode != kOpOpen && h.opcode != kOpCreate && h.opcode != kOpInit) return;
  MutexLock lk(&mu_);
  if (h.opcode == kOpInit) {
    InitIn in{};
    memcpy(&in, static_cast<const char*>(buf) + sizeof h, std::min(sizeof in, len - sizeof h));
    init_flags2_ = (in.flags & kInitExt) ? in.flags2 : 0;
  } else if (!active()) {
    return;  // no open reply to patch
  }
  pending_[h.unique] = h.opcode;
  npending_.store(pending_.size(), std::memory_order_release);
}

void FuseChannel::PatchReply(struct iovec* iov, int count) {
  OutHeader h;
  memcpy(&h, iov[0].iov_base, sizeof h);
  MutexLock lk(&mu_);
  auto it = pending_.find(h.unique);
  if (it == pending_.end()) return;
  uint32_t opcode = it->second;
  pending_.erase(it);
  npending_.store(pending_.size(), std::memory_order_release);
  if (h.error != 0 || count < 2) return;
  struct iovec& body = iov[count - 1];
  if (opcode == kOpInit) {
    if (body.iov_len < sizeof(InitOut)) {
      why_ = "the kernel's protocol is too old";
      uring_why_ = why_;
      return;
    }
    auto* out = static_cast<InitOut*>(body.iov_base);
    if (want_uring_) {
      if (!(init_flags2_ & kOverIoUringFlag2)) {
        uring_why_ = FuseUring::Unavailable();
        if (uring_why_.empty()) uring_why_ = "the kernel does not offer FUSE_OVER_IO_URING";
      } else {
        out->flags |= kInitExt;
        out->flags2 |= kOverIoUringFlag2;
        // The kernel's largest request payload, which every entry must hold.
        uring_payload_ = std::max<size_t>({8192, out->max_write, size_t{out->max_pages} * 4096});
        // The rings are set up right after this reply (StartUring): until
        // they run, requests come through /dev/fuse and status says so.
        uring_why_ = "starting (the rings are set up after INIT)";
        uring_negotiated_.store(true, std::memory_order_release);
      }
    }
    if (!want_) return;
    if (!(init_flags2_ & kPassthroughFlag2)) {
      why_ = "the kernel does not offer FUSE_PASSTHROUGH (needs Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)";
      return;
    }
    if (out->flags & kWritebackCache) {
      why_ = "writeback_cache is on";
      return;
    }
    out->flags |= kInitExt;
    out->flags2 |= kPassthroughFlag2;
    out->max_stack_depth = kMaxStackDepth;
    active_.store(true, std::memory_order_release);
    why_.clear();
    LOG_INFO("fuse: passthrough negotiated (kernel protocol 7.{})", out->minor);
    return;
  }
  if (body.iov_len < sizeof(OpenOut)) return;
  auto* out = reinterpret_cast<OpenOut*>(static_cast<char*>(body.iov_base) + body.iov_len - sizeof(OpenOut));
  auto e = expected_.find(out->fh);
  if (e == expected_.end()) return;
  out->open_flags |= kFopenPassthrough;
  out->backing_id = e->second.backing_id;
  expected_.erase(e);
  opens_.fetch_add(1, std::memory_order_relaxed);
}

Result<int> FuseChannel::OpenBacking(int fd) {
  if (!active()) return Err(EOPNOTSUPP);
  BackingMap map{fd, 0, 0};
  int id = ioctl(fuse_session_fd(se_), kIocBackingOpen, &map);
  if (id > 0) return id;
  int e = id < 0 ? errno : EIO;
  if (e == EPERM || e == ENOTTY || e == EINVAL || e == EOPNOTSUPP)
    TurnOff(e == EPERM ? "registering a backing file needs CAP_SYS_ADMIN (mount as root)"
                       : "the kernel refused a backing file: " + ErrStr(e));
  else
    LOG_ERROR("fuse: cannot register a tier file for passthrough: {}", ErrStr(e));
  return Err(e);
}

void FuseChannel::CloseBacking(int id) {
  uint32_t v = static_cast<uint32_t>(id);
  if (id > 0 && ioctl(fuse_session_fd(se_), kIocBackingClose, &v) != 0)
    LOG_ERROR("fuse: closing backing id {} failed: {}", id, ErrStr(errno));
}

uint64_t FuseChannel::Expect(uint64_t fh, int backing_id) {
  MutexLock lk(&mu_);
  uint64_t token = next_token_++;
  expected_[fh] = Mark{backing_id, token};
  return token;
}

void FuseChannel::Forget(uint64_t fh, uint64_t token) {
  MutexLock lk(&mu_);
  if (auto it = expected_.find(fh); it != expected_.end() && it->second.token == token) expected_.erase(it);
}

}  // namespace ckpt::fs
