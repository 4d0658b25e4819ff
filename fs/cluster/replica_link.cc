// replica_link.cc — see replica_link.h.
//
// Every UCX call happens on the link's own thread (Loop): the public
// methods post a task and wait for their request's promise. UCX callbacks
// (an active message, a completion, an endpoint error) only record what
// happened; Loop acts on it after ucp_worker_progress returns, where
// sending and receiving are allowed.
#include "fs/cluster/replica_link.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/io.h"
#include "common/log.h"
#include "common/mutex.h"
#include "fs/cluster/replica_link_impl.h"

namespace ckpt::fs::replica {
namespace {

// "HOST:PORT" or "[V6]:PORT" → a socket address.
std::expected<std::pair<sockaddr_storage, socklen_t>, std::string> Resolve(const std::string& hp, bool passive) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) return std::unexpected("want HOST:PORT");
  std::string host = hp.substr(0, colon), port = hp.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  for (char c : port)
    if (c < '0' || c > '9' || port.size() > 5) return std::unexpected("bad port");
  if (std::stoul(port) > 65535) return std::unexpected("bad port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || !res) return std::unexpected(std::string("cannot resolve ") + host + ": " + gai_strerror(rc));
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, res->ai_addr, res->ai_addrlen);
  out.second = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

std::string PortOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port));
  if (ss.ss_family == AF_INET6) return std::to_string(ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port));
  return "0";
}

}  // namespace

std::string Link::Impl::Start() {
  ucp_config_t* cfg = nullptr;
  if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return "cannot read UCX's configuration";
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t st = ucp_init(&p, cfg, &context);
  ucp_config_release(cfg);
  if (st != UCS_OK) return std::string("UCX: ") + ucs_status_string(st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((st = ucp_worker_create(context, &wp, &worker)) != UCS_OK)
    return std::string("UCX worker: ") + ucs_status_string(st);
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hp.id = kAmId;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
  hp.cb = &Impl::OnAm;
  hp.arg = this;
  if ((st = ucp_worker_set_am_recv_handler(worker, &hp)) != UCS_OK)
    return std::string("UCX handler: ") + ucs_status_string(st);
  int wfd = -1;
  if ((st = ucp_worker_get_efd(worker, &wfd)) != UCS_OK) return std::string("UCX wakeup: ") + ucs_status_string(st);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wfd;
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, wfd, &ev) != 0) return "epoll: " + ErrStr(errno);
  if (!opts.listen.empty()) {
    auto sa = Resolve(opts.listen, true);
    if (!sa) return "--replica-listen " + opts.listen + ": " + sa.error();
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa->first);
    lp.sockaddr.addrlen = sa->second;
    lp.conn_handler.cb = [](ucp_conn_request_h r, void* arg) { static_cast<Impl*>(arg)->conn_requests.push_back(r); };
    lp.conn_handler.arg = this;
    if ((st = ucp_listener_create(worker, &lp, &listener)) != UCS_OK)
      return "--replica-listen " + opts.listen + ": " + ucs_status_string(st);
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener, &la) != UCS_OK) return "cannot query the replica listener";
    address = opts.listen.substr(0, opts.listen.rfind(':')) + ":" + PortOf(la.sockaddr);
  }
  return "";
}

void Link::Impl::Teardown() {
  for (auto& [id, r] : std::map<uint64_t, std::shared_ptr<Request>>(reqs)) Finish(r, Err(ESHUTDOWN));
  for (auto& [ep, c] : std::unordered_map<ucp_ep_h, std::shared_ptr<Conn>>(conns)) Close(c, true);
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (!closing.empty() && Clock::now() < until) {
    ucp_worker_progress(worker);
    RunCompletions();
    std::erase_if(closing, [](void* rq) {
      if (ucp_request_check_status(rq) == UCS_INPROGRESS) return false;
      ucp_request_free(rq);
      return true;
    });
  }
  for (auto& a : arrived)
    if (a.data) ucp_am_data_release(worker, a.data);
  arrived.clear();
  for (auto* r : conn_requests) ucp_listener_reject(listener, r);
  if (listener) ucp_listener_destroy(listener);
  conns.clear();
  dialed.clear();
  // Tasks posted and never run hold served pieces, whose release takes
  // serve_mu: gone now, while it still exists (the servers stopped first).
  std::deque<std::function<void()>> left;
  {
    MutexLock l(&mu);
    left.swap(tasks);
  }
  left.clear();
  if (worker) ucp_worker_destroy(worker);
  // Receives the destroy cancelled called back into completions, which
  // nothing runs now (their connections are gone): discarded, which frees
  // what they hold while the rest of this Impl still exists.
  completions.clear();
  if (context) ucp_cleanup(context);
}

