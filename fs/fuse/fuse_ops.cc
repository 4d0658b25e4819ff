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
#include "fs/cluster/replica_store.h"
#include "fs/daemon.h"
#include "fs/fuse/ops.h"

namespace ckpt::fs {
namespace {

using namespace ops;

// The largest read reply libfuse can splice: it needs a pipe of the reply
// plus two pages, and without CAP_SYS_RESOURCE a pipe grows only to
// fs.pipe-max-size (1 MiB by default). Larger replies fall back to a fresh
// malloc per request in libfuse, which costs more than the copy it saves.

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
    if (d->fetcher && d->table->shared_ns().LookupNeedsBackend(parent, name)) {
      auto job = [req, parent, n = std::string(name)](bool cancelled) {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          auto r = D(req)->table->shared_ns().Lookup(parent, n);
          if (!r) return (void)fuse_reply_err(req, r.error());
          ReplyEntry(req, *r);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    auto r =
        d->table->shared_ns().enabled() ? d->table->shared_ns().Lookup(parent, name) : d->table->Lookup(parent, name);
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
    auto apply = [req, ino, c] {
      auto r = D(req)->table->SetAttr(ino, c);
      if (!r) return (void)fuse_reply_err(req, r.error());
      ReplyAttr(req, *r);
    };
    // A truncate that first fetches an evicted file (up to its size, from
    // S3) or copies its sealed version aside for the drain (seconds for
    // GiBs) runs on the fetcher or the copier thread, as an open or a write
    // that does: on this worker it held the requests the kernel had handed
    // it already (stat, ls, status).
    Daemon* d = D(req);
    OffloadQueue* q = nullptr;
    if (c.to_set & kSetSize) {
      if (c.size != 0 && d->fetcher && d->table->NeedsFetch(ino, O_RDWR)) q = d->fetcher.get();
      else if (d->copier && d->table->ChangeCopiesAside(ino)) q = d->copier.get();
    }
    auto job = [req, apply](bool cancelled) {
      if (cancelled) return (void)fuse_reply_err(req, EIO);
      Guard(req, apply);
    };
    if (q && q->Submit(std::move(job), 0)) return;
    apply();
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
    auto r = D(req)->table->Mknod(parent, name, mode, rdev, CallerOf(req), /*seal=*/true);  // no close follows
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
    D(req)->table->core().AnnounceNames();
    ReplyEntry(req, *r);
  });
}

void ckpt_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  LOG_DEBUG("symlink(parent={}, name={})", parent, name);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Symlink(parent, name, link, CallerOf(req));
    if (!r) return (void)fuse_reply_err(req, r.error());
    D(req)->table->core().AnnounceNames();
    ReplyEntry(req, *r);
  });
}

void ckpt_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  LOG_DEBUG("link(ino={}, newparent={}, newname={})", ino, newparent, newname);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Link(ino, newparent, newname);
    if (!r) return (void)fuse_reply_err(req, r.error());
    D(req)->table->core().AnnounceNames();
    ReplyEntry(req, *r);
  });
}

// unlink and rmdir: the entry goes, the reply carries no entry.
void RemoveEntry(fuse_req_t req, fuse_ino_t parent, const char* name, bool dir) {
  LOG_DEBUG("{}(parent={}, name={})", dir ? "rmdir" : "unlink", parent, name);
  NoteSave(req);
  Guard(req, [&] {
    InodeTable* t = D(req)->table.get();
    auto r = dir ? t->Rmdir(parent, name) : t->Unlink(parent, name);
    if (r) FAILPOINT("meta.after_commit");
    if (r) t->core().AnnounceNames();
    fuse_reply_err(req, r ? 0 : r.error());
  });
}

void ckpt_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) { RemoveEntry(req, parent, name, false); }

void ckpt_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) { RemoveEntry(req, parent, name, true); }

