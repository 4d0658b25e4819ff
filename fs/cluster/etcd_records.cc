// etcd_records.cc — the members' records in etcd (etcd_records.h).
#include "fs/cluster/etcd_records.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/log.h"

namespace ckpt::fs {

namespace {
constexpr char kMembers[] = "members/";
constexpr char kLeader[] = "digest/leader";
constexpr char kSummary[] = "digest/summary";
constexpr char kDigestDir[] = "digest/";
constexpr char kTurns[] = "turn/";
constexpr auto kReduceGap = std::chrono::milliseconds(2);  // between reductions a changed record triggers
constexpr int64_t kReadEveryUs = 1000 * 1000;  // the elected member's view read whole at least this often while busy
constexpr int64_t kMinTtlS = 2;  // etcd's lease TTL floor (a shorter one is raised by the server)
}  // namespace

EtcdRecords::EtcdRecords(EtcdRecordsOptions o, Clock clock)
    : opt_(std::move(o)), clock_(std::move(clock)), prefix_("/ckptfs/" + opt_.cluster + "/"), client_(opt_.client) {}

EtcdRecords::~EtcdRecords() { Close(false); }

void EtcdRecords::SetReducer(Reducer r) { reducer_ = std::move(r); }

void EtcdRecords::SetError(const std::string& e) {
  MutexLock lk(&mu_);
  if (!e.empty() && e != error_) LOG_WARN("cluster {}: etcd: {}", opt_.cluster, e);
  else if (e.empty() && !error_.empty()) LOG_INFO("cluster {}: etcd answers again", opt_.cluster);
  error_ = e;
}

std::string EtcdRecords::LastError() {
  MutexLock lk(&mu_);
  if (!lease_lost_) return error_;
  return fmt::format("this node's lease expired (cut off from etcd for more than {} s): the others count it dead{}{}",
                     std::max(kMinTtlS, opt_.lease_ttl_s), error_.empty() ? "" : "; ", error_);
}

std::string EtcdRecords::Standing() {
  const int64_t ttl_ms = std::max(kMinTtlS, opt_.lease_ttl_s) * 1000;
  MutexLock lk(&mu_);
  if (lease_ == 0) return "";  // never granted: no record either (the cluster holds for that)
  if (lease_lost_) return "this node's lease expired: the others count it dead until it rejoins";
  if (record_lease_ != 0 && record_lease_ != lease_)
    return "rejoining: this node's record is not yet in the store under its new lease";
  const auto age =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - lease_ok_).count();
  if (age > ttl_ms * 2 / 3)
    return fmt::format("this node's lease was last confirmed {} ms ago (TTL {} ms): the others may soon count it dead",
                       age, ttl_ms);
  return "";
}

EtcdRecordsStats EtcdRecords::Stats() {
  MutexLock lk(&mu_);
  return stats_;
}

bool EtcdRecords::leader() {
  MutexLock lk(&mu_);
  return leading_;
}

std::string EtcdRecords::Describe() { return opt_.url; }

Result<int64_t> EtcdRecords::Lease() {
  bool granted = false;
  auto id = LeaseLocked(&granted);
  // Outside the one-grant lock: every caller of Lease (a name's write on a
  // FUSE reply among them) would wait behind these two requests too.
  if (id && granted) ForgetOwnLeader(*id);
  return id;
}