std::string Link::Impl::OpenWakeup() {
  epfd = epoll_create1(EPOLL_CLOEXEC);
  evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd < 0 || evfd < 0) return "replica link: epoll: " + ErrStr(errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = evfd;
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, evfd, &ev) != 0) return "replica link: epoll: " + ErrStr(errno);
  return "";
}

void Link::Impl::Loop(std::promise<std::string>* ready) {
  std::string err = Start();
  ready->set_value(err);
  if (!err.empty()) {
    Teardown();
    return;
  }
  while (!stop.load()) {
    bool busy = false;
    while (ucp_worker_progress(worker)) busy = true;
    const auto progressed = Clock::now();
    busy |= RunCompletions();
    busy |= RunTasks();
    busy |= HandleArrived();
    busy |= Accept();
    busy |= HandleFailedEps();
    Sweep(progressed);
    std::erase_if(closing, [](void* rq) {
      if (ucp_request_check_status(rq) == UCS_INPROGRESS) return false;
      ucp_request_free(rq);
      return true;
    });
    if (busy) continue;
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    epoll_event evs[2];
    // Transfers in flight: UCX over TCP does not wake the worker's fd for
    // every step of a rendezvous, so the loop looks again within 1 ms; idle,
    // every 50 ms (deadlines, the holder's idle check).
    epoll_wait(epfd, evs, 2, InFlight() ? 1 : 50);
    uint64_t v;
    while (read(evfd, &v, sizeof v) > 0) {
    }
  }
  Teardown();
}

void Link::Impl::Post(std::function<void()> fn) {
  {
    MutexLock l(&mu);
    tasks.push_back(std::move(fn));
  }
  uint64_t one = 1;
  (void)!write(evfd, &one, sizeof one);
}

bool Link::Impl::InFlight() const {
  if (!reqs.empty()) return true;
  for (const auto& [ep, c] : conns)
    if (!c->rx.empty() || !c->refused.empty()) return true;
  return false;
}

bool Link::Impl::RunTasks() {
  std::deque<std::function<void()>> t;
  {
    MutexLock l(&mu);
    t.swap(tasks);
  }
  for (auto& fn : t) fn();
  return !t.empty();
}

bool Link::Impl::RunCompletions() {
  bool any = false;
  while (!completions.empty()) {
    auto c = std::move(completions);
    completions.clear();
    for (auto& fn : c) fn();
    any = true;
  }
  return any;
}

ucs_status_t Link::Impl::OnAm(void* arg, const void* header, size_t hlen, void* data, size_t len,
                              const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  Arrived a{};
  a.ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  a.msg = Decode(header, hlen);
  a.rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  const bool keep = len > 0 && (a.rndv || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA));
  a.data = keep ? data : nullptr;
  a.len = len;
  self->arrived.push_back(a);
  return keep ? UCS_INPROGRESS : UCS_OK;
}

void Link::Impl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t) { static_cast<Impl*>(arg)->failed_eps.push_back(ep); }

