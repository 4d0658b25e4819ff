// fuse_ops.cc — thin libfuse low-level callbacks (the ckpt_ prefix, like lo_
// in passthrough_hp.cc). Each resolves its request, calls InodeTable or the
// tier, and replies; no exception leaves a callback (bad_alloc -> ENOMEM).
//
// Data path: writes arrive through write_buf and are copied (or spliced, when
// libfuse received them into a pipe) straight into the inode's tier file;
// reads reply with an fd-backed buffer so the kernel can splice from the
// tier. Files use the kernel page cache (not direct_io) so MAP_SHARED mmap
// works, which numpy memmap and safetensors need on libfuse 3.14 — except
// handles opened write-only (torch.save), which get direct_io: the writer's
// pages go straight to the tier instead of through a page-cache copy first.
// Measured choices (docs/benchmarks.md): direct_io for O_WRONLY, no
// auto_inval_data, 4 MiB readahead, reads larger than a pipe can hold served
// from a per-thread buffer instead of libfuse's per-request allocation.
#include <fcntl.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <thread>
#include <vector>

#include "common/failpoint.h"
#include "common/log.h"
#include "common/mounts.h"
#include "common/text.h"
#include "fs/daemon.h"

namespace ckpt::fs {
namespace {

struct FileHandle {
  uint64_t ino;
  int fd;  // the tier file, owned by the tier while pinned
  bool wrote = false;
  bool passthrough = false;  // the kernel serves its I/O from the tier file
  bool writer = false;       // opened for writing: counted in Daemon::saves until released
  int64_t writer_token = 0;  // SaveActivity::WriterOpened's
  int backing_id = 0;        // with passthrough: the id the open reply carries
  int flags = 0;             // the open flags: FUSE flush carries none (libfuse passes 0)
  uint64_t open_gen = 0;     // the file's data generation once opened (InodeTable::Flush)
};

struct DirHandle {
  std::vector<DirEntry> entries;
};

Daemon* D(fuse_req_t req) { return static_cast<Daemon*>(fuse_req_userdata(req)); }

// A request that changes the namespace or a file's bytes: a save is under
// way, and the drain waits for a quiet moment (fs/core/save_activity.h).
void NoteSave(fuse_req_t req) { D(req)->saves.Touch(); }

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid};
}

void ReplyEntry(fuse_req_t req, const InodeRecord& r) {
  Daemon* d = D(req);
  fuse_entry_param e{};
  e.ino = r.ino;
  e.generation = 1;
  e.attr_timeout = d->attr_timeout;
  e.entry_timeout = d->entry_timeout;
  d->table->FillStat(r, &e.attr);
  fuse_reply_entry(req, &e);
}

void ReplyAttr(fuse_req_t req, const InodeRecord& r) {
  struct stat st;
  D(req)->table->FillStat(r, &st);
  fuse_reply_attr(req, &st, D(req)->attr_timeout);
}

// Every callback runs its body in Guard: no exception leaves a callback
// (libfuse is C); bad_alloc becomes ENOMEM, anything else EIO with a line.
// A body that throws has not replied yet: replying is always its last act.
// The faults fuse.throw and fuse.nomem (common/failpoint.h) throw at the
// top of every guarded callback, so a test can see the guard at work.
inline void MaybeThrowFault() {
  if (FAULT("fuse.throw")) throw std::runtime_error("fault fuse.throw");
  if (FAULT("fuse.nomem")) throw std::bad_alloc();
}

