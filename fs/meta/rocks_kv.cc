// rocks_kv.cc — the durable Kv: one RocksDB database in the state dir.
//
// RocksDB statuses become errno here and nowhere else (as 3FS
// RocksDBStore::get). Writes go to the WAL without fsync unless asked: that
// survives a daemon crash, and the ordered drain log makes a power loss
// recoverable from the backend.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "fs/common/log.h"
#include "fs/meta/kv.h"

namespace ckpt::meta {
namespace {

int ToErrno(const rocksdb::Status& s) {
  if (s.ok()) return 0;
  if (s.IsNotFound()) return ENOENT;
  if (s.IsIOError()) {
    if (s.ToString().find("lock") != std::string::npos) return EBUSY;
    if (s.ToString().find("ermission") != std::string::npos) return EACCES;
    if (s.IsNoSpace()) return ENOSPC;
  }
  return EIO;
}

class RocksKv final : public Kv {
 public:
  explicit RocksKv(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}

  Result<std::string> Get(std::string_view key) override {
    std::string v;
    auto s = db_->Get(rocksdb::ReadOptions(), rocksdb::Slice(key.data(), key.size()), &v);
    if (s.IsNotFound()) return Err(ENOENT);
    if (!s.ok()) {
      LOG_ERROR("rocksdb get failed: {}", s.ToString());
      return Err(ToErrno(s));
    }
    return v;
  }

  Status Write(const Batch& batch, bool sync) override {
    rocksdb::WriteBatch wb;
    for (const auto& op : batch.ops()) {
      if (op.del) wb.Delete(op.key);
      else wb.Put(op.key, op.value);
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    auto s = db_->Write(wo, &wb);
    if (!s.ok()) {
      LOG_ERROR("rocksdb write of {} ops failed: {}", batch.size(), s.ToString());
      return Err(ToErrno(s));
    }
    return {};
  }

  Status Scan(std::string_view prefix,
              const std::function<bool(std::string_view, std::string_view)>& fn) override {
    rocksdb::ReadOptions ro;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    rocksdb::Slice p(prefix.data(), prefix.size());
    for (it->Seek(p); it->Valid() && it->key().starts_with(p); it->Next()) {
      if (!fn(std::string_view(it->key().data(), it->key().size()),
              std::string_view(it->value().data(), it->value().size())))
        break;
    }
    if (!it->status().ok()) {
      LOG_ERROR("rocksdb scan failed: {}", it->status().ToString());
      return Err(ToErrno(it->status()));
    }
    return {};
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace

Result<std::unique_ptr<Kv>> OpenRocksKv(const std::string& dir) {
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.IncreaseParallelism(2);
  opts.max_open_files = 256;
  opts.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  opts.keep_log_file_num = 2;
  opts.paranoid_checks = true;
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(opts, dir, &raw);
  if (!s.ok()) {
    LOG_ERROR("cannot open metadata store {}: {}", dir, s.ToString());
    return Err(ToErrno(s));
  }
  return std::unique_ptr<Kv>(new RocksKv(std::unique_ptr<rocksdb::DB>(raw)));
}

}  // namespace ckpt::meta
