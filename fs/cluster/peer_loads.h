// peer_loads.h — loads from peers (issue #30): a file that is not in this
// node's RAM is read from another member before the backend, so that N
// nodes opening one file after a restart cost the backend about one read of
// it, not N.
//
// Every file has a *home*: the member with the highest rendezvous hash
// XXH3(path, member) among the live members with a replica link (Peers;
// this node included). Replicas are placed by the same order (Replicator),
// so at its close a file's home is its writer or its first replica holder,
// and after a writer's death its first holder. A node that must fetch a
// file (InodeTable::EnsureLocal: its state is remote) asks the home for the
// bytes whose content checksum the namespace knows (the backend's), unless
// it is the home itself; the home answers from its tier, from a replica it
// holds, or — being the home — by fetching the file from the backend once
// into its own tier (concurrent asks wait for that one fetch) and serving
// it from there. Whatever the answer, the asker checks the whole content
// checksum before the bytes count; a miss, an error, a lie or a home that
// went away sends the asker to the backend, as before. Nothing here is
// needed for correctness: it saves backend reads.
//
// A popular file is spread by a tree (Spread), not served N times by its
// home: the home serves its first `fanout` askers itself and sends each next
// one (kElsewhere) to the earliest asker that has fewer than `fanout` sent
// to it — a member that fetched the file or is fetching it, and serves it
// once its own load is whole (kFetchRelay: it waits for that load, or makes
// one). So a restart of N nodes opening one file costs the home `fanout`
// transfers and each member at most `fanout` more, in about log_fanout(N)
// rounds. An asker follows one redirect at most, and falls back to the home
// itself (kFetchDirect, never redirected), then to the backend; a member
// loading for an asker it was sent (a serving thread) asks the home only,
// directly. Every redirect goes to an earlier asker of the same home, so
// the waits form no cycle.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"
#include "fs/cluster/replica_link.h"
#include "fs/cluster/replica_store.h"

namespace ckpt::fs::replica {

class Peers;

class PeerLoads {
 public:
  // A read-only descriptor of the bytes `c` names that this node holds at
  // c.path in its tier (only if its checksum there is c's), fetched from
  // the backend first when `fetch`; ENOENT when not here.
  using LocalCopy = std::function<Result<int>(const Content& c, bool fetch)>;
  struct Stats {
    uint64_t from_peers = 0, from_peers_bytes = 0;  // loads a peer served whole
    uint64_t misses = 0;                            // the home did not hold it
    uint64_t failures = 0;                          // errors and checksum mismatches
    uint64_t to_backend = 0;                        // loads left to the backend (home here, misses, failures)
    uint64_t served_from_replicas = 0, served_from_tier = 0, served_after_fetch = 0;  // files (within 5 s: once)
    uint64_t sent_elsewhere = 0;  // askers this node sent to another member (the tree)
    uint64_t from_relays = 0;     // loads served whole by the member the home sent this node to
    std::string last_error;
  };

  // A home's tree for one file: who asked it, in order, and where each was
  // sent. Not thread-safe (PeerLoads holds its lock).
  class Spread {
   public:
    explicit Spread(uint64_t fanout) : fanout_(fanout) {}
    // Where `asker` gets the file: "" here, or the member to ask instead
    // (the same answer for every piece it asks). `member(n)`: n is still a
    // member with a link. *first: whether `asker` is new here.
    std::string Route(const std::string& asker, const std::function<bool(const std::string&)>& member,
                      bool* first = nullptr);
    std::chrono::steady_clock::time_point used{};

   private:
    static constexpr size_t kMaxAskers = 4096;  // past them, every next asker is served here
    struct Asker {
      std::string node, sent_to;
      uint64_t children = 0;
    };
    const uint64_t fanout_;
    uint64_t here_ = 0;
    std::vector<Asker> askers_;  // in the order they asked
  };

  // `fanout` (--peer-fanout): askers of one file a member serves before the
  // next are sent to those that have it; 0: the home serves every one.
  PeerLoads(std::string node, Store* store, LocalCopy local, uint64_t fanout = 4);
  PeerLoads(const PeerLoads&) = delete;
  PeerLoads& operator=(const PeerLoads&) = delete;
  ~PeerLoads();

  // The link and the members, once they exist (the link serves Serve()
  // from its start, before them). Attach(nullptr, nullptr) before the
  // link goes: it waits for the loads in flight.
  void Attach(Link* link, Peers* peers);

  // Asks `c`'s home for its bytes and writes them into `fd` (sized to
  // c.size, only holes; zero blocks stay holes). ENOENT: this node is the
  // home, no member has a link, or the home does not hold it; other
  // errors: the load failed (logged once per failure). Either way the
  // caller reads the backend, after emptying `fd`; nothing of this load
  // writes into `fd` once it returned (the pieces land in buffers of the
  // link's, written from this thread).
  Status Load(const Content& c, int fd);

  // Link::Options::serve: what a member asking this one gets.
  Result<Link::Served> Serve(const Content& c, const std::string& asker, Link::Ask ask);

  Stats stats() const;

 private:
  // The cached descriptor of c's bytes (the file is read in kFetchPiece
  // pieces: one lookup for all of them); -1 when none.
  int Cached(const Content& c);
  // Keeps a descriptor of c's bytes for the next pieces and counts the
  // file in `served` — unless another serving thread had it already (so
  // each file served counts once).
  void Remember(const Content& c, int fd, uint64_t Stats::*served);
  // One try of a load from the member at `addr` into `fd` (c.size bytes,
  // holes where nothing was written yet), checked whole.
  Status FetchFrom(Link* link, const std::string& addr, const Content& c, int fd, Link::Ask ask,
                   std::string* elsewhere);
  // The tree's answer for `asker` of `c`: "" serve it here.
  std::string Route(const Content& c, const std::string& asker);

  const std::string node_;
  Store* const store_;
  const LocalCopy local_;
  mutable Mutex mu_;
  Link* link_ GUARDED_BY(mu_) = nullptr;
  Peers* peers_ GUARDED_BY(mu_) = nullptr;
  int loading_ GUARDED_BY(mu_) = 0;  // Loads using link_
  CondVar loaded_;
  struct Open {
    int fd;
    std::chrono::steady_clock::time_point used;
  };
  std::map<std::pair<uint64_t, uint64_t>, Open> open_ GUARDED_BY(mu_);  // by checksum
  const uint64_t fanout_;
  std::map<std::pair<uint64_t, uint64_t>, Spread> spreads_ GUARDED_BY(mu_);  // by checksum
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace ckpt::fs::replica
