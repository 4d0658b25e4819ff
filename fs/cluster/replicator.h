// replicator.h — --replicas K (issue #30): every file this node closes is
// streamed to K other members' replica stores, starting at its close and
// overlapped with the drain, and dropped there once the drain persisted it.
//
// Peers: where the members' replica links listen, from the etcd cluster
// store. Each member puts /ckptfs/NAME/replicas/NODE = HOST:PORT under its
// lease (so a dead member's address goes with it) and every member reads
// the prefix once, then watches it: O(1) requests per member per join or
// leave, nothing per checkpoint. A file's holders are the members with the
// highest rendezvous hash XXH3(path, member) other than the writer, taken
// from distinct failure groups first (GroupOf: `--replica-group N`
// consecutive member numbers, a rack's worth; the writer's own group last),
// so that one rack lost never takes a file and every copy of it. Every
// node computes the same order from the same list, a member that joins or
// leaves moves only the files it wins or held, and the file's home for
// loads (peer_loads.h: the best member of all) is its writer, its first
// holder, or a member of the writer's group that holds nothing and fetches
// it once from the backend. (It was XXH3(writer.ino.version, member) until
// loads from peers: a reader knows a file's path and checksum, never its
// writer's inode.)
//
// Replicator: one thread takes the closed versions the log announces, and
// its namespace entries (mkdir, rename, unlink...: small replicas of key
// (kEntryIno, seq) whose bytes are the encoded entry, which a holder applies
// in a dead writer's place: takeover.h),
// (OpLog observer), waits while a save is running (the drain's own rule:
// replication never competes with the trainer), hashes the version's bytes
// (the content checksum the holder checks the replica against) and sends
// it to the first K holders that take it. A version superseded or
// persisted before its turn is skipped. Once K holders answered HELD, the
// version is `replicated` (Replicated(), the file's user.ckptfs.state)
// while those holders are live members (a holder whose lease ended takes
// its replicas with it: the version is sent to the next member);
// once the drain applied it, the holders are told to drop it: only once
// the applied seq passed it, never while the drain holds at a refusal
// before it or the log shuts down (then nothing of it is in the backend,
// and its replicas are what a node lost then leaves of it), and only once
// that applied seq is durable (Ports::durable_applied). A holder
// without room (WAIT) or gone makes the replicator try the next member in
// the order, then again later; the file stays in RAM and its drain goes
// on meanwhile.
//
// Thread-safety: every method may be called from any thread; Observe with
// the core's lock held (it takes only mu_).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "fs/cluster/etcd_records.h"
#include "fs/cluster/replica_link.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs::replica {

class Peers {
 public:
  // `addr`: this member's replica link ("" : it advertises none); `group`:
  // members per failure group (GroupOf).
  Peers(EtcdRecords* records, std::string node, std::string addr, uint64_t group = kDefaultGroup);
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  void Start();
  void Stop();
  static constexpr uint64_t kDefaultGroup = 8;
  // A member's failure group: its id with the number it ends in divided by
  // `group` ("gpu-017" and "gpu-023" are both "gpu-#2" with 8: consecutive
  // node numbers share a rack), or the id itself when it ends in no digit
  // (a group of its own). Zeros and length do not matter: "n07" is n7.
  static std::string GroupOf(std::string_view node, uint64_t group);
  // Every other member with a link, best holder of the file at `path`
  // first: (node, addr). The best member of each group outside the
  // writer's comes before any second one of a group (and before the
  // writer's group), each run in rendezvous order.
  std::vector<std::pair<std::string, std::string>> Ranked(std::string_view path) const;
  // Whether `a` and `b` share a failure group.
  bool SameGroup(std::string_view a, std::string_view b) const;
  // The home of the file at `path` (peer_loads.h): the best of every member
  // with a link, this node included; empty when none is known.
  std::pair<std::string, std::string> Home(std::string_view path) const;
  size_t count() const;  // other members with a link
  bool known() const;    // the members' links were read once (count() says something)
  // Unit tests, without etcd (records null, never started): the members,
  // and the revision each listed its address at (none: all alike).
  void SetMembersForTest(std::map<std::string, std::string> m, std::map<std::string, int64_t> revisions = {});
  std::string addr_of(const std::string& node) const;

