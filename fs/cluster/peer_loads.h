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
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

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
    std::string last_error;
  };

  PeerLoads(std::string node, Store* store, LocalCopy local);
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
  // caller reads the backend, after emptying `fd` — but for EBUSY: a
  // receive may still write into `fd` (it did not end within a minute of
  // the failure), and the fetch must fail rather than use it.
  Status Load(const Content& c, int fd);

  // Link::Options::serve: what a member asking this one gets.
  Result<int> Serve(const Content& c);

  Stats stats() const;

 private:
  // The cached descriptor of c's bytes (the file is read in kFetchPiece
  // pieces: one lookup for all of them); -1 when none.
  int Cached(const Content& c);
  // Keeps a descriptor of c's bytes for the next pieces and counts the
  // file in `served` — unless another serving thread had it already (so
  // each file served counts once).
  void Remember(const Content& c, int fd, uint64_t Stats::*served);

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
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace ckpt::fs::replica
