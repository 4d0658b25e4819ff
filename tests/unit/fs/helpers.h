// helpers.h — a namespace over a fresh store and tier, for fs/ unit tests.
#pragma once

#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "cache/tier.h"
#include "fs/core/inode_table.h"
#include "fs/meta/meta_store.h"

namespace ckpt::test {

// Which Kv the store uses: every namespace suite runs over both.
enum class KvKind { kMem, kRocks };

// Stands in for fs/passthrough (the kernel's backing ids).
struct FakeBacking : fs::BackingFiles {
  int next = 1;
  std::set<int> open;
  bool active() const override { return true; }
  Result<int> OpenBacking(int) override {
    open.insert(next);
    return next++;
  }
  void CloseBacking(int id) override { open.erase(id); }
};

// A store that refuses writes on demand, as RocksDB does after a failed
// WAL write.
class FailingKv final : public meta::Kv {
 public:
  explicit FailingKv(std::unique_ptr<meta::Kv> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> fail{false};
  Result<std::string> Get(std::string_view k) override { return inner_->Get(k); }
  Status Write(const meta::Batch& b, bool sync) override {
    if (fail) return std::unexpected(EIO);
    return inner_->Write(b, sync);
  }
  Status Sync() override {
    if (fail) return std::unexpected(EIO);
    return inner_->Sync();
  }
  Status Scan(std::string_view p, const std::function<bool(std::string_view, std::string_view)>& fn) override {
    return inner_->Scan(p, fn);
  }

 private:
  std::unique_ptr<meta::Kv> inner_;
};

struct Env {
  std::string dir;  // temp dir holding the RocksDB and the tier
  KvKind kind;
  std::unique_ptr<meta::MetaStore> store;
  std::unique_ptr<cache::Tier> tier;
  std::unique_ptr<fs::InodeTable> table;
  backend::Backend* backend = nullptr;

  explicit Env(KvKind k, uint64_t budget = 64ull << 20, backend::Backend* be = nullptr) : kind(k), backend(be) {
    char tmpl[] = "/dev/shm/ckpt-fs-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    dir = tmpl;
    Open(budget);
  }
  ~Env() {
    table.reset();
    tier.reset();
    store.reset();
    std::filesystem::remove_all(dir);
  }
  // (Re)opens store, tier and table; the MemKv does not survive a reopen.
  void Open(uint64_t budget = 64ull << 20) {
    table.reset();
    tier.reset();
    store.reset();
    if (kind == KvKind::kMem) {
      store = std::make_unique<meta::MetaStore>(meta::NewMemKv());
    } else {
      auto kv = meta::OpenRocksKv(dir + "/meta");
      cr_assert(kv.has_value(), "open rocksdb");
      store = std::make_unique<meta::MetaStore>(std::move(*kv));
    }
    auto t = cache::Tier::Open(dir + "/tier", budget);
    cr_assert(t.has_value(), "open tier");
    tier = std::move(*t);
    table = std::make_unique<fs::InodeTable>(store.get(), tier.get(), backend);
    cr_assert(table->Load(fs::Caller{0, 0}).has_value(), "load");
  }

  // Creates a file with `data`, closes it (sealing it). Returns its ino.
  uint64_t WriteFile(uint64_t parent, const std::string& name, const std::string& data) {
    auto r = table->Mknod(parent, name, S_IFREG | 0644, 0, fs::Caller{0, 0});
    cr_assert(r.has_value(), "mknod %s: %d", name.c_str(), r ? 0 : r.error());
    Overwrite(r->ino, data);
    return r->ino;
  }
  void Overwrite(uint64_t ino, const std::string& data) {
    auto fd = table->Open(ino, O_RDWR | O_TRUNC);
    cr_assert(fd.has_value());
    auto n = table->Write(ino, 0, data.size(), [&](int f) { return pwrite(f, data.data(), data.size(), 0); });
    cr_assert(n.has_value() && *n == data.size());
    table->Release(ino, O_RDWR);
  }
  uint64_t Mkdir(uint64_t parent, const std::string& name) {
    auto r = table->Mkdir(parent, name, 0755, fs::Caller{0, 0});
    cr_assert(r.has_value(), "mkdir %s", name.c_str());
    return r->ino;
  }
};

}  // namespace ckpt::test
