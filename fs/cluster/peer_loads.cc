// peer_loads.cc — see peer_loads.h.
#include "fs/cluster/peer_loads.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "backend/checksum.h"
#include "common/config.h"
#include "common/log.h"
#include "fs/cluster/replicator.h"

namespace ckpt::fs::replica {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kKeepOpen = std::chrono::seconds(5);  // a served file's descriptor, idle
constexpr size_t kMaxOpen = 16;
constexpr auto kLateLanding = std::chrono::seconds(60);  // a failed load's receives still in flight

// A serving thread never asks a peer itself: a home that must fetch reads
// the backend, whatever its view of the members (no chains, no cycles).
thread_local bool serving = false;

}  // namespace

PeerLoads::PeerLoads(std::string node, Store* store, LocalCopy local)
    : node_(std::move(node)), store_(store), local_(std::move(local)) {}

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
    if (serving || home.first.empty() || home.first == node_) {
      stats_.to_backend++;
      return Err(ENOENT);
    }
    link = link_;
    loading_++;
  }
  // The home may first fetch the file from the backend: its first answer
  // may take that long (at 50 MB/s, at least the link's own timeout).
  const int64_t first_ms = std::max<int64_t>(30000, static_cast<int64_t>(c.size / 50000));
  backend::ContentHash hash;
  const auto t0 = Clock::now();
  Status st;
  // The pieces land in a mapping of the tier file itself (no copy here),
  // hashed in order while the next ones move. The mapping lives as long as
  // a receive may still write into it, past an error returned here.
  std::shared_ptr<const void> map;
  if (!hash.ok()) {
    st = Err(ENOMEM);
  } else if (c.size > 0) {
    void* m = mmap(nullptr, c.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) st = ErrFromErrno();
    else map = std::shared_ptr<const void>(m, [n = c.size](const void* p) { munmap(const_cast<void*>(p), n); });
  }
  if (st && map) {
    char* base = static_cast<char*>(const_cast<void*>(map.get()));
    st = link->FetchAll(home.second, c, base, map, first_ms,
                        [&](uint64_t off, size_t n) { hash.Update(off, base + off, n); });
  }
  if (st) {
    auto [hi, lo] = hash.Finish(c.size);
    if (hi != c.hi || lo != c.lo) st = Err(EBADMSG);
  }
  if (!st && map) {
    // A failed piece's siblings may still be landing in the mapping, and
    // the caller fetches from the backend into this very file next: wait
    // until no receive holds it (each ends by its answer, its deadline or
    // its connection's end). Past that, the file is not to be used.
    const auto until = Clock::now() + kLateLanding;
    while (map.use_count() > 1 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (map.use_count() > 1) {
      LOG_ERROR("loads: {}: receives from node {} still in flight {} s after the load failed; the fetch fails",
                EscapeName(c.path), home.first, std::chrono::duration<double>(kLateLanding).count());
      st = Err(EBUSY);
    }
  }
  MutexLock l(&mu_);
  if (--loading_ == 0) loaded_.NotifyAll();
  if (st) {
    stats_.from_peers++;
    stats_.from_peers_bytes += c.size;
    LOG_DEBUG("loads: {} ({} bytes) from node {} in {:.3f} s", EscapeName(c.path), c.size, home.first,
              std::chrono::duration<double>(Clock::now() - t0).count());
    return {};
  }
  stats_.to_backend++;
  if (st.error() == ENOENT) {
    stats_.misses++;
    return st;
  }
  stats_.failures++;
  stats_.last_error = "loading " + EscapeName(c.path) + " from node " + home.first + ": " +
                      (st.error() == EBADMSG ? "its bytes do not match the file's checksum" : ErrStr(st.error()));
  LOG_WARN("loads: {}; reading the backend instead", stats_.last_error);
  return st;
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

Result<int> PeerLoads::Serve(const Content& c) {
  if (int fd = Cached(c); fd >= 0) return fd;
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
      return f->first;
    }
  }
  auto fd = local_(c, false);
  if (fd) {
    Remember(c, *fd, &Stats::served_from_tier);
    return fd;
  }
  if (fd.error() != ENOENT) return fd;
  bool home;
  {
    MutexLock l(&mu_);
    home = peers_ && peers_->Home(c.path).first == node_;
  }
  if (!home) return Err(ENOENT);
  fd = local_(c, true);  // once from the backend, then from this tier
  if (!fd) return fd;
  Remember(c, *fd, &Stats::served_after_fetch);
  return fd;
}

}  // namespace ckpt::fs::replica
