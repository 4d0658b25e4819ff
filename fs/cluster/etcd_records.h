// etcd_records.h — the members' records of --cluster NAME in etcd
// (--cluster-store etcd://...): membership by lease, one member elected to
// reduce the records into a digest that every member watches. O(M) for the
// store per round, O(1) requests per node per checkpoint (docs/scale.md).
//
// Keys, under /ckptfs/NAME/ (NAME is a cluster name: no '/'):
//   members/NODE     this node's record (cluster.h), with its lease: gone
//                    when the node is (lease expiry) or left (revoked)
//   digest/leader    "NODE LEASE" of the elected member, with its lease
//   digest/summary   the digest (Cluster::Reduce), written only while the
//                    writer is the elected member (a transaction that
//                    compares digest/leader)
//   taken/NODE/RUN/HOLDER/SEQ one log entry (SEQ, 20 digits: keys sort
//                    numerically) of NODE's run RUN ("-": unknown; '/'
//                    and '%' as %2F, %25) that HOLDER took over
//                    (published or applied in its place once it was dead);
//                    the value is what became of it (Claims) followed
//                    by HOLDER's run (the incarnation that claimed it;
//                    "" from a version before it), no lease:
//                    NODE's run back (restarted on its state dir, or
//                    rejoining after its lease expired) reads taken/NODE/RUN/
//                    after its first record and skips those entries (the
//                    holder applies them); a holder writes one only while
//                    NODE's record is as it saw it (absent, or another
//                    run's), so none is written after the run is back; the
//                    run deletes its claims once its applied_seq passed them
//                    (PutRecord); a run that never comes back leaves its
//                    claims until the job's keys are deleted (etcdctl)
//   turn/NODE        the digest for NODE alone, when a reduction lets its
//                    entry pass between two summaries (Reduction), with
//                    the elected member's lease; NODE watches this key
//                    besides digest/, and reads whichever of the two is
//                    newer (by revision); also a baton (cluster_types.h:
//                    Reduction) a member handed on, under the elected
//                    member's lease, guarded by digest/leader
// A member: Open grants the lease (TTL --member-timeout, at least 2 s) and
// keeps it alive every TTL/3; watches digest/ (one watch: the leader and
// the digest); campaigns (create digest/leader if absent) when there is no
// leader. The elected member also watches members/ and, when a record
// changed or a pending gate comes due, reads every record (one Range) and
// writes the digest; it keeps every record it read, and before each
// reduction reads only the records put since (min_mod_revision: O(changes));
// its watch brings removals and wakes it. The whole range is read once per
// election and after the watch was reset, not once per step of a
// checkpoint (docs/scale.md). A lease that expired (the node cut off longer than the
// TTL) is noticed at the next keep-alive: a new lease, the record written
// again (Put), and the node rejoins; until its record is written, its drain
// holds (cluster.h: MayPublish).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "fs/cluster/cluster_types.h"
#include "fs/cluster/etcd_client.h"

namespace ckpt::fs {

struct EtcdRecordsOptions {
  etcd::Options client;
  std::string url;  // as given (no credentials in it): for status
  std::string cluster, node;
  std::string incarnation;   // this run's (ClusterOptions::incarnation): whose taken/ entries are its own
  int64_t lease_ttl_s = 60;  // --member-timeout
  int64_t tick_ms = 100;     // the elected member's reduction period while one is due
};

// Requests made, by kind (the scale benchmark counts them).
struct EtcdRecordsStats {
  uint64_t puts = 0, ranges = 0, txns = 0, keepalives = 0, grants = 0, digests_seen = 0, reductions = 0;
  uint64_t summaries = 0, turns = 0;  // written by this member (elected), of each kind
  uint64_t deltas = 0;                // reads of the records changed since the last (O(changes))
  uint64_t from_watch = 0;            // reductions of what the watch brought, without a read
  uint64_t handoffs = 0;              // batons this member handed on with its record
};

class EtcdRecords final : public RecordStore {
 public:
  // Reduces every record (node, bytes) read from `as_of` (µs) into the
  // digest; returns it and when the next reduction is due (0: none).
  using Reducer =
      std::function<Reduction(const std::vector<std::pair<std::string, std::string>>& records, int64_t as_of)>;
  using Clock = std::function<int64_t()>;

