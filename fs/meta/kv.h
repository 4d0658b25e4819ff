// kv.h — the small ordered key-value interface the metadata store is built on.
//
// Two implementations: RocksKv (rocks_kv.cc, the durable record) and MemKv
// (mem_kv.cc, for tests). The shape follows 3FS src/kv/KVStore.h and JuiceFS
// tkv.go: point reads, prefix scans and atomic batches (and a sync of what
// was written); nothing else.
//
// Thread-safety: a Kv may be used from many threads at once. A Batch is
// owned by one thread (as rocksdb::WriteBatch).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace ckpt::meta {

// A set of puts and deletes applied atomically by Kv::Write.
class Batch {
 public:
  struct Op {
    bool del;
    std::string key;
    std::string value;
  };
  void Put(std::string_view k, std::string_view v) { ops_.push_back({false, std::string(k), std::string(v)}); }
  void Delete(std::string_view k) { ops_.push_back({true, std::string(k), {}}); }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  const std::vector<Op>& ops() const { return ops_; }
  void Clear() { ops_.clear(); }

 private:
  std::vector<Op> ops_;
};

class Kv {
 public:
  virtual ~Kv() = default;

  // Returns the value, ENOENT if absent, EIO on a storage error.
  [[nodiscard]] virtual Result<std::string> Get(std::string_view key) = 0;

  // Applies the batch atomically. `sync` makes it durable against power loss
  // before returning (fsync of the WAL); without it, durable against a crash
  // of the process.
  [[nodiscard]] virtual Status Write(const Batch& batch, bool sync = false) = 0;

  // Makes every write that returned before the call durable against power
  // loss (an fsync of the WAL: what `sync` would have done for each), with
  // no write of its own; a write made during the call may or may not be
  // covered. EIO (or another errno) if the sync failed: then nothing is
  // known beyond the last one that succeeded. Blocks for the disk's flush:
  // not on a FUSE worker's path.
  [[nodiscard]] virtual Status Sync() = 0;

  // Calls fn(key, value) for every key starting with `prefix`, in key order,
  // until fn returns false.
  [[nodiscard]] virtual Status Scan(std::string_view prefix,
                                    const std::function<bool(std::string_view, std::string_view)>& fn) = 0;
};

// Opens (creating if needed, mode 0700) a RocksDB database in `dir`.
// Errors: EACCES, EBUSY (another daemon holds it), EUCLEAN (damaged: a
// corrupted record anywhere but the WAL's torn tail; the reason, naming
// the file, is logged and put in *why), EIO (anything else).
// `read_only`: for a look from outside the daemon (`ckptfs gc`): nothing
// is created or written (ENOENT if there is no store), the lock is still
// taken (EBUSY while a daemon has it).
[[nodiscard]] Result<std::unique_ptr<Kv>> OpenRocksKv(const std::string& dir, std::string* why = nullptr,
                                                      bool read_only = false);

// A fresh in-memory store.
std::unique_ptr<Kv> NewMemKv();

}  // namespace ckpt::meta
