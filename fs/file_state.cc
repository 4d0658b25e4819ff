// file_state.cc — the write path of one file: open, write, flush, fsync and
// release; the seal of a version and its copy-on-write. A file's bytes change
// under its data lock (Inode::data_mu), never under the namespace mutex.
//
// One of the files of InodeTable (fs/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include "fs/core_impl.h"

namespace ckpt::fs {

const char* FileEventName(FileEvent e) {
  switch (e) {
    case FileEvent::kChange: return "change";
    case FileEvent::kStage: return "stage";
    case FileEvent::kStageEnd: return "stage-end";
    case FileEvent::kPublish: return "publish";
    case FileEvent::kRefuse: return "refuse";
    case FileEvent::kEvict: return "evict";
    case FileEvent::kFetch: return "fetch";
  }
  return "?";
}

std::optional<meta::DataState> NextState(meta::DataState s, FileEvent e) {
  using S = meta::DataState;
  constexpr int kStates = 5, kEvents = 7;
  // kNone: the event cannot happen in that state.
  constexpr int kNone = -1;
  // Rows: dirty, draining, persisted, remote, failed (meta::DataState order).
  // Columns: change, stage, stage-end, publish, refuse, evict, fetch.
  static constexpr int kTable[kStates][kEvents] = {
      /* dirty     */ {0, 1, 0, 2, 4, kNone, kNone},
      /* draining  */ {0, 1, 0, 2, 4, kNone, kNone},
      /* persisted */ {0, kNone, 2, kNone, kNone, 3, kNone},
      /* remote    */ {0, kNone, 3, kNone, kNone, kNone, 2},
      /* failed    */ {0, kNone, 4, kNone, kNone, kNone, kNone},
  };
  auto row = static_cast<int>(s), col = static_cast<int>(e);
  if (row < 0 || row >= kStates || col < 0 || col >= kEvents || kTable[row][col] == kNone) return std::nullopt;
  return static_cast<S>(kTable[row][col]);
}

void InodeTable::Transition(Inode* n, FileEvent e) {
  auto next = NextState(n->rec.state, e);
  if (!next) {
    LOG_ERROR("ino {}: event {} in state {} is not in the state table; state kept", n->rec.ino, FileEventName(e),
              meta::DataStateName(n->rec.state));
    return;
  }
  n->rec.state = *next;
}

Result<int> InodeTable::Open(uint64_t ino, int flags) {
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (n->is_dir()) return Err(EISDIR);
  if (!S_ISREG(n->rec.mode)) return Err(ENXIO);
  bool writable = (flags & O_ACCMODE) != O_RDONLY;
  bool trunc = (flags & O_TRUNC) && writable;
  if (writable)
    if (auto st = Writable(); !st) return Err(st.error());
  bool was_remote = n->rec.state == DataState::kRemote;
  if (was_remote && !(trunc && !n->fetching)) {
    if (auto st = EnsureLocal(ino); !st) return Err(st.error());
    n = Find(ino);
    if (!n) return Err(ENOENT);
  }
  if (writable && n->writers == 0) {
    // The sealed version the drain has not published stays as it is: an
    // O_TRUNC moves it aside now (a rename; no write is in flight without
    // a writer); otherwise the first change of the bytes copies it
    // (LockForMutation), so an open that writes nothing copies nothing.
    if (trunc)
      if (auto st = MoveAside(n); !st) return Err(st.error());
    // Record "being rewritten" before any byte changes, so that a daemon
    // that dies now restarts from the last sealed version, not from torn
    // bytes it would otherwise take for that version.
    if (n->rec.state == DataState::kPersisted || n->rec.state == DataState::kRemote) {
      const DataState before = n->rec.state;
      Transition(n, FileEvent::kChange);
      Batch b;
      MetaStore::PutInode(&b, n->rec);
      if (auto st = Commit(b); !st) {
        n->rec.state = before;
        return Err(st.error());
      }
      n->pre_open_state = before;
      n->open_marked = true;
    }
  }
  auto fd = tier_->Pin(ino, true);
  if (!fd) return Err(fd.error());
  if (trunc && (n->rec.size != 0 || was_remote)) {
    if (auto st = tier_->Truncate(ino, 0); !st) {
      tier_->Unpin(ino);
      return Err(st.error());
    }
    n->rec.size = 0;
    n->rec.mtime = n->rec.ctime = Now();
    Transition(n, FileEvent::kChange);
    n->data_gen++;
    n->size_dirty = true;
  }
  n->opens++;
  if (writable) n->writers++;
  TouchLru(n);
  return *fd;
}

void InodeTable::Release(uint64_t ino, int open_flags) {
  DataExclusive data = LockForSeal(ino);
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  if (!n) return;
  tier_->Unpin(ino);
  n->opens--;
  if ((open_flags & O_ACCMODE) != O_RDONLY && n->writers > 0) n->writers--;
  TouchLru(n);
  if (n->rec.nlink > 0 && n->data_gen != n->sealed_gen) {
    // Writers through other handles copy the version aside before their
    // next change (LockForMutation).
    if (auto st = SealNow(n); !st) LOG_ERROR("ino {}: could not seal at close: {}", ino, strerror(st.error()));
  } else if (n->writers == 0 && n->open_marked && n->rec.nlink > 0) {
    // Opened for writing, closed unchanged: back to what it was.
    n->open_marked = false;
    n->rec.state =
        n->pre_open_state == DataState::kRemote && tier_->Has(ino) ? DataState::kPersisted : n->pre_open_state;
    Batch b;
    MetaStore::PutInode(&b, n->rec);
    if (auto st = Commit(b); !st) LOG_ERROR("ino {}: could not record state at close", ino);
    else n->size_dirty = false;
  } else if (n->size_dirty && n->rec.nlink > 0) {
    Batch b;
    MetaStore::PutInode(&b, n->rec);
    if (auto st = Commit(b); !st) LOG_ERROR("ino {}: could not record size at close", ino);
    else n->size_dirty = false;
  }
  MaybeDelete(n);
}

Result<size_t> InodeTable::Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int)>& fn,
                                 bool wait) {
  if (auto st = Writable(); !st) return Err(st.error());
  if (off > limits_.max_file_size || len > limits_.max_file_size - off) return Err(EFBIG);
  // The first write after a seal (an fsync, a close through another
  // handle, mmap writeback after close) keeps the sealed version first.
  auto data = LockForMutation(ino, wait);
  if (!data) return Err(data.error());
  // The tier may wait for space here: never under mu_.
  auto n = tier_->Write(ino, off, len, fn, wait);
  if (!n) return n;
  MutexLock lk(&mu_);
  Inode* node = Find(ino);
  if (!node) return n;
  node->rec.size = std::max(node->rec.size, off + *n);
  node->rec.mtime = node->rec.ctime = Now();
  Transition(node, FileEvent::kChange);
  node->data_gen++;
  // Writing clears set-user-ID and set-group-ID, as on local filesystems.
  if (node->rec.mode & (S_ISUID | S_ISGID)) node->rec.mode &= ~(S_ISUID | ((node->rec.mode & S_IXGRP) ? S_ISGID : 0));
  node->size_dirty = true;
  return n;
}

