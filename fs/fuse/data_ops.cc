// data_ops.cc — the FUSE callbacks of the data path: open and create
// (passthrough or through the daemon), read, write_buf, flush, release,
// fsync and fallocate. See fuse_ops.cc's file comment for the measured
// choices (direct_io for write-only handles, splicing, readahead).
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "fs/fuse/ops.h"

namespace ckpt::fs::ops {

namespace {

// Opens the tier file and fills the handle. Returns 0 or an errno.
// `created`: by ckpt_create (InodeTable::OpenHandle).
int OpenFile(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, bool created = false) {
  Daemon* d = D(req);
  auto r = d->table->OpenHandle(ino, fi->flags, created);
  if (!r) return r.error();
  auto* h = new FileHandle{ino, r->fd};
  h->flags = fi->flags;
  h->open_gen = r->gen;
  fi->fh = reinterpret_cast<uint64_t>(h);
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    h->writer = true;
    h->writer_token = d->table->core().saves.WriterOpened();
  }
  // A reader's close has nothing to seal or record (Flush acts for the
  // last writer only): FOPEN_NOFLUSH spares close(2) a synchronous round
  // trip. Release, which the kernel sends without waiting, still comes.
  // Allowed with passthrough; locks are the kernel's (no lock handlers).
  if ((fi->flags & O_ACCMODE) == O_RDONLY) fi->noflush = 1;
  if (r->backing_id > 0) {
    // Reads, writes and mmap go from the kernel to the tier file; the
    // reply is marked on its way out (fs/fuse/channel.h). The kernel takes
    // no other open flag with passthrough but direct_io and noflush.
    h->passthrough = true;
    h->backing_id = r->backing_id;
    return 0;
  }
  // All changes come through this mount, so cached pages stay valid; but
  // for bytes the shared namespace replaced with another node's copy.
  fi->keep_cache = d->table->shared_ns().TakeBackendChanged(ino) ? 0 : 1;
  // Write-only handles (torch.save, cp) bypass the page cache: one copy
  // fewer on the trainer's path and no second copy of every checkpoint in
  // RAM. The kernel still invalidates cached pages of the range written, so
  // readers stay coherent, and mmap needs a readable handle anyway. What it
  // gives up: a reader right after the save is served by the daemon, not
  // from pages the write left behind.
  if ((fi->flags & O_ACCMODE) == O_WRONLY) fi->direct_io = 1;
  return 0;
}

// Sends the reply to an open or create (`send`), marked for passthrough on
// its way out when the handle is one; undoes the open if the kernel no
// longer waits. The mark is dropped whatever happens, so no later reply
// with the same handle value can carry this inode's backing id.
template <class Send>
void ReplyOpened(fuse_req_t req, fuse_file_info* fi, Send&& send) {
  // Everything is read before the reply: once it is sent, req is freed
  // and the kernel may release (delete) the handle on another thread.
  Daemon* d = D(req);
  auto* h = reinterpret_cast<FileHandle*>(fi->fh);
  const uint64_t fh = fi->fh, ino = h->ino;
  const bool pt = h->passthrough;
  const int flags = fi->flags;
  const uint64_t token = pt ? d->channel->Expect(fh, h->backing_id) : 0;
  int rc = send();
  if (pt) d->channel->Forget(fh, token);
  if (rc == -ENOENT) {  // interrupted: the kernel never saw the handle; undo
    d->table->Release(ino, flags, pt);
    if (h->writer) d->table->core().saves.WriterClosed(h->writer_token);
    delete h;
  }
}

// Opens and replies.
void OpenAndReply(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int e = OpenFile(req, ino, fi);
  if (e) return (void)fuse_reply_err(req, e);
  ReplyOpened(req, fi, [&] { return fuse_reply_open(req, fi); });
}

}  // namespace