  EtcdRecords(EtcdRecordsOptions o, Clock clock);
  ~EtcdRecords() override;

  // The elected member's work (Cluster::Reduce); before Open.
  void SetReducer(Reducer r);
  // Called (on the watch's thread, no lock held) when a new digest came;
  // before Open. The member ticks at once (Cluster::Poke).
  void SetOnDigest(std::function<void()> f) { on_digest_ = std::move(f); }
  // A holder's claims, seq -> what became of it: kClaimed (not yet
  // applied), kDone (published or applied), kGaveUp (the holder could not:
  // the writer applies it itself), kRevoked (the writer's run took it back
  // while the holder's run was gone: ReadTaken; the holder publishes
  // nothing of it). One key per seq, the status (then the holder's run) its
  // value.
  static constexpr char kClaimed = ' ', kDone = '+', kGaveUp = '!', kRevoked = 'x';
  using Claims = std::map<uint64_t, char>;
  // This run's entries its holders took over: done (the writer completes
  // them unapplied) and claimed by a live holder, not yet done (the writer's
  // drain waits at them). A claim the holder gave up is the writer's to
  // apply; so is one of a holder whose run is gone (its record absent, or
  // another run's: a new machine under its id, or its state lost) once it
  // is revoked: rewritten kRevoked only while the holder's record is still
  // absent (or still another run's) and the claim unchanged, both as read
  // at the revision the claims were read at (a transaction). A holder whose
  // record is back first keeps its claim; one back after sees kRevoked.
  // The writer applies the entry only once the revocation is in.
  struct Taken {
    std::vector<uint64_t> done, claimed;
  };
  // Called with Taken once after each grant, after the first record put
  // under it and before that put returns (so the drain, held until the
  // record is in, never applies one of them itself), and at each
  // RefreshTaken; before Open. The put fails if taken/ cannot be read.
  // Each later put of this node's record whose applied_seq (this run's)
  // reached a claim read deletes the claims up to it (one range a holder):
  // the drain completed those entries (a claim not done holds it before).
  void SetOnTaken(std::function<void(const Taken&)> f) { on_taken_ = std::move(f); }
  Status RefreshTaken() { return ReadTaken(false); }
  // A holder's claim on a dead writer's entry `seq` (taken/WRITER/RUN/this
  // node/SEQ = kClaimed and this run: that key alone), put only while
  // members/WRITER's mod_revision is `writer_rev` (0: absent) and the key
  // does not exist (a claim revoked or pruned is never put again); false
  // when either changed (the writer may be back). Refused or failed (a
  // reply lost: the put, or an earlier one, may have landed), the key is
  // read back: this run's claim there is true; an error if it cannot be told.
  Result<bool> ClaimTaken(const std::string& writer, const std::string& run, uint64_t seq, int64_t writer_rev);
  // What became of a claimed entry (kDone, kGaveUp), whatever the writer's
  // record; only while the claim still says kClaimed by this run (a claim
  // deleted or revoked is not put back). In the same transaction, under
  // the same guard: `names` (not null) at gaveup/WRITER/RUN/SEQ/this node
  // (a give-up's, replica::EncodePoison, or "+": applied here, another
  // holder gave it up), and for kDone applied/WRITER/RUN/SEQ/this node
  // (AppliedBy). The writer's prune deletes them with its claims.
  Status MarkTaken(const std::string& writer, const std::string& run, uint64_t seq, char status,
                   const std::string* names = nullptr);
  // Given-up entry `seq` of `writer`'s run `run`, at one revision: done by a holder
  // (its give-up then poisons nothing, whichever mark landed first), or no
  // give-up left (kPruned: the writer's drain went past it), or kNo.
  enum class Applied { kNo, kByHolder, kPruned };
  Result<Applied> AppliedBy(const std::string& writer, const std::string& run, uint64_t seq);
  // Every holder's gaveup/ values of `writer`'s run `run`, seq -> holder
  // -> value, as of one revision, put into `*into`; `*rev` (0: all of
  // them) reads only those put since it, and becomes the read's revision;
  // how many keys came. Linearizable: read after a record seen, it has
  // every mark put before that record.
  Result<size_t> ReadGaveUp(const std::string& writer, const std::string& run,
                            std::map<uint64_t, std::map<std::string, std::string>>* into, int64_t* rev);
  // This run's claims on `writer`'s run `run`, as a restarted holder reads
  // them back (one prefix: O(those claims)); kRevoked ones included.
  Result<Claims> OwnClaims(const std::string& writer, const std::string& run);
  // This run's claims on every writer's run, (writer, run) -> claims: what
  // a holder reads back when it starts and after each new standing (it
  // may hold no replica of a run it still owes a mark). O(every claim).
  // `others`: if given, for each (writer, run), what the other holders
  // (other nodes, or other runs of this one) claimed of it.
  struct Others {
    uint64_t last = 0;        // the highest seq claimed
    std::set<uint64_t> done;  // the seqs marked done (kDone)
    bool operator==(const Others&) const = default;
  };
  using OthersClaims = std::map<std::pair<std::string, std::string>, Others>;
  Result<std::map<std::pair<std::string, std::string>, Claims>> AllOwnClaims(OthersClaims* others = nullptr);
  // How many times this node's record was put under a new lease: a holder
  // that sees it change reads its claims back (some may be revoked).
  uint64_t Standings() const { return standings_.load(std::memory_order_acquire); }
  // Starts the watches and threads and grants the lease; false (LastError
  // says why) if the store cannot be reached or refuses (auth): the node
  // joins once it answers (the next record or campaign takes the lease).
  Status Open();
  // Stops the threads; `leave`: revokes the lease (this node's keys go).
  void Close(bool leave);