Result<int64_t> EtcdRecords::LeaseLocked(bool* granted) {
  // One grant at a time: after a lease loss the heartbeat, the reads and
  // the names each granted one, and a record or name could be put under a
  // lease that was replaced at once and never kept alive (it then expired
  // with the live node's name). The others wait for the one grant and take it.
  MutexLock one(&grant_mu_);
  {
    MutexLock lk(&mu_);
    if (lease_ != 0 && !lease_lost_) return lease_;
  }
  const auto asked = std::chrono::steady_clock::now();  // the store's countdown starts no earlier
  auto id = client_.Grant(std::max(kMinTtlS, opt_.lease_ttl_s));
  if (!id) {
    SetError("granting a lease: " + client_.LastError());
    return Err(id.error());
  }
  {
    MutexLock lk(&mu_);
    stats_.grants++;
    if (lease_lost_) LOG_WARN("cluster {}: node {} rejoins under a new lease", opt_.cluster, opt_.node);
    lease_ = *id;
    lease_lost_ = false;
    lease_ok_ = asked;
    taken_read_ = false;  // a run back (restarted, or after its lease ended): what its holders took
  }
  *granted = true;
  return *id;
}

Status EtcdRecords::Open() {
  // The watches and threads start whether or not the store answers now: a
  // mount made while etcd is down (or refusing) joins once it answers —
  // the next record put or campaign takes the lease, the keep-alive then
  // renews it, the watches reconnect on their own and read the digest.
  const int64_t rev = ReadDigestKeys();
  const int64_t from = rev > 0 ? rev + 1 : 0;  // nothing between the read and the watch is missed
  digest_watch_ = std::make_unique<etcd::Watch>(
      &client_, prefix_ + kDigestDir, etcd::PrefixEnd(prefix_ + kDigestDir), from,
      [this](const std::vector<etcd::WatchEvent>& evs, int64_t) { OnWatchedDigest(evs); },
      [this](const std::string& e) { SetError(e.empty() ? "" : "watching the digest: " + e); },
      [this] { ReadDigestKeys(); });
  turn_watch_ = std::make_unique<etcd::Watch>(
      &client_, prefix_ + kTurns + opt_.node, "", from,
      [this](const std::vector<etcd::WatchEvent>& evs, int64_t) { OnWatchedDigest(evs); },
      [this](const std::string& e) { SetError(e.empty() ? "" : "watching this node's turn: " + e); },
      [this] { ReadDigestKeys(); });
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  reducer_thread_ = std::thread([this] { ReduceLoop(); });
  auto id = Lease();
  if (!id) return Err(id.error());
  return {};
}

void EtcdRecords::ForgetOwnLeader(int64_t lease) {
  // This node elected under a lease of its previous life (killed, mounted
  // again): that key would stand until the old lease expires, and no digest
  // would be written meanwhile. Deleted: the members elect again at once.
  constexpr int64_t kTimeoutMs = 1000;  // a cleanup: the next grant or the old lease's expiry does it too
  if (auto r = client_.Range(prefix_ + kLeader, "", 0, kTimeoutMs);
      r && !r->kvs.empty() && r->kvs[0].value.starts_with(opt_.node + " ") &&
      r->kvs[0].value != opt_.node + " " + std::to_string(lease)) {
    LOG_INFO("cluster {}: node {} was the elected member under an earlier lease; electing again", opt_.cluster,
             opt_.node);
    (void)client_.Txn({{.del = true, .key = prefix_ + kLeader, .if_mod_revision = r->kvs[0].mod_revision}}, kTimeoutMs);
  }
}

