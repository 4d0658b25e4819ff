// replica_wire.h — what two daemons say to each other about replicas
// (issue #30, docs/replicas.md): the messages, the names of replicas, the
// shared secret and the handshake's MACs. No I/O here: replica_link.* moves
// these messages over UCX, replica_store.* keeps what a holder received.
//
// A message is a fixed little-endian header (op, request id, four numbers,
// the length of a text) followed by the text; a chunk's bytes travel beside
// it as the message's data. Decode() refuses anything malformed, so a peer
// can send nothing that makes a daemon read past what it received. After
// the handshake every message is sealed: a flag in the header and a tag
// (kTagLen bytes of HMAC-SHA256 under the connection's key, SessionKey)
// after the text; one whose tag is not the connection's is dropped.
//
// Thread-safety: everything here is reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ckpt::fs::replica {

inline constexpr uint64_t kChunk = 4ull << 20;  // bytes per chunk message
inline constexpr int kWindow = 4;               // chunks of one file in flight
inline constexpr size_t kMaxIncomingPerNode = 16;  // replicas one node id may have open at a holder (more: WAIT)
inline constexpr size_t kMaxConnsPerNode = 4;      // a node id's connections at a holder (more: its oldest closed)
inline constexpr size_t kNonceLen = 32;
inline constexpr size_t kMacLen = 32;        // HMAC-SHA256
inline constexpr size_t kTagLen = 16;        // a sealed message's tag: HMAC-SHA256 truncated
inline constexpr size_t kMinSecretLen = 16;  // bytes of a --cluster-secret file
inline constexpr size_t kMaxSecretLen = 4096;
inline constexpr size_t kMaxText = 8192;  // text of one message (a PUT's carries a path)
inline constexpr size_t kMaxNodeId = 64;

enum class Op : uint16_t {
  kHello = 1,      // client → holder: text = client's node id ‖ nonce_c
  kChallenge = 2,  // holder → client: text = nonce_s (the holder's id is not told yet)
  kProof = 3,      // client → holder: text = MAC("client", the holder's id empty)
  kReady = 4,      // holder → client: text = MAC("holder") ‖ holder's node id; requests may follow
  kPut = 10,       // text = key '\n' the writer's JSON of the file (path, mode, owner, mtime, seq);
                   // a = size, b = gate time (µs), c/d = content checksum hi/lo (0/0: with END)
  kChunk = 11,     // a = offset, b = XXH3-64 of the bytes; data = the bytes
  kEnd = 12,       // every chunk sent; c/d = the content checksum when the PUT had none (0/0)
  kAccepted = 13,  // the holder reserved room for a PUT: chunks may follow
  kAck = 14,       // a chunk landed and its checksum matched (a = offset)
  kHeld = 15,      // the replica is whole, checked and kept
  kWait = 16,      // no room at the holder now: try later (the writer's file stays in RAM)
  kRefused = 17,   // text = why; the request is over, nothing of it is kept
  kAbort = 18,     // client → holder: a PUT given up before its END; nothing of it is kept (no answer)
  kDrop = 20,      // text = key: the writer persisted it
  kDropped = 21,
  kGet = 22,          // text = key; a = offset, b = length, c = the writer's incarnation (0: any)
  kData = 23,         // a = offset; data = the bytes, b = their XXH3-64 (none for a kFetch: the whole file is checked)
  kFetch = 24,        // a load (Content): text = size '\n' path; a = offset, b = length, c/d = checksum hi/lo;
                      // answered by kData, kRefused (ENOENT: not here) or kElsewhere
  kElsewhere = 25,    // text = a member's node id: ask it instead (it fetched or is fetching the file)
  kFetchDirect = 26,  // as kFetch, never answered kElsewhere (an asker that was, or a member fetching for one)
  kFetchRelay = 27,   // as kFetchDirect, from an asker the home sent here: fetch the file first if it is not here
};

struct Msg {
  Op op{};
  uint64_t req = 0;  // the request a message belongs to (chosen by the client)
  uint64_t a = 0, b = 0, c = 0, d = 0;
  std::string text{};  // at most kMaxText bytes
  std::string tag{};   // Decode: a sealed message's tag (kTagLen bytes), else empty
};

// Sealed when `key` is not empty: the tag binds the header, the text and
// `dir` (who sends: 'c' client, 'h' holder, so no message is reflected).
std::string Encode(const Msg& m, std::string_view key = {}, char dir = 0);
// Whether `m` (decoded) is sealed under `key` by `dir` (constant time).
bool SealedBy(const Msg& m, std::string_view key, char dir);
// The message in `len` bytes at `p`, or nullopt when they are not exactly
// one well-formed message (unknown op, text too long, bytes short or left).
std::optional<Msg> Decode(const void* p, size_t len);

// Whether `reply` can answer a request of kind `request` (kPut, kGet,
// kFetch, kDrop): a holder that answers a GET with HELD or a PUT with
// DROPPED is confused or lying, and is not believed.
bool Answers(Op request, Op reply);

