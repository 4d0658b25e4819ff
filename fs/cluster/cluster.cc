// cluster.cc — samples, gate times, records and the publish rule of
// cluster.h. The design and what it promises: docs/consistency.md
// "Cross-node ordering (--cluster)".
#include "fs/cluster/cluster.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <utility>

#include "common/log.h"

namespace ckpt::fs {

using Json = nlohmann::json;

namespace {

constexpr size_t kRecordPaths = 1000;  // unpersisted paths named in a record
// ...and their bytes at most: a record must fit the store (backend::kMaxRecordBytes), a path may be
// of any length on a POSIX backend, and a control byte takes 6 as JSON.
constexpr size_t kRecordPathBytes = 128 * 1024;
constexpr int64_t kUsPerMs = 1000;      // options are in ms, times in µs
constexpr int64_t kBusyUs = 2000 * kUsPerMs;
constexpr int64_t kDigestHeartbeats = 60;  // with etcd: a record at least every 60 heartbeats (30 s)
// With etcd, a record travels in the digest: fewer paths.
constexpr size_t kDigestRecordPaths = 8,
                 kDigestRecordPathBytes = 2048;  // records every tick this long after another member had files pending
// Version 2 keeps µs; version 1 (before gate times were µs) kept ms.
constexpr char kSamplesMagic[] = "ckptfs-cluster-samples 2";
constexpr char kSamplesMagicMs[] = "ckptfs-cluster-samples 1";
// The latest sample time (KeepAlive): µs in STATE_DIR/cluster-samples.alive-us,
// ms in .alive where version 1 kept it.
constexpr char kAliveSuffix[] = ".alive-us";
constexpr char kAliveMsSuffix[] = ".alive";

class BackendRecordStore final : public RecordStore {
 public:
  BackendRecordStore(backend::Backend* be, std::string name) : be_(be), name_(std::move(name)) {}
  Status Put(const std::string& node, const std::string& bytes) override { return be_->PutRecord(name_, node, bytes); }
  Result<std::vector<std::pair<std::string, std::string>>> List() override { return be_->ListRecords(name_); }

 private:
  backend::Backend* const be_;
  const std::string name_;
};

}  // namespace

bool ValidClusterName(const std::string& s) {
  if (s.empty() || s.size() > 64 || !isalnum(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; });
}

std::unique_ptr<RecordStore> BackendRecords(backend::Backend* be, std::string name) {
  return std::make_unique<BackendRecordStore>(be, std::move(name));
}

int64_t Cluster::WallClockUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Cluster::Cluster(ClusterOptions o, RecordStore* store, LogView* log, std::string samples_path, Clock clock)
    : opt_(std::move(o)), store_(store), log_(log), samples_path_(std::move(samples_path)), clock_(std::move(clock)) {
  reduces_ = store_->Digest().has_value();
}

Cluster::~Cluster() {
  Stop();
  if (alive_fd_ >= 0) close(alive_fd_);
}

void Cluster::Init() {
  LoadSamples();
  Sample();
  MutexLock lk(&mu_);
  self_.node = opt_.node;
  self_.state = "live";
}

bool Cluster::Join() {
  Heartbeat();
  MutexLock lk(&mu_);
  return BlockedLocked().empty();
}

void Cluster::Start() {
  sampler_ = std::thread([this] {
    for (;;) {
      {
        MutexLock lk(&mu_);
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.sample_ms);
        while (!stop_ && cv_.WaitUntil(&mu_, until)) {
        }
        if (stop_) return;
      }
      try {
        Sample();
      } catch (const std::exception& e) {
        LOG_ERROR("cluster: internal error in the sampler: {}", e.what());
      }
    }
  });
  heart_ = std::thread([this] {
    for (;;) {
      try {
        Tick();
      } catch (const std::exception& e) {
        LOG_ERROR("cluster: internal error in the heartbeat: {}", e.what());
      }
      MutexLock lk(&mu_);
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.tick_ms);
      while (!stop_ && !poked_ && cv_.WaitUntil(&mu_, until)) {
      }
      if (stop_) return;
      poked_ = false;
    }
  });
}

void Cluster::Poke() {
  // Only with a store that reduces (etcd): a record there is one put. With
  // the backend's records a write is a PUT plus a read of every record
  // (ListRecords), so those stay at one a tick however fast the drain goes.
  if (!reduces_) return;
  {
    MutexLock lk(&mu_);
    poked_ = true;
  }
  cv_.NotifyAll();
}