template <class F>
void Guard(fuse_req_t req, F&& f) {
  try {
    MaybeThrowFault();
    f();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (const std::exception& e) {
    LOG_ERROR("internal error: {}", e.what());
    fuse_reply_err(req, EIO);
  }
}

// The same for requests that take no reply (forget).
template <class F>
void GuardNoReply(fuse_req_t req, F&& f) {
  try {
    MaybeThrowFault();
    f();
  } catch (const std::exception& e) {
    LOG_ERROR("internal error in forget: {}", e.what());
  }
  fuse_reply_none(req);
}

// The largest read reply libfuse can splice: it needs a pipe of the reply
// plus two pages, and without CAP_SYS_RESOURCE a pipe grows only to
// fs.pipe-max-size (1 MiB by default). Larger replies fall back to a fresh
// malloc per request in libfuse, which costs more than the copy it saves.
size_t g_splice_max = 0;

size_t SpliceLimit(size_t want) {
  int p[2];
  if (pipe(p) != 0) return 0;
  size_t got = 0;
  for (size_t sz = want; sz >= (64u << 10) && got == 0; sz /= 2) {
    int r = fcntl(p[0], F_SETPIPE_SZ, static_cast<int>(sz));
    if (r > 0) got = static_cast<size_t>(r);
  }
  close(p[0]);
  close(p[1]);
  return got > 2 * 4096 ? got - 2 * 4096 : 0;
}

// Raises the mount's readahead to kReadaheadKb: with the kernel's 128 KiB,
// a sequential reader waits on one small READ after another; 4 MiB gives
// 1 MiB requests, several in flight (measured: 1 MiB and 16 MiB were both
// slower). Only root may write the bdi's sysfs file, and only after INIT
// (the INIT reply clamps it), so the first request after INIT does it.
constexpr int kReadaheadKb = 4096;
std::once_flag g_tune_once;

void TuneBdi(Daemon* d) {
  auto m = MountAt(d->cfg.mountpoint);  // the topmost mount there is ours
  if (!m) return;
  const std::string dev = std::to_string(major(m->devno)) + ":" + std::to_string(minor(m->devno));
  std::ofstream ra("/sys/class/bdi/" + dev + "/read_ahead_kb");
  ra << kReadaheadKb << std::flush;
  if (ra.good()) LOG_INFO("bdi {}: read_ahead_kb {}", dev, kReadaheadKb);
  else LOG_DEBUG("bdi {}: cannot raise read_ahead_kb (not root?)", dev);
}

void TuneOnce(fuse_req_t req) {
  std::call_once(g_tune_once, [&] {
    try {
      TuneBdi(D(req));
    } catch (const std::exception&) {
    }
  });
}

void ckpt_init(void* userdata, fuse_conn_info* conn) {
  // 1 MiB requests: libfuse 3.14's receive buffer tops out there.
  conn->max_write = 1 << 20;
  conn->max_readahead = conn->max_readahead;  // the daemon can only lower it; see TuneBdi
  // No FUSE_CAP_AUTO_INVAL_DATA: every change comes through this mount, so
  // the kernel already keeps cached pages right; with it, the first stat
  // after a write (new mtime) threw away the pages just written, and warm
  // reads went back through the daemon at a fifth of the speed.
  // No FUSE_CAP_SPLICE_READ: a 1 MiB write needs a pipe larger than
  // fs.pipe-max-size, and where it fit it measured no faster.
  unsigned want = FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_ATOMIC_O_TRUNC | FUSE_CAP_PARALLEL_DIROPS |
                  FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO | FUSE_CAP_ASYNC_READ;
  conn->want |= want & conn->capable;
  conn->want &= ~(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_AUTO_INVAL_DATA);
  // Over io_uring a reply is copied into the request's ring entry: never
  // spliced to /dev/fuse (fs/fuse/fuse_uring.h).
  if (static_cast<Daemon*>(userdata)->channel->UringOffered())
    conn->want &= ~(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
  g_splice_max = SpliceLimit(conn->max_write + 2 * 4096);
  LOG_INFO("fuse session ready: max_write {} want {:#x}, reads up to {} bytes spliced", conn->max_write, conn->want,
           g_splice_max);
}

void ckpt_destroy(void* userdata) {
  auto* d = static_cast<Daemon*>(userdata);
  try {
    d->table->PurgeOrphans();
  } catch (const std::exception& e) {
    LOG_ERROR("internal error purging orphans at unmount: {}", e.what());
  }
  LOG_INFO("fuse session ended");
}

void ckpt_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  LOG_DEBUG("lookup(parent={}, name={})", parent, name);
  TuneOnce(req);
  Guard(req, [&] {
    Daemon* d = D(req);
    // Shared namespace: a lookup that must ask the backend (a local miss,
    // or an entry not compared with it for a TTL) runs on a fetcher
    // thread, which replies; no FUSE worker waits on the backend.
    if (d->fetcher && d->table->LookupNeedsBackend(parent, name)) {
      auto job = [req, parent, n = std::string(name)](bool cancelled) {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          auto r = D(req)->table->LookupShared(parent, n);
          if (!r) return (void)fuse_reply_err(req, r.error());
          ReplyEntry(req, *r);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    auto r = d->table->shared() ? d->table->LookupShared(parent, name) : d->table->Lookup(parent, name);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyEntry(req, *r);
  });
}

void ckpt_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  GuardNoReply(req, [&] { D(req)->table->Forget(ino, nlookup); });
}

void ckpt_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  GuardNoReply(req, [&] {
    for (size_t i = 0; i < count; i++) D(req)->table->Forget(forgets[i].ino, forgets[i].nlookup);
  });
}

void ckpt_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  LOG_DEBUG("getattr(ino={})", ino);
  TuneOnce(req);
  Guard(req, [&] {
    auto r = D(req)->table->GetAttr(ino);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyAttr(req, *r);
  });
}

