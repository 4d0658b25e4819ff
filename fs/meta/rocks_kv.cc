// rocks_kv.cc — the durable Kv: one RocksDB database in the state dir.
//
// RocksDB statuses become errno here and nowhere else (as 3FS
// RocksDBStore::get), by Status code, never by message text. Writes go to
// the WAL without fsync unless asked: that survives a daemon crash, and the
// ordered drain log makes a power loss recoverable from the backend. Sync
// makes what was written durable at a moment a caller chooses (the cluster
// record's applied seq: fs/cluster/log_view.h).
//
// Damage is refused, not repaired: paranoid checks on, and the WAL replayed
// with kTolerateCorruptedTailRecords, which accepts only a torn last record
// (what a power loss leaves) and fails the open on corruption anywhere
// else. RocksDB's default (kPointInTimeRecovery) stops at the first bad
// record and opens what came before it: closed checkpoints recorded after
// that point vanished, and start-up then deleted their tier bytes as
// belonging to unknown inodes.
//
// One daemon per database: a lock file (flock, held for the Kv's life)
// tells a second daemon EBUSY before RocksDB is touched.
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>

#include "common/failpoint.h"
#include "common/log.h"
#include "fs/meta/kv.h"

namespace ckpt::meta {
namespace {

int ToErrno(const rocksdb::Status& s) {
  using C = rocksdb::Status::Code;
  if (s.ok()) return 0;
  if (s.IsNoSpace()) return ENOSPC;
  if (s.IsPathNotFound()) return ENOENT;
  switch (s.code()) {
    case C::kNotFound: return ENOENT;
    case C::kCorruption: return EUCLEAN;
    case C::kNotSupported: return EOPNOTSUPP;
    case C::kInvalidArgument: return EINVAL;
    case C::kBusy: return EBUSY;
    case C::kTimedOut: return ETIMEDOUT;
    case C::kAborted: return ECANCELED;
    case C::kTryAgain: return EAGAIN;
    default: return EIO;
  }
}

// RocksDB's corruption status does not say which file; the write-ahead
// logs are where a mid-log corruption sits, so name them (with sizes).
std::string DamagedFiles(const std::string& dir) {
  std::string out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".log" || e.file_size(ec) == 0) continue;
    out += (out.empty() ? "" : ", ") + e.path().string() + " (" + std::to_string(e.file_size(ec)) + " bytes)";
  }
  return out.empty() ? "" : " in " + out;
}

class RocksKv final : public Kv {
 public:
  RocksKv(std::unique_ptr<rocksdb::DB> db, int lock_fd, bool read_only)
      : db_(std::move(db)), lock_fd_(lock_fd), read_only_(read_only) {}
  ~RocksKv() override {
    db_.reset();
    close(lock_fd_);  // releases the flock
  }

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
#if defined(__SANITIZE_THREAD__)
    // RocksDB groups concurrent writes: one writer appends the batches of
    // those queued behind it, handed over through atomics inside
    // librocksdb, which is not built with ThreadSanitizer. TSan sees one
    // thread read another's batch with no order between them. Its build
    // writes one at a time, so no group forms; others write concurrently.
    std::lock_guard tsan_lk(tsan_write_mu_);
#endif
    auto s = FAULT("meta.write") ? rocksdb::Status::IOError("fault meta.write") : db_->Write(wo, &wb);
    if (!s.ok()) {
      LOG_ERROR("rocksdb write of {} ops failed: {}", batch.size(), s.ToString());
      return Err(ToErrno(s));
    }
    return {};
  }

  Status Sync() override {
    if (read_only_) return {};  // nothing was written through this handle
#if defined(__SANITIZE_THREAD__)
    std::lock_guard tsan_lk(tsan_write_mu_);  // see Write: RocksDB's hand-overs are invisible to TSan
#endif
    // FlushWAL(true): RocksDB's buffer to the file, then SyncWAL (every
    // live WAL file, and their directory if new). The buffer is empty while
    // manual_wal_flush is off (its default, and ours), so this is SyncWAL;
    // written so, it stays right if that is ever turned on. Writes go on
    // meanwhile: the fsync runs outside RocksDB's write path.
    auto s = FAULT("meta.write") ? rocksdb::Status::IOError("fault meta.write") : db_->FlushWAL(true);
    if (!s.ok()) {
      // Logged once a run of failures: the caller tries again at each
      // record it writes (a heartbeat), and a failing disk fails them all.
      if (!sync_failing_.exchange(true)) LOG_ERROR("rocksdb sync of the WAL failed: {}", s.ToString());
      else LOG_DEBUG("rocksdb sync of the WAL failed: {}", s.ToString());
      return Err(ToErrno(s));
    }
    if (sync_failing_.exchange(false)) LOG_INFO("rocksdb: the WAL syncs again");
    return {};
  }

  Status Scan(std::string_view prefix, const std::function<bool(std::string_view, std::string_view)>& fn) override {
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
  int lock_fd_;
  const bool read_only_;                   // OpenRocksKv's read_only
  std::atomic<bool> sync_failing_{false};  // the last Sync failed (logged once)
#if defined(__SANITIZE_THREAD__)
  std::mutex tsan_write_mu_;  // see Write
#endif
};

}  // namespace

Result<std::unique_ptr<Kv>> OpenRocksKv(const std::string& dir, std::string* why, bool read_only) {
  if (!read_only && mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrFromErrno();
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return Err(errno == ELOOP ? ENOTDIR : errno);
  int lock_fd = openat(dfd, "CKPTFS.LOCK", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  int e = lock_fd < 0 ? errno : 0;
  close(dfd);
  if (lock_fd < 0) return Err(e);
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    e = errno;
    close(lock_fd);
    return Err(e == EWOULDBLOCK ? EBUSY : e);
  }
  rocksdb::Options opts;
  opts.create_if_missing = !read_only;
  opts.IncreaseParallelism(2);
  opts.max_open_files = 256;
  opts.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  opts.keep_log_file_num = 2;
  opts.paranoid_checks = true;
  opts.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  rocksdb::DB* raw = nullptr;
  auto s = read_only ? rocksdb::DB::OpenForReadOnly(opts, dir, &raw) : rocksdb::DB::Open(opts, dir, &raw);
  if (!s.ok()) {
    close(lock_fd);
    LOG_ERROR("cannot open metadata store {}: {}", dir, s.ToString());
    if (why) *why = s.ToString() + (s.IsCorruption() ? DamagedFiles(dir) : "");
    return Err(ToErrno(s));
  }
  return std::unique_ptr<Kv>(new RocksKv(std::unique_ptr<rocksdb::DB>(raw), lock_fd, read_only));
}

}  // namespace ckpt::meta