void ckpt_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  LOG_DEBUG("open(ino={}, flags={:#x})", ino, fi->flags);
  Guard(req, [&] {
    Daemon* d = D(req);
    // An evicted file is fetched from the backend first, and in the
    // shared namespace a clean file is compared with the backend's copy
    // once per TTL: on a fetcher thread, which replies, never on this
    // FUSE worker.
    if (d->fetcher && (d->table->NeedsFetch(ino, fi->flags) || d->table->shared_ns().RevalidateDue(ino, fi->flags))) {
      fuse_file_info copy = *fi;  // *fi lives only as long as this call
      auto job = [req, ino, copy](bool cancelled) mutable {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          D(req)->table->shared_ns().RevalidateForOpen(ino, copy.flags);
          OpenAndReply(req, ino, &copy);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    d->table->shared_ns().RevalidateForOpen(ino, fi->flags);  // only without a fetcher: nothing when not due
    OpenAndReply(req, ino, fi);
  });
}

void ckpt_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  LOG_DEBUG("create(parent={}, name={}, mode={:o}, flags={:#x})", parent, name, mode, fi->flags);
  Guard(req, [&] {
    Daemon* d = D(req);
    auto r = d->table->Mknod(parent, name, S_IFREG | (mode & 07777), 0, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    int e = OpenFile(req, r->ino, fi, /*created=*/true);
    if (e) {
      d->table->Forget(r->ino, 1);
      return (void)fuse_reply_err(req, e);
    }
    fuse_entry_param ep{};
    ep.ino = r->ino;
    ep.generation = 1;
    ep.attr_timeout = d->attr_timeout;
    ep.entry_timeout = d->entry_timeout;
    d->table->FillStat(*r, &ep.attr);
    FAILPOINT("meta.after_commit");
    ReplyOpened(req, fi, [&] { return fuse_reply_create(req, &ep, fi); });
  });
}

void ckpt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  LOG_DEBUG("read(ino={}, off={}, size={})", ino, off, size);
  Guard(req, [&] {
    // The inode's current tier file, not the one it had at open: a writer
    // that truncated it since moved the old bytes to a snapshot for the
    // drain. The reference keeps the descriptor open while the reply is
    // spliced.
    auto ref = D(req)->table->core().tier()->Ref(ino);
    if (!ref) return (void)fuse_reply_err(req, ref.error() == ENOENT ? EIO : ref.error());
    D(req)->bytes_read += size;
    if (size <= g_splice_max) {
      fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
      buf.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      buf.buf[0].fd = (*ref)->fd;
      buf.buf[0].pos = off;
      return (void)fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
    }
    // Too large to splice: copy through this thread's buffer, allocated once.
    thread_local std::vector<char> tb;
    if (tb.size() < size) tb.assign(size, 0);
    size_t got = 0;
    while (got < size) {
      ssize_t n = pread((*ref)->fd, tb.data() + got, size - got, off + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        LOG_ERROR("ino {}: read of {} bytes at {} from the tier failed: {}", ino, size, off, strerror(e));
        return (void)fuse_reply_err(req, e);
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    fuse_reply_buf(req, tb.data(), got);
  });
}

namespace {

// Replies to a write (from a worker or from the space waiter).
void FinishWrite(fuse_req_t req, fuse_ino_t ino, size_t len, off_t off, const Result<size_t>& n) {
  if (!n) {
    // ENOSPC: the tier has said why, once.
    if (n.error() != ENOSPC && n.error() != EFBIG && n.error() != EROFS)
      LOG_ERROR("ino {}: write of {} bytes at {} failed: {}", ino, len, off, strerror(n.error()));
    return (void)fuse_reply_err(req, n.error());
  }
  D(req)->bytes_written += *n;
  fuse_reply_write(req, *n);
}

// The bytes of a write request, copied out of libfuse's buffer (which the
// worker reuses once the callback returns) so that another thread can
// write them. Replies with the error and returns null if the copy fails.
// fuse_buf_copy advances `in` past what it copied (a pipe's bytes are
// gone from it too): from then on the request's bytes are only here.
std::shared_ptr<const std::vector<char>> CopyRequest(fuse_req_t req, fuse_bufvec* in) {
  size_t len = fuse_buf_size(in);
  auto data = std::make_shared<std::vector<char>>(len);
  fuse_bufvec mem = FUSE_BUFVEC_INIT(len);
  mem.buf[0].mem = data->data();
  ssize_t got = fuse_buf_copy(&mem, in, static_cast<fuse_buf_copy_flags>(0));
  if (got < 0 || static_cast<size_t>(got) != len) {
    fuse_reply_err(req, got < 0 ? static_cast<int>(-got) : EIO);
    return nullptr;
  }
  return data;
}

// Writes a copied request's bytes at `off` (Tier::Write's `fn`).
ssize_t WriteCopy(int fd, const std::vector<char>& data, off_t off) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t w = pwrite(fd, data.data() + done, data.size() - done, off + static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    done += static_cast<size_t>(w);
  }
  return static_cast<ssize_t>(done);
}

// A write the tier has no room for yet, or one that must first copy a
// sealed version aside: its bytes, copied out of the request (CopyRequest),
// go into a job that `waiter` runs (the space waiter once there is room;
// the copier), which replies. The job waits for space until `deadline`
// (the request's arrival plus the tier's wait limit), however long it sat
// in the queue first. False if `waiter` refused the job (its queue
// still full after `wait_for_room`): the caller still holds `data` and
// must write from it (the request's buffer is spent).
bool QueueWrite(fuse_req_t req, fuse_ino_t ino, std::shared_ptr<const std::vector<char>> data, off_t off,
                OffloadQueue* waiter, std::chrono::milliseconds wait_for_room, cache::Deadline deadline) {
  const size_t len = data->size();
  auto job = [req, ino, off, data, deadline](bool cancelled) {
    Daemon* d = D(req);
    if (cancelled) return (void)fuse_reply_err(req, EIO);
    Guard(req, [&] {
      auto n = d->table->Write(
          ino, static_cast<uint64_t>(off), data->size(), [&](int fd) { return WriteCopy(fd, *data, off); },
          /*wait=*/true, deadline);
      FinishWrite(req, ino, data->size(), off, n);
    });
  };
  return waiter->Submit(std::move(job), len, wait_for_room);
}

// A write that found the space waiter's queue full for OffloadQueue::kRoomWait
// and the tier still without room: ENOSPC, said in the log at most every 10 s.
Result<size_t> QueueFull(fuse_ino_t ino, size_t len, off_t off) {
  static std::atomic<int64_t> last_said{INT64_MIN / 2};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t last = last_said.load();
  if (now - last >= 10 && last_said.compare_exchange_strong(last, now))
    LOG_WARN(
        "ino {}: write of {} bytes at {} fails with ENOSPC: the queue of writes waiting for space is full "
        "({} ms waited for room; the drain does not free the tier as fast as writers fill it)",
        ino, len, off, OffloadQueue::kRoomWait.count());
  return std::unexpected(ENOSPC);
}

}  // namespace

void ckpt_write_buf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  LOG_DEBUG("write_buf(ino={}, off={}, size={})", ino, off, fuse_buf_size(in));
  NoteSave(req);
  Guard(req, [&] {
    Daemon* d = D(req);
    // A write queued for space behind others waits one wait limit from
    // now, not from when its turn comes.
    const cache::Deadline deadline = std::chrono::steady_clock::now() + d->tier->wait_limit();
    auto* h = reinterpret_cast<FileHandle*>(fi->fh);
    h->wrote = true;
    size_t len = fuse_buf_size(in);
    // Once a job was offered the request's bytes, they are in `data`, and
    // every later try writes from there: the request's buffer is spent.
    std::shared_ptr<const std::vector<char>> data;
    auto queue = [&](OffloadQueue* waiter, std::chrono::milliseconds wait_for_room) {
      if (!data && !(data = CopyRequest(req, in))) return true;  // replied
      return QueueWrite(req, ino, data, off, waiter, wait_for_room, deadline);
    };
    // Waits for space on the space waiter's thread, not this worker; a
    // full queue holds this worker for kRoomWait at most.
    bool can_queue = d->space_waiter != nullptr, refused = false;
    auto to_space_waiter = [&] {
      if (queue(d->space_waiter.get(), OffloadQueue::kRoomWait)) return true;
      refused = true;
      return false;
    };
    // Writers already waiting for space go first: queue behind them.
    if (can_queue && d->space_waiter->Busy() && to_space_waiter()) return;
    // Copying a version aside takes seconds for GiBs: not on a request
    // thread, whose other requests the kernel may have handed it already
    // (fs/fuse/fuse_uring.h; a lookup waited 0.8–6 s behind a 2 GiB copy).
    if (d->copier && d->table->ChangeCopiesAside(ino) && queue(d->copier.get(), {})) return;
    auto write_in = [&](int fd) -> ssize_t {
      if (data) return WriteCopy(fd, *data, off);
      fuse_bufvec dst = FUSE_BUFVEC_INIT(len);
      dst.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
      dst.buf[0].fd = fd;
      dst.buf[0].pos = off;
      return fuse_buf_copy(&dst, in, FUSE_BUF_SPLICE_NONBLOCK);
    };
    auto n = d->table->Write(ino, static_cast<uint64_t>(off), len, write_in, /*wait=*/!can_queue, deadline);
    if (!n && n.error() == EAGAIN && !refused) {  // EAGAIN only with a space waiter (wait=false)
      if (to_space_waiter()) return;
      n = d->table->Write(ino, static_cast<uint64_t>(off), len, write_in, /*wait=*/false);  // room meanwhile?
    }
    if (!n && n.error() == EAGAIN) n = QueueFull(ino, len, off);
    FinishWrite(req, ino, len, off, n);
  });
}