meta::Timespec ToTs(const struct timespec& t) {
  if (t.tv_nsec == UTIME_NOW) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return {now.tv_sec, static_cast<uint32_t>(now.tv_nsec)};
  }
  return {t.tv_sec, static_cast<uint32_t>(t.tv_nsec)};
}

void ckpt_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  LOG_DEBUG("setattr(ino={}, to_set={:#x})", ino, to_set);
  NoteSave(req);
  Guard(req, [&] {
    AttrChange c;
    if (to_set & FUSE_SET_ATTR_MODE) c.to_set |= kSetMode;
    if (to_set & FUSE_SET_ATTR_UID) c.to_set |= kSetUid;
    if (to_set & FUSE_SET_ATTR_GID) c.to_set |= kSetGid;
    if (to_set & FUSE_SET_ATTR_SIZE) c.to_set |= kSetSize;
    if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) c.to_set |= kSetAtime;
    if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) c.to_set |= kSetMtime;
    c.mode = attr->st_mode;
    c.uid = attr->st_uid;
    c.gid = attr->st_gid;
    c.size = static_cast<uint64_t>(attr->st_size);
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) c.atime = ToTs({0, UTIME_NOW});
    else if (to_set & FUSE_SET_ATTR_ATIME) c.atime = ToTs(attr->st_atim);
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) c.mtime = ToTs({0, UTIME_NOW});
    else if (to_set & FUSE_SET_ATTR_MTIME) c.mtime = ToTs(attr->st_mtim);
    auto r = D(req)->table->SetAttr(ino, c);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyAttr(req, *r);
  });
}

void ckpt_readlink(fuse_req_t req, fuse_ino_t ino) {
  LOG_DEBUG("readlink(ino={})", ino);
  Guard(req, [&] {
    auto r = D(req)->table->Readlink(ino);
    if (!r) return (void)fuse_reply_err(req, r.error());
    fuse_reply_readlink(req, r->c_str());
  });
}

void ckpt_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  LOG_DEBUG("mknod(parent={}, name={}, mode={:o})", parent, name, mode);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Mknod(parent, name, mode, rdev, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyEntry(req, *r);
  });
}

void ckpt_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  LOG_DEBUG("mkdir(parent={}, name={}, mode={:o})", parent, name, mode);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Mkdir(parent, name, mode, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyEntry(req, *r);
  });
}

void ckpt_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  LOG_DEBUG("symlink(parent={}, name={})", parent, name);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Symlink(parent, name, link, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyEntry(req, *r);
  });
}

void ckpt_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  LOG_DEBUG("link(ino={}, newparent={}, newname={})", ino, newparent, newname);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Link(ino, newparent, newname);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyEntry(req, *r);
  });
}

void ckpt_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  LOG_DEBUG("unlink(parent={}, name={})", parent, name);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Unlink(parent, name);
    if (r) FAILPOINT("meta.after_commit");
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

void ckpt_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  LOG_DEBUG("rmdir(parent={}, name={})", parent, name);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Rmdir(parent, name);
    if (r) FAILPOINT("meta.after_commit");
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

