// drain_taken.cc — the drainer's side of a run back after replica holders
// took its entries over (issue #30; drain.h SkipTaken): entries they
// applied are completed unapplied, entries a live holder claimed are
// waited for, and entries they went past are applied where their later
// entries left the names (or not at all, if those removed them).
#include <sys/stat.h>

#include <chrono>
#include <limits>
#include <optional>

#include "common/config.h"
#include "common/log.h"
#include "fs/drain/drain.h"

namespace ckpt::fs {

using meta::LogEntry;
using meta::LogOp;

bool Drainer::IsTaken(uint64_t seq) {
  MutexLock lk(&mu_);
  return taken_.count(seq) > 0;
}

std::optional<int> Drainer::CompleteIfTaken(const LogEntry& e) {
  if (!IsTaken(e.seq)) return std::nullopt;
  LOG_INFO("drain: seq {} {} '{}': applied by a replica holder while this node was counted dead; not again", e.seq,
           meta::LogOpName(e.op), EscapeName(e.path));
  if (auto c = port_->CompleteEntry(e); !c) return c.error();  // still taken: the retry completes it
  MutexLock lk(&mu_);
  taken_.erase(e.seq);
  taken_entries_.erase(e.seq);
  stats_.entries_skipped++;
  return 0;
}

bool Drainer::WaitingForHolder(uint64_t seq) {
  // `seq` claimed and not marked; or not taken while a later seq is
  // claimed and not marked: its holder may be applying it now, a rename
  // that WhereHoldersLeftIt must see before `seq` is applied here.
  auto waits = [&] {
    mu_.AssertHeld();
    return claimed_taken_.count(seq) > 0 ||
           (!taken_.count(seq) && claimed_taken_.upper_bound(seq) != claimed_taken_.end());
  };
  {
    MutexLock lk(&mu_);
    if (!waits()) {
      stats_.holder_wait_seq = 0;
      return false;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  if (refresh_taken_ && now - refreshed_at_ >= std::chrono::milliseconds(500)) {
    refreshed_at_ = now;
    refresh_taken_();  // SkipTaken again, with what the holders say now
  }
  MutexLock lk(&mu_);
  const bool wait = waits();
  if (wait && stats_.holder_wait_seq != seq)  // once per entry waited at
    LOG_INFO(
        "drain: seq {} waits: a replica holder claimed it or a later entry while this node was counted dead, and "
        "has not said yet whether it applied it (status: drain.waits_for_holder_at_seq)",
        seq);
  stats_.holder_wait_seq = wait ? seq : 0;
  return wait;
}

void Drainer::SkipTaken(const std::vector<uint64_t>& seqs, const std::vector<uint64_t>& claimed) {
  auto head = log_->Pending(1);
  const uint64_t next = log_->next_seq();
  MutexLock lk(&mu_);
  claimed_taken_.clear();
  for (uint64_t seq : claimed)
    if (seq < next && !stale_taken_.count(seq)) claimed_taken_.insert(seq);
  for (uint64_t seq : seqs) {
    // A claim of a seq this log never reached: an entry of a tail the
    // metadata lost with the machine (its write-ahead log is not synced),
    // which the holders took over; the seq will be given to a new entry,
    // never to be skipped. Judged once for the process's life.
    if (seq >= next) stale_taken_.insert(seq);
    if (stale_taken_.count(seq) || head.empty() || seq < head.front().seq) continue;  // older: applied here before
    taken_.insert(seq);
  }
  cv_.NotifyAll();
}

namespace {

// Where a later entry `r` left `path`: moved (a rename of it or of a
// directory above it; an exchange), unchanged, or nullopt — removed or
// replaced (an unlink of it, an rmdir above it, a rename over it, a
// persist of another version at that name, a directory, symlink or link
// made there: in the log's order the name was free then, so what is there
// since is theirs, not the object this node's entry names — under a
// directory made again, what the backend kept stays this node's).
std::optional<std::string> LeftBy(const std::string& path, const LogEntry& r) {
  switch (r.op) {
    case LogOp::kRename:
      if (PathUnder(path, r.path)) return r.path2 + path.substr(r.path.size());
      if (PathUnder(path, r.path2)) {
        if (r.flags & 1) return r.path + path.substr(r.path2.size());  // an exchange
        return std::nullopt;
      }
      return path;
    case LogOp::kUnlink: return path == r.path ? std::nullopt : std::optional(path);
    case LogOp::kRmdir: return PathUnder(path, r.path) ? std::nullopt : std::optional(path);
    case LogOp::kPersist: return path == r.path ? std::nullopt : std::optional(path);
    // A mkdir over a directory the backend still holds (its removal given
    // up) keeps what is under it: only the name itself is theirs.
    case LogOp::kMkdir: return path == r.path ? std::nullopt : std::optional(path);
    case LogOp::kSymlink: return PathUnder(path, r.path) ? std::nullopt : std::optional(path);
    case LogOp::kLink: return PathUnder(path, r.path2) ? std::nullopt : std::optional(path);
    default: return path;
  }
}

// Where a later entry `r` left a persist's other names (`names`,
// NUL-separated, as path2 has them): one removed or replaced since is left
// out (the file lives on under the others).
std::string OtherNamesLeftBy(const std::string& names, const LogEntry& r) {
  std::string out;
  for (size_t at = 0; at <= names.size();) {
    size_t end = names.find('\0', at);
    if (end == std::string::npos) end = names.size();
    auto name = LeftBy(names.substr(at, end - at), r);
    if (name && !name->empty()) {
      if (!out.empty()) out.push_back('\0');
      out += *name;
    }
    at = end + 1;
  }
  return out;
}

// Whether `name` is one of `names` (NUL-separated, as a persist's path2).
bool HasName(const std::string& names, const std::string& name) {
  for (size_t at = 0; at <= names.size();) {
    size_t end = names.find('\0', at);
    if (end == std::string::npos) end = names.size();
    if (names.compare(at, end - at, name) == 0 && end > at) return true;
    at = end + 1;
  }
  return false;
}

// Where a later entry `r` left a rename's or a link's target: moved, or at
// its name still if removed or replaced there — reached so only by an
// exchange (a plain rename or link whose target was superseded is not
// applied there: SupersededTarget), whose target is an object of its own
// that later entries move like its source.
std::string TargetLeftBy(const std::string& target, const LogEntry& r) { return LeftBy(target, r).value_or(target); }

std::optional<LogEntry> SupersededTarget(const LogEntry& e, const std::string& source, const LogEntry& r) {
  // A directory's tree stays (no entry removes a tree); a link removes nothing.
  const bool removes = e.op == LogOp::kRename && !S_ISDIR(e.mode);
  LOG_WARN(
      "drain: seq {} {} '{}' -> '{}': a replica holder applied seq {} {} '{}' after it, in this node's place, "
      "over its target; not applied there{}",
      e.seq, meta::LogOpName(e.op), EscapeName(e.path), EscapeName(e.path2), r.seq, meta::LogOpName(r.op),
      EscapeName(r.path),
      removes                  ? fmt::format(" ('{}' removed, as the rename would)", EscapeName(source))
      : e.op == LogOp::kRename ? fmt::format(" (the directory '{}' stays in the backend)", EscapeName(source))
                               : "");
  if (!removes) return std::nullopt;
  LogEntry rm = e;
  rm.op = LogOp::kUnlink;
  rm.flags = 0;
  rm.path = source;
  rm.path2.clear();
  return rm;
}

}  // namespace

std::optional<LogEntry> Drainer::WhereHoldersLeftIt(const LogEntry& e) {
  std::vector<uint64_t> later;
  bool missing = false;
  {
    MutexLock lk(&mu_);
    for (auto it = taken_.upper_bound(e.seq); it != taken_.end(); ++it) {
      later.push_back(*it);
      missing = missing || !taken_entries_.count(*it);
    }
  }
  if (later.empty()) return e;
  // The holders went on past `e` (they gave it up, or never had it) and
  // applied later entries that this log still holds: the backend's names
  // are where those left them. At its logged name a file would stay where
  // a rename had moved its directory from, or replace what a later entry
  // put there (the holders' entries are not applied again). The log is
  // read once for each new set of taken entries, not for each entry.
  if (missing) {
    auto all = log_->Pending(std::numeric_limits<size_t>::max());
    MutexLock lk(&mu_);
    for (const LogEntry& r : all)
      if (taken_.count(r.seq)) taken_entries_.emplace(r.seq, r);
  }
  LogEntry moved = e;
  std::optional<LogEntry> over;  // the first of their entries that removed or replaced e's target
  for (uint64_t seq : later) {
    LogEntry r;
    {
      MutexLock lk(&mu_);
      auto it = taken_entries_.find(seq);
      if (it == taken_entries_.end()) continue;
      r = it->second;
    }
    if (e.op == LogOp::kPersist && r.op == LogOp::kPersist && r.ino == e.ino) {
      LOG_INFO("drain: seq {} persist '{}' v{}: a replica holder published v{} of it after it; superseded, not applied",
               e.seq, EscapeName(e.path), e.version, r.version);
      return std::nullopt;  // (the holder published it at its main name only: its other names keep older bytes)
    }
    if (e.op == LogOp::kPersist) {
      moved.path2 = OtherNamesLeftBy(moved.path2, r);
      // A link of theirs made after it names this file too (they found no
      // file there, ENOENT, taken as done, or an older version): linked
      // there with its other names.
      if (r.op == LogOp::kLink && r.ino == e.ino && r.path2 != moved.path && !HasName(moved.path2, r.path2))
        moved.path2 += (moved.path2.empty() ? "" : std::string(1, '\0')) + r.path2;
    }
    auto path = LeftBy(moved.path, r);
    if (!path && e.op == LogOp::kPersist && !moved.path2.empty()) {
      // Its name removed or replaced, the file lives on under another
      // (a hard link): published there.
      const size_t nul = moved.path2.find('\0');
      moved.path = moved.path2.substr(0, nul);
      moved.path2 = nul == std::string::npos ? std::string() : moved.path2.substr(nul + 1);
      continue;
    }
    if (!path) {
      LOG_INFO(
          "drain: seq {} {} '{}': a replica holder applied seq {} {} '{}' after it, in this node's place; "
          "superseded, not applied",
          e.seq, meta::LogOpName(e.op), EscapeName(e.path), r.seq, meta::LogOpName(r.op), EscapeName(r.path));
      return std::nullopt;
    }
    moved.path = std::move(*path);
    // A rename or link whose target they removed or put another file at:
    // applied now it would put this older file over theirs (a `latest`
    // renamed back a checkpoint). What is left of a rename is its source's
    // removal, where their later entries left the source (followed on: one
    // that put a new file there supersedes the removal too, above). An
    // exchange keeps both names: moved.
    const bool two_names = e.op == LogOp::kRename || e.op == LogOp::kLink;
    const bool names_target = two_names && !(e.flags & 1);
    if (names_target && !over && !LeftBy(moved.path2, r)) over = r;
    if (two_names && !over) moved.path2 = TargetLeftBy(moved.path2, r);
  }
  if (over) return SupersededTarget(e, moved.path, *over);
  if (moved.path != e.path)
    LOG_INFO(
        "drain: seq {} {} '{}': applied here, not by a replica holder, after the holders applied later entries; "
        "at '{}', where they left it",
        e.seq, meta::LogOpName(e.op), EscapeName(e.path), EscapeName(moved.path));
  return moved;
}

int Drainer::CompleteTaken(const LogEntry& e, const std::shared_ptr<Job>& job) {
  if (!job->staged.token.empty()) {  // staged before it was known taken
    backend_->Abort(job->staged);
    MutexLock lk(&mu_);
    job->staged.token.clear();  // a retry of the completion aborts nothing twice
  }
  LOG_INFO(
      "drain: seq {} persist '{}' v{}: published by a replica holder while this node was counted dead; "
      "not published again",
      e.seq, EscapeName(e.path), e.version);
  if (auto st = port_->CompletePersist(e, job->staged, job->src.gen); !st) return st.error();
  MutexLock lk(&mu_);
  taken_.erase(e.seq);
  taken_entries_.erase(e.seq);
  jobs_.erase(e.seq);
  stats_.entries_skipped++;
  return 0;
}

int Drainer::CompleteLeft(const LogEntry& e, const std::shared_ptr<Job>& job) {
  if (job && job->err == 0) {  // staged (or hashed) for nothing
    if (!job->staged.token.empty()) backend_->Abort(job->staged);
    port_->AbortPersist(e);
  }
  if (auto st = port_->CompleteEntry(e); !st) return st.error();
  MutexLock lk(&mu_);
  jobs_.erase(e.seq);
  stats_.entries_skipped++;
  return 0;
}

}  // namespace ckpt::fs