void EtcdRecords::Close(bool leave) {
  {
    MutexLock lk(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (keepalive_.joinable()) keepalive_.join();
  if (reducer_thread_.joinable()) reducer_thread_.join();
  if (digest_watch_) digest_watch_->Stop();
  if (turn_watch_) turn_watch_->Stop();
  if (members_watch_) members_watch_->Stop();
  int64_t lease;
  {
    MutexLock lk(&mu_);
    lease = lease_;
    lease_ = 0;
  }
  // Revoked: this node's record (and the leader key, if it held it) go at
  // once; the others see a member that left, not one that died.
  if (leave && lease != 0 && !client_.Revoke(lease))
    LOG_WARN("cluster {}: revoking this node's lease: {}", opt_.cluster, client_.LastError());
}

Status EtcdRecords::Put(const std::string& node, const std::string& bytes) { return PutRecord(node, bytes, nullptr); }

Status EtcdRecords::PutHanding(const std::string& node, const std::string& bytes, const Handoff& h) {
  return PutRecord(node, bytes, &h);
}

std::string EtcdRecords::Turn() {
  MutexLock lk(&mu_);
  return turn_;
}

Status EtcdRecords::PutRecord(const std::string& node, const std::string& bytes, const Handoff* h) {
  auto lease = Lease();
  if (!lease) return Err(lease.error());
  // The baton goes under the elected member's lease, and only while it is
  // still the one its digest names: a baton of an older election is not
  // written (the new elected member gives turns of its own).
  std::string guard;
  int64_t leader_lease = 0;
  if (h) {
    MutexLock lk(&mu_);
    if (leader_value_.starts_with(h->leader + " ")) {
      guard = leader_value_;
      leader_lease = std::strtoll(guard.c_str() + h->leader.size() + 1, nullptr, 10);
    }
  }
  const bool hand = !guard.empty() && leader_lease != 0;
  std::vector<etcd::Client::Op> ops(1);
  ops[0].key = prefix_ + kMembers + node;
  ops[0].value = bytes;
  ops[0].lease = *lease;
  if (hand) {
    etcd::Client::Op& baton = ops.emplace_back();
    baton.key = prefix_ + kTurns + h->to;
    baton.value = h->digest;
    baton.lease = leader_lease;
    baton.guard_key = prefix_ + kLeader;
    baton.guard_value = guard;
  }
  Result<int64_t> rev = !hand ? client_.Put(ops[0].key, bytes, *lease) : client_.Txn(ops);
  {
    MutexLock lk(&mu_);
    stats_.puts++;
    stats_.handoffs += hand && rev.has_value();
  }
  if (!rev) {
    // A lease that expired meanwhile: the next put takes a new one.
    if (client_.LastError().find("lease not found") != std::string::npos) {
      MutexLock lk(&mu_);
      lease_lost_ = true;
    }
    SetError("writing this node's record: " + client_.LastError());
    return Err(rev.error());
  }
  bool read;
  {
    MutexLock lk(&mu_);
    read = taken_read_;
  }
  if (!read) {
    if (auto st = ReadTaken(true); !st) return st;
  }
  {
    MutexLock lk(&mu_);
    // Under the lease it was put with, and the holders' claims read after
    // it: standing again — unless that lease was replaced meanwhile (then a
    // claim may have come after the read: the next put reads them again).
    if (lease_ == *lease) {
      taken_read_ = true;
      if (record_lease_ != *lease && node == opt_.node) standings_.fetch_add(1, std::memory_order_acq_rel);
      record_lease_ = *lease;
    }
  }
  if (node == opt_.node)
    if (auto applied = AppliedSeqOf(bytes)) PruneTaken(*applied);
  SetError("");
  return {};
}

Result<std::vector<std::pair<std::string, std::string>>> EtcdRecords::List() {
  const std::string dir = prefix_ + kMembers;
  {
    MutexLock lk(&mu_);
    reading_ = true;
    during_.clear();
  }
  auto r = client_.Range(dir, etcd::PrefixEnd(dir));
  if (!r) {
    {
      MutexLock lk(&mu_);
      reading_ = false;
      stats_.ranges++;
      during_.clear();
    }
    SetError("reading the members' records: " + client_.LastError());
    return Err(r.error());
  }
  MutexLock lk(&mu_);
  reading_ = false;
  stats_.ranges++;
  // The elected member's view starts again from this read, and what its
  // watch brought meanwhile that is newer.
  members_.clear();
  for (const etcd::KeyValue& kv : r->kvs) members_[kv.key] = kv;
  members_rev_ = r->revision;
  std::erase_if(during_, [&](const etcd::WatchEvent& ev) { return ev.kv.mod_revision <= r->revision; });
  ApplyMemberEventsLocked(during_);
  during_.clear();
  members_whole_ = watching_members_;
  std::vector<std::pair<std::string, std::string>> out;
  for (etcd::KeyValue& kv : r->kvs) {
    // A record without a lease was not written by a member (a member's
    // record lives and dies with its lease): a stale or forged key.
    if (kv.lease == 0) {
      LOG_DEBUG("cluster {}: etcd key {} has no lease; not a member", opt_.cluster, EscapeName(kv.key));
      continue;
    }
    std::string name = kv.key.substr(dir.size());
    if (!ValidClusterName(name)) {  // no member can have it (--node is checked): into logs and status it would go raw
      LOG_DEBUG("cluster {}: etcd key {} is no member's name; ignored", opt_.cluster, EscapeName(kv.key));
      continue;
    }
    out.emplace_back(std::move(name), std::move(kv.value));
  }
  return out;
}

void EtcdRecords::ApplyMemberEventsLocked(const std::vector<etcd::WatchEvent>& evs) {
  // Per key, the newest wins: the watch and the reads since a revision
  // bring the same changes in either order.
  for (const etcd::WatchEvent& ev : evs) {
    auto it = members_.find(ev.kv.key);
    if (it != members_.end() && it->second.mod_revision >= ev.kv.mod_revision) continue;
    members_[ev.kv.key] = ev.kv;
    // A removal stays as a tombstone (no lease: no member), so that a read
    // from before it, answered after it, does not bring the record back.
    if (ev.deleted) members_[ev.kv.key].lease = 0, members_[ev.kv.key].value.clear();
  }
}

void EtcdRecords::OnMemberEvents(const std::vector<etcd::WatchEvent>& evs) {
  {
    MutexLock lk(&mu_);
    if (reading_) during_.insert(during_.end(), evs.begin(), evs.end());
    ApplyMemberEventsLocked(evs);
    if (!evs.empty()) dirty_ = true;
  }
  cv_.NotifyAll();
}

std::optional<std::vector<std::pair<std::string, std::string>>> EtcdRecords::RecordsFromWatch() {
  int64_t rev;
  {
    MutexLock lk(&mu_);
    if (!members_whole_) return std::nullopt;
    rev = members_rev_;
  }
  // The records put since the last read (the watch has most of them
  // already; a read makes the view current at once, without waiting for
  // it). A record removed meanwhile may still be here until the watch
  // brings its removal: it only holds the others a moment longer.
  const std::string dir = prefix_ + kMembers;
  auto r = client_.RangeSince(dir, etcd::PrefixEnd(dir), rev + 1);
  MutexLock lk(&mu_);
  stats_.deltas++;
  if (!r || !members_whole_) return std::nullopt;
  std::vector<etcd::WatchEvent> evs;
  for (etcd::KeyValue& kv : r->kvs) evs.push_back({false, std::move(kv)});
  ApplyMemberEventsLocked(evs);
  members_rev_ = std::max(members_rev_, r->revision);
  return MembersLocked();
}

std::vector<std::pair<std::string, std::string>> EtcdRecords::MembersLocked() const {
  const size_t skip = prefix_.size() + sizeof(kMembers) - 1;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, kv] : members_)  // no lease: a tombstone, or no member's; nor a name no member can have
    if (kv.lease != 0 && ValidClusterName(key.substr(skip))) out.emplace_back(key.substr(skip), kv.value);
  return out;
}

