// replica_link_impl.h — the inside of replica_link's Link, shared by
// replica_link.cc (the loop, connections, this node's requests) and
// replica_holder.cc (the holder side). Nothing outside those two includes it.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/checksum.h"
#include "common/log.h"
#include "common/mutex.h"
#include "fs/cluster/replica_link.h"
#include "fs/cluster/replica_serve.h"

namespace ckpt::fs::replica {

using Clock = std::chrono::steady_clock;
inline constexpr unsigned kAmId = 17;              // our active messages' id
inline constexpr uint64_t kMaxRead = 64ull << 20;  // one GET

struct Conn;

// Chunk-sized buffers, reused. A replica moves through them (the writer
// reads, hashes and sends a chunk; the holder receives, checks and writes
// it) rather than through mappings of whole files: mapping 1 GiB of tmpfs
// writable and populated costs 0.22 s of page-table work here against
// 0.08 s for pwrite, and a buffer used again is already faulted in (and
// registered, on RDMA). A writer's file may shrink under it (a new version
// written in place): a short pread is an error, where a mapping is SIGBUS.
class ChunkPool {
 public:
  // kChunk bytes, back to the pool when the last holder lets go of it
  // (from any thread).
  static std::shared_ptr<char> Get(const std::shared_ptr<ChunkPool>& pool);

 private:
  static constexpr size_t kKeep = 16;  // 64 MiB at most kept between transfers
  Mutex mu_;
  std::vector<std::unique_ptr<char[]>> free_ GUARDED_BY(mu_);
};

// A request of this node to a peer (Replicate, Read, Drop).
struct Request {
  uint64_t id = 0;
  Op kind{};
  Key key;
  // Given up at `deadline`: `timeout` after the start, pushed on by each sign of progress (a PUT
  // accepted, a chunk acknowledged), so a replica of any size moves as long as its chunks do.
  Clock::time_point deadline;
  Clock::duration timeout{};
  std::weak_ptr<Conn> conn;
  std::promise<Result<uint64_t>> done;
  bool finished = false;
  // Replicate: the source (a descriptor of our own, closed with the
  // request), read a chunk at a time into the pool's buffers.
  int src_fd = -1;
  uint64_t size = 0, gate_us = 0, hash_hi = 0, hash_lo = 0;
  uint64_t incarnation = 0;  // Read: the writer's run the copy must be of (0: any)
  std::string meta;
  uint64_t next = 0;  // offset of the next chunk to send
  // Replicate without a checksum: computed here as the chunks go, in order,
  // and sent with END (null when the PUT carried it). With `sum_ready`, END
  // waits for the caller, told by it (false: finished without it).
  std::unique_ptr<backend::ContentHash> hashing;
  std::optional<std::promise<bool>> sum_ready;
  bool sum_told = false;
  int inflight = 0, sent = 0;
  bool ended = false, accepted = false;
  Content content;         // Fetch
  Op ask_op = Op::kFetch;  // Fetch: kFetch, kFetchDirect or kFetchRelay
  std::string elsewhere;   // Fetch answered kElsewhere: the member named
  // FetchAll: the bytes land at `dst` straight from UCX, in memory that
  // `dst_keep` holds until the last receive into it is over.
  char* dst = nullptr;
  std::shared_ptr<const void> dst_keep;
  // Read, Fetch: where the bytes land (copied to the caller's buffer by the caller).
  uint64_t offset = 0, len = 0;
  std::string buf;
  bool receiving = false;  // Read, Fetch: its one kData came (another is a protocol error)
  ~Request() {
    if (src_fd >= 0) close(src_fd);
  }
};

// A replica this node is receiving as a holder.
struct Rx {
  std::unique_ptr<Store::Incoming> in;
  std::vector<bool> got;      // per chunk: landed, checked and written
  std::vector<bool> claimed;  // per chunk: its message came (a second one is refused, even while the first lands)
  uint64_t chunks_got = 0;
  uint64_t chunks_claimed = 0;  // claimed - got: the chunks in flight, at most kWindow
  // The content checksum of the chunks landed so far in order (those after
  // a gap wait for it): at END it is the whole replica's, with no pass of
  // its own over the bytes.
  backend::ContentHash hash;
  uint64_t hashed = 0;                                   // chunks in `hash`
  std::optional<std::pair<uint64_t, uint64_t>> end_sum;  // the writer's, from END
  int pending = 0;                                       // rendezvous receives in flight
  bool failed = false, ended = false;
  Clock::time_point last;
};

struct Conn {
  enum class St { kAwaitHello, kAwaitProof, kAwaitChallenge, kAwaitReady, kReady, kClosed };
  ucp_ep_h ep = nullptr;
  bool holder_side = false, forged_logged = false;
  St st{};
  std::string addr;  // the peer's address as dialed, or "from HOST:PORT" on the holder side
  std::string peer_id, nonce_c, nonce_s;
  std::string key;  // SessionKey once the handshake passed: every later message sealed under it (HandleArrived)
  Clock::time_point since;
  std::map<uint64_t, std::shared_ptr<Rx>> rx;     // holder: by request id
  std::vector<std::weak_ptr<Rx>> refused;         // holder: refused with a receive in flight (timed out as rx's are)
  std::vector<std::shared_ptr<Request>> waiting;  // client: until kReady
  std::shared_ptr<ServeShare> share = std::make_shared<ServeShare>();  // holder: what it lends this node (AdmitNode)
  std::shared_ptr<ServeShare> sends = std::make_shared<ServeShare>();  // holder: this connection's sends (Sweep)
};

struct Link::Impl {
  Options opts;
  Store* store = nullptr;
  std::string address;
  std::shared_ptr<ChunkPool> chunks = std::make_shared<ChunkPool>();

  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  std::set<std::string> rejecting;  // Accept: "" (all) and hosts at their bound (logged once per burst)
  LogBudget refuse_log{10, std::chrono::seconds(10)};  // Refuse's lines: anyone who reaches the port causes them
  int epfd = -1, evfd = -1;
  std::thread thread;
  std::atomic<bool> stop{false};