void ckpt_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  LOG_DEBUG("flush(ino={})", ino);
  NoteSave(req);
  Guard(req, [&] {
    // fuse_flush_in has no open flags (libfuse hands over 0, O_RDONLY):
    // the handle's own say whether this close is a writer's.
    const auto* h = reinterpret_cast<FileHandle*>(fi->fh);
    auto r = D(req)->table->Flush(ino, h->flags, h->open_gen);
    if (r) FAILPOINT("meta.after_commit");  // close(2) waits for this reply, not for release's
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

void ckpt_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  LOG_DEBUG("release(ino={})", ino);
  std::unique_ptr<FileHandle> h(reinterpret_cast<FileHandle*>(fi->fh));
  if (h->writer) D(req)->table->core().saves.WriterClosed(h->writer_token);
  Guard(req, [&] {
    D(req)->table->Release(ino, fi->flags, h->passthrough);
    if (h->passthrough && (fi->flags & O_ACCMODE) != O_RDONLY) D(req)->table->RelieveOverBudget();
    // The close sealed a new version (one WriteBatch); the kernel has not heard back.
    if (h->wrote) FAILPOINT("meta.after_commit");
    fuse_reply_err(req, 0);
  });
}

void ckpt_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi) {
  LOG_DEBUG("fsync(ino={})", ino);
  NoteSave(req);
  // --fsync=memory: seal the bytes written so far as a version (they then
  // survive a daemon crash, and drain); returns at memory speed.
  // --fsync=backend: also wait until that version and everything logged
  // before it is persisted — answered by the drain thread that applies it,
  // not waited for here, so a slow backend never holds a FUSE worker.
  Guard(req, [&] {
    Daemon* d = D(req);
    const bool writer = (reinterpret_cast<FileHandle*>(fi->fh)->flags & O_ACCMODE) != O_RDONLY;
    auto seq = d->table->SyncSeal(ino, d->cfg.fsync == FsyncMode::kBackend, writer);
    if (!seq) return (void)fuse_reply_err(req, seq.error());
    if (d->cfg.fsync != FsyncMode::kBackend) return (void)fuse_reply_err(req, 0);
    d->table->WhenApplied(*seq, ino, [req](int err) { fuse_reply_err(req, err); });
  });
}