std::optional<std::string> EtcdRecords::Digest() {
  MutexLock lk(&mu_);
  return digest_;
}

int64_t EtcdRecords::ReadDigestKeys() {
  auto r = client_.Range(prefix_ + kDigestDir, etcd::PrefixEnd(prefix_ + kDigestDir));
  if (!r) {
    SetError("reading the digest: " + client_.LastError());
    return 0;
  }
  std::vector<etcd::WatchEvent> evs;
  bool leader_seen = false;
  for (etcd::KeyValue& kv : r->kvs) {
    leader_seen = leader_seen || kv.key == prefix_ + kLeader;
    evs.push_back({false, std::move(kv)});
  }
  if (!leader_seen) evs.push_back({true, {prefix_ + kLeader, "", 0, r->revision, 0, 0}});  // none, as of the read
  auto t = client_.Range(prefix_ + kTurns + opt_.node);
  if (t)
    for (etcd::KeyValue& kv : t->kvs) evs.push_back({false, std::move(kv)});
  {
    MutexLock lk(&mu_);
    digest_read_ = digest_read_ || t.has_value();
  }
  OnDigestEvents(evs);
  return t ? r->revision : 0;
}

void EtcdRecords::OnWatchedDigest(const std::vector<etcd::WatchEvent>& evs) {
  OnDigestEvents(evs);
  // Watched from "now" (the read at Open failed: the store was down): what
  // was written before is read once the watch is made (after its events:
  // the read is the newer).
  bool read;
  {
    MutexLock lk(&mu_);
    read = digest_read_;
  }
  if (!read) ReadDigestKeys();
}

