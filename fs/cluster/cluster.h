// cluster.h — cross-node ordered persistence (--cluster NAME): the mounts of
// one job over one backend keep a file closed after a barrier on one node
// behind the files the other nodes closed before that barrier.
//
// Each node samples its own drain log (every 10 ms: the newest logged seq
// read just before and just after the wall clock). Every log entry gets a
// *gate time*: the moment it was logged, in microseconds (InodeTable keeps it in memory
// beside the pending entry; LogView::LoggedTimes), picked up by the first
// sample that sees it; an entry recovered at a restart, which has none,
// gets an upper bound from the samples kept on disk (the first sample taken
// after it), so the log's format does not change. Every
// heartbeat (500 ms) the node writes a record to the backend's reserved area
// (Backend::PutRecord: .ckptfs-cluster/NAME/NODE) with the time T of its
// newest sample and the gate time G of its oldest entry not yet applied (none
// if nothing is pending), and reads the other members' records — every
// tick (25 ms on POSIX, 100 ms on S3) while the cluster has files pending
// (Tick).
//
// The rule (MayPublish, asked by the drainer before it applies the head
// entry, after staging): entry e of node X, gate g, may reach the backend
// when X read the records after g + max_clock_skew (so it knows every member
// that could have closed a file before e: a node writes its first record
// before it serves a write), and every other live member Y has a record with
//     T_Y >= g + max_clock_skew          (Y's record is newer than e's close)
//     and (G_Y, Y) > (g, X), or Y has nothing pending at T_Y.
// The second condition compares (gate, node id) pairs, a total order on
// every pending entry of the cluster, so the entry smallest in it always
// passes: there is no deadlock, even for entries closed on two nodes in the
// same instant (the design of issue #11, "every member's watermark >= g +
// skew", waits in a cycle there: docs/consistency.md "Cross-node ordering"
// says why, and what exactly is promised).
//
// A member whose heartbeat is older than member_timeout is dead: ignored by
// the rule, and the unpersisted files its last record named are listed as
// lost by every node. A member that unmounted cleanly with nothing pending
// writes state "left" and is ignored too; it rejoins when it mounts again.
// A live member whose record vanishes, turns unreadable or is refused is
// not a member with nothing pending: its last record read stands (and holds
// the others) until it is dead by that record's heartbeat.
//
// This node's own side (MayPublish): it publishes an entry only while its
// own record is in the store and names that entry (written after the
// entry's gate time, so it shows it, or an older one, pending): not before
// its first record is written (Join failed), not after a failed record
// write until a later one succeeds, and not while another member refuses
// its records. Others cannot wait for what they cannot read; this node's
// drain waits instead, its files stay in memory, and Status says why
// (publish_blocked_reason).
//
// Records whose times (heartbeat, watermark, oldest gate) lie more than
// max_clock_skew in this node's future are refused: one forged record with
// a heartbeat ten years ahead never aged into "dead" and held every drain
// for ever. A refused record is no member (logged once, listed in Status);
// this node names the refused records (node, heartbeat) in its own, so a
// real member whose clock is ahead learns that it is refused and publishes
// nothing — while the heartbeat named is one it wrote within the member
// timeout, whether or not the refusing member looks dead to its clock
// (docs/consistency.md "Clock skew" says what that leaves unordered).
//
// Samples are kept in STATE_DIR/cluster-samples (and the latest's time in
// cluster-samples.alive-us; not fsynced: a reboot loses the tier anyway), so
// entries recovered at a restart keep their gate times, and one logged after
// the last sample kept gets that time plus one period (LoadSamples says why).
//
// Thread-safety: every public method may be called from any thread. Its two
// threads call the LogView and the RecordStore without mu_ (but Standing, Describe).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "common/mutex.h"
#include "common/result.h"
#include "fs/cluster/cluster_types.h"

namespace ckpt::fs {

class Cluster {
 public:
  // Wall clock, µs since the epoch (ms tied a shard and a `latest` written
  // a sub-ms barrier apart, and the tie went by node id).
  using Clock = std::function<int64_t()>;
  static int64_t WallClockUs();

