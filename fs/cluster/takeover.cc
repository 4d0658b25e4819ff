// takeover.cc — see takeover.h.
#include "fs/cluster/takeover.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/config.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "fs/drain/drain.h"

namespace ckpt::fs::replica {
namespace {

constexpr auto kPeriod = std::chrono::milliseconds(200);
constexpr auto kLiveCheck = std::chrono::seconds(5);
constexpr auto kNamedWithin = std::chrono::seconds(10);

std::string UnreadableMeta(const Held& h) {
  return "replica " + h.key.Name() + " of dead node " + h.key.writer + ": its meta is unreadable";
}

// Errors no retry mends (the backend refuses the name or its place):
// kept, such a replica would hold every member's drain for ever.
bool Permanent(int e) {
  return e == EINVAL || e == ENAMETOOLONG || e == ELOOP || e == ENOTDIR || e == EISDIR || e == EPERM || e == EACCES;
}

// A claimed entry's mark, kept on the tier until it is in etcd
// (Store::KeepNote): a holder restarted meanwhile marks what it decided,
// with the give-up's names, instead of guessing from its replicas (a
// give-up drops its replica, and "claimed, no replica" read as a give-up
// of unknown names: "*", every later entry of that run poisoned).
// The note's key: the claim's (writer, run, seq).
std::string NoteKey(const std::tuple<std::string, std::string, uint64_t>& k) {
  return std::get<0>(k) + '\0' + std::get<1>(k) + '\0' + std::to_string(std::get<2>(k));
}
// Its text: STATUS GATE_US '\n' NAMES (the gate: the replica's, which a
// give-up's names hold back in this holder's record until they are in).
struct MarkNote {
  char status = 0;
  uint64_t gate_us = 0;
  std::string names;
};
std::string EncodeMarkNote(const MarkNote& n) {
  return std::string(1, n.status) + std::to_string(n.gate_us) + "\n" + n.names;
}
std::optional<MarkNote> DecodeMarkNote(std::string_view text) {
  const size_t nl = text.find('\n');
  if (text.empty() || nl == std::string_view::npos) return std::nullopt;
  MarkNote n;
  n.status = text[0];
  auto [p, ec] = std::from_chars(text.data() + 1, text.data() + nl, n.gate_us);
  if (ec != std::errc() || p != text.data() + nl) return std::nullopt;
  if (n.status != EtcdRecords::kDone && n.status != EtcdRecords::kGaveUp) return std::nullopt;
  n.names = text.substr(nl + 1);
  return n;
}
// The note of claim `k`, if one was kept and reads.
std::optional<MarkNote> NoteOf(const Store& store, const std::tuple<std::string, std::string, uint64_t>& k) {
  auto text = store.Note(NoteKey(k));
  if (!text) return std::nullopt;
  auto note = DecodeMarkNote(*text);
  if (!note)
    LOG_WARN("replicas: node {}'s entry {} (run {}): the note of its mark is unreadable: ignored", std::get<0>(k),
             std::get<2>(k), std::get<1>(k));
  return note;
}

// What the backend holds at a replica's path, against the replica: a file
// with its bytes, with the writer's mtime (a takeover's publish sets it),
// or with a later one. All false: nothing there, or not a file.
struct AtName {
  bool same_bytes = false, same_mtime = false, newer = false;
};
AtName WhatIsAt(backend::Backend* backend, const Held& h, const FileMeta& m) {
  AtName at;
  auto st = backend->Stat(m.path);
  if (!st || st->type != backend::Entry::Type::kFile) return at;
  at.same_bytes = st->has_checksum && st->checksum_hi == h.hash_hi && st->checksum_lo == h.hash_lo;
  at.same_mtime = st->mtime_sec == m.mtime_sec && st->mtime_nsec == m.mtime_nsec;
  at.newer = st->mtime_sec > m.mtime_sec || (st->mtime_sec == m.mtime_sec && st->mtime_nsec > m.mtime_nsec);
  return at;
}

}  // namespace

Takeover::Takeover(std::string node, Store* store, Cluster* cluster, EtcdRecords* records, Peers* peers,
                   backend::Backend* backend)
    : node_(std::move(node)), store_(store), cluster_(cluster), records_(records), peers_(peers), backend_(backend) {}

Takeover::~Takeover() { Stop(); }

void Takeover::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Takeover::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

namespace {
constexpr size_t kAtRiskPaths = 1000;  // as many as a record names (Cluster::MakeRecord cuts them to its size)
}  // namespace

HeldForOthers Takeover::Holding(bool dead_too) const {
  HeldForOthers out;
  if (const uint64_t g = store_->MinGate(); g != 0) out.gate = static_cast<int64_t>(g) + 1;
  MutexLock l(&mu_);
  for (const auto& [k, g] : gaveup_unmarked_)  // given up, its names not in etcd yet (PublishFor)
    if (!out.gate || g + 1 < *out.gate) out.gate = g + 1;
  if (!dead_too) return out;
  for (const auto& [writer, d] : dead_held_) {
    if (d.dead_gate && (!out.dead_gate || *d.dead_gate < *out.dead_gate)) out.dead_gate = d.dead_gate;
    out.dead_files += d.dead_files;
    for (const std::string& p : d.dead_paths)
      if (out.dead_paths.size() < kAtRiskPaths) out.dead_paths.push_back(p);
  }
  return out;
}

void Takeover::NoteAtRisk(const std::string& writer, std::span<const Replica> dead) {
  HeldForOthers d;  // its `gate` left unset, as in every dead_held_ entry (SameHeld compares it too)
  for (const Replica& r : dead) {
    const auto g = static_cast<int64_t>(r.held.gate_us);
    if (!d.dead_gate || g < *d.dead_gate) d.dead_gate = g;
    if (r.held.key.ino == kEntryIno) continue;  // a namespace entry: its gate, no file
    d.dead_files++;
    if (r.meta && d.dead_paths.size() < kAtRiskPaths) d.dead_paths.push_back(r.meta->path);
  }
  bool changed;
  {
    MutexLock l(&mu_);
    auto it = dead_held_.find(writer);
    changed = dead.empty() ? it != dead_held_.end() : it == dead_held_.end() || !SameHeld(it->second, d);
    if (dead.empty()) {
      if (it != dead_held_.end()) dead_held_.erase(it);
    } else {
      dead_held_[writer] = std::move(d);
    }
  }
  // Written before this holder publishes any of them (its record names
  // them at risk while it does), not at the next heartbeat.
  if (changed && cluster_) cluster_->Poke();
}

Takeover::Stats Takeover::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

Takeover::Outcome Takeover::Lose(const std::string& why) {
  // Told as it is: the file is lost (the others' drains go on without it).
  LOG_ERROR("replicas: {}: not published, the replica is dropped and the dead node's file lost", why);
  MutexLock l(&mu_);
  stats_.lost++;
  stats_.failures++;
  stats_.last_error = why;
  return Outcome::kLost;
}

void Takeover::Fail(const std::string& why) {
  MutexLock l(&mu_);
  stats_.failures++;
  if (why != stats_.last_error) LOG_ERROR("replicas: {}", why);
  stats_.last_error = why;
}

void Takeover::Loop() {
  for (;;) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    Pass();
    MutexLock l(&mu_);
    if (!stop_) cv_.WaitFor(&mu_, kPeriod);
  }
}

