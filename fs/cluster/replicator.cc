// replicator.cc — see replicator.h.
#include "fs/cluster/replicator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "common/failpoint.h"
#include "common/log.h"
#include "common/xxhash_fast.h"

namespace ckpt::fs::replica {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPeersPeriod = std::chrono::seconds(1);
constexpr auto kRetry = std::chrono::milliseconds(500);
constexpr auto kRetryMax = std::chrono::seconds(5);

}  // namespace

// ---- Peers ----

Peers::Peers(EtcdRecords* records, std::string node, std::string addr, uint64_t group)
    : records_(records),
      node_(std::move(node)),
      addr_(std::move(addr)),
      prefix_(records ? records->prefix() + "replicas/" : ""),
      group_(std::max<uint64_t>(group, 1)) {}

void Peers::SetMembersForTest(std::map<std::string, std::string> m, std::map<std::string, int64_t> revisions) {
  MutexLock l(&mu_);
  listed_.clear();
  for (auto& [node, addr] : m) listed_[node] = {std::move(addr), revisions.count(node) ? revisions[node] : 0};
  Derive();
}

void Peers::Derive() {
  std::map<std::string, int64_t> newest;  // addr -> the latest revision that lists it
  for (const auto& [node, at] : listed_) newest[at.first] = std::max(newest[at.first], at.second);
  members_.clear();
  std::set<std::string> shadowed;
  for (const auto& [node, at] : listed_) {
    if (at.second == newest[at.first]) {
      members_[node] = at.first;
    } else {
      shadowed.insert(node);
      if (!shadowed_.count(node))
        LOG_WARN("replicas: node {} lists {}, which a member listed since: it gets no replicas until it lists its own",
                 node, at.first);
    }
  }
  shadowed_ = std::move(shadowed);
}

Peers::~Peers() { Stop(); }

void Peers::Start() {
  if (thread_.joinable()) return;  // started early (RestoreFromPeers)
  thread_ = std::thread([this] { Loop(); });
}

void Peers::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  watch_.reset();
}

bool Peers::Advertise() {
  if (addr_.empty()) return true;
  auto lease = records_->Lease();
  if (!lease) return false;
  // Put again each period: cheap (one small put a second), and it heals a
  // key lost with a lease, deleted by hand or compacted away.
  return records_->client()->Put(prefix_ + node_, addr_, *lease).has_value();
}

bool Peers::known() const {
  MutexLock l(&mu_);
  return revision_ > 0;
}

bool Peers::Read() {
  auto r = records_->client()->Range(prefix_, etcd::PrefixEnd(prefix_));
  if (!r) return false;
  std::map<std::string, std::pair<std::string, int64_t>> m;
  for (const auto& kv : r->kvs) {
    std::string node = kv.key.substr(prefix_.size());
    if (ValidNodeId(node) && kv.lease != 0 && kv.value.size() < 256) m[node] = {kv.value, kv.create_revision};
  }
  {
    MutexLock l(&mu_);
    listed_ = std::move(m);
    Derive();
    revision_ = r->revision;
    reread_ = false;
  }
  watch_ = std::make_unique<etcd::Watch>(
      records_->client(), prefix_, etcd::PrefixEnd(prefix_), r->revision + 1,
      [this](const std::vector<etcd::WatchEvent>& evs, int64_t rev) {
        MutexLock l(&mu_);
        for (const auto& ev : evs) {
          std::string node = ev.kv.key.substr(std::min(prefix_.size(), ev.kv.key.size()));
          if (!ValidNodeId(node)) continue;
          if (ev.deleted) listed_.erase(node);
          else if (ev.kv.lease != 0 && ev.kv.value.size() < 256) listed_[node] = {ev.kv.value, ev.kv.create_revision};
        }
        Derive();
        revision_ = rev;
      },
      [](const std::string& e) { LOG_DEBUG("replicas: the members' watch: {}", e); },
      [this] {
        MutexLock l(&mu_);
        reread_ = true;
      });
  return true;
}

