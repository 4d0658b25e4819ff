// replica_link.h — the daemons' link for replicas (issue #30): one UCX
// worker per daemon, a listener (--replica-listen HOST:PORT) that serves the
// holder side into a replica_store, and client requests to other members.
//
// Why UCX (docs/architecture.md, "Libraries"): the same code runs over TCP
// here and over RDMA verbs on clusters that have them. Messages are UCX
// active messages: the header is a replica_wire message, a chunk's bytes
// are the data, which UCX moves eagerly or by rendezvous into one of the
// holder's reused chunk buffers (zero-copy where the transport can), from
// where it is checked and written to the replica's file; the
// reply endpoint UCX hands the receiver is what binds a message to its
// authenticated connection.
//
// Only members may talk: a connection starts with a mutual HMAC-SHA256
// handshake over both sides' nonces and node ids under --cluster-secret
// (replica_wire.h); a peer that fails it, or sends anything before it, is
// logged (its address, never the secret) and disconnected, and nothing it
// sent is read. Every chunk carries its XXH3-64 and the whole replica is
// checked against the writer's content checksum before it counts: a peer
// that lies about either is refused and logged, and keeps nothing.
//
// Thread-safety: every public method may be called from any thread; they
// block until the peer answered or `timeout_ms` passed. One thread of the
// link's own drives UCX (UCS_THREAD_MODE_SINGLE worker).
#pragma once

#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "fs/cluster/replica_store.h"
#include "fs/cluster/replica_wire.h"

namespace ckpt::fs::replica {

class Link {
 public:
  // How a member asks this one for a load (Options::serve, FetchAll).
  enum class Ask : uint8_t {
    kHome,    // kFetch: it takes this member for the file's home; may be sent elsewhere
    kDirect,  // kFetchDirect: never sent elsewhere
    kRelay,   // kFetchRelay: the home sent it here; fetch the file first if it is not here
  };
  // What serve() answers: a read-only descriptor of the bytes (the link
  // closes it), or, for a kHome ask only, the member to ask instead.
  struct Served {
    int fd = -1;
    std::string elsewhere{};
  };
  struct Options {
    std::string node_id{};       // this member (ValidNodeId)
    std::string secret{};        // from LoadSecret
    std::string listen{};        // "HOST:PORT" (port 0: any free one); empty: requests only
    int64_t timeout_ms = 30000;  // one request, connection and handshake included
    // Loads other members ask of this one (FetchAll), one call per piece:
    // exactly the bytes `c` names, another member to ask (Served), or an
    // error (ENOENT: not here). `asker`: the member asking, as its handshake
    // proved. Called on the link's serving threads (kServers), never its
    // loop: it may block (a fetch). Empty: every load is refused with ENOENT.
    std::function<Result<Served>(const Content& c, const std::string& asker, Ask ask)> serve{};
    // Connections to the listener not through the handshake yet: more are
    // rejected at once, and each is refused after `handshake_ms` (or the
    // timeout, if shorter). Anyone who reaches the port can open them: the
    // bound keeps descriptors and endpoints for the members, and one source
    // address may hold only `max_handshakes_per_host` of them (a member has
    // one connection to another: one host cannot take every place), one
    // IPv6 /64 only `max_handshakes_per_prefix` (HandshakePrefix: a host
    // with a /64 has as many addresses as it likes; members of one subnet
    // share it, so it is the larger).
    int max_handshakes = 64;
    int max_handshakes_per_host = 8;
    int max_handshakes_per_prefix = 32;
    int64_t handshake_ms = 5000;
  };
  static constexpr int kServers = 2;
  struct Counters {
    uint64_t peers_refused = 0;   // connections that failed the handshake, spoke before it, or found no room for one
    uint64_t chunks_refused = 0;  // chunks or replicas whose checksum did not match
    uint64_t replicas_held = 0;   // replicas this holder accepted
    uint64_t bytes_in = 0, bytes_out = 0;
    uint64_t loads_served = 0, load_bytes_served = 0;  // Fetch answers this member gave
    uint64_t messages_refused = 0;                     // after a handshake, messages not sealed under its key (dropped)
    uint64_t stalled_closed = 0;  // connections closed for a chunk's receive that stopped moving (the idle sweep)
    uint64_t crowded_closed = 0;  // a node's oldest connection, closed when it opened one past kMaxConnsPerNode
  };

  // `store` (may be null with an empty `listen`) receives the replicas other
  // members send; it must outlive the link. The error is one line.
  static std::expected<std::unique_ptr<Link>, std::string> Open(const Options& o, Store* store);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Where the listener is ("HOST:PORT", the port picked when 0 was asked);
  // empty without one.
  const std::string& address() const;