  // `samples_path`: where samples are kept across restarts ("" : nowhere).
  Cluster(ClusterOptions o, RecordStore* store, LogView* log, std::string samples_path, Clock clock = WallClockUs);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Loads the kept samples and takes the first sample (entries logged
  // before it without a kept sample get its time: the start time).
  void Init();
  // The first heartbeat, before the mount serves anything (so that every
  // member knows this one before it can close a file): Heartbeat(); false
  // (and logged) if the record could not be written or another member
  // refuses it. Until a record is written, MayPublish says no.
  bool Join();
  void Start();  // the sampler and heartbeat threads (Init first)
  void Stop();   // safe to call twice
  // After Stop, on a clean unmount: writes state "left" if nothing is
  // pending (else the record stays "live" and ages into "dead" on the
  // others, which then list its pending files as lost). True if written.
  bool Leave();

  // One sample / one heartbeat (record written, the others' read): the
  // threads call them; tests, with a fake clock.
  void Sample();
  void Heartbeat();
  // Every tick_ms: a Heartbeat when one is due or when its record changed
  // what another member may do (entries applied; another member's files
  // pending; the drain waits for an entry the record does not name yet);
  // else, while the drain waits, a read. After a failed write, writes wait
  // for the heartbeat. A file waits about two ticks for another node's record.
  void Tick();

  // May the log entry `seq` (pending, this node's) reach the backend now?
  // Records what holds it back for Status; logs once per episode in which
  // this node's own record holds it (publish_blocked_reason). Drain thread.
  bool MayPublish(uint64_t seq);
  // The drain no longer waits (the head was applied another way, or stop).
  void ClearWait();
  // The same rule for an entry of another node, `node`, closed at `gate_us`
  // (µs): a dead member's replicated file that this node publishes for it
  // (fs/cluster/takeover.h). Only the other live members' records decide.
  bool MayPublishAs(int64_t gate_us, const std::string& node);
  // Gates this node holds for others (HeldForOthers): its record names the
  // earliest (+1 µs: the writer's own entry never waits for its replica) as
  // pending, so nothing closed after it passes while the replica may still
  // have to be published; and dead members' replicas as its own at risk (U,
  // paths: lost with this node). Set before Start.
  void SetHeldGate(std::function<HeldForOthers(bool dead_too)> fn) { held_gate_ = std::move(fn); }
  // The replicator's view: the first of this node's entries not replicated
  // K times (Replicator::UnsafeFrom: its gate is the record's U, where a loss
  // of this node begins) and whether a file version is (Replicated: the
  // record's at-risk files). Unset: every pending entry. Set before Start.
  void SetReplicas(std::function<uint64_t()> unsafe_from, std::function<bool(uint64_t, uint64_t)> replicated) {
    unsafe_from_ = std::move(unsafe_from), replicated_ = std::move(replicated);
  }
  // A removal at `gate_us` ordered after a lost member's lost entries, kept
  // out of the backend (LostWindows): that member ("" : it may go).
  std::string KeepsRemoval(int64_t gate_us, const std::string& path);
  // Something a tick would act on happened (the drain applied an entry, a
  // digest came): the next tick runs now, so a chain of members moves one
  // store round trip a member (docs/scale.md). A no-op with backend records.
  void Poke();
  // Called (on the tick's thread, no lock held) when a tick read a new
  // digest or wrote this node's record: what MayPublish says may have
  // changed, so the drain asks again now, not at its next 50 ms poll (each
  // step of a checkpoint's chain waited for one). Set before Start.
  void SetOnChange(std::function<void()> f) { on_change_ = std::move(f); }

  // The gate time of entry `seq` (µs): when it was logged, or (recovered
  // entries) the first sample that saw it logged; nullopt if none did yet.
  std::optional<int64_t> GateTime(uint64_t seq);
  // The newest sample time (µs) before which every entry is applied (0: none).
  int64_t Watermark();
  ClusterStatus Status();
  size_t SampleCount();

  // With a store that reduces (etcd: fs/cluster/etcd_records.h), the
  // elected member's work: every member's record, read from `as_of` (its
  // clock when the read began), to the digest every member reads instead
  // of the records (cluster_digest.cc) and the one for the member whose turn it is.
  Reduction Reduce(const std::vector<std::pair<std::string, std::string>>& records, int64_t as_of);
  // The least time between two summaries (µs): ~4,000 digest deliveries a second at any size.
  static int64_t SummaryGapUs(size_t members);

 private:
  struct SampleRec {
    int64_t t;      // µs
    uint64_t pre;   // newest seq logged, read before t: entries <= pre were logged before t
    uint64_t post;  // read after t: every entry logged before t is <= post
  };
  using Record = ClusterRecord;

  // This node's record in `state`, and its heartbeat T (µs).
  std::pair<std::string, int64_t> MakeRecord(const std::string& state);
  void ReadRecords();
  // One record: "" if it is a member's, else why not ("unreadable", or
  // "refused (...)": its times in this node's future; `r` is filled).
  std::string ParseRecord(const std::string& name, const std::string& bytes, int64_t now, Record* r) const;
  // "refused (...)" if the record's times lie beyond the skew in this node's future, else "".
  std::string FutureProblem(Record* r, int64_t now) const;
  // ReadRecords with a store that reduces: the digest instead of the list.
  void ReadDigest(const std::string& digest);
  // Why this node may publish nothing now ("" : it may).
  std::string BlockedLocked() const REQUIRES(mu_);
  std::optional<int64_t> GateLocked(uint64_t seq) REQUIRES(mu_);
  int64_t WatermarkLocked(uint64_t applied) REQUIRES(mu_);
  void Prune(uint64_t applied) REQUIRES(mu_);
  void KeepSamples();
  // Keeps the time of the latest sample in STATE_DIR/cluster-samples.alive.
  void KeepAlive(int64_t t);
  void LoadSamples();
  bool Dead(const Record& r, int64_t now) const;
  void NoteLostLocked(int64_t now) REQUIRES(mu_);  // the lost members' windows (LostWindows)
  struct DigestView;                               // the last digest read, parsed (cluster_digest.cc): parsed once
  // The baton (cluster_types.h: Reduction; cluster_digest.cc): whether this
  // node's next record hands it on (its entry applied), that handoff, one
  // taken from a digest, and whether it lets the entry at `gate_us` pass.
  bool BatonDueLocked() const REQUIRES(mu_);
  std::optional<Handoff> HandOnLocked(const std::string& record) REQUIRES(mu_);
  void TakeBatonLocked(const DigestView& v) REQUIRES(mu_);
  bool BatonPermitsLocked(int64_t gate_us) const REQUIRES(mu_);

  const ClusterOptions opt_;
  RecordStore* const store_;
  LogView* const log_;
  const std::string samples_path_;
  const Clock clock_;

  Mutex mu_;  // held only around RecordStore::Standing/Describe (leaf locks of the store's) and its own state
  CondVar cv_;
  std::deque<SampleRec> samples_ GUARDED_BY(mu_);
  uint64_t applied_ GUARDED_BY(mu_) = 0;  // AppliedSeq at the last sample
  bool samples_changed_ GUARDED_BY(mu_) = false;
  std::vector<Record> others_ GUARDED_BY(mu_);  // from the last read
  int64_t read_at_ GUARDED_BY(mu_) = 0;         // when the last successful read began
  std::vector<std::string> dead_noted_ GUARDED_BY(mu_);  // members whose death was logged
  std::string write_error_ GUARDED_BY(mu_);  // the last write of this node's record failed
  std::string read_error_ GUARDED_BY(mu_);   // the last read of the records failed
  // This node's record as the store holds it: the heartbeat T of the last
  // one written (0: none yet), and whether the last read missed it.
  int64_t stored_us_ GUARDED_BY(mu_) = 0;
  bool self_missing_ GUARDED_BY(mu_) = false;
  std::string refused_by_ GUARDED_BY(mu_);        // a live member refusing this node ("" : none)
  std::vector<Record> refused_ GUARDED_BY(mu_);  // at the last read; problem: why
  std::map<std::string, std::string> refused_noted_ GUARDED_BY(mu_);  // node -> reason logged
  std::string blocked_noted_ GUARDED_BY(mu_);     // the hold of this episode, as logged
  bool waiting_ GUARDED_BY(mu_) = false;
  uint64_t wait_seq_ GUARDED_BY(mu_) = 0;
  int64_t wait_gate_ GUARDED_BY(mu_) = 0;   // µs, as every time below
  int64_t wait_since_ GUARDED_BY(mu_) = 0;
  std::vector<std::string> waiting_for_ GUARDED_BY(mu_);
  Record self_ GUARDED_BY(mu_);  // as last written
  int64_t last_write_ GUARDED_BY(mu_) = 0;        // clock at the last Heartbeat
  uint64_t written_applied_ GUARDED_BY(mu_) = 0;  // AppliedSeq then
  int64_t busy_until_ GUARDED_BY(mu_) = 0;        // records every tick until then (Tick)
  std::string written_ GUARDED_BY(mu_);            // this node's last record, as written
  bool clash_noted_ GUARDED_BY(mu_) = false;       // another mount with this node id (logged once)
  bool stop_ GUARDED_BY(mu_) = false;
  bool poked_ GUARDED_BY(mu_) = false;  // Poke: tick now
  std::function<HeldForOthers(bool)> held_gate_;       // SetHeldGate
  std::function<void()> on_change_;                    // SetOnChange
  std::function<uint64_t()> unsafe_from_;              // SetReplicas
  std::function<bool(uint64_t, uint64_t)> replicated_;  // SetReplicas
  uint64_t written_unsafe_from_ GUARDED_BY(mu_) = 0;    // its value in the last record built (AtRiskFrom)
  uint64_t written_logged_ GUARDED_BY(mu_) = 0;         // the last entry that record saw logged
  LostWindows lost_windows_ GUARDED_BY(mu_);
  HeldForOthers written_held_ GUARDED_BY(mu_);  // in the last record built (its paths not kept: SameHeld)
  // Exact gate times of pending entries a sample saw (LogView::LoggedTimes), the newest seq asked for.
  std::map<uint64_t, int64_t> exact_ GUARDED_BY(mu_);
  uint64_t timed_ GUARDED_BY(mu_) = 0;
  // With a store that reduces (etcd): the digest read last (members, the elected member, when this node's
  // next record lets another member's entry pass) and, elected, its last reduction's members.
  bool reduces_ = false;
  uint64_t members_total_ GUARDED_BY(mu_) = 0;
  std::string leader_ GUARDED_BY(mu_);
  std::string digest_problem_ GUARDED_BY(mu_);  // why the last digest was not used ("" : it was)
  int64_t need_us_ GUARDED_BY(mu_) = 0;
  std::map<std::string, Record> reduced_ GUARDED_BY(mu_);
  std::deque<Record> lost_ GUARDED_BY(mu_);          // vanished with files pending, newest last
  std::map<std::string, std::pair<std::string, int64_t>> runs_ GUARDED_BY(mu_);  // id: run replaced, clash seen
  std::vector<Record> digest_lost_ GUARDED_BY(mu_);  // the digest's lost members (not among others_)
  // The live records the last digest read carried, and its time: a member elected after another compares
  // its first read with them (Reduce): one that died under the previous elected one is named lost too.
  std::map<std::string, Record> digest_seen_ GUARDED_BY(mu_);
  int64_t digest_as_of_ GUARDED_BY(mu_) = 0;
  std::map<std::string, std::pair<std::string, Record>> parsed_;  // Reduce's, as last parsed (its thread only)
  std::string digest_text_ GUARDED_BY(mu_);
  std::shared_ptr<const DigestView> digest_view_ GUARDED_BY(mu_);
  std::string reduced_body_ GUARDED_BY(mu_);  // the last summary written, but its time
  std::string urgent_body_ GUARDED_BY(mu_);   // its lost and refused members
  int64_t summary_as_of_ GUARDED_BY(mu_) = 0, summary_newest_ GUARDED_BY(mu_) = 0;  // its read, newest gate
  int64_t reduced_as_of_ GUARDED_BY(mu_) = 0;                   // the last reduction's read
  std::pair<std::string, int64_t> turn_given_ GUARDED_BY(mu_);  // (member, gate) of the last turn given
  // Elected: the members the last baton named, the one waited for since when, turns left without one.
  std::vector<std::pair<std::string, int64_t>> baton_given_ GUARDED_BY(mu_);
  std::pair<std::pair<std::string, int64_t>, int64_t> baton_wait_ GUARDED_BY(mu_);
  int baton_skip_ GUARDED_BY(mu_) = 0, baton_backoff_ GUARDED_BY(mu_) = 1;
  // Member: the baton held, the last gate one was taken for, the last turn read.
  std::optional<HeldBaton> baton_ GUARDED_BY(mu_);
  int64_t baton_taken_ GUARDED_BY(mu_) = 0;
  std::string turn_read_ GUARDED_BY(mu_);
  int alive_fd_ = -1;  // opened by LoadSamples (Init), before the threads start
  std::thread sampler_, heart_;
};

}  // namespace ckpt::fs