const std::string& Replica::run() const {
  static const std::string kUnknown;
  return meta ? meta->incarnation : kUnknown;
}

bool Takeover::Claimed(const std::string& writer, const Replica& r) const {
  auto it = claimed_.find({writer, r.run()});
  return it != claimed_.end() && it->second.count(r.seq());
}

bool Takeover::Mark(const std::string& writer, const Replica& r, char status, std::optional<std::string> names) {
  auto it = claimed_.find({writer, r.run()});
  if (it == claimed_.end() || !it->second.count(r.seq())) return true;
  it->second[r.seq()] = status;
  const std::tuple k{writer, r.run(), r.seq()};
  unmarked_.insert(k);
  // On the tier first: the give-up drops the replica right after (keeps
  // it, if this note cannot be written), and the mark may not go in
  // before this daemon stops.
  const std::string key = NoteKey(k);
  auto st = store_->KeepNote(key, EncodeMarkNote({status, r.held.gate_us, names.value_or("")}));
  if (!st)
    LOG_WARN(
        "replicas: node {}'s entry {} (run {}): cannot keep its mark on the tier until it is in etcd ({}): its "
        "replica is kept instead, until the mark is in",
        writer, r.seq(), r.run(), ErrStr(st.error()));
  if (names) mark_names_[k] = std::move(*names);
  MarkPending();
  return st.has_value();
}

void Takeover::Unmark(const std::tuple<std::string, std::string, uint64_t>& k) {
  unmarked_.erase(k);
  mark_names_.erase(k);
  store_->DropNote(NoteKey(k));
  bool let_go;
  {
    MutexLock l(&mu_);
    let_go = gaveup_unmarked_.erase(k) > 0;
  }
  if (let_go && cluster_) cluster_->Poke();
}

void Takeover::MarkPending() {
  std::set<std::tuple<std::string, std::string, uint64_t>> landed;
  for (auto it = unmarked_.begin(); it != unmarked_.end();) {
    const auto& [writer, run, seq] = *it;
    auto names = mark_names_.find(*it);
    if (auto st = records_->MarkTaken(writer, run, seq, claimed_[{writer, run}][seq],
                                      names == mark_names_.end() ? nullptr : &names->second);
        !st) {
      Fail("cannot record in etcd what became of node " + writer +
           "'s claimed entries (its drain waits for it): " + records_->client()->LastError());
      break;  // next pass
    }
    landed.insert(*it);
    store_->DropNote(NoteKey(*it));
    if (names != mark_names_.end()) mark_names_.erase(names);
    it = unmarked_.erase(it);
  }
  if (landed.empty()) return;
  bool let_go = false;
  {
    MutexLock l(&mu_);
    for (const auto& k : landed) let_go = gaveup_unmarked_.erase(k) > 0 || let_go;
  }
  if (let_go && cluster_) cluster_->Poke();  // the given-up gates' names are in: the others go on
  // A namespace entry's replica, kept (retired) until its mark was in: a
  // holder restarted before that finds it and marks it done, not given up;
  // and a given-up one kept unpublished (its mark not noted: PublishFor).
  // A published file's copy, kept from eviction while its mark was not
  // in (Act), may go for room now.
  std::set<std::string> writers;
  for (const auto& k : landed) writers.insert(std::get<0>(k));
  for (Held& h : store_->List()) {
    if (!writers.count(h.key.writer)) continue;
    const Replica r(std::move(h));
    if (!landed.count({r.held.key.writer, r.run(), r.seq()})) continue;
    store_->Unkeep(r.held.key);
    if (r.held.key.ino != kEntryIno && r.held.published) continue;
    if (r.held.published || claimed_[{r.held.key.writer, r.run()}][r.seq()] == EtcdRecords::kGaveUp)
      (void)store_->Drop(r.held.key);
  }
}

