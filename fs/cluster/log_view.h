// log_view.h — what the cluster of --cluster (fs/cluster/cluster.h) reads
// of the local drain log: the OpLog in the daemon (LocalLog,
// local_log.cc), fakes in tests.
//
// The applied seq a node tells the others (its record's applied_seq: they
// delete its etcd claims up to it, and its replicas' holders drop what it
// shows applied) is DurableAppliedSeq, not AppliedSeq: the drain commits
// its completions without a sync, so a machine crash (power loss, a kernel
// panic; not a crash of the process) rolls the metadata back to the last
// synced write and entries already called applied are pending again.
// Published, they had lost the claims and replicas their second apply
// needs. docs/consistency.md "What a record's applied seq promises".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::meta {
class Kv;
}

namespace ckpt::fs {

class OpLog;

// Called without any cluster lock held.
class LogView {
 public:
  virtual ~LogView() = default;
  virtual uint64_t LoggedSeq() = 0;   // the newest entry logged (0: none)
  virtual uint64_t AppliedSeq() = 0;  // every entry up to here is applied
  // Every entry up to here is applied, and that survives a machine crash:
  // the AppliedSeq read before the metadata was synced (Kv::Sync; an entry
  // applied during the sync is not covered), or the last such seq while a
  // sync fails. Syncs at most once a call, and only when the drain applied
  // more since the last: on the cluster's and the replicator's threads,
  // never a FUSE worker's. What others may be told (the record).
  virtual uint64_t DurableAppliedSeq() = 0;
  // The number of files whose closed version is not in the backend yet, and
  // the paths of the first `max` of them, oldest first.
  virtual std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) = 0;
  // The same, but only the files `safe` (ino, version) does not vouch for
  // (not replicated K times): what this node's loss would lose.
  virtual std::pair<uint64_t, std::vector<std::string>> AtRisk(size_t max,
                                                               const std::function<bool(uint64_t, uint64_t)>& safe) {
    return Unpersisted(max);
  }
  // When the pending entries from..to were logged (wall µs), where known:
  // their exact gate times. Entries without one (recovered at a restart)
  // get the cluster's samples'.
  virtual std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) { return {}; }
};

// The local drain log, whose completions `kv` (the metadata store's) holds.
// Thread-safe; DurableAppliedSeq's callers take turns (one sync at a time:
// a caller behind another's sync often finds its seq covered by it).
std::unique_ptr<LogView> LocalLog(OpLog* log, meta::Kv* kv);

}  // namespace ckpt::fs
