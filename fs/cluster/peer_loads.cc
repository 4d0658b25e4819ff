// peer_loads.cc — see peer_loads.h.
#include "fs/cluster/peer_loads.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "backend/checksum.h"
#include "common/config.h"
#include "common/io.h"
#include "common/log.h"
#include "fs/cluster/replicator.h"

namespace ckpt::fs::replica {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kKeepOpen = std::chrono::seconds(5);  // a served file's descriptor, idle
constexpr size_t kMaxOpen = 16;
constexpr auto kSpreadIdle = std::chrono::seconds(60);   // a file's tree, unasked
constexpr size_t kMaxSpreads = 1024;

// A serving thread fetches only for an asker the home sent here
// (kFetchRelay), and then asks the home directly (Load): one member between
// an asker and the home at most, whatever their views of the members.
thread_local bool serving = false;

}  // namespace

PeerLoads::PeerLoads(std::string node, Store* store, LocalCopy local, uint64_t fanout)
    : node_(std::move(node)), store_(store), local_(std::move(local)), fanout_(fanout) {}

PeerLoads::~PeerLoads() {
  MutexLock l(&mu_);
  for (auto& [k, o] : open_) close(o.fd);
}

void PeerLoads::Attach(Link* link, Peers* peers) {
  MutexLock l(&mu_);
  while (!link && loading_ > 0) loaded_.Wait(&mu_);
  link_ = link;
  peers_ = peers;
}

PeerLoads::Stats PeerLoads::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

Status PeerLoads::Load(const Content& c, int fd) {
  Link* link;
  std::pair<std::string, std::string> home;
  {
    MutexLock l(&mu_);
    if (link_ && peers_) home = peers_->Home(c.path);
    if (home.first.empty() || home.first == node_) {
      stats_.to_backend++;
      return Err(ENOENT);
    }
    link = link_;
    loading_++;
  }
  const auto t0 = Clock::now();
  // A serving thread loads for an asker it was sent (kFetchRelay): from the
  // home itself, never sent on (no chains past one member, no cycles).
  std::string from = home.first, elsewhere;
  Status st = FetchFrom(link, home.second, c, fd, serving ? Link::Ask::kDirect : Link::Ask::kHome, &elsewhere);
  bool relayed = false;
  if (!st && st.error() == EREMOTE) {
    std::string addr;
    {
      MutexLock l(&mu_);
      if (peers_ && elsewhere != node_) addr = peers_->addr_of(elsewhere);
    }
    st = addr.empty() ? Status(Err(ENOENT)) : FetchFrom(link, addr, c, fd, Link::Ask::kRelay, nullptr);
    if (st) {
      relayed = true;
      from = elsewhere;
    } else {  // the member named failed: the home itself, once, into an emptied file
      if (st.error() != ENOENT)
        LOG_WARN("loads: {} from node {} (sent there by node {}): {}; asking node {} itself", EscapeName(c.path),
                 elsewhere, home.first,
                 st.error() == EBADMSG ? "its bytes do not match the file's checksum" : ErrStr(st.error()), home.first);
      int e = EmptyFile(fd, c.size);
      st = e != 0 ? Status(Err(e)) : FetchFrom(link, home.second, c, fd, Link::Ask::kDirect, nullptr);
    }
  }
  MutexLock l(&mu_);
  if (--loading_ == 0) loaded_.NotifyAll();
  if (st) {
    stats_.from_peers++;
    stats_.from_peers_bytes += c.size;
    if (relayed) stats_.from_relays++;
    LOG_DEBUG("loads: {} ({} bytes) from node {} in {:.3f} s", EscapeName(c.path), c.size, from,
              std::chrono::duration<double>(Clock::now() - t0).count());
    return {};
  }
  stats_.to_backend++;
  if (st.error() == ENOENT) {
    stats_.misses++;
    return st;
  }
  stats_.failures++;
  stats_.last_error = "loading " + EscapeName(c.path) + " from node " + from + ": " +
                      (st.error() == EBADMSG ? "its bytes do not match the file's checksum" : ErrStr(st.error()));
  LOG_WARN("loads: {}; reading the backend instead", stats_.last_error);
  return st;
}

Status PeerLoads::FetchFrom(Link* link, const std::string& addr, const Content& c, int fd, Link::Ask ask,
                            std::string* elsewhere) {
  backend::ContentHash hash;
  if (!hash.ok()) return Err(ENOMEM);
  // The member may first fetch the file (from the backend, or from its own
  // home for an asker it was sent): its first answer may take that long
  // (at 50 MB/s, at least the link's own timeout).
  const int64_t first_ms = std::max<int64_t>(30000, static_cast<int64_t>(c.size / 50000));
  // Each piece is hashed, then written where it goes, zero blocks left as
  // the holes they are in a file just sized (as the backend's fetch does).
  Status st = c.size == 0 ? Status{}
                          : link->FetchAll(
                                addr, c, first_ms,
                                [&](uint64_t off, const char* p, size_t n) -> Status {
                                  hash.Update(off, p, n);
                                  if (int e = WriteNonZero(fd, p, n, off); e != 0) return Err(e);
                                  return {};
                                },
                                ask, elsewhere);
  if (st) {
    auto [hi, lo] = hash.Finish(c.size);
    if (hi != c.hi || lo != c.lo) st = Err(EBADMSG);
  }
  return st;
}