void ckpt_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
                 unsigned int flags) {
  LOG_DEBUG("rename(parent={}, name={}, newparent={}, newname={}, flags={})", parent, name, newparent, newname, flags);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Rename(parent, name, newparent, newname, flags);
    if (r) FAILPOINT("meta.after_commit");
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

// Opens the tier file and fills the handle. Returns 0 or an errno.
int OpenFile(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Daemon* d = D(req);
  auto r = d->table->OpenHandle(ino, fi->flags);
  if (!r) return r.error();
  auto* h = new FileHandle{ino, r->fd};
  h->flags = fi->flags;
  h->open_gen = r->gen;
  fi->fh = reinterpret_cast<uint64_t>(h);
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    h->writer = true;
    h->writer_token = d->saves.WriterOpened();
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
  fi->keep_cache = d->table->TakeBackendChanged(ino) ? 0 : 1;
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
    if (h->writer) d->saves.WriterClosed(h->writer_token);
    delete h;
  }
}

// Opens and replies.
void OpenAndReply(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int e = OpenFile(req, ino, fi);
  if (e) return (void)fuse_reply_err(req, e);
  ReplyOpened(req, fi, [&] { return fuse_reply_open(req, fi); });
}

void ckpt_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  LOG_DEBUG("open(ino={}, flags={:#x})", ino, fi->flags);
  Guard(req, [&] {
    Daemon* d = D(req);
    // An evicted file is fetched from the backend first, and in the
    // shared namespace a clean file is compared with the backend's copy
    // once per TTL: on a fetcher thread, which replies, never on this
    // FUSE worker.
    if (d->fetcher && (d->table->NeedsFetch(ino, fi->flags) || d->table->RevalidateDue(ino, fi->flags))) {
      fuse_file_info copy = *fi;  // *fi lives only as long as this call
      auto job = [req, ino, copy](bool cancelled) mutable {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          D(req)->table->RevalidateForOpen(ino, copy.flags);
          OpenAndReply(req, ino, &copy);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    d->table->RevalidateForOpen(ino, fi->flags);  // only without a fetcher: nothing when not due
    OpenAndReply(req, ino, fi);
  });
}

void ckpt_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  LOG_DEBUG("create(parent={}, name={}, mode={:o}, flags={:#x})", parent, name, mode, fi->flags);
  Guard(req, [&] {
    Daemon* d = D(req);
    auto r = d->table->Mknod(parent, name, S_IFREG | (mode & 07777), 0, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    int e = OpenFile(req, r->ino, fi);
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
    auto ref = D(req)->tier->Ref(ino);
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
// the copier), which replies. False if `waiter` refused the job (its queue
// still full after `wait_for_room`): the caller still holds `data` and
// must write from it (the request's buffer is spent).
bool QueueWrite(fuse_req_t req, fuse_ino_t ino, std::shared_ptr<const std::vector<char>> data, off_t off,
                OffloadQueue* waiter, std::chrono::milliseconds wait_for_room) {
  const size_t len = data->size();
  auto job = [req, ino, off, data](bool cancelled) {
    Daemon* d = D(req);
    if (cancelled) return (void)fuse_reply_err(req, EIO);
    Guard(req, [&] {
      auto n = d->table->Write(ino, static_cast<uint64_t>(off), data->size(),
                               [&](int fd) { return WriteCopy(fd, *data, off); });
      FinishWrite(req, ino, data->size(), off, n);
    });
  };
  return waiter->Submit(std::move(job), len, wait_for_room);
}

// A write that found the space waiter's queue full for OffloadQueue::kRoomWait
// and the tier still without room: ENOSPC, said in the log at most every 10 s.
Result<size_t> QueueFull(fuse_ino_t ino, size_t len, off_t off) {
  static std::atomic<int64_t> last_said{INT64_MIN / 2};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_said.load();
  if (now - last >= 10 && last_said.compare_exchange_strong(last, now))
    LOG_WARN("ino {}: write of {} bytes at {} fails with ENOSPC: the queue of writes waiting for space is full "
             "({} ms waited for room; the drain does not free the tier as fast as writers fill it)",
             ino, len, off, OffloadQueue::kRoomWait.count());
  return std::unexpected(ENOSPC);
}

void ckpt_write_buf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  LOG_DEBUG("write_buf(ino={}, off={}, size={})", ino, off, fuse_buf_size(in));
  NoteSave(req);
  Guard(req, [&] {
    Daemon* d = D(req);
    auto* h = reinterpret_cast<FileHandle*>(fi->fh);
    h->wrote = true;
    size_t len = fuse_buf_size(in);
    // Once a job was offered the request's bytes, they are in `data`, and
    // every later try writes from there: the request's buffer is spent.
    std::shared_ptr<const std::vector<char>> data;
    auto queue = [&](OffloadQueue* waiter, std::chrono::milliseconds wait_for_room) {
      if (!data && !(data = CopyRequest(req, in))) return true;  // replied
      return QueueWrite(req, ino, data, off, waiter, wait_for_room);
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
    auto n = d->table->Write(ino, static_cast<uint64_t>(off), len, write_in, /*wait=*/!can_queue);
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
  if (h->writer) D(req)->saves.WriterClosed(h->writer_token);
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
    auto seq = d->table->SyncSeal(ino, d->cfg.fsync == FsyncMode::kBackend);
    if (!seq) return (void)fuse_reply_err(req, seq.error());
    if (d->cfg.fsync != FsyncMode::kBackend) return (void)fuse_reply_err(req, 0);
    d->table->WhenApplied(*seq, ino, [req](int err) { fuse_reply_err(req, err); });
  });
}

// Snapshots the directory into a handle and replies to the opendir.
void OpenDirAndReply(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto r = D(req)->table->ListDir(ino);
  if (!r) return (void)fuse_reply_err(req, r.error());
  fi->fh = reinterpret_cast<uint64_t>(new DirHandle{std::move(*r)});
  fi->cache_readdir = 0;
  if (fuse_reply_open(req, fi) == -ENOENT) delete reinterpret_cast<DirHandle*>(fi->fh);
}

void ckpt_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  LOG_DEBUG("opendir(ino={})", ino);
  Guard(req, [&] {
    Daemon* d = D(req);
    // Shared namespace: the backend's listing is merged first, at most
    // once per TTL, on a fetcher thread (which replies).
    if (d->fetcher && d->table->MergeDue(ino)) {
      fuse_file_info copy = *fi;
      auto job = [req, ino, copy](bool cancelled) mutable {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          D(req)->table->MergeDir(ino);
          OpenDirAndReply(req, ino, &copy);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    d->table->MergeDir(ino);  // only without a fetcher: nothing when not due
    OpenDirAndReply(req, ino, fi);
  });
}

// Replies with entries from `off` on, as many as fit in `size`.
void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  auto* dh = reinterpret_cast<DirHandle*>(fi->fh);
  Daemon* d = D(req);
  if (off == 0) {  // rewinddir: take a fresh snapshot
    auto r = d->table->ListDir(ino);
    if (!r) return (void)fuse_reply_err(req, r.error());
    dh->entries = std::move(*r);
  }
  std::string buf(size, '\0');
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < dh->entries.size(); i++) {
    const DirEntry& e = dh->entries[i];
    size_t n;
    if (plus) {
      fuse_entry_param ep{};
      bool dot = e.name == "." || e.name == "..";
      if (!dot) {
        auto r = d->table->LookupForReaddir(e.ino);
        if (!r) continue;  // removed since the snapshot
        ep.ino = e.ino;
        ep.generation = 1;
        ep.attr_timeout = d->attr_timeout;
        ep.entry_timeout = d->entry_timeout;
        d->table->FillStat(*r, &ep.attr);
      } else {
        ep.attr.st_ino = e.ino;
        ep.attr.st_mode = S_IFDIR;
      }
      n = fuse_add_direntry_plus(req, buf.data() + used, size - used, e.name.c_str(), &ep, static_cast<off_t>(i + 1));
      if (n > size - used) {
        if (!dot) d->table->Forget(e.ino, 1);  // did not fit: the kernel never saw it
        break;
      }
    } else {
      struct stat st {};
      st.st_ino = e.ino;
      st.st_mode = e.mode;
      n = fuse_add_direntry(req, buf.data() + used, size - used, e.name.c_str(), &st, static_cast<off_t>(i + 1));
      if (n > size - used) break;
    }
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void ckpt_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  LOG_DEBUG("readdir(ino={}, off={})", ino, off);
  Guard(req, [&] { DoReaddir(req, ino, size, off, fi, false); });
}

void ckpt_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  LOG_DEBUG("readdirplus(ino={}, off={})", ino, off);
  Guard(req, [&] { DoReaddir(req, ino, size, off, fi, true); });
}

void ckpt_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  delete reinterpret_cast<DirHandle*>(fi->fh);  // cannot throw
  fuse_reply_err(req, 0);
}

// fsync of a directory: with --fsync=backend, waits (as a file's fsync
// does) until every change logged so far — the directory's own entries
// among them — is in the backend, and says EIO if one of them is not.
void ckpt_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi) {
  Daemon* d = D(req);
  if (d->cfg.fsync != FsyncMode::kBackend) return (void)fuse_reply_err(req, 0);
  d->table->WhenApplied(d->table->oplog().LoggedSeq(), 0, [req](int err) { fuse_reply_err(req, err); });
}

void ckpt_statfs(fuse_req_t req, fuse_ino_t ino) {
  TuneOnce(req);
  Guard(req, [&] {
    Daemon* d = D(req);
    cache::TierStats t = d->tier->Stats();
    NamespaceStats ns = d->table->ns().Stats();
    struct statvfs sv {};
    constexpr uint64_t kBlock = 4096;
    sv.f_bsize = kBlock;
    sv.f_frsize = kBlock;
    sv.f_blocks = t.budget / kBlock;
    // Pre-allocated spares are free space to a writer (the first pages
    // given back when one needs room): df shows what files hold.
    const uint64_t spares = std::min(d->tier->Spares().first, t.used);
    uint64_t used = std::min(t.used - spares, t.budget);
    sv.f_bfree = sv.f_bavail = (t.budget - used) / kBlock;
    sv.f_files = ns.inodes + (1ull << 32);
    sv.f_ffree = sv.f_favail = 1ull << 32;
    sv.f_fsid = d->fs_id;
    sv.f_namemax = kMaxName;
    fuse_reply_statfs(req, &sv);
  });
}

void ReplyXattr(fuse_req_t req, const std::string& v, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, v.size());
  if (v.size() > size) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, v.data(), v.size());
}