void Link::Impl::Send(Conn& c, const Msg& m, const void* data, size_t len, std::shared_ptr<const void> keep,
                      std::string payload) {
  if (c.st == Conn::St::kClosed) return;
  const int forge = c.key.empty() ? 0 : forge_how.load();  // TestForge
  auto* ctx = new SendCtx{this, Encode(m, forge == 1 ? c.key + "x" : c.key, c.holder_side ? 'h' : 'c'),
                          std::move(payload), std::move(keep)};
  if (forge == 2) ctx->hdr[3] = 1;  // a header no version reads
  if (!ctx->payload.empty()) {
    data = ctx->payload.data();
    len = ctx->payload.size();
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.cb.send = [](void* rq, ucs_status_t, void* ud) {
    delete static_cast<SendCtx*>(ud);
    ucp_request_free(rq);
  };
  p.user_data = ctx;
  ucs_status_ptr_t sp = ucp_am_send_nbx(c.ep, kAmId, ctx->hdr.data(), ctx->hdr.size(), data, len, &p);
  if (sp == nullptr) delete ctx;
  else if (UCS_PTR_IS_ERR(sp)) {
    LOG_DEBUG("replica link: send to {}: {}", c.addr, ucs_status_string(UCS_PTR_STATUS(sp)));
    delete ctx;
  }
}

void Link::Impl::Close(const std::shared_ptr<Conn>& c, bool force) {
  if (c->st == Conn::St::kClosed && !conns.count(c->ep)) return;
  c->st = Conn::St::kClosed;
  for (auto& [req, rx] : c->rx) rx->failed = true;  // discarded once no receive writes into them
  c->rx.clear();
  for (auto& r : c->waiting) Finish(r, Err(ECONNRESET));
  c->waiting.clear();
  for (auto& [id, r] : std::map<uint64_t, std::shared_ptr<Request>>(reqs))
    if (r->conn.lock() == c) Finish(r, Err(ECONNRESET));
  conns.erase(c->ep);
  if (!c->holder_side) {
    auto it = dialed.find(c->addr);
    if (it != dialed.end() && it->second == c) dialed.erase(it);
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t sp = ucp_ep_close_nbx(c->ep, &p);
  if (sp && !UCS_PTR_IS_ERR(sp)) closing.push_back(sp);
}

void Link::Impl::Refuse(const std::shared_ptr<Conn>& c, const std::string& why) {
  peers_refused++;
  if (refuse_log.Take()) {
    const uint64_t held = refuse_log.held();
    LOG_ERROR("replica link: refused {}{}: {}{}", c->addr, c->peer_id.empty() ? "" : " (node " + c->peer_id + ")", why,
              held ? " (" + std::to_string(held) + " more refused without a line before it)" : "");
  }
  Msg m{.op = Op::kRefused, .a = EACCES, .text = "not a member of this cluster"};
  Send(*c, m);
  Close(c, false);
}

std::shared_ptr<Conn> Link::Impl::Dial(const std::string& peer, int* err) {
  auto it = dialed.find(peer);
  if (it != dialed.end() && it->second->st != Conn::St::kClosed) return it->second;
  auto sa = Resolve(peer, false);
  if (!sa) {
    LOG_WARN("replica link: peer {}: {}", peer, sa.error());
    *err = EINVAL;
    return nullptr;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa->first);
  ep.sockaddr.addrlen = sa->second;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Impl::OnEpError;
  ep.err_handler.arg = this;
  auto c = std::make_shared<Conn>();
  c->st = Conn::St::kAwaitChallenge;
  c->addr = peer;
  c->since = Clock::now();
  c->nonce_c = RandomNonce();
  ucs_status_t st = ucp_ep_create(worker, &ep, &c->ep);
  if (st != UCS_OK) {
    LOG_WARN("replica link: cannot connect to {}: {}", peer, ucs_status_string(st));
    *err = ECONNREFUSED;
    return nullptr;
  }
  conns[c->ep] = c;
  dialed[peer] = c;
  if (!silent_dial.load()) Send(*c, Msg{.op = Op::kHello, .text = c->nonce_c + opts.node_id});
  return c;
}

void Link::Impl::Finish(const std::shared_ptr<Request>& r, Result<uint64_t> res) {
  if (r->finished) return;
  r->finished = true;
  if (r->sum_ready && !r->sum_told) {
    r->sum_told = true;
    r->sum_ready->set_value(false);
  }
  reqs.erase(r->id);
  r->done.set_value(res);
}

void Link::Impl::StartRequest(const std::shared_ptr<Request>& r, const std::string& peer) {
  int err = 0;
  auto c = Dial(peer, &err);
  if (!c) return Finish(r, Err(err));
  r->conn = c;
  reqs[r->id] = r;
  if (c->st == Conn::St::kReady) Begin(*c, r);
  else c->waiting.push_back(r);
}

void Link::Impl::Begin(Conn& c, const std::shared_ptr<Request>& r) {
  Msg m{.op = r->kind, .req = r->id, .text = r->key.Name()};
  if (r->kind == Op::kPut) {
    m.text += "\n" + r->meta;
    m.a = r->size;
    m.b = r->gate_us;
    m.c = r->hash_hi;
    m.d = r->hash_lo;
  } else if (r->kind == Op::kGet) {
    m.a = r->offset;
    m.b = r->len;
    m.c = r->incarnation;
  } else if (r->kind == Op::kFetch) {
    m.op = r->ask_op;
    m.text = r->content.Text();
    m.a = r->offset;
    m.b = r->len;
    m.c = r->content.hi;
    m.d = r->content.lo;
  }
  Send(c, m);
}

std::shared_ptr<char> ChunkPool::Get(const std::shared_ptr<ChunkPool>& pool) {
  std::unique_ptr<char[]> b;
  {
    MutexLock l(&pool->mu_);
    if (!pool->free_.empty()) {
      b = std::move(pool->free_.back());
      pool->free_.pop_back();
    }
  }
  if (!b) b.reset(new char[kChunk]);
  return std::shared_ptr<char>(b.release(), [pool](char* p) {
    std::unique_ptr<char[]> back(p);
    MutexLock l(&pool->mu_);
    if (pool->free_.size() < kKeep) pool->free_.push_back(std::move(back));
  });
}

void Link::Impl::Pump(Conn& c, const std::shared_ptr<Request>& r) {
  const int limit = stop_after.load(), window = test_window.load() > 0 ? test_window.load() : kWindow;
  while (r->inflight < window && r->next < r->size && (limit < 0 || r->sent < limit)) {
    const uint64_t off = r->next, n = std::min(kChunk, r->size - off);
    if (int ms = pace_ms.load(); ms > 0 && r->sent > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    auto buf = ChunkPool::Get(chunks);
    if (int e = PreadFull(r->src_fd, buf.get(), n, off); e != 0) {
      LOG_ERROR("replica link: replica {}: reading {} bytes at offset {} of its source: {}", r->key.Name(), n, off,
                e == EIO ? "it ends sooner (a new version written in place?) or cannot be read" : ErrStr(e));
      return Finish(r, Err(e));
    }
    if (r->hashing) r->hashing->Update(off, buf.get(), n);
    uint64_t h = ChunkHash(buf.get(), n);
    if (lie.load()) h ^= 1;
    if (off == 0 && repeat_first.load())
      Send(c, Msg{.op = Op::kChunk, .req = r->id, .a = off, .b = h}, buf.get(), n, buf);
    Send(c, Msg{.op = Op::kChunk, .req = r->id, .a = off, .b = h}, buf.get(), n, buf);
    bytes_out += n;
    r->next += n;
    r->inflight++;
    r->sent++;
  }
  if (r->next == r->size && r->inflight == 0 && !r->ended) {
    r->ended = true;
    Msg end{.op = Op::kEnd, .req = r->id};
    if (r->hashing) {
      std::tie(r->hash_hi, r->hash_lo) = r->hashing->Finish(r->size);
      end.c = r->hash_hi;
      end.d = r->hash_lo;
    }
    // The caller's turn before END: no HELD can come before it kept the
    // checksum. Its work (a metadata write, a look at the source) is done
    // on its thread, not this loop's, which serves every peer.
    if (r->sum_ready) {
      r->sum_told = true;
      r->sum_ready->set_value(true);
      return;
    }
    Send(c, end);
  }
}

void Link::Impl::EndAfterSum(const std::shared_ptr<Request>& r, bool kept) {
  if (r->finished) return;  // its deadline, its connection, the link's stop
  auto c = r->conn.lock();
  if (!c) return Finish(r, Err(ECONNRESET));
  if (!kept) {  // the holder gives its room back now, not at its idle sweep
    Send(*c, Msg{.op = Op::kAbort, .req = r->id});
    return Finish(r, Err(EIO));
  }
  r->deadline = Clock::now() + r->timeout;  // the caller's time is not the holder's
  Send(*c, Msg{.op = Op::kEnd, .req = r->id, .c = r->hash_hi, .d = r->hash_lo});
}

void Link::Impl::ClientMessage(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv) {
  if (c->st == Conn::St::kAwaitChallenge && m.op == Op::kChallenge) {
    if (test_saw_challenge) test_saw_challenge(m.text);
    if (m.text.size() != kNonceLen) {  // a daemon of another version (before 2: nonce ‖ id)
      peers_refused++;
      LOG_ERROR("replica link: {} speaks another version of the replica handshake: disconnected", c->addr);
      for (auto& r : c->waiting) Finish(r, Err(EPROTO));
      c->waiting.clear();
      return Close(c, true);
    }
    c->nonce_s = m.text;
    Send(*c,
         Msg{.op = Op::kProof, .text = HandshakeMac(opts.secret, "client", c->nonce_c, c->nonce_s, opts.node_id, "")});
    c->st = Conn::St::kAwaitReady;
    return;
  }
  if (c->st == Conn::St::kAwaitReady && m.op == Op::kReady) {
    // The holder proves it knows the secret too, and names itself: a
    // replica never goes to a listener that is not a member.
    const std::string id = m.text.size() > kMacLen ? m.text.substr(kMacLen) : "";
    const bool proved = SameMac(m.text.substr(0, kMacLen),
                                HandshakeMac(opts.secret, "holder", c->nonce_c, c->nonce_s, opts.node_id, id));
    if (!proved || !ValidNodeId(id) || id == opts.node_id) {
      peers_refused++;
      LOG_ERROR("replica link: {} failed the handshake: {}", c->addr,
                !proved ? "it does not hold this cluster's secret" : "it names itself '" + EscapeName(id) + "'");
      for (auto& r : c->waiting) Finish(r, Err(EACCES));
      c->waiting.clear();
      return Close(c, false);
    }
    c->peer_id = id;
    c->st = Conn::St::kReady;
    c->key = SessionKey(opts.secret, c->nonce_c, c->nonce_s, opts.node_id, c->peer_id);
    if (c->key.size() != kMacLen) return Close(c, true);  // (libcrypto failed: never unsealed)
    auto w = std::move(c->waiting);
    c->waiting.clear();
    for (auto& r : w)
      if (!r->finished) Begin(*c, r);
    return;
  }
  if (m.op == Op::kRefused && c->st != Conn::St::kReady) {  // the holder refused our proof
    for (auto& r : c->waiting) Finish(r, Err(EACCES));
    c->waiting.clear();
    return Close(c, false);
  }
  auto it = reqs.find(m.req);
  if (c->st != Conn::St::kReady || it == reqs.end() || it->second->conn.lock() != c) {
    if (data) ucp_am_data_release(worker, data);
    return;
  }
  auto r = it->second;
  if (!Answers(r->kind, m.op)) {  // a holder that answers a GET with HELD, a PUT with DROPPED...
    if (data) ucp_am_data_release(worker, data);
    LOG_ERROR("replica link: node {} ({}) answered a request with message {} that does not answer it: disconnected",
              c->peer_id, c->addr, static_cast<int>(m.op));
    Finish(r, Err(EPROTO));
    return Close(c, true);
  }
  switch (m.op) {
    // Progress moves the deadline: the PUT accepted (once), a chunk in
    // flight acknowledged. A repeated ACCEPTED or an ACK with nothing in
    // flight moves nothing: a holder that chatters does not keep a
    // replication alive for ever.
    case Op::kAccepted:
      if (r->accepted) return;
      r->accepted = true;
      r->deadline = Clock::now() + r->timeout;
      return Pump(*c, r);
    case Op::kAck:
      if (r->inflight > 0) {
        r->inflight--;
        r->deadline = Clock::now() + r->timeout;
      }
      return Pump(*c, r);
    case Op::kHeld: return Finish(r, r->size);
    case Op::kWait: return Finish(r, Err(EAGAIN));
    case Op::kRefused: return Finish(r, Err(m.a && m.a < 4096 ? static_cast<int>(m.a) : EIO));
    case Op::kDropped: return Finish(r, 0);
    case Op::kData: return ReceiveData(r, m, data, len, rndv);
    case Op::kElsewhere:
      if (r->kind != Op::kFetch || r->ask_op != Op::kFetch || !ValidNodeId(m.text)) return Finish(r, Err(EPROTO));
      r->elsewhere = m.text;
      return Finish(r, Err(EREMOTE));
    default: break;
  }
  if (data) ucp_am_data_release(worker, data);
}

void Link::Impl::ReceiveData(const std::shared_ptr<Request>& r, const Msg& m, void* data, size_t len, bool rndv) {
  // One kData answers a request: a second one, while the first may still
  // be landing in the request's buffer, is refused, never received.
  if ((r->kind != Op::kGet && r->kind != Op::kFetch) || len > r->len || r->receiving) {
    if (data) ucp_am_data_release(worker, data);
    return Finish(r, Err(EPROTO));
  }
  r->receiving = true;
  if (const int ms = stall_ms.exchange(0); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  // FetchAll's pieces land where the caller mapped them; the others in the request's buffer.
  char* dst = r->dst;
  if (!dst) {
    r->buf.resize(len);
    dst = r->buf.data();
  }
  const uint64_t want = m.b;
  auto check = [this, r, dst, len, want] {
    if (r->kind != Op::kFetch && ChunkHash(dst, len) != want) {  // a Fetch's is the whole file's
      chunks_refused++;
      LOG_ERROR("replica link: {} bytes of {} from a peer do not match their checksum", len,
                r->kind == Op::kFetch ? EscapeName(r->content.path) : r->key.Name());
      return Finish(r, Err(EBADMSG));
    }
    bytes_in += len;
    Finish(r, len);
  };
  if (!len) return check();
  if (!rndv) {
    std::memcpy(dst, data, len);
    ucp_am_data_release(worker, data);
    return check();
  }
  struct Ctx {
    Impl* impl;
    std::function<void(bool)> done;
  };
  auto* ctx = new Ctx{this, [r, check, this](bool ok) {
                        if (ok) check();
                        else Finish(r, Err(ECONNRESET));
                      }};
  RecvInto(data, dst, len, ctx, [](void* ud, bool ok) {
    std::shared_ptr<Ctx> x(static_cast<Ctx*>(ud));  // freed run or not (as in Chunk)
    x->impl->completions.push_back([x, ok] { x->done(ok); });
  });
}

void Link::Impl::RecvInto(void* desc, char* dst, size_t len, void* ud, void (*cb)(void*, bool)) {
  struct R {
    void* ud;
    void (*cb)(void*, bool);
  };
  auto* rr = new R{ud, cb};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = [](void* rq, ucs_status_t st, size_t, void* u) {
    auto* x = static_cast<R*>(u);
    x->cb(x->ud, st == UCS_OK);
    delete x;
    ucp_request_free(rq);
  };
  p.user_data = rr;
  ucs_status_ptr_t sp = ucp_am_recv_data_nbx(worker, desc, dst, len, &p);
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) {
    rr->cb(rr->ud, sp == nullptr);
    delete rr;
  }
}

bool Link::Impl::HandleArrived() {
  if (arrived.empty()) return false;
  auto batch = std::move(arrived);
  arrived.clear();
  for (auto& a : batch) {
    auto it = a.ep ? conns.find(a.ep) : conns.end();
    // A malformed message before the handshake passed closes the
    // connection; after it, it is dropped as a forged one (below).
    if (it == conns.end() || it->second->st == Conn::St::kClosed || (!a.msg && it->second->key.empty())) {
      if (a.data) ucp_am_data_release(worker, a.data);
      if (it != conns.end() && !a.msg) {
        if (it->second->holder_side) Refuse(it->second, "sent a malformed message");
        else Close(it->second, true);
      }
      continue;
    }
    auto c = it->second;
    // Sealed under the connection's key once it has one, and only then:
    // UCX names the endpoint from what the message itself carries, so the
    // handshake binds a message only through its tag. A forged one is
    // dropped, not the connection (its member did nothing wrong).
    if (!a.msg || (c->key.empty() ? !a.msg->tag.empty() : !SealedBy(*a.msg, c->key, c->holder_side ? 'c' : 'h'))) {
      if (a.data) ucp_am_data_release(worker, a.data);
      messages_refused++;
      if (!std::exchange(c->forged_logged, true))
        LOG_ERROR(
            "replica link: a message for the connection with node {} ({}) is not sealed with its key: dropped "
            "(forged, or a peer of another version); later ones are counted, not logged",
            c->peer_id.empty() ? "?" : c->peer_id, c->addr);
      continue;
    }
    if (c->holder_side) HolderMessage(c, *a.msg, a.data, a.len, a.rndv);
    else ClientMessage(c, *a.msg, a.data, a.len, a.rndv);
  }
  return true;
}

bool Link::Impl::HandleFailedEps() {
  if (failed_eps.empty()) return false;
  auto eps = std::move(failed_eps);
  failed_eps.clear();
  for (auto ep : eps) {
    auto it = conns.find(ep);
    if (it == conns.end()) continue;
    auto c = it->second;
    if (!c->rx.empty())
      LOG_WARN("replica link: node {} ({}) went away with {} replica(s) unfinished: discarded", c->peer_id, c->addr,
               c->rx.size());
    Close(c, true);
  }
  return true;
}

void Link::Impl::Sweep(Clock::time_point progressed) {
  const auto now = Clock::now();
  for (auto& [id, r] : std::map<uint64_t, std::shared_ptr<Request>>(reqs))
    if (now > r->deadline) {
      auto c = r->conn.lock();
      if (c && c->st != Conn::St::kReady && c->st != Conn::St::kClosed) {
        LOG_WARN("replica link: {} did not finish the handshake in time", c->addr);
        Close(c, true);
      }
      Finish(r, Err(ETIMEDOUT));
    }
  const auto idle = std::chrono::milliseconds(opts.timeout_ms);
  const auto handshake = std::chrono::milliseconds(std::min(opts.timeout_ms, opts.handshake_ms));
  for (auto& [ep, c] : std::unordered_map<ucp_ep_h, std::shared_ptr<Conn>>(conns)) {
    if (c->holder_side && c->st != Conn::St::kReady && c->st != Conn::St::kClosed && now - c->since > handshake) {
      Refuse(c, "did not finish the handshake in time");
      continue;
    }
    // An asker that stopped taking what it asked for (stopped, hung, or
    // never reading) holds its share of the serving memory (replica_serve.h)
    // while its sends are pending: forced closed, which cancels them.
    // Judged as of this turn's progress: a turn of the loop that took long
    // (a slow pread) does not count against the asker.
    if (c->sends->Stalled(progressed, idle)) {
      LOG_WARN("replica link: node {} ({}) took none of the {} bytes served to it for {} ms: disconnected", c->peer_id,
               c->addr, c->sends->sending(), opts.timeout_ms);
      Close(c, true);
      continue;
    }
    // A receive still pending holds the replica's room, its part file and
    // a chunk buffer until it completes, which it never does from a writer
    // that stopped (SIGSTOP, a hung disk) or a peer that never drives it:
    // the connection goes (forced), which cancels it.
    auto close_stuck = [&](const char* what) {
      LOG_WARN("replica link: node {} ({}) stalled in the middle of a chunk{}: disconnected", c->peer_id, c->addr,
               what);
      stalled_closed++;
      Close(c, true);
    };
    for (auto& [req, rx] : std::map<uint64_t, std::shared_ptr<Rx>>(c->rx)) {
      if (now - rx->last <= idle) continue;
      const bool stuck = rx->pending > 0;
      RefuseReplica(c, req, "no chunk came for " + std::to_string(opts.timeout_ms) + " ms");
      if (stuck) {
        close_stuck("");
        break;
      }
    }
    // As stuck: a replica refused while a chunk's receive was in flight,
    // which the peer never completed (a duplicate chunk, then nothing).
    if (c->st == Conn::St::kClosed) continue;
    std::erase_if(c->refused, [](const std::weak_ptr<Rx>& w) { return w.expired(); });
    for (const auto& w : c->refused)
      if (auto rx = w.lock(); rx && rx->pending > 0 && now - rx->last > idle) {
        close_stuck(" of a refused replica");
        break;
      }
  }
}

std::future<Result<uint64_t>> Link::Impl::Start(std::shared_ptr<Request> r, const std::string& peer,
                                                int64_t timeout_ms) {
  r->id = next_id++;
  r->timeout = std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : opts.timeout_ms);
  r->deadline = Clock::now() + r->timeout;
  auto fut = r->done.get_future();
  Post([this, r, peer] { StartRequest(r, peer); });
  return fut;
}

Result<uint64_t> Link::Impl::Call(std::shared_ptr<Request> r, const std::string& peer, int64_t timeout_ms) {
  return Start(std::move(r), peer, timeout_ms)
      .get();  // Loop finishes every request: by an answer, its deadline or shutdown
}

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::expected<std::unique_ptr<Link>, std::string> Link::Open(const Options& o, Store* store) {
  if (!ValidNodeId(o.node_id)) return std::unexpected("replica link: bad node id");
  if (o.secret.size() < kMinSecretLen) return std::unexpected("replica link: no cluster secret");
  if (!o.listen.empty() && !store) return std::unexpected("replica link: a listener needs a replica store");
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  impl->store = store;
  if (std::string w = impl->OpenWakeup(); !w.empty()) return std::unexpected(w);
  std::promise<std::string> ready;
  auto f = ready.get_future();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw, &ready] { raw->Loop(&ready); });
  std::string err = f.get();
  if (!err.empty()) {
    impl->thread.join();
    return std::unexpected(err);
  }
  if (o.serve)
    for (int i = 0; i < kServers; i++) impl->servers.emplace_back([raw] { raw->ServeLoop(); });
  return std::unique_ptr<Link>(new Link(std::move(impl)));
}

