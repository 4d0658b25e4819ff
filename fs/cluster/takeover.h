// takeover.h — a holder's side of --replicas after the writer is gone
// (issue #30): the replicas it holds of a member whose lease expired are
// published to the backend by this node, in the dead member's place, under
// the cross-node ordering rule, as if the dead member's drain had done it.
//
// Why the order holds through the takeover: while a node holds a replica,
// its own record in the cluster store names the replica's gate (+1 µs) as
// pending (Cluster::SetHeldGate), so no member publishes a file closed after
// the replicated one — a `latest` written after the barrier — until this
// node has published the replica (or the writer did and the replica was
// dropped). The writer's own file never waits for its replica (the +1 µs).
// A dead writer's replicas go in its gate order (its log order), each once
// Cluster::MayPublishAs lets that gate through; two holders of one writer's
// files order each other by the same records.
//
// Before it publishes or applies a dead writer's entry, a holder claims it
// in etcd (EtcdRecords::ClaimTaken: a key for that entry alone), only while
// the writer's record is as the holder saw it: a writer's run that comes
// back (restarted on its state dir, or rejoining after its lease ended)
// reads the claims after its first record and skips those entries, so no
// entry is applied twice (a rename replayed after the holder applied it
// failed for ever; a file published again at its old name came back
// there), and deletes them once its drain went past them. A claimed
// replica is published even once its writer is back — while the claim is
// this holder's: a writer back while the holder's run was gone (its record
// expired, or another run of its id is there) revokes the claim and
// applies the entry itself (EtcdRecords::Taken). So a holder reads its
// claims back when it starts, and each time its record stands under a new
// lease (EtcdRecords::Standings), before it publishes anything claimed:
// a revoked claim's replica is dropped (the writer has the entry), and so
// is one whose claim the writer deleted (its drain went past it). A holder
// whose lease lapsed publishes nothing until its record stands again
// (Cluster::MayPublishAs: RecordStore::Standing), and its claims are read
// back after that: a revocation is either seen or refused (it is guarded
// on the holder's record being absent).
//
// What a claim read back says, reconciled: claimed, not marked, with the
// replica held and unpublished: published (applied) again — unless another
// holder claimed a later entry of that run meanwhile (it went past this
// one while this holder was gone: PassedOver gives it up); its replica
// published (a mark lost, or not yet put when the holder stopped): marked
// done; no replica: marked as the note of its mark says (Mark keeps what it
// decided, with a give-up's names, on the tier until the mark is in etcd:
// Store::KeepNote), else — its machine rebooted, tmpfs lost — given up with
// its names unknown (the writer applies the entry itself, and every later
// entry of that run is given up with it). A namespace entry's replica is
// kept (retired) until its mark is in etcd, for the same reason; so is a
// given-up one whose note could not be written (unpublished: KeptGivenUp).
//
// An entry the backend refuses for good, or whose replica is unreadable,
// is given up (marked kGaveUp, with its names beside the mark: MarkTaken),
// and so is every later entry of that writer's run on those names, by
// whichever holder holds it (poison.h): each entry is checked against this
// holder's give-ups and the others' (ReadGaveUp, read once the order let
// it through); a give-up's gate stays in this holder's record until its
// names are in etcd.
//
// Replicas of live writers are dropped once the writer's own record shows
// the version applied (ShowsApplied): the DROP a writer sends can be lost
// (it restarted, the holder was unreachable), and a replica kept for ever
// would hold every member's drain. A replica whose path already holds the same bytes, or a newer file
// (a later mtime), in the backend is dropped without publishing: the dead
// writer's drain got that far before it died.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <expected>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>

#include "backend/backend.h"
#include "common/mutex.h"
#include "fs/cluster/cluster.h"
#include "fs/cluster/etcd_records.h"
#include "fs/cluster/poison.h"
#include "fs/cluster/replica_store.h"
#include "fs/cluster/replicator.h"