  Mutex mu;
  std::deque<std::function<void()>> tasks GUARDED_BY(mu);

  // Loop's own (the UCX callbacks run inside ucp_worker_progress on Loop).
  struct Arrived {
    ucp_ep_h ep;
    std::optional<Msg> msg;
    void* data;
    size_t len;
    bool rndv;
  };
  std::deque<Arrived> arrived;
  std::vector<ucp_conn_request_h> conn_requests;
  std::vector<ucp_ep_h> failed_eps;
  std::vector<std::function<void()>> completions;  // UCX completions, acted on after progress
  std::unordered_map<ucp_ep_h, std::shared_ptr<Conn>> conns;
  std::map<std::string, std::shared_ptr<Conn>> dialed;  // client side, by peer address
  std::map<uint64_t, std::shared_ptr<Request>> reqs;
  std::vector<void*> closing;

  std::atomic<uint64_t> next_id{1}, peers_refused{0}, chunks_refused{0}, replicas_held{0}, bytes_in{0}, bytes_out{0};
  std::atomic<uint64_t> loads_served{0}, load_bytes_served{0}, messages_refused{0}, stalled_closed{0},
      crowded_closed{0};
  std::atomic<bool> lie{false}, repeat_first{false}, silent_dial{false};  // tests' hooks (replica_link.h)
  std::atomic<int> forge_how{0}, stop_after{-1}, pace_ms{0}, test_window{0}, stall_ms{0};
  std::function<void(const std::string&)> test_saw_challenge;  // set before the first dial

  // ---- set-up and the loop ----
  // On the loop's thread: "" when ready, else why not.
  std::string Start();
  void Teardown();

  // The loop's wake-up descriptors: made before its thread starts and
  // closed after it ended, so Post() and ~Link() never write to a closed one.
  std::string OpenWakeup();

  ~Impl() {
    if (epfd >= 0) close(epfd);
    if (evfd >= 0) close(evfd);
  }

  void Loop(std::promise<std::string>* ready);

  void Post(std::function<void()> fn);
  bool RunTasks();
  bool InFlight() const;  // requests or replicas being received

  bool RunCompletions();

  // ---- UCX callbacks: record only ----
  static ucs_status_t OnAm(void* arg, const void* header, size_t hlen, void* data, size_t len,
                           const ucp_am_recv_param_t* param);

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t);

  struct SendCtx {
    Impl* impl;
    std::string hdr, payload;
    std::shared_ptr<const void> keep;  // the source (a chunk buffer) stays while the send reads it
  };

  void Send(Conn& c, const Msg& m, const void* data = nullptr, size_t len = 0, std::shared_ptr<const void> keep = {},
            std::string payload = {});