void EtcdRecords::OnDigestEvents(const std::vector<etcd::WatchEvent>& evs) {
  bool fresh = false;
  {
    MutexLock lk(&mu_);
    fresh = DigestEventsLocked(evs);
  }
  cv_.NotifyAll();
  if (fresh && on_digest_) on_digest_();
}

bool EtcdRecords::DigestEventsLocked(const std::vector<etcd::WatchEvent>& evs) {
  bool fresh = false;
  for (const etcd::WatchEvent& ev : evs) {
    if (ev.kv.key == prefix_ + kLeader) {
      // A read answered after a newer event (a campaign won meanwhile):
      // what it saw is older, and kept out.
      if (ev.kv.mod_revision < leader_rev_) continue;
      leader_rev_ = ev.kv.mod_revision;
      leader_value_ = ev.deleted ? "" : ev.kv.value;
      const std::string mine = opt_.node + " " + std::to_string(lease_);
      const bool leading = !ev.deleted && ev.kv.value == mine;
      if (leading_ && !leading) LOG_INFO("cluster {}: node {} no longer reduces the records", opt_.cluster, opt_.node);
      leading_ = leading;
    } else if ((ev.kv.key == prefix_ + kSummary || ev.kv.key == prefix_ + kTurns + opt_.node) && !ev.deleted) {
      if (ev.kv.key != prefix_ + kSummary && ev.kv.mod_revision > turn_rev_) {
        turn_ = ev.kv.value;  // read beside a newer summary: it may carry a baton
        turn_rev_ = ev.kv.mod_revision;
        fresh = true;
      }
      if (ev.kv.mod_revision <= digest_rev_) continue;
      digest_ = ev.kv.value;
      digest_rev_ = ev.kv.mod_revision;
      stats_.digests_seen++;
      fresh = true;
    }
  }
  return fresh;
}

void EtcdRecords::KeepAliveLoop() {
  const auto period =
      std::chrono::milliseconds(std::max<int64_t>(500, std::max(kMinTtlS, opt_.lease_ttl_s) * 1000 / 3));
  for (;;) {
    int64_t lease;
    {
      MutexLock lk(&mu_);
      auto until = std::chrono::steady_clock::now() + period;
      while (!stop_ && cv_.WaitUntil(&mu_, until)) {
      }
      if (stop_) return;
      lease = lease_lost_ ? 0 : lease_;
    }
    if (lease == 0) continue;  // the next Put takes a new lease
    const auto asked = std::chrono::steady_clock::now();
    auto ttl = client_.KeepAlive(lease);
    MutexLock lk(&mu_);
    stats_.keepalives++;
    if (lease_ != lease) continue;
    const auto now = std::chrono::steady_clock::now();
    if (ttl && *ttl > 0) {
      lease_ok_ = std::max(lease_ok_, asked);  // confirmed as of the request: the store's countdown began after it
      continue;
    }
    // The store says the lease is gone, or it has not confirmed it for
    // longer than the TTL (cut off): either way the others count this node
    // dead and its record is gone. It rejoins under a new lease with its
    // next record; until then it elects nothing and reduces nothing.
    const auto ttl_s = std::max(kMinTtlS, opt_.lease_ttl_s);
    if (ttl || now - lease_ok_ > std::chrono::seconds(ttl_s)) {
      LOG_ERROR(
          "cluster {}: node {}'s lease expired (cut off from etcd for more than {} s{}): the others count it "
          "dead; it rejoins with its next record",
          opt_.cluster, opt_.node, ttl_s, ttl ? "" : ": " + client_.LastError());
      lease_lost_ = true;
      leading_ = false;
    }
  }
}