bool Takeover::KeptGivenUp(const std::string& writer, const Replica& r) {
  // Given up here and kept for its names until the mark is in; once it is
  // (read back after a restart, or landed), nothing needs it. Not for a
  // replica whose meta is unreadable: (run "", seq 0) names no one entry.
  if (r.seq() == 0) return false;
  auto run = claimed_.find({writer, r.run()});
  if (run == claimed_.end()) return false;
  auto c = run->second.find(r.seq());
  if (c == run->second.end() || c->second != EtcdRecords::kGaveUp) return false;
  if (!unmarked_.count({writer, r.run(), r.seq()}) && store_->Drop(r.held.key))
    LOG_WARN("replicas: node {}'s entry {} (run {}) was given up here and its mark is in: its replica is dropped",
             writer, r.seq(), r.run());
  return true;
}

bool Takeover::ReadBack() {
  const uint64_t standing = records_->Standings();  // before the read: a later standing reads again
  EtcdRecords::OthersClaims others;
  auto all = records_->AllOwnClaims(&others);
  if (!all) {
    Fail("cannot read back this holder's claims in etcd: " + records_->client()->LastError());
    return false;
  }
  std::map<std::tuple<std::string, std::string, uint64_t>, Held> held;
  for (Held& h : store_->List()) {
    if (h.key.writer == node_) continue;
    Replica r(std::move(h));
    std::tuple k{r.held.key.writer, r.run(), r.seq()};
    held[std::move(k)] = std::move(r.held);
  }
  auto drop = [&](const std::tuple<std::string, std::string, uint64_t>& k, const char* why) {
    auto h = held.find(k);
    if (h == held.end()) return;
    LOG_WARN("replicas: node {}'s entry {} (run {}): {}: its replica is dropped, not published", std::get<0>(k),
             std::get<2>(k), std::get<1>(k), why);
    (void)store_->Drop(h->second.key);
    held.erase(h);
  };
  // Claimed before and gone from etcd: the writer's drain went past it
  // (it deletes only those): the writer applied or completed it.
  for (auto& [run, claims] : claimed_)
    for (auto it = claims.begin(); it != claims.end();) {
      auto found = all->find(run);
      if (found != all->end() && found->second.count(it->first)) {
        ++it;
        continue;
      }
      const std::tuple k{run.first, run.second, it->first};
      Unmark(k);
      drop(k, "its writer went past it");
      it = claims.erase(it);
    }
  passed_over_.clear();
  bool held_back = false;  // a given-up gate held again (a note): the record says so now
  for (const auto& [run, claims] : *all)
    for (const auto& [seq, status] : claims) {
      const std::tuple k{run.first, run.second, seq};
      if (status == EtcdRecords::kRevoked) {
        claimed_[run].erase(seq);
        Unmark(k);
        drop(k, "its writer took the claim back while this holder was gone and applied it itself");
        continue;
      }
      if (unmarked_.count(k)) continue;  // this holder's mark, not in etcd yet
      char& mine = claimed_[run][seq];
      mine = status;
      if (status != EtcdRecords::kClaimed) continue;
      auto h = held.find(k);
      // What this holder decided before it stopped, kept on the tier
      // until the mark was in (Mark): marked as decided, with its names;
      // its replica, if this holder stopped before it let it go, let go
      // as then (dropped after a give-up, kept published after a publish).
      if (auto note = NoteOf(*store_, k)) {
        if (h != held.end() && !h->second.published &&
            (note->status == EtcdRecords::kGaveUp || !store_->Retire(h->second.key)))
          drop(k, "it was decided here before this holder stopped");
        mine = note->status;
        if (!note->names.empty()) mark_names_[k] = note->names;
        if (note->status == EtcdRecords::kGaveUp) {
          poison_[run].Add(seq, DecodePoison(note->names));
          MutexLock l(&mu_);  // its names not in etcd: its gate held (Pass)
          gaveup_unmarked_[k] = static_cast<int64_t>(note->gate_us);
          held_back = true;
        }
        unmarked_.insert(k);
        continue;
      }
      // Claimed, not marked, undecided: redone while the replica waits,
      // unpublished (the pass publishes it) — unless another holder
      // claimed a later entry of that run: it went past this one while
      // this holder was gone (its record no longer named the gate), and
      // this one, done now, would undo what came after it (Act:
      // PassedOver). Marked as what its replica says otherwise.
      if (h != held.end() && !h->second.published) {
        if (auto o = others.find(run); o != others.end() && o->second.last > seq)
          passed_over_[k] = o->second.done.count(seq);
        continue;
      }
      mine = h != held.end() ? EtcdRecords::kDone : EtcdRecords::kGaveUp;
      if (h != held.end()) (void)store_->Keep(h->second.key);  // no note: until the mark is in (MarkPending)
      if (h == held.end()) {
        LOG_WARN(
            "replicas: node {}'s entry {} (run {}) was claimed here and its replica is gone: given up (the "
            "writer applies it itself), and every later entry of that run with it",
            run.first, seq, run.second);
        poison_[run].Add(seq, Poison::All());  // its names, nothing here says
        mark_names_[k] = EncodePoison(Poison::All());
      }
      unmarked_.insert(k);
    }
  // Notes of marks that went in, or of claims gone, before this holder
  // stopped: nothing owes them.
  std::set<std::string> owed;
  for (const auto& k : unmarked_) owed.insert(NoteKey(k));
  for (const std::string& key : store_->NoteKeys())
    if (!owed.count(key)) store_->DropNote(key);
  // Published copies, all kept since the store opened (KeepPublished):
  // only those whose done mark is neither in etcd nor noted (a note that
  // reads) stay kept. Over the store, not `held`: replicas whose metas
  // name no run or seq share one key there.
  for (Held& h : store_->List()) {
    if (h.key.writer == node_) {
      store_->Unkeep(h.key);  // no claim of this holder's own
      continue;
    }
    const Replica r(std::move(h));
    const std::tuple k{r.held.key.writer, r.run(), r.seq()};
    if (!unmarked_.count(k) || NoteOf(*store_, k)) store_->Unkeep(r.held.key);
  }
  if (held_back && cluster_) cluster_->Poke();
  std::erase_if(claimed_, [](const auto& kv) { return kv.second.empty(); });
  standing_seen_ = standing;
  reread_ = false;
  MarkPending();
  return true;
}

