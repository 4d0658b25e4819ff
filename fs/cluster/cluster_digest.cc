// cluster_digest.cc — the cluster over a store that reduces (etcd): the
// elected member reduces every record into one digest, and every member
// reads the digest instead of every record (cluster.h, etcd_records.h;
// docs/consistency.md "Cross-node ordering at scale").
//
// Why the digest decides as the records would: the rule (MayPublish) holds
// entry e of X (gate g) while some other live member Y has T_Y < g + skew,
// or a pending entry before e in (gate, node) order. If any member other
// than X does, the one with the smallest (T, node) or the smallest
// (G, node) among the members but X does; those are among the two smallest
// of each over all members. So the digest carries those (at most four
// records), and the rule over them holds e exactly when the rule over every
// record would. The read's time (as_of) stands for the time of the list:
// every member that joined before it is in it (a member's record is in the
// store before it serves a write).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/log.h"
#include "fs/cluster/cluster.h"

namespace ckpt::fs {

using Json = nlohmann::json;

namespace {
constexpr int64_t kUsPerMs = 1000;
constexpr size_t kDeciding = 2;   // records of each order carried (see above)
constexpr size_t kLostKept = 16;  // vanished members named in the digest
constexpr size_t kLostPaths = 4;
constexpr char kReplaced[] = "replaced by a new run";  // a lost run's `problem` when another run of its id came
constexpr int64_t kClashKeptUs = 60 * 1000 * 1000;     // an id two runs wrote as is named this long after
constexpr size_t kAllUpTo = 16;
constexpr int64_t kDigestRefreshUs = 60 * 1000 * 1000;  // an unchanged summary is rewritten this often
// Summaries at most every 10 ms, and 250 µs more per member: each is
// delivered to every member, so about 4,000 deliveries a second at any size.
constexpr int64_t kMinSummaryGapUs = 10 * 1000;
constexpr int64_t kSummaryGapPerMemberUs = 250;
// The baton (cluster_types.h: Reduction): members named after the head,
// and how long at most the elected member waits for one it named to be
// handed the baton before it gives that member a turn itself.
constexpr size_t kBaton = 32;
constexpr int64_t kBatonGraceUs = 100 * 1000;

// The `n` first of `v` by `less`, in order.
template <typename Less>
std::vector<const ClusterRecord*> Smallest(std::vector<const ClusterRecord*> v, size_t n, Less less) {
  n = std::min(v.size(), n);
  std::partial_sort(v.begin(), v.begin() + static_cast<ssize_t>(n), v.end(), less);
  v.resize(n);
  return v;
}
bool ByHeartbeat(const ClusterRecord* a, const ClusterRecord* b) {
  return std::tie(a->heartbeat_us, a->node) < std::tie(b->heartbeat_us, b->node);
}
bool ByGate(const ClusterRecord* a, const ClusterRecord* b) {
  return std::tie(*a->oldest_gate_us, a->node) < std::tie(*b->oldest_gate_us, b->node);
}

bool Named(const std::vector<std::pair<std::string, int64_t>>& baton, const std::pair<std::string, int64_t>& turn) {
  return std::find(baton.begin(), baton.end(), turn) != baton.end();
}

// The members after `head` in (gate, node) order whose entries the rule
// lets pass once the members before them in it published: read after
// their gate + skew, and every other member's record newer than it.
std::vector<const ClusterRecord*> BatonChain(std::vector<const ClusterRecord*> pending,
                                             std::vector<const ClusterRecord*> live, const ClusterRecord* head,
                                             int64_t as_of, int64_t skew) {
  pending = Smallest(std::move(pending), kBaton + 1, ByGate);
  live = Smallest(std::move(live), kBaton + 3, ByHeartbeat);  // of these, two lie outside any prefix
  std::vector<const ClusterRecord*> chain, before{head};
  for (const ClusterRecord* c : pending) {
    if (c == head) continue;
    const int64_t g = *c->oldest_gate_us;
    before.push_back(c);
    auto outside = std::find_if(live.begin(), live.end(), [&](const ClusterRecord* r) {
      return std::find(before.begin(), before.end(), r) == before.end();
    });
    if (as_of < g + skew || (outside != live.end() && (*outside)->heartbeat_us < g + skew)) break;
    chain.push_back(c);
  }
  return chain;
}
}  // namespace

struct Cluster::DigestView {
  std::vector<Record> others, refused, lost;
  std::map<std::string, Record> carried;  // every live record, this node's too
  int64_t as_of = 0, newest = 0;
  uint64_t members = 0;
  std::string leader;
  std::string baton_holder;  // a baton: whose, for its entry at baton_gate, naming others after it,
  int64_t baton_gate = 0;    // with the records of the members before it as they handed it on
  bool baton_next = false;
  std::vector<Record> baton_before;
  std::vector<std::string> clashes;  // ids two runs write records as
};

int64_t Cluster::SummaryGapUs(size_t members) {
  return std::max<int64_t>(kMinSummaryGapUs, static_cast<int64_t>(members) * kSummaryGapPerMemberUs);
}

Reduction Cluster::Reduce(const std::vector<std::pair<std::string, std::string>>& records, int64_t as_of) {
  const int64_t now = clock_();
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  std::map<std::string, Record> seen;
  std::map<std::string, const std::string*> bytes_of;
  std::vector<Record> refused;
  size_t unreadable = 0;
  std::map<std::string, std::pair<std::string, Record>> parsed;  // this read's, for the next
  for (const auto& [name, bytes] : records) {
    Record r;
    std::string problem;
    // A record unchanged since the last reduction is not parsed again (a
    // thousand records, one of which changed, each step of a checkpoint).
    if (auto hit = parsed_.find(name); hit != parsed_.end() && hit->second.first == bytes) {
      r = hit->second.second;
      problem = FutureProblem(&r, now);
    } else {
      problem = ParseRecord(name, bytes, now, &r);
    }
    if (problem.empty()) parsed.emplace(name, std::pair<std::string, Record>{bytes, r});
    if (problem == "unreadable") {
      unreadable++;
      continue;
    }
    if (!problem.empty()) {
      refused.push_back(std::move(r));
      continue;
    }
    bytes_of[name] = &bytes;
    seen.emplace(name, std::move(r));
  }
  parsed_ = std::move(parsed);
  std::vector<const Record*> live, pending;
  for (const auto& [name, r] : seen) {
    if (r.state != "live") continue;
    live.push_back(&r);
    if (r.oldest_gate_us) pending.push_back(&r);
  }
  auto by_t = Smallest(live, kDeciding, ByHeartbeat);
  auto by_g = Smallest(pending, kDeciding, ByGate);
  // With nothing pending, T decides nothing: only membership goes in (a
  // small cluster's records all go in, for status).
  std::vector<const Record*> deciding = live.size() <= kAllUpTo ? live : pending.empty() ? by_g : by_t;
  for (const Record* r : by_g)
    if (std::find(deciding.begin(), deciding.end(), r) == deciding.end()) deciding.push_back(r);
  // The elected member's own record goes in while it has files pending:
  // the member elected after it learns from the digest what it had, should
  // it die (an idle one's changes nothing: an idle cluster writes no digest).
  if (auto self = seen.find(opt_.node); self != seen.end() && self->second.state == "live" &&
                                        self->second.unpersisted > 0 &&
                                        std::find(deciding.begin(), deciding.end(), &self->second) == deciding.end())
    deciding.push_back(&self->second);
  // When a new reduction would let an entry pass: its gate + skew, once
  // the read is later than that.
  int64_t due = 0;
  for (const Record* r : pending)
    if (*r->oldest_gate_us + skew >= as_of && (due == 0 || *r->oldest_gate_us + skew + 1 < due))
      due = *r->oldest_gate_us + skew + 1;

  Json recs = Json::array();
  for (const Record* r : deciding) recs.push_back({{"node", r->node}, {"record", *bytes_of[r->node]}});
  Json refused_j = Json::array();
  for (const Record& r : refused)
    if (refused_j.size() < opt_.max_refused)
      refused_j.push_back(
          {{"node", r.node}, {"heartbeat_us", r.heartbeat_us}, {"unpersisted", r.unpersisted}, {"reason", r.problem}});
  Json lost_j = Json::array(), clashes_j = Json::array();
  {
    MutexLock lk(&mu_);
    // A member read before whose record is gone: its lease expired (or it
    // was deleted). With files pending it is lost, and named in the
    // digest so that every member logs it; a member that left cleanly
    // revoked its lease with nothing pending.
    // A lost member that is back (mounted again) is no longer lost.
    if (digest_as_of_ > reduced_as_of_) {
      // Another member reduced since this one last did (this one was just
      // elected): what it read, as its digest carried it, is the "before".
      reduced_ = digest_seen_;
      runs_.clear();  // what it saw in an earlier term is not the runs of now
      for (const Record& r : digest_lost_)
        if (std::none_of(lost_.begin(), lost_.end(), [&](const Record& x) { return NotedName(x) == NotedName(r); }))
          lost_.push_back(r);
    }
    // A record of the same node id from another incarnation (a replacement
    // machine mounted under the dead node's id with a new state dir, before
    // or after its lease expired) does not bring the dead run back: what it
    // had pending is lost (its holders publish its replicas) all the same.
    auto back = [&](const Record& r) {
      auto it = seen.find(r.node);
      return it != seen.end() && SameIncarnation(it->second.incarnation, r.incarnation);
    };
    std::erase_if(lost_, back);
    // A run another run of its id replaced, seen again, twice: two mounts
    // write records as this id, each in turn (not a replacement, nor a run
    // back once on its state dir after its replacement died: a clash).
    // runs_' second: 0 none seen back, -1 once, else when last named.
    std::set<std::string> back_now;  // ids whose replaced run is seen again in this reduction
    for (const auto& [name, r] : seen) {
      auto it = runs_.find(name);
      if (it == runs_.end() || r.incarnation.empty() || it->second.first != r.incarnation) continue;
      back_now.insert(name);
      if (it->second.second == 0) {
        it->second.second = -1;
        continue;
      }
      if (it->second.second == -1)
        LOG_ERROR(
            "cluster {}: two mounts write records as node {} (runs {} and {}, in turn); give each mount its "
            "own --node",
            opt_.name, name, r.incarnation, reduced_.count(name) ? reduced_.at(name).incarnation : "?");
      it->second.second = now;
    }
    for (const auto& [name, old] : reduced_) {
      if (back(old) || old.state != "live") continue;
      const bool replaced = seen.count(name) > 0;
      if (replaced) {
        auto& run = runs_[name];
        run.first = old.incarnation;
        if (!back_now.count(name) && run.second == -1) run.second = 0;  // a new replacement: not the switching
      }
      // Nothing pending of its own, and nothing held for dead members
      // (their replicas are its at risk: lost with it).
      if (old.unpersisted == 0 && old.at_risk == 0 && !old.unsafe_gate_us) {
        LOG_INFO("cluster {}: member {} is gone ({}, nothing pending)", opt_.name, name,
                 replaced ? "a new run mounted under its id" : "its lease ended");
        continue;
      }
      Record gone = old;
      NotLostWhereHeld(&gone, seen);
      LOG_WARN("cluster {}: member {} is dead ({}); {}", opt_.name, name,
               replaced ? "a new run with a new state dir mounted under its id" : "its lease expired",
               LostFilesText(gone.unpersisted, gone.at_risk, gone.paths));
      gone.paths.resize(std::min(gone.paths.size(), kLostPaths));
      gone.problem = fmt::format("{}, noticed at {} ms", replaced ? kReplaced : "lease expired", now / kUsPerMs);
      lost_.push_back(std::move(gone));
      if (lost_.size() > kLostKept) lost_.pop_front();
    }
    reduced_ = seen;
    for (const Record& r : lost_)
      lost_j.push_back({{"node", r.node},
                        {"incarnation", r.incarnation},
                        {"heartbeat_us", r.heartbeat_us},
                        {"unpersisted", r.unpersisted},
                        {"at_risk", r.at_risk},
                        {"unsafe_gate_us", r.unsafe_gate_us ? Json(*r.unsafe_gate_us) : Json(nullptr)},
                        {"paths", r.paths},
                        {"noticed", r.problem}});
    std::erase_if(runs_, [&](const auto& kv) { return !seen.count(kv.first); });
    for (const auto& [node, run] : runs_)
      if (run.second > 0 && now - run.second <= kClashKeptUs) clashes_j.push_back(node);
  }
  if (unreadable) LOG_DEBUG("cluster {}: {} records not readable; no members", opt_.name, unreadable);
  // The newest oldest-pending gate of any member: a record of every member
  // newer than it + skew lets every pending entry be ordered (ReadDigest:
  // each member writes one then), so a checkpoint costs each node O(1)
  // records, not one for each gate that becomes the cluster's oldest.
  std::optional<int64_t> newest;
  for (const Record* r : pending) newest = std::max(newest.value_or(0), *r->oldest_gate_us);
  Json d = {{"version", 1},
            {"cluster", opt_.name},
            {"leader", opt_.node},
            {"members", live.size()},
            {"pending", pending.size()},
            {"records", recs},
            {"refused", refused_j},
            {"lost", lost_j},
            {"clashes", clashes_j},
            {"newest_gate_us", newest ? Json(*newest) : Json(nullptr)}};
  std::string body = d.dump(-1, ' ', false, Json::error_handler_t::replace);
  const std::string urgent = refused_j.dump() + lost_j.dump() + clashes_j.dump();
  // Whose turn it is: the rule lets an entry pass only while no other
  // member has one before it in (gate, node) order, so of all pending
  // entries only the first may pass, and only once every other member's
  // record is newer than its gate + skew (MayPublish).
  const Record* head = nullptr;
  for (const Record* r : pending)
    if (!head || std::tie(*r->oldest_gate_us, r->node) < std::tie(*head->oldest_gate_us, head->node)) head = r;
  if (head && as_of < *head->oldest_gate_us + skew) head = nullptr;
  for (const Record* r : live)
    if (head && r != head && r->heartbeat_us < *head->oldest_gate_us + skew) head = nullptr;
  Reduction out;
  out.due = due;
  d["as_of_us"] = as_of;
  MutexLock lk(&mu_);
  reduced_as_of_ = as_of;
  // The summary says something new: its content changed, or a later read
  // lets a pending entry pass (its gate + skew lies between the last
  // summary's read and this one's). Written at once when a member is lost
  // or refused, else at most once a SummaryGapUs; an idle cluster's members
  // refreshing their records write none.
  bool fresh_needed = false;
  for (const Record* r : pending)
    if (*r->oldest_gate_us + skew >= summary_as_of_ && *r->oldest_gate_us + skew < as_of) fresh_needed = true;
  const bool gap_passed = as_of - summary_as_of_ >= SummaryGapUs(live.size());
  const std::pair<std::string, int64_t> turn =
      head ? std::pair<std::string, int64_t>{head->node, *head->oldest_gate_us} : std::pair<std::string, int64_t>{};
  // While a baton runs, a summary would say only that the chain moved, to
  // members it does not concern yet (each one read by every member, 100
  // parses a step at 100 members: what made the steps slow): none then,
  // unless a member is lost or refused, or a newer entry was logged.
  const bool baton_runs =
      head && Named(baton_given_, turn) && urgent == urgent_body_ && newest.value_or(0) == summary_newest_;
  const bool changed = (body != reduced_body_ || fresh_needed) && !baton_runs;
  if ((changed && (gap_passed || urgent != urgent_body_)) || as_of - summary_as_of_ >= kDigestRefreshUs) {
    reduced_body_ = body;
    urgent_body_ = urgent;
    summary_as_of_ = as_of;
    summary_newest_ = newest.value_or(0);
    if (head) turn_given_ = turn;  // it reads the summary
    // A member that passes then does not show the baton working (below).
    std::erase(baton_given_, turn);
    out.summary = d.dump(-1, ' ', false, Json::error_handler_t::replace);
    return out;
  }
  // Withheld: written once the gap has passed (a reduction is due then).
  if (changed)
    out.due = out.due == 0 ? summary_as_of_ + SummaryGapUs(live.size())
                           : std::min(out.due, summary_as_of_ + SummaryGapUs(live.size()));
  if (!head) turn_given_ = {};  // the next head gets a turn, even one given before
  if (head && turn != turn_given_) {
    // A member the last baton names is handed it by the member before it:
    // no turn for it (on a busy machine the elected member's work for each
    // step was what made a step slow), unless the baton does not come
    // within a grace — a member died, a put failed, the leader changed:
    // the baton is lost, not wrong.
    if (Named(baton_given_, turn)) {
      if (baton_wait_.first != turn) {
        if (Named(baton_given_, baton_wait_.first)) baton_backoff_ = 1;  // the one before passed without a turn
        baton_wait_ = {turn, now};
      }
      if (const int64_t at = baton_wait_.second + kBatonGraceUs; now < at) {
        out.due = out.due == 0 ? at : std::min(out.due, at);
        return out;
      }
      // Lost: the next turns go without a baton (1, 2, 4 ... up to kBaton
      // of them), so that members or a store that cannot hand it on cost
      // a grace now and then, not one a step.
      baton_skip_ = baton_backoff_;
      baton_backoff_ = std::min<int>(2 * baton_backoff_, kBaton);
      LOG_DEBUG("cluster {}: the baton did not reach member {} within {} ms; {} turns without one", opt_.name,
                turn.first, kBatonGraceUs / kUsPerMs, baton_skip_);
    }
    // One step of the chain: only the member whose turn it is learns now,
    // with the baton for the members after it.
    turn_given_ = turn;
    baton_given_.clear();
    std::vector<const Record*> chain;
    if (baton_skip_ > 0) baton_skip_--;
    else chain = BatonChain(pending, live, head, as_of, skew);
    if (!chain.empty()) {
      Json next = Json::array();
      for (const Record* c : chain) {
        baton_given_.emplace_back(c->node, *c->oldest_gate_us);
        next.push_back({{"node", c->node}, {"gate_us", *c->oldest_gate_us}});
      }
      d["baton"] = {
          {"holder", head->node}, {"gate_us", *head->oldest_gate_us}, {"next", next}, {"before", Json::array()}};
    }
    out.turn_node = head->node;
    out.turn = d.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return out;
}

bool Cluster::BatonDueLocked() const {
  return baton_ && baton_->hand_on && (!self_.oldest_gate_us || *self_.oldest_gate_us > baton_->gate_us);
}

bool Cluster::BatonPermitsLocked(int64_t gate_us) const {
  // The elected member checked every other member for this entry (its
  // gate), but those before it in the baton: their records as they handed
  // it on must show them past it (what they log later comes later).
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  if (!baton_ || baton_->gate_us != gate_us || baton_->as_of_us < gate_us + skew) return false;
  return std::all_of(baton_->before.begin(), baton_->before.end(), [&](const Record& r) {
    return r.heartbeat_us >= gate_us + skew &&
           (!r.oldest_gate_us || std::tie(*r.oldest_gate_us, r.node) > std::tie(gate_us, opt_.node));
  });
}

std::optional<Handoff> Cluster::HandOnLocked(const std::string& record) {
  // The baton as given, with this node's new record among those before the
  // next member, handed to that member. The digest's records stay as the
  // elected member read them: the rule over the digest stands as it was.
  Handoff h;
  try {
    Json d = Json::parse(baton_->digest);
    Json b = d.at("baton");
    Json next = b.at("next");
    // Without the paths it names (the rule reads its times): a baton
    // carries up to 32 records, and etcd keeps every version for a while.
    Json mine = Json::parse(record);
    mine["paths"] = Json::array();
    b.at("before").push_back(
        {{"node", opt_.node}, {"record", mine.dump(-1, ' ', false, Json::error_handler_t::replace)}});
    h.to = next.at(0).at("node").get<std::string>();
    d["baton"] = {{"holder", h.to},
                  {"gate_us", next.at(0).at("gate_us")},
                  {"next", Json(next.begin() + 1, next.end())},
                  {"before", b.at("before")}};
    h.digest = d.dump(-1, ' ', false, Json::error_handler_t::replace);
    h.leader = baton_->leader;
  } catch (const std::exception& e) {
    LOG_DEBUG("cluster {}: the baton is not handed on: {}", opt_.name, e.what());
    baton_->hand_on = false;
    return std::nullopt;
  }
  return h;
}

void Cluster::TakeBatonLocked(const DigestView& v) {
  if (v.baton_holder != opt_.node || v.baton_gate <= baton_taken_) return;
  baton_ = HeldBaton{digest_text_, v.leader, v.baton_gate, v.as_of, v.baton_next, v.baton_before};
  baton_taken_ = v.baton_gate;
}

void Cluster::ReadDigest(const std::string& digest) {
  const int64_t now = clock_();
  const int64_t skew = opt_.max_skew_ms * kUsPerMs;
  if (digest.empty()) {
    MutexLock lk(&mu_);
    digest_problem_ = "no digest of the members' records yet (no member elected, or the store unreachable)";
    return;
  }
  // Parsed once per digest, not at every tick (a thousand members each
  // parsing the same digest ten times a second was most of their CPU).
  std::shared_ptr<const DigestView> view;
  {
    MutexLock lk(&mu_);
    if (digest_view_ && digest_text_ == digest) view = digest_view_;
  }
  if (!view) {
    auto v = std::make_shared<DigestView>();
    try {
      Json d = Json::parse(digest);
      if (d.at("cluster").get<std::string>() != opt_.name) throw std::runtime_error("another cluster's digest");
      v->as_of = d.at("as_of_us").get<int64_t>();
      v->members = d.at("members").get<uint64_t>();
      v->leader = d.at("leader").get<std::string>();
      if (auto it = d.find("newest_gate_us"); it != d.end() && !it->is_null()) v->newest = it->get<int64_t>();
      if (auto it = d.find("baton"); it != d.end()) {
        v->baton_holder = it->at("holder").get<std::string>();
        v->baton_gate = it->at("gate_us").get<int64_t>();
        v->baton_next = !it->at("next").empty();
        for (const Json& x : it->at("before")) {
          Record r;
          const std::string node = x.at("node").get<std::string>();
          if (const std::string why = ParseRecord(node, x.at("record").get<std::string>(), now, &r); !why.empty()) {
            // Not one this node accepts (a clock ahead): no baton, the turn comes.
            LOG_INFO("cluster {}: a baton naming {}'s record is not used: {}", opt_.name, node, why);
            v->baton_holder.clear();
            break;
          }
          v->baton_before.push_back(std::move(r));
        }
      }
      for (const Json& x : d.at("records")) {
        const std::string node = x.at("node").get<std::string>();
        Record r;
        if (!ParseRecord(node, x.at("record").get<std::string>(), now, &r).empty() || r.state != "live") continue;
        v->carried.emplace(node, r);
        if (node != opt_.node) v->others.push_back(std::move(r));
      }
      for (const Json& x : d.at("refused")) {
        Record r;
        r.node = x.at("node").get<std::string>();
        r.heartbeat_us = x.at("heartbeat_us").get<int64_t>();
        r.unpersisted = x.at("unpersisted").get<uint64_t>();
        r.problem = x.at("reason").get<std::string>();
        v->refused.push_back(std::move(r));
      }
      for (const Json& x : d.at("lost")) {
        Record r;
        r.node = x.at("node").get<std::string>();
        r.incarnation = x.value("incarnation", std::string());
        r.unpersisted = x.at("unpersisted").get<uint64_t>();
        r.at_risk = x.value("at_risk", r.unpersisted);
        r.paths = x.at("paths").get<std::vector<std::string>>();
        r.heartbeat_us = x.at("heartbeat_us").get<int64_t>();
        if (auto it = x.find("unsafe_gate_us"); it != x.end() && !it->is_null()) r.unsafe_gate_us = it->get<int64_t>();
        r.problem = x.value("noticed", std::string());
        r.state = "live";
        v->lost.push_back(std::move(r));
      }
      if (auto it = d.find("clashes"); it != d.end())  // since stop 55
        v->clashes = it->get<std::vector<std::string>>();
    } catch (const std::exception& e) {
      MutexLock lk(&mu_);
      const std::string msg = std::string("the members' digest is not readable: ") + e.what();
      if (digest_problem_ != msg) LOG_WARN("cluster {}: {}", opt_.name, msg);
      digest_problem_ = msg;
      return;
    }
    MutexLock lk(&mu_);
    digest_text_ = digest;
    digest_view_ = view = std::move(v);
  }
  const std::vector<Record>& others = view->others;
  const std::vector<Record>& refused = view->refused;
  const std::vector<Record>& lost = view->lost;
  const int64_t as_of = view->as_of, newest = view->newest;
  const uint64_t members = view->members;
  const std::string& leader = view->leader;
  MutexLock lk(&mu_);
  if (as_of > now + skew) {
    // The elected member's clock is ahead: its reads cannot stand for a
    // time this node has not reached.
    const std::string msg = fmt::format("the digest of member {} is dated {:.3f} s in this node's future", leader,
                                        static_cast<double>(as_of - now) / (1000 * kUsPerMs));
    if (digest_problem_ != msg) LOG_ERROR("cluster {}: {}; it is not used", opt_.name, msg);
    digest_problem_ = msg;
    return;
  }
  // A summary and this member's turn come by two watches: the older of
  // the two says less, but it may hand this member a baton.
  if (as_of < digest_as_of_) {
    TakeBatonLocked(*view);
    return;
  }
  if (!digest_problem_.empty()) LOG_INFO("cluster {}: the members' digest is readable again", opt_.name);
  digest_problem_.clear();
  digest_seen_ = view->carried;
  digest_as_of_ = as_of;
  digest_lost_.clear();
  if (!clash_noted_ && std::find(view->clashes.begin(), view->clashes.end(), opt_.node) != view->clashes.end()) {
    clash_noted_ = true;
    LOG_ERROR(
        "cluster {}: another mount writes records as node {} (the elected member saw two runs of this id in "
        "turn); give each mount its own --node",
        opt_.name, opt_.node);
  }
  auto carried = [&](const Record& r) {  // its run's record is among the deciding: it is back
    return std::any_of(others.begin(), others.end(), [&](const Record& o) {
      return o.node == r.node && SameIncarnation(o.incarnation, r.incarnation);
    });
  };
  for (const Record& r : lost) {
    if (!carried(r)) digest_lost_.push_back(r);
    if (std::find(dead_noted_.begin(), dead_noted_.end(), NotedName(r)) != dead_noted_.end()) continue;
    LOG_WARN("cluster {}: member {} is dead (its lease expired, or a new run mounted under its id); {}", opt_.name,
             r.node, LostFilesText(r.unpersisted, r.at_risk, r.paths));
    dead_noted_.push_back(NotedName(r));
  }
  // Back: a member named lost whose record is among the deciding again.
  for (const Record& r : others)
    if (auto it = std::find(dead_noted_.begin(), dead_noted_.end(), NotedName(r)); it != dead_noted_.end()) {
      LOG_INFO("cluster {}: member {} is back ({})", opt_.name, r.node, r.state);
      dead_noted_.erase(it);
    }
  std::string refused_by;
  for (const Record& r : refused)
    if (r.node == opt_.node && r.heartbeat_us >= now - opt_.member_timeout_ms * kUsPerMs &&
        r.heartbeat_us <= now + skew)
      refused_by = leader;
  if (refused_by != refused_by_) {
    if (!refused_by.empty())
      LOG_ERROR(
          "cluster {}: member {} (elected) refuses this node's records: this node's clock is ahead by more than "
          "--max-clock-skew ({} ms); this node publishes nothing until it is no longer refused (its files stay "
          "in memory): fix the clocks (NTP)",
          opt_.name, refused_by, opt_.max_skew_ms);
    else LOG_INFO("cluster {}: no member refuses this node's records any more", opt_.name);
    refused_by_ = refused_by;
  }
  // A record of this node newer than every pending gate + skew (Tick writes
  // it once the clock is there): then no pending entry waits for this node.
  need_us_ = newest > 0 && newest <= now + skew ? newest + skew : 0;
  others_ = others;
  TakeBatonLocked(*view);
  refused_ = refused;
  read_at_ = as_of;
  members_total_ = members;
  leader_ = leader;
  self_missing_ = false;
  NoteLostLocked(now);
}

}  // namespace ckpt::fs