void EtcdRecords::Campaign() {
  auto lease = Lease();
  if (!lease) return;
  const std::string mine = opt_.node + " " + std::to_string(*lease);
  auto r = client_.PutIfAbsent(prefix_ + kLeader, mine, *lease);
  MutexLock lk(&mu_);
  stats_.txns++;
  if (r && r->succeeded && r->revision >= leader_rev_) {  // else the watch brought newer: it decides
    LOG_INFO("cluster {}: node {} reduces the members' records (elected)", opt_.cluster, opt_.node);
    leader_value_ = mine;
    leader_rev_ = std::max(leader_rev_, r->revision);
    leading_ = true;
    dirty_ = true;
  } else if (r && !r->kvs.empty() && r->kvs[0].mod_revision >= leader_rev_) {
    leader_value_ = r->kvs[0].value;
    leader_rev_ = r->kvs[0].mod_revision;
    leading_ = leader_value_ == mine;  // won earlier, and a stale read forgot it
    dirty_ = dirty_ || leading_;
  }
}

void EtcdRecords::Reduce() {
  std::string mine;
  int64_t as_of = clock_();
  std::optional<std::vector<std::pair<std::string, std::string>>> watched;
  {
    MutexLock lk(&mu_);
    dirty_ = false;
    last_reduce_ = std::chrono::steady_clock::now();
    mine = leader_value_;
    // A read of the store makes the view whole as of its start; it is
    // needed only when a pending gate + skew has passed since the last one
    // (due: an entry may pass now that did not), and once a second. In
    // between — each step of a checkpoint's chain — the records the watch
    // brought are reduced as of the last read: a newer record of a member
    // only shows a later heartbeat and a later oldest gate (it can only
    // hold less wrongly, never let an entry pass that the read's would
    // not), and a member the watch shows that the read did not is one
    // more to wait for.
    if (members_whole_ && !(due_ != 0 && as_of >= due_) && as_of - whole_as_of_ < kReadEveryUs) {
      watched = MembersLocked();
      as_of = whole_as_of_;
      stats_.from_watch++;
    }
  }
  if (!watched) {
    watched = RecordsFromWatch();
    if (!watched) {
      auto full = List();
      if (full) watched = std::move(*full);
    }
    if (!watched) {
      MutexLock lk(&mu_);
      dirty_ = true;
      return;
    }
    MutexLock lk(&mu_);
    whole_as_of_ = as_of;
  }
  Reduction red = reducer_(*watched, as_of);
  int64_t lease = 0;
  {
    MutexLock lk(&mu_);
    stats_.reductions++;
    due_ = red.due;
    lease = lease_;
  }
  // The summary under no lease (it outlives an elected member, for the
  // next one to compare with); a turn under the elected member's lease
  // (gone with it: no key per member ever given a turn is left behind).
  auto write = [&](const std::string& key, const std::string& value, int64_t lease_id) {
    auto r = client_.PutIfEqual(key, value, lease_id, prefix_ + kLeader, mine);
    MutexLock lk(&mu_);
    stats_.txns++;
    if (!r) {
      dirty_ = true;
    } else if (!r->succeeded) {
      if (leading_) LOG_INFO("cluster {}: node {} is no longer the elected member", opt_.cluster, opt_.node);
      leading_ = false;
      // The leader key as the failed guard read it: a stale value kept
      // would stop this node from ever campaigning again.
      const int64_t rev = r->kvs.empty() ? r->revision : r->kvs[0].mod_revision;
      if (rev >= leader_rev_) {
        leader_value_ = r->kvs.empty() ? "" : r->kvs[0].value;
        leader_rev_ = rev;
      }
    }
  };
  if (!red.summary.empty()) {
    write(prefix_ + kSummary, red.summary, 0);
    MutexLock lk(&mu_);
    stats_.summaries++;
  }
  if (!red.turn.empty() && ValidClusterName(red.turn_node)) {
    write(prefix_ + kTurns + red.turn_node, red.turn, lease);
    MutexLock lk(&mu_);
    stats_.turns++;
  }
}