Link::~Link() {
  impl_->StopServers();  // they post to the loop: before it ends
  impl_->stop = true;
  uint64_t one = 1;
  (void)!write(impl_->evfd, &one, sizeof one);
  impl_->thread.join();
}

const std::string& Link::address() const { return impl_->address; }

Status Link::Replicate(const std::string& peer, const Key& k, int fd, uint64_t size, uint64_t gate_us, uint64_t hash_hi,
                       uint64_t hash_lo, const std::string& meta) {
  return Replicate(peer, k, fd, size, gate_us, &hash_hi, &hash_lo, meta);
}

Status Link::Replicate(const std::string& peer, const Key& k, int fd, uint64_t size, uint64_t gate_us,
                       uint64_t* hash_hi, uint64_t* hash_lo, const std::string& meta,
                       const std::function<bool(uint64_t, uint64_t)>& summed) {
  if (k.Name().size() + 1 + meta.size() > kMaxText) return Err(ENAMETOOLONG);
  auto r = std::make_shared<Request>();
  r->meta = meta;
  r->kind = Op::kPut;
  r->key = k;
  r->size = size;
  r->gate_us = gate_us;
  r->hash_hi = *hash_hi;
  r->hash_lo = *hash_lo;
  if ((r->hash_hi | r->hash_lo) == 0) {
    r->hashing = std::make_unique<backend::ContentHash>();
    if (!r->hashing->ok()) return Err(ENOMEM);
    if (summed) r->sum_ready.emplace();
  }
  if (size && (r->src_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) return ErrFromErrno();
  std::future<bool> sum_ready;
  if (r->sum_ready) sum_ready = r->sum_ready->get_future();
  auto done = impl_->Start(r, peer);
  // Every chunk acknowledged, END not sent: `summed` on this thread, then
  // END (or, not kept, the request fails EIO) on the loop's.
  if (sum_ready.valid() && sum_ready.get()) {
    const bool kept = summed(r->hash_hi, r->hash_lo);
    impl_->Post([impl = impl_.get(), r, kept] { impl->EndAfterSum(r, kept); });
  }
  auto res = done.get();
  if (!res) return Err(res.error());
  if (r->hashing && (r->hash_hi | r->hash_lo) != 0) {  // computed as the chunks went (not when HELD at once)
    *hash_hi = r->hash_hi;
    *hash_lo = r->hash_lo;
  }
  return {};
}

Result<size_t> Link::Read(const std::string& peer, const Key& k, uint64_t offset, void* buf, size_t len,
                          const std::string& incarnation) {
  auto r = std::make_shared<Request>();
  r->kind = Op::kGet;
  r->key = k;
  if (!incarnation.empty()) {
    auto id = IncarnationId(incarnation);
    if (!id) return Err(EINVAL);
    r->incarnation = *id;
  }
  r->offset = offset;
  r->len = std::min<uint64_t>(len, kMaxRead);
  auto res = impl_->Call(r, peer);
  if (!res) return Err(res.error());
  std::memcpy(buf, r->buf.data(), r->buf.size());
  return r->buf.size();
}

Status Link::Drop(const std::string& peer, const Key& k) {
  auto r = std::make_shared<Request>();
  r->kind = Op::kDrop;
  r->key = k;
  auto res = impl_->Call(r, peer);
  if (!res) return Err(res.error());
  return {};
}

Link::Counters Link::counters() const {
  return {impl_->peers_refused.load(),     impl_->chunks_refused.load(),   impl_->replicas_held.load(),
          impl_->bytes_in.load(),          impl_->bytes_out.load(),        impl_->loads_served.load(),
          impl_->load_bytes_served.load(), impl_->messages_refused.load(), impl_->stalled_closed.load(),
          impl_->crowded_closed.load()};
}

void Link::TestLieAboutChunks(bool on) { impl_->lie = on; }
void Link::TestStopAfterChunks(int n) { impl_->stop_after = n; }
void Link::TestPaceChunks(int ms) { impl_->pace_ms = ms; }
void Link::TestRepeatFirstChunk(bool on) { impl_->repeat_first = on; }
void Link::TestWindow(int n) { impl_->test_window = n; }
void Link::TestSilentDial(bool on) { impl_->silent_dial = on; }
void Link::TestForge(int how) { impl_->forge_how = how; }
void Link::TestStallOnData(int ms) { impl_->stall_ms = ms; }
void Link::TestOnChallenge(std::function<void(const std::string&)> f) { impl_->test_saw_challenge = std::move(f); }

}  // namespace ckpt::fs::replica