bool Takeover::Claim(const std::string& writer, const Replica& r, int64_t writer_rev) {
  // Standing again since the claims were read (this node's lease lapsed):
  // some may be revoked; read after MayPublishAs said it stands, so a
  // revocation is seen here or refused (takeover.h).
  if (records_->Standings() != standing_seen_) {
    (void)ReadBack();
    return false;  // what it dropped may be among this pass's: decided again next pass
  }
  if (Claimed(writer, r)) {
    store_->SetClaimed(r.held.key);
    return true;
  }
  // That entry's key alone: a claim costs the same at the first entry
  // taken over as at the 100,000th.
  auto ok = records_->ClaimTaken(writer, r.run(), r.seq(), writer_rev);
  if (!ok) {
    // Not known (the claim may be in: every claim is read back before
    // anything is decided, its writer back or not).
    reread_ = true;
    Fail("cannot claim node " + writer + "'s entries in etcd: " + records_->client()->LastError());
    return false;
  }
  if (!*ok) return false;  // its record changed since it was read: decided again next pass
  claimed_[{writer, r.run()}][r.seq()] = EtcdRecords::kClaimed;
  store_->SetClaimed(r.held.key);  // the writer's DROP no longer removes it: this holder publishes it
  return true;
}

void Takeover::Pass() {
  // This holder's claims, read back (a restarted holder still owes them;
  // one back under a new lease may have lost some) before any is claimed
  // anew or published; the replicas it dropped then are not this pass's.
  if (reread_ || records_->Standings() != standing_seen_)
    if (!ReadBack()) return;  // the store is unreachable: nothing can be decided
  (void)store_->NameUnnamed();  // publishes whose rename failed: named now, if the tier lets it
  // Each replica's meta decoded here, once a pass.
  std::map<std::string, std::vector<Replica>> by_writer;
  for (Held& h : store_->List())  // published ones are only kept to serve loads
    if (h.key.writer != node_ && !h.published) by_writer[h.key.writer].emplace_back(std::move(h));
  MarkPending();
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(checked_, [&](const auto& kv) { return !by_writer.count(kv.first); });
  std::erase_if(gone_, [&](const auto& kv) { return !by_writer.count(kv.first); });
  std::erase_if(poison_, [&](const auto& kv) { return !by_writer.count(kv.first.first); });
  std::erase_if(gaveup_seen_, [&](const auto& kv) { return !by_writer.count(kv.first.first); });
  std::erase_if(poison_gate_, [&](const auto& kv) { return !by_writer.count(kv.first); });
  {
    MutexLock l(&mu_);  // a writer none of whose replicas is left: nothing of it at risk here
    std::erase_if(dead_held_, [&](const auto& kv) { return !by_writer.count(kv.first); });
  }
  for (auto& [writer, held] : by_writer) {
    // A writer whose replica link is still advertised (its key goes with
    // its lease, as its record does) is live: its record is read only
    // every kLiveCheck, to drop what it applied and whose DROP was lost.
    // O(1) requests a holder every few seconds, not one a writer a pass.
    if (!peers_->addr_of(writer).empty() && !gone_.count(writer)) {
      auto& at = checked_[writer];
      if (now - at < kLiveCheck) continue;
      at = now;
    }
    // The writer's record: there while its lease is (etcd deletes it when
    // the lease expires); what it says is applied.
    auto r = records_->client()->Range(records_->prefix() + "members/" + writer);
    if (!r) return;  // the store is unreachable: nothing can be decided
    const bool gone = r->kvs.empty() || r->kvs[0].lease == 0;
    const int64_t writer_rev = r->kvs.empty() ? 0 : r->kvs[0].mod_revision;
    WriterRecord w;
    std::string incarnation;
    if (!gone) {
      try {
        auto j = nlohmann::json::parse(r->kvs[0].value);
        w.heartbeat_us = j.at("heartbeat_us").get<int64_t>();
        if (!j.at("oldest_gate_us").is_null()) w.oldest_gate_us = j.at("oldest_gate_us").get<int64_t>();
        incarnation = Incarnation(j);
        // Its log position means this run's (a seq of another run is no
        // measure of it): unknown run, unknown position.
        if (j.contains("applied_seq") && !incarnation.empty()) w.applied_seq = j.at("applied_seq").get<uint64_t>();
      } catch (const std::exception&) {
        continue;  // not a record this version reads: keep the replicas
      }
    }
    // Replicas of another run of this id (a new machine mounted under it
    // with a new state dir: its record is there, its files numbered from 1
    // again) are a dead writer's, as when the record is gone: published in
    // its place, never collected by what the new run's record says.
    auto dead_end = std::stable_partition(held.begin(), held.end(), [&](const Replica& rep) {
      return gone || (rep.meta && !SameIncarnation(rep.meta->incarnation, incarnation));
    });
    if (dead_end != held.begin()) {
      // Not before the cluster names it lost (the elected member's digest,
      // from its last record): then this node knows from which gate on its
      // entries were lost, and keeps its removals ordered after them out
      // of the backend (LostWindows). A writer that had nothing pending is
      // never named: after kNamedWithin, its replicas go all the same.
      auto& since = gone_[writer];
      if (since == std::chrono::steady_clock::time_point{}) since = now;
      std::set<std::string> runs;  // each run of the id whose replicas these are: each named
      for (auto it = held.begin(); it != dead_end; ++it) runs.insert(it->run());
      NoteAtRisk(writer, {held.begin(), dead_end});  // lost with this node while it publishes them
      const bool named =
          std::all_of(runs.begin(), runs.end(), [&](const std::string& run) { return NamedLost(writer, run); });
      if (named || now - since >= kNamedWithin)
        PublishFor(writer, std::vector<Replica>(held.begin(), dead_end), writer_rev);
      continue;
    }
    gone_.erase(writer);
    if (w.applied_seq) ForgetApplied({writer, incarnation}, *w.applied_seq);
    // A live writer's claimed replicas are not lost with this node: the
    // writer has the bytes, and takes a gone holder's claim back.
    NoteAtRisk(writer, {});
    // Claimed while the writer was dead: it skips them, so they are this
    // holder's to publish, live writer or not — unless its record shows
    // the entry applied: applied before it died (the claim then pruned),
    // or completed after this holder's mark (then published already).
    auto claimed_end = std::stable_partition(held.begin(), held.end(), [&](const Replica& rep) {
      if (!Claimed(writer, rep)) return false;
      if (ShowsApplied(w, rep)) return false;  // dropped below, as any applied replica
      store_->SetClaimed(rep.held.key);        // (again after a restart of this holder)
      return true;
    });
    if (claimed_end != held.begin()) {
      PublishFor(writer, std::vector<Replica>(held.begin(), claimed_end), writer_rev);
      continue;
    }
    for (const Replica& rep : held) {
      if (ShowsApplied(w, rep) && store_->Drop(rep.held.key)) {
        LOG_DEBUG("replicas: node {} applied {} (its record says so): dropped", writer, rep.held.key.Name());
        MutexLock l(&mu_);
        stats_.collected++;
      }
    }
  }
}