void Peers::Loop() {
  std::string last;
  for (;;) {
    bool reread;
    {
      MutexLock l(&mu_);
      if (stop_) return;
      reread = reread_;
    }
    std::string err;
    if (!Advertise()) err = "cannot advertise this node's replica link: " + records_->LastError();
    if (reread) {
      watch_.reset();
      if (!Read()) err = "cannot read the members' replica links: " + records_->client()->LastError();
    }
    if (err != last) {
      if (!err.empty()) LOG_WARN("replicas: {} (retried every second)", err);
      else if (!last.empty()) LOG_INFO("replicas: the members' replica links are readable again");
      last = err;
    }
    MutexLock l(&mu_);
    if (!stop_) cv_.WaitFor(&mu_, kPeersPeriod);
  }
}

namespace {
uint64_t Rendezvous(std::string_view path, const std::string& node) {
  std::string in(path);
  in += '\0';  // a path holds no NUL: (path, node) pairs never collide
  in += node;
  return XXH3_64bits(in.data(), in.size());
}
}  // namespace

std::pair<std::string, std::string> Peers::Home(std::string_view path) const {
  MutexLock l(&mu_);
  std::pair<std::string, std::string> best;
  uint64_t top = 0;
  for (const auto& [node, addr] : members_) {
    const uint64_t h = Rendezvous(path, node);
    if (best.first.empty() || h > top) {
      top = h;
      best = {node, addr};
    }
  }
  return best;
}

std::string Peers::GroupOf(std::string_view node, uint64_t group) {
  size_t i = node.size();
  while (i > 0 && node[i - 1] >= '0' && node[i - 1] <= '9') i--;
  size_t digits = i;
  while (digits < node.size() && node[digits] == '0') digits++;  // n07 is n7
  if (i == node.size() || node.size() - digits > 18) return std::string(node);
  uint64_t n = 0;
  for (size_t j = digits; j < node.size(); j++) n = n * 10 + static_cast<uint64_t>(node[j] - '0');
  return std::string(node.substr(0, i)) + "#" + std::to_string(n / std::max<uint64_t>(group, 1));
}

bool Peers::SameGroup(std::string_view a, std::string_view b) const { return GroupOf(a, group_) == GroupOf(b, group_); }

std::vector<std::pair<std::string, std::string>> Peers::Ranked(std::string_view path) const {
  std::vector<std::tuple<uint64_t, std::string, std::string>> s;
  {
    MutexLock l(&mu_);
    for (const auto& [node, addr] : members_) {
      if (node == node_) continue;
      s.emplace_back(Rendezvous(path, node), node, addr);
    }
  }
  std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  // The best of each group the file is not in yet, then the rest, each in
  // rendezvous order: K copies land in K groups other than the writer's
  // while there are K such groups with a live member.
  std::set<std::string> used{GroupOf(node_, group_)};
  std::vector<std::pair<std::string, std::string>> out, rest;
  for (auto& [h, node, addr] : s)
    (used.insert(GroupOf(node, group_)).second ? out : rest).emplace_back(std::move(node), std::move(addr));
  std::move(rest.begin(), rest.end(), std::back_inserter(out));
  return out;
}

size_t Peers::count() const {
  MutexLock l(&mu_);
  return members_.size() - (members_.count(node_) ? 1 : 0);
}

std::string Peers::addr_of(const std::string& node) const {
  MutexLock l(&mu_);
  auto it = members_.find(node);
  return it == members_.end() ? "" : it->second;
}

// ---- Replicator ----

Replicator::Replicator(std::string node, int k, Link* link, Peers* peers, Ports ports)
    : node_(std::move(node)), k_(k), link_(link), peers_(peers), ports_(std::move(ports)) {
  stats_.replicas = k;
}

Replicator::~Replicator() { Stop(); }