Status InodeTable::Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, bool wait) {
  if (auto st = Writable(); !st) return st;
  if (off > limits_.max_file_size || len > limits_.max_file_size - off) return Err(EFBIG);
  {
    MutexLock lk(&mu_);
    Inode* n = Find(ino);
    if (!n) return Err(ENOENT);
    if (!S_ISREG(n->rec.mode)) return Err(ENODEV);
  }
  auto data = LockForMutation(ino, wait);
  if (!data) return Err(data.error());
  if (auto st = tier_->Fallocate(ino, mode, off, len, wait); !st) return st;
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  if (!n) return {};
  if (!(mode & FALLOC_FL_KEEP_SIZE)) n->rec.size = std::max(n->rec.size, off + len);
  n->rec.mtime = n->rec.ctime = Now();
  Transition(n, FileEvent::kChange);
  n->data_gen++;
  n->size_dirty = true;
  return {};
}

Status InodeTable::Flush(uint64_t ino, int open_flags) {
  DataExclusive data = LockForSeal(ino);
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  bool last_writer = (open_flags & O_ACCMODE) != O_RDONLY && n->writers == 1;
  if (last_writer && n->rec.nlink > 0 && n->data_gen != n->sealed_gen && S_ISREG(n->rec.mode)) return SealNow(n);
  if (!n->size_dirty) return {};
  Batch b;
  MetaStore::PutInode(&b, n->rec);
  if (auto st = Commit(b); !st) return st;
  n->size_dirty = false;
  return {};
}