void ckpt_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info* fi) {
  LOG_DEBUG("fallocate(ino={}, mode={}, off={}, len={})", ino, mode, off, len);
  NoteSave(req);
  Guard(req, [&] {
    if (off < 0 || len <= 0) return (void)fuse_reply_err(req, EINVAL);
    Daemon* d = D(req);
    reinterpret_cast<FileHandle*>(fi->fh)->wrote = true;
    auto uoff = static_cast<uint64_t>(off), ulen = static_cast<uint64_t>(len);
    // As for a write: one wait limit from the request's arrival.
    const cache::Deadline deadline = std::chrono::steady_clock::now() + d->tier->wait_limit();
    bool can_queue = d->space_waiter != nullptr;
    auto r = d->table->Fallocate(ino, mode, uoff, ulen, /*wait=*/!can_queue, deadline);
    if (!r && r.error() == EAGAIN) {
      // No room yet: wait on the space waiter's thread, not this worker.
      auto job = [req, ino, mode, uoff, ulen, deadline](bool cancelled) {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          auto st = D(req)->table->Fallocate(ino, mode, uoff, ulen, /*wait=*/true, deadline);
          fuse_reply_err(req, st ? 0 : st.error());
        });
      };
      if (d->space_waiter->Submit(std::move(job), 0)) return;
      r = d->table->Fallocate(ino, mode, uoff, ulen, /*wait=*/true, deadline);
    }
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

}  // namespace ckpt::fs::ops