void Replicator::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Replicator::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void Replicator::Observe(const std::vector<meta::LogEntry>& entries) {
  bool any = false;
  {
    MutexLock l(&mu_);
    for (const auto& e : entries) {
      // A file's version, or a namespace entry (mkdir, rename, unlink...):
      // those go as small replicas of their own, key (0, seq), so that a
      // holder applies them in the dead writer's place, in its order — a
      // checkpoint written as step.tmp/ and renamed to step/ after its
      // files closed lands as step/, not step.tmp/.
      Item it{e, Clock::now(), 0};
      if (e.op != meta::LogOp::kPersist) {
        it.e.ino = kEntryIno;
        it.e.version = e.seq;
      }
      pending_.insert({it.e.ino, it.e.version});
      observed_ = std::max(observed_, e.seq);
      queue_.push_back(std::move(it));
      stats_.queued++;
      any = true;
    }
  }
  if (any) cv_.NotifyAll();
}

bool Replicator::Sending() const {
  MutexLock l(&mu_);
  if (sending_ != 0) return true;
  for (const Item& it : queue_)
    if (it.tries == 0) return true;
  return false;
}

bool Replicator::Replicated(uint64_t ino, uint64_t version) const {
  MutexLock l(&mu_);
  auto it = held_.find({ino, version});
  return it != held_.end() && static_cast<int>(it->second.size()) >= k_;
}

uint64_t Replicator::UnsafeFrom() const {
  MutexLock l(&mu_);
  uint64_t from = observed_ + 1;
  if (sending_ > 0) from = std::min(from, sending_);
  for (const Item& it : queue_) from = std::min(from, it.e.seq);
  return from;
}

Replicator::Stats Replicator::stats() const {
  MutexLock l(&mu_);
  Stats s = stats_;
  s.queued = queue_.size();
  return s;
}

void Replicator::Fail(const std::string& why) {
  MutexLock l(&mu_);
  stats_.failures++;
  if (why != stats_.last_error) LOG_WARN("replicas: {}", why);
  stats_.last_error = why;
}

void Replicator::Applied(const Version& v) {
  {
    MutexLock l(&mu_);
    // Queued or being sent: its sending ends at its next step, and what
    // it reached by then is dropped.
    if (pending_.count(v)) applied_.insert(v);
    auto it = held_.find(v);
    if (it == held_.end()) return;
    for (const auto& addr : it->second) drops_.emplace_back(addr, Key{node_, v.first, v.second});
    held_.erase(it);
    entries_.erase(v);
  }
  cv_.NotifyAll();
}

void Replicator::Answered(const Version& v, uint64_t seq, int err) {
  // EIO says an entry up to `seq` did not reach the backend. Once the
  // applied seq passed `seq`, that is the drain's last word: the entry
  // completed (failed, skipped, or lost) and the replicas go. A lost one
  // (RecordLost: its bytes gone from this node's tier) goes too: nothing
  // reads a replica of an entry its writer's log completed (a restart asks
  // its holders only for entries still pending: RestoreFromPeers; the
  // holders drop it themselves once this node's record shows it applied:
  // Takeover's ShowsApplied), so kept it would only hold their room.
  // Before that, the drain holds at a refusal up to `seq` or the log shut
  // down: nothing of the entry is in the backend, and its replicas are what
  // a node lost now leaves of it. Kept, and watched again (Run).
  if (err != 0) {
    const uint64_t applied = ports_.applied_seq ? ports_.applied_seq() : 0;
    if (applied < seq) {
      MutexLock l(&mu_);
      rewatch_[v] = {seq, applied};
      return;
    }
  }
  Applied(v);
}

void Replicator::ForgetGoneHolders() {
  std::set<std::string> live;
  for (const auto& [node, addr] : peers_->Ranked("")) live.insert(addr);
  MutexLock l(&mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    const size_t before = it->second.size();
    std::erase_if(it->second, [&](const std::string& a) { return !live.count(a); });
    if (it->second.size() < before) {
      LOG_WARN("replicas: a holder of ino {} version {} left the cluster; sending it to another member",
               it->first.first, it->first.second);
      if (auto e = entries_.find(it->first); e != entries_.end()) {
        queue_.push_front(Item{e->second, Clock::now(), 1});
        pending_.insert(it->first);
        uint64_t& n = it->first.first == kEntryIno ? stats_.replicated_entries : stats_.replicated_files;
        if (static_cast<int>(before) >= k_) n -= std::min<uint64_t>(n, 1);
      }
    }
    ++it;
  }
}