void EtcdRecords::ReduceLoop() {
  for (;;) {
    bool campaign = false, reduce = false, watch = false, unwatch = false;
    {
      MutexLock lk(&mu_);
      // Every tick; and, elected, as soon as a record changed (the members'
      // watch notifies), at most one reduction every kReduceGap: a member
      // waiting for another's record waits one round trip, not a tick.
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.tick_ms);
      while (!stop_) {
        auto when = leading_ && dirty_ ? std::min(until, last_reduce_ + kReduceGap) : until;
        // A withheld summary or a gate coming due: then, not at the next tick.
        if (leading_ && due_ != 0)
          when = std::min(when, std::max(last_reduce_ + kReduceGap,
                                         std::chrono::steady_clock::now() +
                                             std::chrono::microseconds(std::max<int64_t>(0, due_ - clock_()))));
        if (std::chrono::steady_clock::now() >= when) break;
        cv_.WaitUntil(&mu_, when);
      }
      if (stop_) return;
      campaign = leader_value_.empty() && !lease_lost_ && reducer_;
      reduce = leading_ && (dirty_ || (due_ != 0 && clock_() >= due_));
      watch = leading_ && !members_watch_;
      unwatch = !leading_ && members_watch_;
    }
    if (unwatch) {
      members_watch_.reset();
      MutexLock lk(&mu_);
      watching_members_ = false;
      members_whole_ = false;
      members_.clear();
    }
    if (campaign) Campaign();
    if (watch) {
      // The elected member follows every record: a change makes the next
      // tick reduce (one Range), at most one reduction a tick. The records
      // are read whole first and followed from just after that read: a
      // watch from "now" starts whenever its stream connects, and a record
      // put between a read and then would be in neither the view nor the
      // watch — nothing would reduce it until the next change.
      const int64_t as_of = clock_();
      if (!List()) {
        // Not watching yet: the next tick reads again (not at once — a
        // store that refuses fast would be asked in a loop).
        MutexLock lk(&mu_);
        dirty_ = false;
        continue;
      }
      int64_t from;
      {
        MutexLock lk(&mu_);
        from = members_rev_ + 1;
      }
      members_watch_ = std::make_unique<etcd::Watch>(
          &client_, prefix_ + kMembers, etcd::PrefixEnd(prefix_ + kMembers), from,
          [this](const std::vector<etcd::WatchEvent>& evs, int64_t) { OnMemberEvents(evs); },
          [this](const std::string& e) {
            MutexLock lk(&mu_);
            dirty_ = true;
            (void)e;
          },
          [this] {
            MutexLock lk(&mu_);
            members_whole_ = false;  // events were missed: the next reduction reads the range
            dirty_ = true;
          });
      MutexLock lk(&mu_);
      watching_members_ = true;
      members_whole_ = true;  // the read above, and the watch from just after it
      whole_as_of_ = as_of;
      dirty_ = true;
      reduce = true;
    }
    if (reduce) Reduce();
  }
}

}  // namespace ckpt::fs
