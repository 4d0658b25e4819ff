// etcd_names.cc — the names the nodes change, in etcd (etcd_names.h).
#include "fs/cluster/etcd_names.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/log.h"
#include "fs/core/oplog.h"

namespace ckpt::fs {

using Json = nlohmann::json;
using meta::LogOp;

namespace {
constexpr size_t kTxnOps = 128;  // etcd's --max-txn-ops default
constexpr int64_t kSweepMs = 25;
// A reply waits about this long at most for etcd (the store's
// requests take milliseconds; one that takes longer is not worth a stalled
// mkdir: the change reaches the others through the backend instead).
constexpr int64_t kAnnounceTimeoutMs = 1000;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The entry as a key's value: t = d (directory), f (file), l (symlink),
// ? (renamed, type unknown to an older log); a node's miss takes a
// directory from it and asks the backend for anything else.
std::string Value(char type, const meta::LogEntry& e, const std::string& node, const std::string& target = "") {
  Json j = {{"t", std::string(1, type)}, {"mode", e.mode & 07777},   {"uid", e.uid}, {"gid", e.gid},
            {"mtime_s", e.mtime.sec},    {"mtime_ns", e.mtime.nsec}, {"node", node}};
  if (!target.empty()) j["target"] = target;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

char TypeOf(uint32_t mode) {
  if (mode == 0) return '?';
  return S_ISDIR(mode) ? 'd' : S_ISLNK(mode) ? 'l' : 'f';
}
}  // namespace

EtcdNames::EtcdNames(EtcdRecords* records, OpLog* log, std::string node, int64_t hold_ms)
    : records_(records), log_(log), node_(std::move(node)), hold_ms_(hold_ms) {}

EtcdNames::~EtcdNames() { Stop(); }

std::string EtcdNames::Key(const std::string& path) const { return records_->prefix() + "ns/" + path; }

int64_t EtcdNames::ReplyBudgetMs() const {
  // Shared by the endpoints the client may try in turn.
  return std::max<int64_t>(200, kAnnounceTimeoutMs / static_cast<int64_t>(records_->client()->endpoint_count()));
}

void EtcdNames::Observe(const std::vector<meta::LogEntry>& entries) {
  MutexLock lk(&mu_);
  for (const meta::LogEntry& e : entries) {
    switch (e.op) {
      case LogOp::kMkdir:
      case LogOp::kSymlink:
      case LogOp::kLink:
      case LogOp::kRename:
      case LogOp::kUnlink:
      case LogOp::kRmdir: outbox_.push_back({e.seq, e}); break;
      case LogOp::kPersist: files_.push_back({e.seq, e}); break;
      default: break;
    }
  }
}

void EtcdNames::Write(const std::vector<Change>& changes, int64_t timeout_ms) {
  auto lease = records_->Lease();
  if (!lease) {
    MutexLock lk(&mu_);
    stats_.failures++;
    return;
  }
  std::vector<etcd::Client::Op> ops;
  std::vector<Held> held;
  std::vector<size_t> op_of_held;  // held[j]'s put is ops[op_of_held[j]]
  auto put = [&](uint64_t seq, const std::string& path, std::string value) {
    op_of_held.push_back(ops.size());
    ops.push_back({false, Key(path), "", std::move(value), *lease});
    held.push_back({seq, Key(path), 0});
  };
  // A removed name: a tombstone (held as a put is), so that a node that
  // misses it does not take it from a backend this node's drain has not
  // reached yet; the names below a directory are deleted.
  auto del = [&](uint64_t seq, const meta::LogEntry& e, const std::string& path, bool below) {
    put(seq, path, Value('x', e, node_));
    if (below) ops.push_back({true, Key(path + "/"), etcd::PrefixEnd(Key(path + "/")), "", 0});
  };
  for (const Change& c : changes) {
    const meta::LogEntry& e = c.e;
    switch (e.op) {
      case LogOp::kMkdir: put(c.seq, e.path, Value('d', e, node_)); break;
      case LogOp::kSymlink: put(c.seq, e.path, Value('l', e, node_, e.path2)); break;
      case LogOp::kLink: put(c.seq, e.path2, Value('f', e, node_)); break;
      case LogOp::kRename:
        if (e.flags & 1) {  // exchange: both names stay, each with the other's entry
          put(c.seq, e.path, Value('?', e, node_));
          put(c.seq, e.path2, Value(TypeOf(e.mode), e, node_));
        } else {
          del(c.seq, e, e.path, S_ISDIR(e.mode) || e.mode == 0);
          put(c.seq, e.path2, Value(TypeOf(e.mode), e, node_));
        }
        break;
      case LogOp::kUnlink: del(c.seq, e, e.path, false); break;
      case LogOp::kRmdir: del(c.seq, e, e.path, true); break;
      case LogOp::kPersist: put(c.seq, e.path, Value('f', e, node_)); break;
      default: break;
    }
  }
  size_t failed = 0;
  std::vector<int64_t> rev(ops.size(), 0);  // the revision each op was written at
  for (size_t i = 0; i < ops.size(); i += kTxnOps) {
    const size_t end = std::min(ops.size(), i + kTxnOps);
    std::vector<etcd::Client::Op> part(ops.begin() + static_cast<ssize_t>(i), ops.begin() + static_cast<ssize_t>(end));
    if (auto r = records_->client()->Txn(part, timeout_ms)) {
      std::fill(rev.begin() + static_cast<ssize_t>(i), rev.begin() + static_cast<ssize_t>(end), *r);
      continue;
    }
    // etcd refuses a transaction that names a key twice (a name made and
    // removed in one batch, a put under a directory removed with it): the
    // same operations one by one, in order.
    if (records_->client()->LastError().find("duplicate key") == std::string::npos) {
      failed++;
      continue;
    }
    for (size_t k = i; k < end; k++) {
      auto r = records_->client()->Txn({ops[k]}, timeout_ms);
      if (!r) {
        failed++;
        break;
      }
      rev[k] = *r;
    }
  }
  for (size_t j = 0; j < held.size(); j++) held[j].rev = rev[op_of_held[j]];
  MutexLock lk(&mu_);
  stats_.puts += held.size();
  stats_.deletes += ops.size() - held.size();
  if (failed) {
    // The change stands here; the others see it within --shared-ttl once
    // it reaches the backend, as without a store.
    stats_.failures++;
    LOG_WARN(
        "cluster: etcd: the names of {} namespace changes not written ({}); other nodes see them within "
        "--shared-ttl of their drain",
        changes.size(), records_->client()->LastError());
    return;
  }
  for (Held& h : held) held_.push_back(std::move(h));
}

void EtcdNames::Announce() {
  MutexLock one(&announce_mu_);
  std::vector<Change> changes;
  {
    MutexLock lk(&mu_);
    changes.assign(outbox_.begin(), outbox_.end());
    outbox_.clear();
  }
  if (changes.empty()) return;
  if (!records_->client()->reachable()) {
    // etcd did not answer the last request (the keep-alive finds when it
    // is back): the reply goes out now, the others see the change within
    // --shared-ttl of its drain, as when a write below fails.
    MutexLock lk(&mu_);
    stats_.failures++;
    if (!skipping_)
      LOG_WARN("cluster: etcd unreachable: namespace changes not written there until it answers ({})",
               records_->client()->LastError());
    skipping_ = true;
    return;
  }
  {
    MutexLock lk(&mu_);
    if (skipping_) LOG_INFO("cluster: etcd answers: namespace changes written there again");
    skipping_ = false;
  }
  Write(changes, ReplyBudgetMs());
}

void EtcdNames::Sweep() {
  // AppliedSeq, not the durable seq the record tells the others (LogView::
  // DurableAppliedSeq): these keys say what the backend holds, which a
  // machine crash that rolls this node's metadata back does not undo; no
  // node reads this node's log position from them.
  const uint64_t applied = log_->AppliedSeq();
  const int64_t now = SteadyMs();
  std::vector<Change> files;
  std::vector<etcd::Client::Op> expired;
  {
    MutexLock lk(&mu_);
    // Files the drain persisted: their names now, so that another node's
    // open or miss asks the backend at once.
    while (!files_.empty() && files_.front().seq <= applied) {
      files.push_back(std::move(files_.front()));
      files_.pop_front();
    }
    for (Held& h : held_)
      if (h.applied_ms == 0 && h.seq <= applied) h.applied_ms = now;
    std::vector<Held> keys;
    while (!held_.empty() && held_.front().applied_ms != 0 && now - held_.front().applied_ms >= hold_ms_ &&
           keys.size() < kTxnOps) {
      keys.push_back(std::move(held_.front()));
      held_.pop_front();
    }
    // A key this node wrote again since (the name made again, removed
    // again) stays until that later entry expires: deleting it now would
    // drop a name the backend may not hold yet. A key another node put
    // since stays too: each delete compares the key's mod_revision with
    // this node's put (a nested transaction each), so it deletes nothing
    // once the key is someone else's. Each key once (etcd refuses a
    // transaction that names one twice).
    if (!keys.empty()) {
      std::unordered_set<std::string> later, seen;
      for (const Held& h : held_) later.insert(h.key);
      for (Held& h : keys)
        if (!later.count(h.key) && seen.insert(h.key).second)
          expired.push_back({.del = true, .key = std::move(h.key), .if_mod_revision = h.rev});
    }
  }
  if (!files.empty()) {
    // Under announce_mu_, which a FUSE reply's Announce waits for: within
    // the reply budget, and not at all while etcd does not answer (the
    // others see these names within --shared-ttl of the drain). With the
    // client's own timeout (5 s an endpoint) a frozen etcd held every
    // mkdir and rename that long.
    if (!records_->client()->reachable()) {
      MutexLock lk(&mu_);
      stats_.failures++;
    } else {
      MutexLock one(&announce_mu_);
      Write(files, ReplyBudgetMs());
    }
  }
  if (!expired.empty()) {
    if (!records_->client()->Txn(expired)) {
      MutexLock lk(&mu_);
      stats_.failures++;
      return;
    }
    MutexLock lk(&mu_);
    stats_.deletes += expired.size();
  }
}

void EtcdNames::Start() {
  sweeper_ = std::thread([this] {
    for (;;) {
      {
        MutexLock lk(&mu_);
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSweepMs);
        while (!stop_ && cv_.WaitUntil(&mu_, until)) {
        }
        if (stop_) return;
      }
      Sweep();
    }
  });
}

void EtcdNames::Stop() {
  {
    MutexLock lk(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (sweeper_.joinable()) sweeper_.join();
}

Result<std::optional<NameStore::Name>> EtcdNames::Get(const std::string& path) {
  {
    MutexLock lk(&mu_);
    stats_.gets++;
  }
  // A lookup waits for the store no longer than a namespace change does,
  // and not at all while it is unreachable: the backend decides then.
  if (!records_->client()->reachable()) return Err(ECONNREFUSED);
  auto r = records_->client()->Range(Key(path), "", 0, ReplyBudgetMs());
  if (!r) return Err(r.error());
  if (r->kvs.empty()) return std::optional<Name>();
  const etcd::KeyValue& kv = r->kvs[0];
  // A key without a lease was not written by a member (a member's names
  // live with its lease): stale or forged, ignored.
  if (kv.lease == 0) return std::optional<Name>();
  Name n;
  n.revision = kv.mod_revision;
  try {
    Json j = Json::parse(kv.value);
    const std::string t = j.at("t").get<std::string>();
    n.entry.type = t == "d"   ? backend::Entry::Type::kDir
                   : t == "l" ? backend::Entry::Type::kSymlink
                              : backend::Entry::Type::kFile;
    n.entry.path = path;
    n.entry.mode = j.at("mode").get<uint32_t>() & 07777;
    n.entry.mtime_sec = j.at("mtime_s").get<int64_t>();
    n.entry.mtime_nsec = j.at("mtime_ns").get<uint32_t>();
    if (n.entry.mtime_nsec >= 1000000000u) throw std::runtime_error("mtime_ns out of range");
    n.entry.target = j.value("target", std::string());
    n.gone = t == "x";
    if (t == "?") n.entry.type = backend::Entry::Type::kFile;  // asked of the backend
  } catch (const std::exception& e) {
    LOG_DEBUG("cluster: etcd name '{}' is not readable ({}); ignored", path, e.what());
    return std::optional<Name>();
  }
  return std::optional<Name>(std::move(n));
}

EtcdNames::Stats EtcdNames::stats() {
  MutexLock lk(&mu_);
  return stats_;
}

}  // namespace ckpt::fs