namespace ckpt::fs::replica {

// What a live writer's record says of its drain (Cluster::MakeRecord).
struct WriterRecord {
  int64_t heartbeat_us = 0;
  std::optional<int64_t> oldest_gate_us;
  std::optional<uint64_t> applied_seq;  // its log applied up to here (records of this run that give it)
};
// A replica of another writer with its meta decoded, once a takeover pass
// (its seq, run and path are asked of it many times).
struct Replica {
  explicit Replica(Held h) : held(std::move(h)), meta(DecodeMeta(held.meta)) {}
  Held held;
  std::optional<FileMeta> meta;  // nullopt: unreadable
  // The writer's log entry (a namespace entry's version is its seq); 0: unknown.
  uint64_t seq() const { return held.key.ino == kEntryIno ? held.key.version : meta ? meta->seq : 0; }
  // The writer's run (FileMeta::incarnation); "": unknown.
  const std::string& run() const;
};
// Whether `w` shows replica `r` of its writer applied: its log applied
// past the replica's seq (FileMeta) where both are known; else, from a
// record or replica of an older version, the record newer than the
// replica's gate and its oldest pending gate past it.
bool ShowsApplied(const WriterRecord& w, const Replica& r);

class Takeover {
 public:
  struct Stats {
    uint64_t published = 0, published_bytes = 0, already_there = 0, collected = 0, failures = 0;
    uint64_t lost = 0;  // a dead node's replicas the backend refused for good (dropped, logged)
    uint64_t applied_entries = 0;  // a dead node's namespace entries applied in its place
    uint64_t poisoned = 0;         // given up because an earlier given-up entry touched their names (poison.h)
    uint64_t passed_over = 0;      // claimed here, given up: others went past them while this holder was gone
    std::string last_error;
  };
  // `peers`: which writers still advertise a link (live, cheaply).
  Takeover(std::string node, Store* store, Cluster* cluster, EtcdRecords* records, Peers* peers,
           backend::Backend* backend);
  ~Takeover();
  Takeover(const Takeover&) = delete;
  Takeover& operator=(const Takeover&) = delete;

  void Start();
  void Stop();
  // For the record (Cluster::SetHeldGate): the earliest gate held + 1 µs,
  // and the dead writers' replicas this holder is to publish (as of the
  // last pass): lost with this node.
  HeldForOthers Holding(bool dead_too = true) const;
  Stats stats() const;

 private:
  void Loop();
  void Pass();
  // One dead writer's replicas, oldest gate first, while the rule lets them.
  // `writer_rev`: the mod_revision of its record as read (0: none), the
  // guard of each claim.
  void PublishFor(const std::string& writer, std::vector<Replica> held, int64_t writer_rev);
  // Claims `h` for this holder (taken/ in etcd); false: not now (the
  // writer's record changed, or the store did not answer).
  bool Claim(const std::string& writer, const Replica& r, int64_t writer_rev);
  bool Claimed(const std::string& writer, const Replica& r) const;
  // Reads this holder's claims back from etcd and reconciles them with the
  // replicas held (takeover.h's opening comment); false: not now.
  bool ReadBack();
  // What became of a claimed entry, into its claim (the writer waits for it).
  // `names`: put beside the mark (EtcdRecords::MarkTaken): a give-up's
  // names (EncodePoison), or kAppliedText. False: not on the tier (no note).
  bool Mark(const std::string& writer, const Replica& r, char status, std::optional<std::string> names = {});
  void MarkPending();
  // A replica given up here, its mark owed (kept for its names: PublishFor):
  // true, and dropped once the mark is in.
  bool KeptGivenUp(const std::string& writer, const Replica& r);
  // A mark no longer owed (the writer went past the entry, or revoked it).
  void Unmark(const std::tuple<std::string, std::string, uint64_t>& k);
  // The cluster lists that run of `writer` dead (its lost window noted):
  // an earlier run of the same id named dead does not stand for a later one.
  bool NamedLost(const std::string& writer, const std::string& incarnation);
  enum class Outcome { kLater, kInBackend, kLost };
  // The log entry a replica stands for: a namespace entry's decoded bytes,
  // a file's persist at its meta's path. Error kLater: not now (the
  // replica could not be opened); kLost: unreadable (logged).
  std::expected<meta::LogEntry, Outcome> EntryOf(const Replica& r);
  // Given up because given-up entry `by` of the same run touches its names.
  // `by`: what poisoned it, as the log says it.
  Outcome Poisoned(const Replica& r, const meta::LogEntry& e, const std::string& by);
  // What becomes of entry `e` of `r` once claimed: given up when an earlier
  // give-up in `poison` touches it, or when a replica of its writer given
  // up here had an unreadable meta (poison_gate_); else applied (a
  // namespace entry) or published (a file).
  Outcome Act(const Replica& r, const meta::LogEntry& e, const PoisonView& poison);
  // A claim read back unmarked, its replica unpublished, whose run another
  // holder went past (passed_over_): done if another holder of it marked
  // it done (`done_elsewhere`) or its file is in the backend with its bytes
  // and mtime, else given up — published or applied now, it would undo the
  // later entries the others applied while this holder was gone.
  Outcome PassedOver(const Replica& r, const meta::LogEntry& e, bool done_elsewhere);
  // `run` (writer, run) applied its log up to `applied` (its run back went
  // past the entries given up, in order): they poison nothing any more.
  void ForgetApplied(const std::pair<std::string, std::string>& run, uint64_t applied);
  // Publishes one replica: kInBackend once published or already there (the
  // replica is then kept, published, to serve loads: Store::Retire);
  // kLater: tried again next pass; kLost: dropped.
  Outcome Publish(const Replica& r);
  // Applies a namespace entry (a replica of key ino kEntryIno, its bytes
  // the encoded log entry `e`: Replicator::Observe) to the backend.
  Outcome Apply(const Held& h, const meta::LogEntry& e);
  void Fail(const std::string& why);
  // A replica that can never be published: logged as lost; kLost.
  Outcome Lose(const std::string& why);