void Takeover::ForgetApplied(const std::pair<std::string, std::string>& run, uint64_t applied) {
  auto up_to = [applied](auto& by_seq) { std::erase_if(by_seq, [&](const auto& kv) { return kv.first <= applied; }); };
  if (auto p = poison_.find(run); p != poison_.end()) up_to(p->second.by_seq);
  if (auto g = gaveup_seen_.find(run); g != gaveup_seen_.end()) {
    up_to(g->second.by_seq);
    std::erase_if(g->second.applied, [&](uint64_t seq) { return seq <= applied; });
    g->second.view = PoisonFromHolders(g->second.by_seq);
  }
}

bool ShowsApplied(const WriterRecord& w, const Replica& r) {
  // By its log position where the record gives it and the replica says
  // which entry it is: exact across the writer's restarts. Its times are
  // not: the entries it recovers get their gates from its samples, later
  // than the exact ones its replicas were sent with, and the times said
  // applied a replica that was still pending (its only copy then went).
  const std::optional<FileMeta>& m = r.meta;
  if (w.applied_seq && m && m->seq > 0 && !m->incarnation.empty()) return *w.applied_seq >= m->seq;
  const auto g = static_cast<int64_t>(r.held.gate_us);
  return w.heartbeat_us >= g && (!w.oldest_gate_us || *w.oldest_gate_us > g);
}

bool Takeover::NamedLost(const std::string& writer, const std::string& incarnation) {
  const ClusterStatus st = cluster_->Status();
  return std::any_of(st.members.begin(), st.members.end(), [&](const ClusterMember& m) {
    return m.node == writer && m.state == "dead" && SameIncarnation(m.incarnation, incarnation);
  });
}