void ckpt_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  LOG_DEBUG("setxattr(ino={}, name={})", ino, name);
  Guard(req, [&] {
    const bool control = ino == meta::kRootIno && (strcmp(name, kLostClearXattr) == 0 ||
                                                   strcmp(name, kReleaseXattr) == 0 || strcmp(name, kSkipXattr) == 0 ||
                                                   strcmp(name, kRetryXattr) == 0);
    if (control) {  // `ckptfs lost --clear`, `ckptfs umount`, `ckptfs skip`: the daemon's user only
      uid_t uid = fuse_req_ctx(req)->uid;
      if (uid != 0 && uid != geteuid()) return (void)fuse_reply_err(req, EPERM);
      if (strcmp(name, kReleaseXattr) == 0) {
        D(req)->release_tier = size == 1 && value[0] == '1';
        return (void)fuse_reply_err(req, 0);
      }
      if (strcmp(name, kRetryXattr) == 0) {
        D(req)->drainer->Kick();
        return (void)fuse_reply_err(req, 0);
      }
      if (strcmp(name, kSkipXattr) == 0) {
        auto r = D(req)->table->oplog().RequestSkip(std::string_view(value, size));
        if (r) {
          LOG_WARN("skip: the operator gives up on '{}': the drain marks it failed and goes on",
                   EscapeName(std::string_view(value, size)));
          D(req)->drainer->Kick();
        }
        return (void)fuse_reply_err(req, r ? 0 : r.error());
      }
      auto r = D(req)->table->ClearLost();
      return (void)fuse_reply_err(req, r ? 0 : r.error());
    }
    if (strcmp(name, kPersistXattr) == 0) {  // `ckptfs persist`
      const fuse_ctx* ctx = fuse_req_ctx(req);
      auto r = D(req)->table->PersistCheckpoint(ino, Caller{ctx->uid, ctx->gid});
      return (void)fuse_reply_err(req, r ? 0 : r.error());
    }
    auto r = D(req)->table->SetXattr(ino, name, std::string_view(value, size), flags);
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

void ckpt_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  LOG_DEBUG("getxattr(ino={}, name={})", ino, name);
  TuneOnce(req);
  Guard(req, [&] {
    if (ino == meta::kRootIno && strcmp(name, kStatusXattr) == 0) return ReplyXattr(req, StatusJson(D(req)), size);
    // user.ckptfs.lost.N / user.ckptfs.checkpoints.N: page N of the lost
    // list (`ckptfs lost`) / of the checkpoints (`ckptfs ls`).
    for (const char* prefix : {kLostXattrPrefix, kCheckpointsXattrPrefix}) {
      if (ino != meta::kRootIno || strncmp(name, prefix, strlen(prefix)) != 0) continue;
      const char* num = name + strlen(prefix);
      char* end = nullptr;
      errno = 0;
      unsigned long long page = strtoull(num, &end, 10);
      if (*num >= '0' && *num <= '9' && *end == '\0' && errno == 0 && (num[0] != '0' || num[1] == '\0')) {
        auto r = prefix == kLostXattrPrefix ? LostPage(D(req), page) : CheckpointsPage(D(req), page);
        if (!r) return (void)fuse_reply_err(req, r.error());
        return ReplyXattr(req, *r, size);
      }
    }
    auto r = D(req)->table->GetXattr(ino, name);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyXattr(req, *r, size);
  });
}

void ckpt_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  LOG_DEBUG("listxattr(ino={})", ino);
  Guard(req, [&] {
    auto r = D(req)->table->ListXattr(ino);
    if (!r) return (void)fuse_reply_err(req, r.error());
    ReplyXattr(req, *r, size);
  });
}