 private:
  void Loop();
  bool Advertise();  // true: this node's key is in the store under its current lease
  bool Read();       // the whole prefix; then the watch follows it

  EtcdRecords* const records_;
  const std::string node_, addr_, prefix_;
  const uint64_t group_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool reread_ GUARDED_BY(mu_) = true;
  // One address is one daemon: when two members list the same address (a
  // daemon under a new id took the port of one whose lease has not ended),
  // it is the one whose key is newest (etcd's create_revision: a member's
  // re-put each second keeps it, so two live daemons on one address, a
  // misconfiguration, do not take turns); the other is left out until it
  // lists an address of its own. Without that, K copies could be counted on one
  // daemon through its two names. Derive makes members_ from listed_.
  void Derive() REQUIRES(mu_);
  std::map<std::string, std::pair<std::string, int64_t>> listed_ GUARDED_BY(mu_);  // node → addr, key's creation
  std::set<std::string> shadowed_ GUARDED_BY(mu_);                                 // listed, left out (logged once)
  std::map<std::string, std::string> members_ GUARDED_BY(mu_);  // node → addr
  int64_t revision_ GUARDED_BY(mu_) = 0;
  std::unique_ptr<etcd::Watch> watch_;
  std::thread thread_;
};

class Replicator {
 public:
  // A read-only descriptor of exactly one sealed version's bytes; `keep`
  // holds it open.
  struct Source {
    std::shared_ptr<const void> keep;
    int fd = -1;
    uint64_t size = 0;
    // Whether `fd` still holds the version's bytes, asked once they all
    // went to the first holder, before its END (a live tier file a writer
    // began to change meanwhile, its version copied aside: what went may
    // be torn). Unset: always.
    std::function<bool()> unchanged;
  };
  struct Ports {
    // The version an entry names. ESTALE or ENODATA: superseded or gone
    // (skipped); EINPROGRESS: not now (tried again).
    std::function<Result<Source>(const meta::LogEntry&)> source;
    std::function<int64_t(uint64_t seq)> gate_us;  // 0: not known
    // Calls `fn` once the entry `seq` is applied (its bytes persisted, or
    // undone): on the drain's thread, without locks held. OpLog::WhenApplied:
    // EIO too when an entry up to `seq` failed or was lost (applied all the
    // same), and when the drain holds at a refusal before it or the log
    // shuts down (not applied: applied_seq tells those apart).
    std::function<void(uint64_t seq, std::function<void(int err)> fn)> when_applied;
    // Every entry up to here is applied (OpLog::AppliedSeq). Without it an
    // EIO from when_applied never drops a replica.
    std::function<uint64_t()> applied_seq;
    // The same, made durable (LogView::DurableAppliedSeq: a sync of the
    // metadata when needed). Asked once for each round's DROPs, on the
    // replicator's thread: they go only once it reaches applied_seq (the
    // drain's completions are committed without a sync; a machine crash
    // makes them pending again, their replicas needed). Unset: not asked.
    std::function<uint64_t()> durable_applied;
    std::function<bool()> hold;  // true while a save runs: wait
    // New entries were observed (UnsafeFrom moved): called on the
    // replicator's thread, no lock held, so that the cluster's record names
    // them at risk within a store round trip, not at its next tick.
    std::function<void()> observed;
    // The content checksum sent with ino@version's replicas (a file's, not
    // an entry's), once a version's chunks all reached its first holder and
    // before END goes, so before any holder holds it (on the replicator's
    // thread, the link holding END back; told once a version, even when that
    // holder then refuses it; false: not kept, and no holder gets the
    // version now); and the version's replicas dropped once persisted (on
    // the replicator's thread). sent_sums.h keeps it for a restart's
    // read-back. Unset: not told.
    std::function<bool(uint64_t ino, uint64_t version, uint64_t hi, uint64_t lo)> sent;
    std::function<void(uint64_t ino, uint64_t version)> dropped;
    // This run's incarnation (the member record's), sent with each replica:
    // a holder tells the replicas of a dead run from a new one's under the
    // same node id by it (Takeover).
    std::string incarnation;
  };
  struct Stats {
    int replicas = 0;
    uint64_t queued = 0, replicated_files = 0, replicated_bytes = 0, dropped = 0, waits = 0, failures = 0;
    // Copies placed in this node's own failure group: no member of another
    // group took them (Peers::GroupOf).
    uint64_t same_group = 0;
    uint64_t replicated_entries = 0;  // namespace entries (mkdir, rename, unlink...) held K times
    std::string last_error;
  };