  Status Put(const std::string& node, const std::string& bytes) override;
  Status PutHanding(const std::string& node, const std::string& bytes, const Handoff& h) override;
  std::string Turn() override;
  Result<std::vector<std::pair<std::string, std::string>>> List() override;
  std::optional<std::string> Digest() override;
  std::string Describe() override;

  // The last failure, and whether this node's lease expired meanwhile.
  std::string LastError() override;
  // Not a member while the lease is lost, or last confirmed more than two
  // thirds of its TTL ago (the store's countdown began no earlier than the
  // confirming request was sent; the third left covers a publish begun now),
  // or, after a new grant, until this node's record is put under it and
  // its holders' claims are read (another caller's grant — a name, the
  // replica link's advertisement — does not make it a member again).
  std::string Standing() override;
  EtcdRecordsStats Stats();
  bool leader();
  std::string prefix() const { return prefix_; }
  etcd::Client* client() { return &client_; }
  // The lease this node's keys are under; a new one if it expired.
  Result<int64_t> Lease() EXCLUDES(mu_, grant_mu_);

 private:
  Status PutRecord(const std::string& node, const std::string& bytes, const Handoff* h);
  Result<int64_t> LeaseLocked(bool* granted) EXCLUDES(mu_, grant_mu_);  // Lease's one grant
  void KeepAliveLoop();
  void ReduceLoop();
  void OnDigestEvents(const std::vector<etcd::WatchEvent>& evs);
  bool DigestEventsLocked(const std::vector<etcd::WatchEvent>& evs) REQUIRES(mu_);  // true: a new digest
  // The digest keys read (leader, summary, this node's turn); the store's
  // revision as of the read (0: it failed).
  int64_t ReadDigestKeys();
  void OnWatchedDigest(const std::vector<etcd::WatchEvent>& evs);
  // Deletes digest/leader if it names this node under another lease.
  void ForgetOwnLeader(int64_t lease);
  void Reduce();
  // The elected member's view of every record: what it read before, the
  // records put since read now (Reduce); nullopt if it must read the range.
  std::optional<std::vector<std::pair<std::string, std::string>>> RecordsFromWatch();
  void OnMemberEvents(const std::vector<etcd::WatchEvent>& evs);
  void ApplyMemberEventsLocked(const std::vector<etcd::WatchEvent>& evs) REQUIRES(mu_);
  // The view's records (node, bytes) of members: those under a lease.
  std::vector<std::pair<std::string, std::string>> MembersLocked() const REQUIRES(mu_);
  void Campaign();
  void SetError(const std::string& e);
  // This run's taken/ entries, to on_taken_ (`first`: the read after a
  // grant, logged; a refresh is logged at debug); a gone holder's claims
  // revoked (Taken).
  Status ReadTaken(bool first);
  // Revokes `kv` (a claim of `holder`'s run `holder_run`, as read): true
  // once it is kRevoked; false if the claim changed since, or the holder's
  // record changed from `record_rev` (its mod_revision as read, 0: absent;
  // nullopt: another run's, not guarded) — decided again at the next read.
  Result<bool> Revoke(const etcd::KeyValue& kv, const std::string& holder, const std::string& holder_run,
                      std::optional<int64_t> record_rev);
  // This run's applied_seq in record `bytes` (nullopt: none, another run's, or no claims to prune).
  std::optional<uint64_t> AppliedSeqOf(const std::string& bytes);
  void PruneTaken(uint64_t applied);  // this run's claims up to `applied` (its drain's applied_seq)