// The network a connecting peer's handshakes are also counted against
// (Link::Options::max_handshakes_per_prefix), from getnameinfo's numeric
// host: an IPv6 address's /64 ("2001:db8:1:2::/64"; one host is routinely
// given a whole /64, and could use a new address for each connection), an
// IPv4-mapped address as its IPv4 one, a zone index ("%eth0") dropped.
// Anything else (IPv4, "") as it is: its address bound is the one.
std::string HandshakePrefix(std::string_view host);

// The connections in their handshake, in all, per source host and per
// HandshakePrefix (Link::Options' bounds; a bound below 1 counts as 1).
class HandshakeCount {
 public:
  HandshakeCount(int all, int per_host, int per_prefix) : all_(all), per_host_(per_host), per_prefix_(per_prefix) {}
  // One in its handshake, from `host` ("": unknown, bounded only in all).
  void Add(const std::string& host);
  // Counted (Add) and nullopt if a new connection from `host` is within
  // every bound; else the bound it is past: who ("" for all, the host, or
  // its /64) and how many are in their handshake there.
  struct Past {
    std::string who;
    size_t n = 0;
  };
  std::optional<Past> Admit(const std::string& host);

 private:
  int all_, per_host_, per_prefix_;
  size_t all_n_ = 0;
  std::map<std::string, size_t> hosts_, prefixes_;
};

// A member's node id as the cluster knows it: 1..64 of [A-Za-z0-9._-],
// starting with a letter or digit (so it is also a safe file name part).
bool ValidNodeId(std::string_view id);

// A replica: version `version` of inode `ino` written on node `writer`.
// The ino of a namespace entry's replica (mkdir, rename, unlink...; its
// version is the entry's seq): no file has it (the root is 1).
inline constexpr uint64_t kEntryIno = 0;

struct Key {
  std::string writer;
  uint64_t ino = 0, version = 0;
  // "writer.ino.version" (ino and version in decimal): a file name.
  std::string Name() const;
  static std::optional<Key> Parse(std::string_view name);
  bool operator==(const Key&) const = default;
  auto operator<=>(const Key&) const = default;
};

// What a member loading a file asks another member for (issue #30, loads
// from peers; fs/cluster/peer_loads.h): the bytes of a file whose content
// checksum (backend/checksum.h) is hi/lo, of `size` bytes, which the
// backend names `path`. The checksum names the bytes; the path only says
// where the holder may look for them.
struct Content {
  std::string path;
  uint64_t size = 0, hi = 0, lo = 0;
  // A kFetch's text, and its inverse (nullopt: malformed).
  std::string Text() const;
  static std::optional<Content> FromText(std::string_view text, uint64_t hi, uint64_t lo);
};

// The shared secret of --cluster-secret FILE: a regular file (not a link)
// owned by this process's user, readable by nobody else (mode & 077 == 0),
// of kMinSecretLen to kMaxSecretLen bytes (a trailing newline is dropped).
// The error says what is wrong with the file, never what is in it.
std::expected<std::string, std::string> LoadSecret(const std::string& path);

std::string RandomNonce();  // kNonceLen bytes from getrandom()

// A run's incarnation (the state dir's random id) as records, metas and
// names spell it: 16 lower-case hex digits; and back (a GET's `c`):
// nullopt unless 1 to 16 hex digits and nothing else.
std::string IncarnationText(uint64_t id);
std::optional<uint64_t> IncarnationId(std::string_view text);

// HMAC-SHA256 under `secret` of the handshake's transcript: `role`
// ("holder" or "client"), both nonces and both node ids, each length-prefixed,
// so no two different transcripts give the same input.
std::string HandshakeMac(std::string_view secret, std::string_view role, std::string_view nonce_c,
                         std::string_view nonce_s, std::string_view id_c, std::string_view id_s);
// Compares in constant time (CRYPTO_memcmp).
bool SameMac(std::string_view a, std::string_view b);
// A connection's key once its handshake passed: HMAC-SHA256 under `secret`
// of the same transcript, role "session" (a fresh one per connection).
std::string SessionKey(std::string_view secret, std::string_view nonce_c, std::string_view nonce_s,
                       std::string_view id_c, std::string_view id_s);

uint64_t ChunkHash(const void* p, size_t len);  // XXH3-64

// What a writer tells its holders of a file (a PUT's meta): enough for a
// holder to publish it in the writer's place (fs/cluster/takeover.h).
// Encoded as one line of numbers (version 2: then the writer's
// incarnation), then the path (any bytes but NUL, a newline included, as
// the drain log has them). Version 1 (no incarnation) is still read.
struct FileMeta {
  uint64_t seq = 0;         // the writer's log entry
  std::string incarnation;  // the writer's run (ClusterOptions::incarnation); "" unknown
  std::string path;  // as the backend names it
  uint32_t mode = 0, uid = 0, gid = 0;
  bool has_owner = false;
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
};
std::string EncodeMeta(const FileMeta& m);
std::optional<FileMeta> DecodeMeta(std::string_view s);

}  // namespace ckpt::fs::replica