  const std::string node_;
  Store* const store_;
  Cluster* const cluster_;
  EtcdRecords* const records_;
  Peers* const peers_;
  backend::Backend* const backend_;
  std::map<std::string, std::chrono::steady_clock::time_point> checked_;  // Pass's thread only
  std::map<std::string, std::chrono::steady_clock::time_point> gone_;     // its record first seen gone (Pass)
  // What this holder claimed (Pass's thread only): (writer, run) -> seqs;
  // read back from etcd (ReadBack) at the first pass, after each new
  // standing (standing_seen_) and after a claim that failed (reread_).
  std::map<std::pair<std::string, std::string>, EtcdRecords::Claims> claimed_;
  bool reread_ = true;
  uint64_t standing_seen_ = 0;
  // Outcomes not yet in etcd, (writer, run, seq): retried each pass.
  std::set<std::tuple<std::string, std::string, uint64_t>> unmarked_;
  std::map<std::tuple<std::string, std::string, uint64_t>, std::string> mark_names_;  // their names, if any
  // Claims read back unmarked, their replicas unpublished, a later entry of
  // whose run another holder claimed (ReadBack; Pass's thread only) ->
  // whether another holder marked that very entry done.
  std::map<std::tuple<std::string, std::string, uint64_t>, bool> passed_over_;
  // The entries this holder gave up, (writer, run) -> their names (Pass's
  // thread only): a later entry of that run touching them is given up too
  // (poison.h). Pruned to what the writer's record shows unapplied.
  std::map<std::pair<std::string, std::string>, PoisonView> poison_;
  // Every holder's give-ups of (writer, run) as read from etcd, and the
  // revision read up to (Pass's thread only): each entry reads only what
  // was put since (ReadGaveUp).
  struct GaveUpSeen {
    GaveUps by_seq;
    int64_t rev = 0;
    PoisonView view;
    std::set<uint64_t> applied;  // seqs among them etcd said applied (Act), until new give-ups come
  };
  std::map<std::pair<std::string, std::string>, GaveUpSeen> gaveup_seen_;
  // writer -> the gate of a replica given up with its meta unreadable (its
  // run and names unknown): every later one of that writer held here is
  // given up too (Pass's thread only).
  std::map<std::string, uint64_t> poison_gate_;
  mutable Mutex mu_;
  // Holding's second half: each dead writer's replicas this holder is to
  // publish (NoteAtRisk, set before it publishes them; none: erased).
  std::map<std::string, HeldForOthers> dead_held_ GUARDED_BY(mu_);
  // Given up, dropped, and its mark (with its names) not in etcd yet:
  // its gate, which this holder's record keeps naming (Holding) until it is.
  std::map<std::tuple<std::string, std::string, uint64_t>, int64_t> gaveup_unmarked_ GUARDED_BY(mu_);
  // Sets `writer`'s entry of dead_held_ from `dead`, its replicas this
  // holder is to publish (empty: erased); pokes the record if that changed.
  void NoteAtRisk(const std::string& writer, std::span<const Replica> dead);
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  Stats stats_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ckpt::fs::replica
