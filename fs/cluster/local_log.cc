// local_log.cc — the cluster's view of this node's drain log (LocalLog,
// fs/cluster/log_view.h): the OpLog's queries, and the applied seq made
// durable before it is told to anyone (DurableAppliedSeq).
//
// What it gives up: a sync costs a disk flush (a millisecond or more) on the
// caller's thread each time the drain applied something since the last
// one, so a record that follows the drain step by step (etcd, Poke) pays
// one per step. A sync that fails holds the published seq where it was,
// never lets it run ahead: the others keep claims and replicas longer.
#include <string>

#include "common/log.h"
#include "common/mutex.h"
#include "common/result.h"
#include "fs/cluster/log_view.h"
#include "fs/core/oplog.h"
#include "fs/meta/kv.h"

namespace ckpt::fs {
namespace {

class OpLogView final : public LogView {
 public:
  OpLogView(OpLog* l, meta::Kv* kv) : l_(l), kv_(kv) {}
  uint64_t LoggedSeq() override { return l_->LoggedSeq(); }
  uint64_t AppliedSeq() override { return l_->AppliedSeq(); }
  uint64_t DurableAppliedSeq() override {
    MutexLock lk(&mu_);
    // Read before the sync begins: its completion was committed before the
    // read (Complete, Commit, then Finish advances the seq), so the sync
    // covers it; one applied during the sync may not be.
    const uint64_t applied = l_->AppliedSeq();
    // durable_ starts at 0, not at the seq the store held at start-up: a
    // daemon restarted after a crash of its process reads back completions
    // that may still be only in the page cache.
    if (applied <= durable_) return durable_;
    if (auto st = kv_->Sync(); !st) {
      if (!sync_failed_)
        LOG_WARN("cluster: cannot sync the metadata ({}): the applied seq the others see stays at {}",
                 ErrStr(st.error()), durable_);
      sync_failed_ = true;
      return durable_;
    }
    sync_failed_ = false;  // the Kv logs that it syncs again
    durable_ = applied;
    return applied;
  }
  std::pair<uint64_t, std::vector<std::string>> Unpersisted(size_t max) override { return l_->UnpersistedFiles(max); }
  std::pair<uint64_t, std::vector<std::string>> AtRisk(size_t max,
                                                       const std::function<bool(uint64_t, uint64_t)>& safe) override {
    // Asked outside the log's lock: `safe` takes the replicator's.
    std::pair<uint64_t, std::vector<std::string>> out{0, {}};
    for (auto& [ino, version, path] : l_->UnpersistedVersions()) {
      if (safe(ino, version)) continue;
      if (out.first++ < max) out.second.push_back(std::move(path));
    }
    return out;
  }
  std::vector<std::pair<uint64_t, int64_t>> LoggedTimes(uint64_t from, uint64_t to) override {
    return l_->LoggedTimes(from, to);
  }

 private:
  OpLog* const l_;
  meta::Kv* const kv_;
  // Held across the sync: only the cluster's threads and the replicator's
  // take it (never a FUSE worker), and one behind a sync mostly finds its
  // seq covered when it gets it. A leaf, but for RocksDB's own locks inside
  // the sync (AppliedSeq reads an atomic).
  Mutex mu_;
  uint64_t durable_ GUARDED_BY(mu_) = 0;  // the seq the last successful sync covered
  bool sync_failed_ GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<LogView> LocalLog(OpLog* log, meta::Kv* kv) { return std::make_unique<OpLogView>(log, kv); }

}  // namespace ckpt::fs