void Takeover::PublishFor(const std::string& writer, std::vector<Replica> held, int64_t writer_rev) {
  // The writer's order: its gates are one µs apart at least (OpLog), so
  // (gate, seq) is its log order across every holder.
  std::sort(held.begin(), held.end(), [](const Replica& a, const Replica& b) {
    return a.held.gate_us != b.held.gate_us ? a.held.gate_us < b.held.gate_us : a.seq() < b.seq();
  });
  for (const Replica& r : held) {
    const Held& h = r.held;
    {
      MutexLock l(&mu_);
      if (stop_) return;
    }
    if (KeptGivenUp(writer, r)) continue;
    // Another holder's record names its earliest held gate + 1 µs (so that
    // a live writer never waits for its own replica): asked as gate + 1, an
    // entry of this writer held elsewhere with an earlier gate holds this
    // one back, however close — a rename never goes before the file it moves.
    if (!cluster_->MayPublishAs(static_cast<int64_t>(h.gate_us) + 1, writer)) return;  // next pass
    // An entry whose names an earlier given-up one of this run touches is
    // given up too, and so on (poison.h): applied, it would act on other
    // objects than on the writer. One whose names are unknown poisons
    // every later one. The other holders' give-ups are read here, after
    // the order let this entry through: a holder keeps naming a given-up
    // entry's gate until its names are in etcd (gaveup_unmarked_), so a
    // read after its record moved on has them.
    GaveUpSeen& others = gaveup_seen_[{writer, r.run()}];
    auto came = records_->ReadGaveUp(writer, r.run(), &others.by_seq, &others.rev);
    if (!came) {
      Fail("cannot read the other holders' give-ups of node " + writer + ": " + records_->client()->LastError());
      return;  // next pass
    }
    if (*came > 0) {
      others.view = PoisonFromHolders(others.by_seq);
      others.applied.clear();  // asked again (a seq the writer numbered again may be given up anew)
    }
    if (!Claim(writer, r, writer_rev)) return;
    PoisonView& own = poison_[{writer, r.run()}];
    const PoisonView* poison = &others.view;
    PoisonView both;
    if (!own.by_seq.empty()) {
      both = others.view;
      for (const auto& [seq, p] : own.by_seq) both.Add(seq, p);
      poison = &both;
    }
    auto e = EntryOf(r);
    if (!e && e.error() == Outcome::kLater) return;
    const Outcome o = e ? Act(r, *e, *poison) : Outcome::kLost;
    if (o == Outcome::kLater) return;
    // A file replica whose meta is unreadable: its run, seq and names are
    // unknown, so no run's poison would name it; every later entry of this
    // writer held here is given up (by its gate). The other holders do not
    // learn of it (docs/replicas.md).
    if (const auto blind = poison_gate_.find(writer);
        o == Outcome::kLost && r.seq() == 0 && (blind == poison_gate_.end() || h.gate_us < blind->second))
      poison_gate_[writer] = h.gate_us;
    // Told to the writer through its claim: done, or given up (then the
    // writer, if it comes back, applies the entry itself, in its order);
    // a give-up with its names, for the other holders — and a done entry
    // another holder gave up with "+" (it poisons nothing; a done mark
    // also says so by seq, for a give-up read before it: Act).
    std::optional<std::string> names;
    if (o == Outcome::kLost) {
      Poison p = e ? PoisonOf(*e) : Poison::All();
      names = EncodePoison(p);
      own.Add(r.seq(), std::move(p));
    } else if (others.by_seq.count(r.seq())) {
      names = kAppliedText;
    }
    const bool noted =
        Mark(writer, r, o == Outcome::kLost ? EtcdRecords::kGaveUp : EtcdRecords::kDone, std::move(names));
    const bool unmarked = unmarked_.count({writer, r.run(), r.seq()}) > 0;
    if (o == Outcome::kLost && unmarked) {
      // Its names not in etcd yet: its gate stays in this holder's record
      // until they are, or another holder could apply a later entry on
      // them without knowing (MarkPending lets it go).
      MutexLock l(&mu_);
      gaveup_unmarked_[{writer, r.run(), r.seq()}] = static_cast<int64_t>(h.gate_us);
    }
    // Kept, published, while its room is not needed: the replacement node
    // and the others load it from here (this holder is its home now). A
    // namespace entry, once applied, serves nothing: kept (published, so no
    // pass applies it again) only until its mark is in (MarkPending).
    // A give-up whose mark is neither in etcd nor noted on the tier keeps
    // its replica, unpublished, until the mark is in (MarkPending): a
    // restart reads its names from it, not "*" (every later entry lost).
    // A published copy whose done mark is neither in etcd nor noted is
    // kept from eviction until the mark is in (Retire's keep; MarkPending
    // lets it go): a restart with neither note nor copy would read
    // "claimed, no replica" and give the applied entry up, and the
    // writer, back, would apply it again.
    if (o == Outcome::kLost && unmarked && !noted && r.seq() != 0) {
    } else if (o == Outcome::kLost || !store_->Retire(h.key, unmarked && !noted)) {
      (void)store_->Drop(h.key);
    } else if (h.key.ino == kEntryIno && !unmarked) {
      (void)store_->Drop(h.key);
    }
    if (o == Outcome::kLost) FAILPOINT("takeover.gave_up");
    cluster_->Poke();  // the record no longer names this gate (once its mark is in): the others go on
  }
}

