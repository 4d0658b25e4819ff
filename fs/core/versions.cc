// versions.cc — VersionStore (fs/core/versions.h): the seal, copy-on-write
// and snapshots of each file's versions, and the rules they keep; and the
// state table's one place of application, Transition.
#include "fs/core/versions.h"

#include <sys/stat.h>
#include <time.h>

#include <cstring>

#include "common/log.h"

namespace ckpt::fs {

using meta::Batch;
using meta::LogEntry;
using meta::LogOp;
using meta::MetaStore;

int64_t WallNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void Transition(Inode* n, FileEvent e) {
  auto next = NextState(n->rec.state, e);
  if (!next) {
    LOG_ERROR("ino {}: event {} in state {} is not in the state table; state kept", n->rec.ino, FileEventName(e),
              meta::DataStateName(n->rec.state));
    return;
  }
  // Checkpoint timing: a change after the last publish starts a new write.
  const int64_t now = WallNs();
  if (e == FileEvent::kChange && (n->t_change_ns == 0 || n->t_publish_ns >= n->t_change_ns)) n->t_change_ns = now;
  if (e == FileEvent::kPublish) n->t_publish_ns = now;
  n->rec.state = *next;
}

uint64_t VersionStore::Seal(const Namespace& ns, Inode* n, bool memory_only, Batch* b, std::vector<LogEntry>* out) {
  // The previous version still waits at the end of the log, nothing logged
  // after it: the drain would skip it anyway (its very next entry rewrites
  // the file; Drainer::SkipUndonePersist), so it is dropped now, with the
  // copy kept for it. A file rewritten and fsynced in a loop then holds at
  // most its live bytes, one copy and one version in transfer, however far
  // behind the drain is.
  uint64_t dropped = 0;
  if (out->empty() && SealPending(n) && log_->IsOpenTail(n->seal_seq, n->rec.ino)) {
    MetaStore::DeleteLog(b, n->seal_seq);
    dropped = n->seal_seq;
  }
  n->rec.version++;
  n->rec.sealed_size = n->rec.size;
  residency_->Sealed(n->rec.size);
  Transition(n, FileEvent::kChange);  // a new version, in no backend yet
  n->sealed_gen = n->data_gen;
  n->t_seal_ns = WallNs();
  if (memory_only) {
    Transition(n, FileEvent::kKeep);  // sealed in RAM; never logged (see PersistCheckpoint)
    n->seal_seq = 0;
    return dropped;
  }
  log_->Append(b, PersistEntry(ns, n), out);
  n->seal_seq = out->back().seq;
  return dropped;
}

LogEntry VersionStore::MakeEntry(const meta::InodeRecord& r, std::string path) {
  LogEntry e;
  e.op = S_ISDIR(r.mode) ? LogOp::kMkdir : LogOp::kSymlink;
  e.ino = r.ino;
  e.mode = r.mode;
  e.uid = r.uid;
  e.gid = r.gid;
  e.has_owner = true;
  e.path = std::move(path);
  e.path2 = r.target;
  return e;
}

LogEntry VersionStore::PersistEntry(const Namespace& ns, const Inode* n) {
  LogEntry e;
  e.op = LogOp::kPersist;
  e.ino = n->rec.ino;
  e.version = n->rec.version;
  e.mode = n->rec.mode;
  e.mtime = n->rec.mtime;
  e.uid = n->rec.uid;
  e.gid = n->rec.gid;
  e.has_owner = true;
  e.path = ns.EntryPath(n->rec.parent, n->rec.name);
  // A file with several names: the backend publishes under the first and
  // must link the others to the new bytes (publishing renames a new file
  // over the name, which breaks the backend's hard link). path2 lists them,
  // NUL-separated. Scanning every directory is fine: hard links are rare.
  if (n->rec.nlink > 1) {
    for (auto& [dino, d] : ns.all()) {
      if (!d->is_dir()) continue;
      for (auto& [name, child] : d->children) {
        if (child != n->rec.ino || (dino == n->rec.parent && name == n->rec.name)) continue;
        if (!e.path2.empty()) e.path2.push_back('\0');
        e.path2 += ns.EntryPath(dino, name);
      }
    }
  }
  return e;
}

void VersionStore::Supersede(uint64_t seq, uint64_t ino, uint64_t version) {
  if (seq == 0) return;
  log_->Supersede(seq);
  tier_->Remove(cache::SnapKey(ino, version));  // a transfer already reading it keeps its descriptor
  tier_->NotifySpace();
}

Status VersionStore::MoveAside(const Namespace& ns, Inode* n) {
  uint64_t ino = n->rec.ino;
  if (!S_ISREG(n->rec.mode) || !SealPending(n)) return {};
  uint64_t key = cache::SnapKey(ino, n->rec.version);
  if (tier_->Has(key) || !tier_->Has(ino)) return {};
  // Passthrough handles are served from the live file: it stays, the
  // version is copied (rare: a truncate(2) by path under a reader).
  // Under the namespace lock, so the copy takes only free budget (the evictor takes the namespace lock).
  if (auto st = n->pt_opens > 0 ? tier_->CopyOut(ino, key, false, false) : tier_->Snapshot(ino, key, false); !st) {
    LOG_ERROR("ino {} '{}': cannot keep version {} for the drain: {}", ino, ns.EntryPath(n->rec.parent, n->rec.name),
              n->rec.version, strerror(st.error()));
    return st;
  }
  LOG_DEBUG("ino {}: version {} moved aside", ino, n->rec.version);
  return {};
}

bool VersionStore::NeedsCopy(const Inode* n) const {
  // Bytes changed since the seal: the version was kept when they first did.
  if (!S_ISREG(n->rec.mode) || n->data_gen != n->sealed_gen || !SealPending(n)) return false;
  return !tier_->Has(cache::SnapKey(n->rec.ino, n->rec.version)) && tier_->Has(n->rec.ino);
}

void VersionStore::SupersedeInPlace(Inode* n) {
  // A version sealed in place (an fsync under a passthrough writer: no
  // copy) whose bytes changed, or may have, before the drain took it: its
  // bytes are gone, and the next seal carries the live ones instead, so
  // the drain skips it as superseded. Without this, the seal at the
  // writer's close left it pending with no bytes, and the drain reported
  // it lost (fsstress, issue #27).
  if (SealPending(n) && n->data_gen == n->sealed_gen && !tier_->Has(cache::SnapKey(n->rec.ino, n->rec.version)))
    log_->Supersede(n->seal_seq);
}

bool VersionStore::StagedBytesHeld(const LogEntry& e, const PersistSource& src) const {
  if (!src.live) return true;
  // Every change of a sealed version's bytes is preceded by its copy or
  // rename aside (LockForMutation, OpenImpl, MoveAside): no snapshot now,
  // no change has begun.
  const uint64_t key = cache::SnapKey(e.ino, e.version);
  if (!tier_->Has(key)) return true;
  auto ref = tier_->Ref(key);
  struct stat snap, staged;
  return ref && fstat((*ref)->fd, &snap) == 0 && fstat(src.fd, &staged) == 0 && snap.st_dev == staged.st_dev &&
         snap.st_ino == staged.st_ino;
}

}  // namespace ckpt::fs
