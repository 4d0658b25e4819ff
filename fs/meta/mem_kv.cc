// mem_kv.cc — an in-memory Kv for unit tests: a std::map under a mutex.
#include <map>

#include "common/mutex.h"
#include "fs/meta/kv.h"

namespace ckpt::meta {
namespace {

class MemKv final : public Kv {
 public:
  Result<std::string> Get(std::string_view key) override {
    MutexLock lk(&mu_);
    auto it = map_.find(std::string(key));
    if (it == map_.end()) return Err(ENOENT);
    return it->second;
  }

  Status Write(const Batch& batch, bool /*sync*/) override {
    MutexLock lk(&mu_);
    for (const auto& op : batch.ops()) {
      if (op.del) map_.erase(op.key);
      else map_[op.key] = op.value;
    }
    return {};
  }

  Status Sync() override { return {}; }  // nothing here outlives the process: as durable as it gets

  Status Scan(std::string_view prefix, const std::function<bool(std::string_view, std::string_view)>& fn) override {
    MutexLock lk(&mu_);
    for (auto it = map_.lower_bound(std::string(prefix)); it != map_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      if (!fn(it->first, it->second)) break;
    }
    return {};
  }

 private:
  // A leaf; held across Scan's callback, which therefore must not call back
  // into this Kv (it would deadlock).
  Mutex mu_;
  std::map<std::string, std::string> map_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Kv> NewMemKv() { return std::make_unique<MemKv>(); }

}  // namespace ckpt::meta