std::expected<meta::LogEntry, Takeover::Outcome> Takeover::EntryOf(const Replica& r) {
  const Held& h = r.held;
  if (h.key.ino != kEntryIno) {
    if (!r.meta) return std::unexpected(Lose(UnreadableMeta(h)));
    meta::LogEntry e;
    e.seq = r.seq();
    e.op = meta::LogOp::kPersist;
    e.ino = h.key.ino;
    e.path = r.meta->path;
    return e;
  }
  const std::string what = "node " + h.key.writer + "'s namespace entry " + std::to_string(h.key.version);
  auto held = store_->OpenHeld(h.key);
  if (!held) {
    Fail("cannot open the replica of " + what + ": " + ErrStr(held.error()));
    return std::unexpected(Outcome::kLater);
  }
  std::string bytes(std::min<uint64_t>(h.size, 1u << 20), '\0');
  const ssize_t got = pread(held->first, bytes.data(), bytes.size(), 0);
  close(held->first);
  if (got != static_cast<ssize_t>(bytes.size())) return std::unexpected(Lose("cannot read " + what));
  auto e = meta::DecodeLogEntry(bytes);
  if (!e || e->op == meta::LogOp::kPersist) return std::unexpected(Lose(what + ": not an entry this version reads"));
  e->seq = r.seq();  // its place in the writer's log is the replica's version
  return std::move(*e);
}

Takeover::Outcome Takeover::Act(const Replica& r, const meta::LogEntry& e, const PoisonView& poison) {
  if (auto p = passed_over_.find({r.held.key.writer, r.run(), r.seq()}); p != passed_over_.end()) {
    const bool done_elsewhere = p->second;
    passed_over_.erase(p);
    return PassedOver(r, e, done_elsewhere);
  }
  // Poisoned by an earlier give-up — unless a holder of that entry (K > 1)
  // marked it done: done wins, whichever mark landed first (a done mark
  // says so by seq; asked here, for the few seqs that poison, not read
  // with the give-ups at every entry) — or the writer, back, applied it
  // (its prune took the give-ups: read before, they still poison here —
  // pruned means gone from etcd, so only a give-up read there, this
  // holder's own marked ones included, and not one still owed). Each
  // answer that it is applied is kept until new give-ups come (PublishFor).
  PoisonView rest;
  const PoisonView* view = &poison;
  const std::string& writer = r.held.key.writer;
  GaveUpSeen& seen = gaveup_seen_[{writer, r.run()}];
  for (std::optional<uint64_t> by = Touches(*view, e); by; by = Touches(*view, e)) {
    if (!seen.applied.count(*by)) {
      auto applied = records_->AppliedBy(writer, r.run(), *by);
      if (!applied) {
        Fail("cannot ask etcd whether another holder applied node " + writer + "'s entry " + std::to_string(*by) +
             ": " + records_->client()->LastError());
        return Outcome::kLater;
      }
      const bool pruned = *applied == EtcdRecords::Applied::kPruned && seen.by_seq.count(*by) &&
                          !unmarked_.count({writer, r.run(), *by});
      if (*applied != EtcdRecords::Applied::kByHolder && !pruned)
        return Poisoned(r, e, "its entry " + std::to_string(*by));
      seen.applied.insert(*by);
    }
    if (view == &poison) {
      rest = poison;
      view = &rest;
    }
    rest.by_seq.erase(*by);
  }
  if (const auto blind = poison_gate_.find(r.held.key.writer);
      blind != poison_gate_.end() && r.held.gate_us > blind->second)
    return Poisoned(r, e, "a replica of it given up here whose meta was unreadable (its run and names unknown)");
  return r.held.key.ino == kEntryIno ? Apply(r.held, e) : Publish(r);
}

Takeover::Outcome Takeover::Poisoned(const Replica& r, const meta::LogEntry& e, const std::string& by) {
  // Not Lose: its bytes are sound. The writer, back, applies it after the
  // entry that poisoned it; never back, the entry is lost, and said so.
  LOG_ERROR(
      "replicas: node {}'s entry {} ({} {}) touches the names of {}, given up here: given up too (the writer applies "
      "both, in order, if it comes back; lost otherwise)",
      r.held.key.writer, e.seq, meta::LogOpName(e.op), EscapeName(e.path), by);
  MutexLock l(&mu_);
  stats_.poisoned++;
  stats_.failures++;
  stats_.last_error =
      "entry " + std::to_string(e.seq) + " of node " + r.held.key.writer + " given up: it touches the names of " + by;
  return Outcome::kLost;
}

Takeover::Outcome Takeover::PassedOver(const Replica& r, const meta::LogEntry& e, bool done_elsewhere) {
  const std::string what = "node " + r.held.key.writer + "'s entry " + std::to_string(e.seq) + " (" +
                           meta::LogOpName(e.op) + " " + EscapeName(e.path) + ")";
  // Done by another holder of it (K > 1; its record held the others at
  // this gate until it was), or published here before this holder stopped
  // and still where it was put: its bytes and its mtime (Publish sets the
  // writer's), not only bytes — an empty file a later entry put at that
  // name has the same.
  bool done = done_elsewhere;
  if (!done && r.held.key.ino != kEntryIno && r.meta) {
    const AtName at = WhatIsAt(backend_, r.held, *r.meta);
    done = at.same_bytes && at.same_mtime;
  }
  if (done) {
    LOG_INFO("replicas: {} was claimed here before this holder stopped, and {}: done", what,
             done_elsewhere ? "another holder of it did it" : "the backend holds it as published here");
    MutexLock l(&mu_);
    stats_.already_there++;
    return Outcome::kInBackend;
  }
  // Not Lose: its bytes are sound. The writer, back, applies it where the
  // later entries left its names (drain_taken.cc); never back, it is lost.
  LOG_ERROR(
      "replicas: {} was claimed here, and other holders applied later entries of its writer while this holder was "
      "gone: done now it would undo them; given up (the writer applies it where they left its names if it comes "
      "back; lost otherwise)",
      what);
  MutexLock l(&mu_);
  stats_.passed_over++;
  stats_.failures++;
  stats_.last_error = what + " given up: other holders went past it while this holder was gone";
  return Outcome::kLost;
}

