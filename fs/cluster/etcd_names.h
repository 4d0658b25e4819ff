// etcd_names.h — the names the nodes change, in etcd (--cluster-store), so
// that a lookup on one node sees what another did before it (close-to-open
// across nodes; docs/consistency.md).
//
// Keys /ckptfs/NAME/ns/PATH (PATH as the backend names it), each with the
// writing node's lease; value: the entry (type, mode, owner, mtime, a
// symlink's target). This node puts, before the reply of the change
// (Announce, from Core::AnnounceNames):
//   mkdir, symlink, link    the new name
//   rename                  the new name; a tombstone at the old one
//                           (and, for a directory, every name under it
//                           deleted)
//   unlink, rmdir           a tombstone (value t = x): another node's
//                           miss answers ENOENT, whatever the backend
//                           still holds
// and, once a closed file is persisted (the drain applied its entry), the
// file's name (Sweep): another node's miss or open then asks the backend
// at once instead of trusting what it found there up to --shared-ttl ago.
// A key whose entry is applied is deleted --shared-ttl (+1 s) later: the
// backend holds the name then, and every node's cached answers about it
// have expired — unless another node (or this one) put it since: the
// delete compares the key's mod_revision with this node's put. The keys
// of a node that dies go with its lease.
//
// Thread-safety: every method may be called from any thread; Observe with
// the core's lock held (it takes only mu_).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "fs/cluster/etcd_records.h"
#include "fs/core/shared.h"
#include "fs/meta/meta_store.h"

namespace ckpt::fs {

class OpLog;

class EtcdNames final : public NameStore {
 public:
  // `hold_ms`: how long a key stays after its entry is applied.
  EtcdNames(EtcdRecords* records, OpLog* log, std::string node, int64_t hold_ms);
  ~EtcdNames() override;

  // OpLog::set_observer: the entries as they are logged.
  void Observe(const std::vector<meta::LogEntry>& entries);
  // Before the reply of a namespace change: every name change logged so
  // far is in the store (or the store failed: logged, the change stands).
  // Waits about 1 s at most (200 ms an endpoint at least), and not at all
  // while the store is unreachable (etcd::Client::reachable).
  void Announce();
  // Puts the names of persisted files, deletes the keys that expired.
  void Sweep();
  void Start();
  void Stop();

  // Waits as Announce does; ECONNREFUSED at once while etcd is unreachable.
  Result<std::optional<Name>> Get(const std::string& path) override;

  struct Stats {
    uint64_t puts = 0, deletes = 0, gets = 0, failures = 0;
  };
  Stats stats();

 private:
  struct Change {
    uint64_t seq;
    meta::LogEntry e;
  };
  struct Held {
    uint64_t seq;
    std::string key;
    int64_t applied_ms = 0;  // steady ms when its entry was seen applied (0: not yet)
    int64_t rev = 0;         // the store's revision of the put (its key's mod_revision then)
  };
  std::string Key(const std::string& path) const;
  // How long a FUSE reply waits for one endpoint (Announce, Get).
  int64_t ReplyBudgetMs() const;
  // The requests for `changes` (puts and deletes), in one transaction per
  // 128 operations (etcd's limit).
  void Write(const std::vector<Change>& changes, int64_t timeout_ms = 0);

  EtcdRecords* const records_;
  OpLog* const log_;
  const std::string node_;
  const int64_t hold_ms_;
  Mutex announce_mu_;  // one Announce at a time: a reply after it finds its names written
  Mutex mu_;           // a leaf
  CondVar cv_;
  std::deque<Change> outbox_ GUARDED_BY(mu_);  // namespace changes not written yet
  std::deque<Change> files_ GUARDED_BY(mu_);   // persist entries, written once applied
  std::deque<Held> held_ GUARDED_BY(mu_);      // keys written, deleted hold_ms after applied
  Stats stats_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool skipping_ GUARDED_BY(mu_) = false;  // Announce skips the store (logged once)
  std::thread sweeper_;
};

}  // namespace ckpt::fs