bool InodeTable::NeedsCopy(const Inode* n) {
  // Bytes changed since the seal: the version was kept when they first did.
  if (!S_ISREG(n->rec.mode) || n->data_gen != n->sealed_gen || !SealPending(n)) return false;
  return !tier_->Has(cache::SnapKey(n->rec.ino, n->rec.version)) && tier_->Has(n->rec.ino);
}

InodeTable::DataExclusive InodeTable::LockForSeal(uint64_t ino) {
  DataExclusive l;
  {
    MutexLock lk(&mu_);
    Inode* n = Find(ino);
    if (!n) return l;
    l.mu = n->data_mu;
  }
  l.lock = std::unique_lock(*l.mu);
  return l;
}

Result<InodeTable::DataShared> InodeTable::LockForMutation(uint64_t ino, bool wait) {
  std::shared_ptr<std::shared_mutex> mu;
  {
    MutexLock lk(&mu_);
    Inode* n = Find(ino);
    if (!n) return Err(ENOENT);
    mu = n->data_mu;
  }
  for (;;) {
    DataShared shared{mu, std::shared_lock(*mu)};
    {
      MutexLock lk(&mu_);
      Inode* n = Find(ino);
      if (!n) return Err(ENOENT);
      if (!NeedsCopy(n)) return shared;
    }
    shared.lock.unlock();
    std::unique_lock excl(*mu);
    uint64_t version;
    {
      MutexLock lk(&mu_);
      Inode* n = Find(ino);
      if (!n) return Err(ENOENT);
      if (!NeedsCopy(n)) continue;  // another writer copied it meanwhile
      version = n->rec.version;
    }
    // No change of the bytes and no seal can run now (data lock), but
    // everything else can (mu_ is free), the evictor that makes room for
    // the copy included.
    const uint64_t key = cache::SnapKey(ino, version);
    if (auto st = tier_->Snapshot(ino, key, true, wait); !st) {
      if (st.error() != EAGAIN)
        LOG_ERROR("ino {}: cannot keep version {} for the drain: {}", ino, version, strerror(st.error()));
      return Err(st.error());
    }
    LOG_DEBUG("ino {}: version {} copied aside before a write", ino, version);
    MutexLock lk(&mu_);
    Inode* n = Find(ino);
    // Published while it was copied: the copy is not needed after all.
    if (!n || n->rec.version != version || !SealPending(n)) tier_->Remove(key);
  }
}

Result<uint64_t> InodeTable::SyncSeal(uint64_t ino) {
  DataExclusive data = LockForSeal(ino);
  MutexLock lk(&mu_);
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  // The seal is metadata only: a writer that goes on copies the version
  // aside at its next write (LockForMutation), not here.
  if (n->rec.nlink > 0 && n->data_gen != n->sealed_gen && S_ISREG(n->rec.mode))
    if (auto st = SealNow(n); !st) return Err(st.error());
  // Everything logged so far, this file's seal included.
  return next_seq_ - 1;
}