Takeover::Outcome Takeover::Apply(const Held& h, const meta::LogEntry& e) {
  const std::string what = "node " + h.key.writer + "'s namespace entry " + std::to_string(h.key.version);
  const std::string desc = what + " (" + meta::LogOpName(e.op) + " " + EscapeName(e.path) +
                           (e.path2.empty() ? "" : " -> " + EscapeName(e.path2)) + ")";
  if (fs::KeptForLost(cluster_, e.op, static_cast<int64_t>(h.gate_us), e.path, "replicas: " + what)) {
    MutexLock l(&mu_);
    stats_.applied_entries++;
    return Outcome::kInBackend;
  }
  // As the drain replays it: ENOENT is what a replay of a done entry (or
  // one on a file never persisted) finds, and nothing is left to do.
  auto st = fs::ApplyToBackend(backend_, e);
  if (!st && st.error() != ENOENT) {
    if (Permanent(st.error()) || st.error() == EEXIST || st.error() == ENOTEMPTY)
      return Lose("cannot apply " + desc + ": " + ErrStr(st.error()));
    Fail("cannot apply " + desc + " for the dead node: " + ErrStr(st.error()));
    return Outcome::kLater;
  }
  LOG_WARN("replicas: applied {} in its place{}", desc, st ? "" : " (nothing there: done before, or never persisted)");
  MutexLock l(&mu_);
  stats_.applied_entries++;
  return Outcome::kInBackend;
}

Takeover::Outcome Takeover::Publish(const Replica& r) {
  const Held& h = r.held;
  const std::optional<FileMeta>& meta = r.meta;
  if (!meta) return Lose(UnreadableMeta(h));
  const std::string what = "node " + h.key.writer + "'s " + EscapeName(meta->path) + " (ino " +
                           std::to_string(h.key.ino) + " version " + std::to_string(h.key.version) + ")";
  if (FAULT("takeover.publish")) {
    Fail("cannot publish " + what + " for the dead node: fault takeover.publish");
    return Outcome::kLater;
  }
  // What the backend holds there may be this very version (the writer's
  // drain got it there before it died) or a newer file: then nothing to do.
  if (const AtName at = WhatIsAt(backend_, h, *meta); at.same_bytes || at.newer) {
    LOG_INFO("replicas: {} is already in the backend ({}): not published again", what,
             at.same_bytes ? "same bytes" : "newer");
    MutexLock l(&mu_);
    stats_.already_there++;
    return Outcome::kInBackend;
  }
  auto held = store_->OpenHeld(h.key);
  if (!held) {
    Fail("cannot open the replica of " + what + ": " + ErrStr(held.error()));
    return Outcome::kLater;
  }
  const int fd = held->first;
  auto staged = backend_->Stage(fd, h.size, [] { return false; });
  close(fd);
  if (!staged) {
    if (Permanent(staged.error())) return Lose("cannot stage " + what + ": " + ErrStr(staged.error()));
    Fail("cannot stage " + what + " for the dead node: " + ErrStr(staged.error()));
    return Outcome::kLater;
  }
  if (staged->checksum_hi != h.hash_hi || staged->checksum_lo != h.hash_lo) {
    backend_->Abort(*staged);
    return Lose("the replica of " + what + " does not match its checksum");
  }
  // Still this holder's to publish? The stage took as long as the file's
  // bytes (seconds), with the order checked before it: a lease lost
  // meanwhile lets the writer, back, revoke the claim, apply the entry and
  // publish a newer version at the name — put back over it by this
  // publish. Asked again here, as the drain asks before its own (Cleared);
  // the next pass reads the claims back (a revoked one is dropped).
  if (records_->Standings() != standing_seen_ ||
      (cluster_ && !cluster_->MayPublishAs(static_cast<int64_t>(h.gate_us) + 1, h.key.writer))) {
    backend_->Abort(*staged);
    LOG_INFO("replicas: {} staged, not published: this holder no longer stands or the order moved; next pass", what);
    return Outcome::kLater;
  }
  backend::Attrs a{.mode = meta->mode,
                   .uid = meta->uid,
                   .gid = meta->gid,
                   .has_owner = meta->has_owner,
                   .mtime_sec = meta->mtime_sec,
                   .mtime_nsec = meta->mtime_nsec};
  if (auto st = backend_->Publish(*staged, meta->path, a); !st) {
    backend_->Abort(*staged);
    if (Permanent(st.error())) return Lose("cannot publish " + what + ": " + ErrStr(st.error()));
    Fail("cannot publish " + what + " for the dead node: " + ErrStr(st.error()));
    return Outcome::kLater;
  }
  FAILPOINT("takeover.published");
  LOG_WARN("replicas: published {} ({} bytes) in its place: it died before its drain did", what, h.size);
  MutexLock l(&mu_);
  stats_.published++;
  stats_.published_bytes += h.size;
  return Outcome::kInBackend;
}

}  // namespace ckpt::fs::replica
