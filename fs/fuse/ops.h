// ops.h — what the FUSE callbacks share (fs/fuse/fuse_ops.cc: the
// namespace, directories, xattrs, statfs; fs/fuse/data_ops.cc: open, read,
// write, flush, release, fsync, fallocate): the handles, the guard that
// keeps exceptions out of libfuse, the replies of an entry and of
// attributes. Included by those two files only.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>

#include <cstdint>
#include <new>
#include <stdexcept>
#include <vector>

#include "common/failpoint.h"
#include "common/log.h"
#include "fs/daemon.h"

namespace ckpt::fs::ops {

struct FileHandle {
  uint64_t ino;
  int fd;  // the tier file, owned by the tier while pinned
  bool wrote = false;
  bool passthrough = false;  // the kernel serves its I/O from the tier file
  bool writer = false;       // opened for writing: counted in Core::saves until released
  int64_t writer_token = 0;  // SaveActivity::WriterOpened's
  int backing_id = 0;        // with passthrough: the id the open reply carries
  int flags = 0;             // the open flags: FUSE flush carries none (libfuse passes 0)
  uint64_t open_gen = 0;     // the file's data generation once opened (InodeTable::Flush)
};

struct DirHandle {
  std::vector<DirEntry> entries;
};

inline Daemon* D(fuse_req_t req) { return static_cast<Daemon*>(fuse_req_userdata(req)); }

// A request that changes the namespace or a file's bytes: a save is under
// way, and the drain waits for a quiet moment (fs/core/save_activity.h).
inline void NoteSave(fuse_req_t req) { D(req)->table->core().saves.Touch(); }

inline Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid};
}

inline void ReplyEntry(fuse_req_t req, const InodeRecord& r) {
  Daemon* d = D(req);
  fuse_entry_param e{};
  e.ino = r.ino;
  e.generation = 1;
  e.attr_timeout = d->attr_timeout;
  e.entry_timeout = d->entry_timeout;
  d->table->FillStat(r, &e.attr);
  fuse_reply_entry(req, &e);
}

inline void ReplyAttr(fuse_req_t req, const InodeRecord& r) {
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

// The largest read reply libfuse can splice (set at INIT, fuse_ops.cc).
inline size_t g_splice_max = 0;

// The data path (data_ops.cc).
void ckpt_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void ckpt_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
void ckpt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void ckpt_write_buf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* in, off_t off, fuse_file_info* fi);
void ckpt_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void ckpt_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void ckpt_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
void ckpt_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info* fi);

}  // namespace ckpt::fs::ops
