// cluster_types.h — what the cluster of --cluster (fs/cluster/cluster.h)
// reads and shows: its options, the two views it reads through (the local
// drain log, the members' records), and the status it reports of each
// member.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "common/result.h"
#include "fs/cluster/log_view.h"

namespace ckpt::fs {

struct ClusterOptions {
  std::string name;                   // --cluster
  std::string node;                   // --node
  int64_t heartbeat_ms = 500;         // a record at least this often
  int64_t tick_ms = 100;              // sooner when something changed (Tick)
  int64_t sample_ms = 10;             // gate times of recovered entries: see docs/consistency.md
  int64_t member_timeout_ms = 60000;  // --member-timeout
  int64_t max_skew_ms = 50;           // --max-clock-skew
  size_t max_refused = 1000;          // refused nodes named in a record
  // This run of the node: made with its state dir (StateIncarnation), so a
  // replacement machine that mounts under a dead node's --node id with a
  // new state dir is told apart from the node it replaces. Empty: unknown
  // (records of versions before it; tests).
  std::string incarnation;
};

// Whether two records of one node are of the same run: the same
// incarnation, or either one unknown (a record of an older version).
inline bool SameIncarnation(const std::string& a, const std::string& b) { return a.empty() || b.empty() || a == b; }

struct ClusterRecord;

// What this node holds for other members (issue #30; Cluster::SetHeldGate,
// Takeover::Held): `gate`, the earliest replica's gate + 1 µs (its record
// names it pending); and the replicas of dead members it is to publish in
// their place, which are lost with this node: the earliest's gate (its
// record's U goes back there), how many files, their paths (the first).
struct HeldForOthers {
  std::optional<int64_t> gate;
  std::optional<int64_t> dead_gate;
  uint64_t dead_files = 0;
  std::vector<std::string> dead_paths;
};
// The same for a record (the paths follow the count, nearly always).
inline bool SameHeld(const HeldForOthers& a, const HeldForOthers& b) {
  return a.gate == b.gate && a.dead_gate == b.dead_gate && a.dead_files == b.dead_files;
}
// The name a run of a member is logged dead and back under: the node id,
// and its incarnation where known (two runs of one id are two members).
std::string NotedName(const ClusterRecord& r);
// The "incarnation" of a member record (ClusterOptions::incarnation): ""
// when the record has none; throws for one no member writes (empty, or
// over kMaxIncarnation bytes, or not a string). cluster_record.cc.
constexpr size_t kMaxIncarnation = 64;
std::string Incarnation(const nlohmann::json& record);

// Whether `s` may name a cluster or a node: [A-Za-z0-9][A-Za-z0-9._-]{0,63}.
bool ValidClusterName(const std::string& s);

// What the elected member's reduction of every record says (Cluster::Reduce,
// with a store that reduces: etcd). The rule lets only one member's entry
// pass at a time — the member whose oldest pending entry is first in
// (gate, node) order — so each step of a checkpoint's chain concerns one
// member: it gets the digest alone (`turn`, under its own key), and the
// digest every member watches (`summary`) is written at most once per
// SummaryGapUs (sooner when a member is lost or refused). A thousand
// members then receive a few summaries a second, not one for each of the
// thousand steps of a checkpoint (docs/scale.md).
//
// The turn also carries a *baton* (docs/scale.md "The baton"): the next
// members in that order whose entries the rule would let pass once the
// members before them in it have published (every other member's record
// already allows them), with the records of those members. A member that
// published its entry puts its new record into the baton and hands it to
// the next (RecordStore::PutHanding: one transaction with its record), so
// a step of the chain is one store round trip between two members, not a
// round trip to the elected member and another back.
struct Reduction {
  std::string summary;    // for every member ("" : nothing new, or not yet)
  std::string turn_node;  // the member whose entry this reduction lets pass ("" : none new)
  std::string turn;       // the digest for it alone ("" : none)
  int64_t due = 0;        // µs: when a new reduction would say more (0 : when a record changes)
};

// A baton handed on with a record (Reduction): the digest for member `to`,
// written under turn/`to` only while `leader` is still the elected member.
struct Handoff {
  std::string to, digest, leader;
};

// Where the members' records are (the backend's reserved area; fakes in
// tests).
class RecordStore {
 public:
  virtual ~RecordStore() = default;
  [[nodiscard]] virtual Status Put(const std::string& node, const std::string& bytes) = 0;
  // This node's record and, in the same request, a baton for the next
  // member (a store that reduces; the others only put the record).
  [[nodiscard]] virtual Status PutHanding(const std::string& node, const std::string& bytes, const Handoff&) {
    return Put(node, bytes);
  }
  // The last turn given to this node (a baton it holds, or records newer
  // than the digest's), even when a newer summary followed it ("" : none).
  virtual std::string Turn() { return ""; }
  [[nodiscard]] virtual Result<std::vector<std::pair<std::string, std::string>>> List() = 0;
  // A store that reduces the records in one place (etcd:
  // fs/cluster/etcd_records.h) gives each member a digest of them instead
  // of every record: its newest ("" : none yet). nullopt: the store does
  // not reduce, and List() is read.
  virtual std::optional<std::string> Digest() { return std::nullopt; }
  // What the store is, for status ("backend records", "etcd://...").
  virtual std::string Describe() { return "backend records"; }
  // Why the store's last request failed, in its own words ("" : not known
  // beyond the errno).
  virtual std::string LastError() { return ""; }
  // Why this node may be counted dead by the others though its last write
  // succeeded (etcd: its lease expired, or was last confirmed too long
  // ago to outlast a publish), "" : it is a member. Cheap; called under
  // the cluster's lock, so it calls nothing back.
  virtual std::string Standing() { return ""; }
};

// The records of cluster `name` in `be` (Backend::PutRecord/ListRecords).
std::unique_ptr<RecordStore> BackendRecords(backend::Backend* be, std::string name);

// One member's record as read (Cluster::ParseRecord).
struct ClusterRecord {
  std::string node, state;
  std::string incarnation;                     // ClusterOptions::incarnation of the run that wrote it ("" unknown)
  int64_t heartbeat_us = 0, watermark_us = 0;  // wall clock, µs
  std::optional<int64_t> oldest_gate_us;
  std::optional<int64_t> unsafe_gate_us;  // U: its oldest entry not replicated K times
  uint64_t unpersisted = 0, at_risk = 0;  // at_risk: of those, not replicated (paths: the first)
  std::vector<std::string> paths;
  std::vector<std::pair<std::string, int64_t>> refused;  // the records it refuses: node, their heartbeat
  std::string problem;                                   // ClusterMember::record_problem
  int problem_reads = 0;                                 // reads in a row that found it
};

// A baton this member holds: the digest as given, its elected member, the
// gate of this member's entry in it and the digest's read time, whether it
// names a member after this one (handed on once the entry is applied), and
// the records of the members before it as they handed it on.
struct HeldBaton {
  std::string digest, leader;
  int64_t gate_us = 0, as_of_us = 0;
  bool hand_on = false;
  std::vector<ClusterRecord> before;
};

// One member as the last record read shows it.
struct ClusterMember {
  std::string node;
  bool self = false;
  std::string state;                      // "live", "left"; "dead" when live and its heartbeat is too old
  int64_t heartbeat_ms = 0;               // T: its newest sample when it wrote the record
  int64_t age_ms = 0;                     // now - T, by this node's clock
  int64_t watermark_ms = 0;               // everything it closed before this is persisted
  std::optional<int64_t> oldest_gate_ms;  // G: its oldest pending entry's gate time
  uint64_t unpersisted = 0;
  uint64_t at_risk = 0;            // of those, not replicated K times: lost with it
  std::vector<std::string> paths;  // the first at risk (lost, if it is dead)
  // Why the record shown is not the member's current one ("" : it is):
  // "missing", "unreadable" or "refused (...)"; the last one read stands.
  std::string record_problem;
  std::string incarnation;  // the run its record is of ("" unknown)
};

// A record refused at the last read (its times in this node's future): no
// member, and named in this node's record so that its writer knows.
struct RefusedRecord {
  std::string node;
  std::string reason;  // "its times lie N s in this node's future (...)"
  int64_t heartbeat_ms = 0;
  uint64_t unpersisted = 0;
};

// Removals ordered after what a lost member took with it (issue #30).
// A member that dies loses its entries from U on — its oldest entry not
// held K times by replicas (all of them without --replicas) — and the
// order the backend keeps then has a hole: the others' later entries pass
// once it is named lost. A file or a `latest` is then missing, which the
// lost list says; but a removal ordered after the lost entries could take
// away what the backend's older `latest` still names (rank 0 lost with a
// newer `latest` not yet replicated, and the live ranks' rotation removing
// the step the older one names). So a removal (unlink, rmdir) whose gate
// lies after U and before this node learned of the loss is not applied to
// the backend: the backend keeps those files (listed, counted, logged),
// never a `latest` naming a step it removed. Later removals go as before:
// they were made after the loss was known. Not thread-safe: the cluster's
// lock guards it.
class LostWindows {
 public:
  // `node` is named lost; its entries from gate `from_us` on are lost.
  // `now`: when this node learned it (the first call for a window counts).
  void Note(const std::string& node, int64_t from_us, int64_t now);
  // The lost member whose window holds `gate_us` ("" : none): from_us <
  // gate_us < learned. Counts `path` as kept when one does.
  std::string Keeps(int64_t gate_us, const std::string& path);
  uint64_t kept() const { return kept_; }
  const std::deque<std::string>& kept_paths() const { return kept_paths_; }
  size_t size() const { return windows_.size(); }