std::string PeerLoads::Spread::Route(const std::string& asker, const std::function<bool(const std::string&)>& member,
                                     bool* first) {
  if (first) *first = false;
  for (const Asker& a : askers_)
    if (a.node == asker) return a.sent_to.empty() || !member(a.sent_to) ? std::string() : a.sent_to;
  std::string to;
  if (fanout_ > 0 && here_ >= fanout_ && askers_.size() < kMaxAskers) {
    for (Asker& a : askers_)
      if (a.children < fanout_ && member(a.node)) {
        a.children++;
        to = a.node;
        break;
      }
  }
  if (to.empty()) here_++;
  if (askers_.size() < kMaxAskers) askers_.push_back(Asker{asker, to, 0});
  if (first) *first = true;
  return to;
}

std::string PeerLoads::Route(const Content& c, const std::string& asker) {
  MutexLock l(&mu_);
  if (fanout_ == 0 || !peers_) return {};
  const auto now = Clock::now();
  for (auto it = spreads_.begin(); it != spreads_.end();)
    it = now - it->second.used > kSpreadIdle ? spreads_.erase(it) : std::next(it);
  auto it = spreads_.find({c.hi, c.lo});
  if (it == spreads_.end()) {
    if (spreads_.size() >= kMaxSpreads) return {};
    it = spreads_.emplace(std::pair{c.hi, c.lo}, Spread(fanout_)).first;
  }
  it->second.used = now;
  Peers* peers = peers_;
  bool first = false;
  std::string to = it->second.Route(
      asker, [&](const std::string& n) { return n != node_ && n != asker && !peers->addr_of(n).empty(); }, &first);
  if (!to.empty() && first) stats_.sent_elsewhere++;
  return to;
}

int PeerLoads::Cached(const Content& c) {
  MutexLock l(&mu_);
  const auto now = Clock::now();
  for (auto it = open_.begin(); it != open_.end();) {
    if (now - it->second.used > kKeepOpen) {
      close(it->second.fd);
      it = open_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = open_.find({c.hi, c.lo});
  if (it == open_.end()) return -1;
  it->second.used = now;
  return fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
}

void PeerLoads::Remember(const Content& c, int fd, uint64_t Stats::*served) {
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  MutexLock l(&mu_);
  if (open_.count({c.hi, c.lo})) {  // another serving thread found it first: counted there
    if (mine >= 0) close(mine);
    return;
  }
  stats_.*served += 1;
  if (mine >= 0 && open_.size() < kMaxOpen) open_[{c.hi, c.lo}] = Open{mine, Clock::now()};
  else if (mine >= 0) close(mine);
}

Result<Link::Served> PeerLoads::Serve(const Content& c, const std::string& asker, Link::Ask ask) {
  if (ask == Link::Ask::kHome) {
    if (std::string to = Route(c, asker); !to.empty()) return Link::Served{.elsewhere = std::move(to)};
  }
  if (int fd = Cached(c); fd >= 0) return Link::Served{.fd = fd};
  serving = true;
  struct Reset {
    ~Reset() { serving = false; }
  } reset;
  // A replica held for its writer: the bytes are named by their checksum.
  if (store_) {
    for (const Held& h : store_->List()) {
      if (h.hash_hi != c.hi || h.hash_lo != c.lo || h.size != c.size) continue;
      auto f = store_->OpenHeld(h.key);
      if (!f) continue;
      Remember(c, f->first, &Stats::served_from_replicas);
      return Link::Served{.fd = f->first};
    }
  }
  auto fd = local_(c, false);
  if (fd) {
    Remember(c, *fd, &Stats::served_from_tier);
    return Link::Served{.fd = *fd};
  }
  if (fd.error() != ENOENT) return Err(fd.error());
  bool home;
  {
    MutexLock l(&mu_);
    home = peers_ && peers_->Home(c.path).first == node_;
  }
  // The home fetches from the backend; a member the home sent an asker to
  // waits for its own load in flight, or loads it from the home (Load).
  if (!home && ask != Link::Ask::kRelay) return Err(ENOENT);
  fd = local_(c, true);
  if (!fd) return Err(fd.error());
  Remember(c, *fd, &Stats::served_after_fetch);
  return Link::Served{.fd = *fd};
}

}  // namespace ckpt::fs::replica