void ckpt_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  LOG_DEBUG("removexattr(ino={}, name={})", ino, name);
  Guard(req, [&] {
    auto r = D(req)->table->RemoveXattr(ino, name);
    fuse_reply_err(req, r ? 0 : r.error());
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
    bool can_queue = d->space_waiter != nullptr;
    auto r = d->table->Fallocate(ino, mode, uoff, ulen, /*wait=*/!can_queue);
    if (!r && r.error() == EAGAIN) {
      // No room yet: wait on the space waiter's thread, not this worker.
      auto job = [req, ino, mode, uoff, ulen](bool cancelled) {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          auto st = D(req)->table->Fallocate(ino, mode, uoff, ulen);
          fuse_reply_err(req, st ? 0 : st.error());
        });
      };
      if (d->space_waiter->Submit(std::move(job), 0)) return;
      r = d->table->Fallocate(ino, mode, uoff, ulen);
    }
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops o{};
  o.init = ckpt_init;
  o.destroy = ckpt_destroy;
  o.lookup = ckpt_lookup;
  o.forget = ckpt_forget;
  o.forget_multi = ckpt_forget_multi;
  o.getattr = ckpt_getattr;
  o.setattr = ckpt_setattr;
  o.readlink = ckpt_readlink;
  o.mknod = ckpt_mknod;
  o.mkdir = ckpt_mkdir;
  o.symlink = ckpt_symlink;
  o.link = ckpt_link;
  o.unlink = ckpt_unlink;
  o.rmdir = ckpt_rmdir;
  o.rename = ckpt_rename;
  o.open = ckpt_open;
  o.create = ckpt_create;
  o.read = ckpt_read;
  o.write_buf = ckpt_write_buf;
  o.flush = ckpt_flush;
  o.release = ckpt_release;
  o.fsync = ckpt_fsync;
  o.opendir = ckpt_opendir;
  o.readdir = ckpt_readdir;
  o.readdirplus = ckpt_readdirplus;
  o.releasedir = ckpt_releasedir;
  o.fsyncdir = ckpt_fsyncdir;
  o.statfs = ckpt_statfs;
  o.setxattr = ckpt_setxattr;
  o.getxattr = ckpt_getxattr;
  o.listxattr = ckpt_listxattr;
  o.removexattr = ckpt_removexattr;
  o.fallocate = ckpt_fallocate;
  return o;
}

}  // namespace

const fuse_lowlevel_ops& FuseOps() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return ops;
}

}  // namespace ckpt::fs