  // Streams `size` bytes of `fd` (a file of the tier, read a chunk at a
  // time; EIO if it turns out shorter than `size`) to
  // the member listening at `peer` as replica `k`, and returns once the
  // holder answered that it holds it whole and checked. EAGAIN: the holder
  // has no room now; EBADMSG: it refused the bytes; EACCES: the handshake
  // failed (wrong secret); ETIMEDOUT, ECONNREFUSED, ECONNRESET as they come.
  // `meta` (up to 8 KiB with the key): what the holder keeps with it (Held::meta).
  Status Replicate(const std::string& peer, const Key& k, int fd, uint64_t size, uint64_t gate_us, uint64_t hash_hi,
                   uint64_t hash_lo, const std::string& meta = {});
  // The same with the content checksum in *hash_hi/*hash_lo, or 0/0: then
  // computed as the chunks go (no pass of its own before the first one),
  // sent with END, and stored there once the holder held it. `summed`, if
  // set, is called with that checksum on the calling thread once the last
  // chunk was acknowledged and before END goes, so before the holder can
  // hold the replica (what a writer keeps for a restart's read-back is kept
  // before any holder counts it: sent_sums.h). It returns false when the
  // bytes sent are not to be held (the checksum not kept, the source
  // changed under the transfer): then no END goes, and the call fails EIO
  // (the holder holds nothing).
  Status Replicate(const std::string& peer, const Key& k, int fd, uint64_t size, uint64_t gate_us, uint64_t* hash_hi,
                   uint64_t* hash_lo, const std::string& meta = {},
                   const std::function<bool(uint64_t hi, uint64_t lo)>& summed = {});
  // Reads `len` bytes at `offset` of replica `k` held by `peer` into `buf`
  // (checked by their XXH3-64); returns the bytes read (fewer at its end).
  // `incarnation` (hex, "" : any): ESTALE if the copy the peer holds was
  // written by another run of the writer (replica_wire.h: FileMeta).
  Result<size_t> Read(const std::string& peer, const Key& k, uint64_t offset, void* buf, size_t len,
                      const std::string& incarnation = {});
  // The whole file `c` names from `peer`, in kFetchPiece pieces with
  // kFetchDepth in flight, each landing straight from the transport in one
  // of a few buffers of this call's, reused (not in a mapping of the
  // destination: on a VM, a fault per page of a fresh tmpfs mapping made a
  // 1 GiB load take 5 s where pwrite of the same bytes takes 0.3 s),
  // unchecked: the whole file's content checksum, which the caller checks
  // (peer_loads.h), is what tells a lie. `landed(offset, data, len)` runs on
  // the caller's thread for each piece, in order (to hash and write it
  // while the next ones move); nothing lands anywhere the caller sees once
  // this returns (a receive still in flight after an error holds its own
  // buffer). `first_timeout_ms`: for the first piece (the peer may fetch
  // the file first), 0: the link's. EREMOTE: the peer sent the asker to
  // another member, named in *elsewhere (a kHome ask only).
  static constexpr uint64_t kFetchPiece = 8u << 20;
  static constexpr size_t kFetchDepth = 4;
  Status FetchAll(const std::string& peer, const Content& c, int64_t first_timeout_ms,
                  const std::function<Status(uint64_t, const char*, size_t)>& landed, Ask ask = Ask::kHome,
                  std::string* elsewhere = nullptr);
  // Tells `peer` to forget replica `k`. ENOENT: it did not hold it.
  Status Drop(const std::string& peer, const Key& k);

  Counters counters() const;

  // Tests only: send every chunk with a wrong checksum; stop a replication
  // after `n` chunks without ending it (as a writer that died mid-stream).
  void TestLieAboutChunks(bool on);
  void TestStopAfterChunks(int n);
  // Tests only: sleep `ms` before each chunk but the first, the link's
  // loop stopped meanwhile (a slow link: the transfer outlasts `timeout_ms`
  // while every chunk arrives within it; or a writer stalled mid-chunk);
  // send the first chunk twice (a confused writer).
  void TestPaceChunks(int ms);
  void TestRepeatFirstChunk(bool on);
  // Tests only: `n` chunks of a file in flight instead of kWindow (0: kWindow),
  // as a peer that sends every chunk's header at once.
  void TestWindow(int n);
  // Tests only: connect without saying HELLO (a port scanner, or a peer
  // that hangs before the handshake).
  void TestSilentDial(bool on);
  // Tests only: every message after the handshake sealed under a wrong key
  // (1), or malformed (2), as a peer that skipped the handshake makes one
  // pass for a member's; 0: honest.
  void TestForge(int how);
  // Tests only: the link's loop stops for `ms` when the next piece of a
  // read or load comes, before it takes it (an asker stopped, or hung).
  void TestStallOnData(int ms);
  // Tests only: `f` sees each CHALLENGE's text as it arrives (on the loop's
  // thread); set it before the link dials anyone.
  void TestOnChallenge(std::function<void(const std::string&)> f);

  struct Impl;

 private:
  explicit Link(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::fs::replica
