// drain.cc — ordered, parallel, retried application of the log to a backend.
#include "fs/drain/drain.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backend/checksum.h"
#include "common/config.h"
#include "common/failpoint.h"
#include "common/log.h"

namespace ckpt::fs {

using meta::LogEntry;
using meta::LogOp;

namespace {

constexpr size_t kWindow = 64;           // entries looked at for staging
constexpr size_t kSkipLookahead = 4096;  // entries searched for an undoing rmdir

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What staging would give of `size` bytes at `fd`, without a copy in the
// backend: their size and content checksum (a taken entry's state).
Result<backend::Staged> HashOnly(int fd, uint64_t size) {
  backend::ContentHash h;
  if (!h.ok()) return Err(ENOMEM);
  std::vector<char> buf(std::min<uint64_t>(std::max<uint64_t>(size, 1), 4 << 20));
  for (uint64_t off = 0; off < size;) {
    const size_t n = std::min<uint64_t>(buf.size(), size - off);
    if (int e = PreadFull(fd, buf.data(), n, off); e != 0) return Err(e);
    h.Update(off, buf.data(), n);
    off += n;
  }
  backend::Staged s;
  s.size = size;
  std::tie(s.checksum_hi, s.checksum_lo) = h.Finish(size);
  return s;
}

}  // namespace

bool IsPermanent(int err) {
  switch (err) {
    case ELOOP:         // a symlink where the backend needs a directory: never followed
    case ENOTDIR:       // a file where the backend needs a directory
    case EISDIR:        // a directory where the backend needs a file
    case EEXIST:        // a file where the backend needs to make a directory
    case ENAMETOOLONG:  // a name or path the backend cannot hold
    case EINVAL:        // a request the store rejects as such (S3 4xx)
    case EILSEQ:        // a name the store cannot encode
    case EFBIG:         // a file larger than the store takes
      return true;
    default: return false;
  }
}

namespace {

// True if `path` is `dir` or lies under it.
bool Under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

}  // namespace

Drainer::Drainer(DrainPort* port, backend::Backend* backend, int parallel)
    : port_(port), log_(&port->log()), backend_(backend), parallel_(std::max(1, parallel)) {
  if (const char* v = getenv("CKPTFS_DRAIN_DELAY_MS")) publish_delay_ms_ = atoi(v);
  if (const char* v = getenv("CKPTFS_DRAIN_PAUSE_FILE")) pause_file_ = v;
}

Drainer::~Drainer() {
  Stop();
  JoinAndDropStaged();  // nothing left after a Stop that returned true
}

void Drainer::Start() {
  {
    MutexLock lk(&mu_);
    running_ = 1 + parallel_;
  }
  runner_ = std::thread([this] {
    Run();
    Exited();
  });
  for (int i = 0; i < parallel_; i++)
    stagers_.emplace_back([this] {
      StageLoop();
      Exited();
    });
}

void Drainer::Exited() {
  MutexLock lk(&mu_);
  running_--;
  cv_.NotifyAll();
}

bool Drainer::Stop(std::chrono::milliseconds bound) {
  {
    // Set under mu_: a thread that has just found stop_ false under mu_ is
    // then already waiting on cv_ and gets the wake-up (set without mu_, a
    // stager could miss it and block for ever, and with it the wait below).
    MutexLock lk(&mu_);
    if (stop_.exchange(true)) return running_ == 0;
  }
  cv_.NotifyAll();
  int stuck;
  {
    // Every wait of the threads ends at stop_; only a backend call that
    // does not return (a hard-mounted NFS server gone: the cancel callback
    // is not even asked) keeps one.
    MutexLock lk(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (running_ > 0 && cv_.WaitUntil(&mu_, deadline)) {
    }
    stuck = running_;
  }
  if (stuck > 0) {
    LOG_ERROR(
        "drain: {} thread(s) still in a call to backend {} after {:.1f} s; stopping without them: the {} "
        "entries not applied stay in the log for the next mount",
        stuck, backend_->Describe(), std::chrono::duration<double>(bound).count(), log_->size());
    return false;
  }
  JoinAndDropStaged();
  return true;
}

void Drainer::JoinAndDropStaged() {
  if (runner_.joinable()) runner_.join();
  for (auto& t : stagers_)
    if (t.joinable()) t.join();
  stagers_.clear();
  // Staged but unpublished uploads: drop them; the log still has the entries.
  MutexLock lk(&mu_);
  for (auto& [seq, job] : jobs_) {
    if (!job->done) continue;
    if (job->err == 0) {
      if (!job->staged.token.empty()) backend_->Abort(job->staged);
      port_->AbortPersist(job->entry);
    }
  }
  jobs_.clear();
}

DrainStats Drainer::Stats() {
  MutexLock lk(&mu_);
  DrainStats s = stats_;
  s.yielding = yielding_ > 0;
  double now = NowSeconds();
  while (!recent_.empty() && recent_.front().first < now - 10) recent_.pop_front();
  uint64_t bytes = 0;
  for (auto& [t, b] : recent_) bytes += b;
  s.rate = recent_.empty() ? 0 : static_cast<double>(bytes) / std::max(1.0, now - recent_.front().first);
  return s;
}

void Drainer::StageLoop() {
  // Copying checkpoints out is background work: at a lower CPU priority
  // (and, by the kernel's default mapping, I/O priority) than the FUSE
  // threads that serve the trainer, so a drain never slows a save down on
  // a busy node, yet takes every idle cycle. io_uring's workers, created by
  // this thread, inherit it. The value is measured in docs/benchmarks.md.
  int nice_value = kStagerNice;
  if (const char* v = getenv("CKPTFS_DRAIN_NICE")) nice_value = atoi(v);  // 0: as the FUSE threads
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice_value) != 0)
    LOG_DEBUG("drain: cannot lower the stager's priority: {}", strerror(errno));
  for (;;) {
    std::shared_ptr<Job> job;
    {
      MutexLock lk(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    YieldToSaves();
    int err = 0;
    auto src = port_->BeginPersist(job->entry);
    if (!src && src.error() == EINPROGRESS && CopyAsideDue()) {
      // Sealed in place under a passthrough writer still open: copied
      // aside here, off the FUSE threads, when entries wait behind it,
      // rather than have them all wait for the writer's close.
      auto st = port_->CopyAsideSealedInPlace(job->entry);
      if (st) {
        src = port_->BeginPersist(job->entry);
      } else if (st.error() != EINPROGRESS) {  // no room (ENOSPC), or the copy failed: not every 20 ms
        LOG_DEBUG("drain: seq {} '{}' v{} sealed in place under an open writer: not copied aside ({}); it waits "
                  "for the close, or for a try a second later",
                  job->entry.seq, job->entry.path, job->entry.version, strerror(st.error()));
        MutexLock lk(&mu_);
        copy_retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      }
    }
    if (!src) {
      err = src.error();
    } else {
      const LogEntry& e = job->entry;
      // The bytes are a sealed version: a snapshot nothing changes, or the
      // live file until a writer copies it aside (VersionStore::MoveAside,
      // LockForMutation; checked after the transfer). Only a stop cancels it.
      // A taken entry is hashed, not staged: the holder published it; its
      // checksum is all the state needs.
      bool hash_only;
      {
        MutexLock lk(&mu_);
        hash_only = taken_.count(e.seq) || claimed_taken_.count(e.seq);  // a holder's (claimed: likely done soon)
      }
      auto staged =
          hash_only ? HashOnly(src->fd, src->size) : backend_->Stage(src->fd, src->size, [&] { return stop_.load(); });
      if (!port_->StagedBytesHeld(e, *src)) {
        // Copied aside under the transfer: whatever it read (torn bytes, a
        // short read) is dropped, and the copy is staged at once.
        LOG_DEBUG("drain: seq {} '{}' v{} copied aside while staged; staging the copy", e.seq, e.path, e.version);
        if (staged && !staged->token.empty()) backend_->Abort(*staged);
        port_->AbortPersist(e);
        err = EAGAIN;
      } else if (!staged) {
        err = staged.error();
        port_->AbortPersist(e);
      } else {
        job->staged = *staged;
        job->src = *src;
        job->hashed_only = hash_only;
      }
    }
    MutexLock lk(&mu_);
    job->err = err;
    job->done = true;
    cv_.NotifyAll();
  }
}

bool Drainer::CopyAsideDue() {
  MutexLock lk(&mu_);
  return std::chrono::steady_clock::now() >= copy_retry_at_;
}

void Drainer::YieldToSaves() {
  if (!hold_ || !hold_()) return;
  auto start = std::chrono::steady_clock::now();
  MutexLock lk(&mu_);
  yielding_++;
  stats_.yields++;
  while (!stop_ && hold_()) SleepUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
  yielding_--;
  stats_.yielded_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Drainer::Schedule(const std::vector<LogEntry>& window) {
  size_t active = 0;
  for (auto& [seq, job] : jobs_) active += job->done ? 0 : 1;
  for (const LogEntry& e : window) {
    if (active >= static_cast<size_t>(parallel_)) break;
    if (e.op != LogOp::kPersist || jobs_.count(e.seq)) continue;
    if (std::find(skip_.begin(), skip_.end(), e.seq) != skip_.end()) continue;
    AddJob(e);
    active++;
  }
  cv_.NotifyAll();
}

std::shared_ptr<Drainer::Job> Drainer::AddJob(const LogEntry& e) {
  auto job = std::make_shared<Job>();
  job->entry = e;
  jobs_[e.seq] = job;
  queue_.push_back(job);
  return job;
}

void Drainer::Run() {
  while (!stop_) {
    if (std::string ro = port_->ReadOnlyReason(); !ro.empty()) {
      HoldReadOnly(ro);
      continue;
    }
    auto window = log_->Pending(kWindow);
    if (window.empty()) {
      if (ProbeDue()) {
        if (auto st = backend_->Check(); st) {
          NoteSuccess();
        } else {
          Backoff();
        }
        continue;
      }
      log_->WaitForEntries(std::chrono::milliseconds(200));
      continue;
    }
    {
      MutexLock lk(&mu_);
      Schedule(window);
    }
    if (log_->SkipRequested(window.front().seq)) {  // `ckptfs skip`: the operator gives up on it
      auto held = log_->Held();
      std::string why = "skipped by the operator (refused: " + (held ? held->reason : std::string("?")) + ")";
      if (int err = FailHead(window.front(), why); err != 0 && !stop_) Backoff();
      else NoteSuccess();
      continue;
    }
    int err = ApplyHead(window.front(), window);
    if (err == EINPROGRESS) {
      // A version sealed by an fsync while a passthrough writer still has
      // the file open: its bytes may still change. A stager copies it aside
      // once entries wait behind it (StageLoop); until then (no room, the
      // writer busy) it waits, for that or for the close (which seals
      // again). Not a backend error.
      MutexLock lk(&mu_);
      SleepUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
      continue;
    }
    if (err != 0 && !stop_ && IsPermanent(err)) {
      if (!refusal_skip_) {
        HoldHead(window.front(), err);
        Backoff();
        continue;
      }
      err = FailHead(window.front(), fmt::format("{}: {}", meta::LogOpName(window.front().op), strerror(err)));
    }
    if (err == 0) {
      NoteSuccess();
      // The cluster writes this node's record now, not at its next tick:
      // another member may wait for it (Cluster::Poke).
      if (cluster_) cluster_->Poke();
    } else if (!stop_) {
      NoteError(window.front(), err);
      Backoff();
    }
  }
}

int Drainer::ApplyHead(const LogEntry& e, const std::vector<LogEntry>& window) {
  if (WaitingForHolder(e.seq)) return EINPROGRESS;    // its holder's claim: done, or given back, first
  if (e.op != LogOp::kPersist)
    if (auto done = CompleteIfTaken(e)) return *done;  // a replica holder applied it (SkipTaken)
  bool skip;
  {
    MutexLock lk(&mu_);
    auto it = std::find(skip_.begin(), skip_.end(), e.seq);
    skip = it != skip_.end();
    if (skip) skip_.erase(it);
  }
  if (!skip && e.op == LogOp::kMkdir) skip = SkipUndoneMkdir(e);
  if (!skip && e.op == LogOp::kPersist) skip = SkipUndonePersist(e, window);
  if (skip) {
    LOG_DEBUG("drain: seq {} {} '{}' undone by later history; skipped", e.seq, meta::LogOpName(e.op), e.path);
    if (!DropJob(e)) return ECANCELED;
    if (auto st = port_->CompleteEntry(e); !st) return st.error();
    MutexLock lk(&mu_);
    stats_.entries_skipped++;
    return 0;
  }
  return e.op == LogOp::kPersist ? ApplyPersist(e) : ApplyNamespace(e);
}

bool Drainer::DropJob(const LogEntry& e) {
  std::shared_ptr<Job> job;
  {
    MutexLock lk(&mu_);
    if (auto it = jobs_.find(e.seq); it != jobs_.end()) job = it->second;
    while (job && !stop_ && !job->done) cv_.Wait(&mu_);
    if (stop_) return false;
    jobs_.erase(e.seq);
  }
  if (job && job->err == 0) {  // staged before it was known not to be published
    if (!job->staged.token.empty()) backend_->Abort(job->staged);
    port_->AbortPersist(e);
  }
  return true;
}

int Drainer::FailHead(const LogEntry& e, const std::string& reason) {
  // -o on_refusal=skip (retrying cannot help, and the mount prefers
  // liveness), or the operator's `ckptfs skip`: the entry is recorded as
  // failed and the drain goes on. The backend then misses that one change,
  // which status, the log, the file's state (`failed`) and every waiter
  // whose range covers it (EIO) say.
  if (!DropJob(e)) return ECANCELED;
  LOG_ERROR("drain: seq {} {} '{}' not applied to backend {}: {}; marked failed, the drain goes on", e.seq,
            meta::LogOpName(e.op), e.path, backend_->Describe(), reason);
  if (auto st = port_->FailEntry(e, reason); !st) return st.error();
  MutexLock lk(&mu_);
  stats_.entries_failed++;
  return 0;
}

void Drainer::HoldHead(const LogEntry& e, int err) {
  // Order first: nothing after a refused entry reaches the backend without
  // it (a `latest` past a missing shard). The entry stays at the head and
  // is retried with backoff, so an operator who fixes the backend needs
  // do nothing more; `ckptfs skip` gives up on it.
  std::string reason = fmt::format("{}: {}", meta::LogOpName(e.op), strerror(err));
  log_->Hold(e, reason);
  MutexLock lk(&mu_);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (held_seq_ != e.seq || held_reason_ != reason) {  // once per entry and reason, not per retry
    held_seq_ = e.seq;
    held_reason_ = reason;
    LOG_ERROR("drain: seq {} {} '{}' refused by backend {} for good ({}); the drain holds here, later entries wait: "
              "fix the backend (retried with backoff) or give it up with `ckptfs skip MOUNTPOINT PATH`",
              e.seq, meta::LogOpName(e.op), e.path, backend_->Describe(), strerror(err));
    if (!stats_.in_error) stats_.error_since = now;
  }
  stats_.retries++;
  stats_.in_error = true;
  stats_.last_error = fmt::format("held: {} '{}' refused for good: {}", meta::LogOpName(e.op), e.path, strerror(err));
  stats_.last_error_time = now;
}

void Drainer::Kick() {
  MutexLock lk(&mu_);
  kick_ = true;
  cv_.NotifyAll();
}

void Drainer::ClusterChanged() {
  MutexLock lk(&mu_);
  cluster_changed_ = true;
  cv_.NotifyAll();
}

int Drainer::ApplyPersist(const LogEntry& e) {
  std::shared_ptr<Job> job;
  {
    MutexLock lk(&mu_);
    auto it = jobs_.find(e.seq);
    if (it != jobs_.end()) {
      job = it->second;
    } else {
      // The head has no job (its last one failed and was dropped for a
      // retry): it gets one now even when later entries fill every stager
      // slot (Schedule would stop at the cap and leave none: a crash seen
      // in CI, dir_ops, as a dereference of jobs_.end()).
      job = AddJob(e);
      cv_.NotifyAll();
    }
    while (!stop_ && !job->done) cv_.Wait(&mu_);
    if (stop_) return ECANCELED;
    if (job->err != 0) jobs_.erase(e.seq);  // a retry stages afresh
  }
  if (job->err == ESTALE) {
    // A newer version of the file replaced this one before the drain took
    // it (VersionStore::Seal): the very next entry brings the newer bytes.
    LOG_DEBUG("drain: seq {} persist '{}' v{} superseded; skipped", e.seq, e.path, e.version);
    if (auto st = port_->CompleteEntry(e); !st) return st.error();
    MutexLock lk(&mu_);
    stats_.entries_skipped++;
    return 0;
  }
  if (job->err == ENODATA) {
    // The sealed bytes are gone (the memory tier did not survive, e.g. a
    // node reboot): nothing to publish. Listed by `ckptfs status`.
    LOG_ERROR("drain: seq {} persist '{}' v{}: lost, its bytes are not in the memory tier", e.seq, e.path, e.version);
    port_->RecordLost(e, "not persisted, and its bytes are not in the memory tier");
    if (auto st = port_->CompleteEntry(e); !st) return st.error();
    MutexLock lk(&mu_);
    stats_.entries_skipped++;
    return 0;
  }
  // Sealed in place under a passthrough writer (see Run), or copied aside
  // while staged (StageLoop): staged again, not an error.
  if (job->err == EINPROGRESS || job->err == EAGAIN) return EINPROGRESS;
  if (job->err != 0) return job->err;
  // Taken over by a replica holder (this run was counted dead; SkipTaken
  // came with its record), before or while it waited: not published.
  if (IsTaken(e.seq)) return CompleteTaken(e, job);
  if (!Cleared(e)) return ECANCELED;
  if (WaitingForHolder(e.seq)) return EINPROGRESS;
  if (IsTaken(e.seq)) return CompleteTaken(e, job);
  if (job->hashed_only) {  // hashed for a claim its holder gave back since: staged for real now
    port_->AbortPersist(e);
    MutexLock lk(&mu_);
    jobs_.erase(e.seq);
    return EINPROGRESS;
  }
  if (publish_delay_ms_ > 0) {  // test knob: a slow backend, to watch the order from outside
    MutexLock lk(&mu_);
    SleepUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(publish_delay_ms_));
  }
  const std::optional<LogEntry> left = WhereHoldersLeftIt(e);
  if (!left) return CompleteLeft(e, job);
  const LogEntry& at = *left;
  backend::Attrs attrs{job->src.mode,      job->src.uid,       job->src.gid,
                       job->src.has_owner, job->src.mtime.sec, job->src.mtime.nsec};
  if (auto st = backend_->Publish(job->staged, at.path, attrs); !st) {
    // ESTALE: the staged copy is gone (deleted behind the daemon's back,
    // the backend replaced): stage again. Otherwise the staged copy stays
    // and the retry publishes it again.
    if (st.error() == ESTALE) {
      backend_->Abort(job->staged);
      port_->AbortPersist(e);
      MutexLock lk(&mu_);
      jobs_.erase(e.seq);
    }
    return st.error();
  }
  FAILPOINT("drain.after_publish");
  // The file's other names (hard links) point at the new bytes too.
  for (size_t i = 0; i < at.path2.size();) {
    size_t end = at.path2.find('\0', i);
    if (end == std::string::npos) end = at.path2.size();
    std::string other = at.path2.substr(i, end - i);
    i = end + 1;
    if (auto st = backend_->Remove(other); !st && st.error() != ENOENT) return st.error();
    if (auto st = backend_->Link(at.path, other); !st) return st.error();
  }
  // The core's names follow the log in order (the holders' renames complete
  // next, unapplied): the logged entry, not `at`.
  if (auto st = port_->CompletePersist(e, job->staged, job->src.gen); !st) return st.error();
  MutexLock lk(&mu_);
  jobs_.erase(e.seq);
  stats_.bytes_persisted += job->staged.size;
  stats_.files_persisted++;
  stats_.entries_applied++;
  recent_.emplace_back(NowSeconds(), job->staged.size);
  return 0;
}

bool Drainer::Cleared(const LogEntry& e) {
  if (!WaitCluster(e)) return false;
  if (WhilePaused()) return false;
  // Asked again after a pause: this node may have stopped standing in the
  // cluster meanwhile (a pause as long as its lease, or a process stopped
  // there), and its holders may have taken the entry over (SkipTaken).
  return WaitCluster(e);
}

bool Drainer::WhilePaused() {
  if (pause_file_.empty()) return false;
  MutexLock lk(&mu_);
  bool paused = false;
  while (!stop_ && access(pause_file_.c_str(), F_OK) == 0) {
    paused = true;
    SleepUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  }
  // Stopped while held: the entry is not applied (a stuck backend does not
  // come unstuck because the daemon stops).
  return paused && stop_;
}

void Drainer::SleepUntil(std::chrono::steady_clock::time_point deadline) {
  while (!stop_ && cv_.WaitUntil(&mu_, deadline)) {
  }
}

bool Drainer::WaitCluster(const LogEntry& e) {
  if (!cluster_) return true;
  bool noted = false;
  while (!cluster_->MayPublish(e.seq)) {
    if (!noted) {
      noted = true;
      LOG_DEBUG("drain: seq {} {} '{}' waits for the cluster's other members (see ckptfs status)", e.seq,
                meta::LogOpName(e.op), e.path);
    }
    MutexLock lk(&mu_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (!stop_ && !cluster_changed_ && cv_.WaitUntil(&mu_, until)) {
    }
    cluster_changed_ = false;
    if (stop_) {
      cluster_->ClearWait();
      return false;
    }
  }
  if (noted) LOG_DEBUG("drain: seq {} '{}' may go: the cluster's earlier files are persisted", e.seq, e.path);
  return true;
}

bool KeptForLost(Cluster* c, LogOp op, int64_t gate_us, const std::string& path, const std::string& who) {
  if (!c || (op != LogOp::kUnlink && op != LogOp::kRmdir)) return false;
  const std::string lost = c->KeepsRemoval(gate_us, path);
  if (lost.empty()) return false;
  LOG_WARN(
      "{} {} '{}' not applied: the backend keeps it, because it is ordered after entries lost with member {} "
      "(the backend's older `latest` may name it; docs/consistency.md, \"Removals ordered after what a lost node took "
      "with it\")",
      who, meta::LogOpName(op), EscapeName(path), lost);
  return true;
}

Status ApplyToBackend(backend::Backend* b, const LogEntry& e) {
  const backend::Attrs attrs{e.mode & 07777, e.uid, e.gid, e.has_owner, e.mtime.sec, e.mtime.nsec};
  switch (e.op) {
    case LogOp::kMkdir: return b->Mkdir(e.path, attrs);
    case LogOp::kRmdir: return b->Rmdir(e.path);
    case LogOp::kUnlink: return b->Remove(e.path);
    case LogOp::kRename: return b->Rename(e.path, e.path2, e.flags & 1);
    case LogOp::kSymlink: return b->Symlink(e.path, e.path2, attrs);
    case LogOp::kLink: return b->Link(e.path, e.path2);
    case LogOp::kSetattr: return b->SetAttr(e.path, attrs);
    case LogOp::kPersist: break;
  }
  return {};
}

int Drainer::ApplyNamespace(const LogEntry& e) {
  if (!Cleared(e)) return ECANCELED;
  if (WaitingForHolder(e.seq)) return EINPROGRESS;
  if (auto done = CompleteIfTaken(e)) return *done;  // taken over meanwhile (as in ApplyPersist)
  const std::optional<LogEntry> left = WhereHoldersLeftIt(e);
  if (!left) return CompleteLeft(e, nullptr);
  const LogEntry& at = *left;
  if (KeptForLost(cluster_, e.op, cluster_ ? cluster_->GateTime(e.seq).value_or(0) : 0, at.path,
                  "drain: seq " + std::to_string(e.seq))) {
    if (auto c = port_->CompleteEntry(e); !c) return c.error();
    MutexLock lk(&mu_);
    stats_.entries_applied++;
    return 0;
  }
  Status st = ApplyToBackend(backend_, at);
  // ENOENT: the entry names something whose bytes never reached the backend
  // (renamed or linked while still open, then sealed under the new name);
  // the later persist entry brings it. Replaying it is a no-op.
  if (!st && st.error() != ENOENT) return st.error();
  if (!st) LOG_DEBUG("drain: seq {} {} '{}': not in backend; nothing to do", e.seq, meta::LogOpName(e.op), e.path);
  if (auto c = port_->CompleteEntry(e); !c) return c.error();
  MutexLock lk(&mu_);
  stats_.entries_applied++;
  return 0;
}

bool Drainer::SkipUndoneMkdir(const LogEntry& e) {
  auto later = log_->Pending(kSkipLookahead);
  const std::string& dir = e.path;
  for (size_t j = 1; j < later.size(); j++) {
    const LogEntry& x = later[j];
    if ((x.op == LogOp::kRename || x.op == LogOp::kLink) &&
        (Under(x.path, dir) || Under(x.path2, dir) || Under(dir, x.path) || Under(dir, x.path2)))
      return false;  // something moved in or out: replay it all
    // Anything outside the directory in between would be seen by the
    // backend without the directory it had at that moment: replay it all.
    if (!Under(x.path, dir)) return false;
    if (x.op == LogOp::kRmdir && x.path == dir) {
      MutexLock lk(&mu_);
      for (size_t k = 1; k <= j; k++)
        if (Under(later[k].path, dir)) skip_.push_back(later[k].seq);
      return true;
    }
  }
  return false;
}

bool Drainer::SkipUndonePersist(const LogEntry& e, const std::vector<LogEntry>& window) {
  // Only when the very next entry undoes this one: then the backend goes
  // from the state before this version straight to the state after its
  // undoing, both moments of the mount's history. With anything in
  // between (a `latest` written after this checkpoint, say), skipping would
  // show the backend a state that never existed.
  // A name removed is the file removed only if it was the file's one name:
  // a hard-linked file (path2 lists its other names at the seal) lives on
  // under the others, and skipping its version left the backend's older
  // bytes there for good (and recovery then took them for the last seal;
  // issue #27 item 1, found again by fsstress).
  if (window.size() < 2 || window[0].seq != e.seq) return false;
  const LogEntry& x = window[1];
  const bool one_name = e.path2.empty();
  switch (x.op) {
    case LogOp::kPersist: return x.ino == e.ino && x.path == e.path;               // rewritten
    case LogOp::kUnlink: return one_name && x.path == e.path;                     // deleted
    case LogOp::kRename: return one_name && x.path2 == e.path && !(x.flags & 1);  // replaced by another file
    default: return false;
  }
}

void Drainer::NoteError(const LogEntry& e, int err) {
  MutexLock lk(&mu_);
  stats_.retries++;
  std::string msg = fmt::format("{} '{}': {}", meta::LogOpName(e.op), e.path, strerror(err));
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (!stats_.in_error) stats_.error_since = now;
  if (!stats_.in_error || stats_.last_error != msg) {
    LOG_ERROR("drain: seq {} {} (backend {}); retrying with backoff", e.seq, msg, backend_->Describe());
  }
  stats_.in_error = true;
  stats_.last_error = msg;
  stats_.last_error_time = now;
}

void Drainer::MarkUnreachable(const std::string& why) {
  MutexLock lk(&mu_);
  stats_.in_error = true;
  stats_.last_error = "unreachable at mount: " + why;
  stats_.last_error_time = stats_.error_since =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool Drainer::ProbeDue() {
  MutexLock lk(&mu_);
  return stats_.in_error && !read_only_noted_;
}

void Drainer::NoteSuccess() {
  backoff_ms_ = 0;
  MutexLock lk(&mu_);
  if (stats_.in_error) {
    LOG_INFO("drain: backend {} healthy again after {} retries", backend_->Describe(), stats_.retries);
    stats_.in_error = false;
  }
}

void Drainer::HoldReadOnly(const std::string& why) {
  MutexLock lk(&mu_);
  if (!read_only_noted_) {
    read_only_noted_ = true;
    LOG_ERROR("drain: stopped, {}: nothing more is applied to backend {}; the next mount resumes the drain", why,
              backend_->Describe());
    stats_.in_error = true;
    stats_.last_error = "drain stopped: " + why;
    stats_.last_error_time =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  SleepUntil(std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

void Drainer::Backoff() {
  backoff_ms_ = backoff_ms_ == 0 ? 100 : std::min(backoff_ms_ * 2, 10000);
  MutexLock lk(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms_);
  while (!stop_ && !kick_ && cv_.WaitUntil(&mu_, deadline)) {
  }
  kick_ = false;
}

}  // namespace ckpt::fs