void ckpt_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
                 unsigned int flags) {
  LOG_DEBUG("rename(parent={}, name={}, newparent={}, newname={}, flags={})", parent, name, newparent, newname, flags);
  NoteSave(req);
  Guard(req, [&] {
    auto r = D(req)->table->Rename(parent, name, newparent, newname, flags);
    if (r) FAILPOINT("meta.after_commit");
    if (r) D(req)->table->core().AnnounceNames();
    fuse_reply_err(req, r ? 0 : r.error());
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
    if (d->fetcher && d->table->shared_ns().MergeDue(ino)) {
      fuse_file_info copy = *fi;
      auto job = [req, ino, copy](bool cancelled) mutable {
        if (cancelled) return (void)fuse_reply_err(req, EIO);
        Guard(req, [&] {
          D(req)->table->shared_ns().MergeDir(ino);
          OpenDirAndReply(req, ino, &copy);
        });
      };
      if (d->fetcher->Submit(std::move(job), 0)) return;
    }
    d->table->shared_ns().MergeDir(ino);  // only without a fetcher: nothing when not due
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
  // Guarded as every callback is: an exception (bad_alloc) out of here
  // reached libfuse and terminated the daemon.
  Guard(req, [&] {
    d->table->WhenApplied(d->table->core().oplog.LoggedSeq(), 0, [req](int err) { fuse_reply_err(req, err); });
  });
}

void ckpt_statfs(fuse_req_t req, fuse_ino_t ino) {
  TuneOnce(req);
  Guard(req, [&] {
    Daemon* d = D(req);
    cache::TierStats t = d->table->core().tier()->Stats();
    NamespaceStats ns = d->table->core().ns.Stats();
    struct statvfs sv {};
    constexpr uint64_t kBlock = 4096;
    sv.f_bsize = kBlock;
    sv.f_frsize = kBlock;
    sv.f_blocks = t.budget / kBlock;
    // Pre-allocated spares are free space to a writer (the first pages
    // given back when one needs room): df shows what files hold. Other
    // members' replicas share the budget (--replicas): free but not
    // available, as a file system's reserved blocks are, so `df` shows them
    // apart — Size − Used − Avail.
    const uint64_t spares = std::min(d->table->core().tier()->Spares().first, t.used);
    uint64_t used = std::min(t.used - spares, t.budget);
    uint64_t replicas = 0;
    if (d->replica_store) replicas = std::min(t.outside, d->replica_store->bytes() - d->replica_store->spare_bytes());
    sv.f_bfree = (t.budget - used) / kBlock;
    sv.f_bavail = (t.budget - used - std::min(replicas, t.budget - used)) / kBlock;
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
        auto r = D(req)->table->core().oplog.RequestSkip(std::string_view(value, size));
        if (r) {
          LOG_WARN("skip: the operator gives up on '{}': the drain marks it failed and goes on",
                   EscapeName(std::string_view(value, size)));
          D(req)->drainer->Kick();
        }
        return (void)fuse_reply_err(req, r ? 0 : r.error());
      }
      auto r = D(req)->table->drain_port().ClearLost();
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

// Who asks for a status list (fs/daemon.h, Asker): root and the daemon's
// own uid see everything; another uid's groups come from the kernel.
Asker AskerOf(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  Asker a{.all = c->uid == 0 || c->uid == geteuid(), .uid = c->uid, .gids = {c->gid}};
  if (a.all) return a;
  gid_t groups[256];
  const int n = fuse_req_getgroups(req, 256, groups);
  for (int i = 0; i < std::min(n, 256); i++) a.gids.push_back(groups[i]);
  return a;
}

void ckpt_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  LOG_DEBUG("getxattr(ino={}, name={})", ino, name);
  TuneOnce(req);
  Guard(req, [&] {
    if (ino == meta::kRootIno && strcmp(name, kStatusXattr) == 0)
      return ReplyXattr(req, StatusJson(D(req), AskerOf(req)), size);
    // user.ckptfs.lost.N / user.ckptfs.checkpoints.N: page N of the lost
    // list (`ckptfs lost`) / of the checkpoints (`ckptfs ls`).
    for (const char* prefix : {kLostXattrPrefix, kCheckpointsXattrPrefix}) {
      if (ino != meta::kRootIno || strncmp(name, prefix, strlen(prefix)) != 0) continue;
      const char* num = name + strlen(prefix);
      char* end = nullptr;
      errno = 0;
      unsigned long long page = strtoull(num, &end, 10);
      if (*num >= '0' && *num <= '9' && *end == '\0' && errno == 0 && (num[0] != '0' || num[1] == '\0')) {
        auto r = prefix == kLostXattrPrefix ? LostPage(D(req), page, AskerOf(req))
                                            : CheckpointsPage(D(req), page, AskerOf(req));
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