  Replicator(std::string node, int k, Link* link, Peers* peers, Ports ports);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  void Start();
  void Stop();
  void Observe(const std::vector<meta::LogEntry>& entries);
  bool Replicated(uint64_t ino, uint64_t version) const;
  // The oldest of this node's log entries not held K times yet (queued,
  // being sent, or not observed yet): the cluster's record names its gate,
  // so that a member that dies loses only what lies from there on
  // (Cluster::KeepsRemoval).
  uint64_t UnsafeFrom() const;
  // A version being sent, or one queued for its first try: spares wait
  // (Residency::set_busy). One waiting to be tried again (a holder gone,
  // full) does not count, so a cluster that cannot take replicas does not
  // keep the next save from its spare.
  bool Sending() const;
  Stats stats() const;

 private:
  // While a save runs, what is small goes anyway: namespace entries and
  // files of at most kSmallFile bytes (a `latest`, a config) cost the save
  // nothing, and waiting would leave them in this node's RAM only for as
  // long as the trainer keeps saving (the crash harness's node-loss kind:
  // a `latest` closed 200 ms before the node's loss, not replicated).
  static constexpr uint64_t kSmallFile = 1 << 20;
  static constexpr uint64_t kUnsized = ~0ull;
  struct Item {
    meta::LogEntry e;
    std::chrono::steady_clock::time_point not_before;
    int tries = 0;
    uint64_t size = kUnsized;  // the version's bytes, once asked (Next)
  };
  using Version = std::pair<uint64_t, uint64_t>;  // ino, version
  void Run();
  // The next item due: the first one, or while a save runs (`hold`) the
  // first small one; items of unknown size on the way go into `to_size`.
  std::deque<Item>::iterator Next(bool hold, std::vector<meta::LogEntry>* to_size) REQUIRES(mu_);
  // Sends one version; false: try again later.
  bool Send(const Item& it);
  void Applied(const Version& v);
  // when_applied answered `err` for `v`, logged at `seq`: Applied, or, if
  // the applied seq has not passed `seq` (a hold, a shutdown), watched
  // again once it moved (Run).
  void Answered(const Version& v, uint64_t seq, int err);
  // Holders that left (their address gone from Peers) hold nothing any
  // more: their versions are sent again, to the next members in the order.
  void ForgetGoneHolders();
  void Fail(const std::string& why);

  const std::string node_;
  const int k_;
  Link* const link_;
  Peers* const peers_;
  const Ports ports_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::deque<Item> queue_ GUARDED_BY(mu_);
  std::map<Version, std::vector<std::string>> held_ GUARDED_BY(mu_);  // replicated: its holders' addresses
  std::map<Version, meta::LogEntry> entries_ GUARDED_BY(mu_);         // the entry of each held version
  std::set<Version> pending_ GUARDED_BY(mu_);                         // queued or being sent
  std::set<Version> applied_ GUARDED_BY(mu_);                         // of those, persisted (or undone) meanwhile
  std::vector<std::pair<std::string, Key>> drops_ GUARDED_BY(mu_);
  // Versions whose watch heard EIO before the applied seq passed them:
  // their seq and the applied seq then (watched again once it moves).
  std::map<Version, std::pair<uint64_t, uint64_t>> rewatch_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
  uint64_t observed_ GUARDED_BY(mu_) = 0;  // the newest seq observed
  uint64_t sending_ GUARDED_BY(mu_) = 0;   // the seq of the item out of the queue (0 : none)
  std::thread thread_;
};

}  // namespace ckpt::fs::replica