  const EtcdRecordsOptions opt_;
  const Clock clock_;
  const std::string prefix_;  // /ckptfs/NAME/
  etcd::Client client_;
  Reducer reducer_;
  std::function<void()> on_digest_;
  std::function<void(const Taken&)> on_taken_;
  std::chrono::steady_clock::time_point last_reduce_ GUARDED_BY(mu_);

  Mutex mu_;
  CondVar cv_;
  Mutex grant_mu_ ACQUIRED_BEFORE(mu_);  // Lease(): one grant at a time
  int64_t lease_ GUARDED_BY(mu_) = 0;
  bool lease_lost_ GUARDED_BY(mu_) = false;
  bool taken_read_ GUARDED_BY(mu_) = false;   // taken/ read since the last grant
  // This run's claims as last read (holder -> seqs), until pruned: a holder
  // claims nothing once the run's record is back, so the read has them all.
  std::map<std::string, std::set<uint64_t>> run_claims_ GUARDED_BY(mu_);
  int64_t record_lease_ GUARDED_BY(mu_) = 0;  // the lease this node's record was last put under (Standing)
  std::atomic<uint64_t> standings_{0};        // Standings
  // When the store last confirmed the lease (granted, or a keep-alive
  // answered): cut off longer than the TTL, the node knows it was dropped.
  std::chrono::steady_clock::time_point lease_ok_ GUARDED_BY(mu_);
  std::string leader_value_ GUARDED_BY(mu_);  // digest/leader as last seen ("" : none)
  int64_t leader_rev_ GUARDED_BY(mu_) = 0;    // the revision it was seen as of
  std::string digest_ GUARDED_BY(mu_);
  std::string turn_ GUARDED_BY(mu_);  // this node's last turn (Turn), and its revision
  int64_t turn_rev_ GUARDED_BY(mu_) = 0;
  int64_t digest_rev_ GUARDED_BY(mu_) = 0;  // its mod revision: the newer of summary and turn wins
  bool digest_read_ GUARDED_BY(mu_) = false;  // the digest keys were read once
  // The records as the reads and the members' watch brought them (key:
  // the etcd key), the store revision every put up to which is in, and
  // whether they are whole (a full read since the watch began or was reset).
  std::map<std::string, etcd::KeyValue> members_ GUARDED_BY(mu_);
  int64_t members_rev_ GUARDED_BY(mu_) = 0;
  bool members_whole_ GUARDED_BY(mu_) = false;
  bool watching_members_ GUARDED_BY(mu_) = false;  // members_watch_ runs
  int64_t whole_as_of_ GUARDED_BY(mu_) = 0;         // the clock when the last read of them began
  bool reading_ GUARDED_BY(mu_) = false;                // a full read runs: events are kept too
  std::vector<etcd::WatchEvent> during_ GUARDED_BY(mu_);  // (re-applied after it)
  bool leading_ GUARDED_BY(mu_) = false;
  bool dirty_ GUARDED_BY(mu_) = true;  // a record changed since the last reduction
  int64_t due_ GUARDED_BY(mu_) = 0;
  std::string error_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  EtcdRecordsStats stats_ GUARDED_BY(mu_);
  std::unique_ptr<etcd::Watch> digest_watch_, turn_watch_, members_watch_;
  std::thread keepalive_, reducer_thread_;
};

}  // namespace ckpt::fs