 private:
  struct Window {
    std::string node;
    int64_t from_us, known_us;
  };
  static constexpr size_t kMax = 64;    // windows kept (a window once noted stays: its removals may come late)
  static constexpr size_t kPaths = 16;  // paths shown (the newest)
  std::deque<Window> windows_;
  uint64_t kept_ = 0;
  std::deque<std::string> kept_paths_;
};

// The first of a member's entries at risk (not replicated K times), 0 if
// none: `unsafe_from` (Replicator::UnsafeFrom) once it is logged. While
// every entry is held, UnsafeFrom is the next seq to log, and it stays that
// seq once that entry is logged and queued: compared raw, a record naming
// nothing at risk stood while files closed (the crash harness's node-loss
// kind, seed 166835: three shards lost unlisted).
inline uint64_t AtRiskFrom(uint64_t unsafe_from, uint64_t logged) { return unsafe_from <= logged ? unsafe_from : 0; }

// What a dead member's last record says it loses, for the log: "its N
// unpersisted files not replicated are lost, e.g. P (M others are
// replicated: their holders publish them)".
std::string LostFilesText(uint64_t unpersisted, uint64_t at_risk, const std::vector<std::string>& paths);
// Takes out of dead `gone` the paths a live record names at risk too (K > 1: a holder's loss is not the file's).
void NotLostWhereHeld(ClusterRecord* gone, const std::map<std::string, ClusterRecord>& live);

struct ClusterStatus {
  std::string name, node;
  std::string store;           // RecordStore::Describe
  uint64_t members_total = 0;  // live members, this node included (etcd: as the digest counts them)
  std::string leader;          // etcd: the member that reduces the records ("" : none known)
  int64_t watermark_ms = 0;
  // Sorted by node id, this node included. With etcd, only the members
  // whose records decide the rule now (the digest's), not every one.
  std::vector<ClusterMember> members;
  // The drain waits for the cluster: its head entry, gate time, the members
  // that hold it back, since when (wall ms).
  bool waiting = false;
  uint64_t wait_seq = 0;
  int64_t wait_gate_ms = 0;
  std::vector<std::string> waiting_for;
  int64_t waiting_since_ms = 0;
  std::string last_error;      // the last record write or read that failed ("" if fine)
  bool node_id_clash = false;  // another mount writes records under this node id
  // Why this node publishes nothing now ("" : it may): its record is not in
  // the store (not joined yet, the last write failed, missing) or another
  // member refuses it.
  std::string publish_blocked_reason;
  std::vector<RefusedRecord> refused;  // sorted by node id
  // Removals not applied to the backend: ordered after a lost member's
  // lost entries (LostWindows); the newest paths.
  uint64_t kept_removals = 0;
  std::vector<std::string> kept_paths;
};

}  // namespace ckpt::fs
