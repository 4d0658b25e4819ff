// posix_copy.cc — see posix_copy.h.
#include "backend/posix_copy.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string_view>

#include "common/failpoint.h"
#include "common/log.h"
#include "common/result.h"

namespace ckpt::backend::posix {
namespace {
// A switch in the daemon's environment: set, not empty and not "0".
bool EnvSwitch(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string_view(v) != "0";
}
}  // namespace

std::unique_ptr<Ring> MakeRing() {
  static const bool disabled = EnvSwitch("CKPTFS_BACKEND_NO_URING");
  static std::once_flag warned;
  if (disabled) {
    std::call_once(warned, [] { LOG_WARN("posix backend: io_uring disabled by CKPTFS_BACKEND_NO_URING"); });
    return nullptr;
  }
  auto ring = Ring::Create(kQueueDepth);
  if (!ring) {
    int e = ring.error();
    std::call_once(warned,
                   [e] { LOG_WARN("posix backend: io_uring unavailable ({}); copying with pread/pwrite", ErrStr(e)); });
    return nullptr;
  }
  return std::move(*ring);
}

Fd OpenDirect(int dir_fd, const char* name, uint64_t size) {
  static const bool disabled = EnvSwitch("CKPTFS_BACKEND_NO_DIRECT");
  static std::once_flag warned;
  if (size < kDirectMin) return Fd();
  if (disabled) {
    std::call_once(warned,
                   [] { LOG_WARN("posix backend: O_DIRECT drain writes disabled by CKPTFS_BACKEND_NO_DIRECT"); });
    return Fd();
  }
  return Fd(openat(dir_fd, name, O_WRONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC));
}

bool Extents::Next(uint64_t* off, uint64_t* len) {
  if (pos_ >= end_) {
    if (pos_ >= size_ || err_) return false;
    if (dense_) {
      end_ = size_;
    } else {
      off_t d = lseek(fd_, static_cast<off_t>(pos_), SEEK_DATA);
      if (d < 0) {
        if (errno == ENXIO) {  // nothing but a hole up to EOF
          pos_ = size_;
          return false;
        }
        if (errno != EINVAL && errno != EOPNOTSUPP) {
          err_ = errno;
          return false;
        }
        dense_ = true;
        end_ = size_;
      } else {
        if (static_cast<uint64_t>(d) >= size_) {
          pos_ = size_;
          return false;
        }
        off_t h = lseek(fd_, d, SEEK_HOLE);
        if (h < 0) {
          err_ = errno;
          return false;
        }
        pos_ = static_cast<uint64_t>(d);
        end_ = std::min(static_cast<uint64_t>(h), size_);
        if (end_ <= pos_) end_ = size_;  // a file that grew past `size` meanwhile
      }
    }
  }
  *off = pos_;
  *len = std::min(kChunkSize, end_ - pos_);
  pos_ += *len;
  return true;
}

int RingStage(Ring& ring, int in_fd, Extents& ext, StageTarget* out, const std::function<bool()>& cancelled,
              ContentHash* hash, bool* read_failed) {
  SlotQueue q(ring, out->fd, SlotQueue::Op::kWrite, kStageDepth, kChunkSize);
  if (!q.ok()) return ENOMEM;
  // Chunks queued, oldest first: (seq, end offset, written).
  struct Queued {
    uint64_t end;
    bool written;
  };
  std::deque<Queued> order;
  uint64_t next = 0, first_seq = 0, written_end = 0, synced = 0, since_sync = 0;
  uint64_t tail_off = 0, tail_len = 0;  // the unaligned end of the last extent, not yet queued
  bool more = true;
  int err = 0;
  auto aligned = [](uint64_t v) { return v % kDirectAlign == 0; };
  for (;;) {
    while (!err && more && q.inflight() < kStageDepth) {
      if (cancelled && cancelled()) {
        err = ECANCELED;
        break;
      }
      uint64_t off, len;
      if (tail_len) {
        off = tail_off, len = tail_len, tail_len = 0;
      } else if (!ext.Take(&off, &len, &more, &err, read_failed)) {
        break;
      } else if (out->direct_fd >= 0 && aligned(off) && len > kDirectAlign && !aligned(len)) {
        // An extent's end: its aligned part direct, the rest next time round.
        tail_len = len % kDirectAlign;
        len -= tail_len;
        tail_off = off + len;
      }
      auto i = static_cast<unsigned>(q.FreeSlot());  // one is free: fewer than kStageDepth in flight
      char* buf = q[i].buf;
      if (int e = PreadFull(in_fd, buf, len, off)) {
        *read_failed = true;
        err = e;
        break;
      }
      hash->Update(off, buf, len);
      order.push_back({off + len, false});
      bool direct = out->direct_fd >= 0 && aligned(off) && aligned(len);
      q.Start(i, next++, off, len, direct ? out->direct_fd : -1);
      // The first chunk is queued; the rest (and the fdatasync) are not done.
      if (next == 1) FAILPOINT("drain.mid_transfer");
    }
    if (auto st = q.Submit(); !st) return st.error();  // the owner tears the ring down
    if (q.inflight() == 0) break;
    auto done = q.Reap(/*retry=*/!err);
    if (!done) return done.error();
    SlotQueue::Slot& sl = q[done->slot];
    bool was_direct = out->direct_fd >= 0 && sl.fd == out->direct_fd;
    if ((done->err == EINVAL || done->err == EOPNOTSUPP) && was_direct && !err) {
      // The file system takes no direct writes (or not these): the rest of
      // this chunk, and every later one, through the page cache.
      out->direct_refused = true;
      out->direct_fd = -1;
      q.Resume(done->slot, out->fd);
      continue;
    }
    if (done->err) {
      if (!err) err = done->err;
    } else {
      if (was_direct) out->direct_bytes += sl.len;
      order[sl.seq - first_seq].written = true;
      if (!was_direct) since_sync += sl.len;
      while (!order.empty() && order.front().written) {
        written_end = order.front().end;
        order.pop_front();
        first_seq++;
      }
      if (since_sync >= kWritebackWindow && written_end > synced) {
        (void)sync_file_range(out->fd, static_cast<off_t>(synced), static_cast<off_t>(written_end - synced),
                              SYNC_FILE_RANGE_WRITE);
        synced = written_end;
        since_sync = 0;
      }
    }
    sl.busy = false;
  }
  return err;
}

}  // namespace ckpt::backend::posix