  // ---- connections ----
  void Close(const std::shared_ptr<Conn>& c, bool force);

  // A peer that is not (or not yet) a member: one line, and disconnected.
  void Refuse(const std::shared_ptr<Conn>& c, const std::string& why);

  bool Accept();
  void AdmitNode(const std::shared_ptr<Conn>& c);  // a holder's bounds per node id (replica_holder.cc)

  std::shared_ptr<Conn> Dial(const std::string& peer, int* err);

  // ---- client requests ----
  void Finish(const std::shared_ptr<Request>& r, Result<uint64_t> res);
  void StartRequest(const std::shared_ptr<Request>& r, const std::string& peer);
  void Begin(Conn& c, const std::shared_ptr<Request>& r);
  void Pump(Conn& c, const std::shared_ptr<Request>& r);
  void EndAfterSum(const std::shared_ptr<Request>& r, bool kept);  // the caller's answer to sum_ready

  void ClientMessage(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv);

  void ReceiveData(const std::shared_ptr<Request>& r, const Msg& m, void* data, size_t len, bool rndv);

  // Starts a rendezvous receive; `cb(ud, ok)` runs when it is over (from a
  // UCX callback: it must only record).
  void RecvInto(void* desc, char* dst, size_t len, void* ud, void (*cb)(void*, bool));

  // ---- holder side ----
  void HolderMessage(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv);
  void Reply(Conn& c, uint64_t req, Op op, uint64_t a = 0, std::string text = {});

  // A request about this writer's own replicas only: a member cannot place
  // or drop replicas in another member's name.
  std::optional<Key> OwnKey(Conn& c, const Msg& m);

  void Put(const std::shared_ptr<Conn>& c, const Msg& m);
  void RefuseReplica(const std::shared_ptr<Conn>& c, uint64_t req, const std::string& why, int err = EBADMSG);
  std::string Discard(const std::shared_ptr<Conn>& c, uint64_t req);  // the receive's key name, or "?"
  void Chunk(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv);

  int HashLanded(Rx& rx);
  void End(const std::shared_ptr<Conn>& c, const Msg& m);

  void DropReplica(const std::shared_ptr<Conn>& c, const Msg& m);

  void Get(const std::shared_ptr<Conn>& c, const Msg& m);
  // A piece served (GET, load), counted as the asker's sending until UCX is done with it.
  void SendServed(Conn& c, const Msg& m, const char* data, uint64_t n, std::shared_ptr<const void> buf);

  // ---- the loop's bookkeeping ----
  bool HandleArrived();

  bool HandleFailedEps();

  void Sweep(Clock::time_point progressed);  // `progressed`: when this turn's UCX progress ended

  Result<uint64_t> Call(std::shared_ptr<Request> r, const std::string& peer, int64_t timeout_ms = 0);
  // Call without waiting: the answer comes through the returned future.
  std::future<Result<uint64_t>> Start(std::shared_ptr<Request> r, const std::string& peer, int64_t timeout_ms = 0);

  // ---- loads served to other members (Options::serve), off the loop ----
  // Bounded (replica_serve.h): kServeBytes read and not yet sent, kServeShare
  // of it for one asker; a GET past either is refused EAGAIN, a load waits.
  struct ServeJob {
    std::weak_ptr<Conn> conn;
    std::shared_ptr<ServeShare> share;
    std::shared_ptr<void> hold;  // the asker's share, taken when a server picks the job
    uint64_t req = 0;
    Content content;
    uint64_t offset = 0, len = 0;
    Link::Ask ask = Link::Ask::kHome;
    std::string asker;
  };
  Mutex serve_mu;
  CondVar serve_cv;
  std::deque<ServeJob> serve_q GUARDED_BY(serve_mu);
  bool serve_stop GUARDED_BY(serve_mu) = false;
  std::shared_ptr<std::atomic<uint64_t>> get_bytes = std::make_shared<std::atomic<uint64_t>>(0);  // GETs'
  uint64_t serve_bytes GUARDED_BY(serve_mu) = 0;                                                  // loads'
  std::vector<std::thread> servers;

  std::optional<ServeJob> NextServeJob();
  void Fetch(const std::shared_ptr<Conn>& c, const Msg& m);
  void ServeLoop();
  void StopServers();
};

}  // namespace ckpt::fs::replica