namespace {
// A namespace entry's bytes, for the link: its encoding in an anonymous
// memory file (the link sends from a descriptor).
Result<Replicator::Source> EntrySource(const meta::LogEntry& e) {
  const std::string bytes = meta::EncodeLogEntry(e);
  int fd = memfd_create("ckptfs-entry", MFD_CLOEXEC);
  if (fd < 0) return ErrFromErrno();
  auto keep = std::shared_ptr<const void>(nullptr, [fd](const void*) { close(fd); });
  if (pwrite(fd, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) return Err(EIO);
  return Replicator::Source{keep, fd, bytes.size()};
}
}  // namespace

bool Replicator::Send(const Item& it) {
  const Version v{it.e.ino, it.e.version};
  const bool entry = it.e.ino == kEntryIno;  // a namespace entry (Observe)
  auto src = entry ? EntrySource(it.e) : ports_.source(it.e);
  if (!src) {
    const int e = src.error();
    if (e == ESTALE || e == ENODATA || e == ENOENT) return true;  // superseded or gone: nothing to keep
    if (e != EINPROGRESS) Fail("ino " + std::to_string(it.e.ino) + " (" + it.e.path + "): " + ErrStr(e));
    return false;
  }
  const auto t1 = Clock::now();
  // The content checksum the holder checks: computed by the link as the
  // first holder's chunks go (it was a pass of its own before any byte
  // moved: 0.4 s a GiB here), then given to the next holders.
  uint64_t sum_hi = 0, sum_lo = 0;
  const Key key{node_, it.e.ino, it.e.version};
  const int64_t gate = ports_.gate_us ? ports_.gate_us(it.e.seq) : 0;
  // Without its time a replica would be ordered first at a takeover: not
  // now (applied meanwhile, it is skipped: Run).
  if (ports_.gate_us && gate <= 0) return false;
  auto ranked = peers_->Ranked(it.e.path);
  if (ranked.empty()) {
    Fail("no other member has a replica link (--replica-listen): " + it.e.path + " stays in this node's RAM only");
    return false;
  }
  const std::string meta = EncodeMeta(FileMeta{.seq = it.e.seq,
                                               .incarnation = ports_.incarnation,
                                               .path = it.e.path,
                                               .mode = it.e.mode & 07777,
                                               .uid = it.e.uid,
                                               .gid = it.e.gid,
                                               .has_owner = it.e.has_owner,
                                               .mtime_sec = it.e.mtime.sec,
                                               .mtime_nsec = it.e.mtime.nsec});
  bool waited = false, told_sum = false;
  for (const auto& [node, addr] : ranked) {
    {
      MutexLock l(&mu_);
      if (stop_ || applied_.count(v)) break;
      if (static_cast<int>(held_[v].size()) >= k_) break;
      if (std::find(held_[v].begin(), held_[v].end(), addr) != held_[v].end()) continue;
    }
    // Once every chunk of a transfer that computes the checksum (the first
    // holder's) went, before its END: the source is asked whether it still
    // holds the version (a writer that began to change a live tier file
    // copied the version aside: what went may be torn; the holders after
    // the first check the bytes against this checksum), and the checksum
    // is kept, so before the holder can hold the copy: a process killed
    // right after HELD has it (FAILPOINT below). Either not so, no END
    // goes, and the version waits for its next try (from its copy; not the
    // next member: neither is the holder's doing). Told once a version: a
    // holder after a refusing one hashes again, the same sum.
    bool changed = false, not_kept = false;
    std::function<bool(uint64_t, uint64_t)> summed;
    if (!entry)
      summed = [&](uint64_t hi, uint64_t lo) {
        if (src->unchanged && !src->unchanged()) return !(changed = true);
        if (told_sum || !ports_.sent) return true;
        told_sum = ports_.sent(it.e.ino, it.e.version, hi, lo);
        not_kept = !told_sum;  // logged by the port
        return told_sum;
      };
    auto st = link_->Replicate(addr, key, src->fd, src->size, static_cast<uint64_t>(std::max<int64_t>(gate, 0)),
                               &sum_hi, &sum_lo, meta, summed);
    if (changed) {
      LOG_DEBUG("replicas: ino {} version {} ({}) copied aside while it was sent; sent again", v.first, v.second,
                it.e.path);
      return false;
    }
    if (not_kept) return false;
    if (st) {
      if (!entry) FAILPOINT("replica.held");
      const bool same = peers_->SameGroup(node, node_);
      MutexLock l(&mu_);
      held_[v].push_back(addr);
      entries_[v] = it.e;
      if (same) {
        stats_.same_group++;
        LOG_WARN("replicas: {} is held by {} in this node's own failure group (no member of another group took it)",
                 it.e.path, node);
      }
      if (static_cast<int>(held_[v].size()) == k_ && entry) {
        stats_.replicated_entries++;
      } else if (static_cast<int>(held_[v].size()) == k_) {
        stats_.replicated_files++;
        stats_.replicated_bytes += src->size;
        LOG_DEBUG("replicas: ino {} version {} ({}, {} bytes) replicated {} time(s) in {:.3f} s (checksum included)",
                  v.first, v.second, it.e.path, src->size, k_,
                  std::chrono::duration<double>(Clock::now() - t1).count());
      }
    } else if (st.error() == EAGAIN) {
      waited = true;
    } else {
      Fail("node " + node + " (" + addr + ") did not take " + it.e.path + ": " + ErrStr(st.error()));
    }
  }
  MutexLock l(&mu_);
  if (applied_.count(v)) {  // persisted meanwhile: what was sent goes
    if (auto h = held_.find(v); h != held_.end()) {
      for (const auto& addr : h->second) drops_.emplace_back(addr, key);
      held_.erase(h);
    }
    entries_.erase(v);
    return true;
  }
  if (static_cast<int>(held_[v].size()) >= k_) return true;
  if (waited) stats_.waits++;
  return false;
}

std::deque<Replicator::Item>::iterator Replicator::Next(bool hold, std::vector<meta::LogEntry>* to_size) {
  const auto now = Clock::now();
  for (auto it = queue_.begin(); it != queue_.end() && it->not_before <= now; ++it) {
    if (!hold || it->e.ino == kEntryIno || it->size <= kSmallFile) return it;
    if (it->size == kUnsized && to_size->size() < 8) to_size->push_back(it->e);
  }
  return queue_.end();
}

void Replicator::Run() {
  // A callback the drain may call after this replicator is gone: it finds
  // the gate closed.
  struct Gate {
    Mutex mu;
    Replicator* r GUARDED_BY(mu);
  };
  auto gate = std::make_shared<Gate>();
  {
    MutexLock l(&gate->mu);
    gate->r = this;
  }
  auto watch = [&](const Version& v, uint64_t seq) {
    ports_.when_applied(seq, [gate, v, seq](int err) {
      MutexLock l(&gate->mu);
      if (gate->r) gate->r->Answered(v, seq, err);
    });
  };
  auto checked = Clock::now();
  uint64_t told = 0;  // observed_ when ports_.observed was last called
  for (;;) {
    if (Clock::now() - checked > std::chrono::seconds(1)) {
      ForgetGoneHolders();
      checked = Clock::now();
    }
    // A watch that heard EIO for a hold is set again once the applied seq
    // moved (the held entry completed): one check a round, no wake-up of
    // its own (a drop a second late costs nothing).
    std::vector<std::pair<Version, uint64_t>> rearm;
    if (ports_.applied_seq) {
      const uint64_t applied = ports_.applied_seq();
      MutexLock l(&mu_);
      for (auto it = rewatch_.begin(); it != rewatch_.end();) {
        if (it->second.second == applied) {
          ++it;
          continue;
        }
        rearm.emplace_back(it->first, it->second.first);
        it = rewatch_.erase(it);
      }
    }
    for (const auto& [v, seq] : rearm) watch(v, seq);
    std::vector<std::pair<std::string, Key>> drops;
    std::optional<Item> item;
    std::vector<meta::LogEntry> to_size;
    bool observed = false;
    {
      MutexLock l(&mu_);
      observed = observed_ != told;
      told = observed_;
    }
    if (observed && ports_.observed) ports_.observed();
    {
      MutexLock l(&mu_);
      auto next = Next(ports_.hold && ports_.hold(), &to_size);
      if (!stop_ && drops_.empty() && next == queue_.end() && to_size.empty()) {
        // One wait, then round again: the holders' check runs every second.
        auto until = Clock::now() + std::chrono::milliseconds(queue_.empty() ? 1000 : 10);
        if (!queue_.empty()) until = std::max(until, std::min(queue_.front().not_before, Clock::now() + kPeersPeriod));
        cv_.WaitUntil(&mu_, until);
        continue;
      }
      if (stop_) break;
      drops.swap(drops_);
      if (next != queue_.end()) {
        item = std::move(*next);
        queue_.erase(next);
        const Version v{item->e.ino, item->e.version};
        if (applied_.erase(v)) {  // persisted before its turn
          pending_.erase(v);
          item.reset();
        }
      }
      sending_ = item ? item->e.seq : 0;
    }
    for (const meta::LogEntry& e : to_size) {  // what a save holds back: small enough to go anyway?
      auto src = ports_.source(e);
      // Superseded or gone: Send skips it at once; not now: after the save.
      const uint64_t n = src ? src->size : src.error() == EINPROGRESS ? kSmallFile + 1 : 0;
      MutexLock l(&mu_);
      for (Item& it : queue_)
        if (it.e.ino == e.ino && it.e.version == e.version) it.size = n;
    }
    // Each DROP was queued once its entry was applied (Applied): read now,
    // the applied seq covers all of them. A machine crash would roll back a
    // completion not synced yet, and the entry, pending again, would need
    // its replicas: so they go once the metadata is durable up to here (one
    // sync for the round's drops, none when the record's covered them). If
    // it cannot be made so, they are not sent: the holders drop them once
    // this node's record shows them applied (Takeover's ShowsApplied),
    // which it does only once durable, as for a DROP lost on the way.
    if (!drops.empty() && ports_.durable_applied) {
      const uint64_t applied = ports_.applied_seq ? ports_.applied_seq() : 0;
      if (const uint64_t durable = ports_.durable_applied(); durable < applied) {
        LOG_DEBUG("replicas: {} drop(s) not sent: the metadata is durable up to entry {} only, {} applied",
                  drops.size(), durable, applied);
        drops.clear();
      }
    }
    for (const auto& [addr, key] : drops) {
      auto st = link_->Drop(addr, key);
      if (!st && st.error() != ENOENT)
        LOG_DEBUG("replicas: {} did not drop {}: {}", addr, key.Name(), ErrStr(st.error()));
      if (ports_.dropped && key.ino != kEntryIno) ports_.dropped(key.ino, key.version);
      MutexLock l(&mu_);
      stats_.dropped++;
    }
    if (!item) continue;
    if (item->tries == 0 && ports_.when_applied) watch({item->e.ino, item->e.version}, item->e.seq);
    if (Send(*item)) {
      MutexLock l(&mu_);
      sending_ = 0;
      pending_.erase({item->e.ino, item->e.version});
      applied_.erase({item->e.ino, item->e.version});
    } else {
      item->tries++;
      auto backoff = std::min<Clock::duration>(kRetry * item->tries, kRetryMax);
      item->not_before = Clock::now() + backoff;
      MutexLock l(&mu_);
      queue_.push_back(std::move(*item));
      sending_ = 0;
      std::stable_sort(queue_.begin(), queue_.end(),
                       [](const Item& a, const Item& b) { return a.not_before < b.not_before; });
    }
  }
  MutexLock l(&gate->mu);
  gate->r = nullptr;
}

}  // namespace ckpt::fs::replica