void Cluster::Stop() {
  {
    MutexLock lk(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (sampler_.joinable()) sampler_.join();
  if (heart_.joinable()) heart_.join();
}

void Cluster::Sample() {
  // pre before the clock, post after it: entries <= pre were logged before
  // t (gate times), every entry logged before t is <= post (watermark).
  const uint64_t pre = log_->LoggedSeq();
  int64_t t = clock_();
  const uint64_t post = log_->LoggedSeq();
  const uint64_t applied = log_->AppliedSeq();
  // The exact times of the entries this sample sees first (<= pre).
  uint64_t from;
  {
    MutexLock lk(&mu_);
    from = std::max(timed_, applied) + 1;
  }
  auto times = from <= pre ? log_->LoggedTimes(from, pre) : std::vector<std::pair<uint64_t, int64_t>>{};
  bool changed = false;
  {
    MutexLock lk(&mu_);
    if (!samples_.empty()) t = std::max(t, samples_.back().t);  // a clock stepped back: never backwards
    if (from <= pre && timed_ < pre) {
      // Never later than this sample, the first to see them (so it is with
      // one wall clock; with a test's clock beside the table's real one,
      // the sample's time stands).
      for (const auto& [seq, at] : times)
        if (seq > timed_) exact_[seq] = std::min(at, t);
      timed_ = pre;
    }
    const size_t n = samples_.size();
    // A run of samples that saw the same log: its first (gate times) and
    // its last (watermark) are all that is ever asked of it.
    if (n >= 2 && samples_[n - 1].pre == pre && samples_[n - 1].post == post && samples_[n - 2].pre == pre &&
        samples_[n - 2].post == post) {
      samples_[n - 1].t = t;
    } else {
      samples_.push_back({t, pre, post});
      changed = true;
    }
    applied_ = std::max(applied_, applied);
    size_t before = samples_.size();
    Prune(applied_);
    changed = changed || samples_.size() != before;
    samples_changed_ = samples_changed_ || changed;
  }
  // Kept at once, not at the next heartbeat: entries logged after the
  // samples kept get, at a restart, a time derived from the last one kept
  // (LoadSamples), so the window must be one sample period, not a heartbeat
  // (a 500 ms window let a restarted node's shards pass for newer than
  // another node's `latest`: seed 103 of the multi-node crash harness).
  KeepSamples();
  KeepAlive(t);
}

void Cluster::Prune(uint64_t applied) {
  exact_.erase(exact_.begin(), exact_.upper_bound(applied));
  // Needed: the newest sample with post <= applied (the watermark), and
  // those with pre > applied (gate times of the pending entries). The
  // newest sample is kept in any case: it is the record's T.
  std::deque<SampleRec> kept;
  ssize_t w = -1;
  for (size_t i = 0; i < samples_.size(); i++)
    if (samples_[i].post <= applied) w = static_cast<ssize_t>(i);
  for (size_t i = 0; i < samples_.size(); i++)
    if (static_cast<ssize_t>(i) == w || samples_[i].pre > applied || i + 1 == samples_.size()) kept.push_back(samples_[i]);
  samples_.swap(kept);
}

std::optional<int64_t> Cluster::GateLocked(uint64_t seq) {
  // When it was logged, if a sample saw it with its time; else the first
  // sample that saw it (an upper bound, at most a sample period late).
  if (auto it = exact_.find(seq); it != exact_.end()) return it->second;
  for (const SampleRec& s : samples_)
    if (s.pre >= seq) return s.t;
  return std::nullopt;
}

int64_t Cluster::WatermarkLocked(uint64_t applied) {
  int64_t w = 0;
  for (const SampleRec& s : samples_)
    if (s.post <= applied) w = s.t;
  return w;
}

std::optional<int64_t> Cluster::GateTime(uint64_t seq) {
  MutexLock lk(&mu_);
  return GateLocked(seq);
}

int64_t Cluster::Watermark() {
  MutexLock lk(&mu_);
  return WatermarkLocked(applied_);
}

size_t Cluster::SampleCount() {
  MutexLock lk(&mu_);
  return samples_.size();
}

std::pair<std::string, int64_t> Cluster::MakeRecord(const std::string& state) {
  // How far this node's log is applied where a machine crash cannot undo
  // it (a sync of the metadata when the drain applied more since the last;
  // no lock held): the others act on the record's applied_seq, so it goes
  // no further (fs/cluster/log_view.h).
  const uint64_t durable = log_->DurableAppliedSeq();
  const size_t max_paths = reduces_ ? kDigestRecordPaths : kRecordPaths;
  // With replicas the paths named are those at risk: the first pass only counts.
  auto [count, paths] = log_->Unpersisted(replicated_ ? 0 : max_paths);
  // What this node's loss would lose: the files not replicated K times
  // (with --replicas; else every unpersisted one), named in the record so
  // that a lost member's lost list is not the files its holders publish.
  uint64_t at_risk = count;
  if (replicated_) std::tie(at_risk, paths) = log_->AtRisk(max_paths, replicated_);
  // Dead members' replicas this node is to publish in their place: no
  // other copy is known (their writer is gone), so they are lost with this
  // node, and its record says so — a loss of writer and holder both was
  // named nowhere, and no lost window kept the removals after them.
  const HeldForOthers held = held_gate_ ? held_gate_(true) : HeldForOthers{};
  at_risk += held.dead_files;
  for (const std::string& p : held.dead_paths)
    if (paths.size() < max_paths) paths.push_back(p);
  const size_t max_bytes = reduces_ ? kDigestRecordPathBytes : kRecordPathBytes;
  size_t keep = 0, bytes = 0;
  while (keep < paths.size() && bytes + paths[keep].size() <= max_bytes) bytes += paths[keep++].size();
  paths.resize(keep);
  Record r;
  const uint64_t unsafe_from = unsafe_from_ ? unsafe_from_() : 0;  // 0: every pending entry
  uint64_t applied = 0;
  {
    MutexLock lk(&mu_);
    applied = applied_;
    const SampleRec& s = samples_.back();  // never empty after Init
    r.node = opt_.node;
    r.incarnation = opt_.incarnation;
    r.state = state;
    r.heartbeat_us = s.t;
    r.watermark_us = WatermarkLocked(applied_);
    // Every entry logged before T is <= s.post; those above `applied_`
    // are pending, the oldest is applied_ + 1. Its gate, or T while no
    // sample has seen it yet (its gate is later: T errs on the safe side).
    if (applied_ < s.post) r.oldest_gate_us = GateLocked(applied_ + 1).value_or(s.t);
    if (held.gate && (!r.oldest_gate_us || *held.gate < *r.oldest_gate_us)) r.oldest_gate_us = held.gate;
    written_held_ = {held.gate, held.dead_gate, held.dead_files, {}};
    // U: the oldest entry no other member holds a copy of (the replicas'
    // own, not those held here for others). A loss of this node begins there.
    if (const uint64_t u = std::max(applied_ + 1, unsafe_from); u <= s.post)
      r.unsafe_gate_us = GateLocked(u).value_or(s.t);
    if (held.dead_gate && (!r.unsafe_gate_us || *held.dead_gate < *r.unsafe_gate_us)) r.unsafe_gate_us = held.dead_gate;
    written_unsafe_from_ = AtRiskFrom(unsafe_from, s.post), written_logged_ = s.post;
    r.unpersisted = count;
    r.at_risk = at_risk;
    r.paths = std::move(paths);
    // The records it refuses, so that their writers learn it (a member
    // whose clock is ahead publishes nothing while another refuses it).
    for (const Record& x : refused_)
      if (r.refused.size() < opt_.max_refused) r.refused.emplace_back(x.node, x.heartbeat_us);
    self_ = r;
  }
  // Version 2: times in µs; the ms fields of version 1 stay beside them,
  // for members still running it (they read those; truncated, they err
  // early, on the safe side, as below).
  auto ms = [](int64_t us) { return us / kUsPerMs; };
  Json refused = Json::array();
  for (const auto& [node, heartbeat_us] : r.refused) refused.push_back({{"node", node}, {"heartbeat_us", heartbeat_us}});
  Json j = {{"version", 2},
            {"cluster", opt_.name},
            {"node", r.node},
            {"state", r.state},
            {"heartbeat_us", r.heartbeat_us},
            {"watermark_us", r.watermark_us},
            {"oldest_gate_us", r.oldest_gate_us ? Json(*r.oldest_gate_us) : Json(nullptr)},
            {"unsafe_gate_us", r.unsafe_gate_us ? Json(*r.unsafe_gate_us) : Json(nullptr)},
            {"heartbeat_ms", ms(r.heartbeat_us)},
            {"watermark_ms", ms(r.watermark_us)},
            {"oldest_gate_ms", r.oldest_gate_us ? Json(ms(*r.oldest_gate_us)) : Json(nullptr)},
            {"unpersisted", r.unpersisted},
            {"at_risk", r.at_risk},
            {"paths", r.paths},
            {"refused", refused}};
  if (!r.incarnation.empty()) j["incarnation"] = r.incarnation;
  // What a holder of this node's replicas drops them by (Takeover): a log
  // position stays exact across a restart, the gate times of recovered
  // entries do not. Never beyond `durable`: a sync that failed leaves the
  // samples' applied seq ahead of it.
  j["applied_seq"] = std::min(applied, durable);
  return {j.dump(-1, ' ', false, Json::error_handler_t::replace), r.heartbeat_us};
}

void Cluster::Tick() {
  const int64_t now = clock_();
  const uint64_t applied = log_->AppliedSeq();
  // A replica held for another node came or went (SetHeldGate): the others wait on this record's gate, so it
  // is written at once; so is each entry at risk (AtRiskFrom: the first, 0 if none; and each after it).
  const HeldForOthers held = held_gate_ ? held_gate_(true) : HeldForOthers{};
  const uint64_t logged = log_->LoggedSeq(), unsafe_from = unsafe_from_ ? AtRiskFrom(unsafe_from_(), logged) : 0;
  bool write = false, read = false;
  {
    MutexLock lk(&mu_);
    const bool risk = unsafe_from != written_unsafe_from_ || (unsafe_from != 0 && logged > written_logged_);
    // Busy: another member had files pending at the last read, so it may
    // wait for a record of this node newer than its files' gates. The
    // drain waits for an entry that this node's record in the store does
    // not name yet (or the store lost that record): it is written now, not
    // at the next heartbeat. After a failed write or read, the next try
    // waits for the heartbeat.
    if (reduces_) {
      // Membership is the lease: a record is written when it changes what
      // another member may do — entries applied (its oldest pending gate
      // moved: members with later entries wait for that; skipping it while
      // no other member seemed to wait stalled a 200-member run), an entry
      // its record does not name yet — or when a pending entry of another
      // member needs a record of this node newer than its gate + skew; at
      // most one a tick. Else every kDigestHeartbeats heartbeats (a few a
      // minute), and after a failed write every heartbeat: O(1) records a
      // node per checkpoint and file, not one a tick.
      // Not standing (a lease lost, the record not put under the new one):
      // written every heartbeat, as after a failed write — the drain holds
      // until it is (a rejoin waited the 30 s of kDigestHeartbeats).
      const bool standing = store_->Standing().empty();
      write = now - last_write_ >=
                  opt_.heartbeat_ms * kUsPerMs * (write_error_.empty() && standing ? kDigestHeartbeats : 1) ||
              (write_error_.empty() && (applied != written_applied_ || !SameHeld(held, written_held_) || risk ||
                                        (waiting_ && wait_gate_ > stored_us_) ||
                                        (need_us_ > stored_us_ && now >= need_us_) || BatonDueLocked()));
    } else {
      write = now - last_write_ >= opt_.heartbeat_ms * kUsPerMs ||
              (write_error_.empty() && read_error_.empty() &&
               (applied != written_applied_ || !SameHeld(held, written_held_) || risk || now < busy_until_ ||
                self_missing_ || (waiting_ && wait_gate_ > stored_us_)));
    }
    read = waiting_ || reduces_;  // a digest is read from memory: no request
  }
  std::pair<const void*, int64_t> before;
  {
    MutexLock lk(&mu_);
    before = {digest_view_.get(), stored_us_};
  }
  if (write) {
    Heartbeat();
  } else if (read) {
    ReadRecords();
  }
  bool changed;
  {
    MutexLock lk(&mu_);
    changed = before != std::pair<const void*, int64_t>{digest_view_.get(), stored_us_};
  }
  if (changed && on_change_) on_change_();
}

void Cluster::Heartbeat() {
  const int64_t now = clock_();
  const uint64_t applied = log_->AppliedSeq();
  Sample();
  KeepSamples();
  {
    MutexLock lk(&mu_);
    last_write_ = now;
    written_applied_ = applied;
  }
  auto [rec, t] = MakeRecord("live");
  std::optional<Handoff> handoff;
  {
    MutexLock lk(&mu_);
    written_ = rec;
    if (BatonDueLocked()) handoff = HandOnLocked(rec);
  }
  if (auto st = handoff ? store_->PutHanding(opt_.node, rec, *handoff) : store_->Put(opt_.node, rec); !st) {
    // The store holds an older record of this node, or none: the others
    // cannot see the entries logged since. MayPublish says no until a
    // write succeeds.
    std::string msg = store_->LastError();
    if (msg.empty()) msg = std::string("writing this node's record: ") + strerror(st.error());
    MutexLock lk(&mu_);
    if (write_error_ != msg) LOG_WARN("cluster {}: {} (retried every heartbeat)", opt_.name, msg);
    write_error_ = msg;
    return;
  }
  {
    MutexLock lk(&mu_);
    if (!write_error_.empty()) LOG_INFO("cluster {}: this node's record written again", opt_.name);
    write_error_.clear();
    stored_us_ = t;
    self_missing_ = false;
    if (handoff) baton_.reset();
  }
  ReadRecords();
}

bool Cluster::Dead(const Record& r, int64_t now) const {
  // With etcd a member is live while its lease is: the digest names no other.
  return !reduces_ && r.state == "live" && now - r.heartbeat_us > opt_.member_timeout_ms * kUsPerMs;
}

void Cluster::ReadRecords() {
  if (reduces_) {
    // This node's last turn, also when a newer summary followed it: it may hand this node a baton.
    const std::string turn = store_->Turn(), digest = store_->Digest().value_or("");
    bool turn_new;
    {
      MutexLock lk(&mu_);
      turn_new = std::exchange(turn_read_, turn) != turn;
    }
    if (turn_new && !turn.empty() && turn != digest) ReadDigest(turn);
    ReadDigest(digest);
    return;
  }
  // The time before the listing: a member whose first record was written
  // before it is in the list (POSIX and S3 read their own writes).
  const int64_t read_at = clock_();
  auto list = store_->List();
  const int64_t now = clock_();
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  MutexLock lk(&mu_);
  if (!list) {
    std::string msg = std::string("reading the members' records: ") + strerror(list.error());
    if (read_error_ != msg) LOG_WARN("cluster {}: {} (retried every heartbeat)", opt_.name, msg);
    read_error_ = msg;
    return;
  }
  if (!read_error_.empty()) LOG_INFO("cluster {}: records readable again", opt_.name);
  read_error_.clear();
  std::vector<Record> others, refused;
  std::map<std::string, std::string> unused;  // node -> why its record is not used
  bool self_seen = false;
  for (const auto& [name, bytes] : *list) {
    if (name == opt_.node) {
      // Ours, as we wrote it last, unless another mount uses this node id
      // (each overwrites the other's record: the others see one member).
      self_seen = true;
      if (!written_.empty() && bytes != written_ && !clash_noted_) {
        clash_noted_ = true;
        LOG_ERROR("cluster {}: another mount writes records as node {}; give each mount its own --node", opt_.name,
                  opt_.node);
      }
      continue;
    }
    Record r;
    const std::string problem = ParseRecord(name, bytes, now, &r);
    if (problem == "unreadable") {
      unused[name] = problem;
      continue;
    }
    if (!problem.empty()) {
      const int64_t ahead = std::max({r.heartbeat_us, r.watermark_us, r.oldest_gate_us.value_or(0)}) - now;
      if (refused_noted_.emplace(name, r.problem).second)
        LOG_ERROR("cluster {}: the record of {} is refused: its times lie {:.3f} s in this node's future, beyond "
                  "--max-clock-skew ({} ms): its writer's clock is ahead, or no member wrote it; it is no member "
                  "(its {} files not persisted are not waited for) until its times are no longer ahead",
                  opt_.name, name, static_cast<double>(ahead) / (1000 * kUsPerMs), opt_.max_skew_ms, r.unpersisted);
      unused[name] = problem;
      refused.push_back(std::move(r));
      continue;
    }
    if (refused_noted_.erase(name)) LOG_INFO("cluster {}: the record of {} is accepted again", opt_.name, name);
    others.push_back(std::move(r));
  }
  // A live member read before whose record is now gone, unreadable or
  // refused: not a member with nothing pending. Its last record read stands
  // (and holds the others) until it is dead by that record's heartbeat;
  // its files are then listed as lost.
  // A record of the same id from another incarnation (a new machine that
  // mounted with a new state dir under a dead node's id) replaces the
  // file, not the dead run: its last record stands the same way.
  for (Record& old : others_) {
    if (old.state != "live") continue;
    auto now_there = std::find_if(others.begin(), others.end(), [&](const Record& r) { return r.node == old.node; });
    if (now_there != others.end() && SameIncarnation(now_there->incarnation, old.incarnation)) continue;
    auto why = unused.find(old.node);
    std::string problem = now_there != others.end() ? "replaced by a new run (" + now_there->incarnation + ")"
                          : why == unused.end()     ? "missing"
                                                    : why->second;
    // One read can catch a record mid-replacement where a PUT is not
    // atomic for readers (the test server renames an object's metadata and
    // its bytes one after the other: seen in a busy run); the next
    // heartbeat's read finds it whole. Found three times in a row (twice
    // was seen in CI: a busy member rewrites it every 100 ms), it is warned of.
    if (old.problem.empty()) old.problem_reads = 0;
    old.problem_reads++;
    if (old.problem_reads <= 3) {
      const std::string msg = fmt::format(
          "cluster {}: the record of member {} is {}{}; its last one read (heartbeat {:.1f} s ago, {} files not "
          "persisted) stands until the member is back or dead",
          opt_.name, old.node, problem, old.problem_reads == 3 ? " on three reads in a row" : "",
          static_cast<double>(now - old.heartbeat_us) / (1000 * kUsPerMs), old.unpersisted);
      if (old.problem_reads == 3) LOG_WARN("{}", msg);
      else LOG_DEBUG("{}", msg);
    }
    old.problem = problem;
    others.push_back(std::move(old));
  }
  std::string refused_by;
  for (const Record& r : others) {
    auto noted = std::find(dead_noted_.begin(), dead_noted_.end(), NotedName(r));
    if (Dead(r, now) && noted == dead_noted_.end()) {
      LOG_WARN("cluster {}: member {} is dead (no heartbeat for {} s); {}", opt_.name, r.node,
               (now - r.heartbeat_us) / (1000 * kUsPerMs), LostFilesText(r.unpersisted, r.at_risk, r.paths));
      dead_noted_.push_back(NotedName(r));
    } else if (!Dead(r, now) && noted != dead_noted_.end()) {
      LOG_INFO("cluster {}: member {} is back ({})", opt_.name, r.node, r.state);
      dead_noted_.erase(noted);
    }
    if (r.state != "live") continue;
    if (r.oldest_gate_us && !Dead(r, now)) busy_until_ = now + kBusyUs;
    // A member refuses a record of this node written within the member
    // timeout: this node's clock is ahead of that member's. Not only a
    // member live by this node's clock: a clock ahead by more than the
    // member timeout sees every member dead. A refusal of an older record
    // (a member stopped long ago, a forged one) refuses nothing.
    for (const auto& [node, heartbeat_us] : r.refused)
      if (refused_by.empty() && node == opt_.node && heartbeat_us >= now - opt_.member_timeout_ms * kUsPerMs &&
          heartbeat_us <= now + skew)
        refused_by = r.node;
  }
  if (refused_by != refused_by_) {
    if (!refused_by.empty())
      LOG_ERROR("cluster {}: member {} refuses this node's records: this node's clock is ahead of its by more than "
                "--max-clock-skew ({} ms); this node publishes nothing until no member refuses it (its files stay "
                "in memory): fix the clocks (NTP)",
                opt_.name, refused_by, opt_.max_skew_ms);
    else
      LOG_INFO("cluster {}: no member refuses this node's records any more", opt_.name);
    refused_by_ = refused_by;
  }
  // This node's record written, yet not in the store: the others do not
  // see it (removed behind the daemon's back). Written again at once
  // (Tick); until then MayPublish says no.
  const bool missing = !self_seen && stored_us_ > 0;
  if (missing && !self_missing_)
    LOG_WARN("cluster {}: this node's record is missing from the store; writing it again", opt_.name);
  self_missing_ = missing;
  refused_ = std::move(refused);
  others_ = std::move(others);
  read_at_ = std::max(read_at_, read_at);
  NoteLostLocked(now);
}

std::string Cluster::BlockedLocked() const {
  if (stored_us_ == 0)
    return write_error_.empty() ? "not joined: this node's first record is not written yet"
                                : "not joined: this node's first record cannot be written (" + write_error_ + ")";
  if (!write_error_.empty())
    return "this node's record in the store is out of date, the last write failed (" + write_error_ +
           "): the others cannot see its newer files";
  if (self_missing_) return "this node's record is missing from the store (written again at the next tick)";
  if (!refused_by_.empty())
    return "member " + refused_by_ + " refuses this node's records: this node's clock is ahead of its by more than " +
           "--max-clock-skew";
  // The others may count this node dead whatever its last write said: what
  // it publishes now may come after what they publish in its absence.
  return store_->Standing();
}

bool Cluster::MayPublish(uint64_t seq) {
  const int64_t now = clock_();
  const int64_t held = held_gate_ ? held_gate_(false).gate.value_or(0) : 0;  // taken before mu_ (the store's lock)
  MutexLock lk(&mu_);
  std::vector<std::string> blockers;
  auto g = GateLocked(seq);
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  const std::string blocked = BlockedLocked();
  if (blocked.empty() != blocked_noted_.empty()) {  // one line per episode, not per poll
    if (!blocked.empty())
      LOG_WARN("cluster {}: the drain holds ({}); files stay in memory until this node's record is in the store",
               opt_.name, blocked);
    else
      LOG_INFO("cluster {}: this node's record is in the store; the drain goes on", opt_.name);
  }
  blocked_noted_ = blocked;
  if (!blocked.empty()) {
    // The others cannot wait for what they cannot read: this node's record
    // must be in the store (and accepted) before anything of it passes.
    blockers.push_back("(this node's record)");
  } else if (!g) {
    blockers.push_back("(this node's next sample)");
  } else if (stored_us_ < *g) {
    // The record in the store must name this entry (pending, or an older
    // one) before it is published: what the others read of this node is
    // never behind what it published.
    blockers.push_back("(this node's next record)");
  } else if (held > 0 && held <= *g) {
    // A replica held here of another node's file closed before this one
    // (held = its gate + 1): it reaches the backend first, through its
    // writer or, if that writer died, through this node (takeover.h).
    blockers.push_back("(a replica held here of another node's earlier file)");
  } else if (BatonPermitsLocked(*g)) {  // the elected member checked the others, the baton those before
  } else if (read_at_ < *g + skew) {
    // A member that joined after the last read, and closed a file before
    // this entry, must be seen first: it wrote its first record before it
    // served any write.
    blockers.push_back("(this node's next read of the records)");
  } else {
    for (const Record& r : others_) {
      if (r.state != "live" || Dead(r, now)) continue;
      // Its record must be newer than this entry's close (on its clock,
      // which may be max_skew_ms behind ours), and show nothing pending
      // that comes first in (gate, node) order.
      if (r.heartbeat_us < *g + skew ||
          (r.oldest_gate_us && (*r.oldest_gate_us < *g || (*r.oldest_gate_us == *g && r.node < opt_.node))))
        blockers.push_back(r.node);
    }
  }
  if (blockers.empty()) {
    waiting_ = false;
    return true;
  }
  if (!waiting_ || wait_seq_ != seq) wait_since_ = now;
  waiting_ = true;
  wait_seq_ = seq;
  wait_gate_ = g.value_or(0);
  waiting_for_ = std::move(blockers);
  return false;
}

void Cluster::NoteLostLocked(int64_t now) {
  // A member with entries not replicated when it died: its record's U
  // (backend records: dead by its heartbeat; etcd: named lost by the digest).
  // What it logged after its last record (T) is not known: lost from T on
  // if that record named nothing unreplicated.
  for (const Record& r : others_)
    if ((r.oldest_gate_us || r.unpersisted > 0) && Dead(r, now))
      lost_windows_.Note(r.node, r.unsafe_gate_us.value_or(r.heartbeat_us), now);
  for (const Record& r : digest_lost_) lost_windows_.Note(r.node, r.unsafe_gate_us.value_or(r.heartbeat_us), now);
}

std::string Cluster::KeepsRemoval(int64_t gate_us, const std::string& path) {
  const int64_t now = clock_();
  MutexLock lk(&mu_);
  // The rule may have let the removal pass on a member's death that no
  // read has noted yet (Dead is by the clock): noted now, learned now.
  NoteLostLocked(now);
  return lost_windows_.Keeps(gate_us, path);
}

bool Cluster::MayPublishAs(int64_t gate_us, const std::string& node) {
  const int64_t now = clock_();
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  MutexLock lk(&mu_);
  if (!BlockedLocked().empty() || read_at_ < gate_us + skew) return false;
  // This node's own entries come first too: others_ never holds this
  // node's record, and a holder's shard closed before the dead writer's
  // `latest` must reach the backend before it. A sample at or after
  // gate_us sees every own entry logged before it; the oldest pending one
  // before gate_us holds the publish back. At the same gate the replica
  // goes first: MayPublish holds an own entry at or after what is held
  // here (gate_us is that held gate, the writer's + 1 µs), and a tie
  // broken the other way here would hold both for ever.
  const SampleRec& s = samples_.back();
  if (s.t < gate_us) return false;
  if (applied_ < s.post && GateLocked(applied_ + 1).value_or(s.t) < gate_us) return false;
  for (const Record& r : others_) {
    if (r.state != "live" || Dead(r, now) || r.node == node) continue;
    if (r.heartbeat_us < gate_us + skew ||
        (r.oldest_gate_us && (*r.oldest_gate_us < gate_us || (*r.oldest_gate_us == gate_us && r.node < node))))
      return false;
  }
  return true;
}

void Cluster::ClearWait() {
  MutexLock lk(&mu_);
  waiting_ = false;
}

bool Cluster::Leave() {
  Sample();
  {
    MutexLock lk(&mu_);
    if (applied_ < samples_.back().post) return false;
  }
  std::string rec = MakeRecord("left").first;
  if (auto st = store_->Put(opt_.node, rec); !st) {
    LOG_WARN("cluster {}: cannot write this node's last record (left): {}; the others will see it dead after {} s",
             opt_.name, strerror(st.error()), opt_.member_timeout_ms / 1000);
    return false;
  }
  return true;
}

ClusterStatus Cluster::Status() {
  const int64_t now = clock_();
  MutexLock lk(&mu_);
  ClusterStatus s;
  s.name = opt_.name;
  s.node = opt_.node;
  s.store = store_->Describe();
  s.members_total = reduces_ ? members_total_ : 1 + std::count_if(others_.begin(), others_.end(), [&](const Record& r) {
                                                  return r.state == "live" && !Dead(r, now);
                                                });
  s.leader = leader_;
  // Status shows ms (`ckptfs status`, its JSON).
  auto ms = [](int64_t us) { return us / kUsPerMs; };
  s.watermark_ms = ms(WatermarkLocked(applied_));
  auto member = [&](const Record& r, bool self) {
    ClusterMember m;
    m.node = r.node;
    m.self = self;
    m.state = !self && Dead(r, now) ? "dead" : r.state;
    m.heartbeat_ms = ms(r.heartbeat_us);
    m.age_ms = ms(now - r.heartbeat_us);
    m.watermark_ms = ms(r.watermark_us);
    if (r.oldest_gate_us) m.oldest_gate_ms = ms(*r.oldest_gate_us);
    m.unpersisted = r.unpersisted;
    m.at_risk = r.at_risk;
    m.paths = r.paths;
    m.record_problem = r.problem;
    m.incarnation = r.incarnation;
    return m;
  };
  s.members.push_back(member(self_, true));
  for (const Record& r : others_) s.members.push_back(member(r, false));
  for (const Record& r : digest_lost_) {  // etcd: members whose lease expired with files pending
    ClusterMember m = member(r, false);
    m.state = "dead";
    s.members.push_back(std::move(m));
  }
  std::sort(s.members.begin(), s.members.end(), [](const auto& a, const auto& b) { return a.node < b.node; });
  s.waiting = waiting_;
  s.wait_seq = wait_seq_;
  s.wait_gate_ms = ms(wait_gate_);
  s.waiting_for = waiting_for_;
  s.waiting_since_ms = ms(wait_since_);
  s.last_error = !write_error_.empty() ? write_error_ : !read_error_.empty() ? read_error_ : digest_problem_;
  s.node_id_clash = clash_noted_;
  s.publish_blocked_reason = BlockedLocked();
  for (const Record& r : refused_) s.refused.push_back({r.node, r.problem, ms(r.heartbeat_us), r.unpersisted});
  std::sort(s.refused.begin(), s.refused.end(), [](const auto& a, const auto& b) { return a.node < b.node; });
  s.kept_removals = lost_windows_.kept();
  s.kept_paths.assign(lost_windows_.kept_paths().begin(), lost_windows_.kept_paths().end());
  return s;
}

void Cluster::KeepSamples() {
  if (samples_path_.empty()) return;
  std::string text = std::string(kSamplesMagic) + "\n";
  {
    MutexLock lk(&mu_);
    if (!samples_changed_) return;
    samples_changed_ = false;
    for (const SampleRec& s : samples_) text += fmt::format("{} {} {}\n", s.t, s.pre, s.post);
  }
  // Written whole under a temporary name, then renamed: a reader (the next
  // start) sees the old list or the new one. Not fsynced: see cluster.h.
  std::string tmp = samples_path_ + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (fd >= 0) close(fd);
  if (!ok || rename(tmp.c_str(), samples_path_.c_str()) != 0) {
    LOG_DEBUG("cluster: cannot keep samples in {}: {}", samples_path_, strerror(errno));
    unlink(tmp.c_str());
  }
}

void Cluster::KeepAlive(int64_t t) {
  if (alive_fd_ < 0) return;
  // One pwrite of 8 bytes a sample, no rename: the page cache keeps it when
  // the daemon is killed (what a node reboot loses, the tier loses too).
  if (pwrite(alive_fd_, &t, sizeof t, 0) != static_cast<ssize_t>(sizeof t))
    LOG_DEBUG("cluster: cannot keep the sample time in {}{}: {}", samples_path_, kAliveSuffix, strerror(errno));
}

void Cluster::LoadSamples() {
  if (samples_path_.empty()) return;
  // The time of the last sample the previous daemon took (KeepAlive), if
  // it kept one: the crash came less than a sample period after it.
  std::optional<int64_t> alive;
  std::string alive_path = samples_path_ + kAliveSuffix, alive_ms_path = samples_path_ + kAliveMsSuffix;
  alive_fd_ = open(alive_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (int64_t t = 0; alive_fd_ >= 0 && pread(alive_fd_, &t, sizeof t, 0) == static_cast<ssize_t>(sizeof t) && t > 0)
    alive = t;
  if (alive_fd_ < 0) LOG_WARN("cluster: cannot open {}: {}", alive_path, strerror(errno));
  // Kept by a version 1 daemon (ms): its millisecond's end bounds from above.
  if (int fd = open(alive_ms_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC); fd >= 0) {
    if (int64_t t = 0; !alive && pread(fd, &t, sizeof t, 0) == static_cast<ssize_t>(sizeof t) && t > 0)
      alive = (t + 1) * kUsPerMs;
    close(fd);
    unlink(alive_ms_path.c_str());
  }
  std::deque<SampleRec> got;
  const uint64_t logged = log_->LoggedSeq();
  std::ifstream in(samples_path_);
  if (in) {
    std::string line;
    const bool got_line = static_cast<bool>(std::getline(in, line));
    const int64_t unit = got_line && line == kSamplesMagicMs ? kUsPerMs : 1;  // kept by version 1
    if (!got_line || (line != kSamplesMagic && unit == 1)) {
      LOG_WARN("cluster: {} is not a samples file; ignored (entries recovered now get the start time)", samples_path_);
      return;
    }
    // Samples of a log that lost its newest entries (seqs above what is
    // logged now) would give new entries with reused seqs old gate times.
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      SampleRec s{};
      const bool parsed = static_cast<bool>(ls >> s.t >> s.pre >> s.post);
      s.t *= unit;  // version 1: the start of its millisecond (within the margin it promised)
      if (!parsed || s.pre > s.post || s.post > logged ||
          (!got.empty() && (s.t < got.back().t || s.pre < got.back().pre || s.post < got.back().post))) {
        LOG_WARN("cluster: {} is damaged; ignored (entries recovered now get the start time)", samples_path_);
        return;
      }
      got.push_back(s);
    }
  }
  // Entries logged after the last sample kept: the previous daemon would
  // have kept a sample that saw them (Sample keeps every change at once)
  // had it lived one more sample period, so each was logged within a
  // sample period of the last sample time it kept alive, and the crash
  // came within one after it: that time plus one period bounds them from
  // above, and from below but for two periods (inside the ordering margin).
  // The restart time would do from above only: another node's `latest`
  // would pass them for newer (docs/consistency.md "Cross-node ordering").
  if (alive && logged > (got.empty() ? 0 : got.back().pre)) {
    int64_t t = std::max(*alive, got.empty() ? *alive : got.back().t) + opt_.sample_ms * kUsPerMs;
    got.push_back({t, logged, logged});
  }
  MutexLock lk(&mu_);
  samples_ = std::move(got);
}

}  // namespace ckpt::fs