Status InodeTable::SyncToBackend(uint64_t ino, bool wait) {
  auto seq = SyncSeal(ino);
  if (!seq) return Err(seq.error());
  if (!wait) return {};
  return WaitApplied(*seq) ? Status{} : Err(EIO);
}

uint64_t InodeTable::Seal(Inode* n, Batch* b, std::vector<LogEntry>* out) {
  // The previous version still waits at the end of the log, nothing logged
  // after it: the drain would skip it anyway (its very next entry rewrites
  // the file; Drainer::SkipUndonePersist), so it is dropped now, with the
  // copy kept for it. A file rewritten and fsynced in a loop then holds at
  // most its live bytes, one copy and one version in transfer, however far
  // behind the drain is.
  uint64_t dropped = 0;
  if (out->empty() && SealPending(n) && !log_.empty() && log_.back().seq == n->seal_seq &&
      log_.back().op == LogOp::kPersist && log_.back().ino == n->rec.ino && !superseded_.count(n->seal_seq)) {
    MetaStore::DeleteLog(b, n->seal_seq);
    dropped = n->seal_seq;
  }
  n->rec.version++;
  n->rec.sealed_size = n->rec.size;
  Transition(n, FileEvent::kChange);  // a new version, in no backend yet
  n->sealed_gen = n->data_gen;
  LogEntry e;
  e.op = LogOp::kPersist;
  e.ino = n->rec.ino;
  e.version = n->rec.version;
  e.mode = n->rec.mode;
  e.mtime = n->rec.mtime;
  e.uid = n->rec.uid;
  e.gid = n->rec.gid;
  e.has_owner = true;
  e.path = EntryPath(n->rec.parent, n->rec.name);
  // A file with several names: the backend publishes under the first and
  // must link the others to the new bytes (publishing renames a new file
  // over the name, which breaks the backend's hard link). path2 lists them,
  // NUL-separated. Scanning every directory is fine: hard links are rare.
  if (n->rec.nlink > 1) {
    for (auto& [dino, d] : inodes_) {
      if (!d->is_dir()) continue;
      for (auto& [name, child] : d->children) {
        if (child != n->rec.ino || (dino == n->rec.parent && name == n->rec.name)) continue;
        if (!e.path2.empty()) e.path2.push_back('\0');
        e.path2 += EntryPath(dino, name);
      }
    }
  }
  AppendLog(b, e, out);
  n->seal_seq = out->back().seq;
  return dropped;
}

void InodeTable::Supersede(uint64_t seq, uint64_t ino, uint64_t version) {
  if (seq == 0) return;
  superseded_.insert(seq);
  tier_->Remove(cache::SnapKey(ino, version));  // a transfer already reading it keeps its descriptor
  tier_->NotifySpace();
}

Status InodeTable::SealNow(Inode* n) {
  Batch b;
  std::vector<LogEntry> log;
  uint64_t dropped = Seal(n, &b, &log);
  MetaStore::PutInode(&b, n->rec);
  if (auto st = CommitWithLog(b, std::move(log)); !st) return st;
  Supersede(dropped, n->rec.ino, n->rec.version - 1);
  n->size_dirty = false;
  n->open_marked = false;
  return {};
}

Status InodeTable::MoveAside(Inode* n) {
  uint64_t ino = n->rec.ino;
  if (!S_ISREG(n->rec.mode) || !SealPending(n)) return {};
  uint64_t key = cache::SnapKey(ino, n->rec.version);
  if (tier_->Has(key) || !tier_->Has(ino)) return {};
  if (auto st = tier_->Snapshot(ino, key, false); !st) {
    LOG_ERROR("ino {} '{}': cannot keep version {} for the drain: {}", ino, EntryPath(n->rec.parent, n->rec.name),
              n->rec.version, strerror(st.error()));
    return st;
  }
  LOG_DEBUG("ino {}: version {} moved aside", ino, n->rec.version);
  return {};
}

}  // namespace ckpt::fs
