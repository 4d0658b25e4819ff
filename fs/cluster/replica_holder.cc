// replica_holder.cc — the holder side of the replica link (see
// replica_link.h): the handshake as the one who listens, and PUT, CHUNK,
// END, DROP and GET from a member that passed it.
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "common/io.h"
#include "common/log.h"
#include "fs/cluster/cluster_types.h"
#include "fs/cluster/replica_link_impl.h"

namespace ckpt::fs::replica {

void Link::Impl::HolderMessage(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv) {
  if (c->st == Conn::St::kAwaitHello) {
    if (data) ucp_am_data_release(worker, data);
    if (m.op != Op::kHello || m.text.size() <= kNonceLen || !ValidNodeId(m.text.substr(kNonceLen)))
      return Refuse(c, "spoke before the handshake");
    c->nonce_c = m.text.substr(0, kNonceLen);
    c->peer_id = m.text.substr(kNonceLen);
    c->nonce_s = RandomNonce();
    // This holder's node id is told only to a member, in READY: anyone may
    // say HELLO, and a node id names a host.
    Send(*c, Msg{.op = Op::kChallenge, .text = c->nonce_s});
    c->st = Conn::St::kAwaitProof;
    return;
  }
  if (c->st == Conn::St::kAwaitProof) {
    if (data) ucp_am_data_release(worker, data);
    if (m.op != Op::kProof) return Refuse(c, "spoke before the handshake");
    if (!SameMac(m.text, HandshakeMac(opts.secret, "client", c->nonce_c, c->nonce_s, c->peer_id, "")))
      return Refuse(c, "failed the handshake: it does not hold this cluster's secret");
    // No member dials itself: a peer under this holder's own id would place
    // replicas its takeover never publishes nor collects (it skips its own),
    // whose gate its record then names for ever, holding every drain.
    // Refused only once it proved the secret: a refusal at HELLO would tell
    // anyone who guessed the holder's id that they had.
    if (c->peer_id == opts.node_id) return Refuse(c, "says it is this node (" + opts.node_id + ")");
    c->st = Conn::St::kReady;
    LOG_DEBUG("replica link: {} is node {}", c->addr, c->peer_id);
    Send(*c, Msg{.op = Op::kReady,
                 .text = HandshakeMac(opts.secret, "holder", c->nonce_c, c->nonce_s, c->peer_id, opts.node_id) +
                         opts.node_id});
    c->key = SessionKey(opts.secret, c->nonce_c, c->nonce_s, c->peer_id, opts.node_id);  // after READY, unsealed
    if (c->key.size() != kMacLen) return Close(c, true);  // (libcrypto failed: never unsealed)
    return AdmitNode(c);
  }
  if (c->st != Conn::St::kReady) {
    if (data) ucp_am_data_release(worker, data);
    return;
  }
  switch (m.op) {
    case Op::kPut: return Put(c, m);
    case Op::kChunk: return Chunk(c, m, data, len, rndv);
    case Op::kEnd: return End(c, m);
    case Op::kAbort:  // the writer's bytes are not to be held (sent again later): its room back now
      LOG_DEBUG("replica link: replica {} given up by node {} before its end", Discard(c, m.req), c->peer_id);
      return;
    case Op::kDrop: return DropReplica(c, m);
    case Op::kGet: return Get(c, m);
    case Op::kFetch:
    case Op::kFetchDirect:
    case Op::kFetchRelay: return Fetch(c, m);
    default: break;
  }
  if (data) ucp_am_data_release(worker, data);
}

void Link::Impl::Reply(Conn& c, uint64_t req, Op op, uint64_t a, std::string text) {
  Send(c, Msg{.op = op, .req = req, .a = a, .text = std::move(text)});
}

std::optional<Key> Link::Impl::OwnKey(Conn& c, const Msg& m) {
  auto k = Key::Parse(m.text);
  if (!k || k->writer != c.peer_id) {
    LOG_ERROR("replica link: node {} ({}) named replica '{}', not one of its own: refused", c.peer_id, c.addr,
              m.text.substr(0, 80));
    Reply(c, m.req, Op::kRefused, EPERM);
    return std::nullopt;
  }
  return k;
}

void Link::Impl::Put(const std::shared_ptr<Conn>& c, const Msg& m0) {
  Msg m = m0;  // text: key '\n' meta
  std::string meta;
  if (size_t nl = m.text.find('\n'); nl != std::string::npos) {
    meta = m.text.substr(nl + 1);
    m.text.resize(nl);
  }
  auto k = OwnKey(*c, m);
  if (!k) return;
  if (!store) return Reply(*c, m.req, Op::kRefused, EOPNOTSUPP);
  if (c->rx.count(m.req)) return Reply(*c, m.req, Op::kRefused, EEXIST);
  // Each replica being received holds a part file open: a node that
  // starts many and sends nothing is told to wait, as a full holder does,
  // whatever connections it started them on. So does one refused while a
  // chunk's receive was in flight (it holds the room and part file until
  // the receive ends).
  size_t open = 0;
  for (const auto& [ep, o] : conns)
    if (o->holder_side && o->st == Conn::St::kReady && o->peer_id == c->peer_id) {
      std::erase_if(o->refused, [](const std::weak_ptr<Rx>& w) { return w.expired(); });
      open += o->rx.size() + o->refused.size();
    }
  if (open >= kMaxIncomingPerNode) return Reply(*c, m.req, Op::kWait);
  auto in = store->Begin(Held{.key = *k, .size = m.a, .gate_us = m.b, .hash_hi = m.c, .hash_lo = m.d, .meta = meta});
  if (!in) {
    if (in.error() == EEXIST) return Reply(*c, m.req, Op::kHeld, m.a);
    if (in.error() == ESTALE)
      LOG_ERROR(
          "replica link: node {} ({}) offered replica {}, but one of that name with other bytes is held here: "
          "refused (a node that reused its id with a new state dir?)",
          c->peer_id, c->addr, k->Name());
    if (in.error() == EAGAIN) return Reply(*c, m.req, Op::kWait);
    return Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(in.error()));
  }
  auto rx = std::make_shared<Rx>();
  rx->got.assign((m.a + kChunk - 1) / kChunk, false);
  rx->claimed = rx->got;
  rx->in = std::move(*in);
  rx->last = Clock::now();
  c->rx[m.req] = rx;
  Reply(*c, m.req, Op::kAccepted);
}

void Link::Impl::RefuseReplica(const std::shared_ptr<Conn>& c, uint64_t req, const std::string& why, int err) {
  const std::string name = Discard(c, req);
  if (err == EBADMSG) chunks_refused++;  // the peer's bytes, not this holder's trouble
  LOG_ERROR("replica link: replica {} from node {} ({}) refused: {}", name, c->peer_id, c->addr, why);
  Reply(*c, req, Op::kRefused, static_cast<uint64_t>(err), why);
}

std::string Link::Impl::Discard(const std::shared_ptr<Conn>& c, uint64_t req) {
  auto it = c->rx.find(req);
  std::string name = it != c->rx.end() ? it->second->in->held().key.Name() : "?";
  if (it != c->rx.end()) {
    it->second->failed = true;
    // A receive still in flight keeps the replica (its room, part file and
    // a chunk buffer) until it ends: from a peer that never drives it, not
    // before the idle sweep closes the connection (replica_link.cc).
    // Judged from now, and from each of its receives that ends: by "none
    // of them moved for the idle time", as a live replica is.
    if (it->second->pending > 0) {
      it->second->last = Clock::now();
      c->refused.push_back(it->second);
    }
    c->rx.erase(it);
  }
  return name;
}

void Link::Impl::Chunk(const std::shared_ptr<Conn>& c, const Msg& m, void* data, size_t len, bool rndv) {
  auto it = c->rx.find(m.req);
  if (it == c->rx.end()) {  // refused or timed out already
    if (data) ucp_am_data_release(worker, data);
    return;
  }
  auto rx = it->second;
  const uint64_t size = rx->in->held().size, off = m.a;
  const uint64_t idx = off / kChunk;
  if (off % kChunk || off >= size || len != std::min(kChunk, size - off) || rx->claimed[idx]) {
    if (data) ucp_am_data_release(worker, data);
    return RefuseReplica(
        c, m.req,
        "a chunk at offset " + std::to_string(off) + " of " + std::to_string(len) + " bytes does not fit the replica");
  }
  // At most the window in flight (claimed, not landed): a writer keeps to
  // it (its next chunk goes once this holder acknowledged one, after the
  // landing). Past it, each chunk's header took a 4 MiB buffer here,
  // bounded by nothing but the replica's size.
  if (rx->chunks_claimed - rx->chunks_got >= static_cast<uint64_t>(kWindow)) {
    if (data) ucp_am_data_release(worker, data);
    return RefuseReplica(c, m.req, "more than " + std::to_string(kWindow) + " chunks in flight", EPROTO);
  }
  rx->claimed[idx] = true;
  rx->chunks_claimed++;
  rx->last = Clock::now();
  const uint64_t want = m.b, req = m.req;
  std::weak_ptr<Conn> wc = c;
  // `p`: the chunk's bytes (a buffer of the pool, or UCX's own for an eager
  // message), checked, written to the replica's file, and hashed for the
  // content checksum when it is the next one in order.
  auto landed = [this, rx, wc, req, off, len, want, idx](bool ok, const char* p) {
    auto conn = wc.lock();
    if (rx->failed || !conn || conn->st == Conn::St::kClosed) return;
    if (!ok) return RefuseReplica(conn, req, "a chunk did not arrive");
    if (ChunkHash(p, len) != want)
      return RefuseReplica(conn, req, "the chunk at offset " + std::to_string(off) + " does not match its checksum");
    if (int e = rx->in->Write(off, p, len); e != 0) return RefuseReplica(conn, req, "writing it: " + ErrStr(e), e);
    rx->got[idx] = true;
    rx->chunks_got++;
    if (idx == rx->hashed) {
      rx->hash.Update(off, p, len);
      rx->hashed++;
    }
    if (int e = HashLanded(*rx); e != 0) return RefuseReplica(conn, req, "reading it back: " + ErrStr(e), e);
    rx->last = Clock::now();
    bytes_in += len;
    Reply(*conn, req, Op::kAck, off);
    if (rx->ended) End(conn, Msg{.op = Op::kEnd, .req = req});
  };
  if (!rndv) {
    landed(true, static_cast<const char*>(data));
    ucp_am_data_release(worker, data);
    return;
  }
  struct Ctx {
    Impl* impl;
    std::shared_ptr<Rx> rx;
    std::shared_ptr<char> buf;
    std::function<void(bool, const char*)> done;
  };
  rx->pending++;
  auto* ctx = new Ctx{this, rx, ChunkPool::Get(chunks), landed};
  RecvInto(data, ctx->buf.get(), len, ctx, [](void* ud, bool ok) {
    // Owned by the completion, run or not: one that UCX calls back during
    // Teardown (the worker's destroy cancels it) is discarded unrun, and
    // frees its buffer and Rx then (a leak under LeakSanitizer, stop 65).
    std::shared_ptr<Ctx> x(static_cast<Ctx*>(ud));
    x->impl->completions.push_back([x, ok] {
      x->rx->pending--;
      x->rx->last = Clock::now();  // a refused replica's receives, too (the idle sweep)
      x->done(ok, x->buf.get());  // the last holder of a failed Rx discards it with x
    });
  });
}

// Chunks that landed before the one in front of them join the content
// checksum once it came, read back from the replica's file (rare: UCX
// mostly completes one connection's receives in order).
int Link::Impl::HashLanded(Rx& rx) {
  const uint64_t total = rx.in->held().size;
  std::shared_ptr<char> buf;
  while (rx.hashed < rx.got.size() && rx.got[rx.hashed]) {
    const uint64_t o = rx.hashed * kChunk, n = std::min(kChunk, total - o);
    if (!buf) buf = ChunkPool::Get(chunks);
    if (int e = rx.in->Read(o, buf.get(), n); e != 0) return e;
    rx.hash.Update(o, buf.get(), n);
    rx.hashed++;
  }
  return 0;
}

void Link::Impl::End(const std::shared_ptr<Conn>& c, const Msg& m) {
  auto it = c->rx.find(m.req);
  if (it == c->rx.end()) return;
  auto rx = it->second;
  rx->ended = true;
  if ((m.c | m.d) != 0) rx->end_sum = std::make_pair(m.c, m.d);  // the writer hashed as it sent
  if (rx->pending > 0 || rx->chunks_got < rx->got.size()) {
    if (rx->pending == 0) RefuseReplica(c, m.req, "ended with chunks missing");
    return;  // the last chunk's landing ends it
  }
  c->rx.erase(it);
  const Held h = rx->in->held();
  if (!rx->hash.ok()) return RefuseReplica(c, m.req, "out of memory");
  const auto landed = rx->hash.Finish(h.size);
  auto st = store->Commit(std::move(rx->in), landed, rx->end_sum);
  if (!st) {
    chunks_refused++;
    LOG_ERROR("replica link: replica {} from node {} ({}) refused: {}", h.key.Name(), c->peer_id, c->addr,
              st.error() == EBADMSG ? "its bytes do not match the writer's content checksum" : ErrStr(st.error()));
    return Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(st.error()));
  }
  replicas_held++;
  LOG_DEBUG("replica link: holding {} ({} bytes) for node {}", h.key.Name(), h.size, c->peer_id);
  Reply(*c, m.req, Op::kHeld, h.size);
}

void Link::Impl::DropReplica(const std::shared_ptr<Conn>& c, const Msg& m) {
  auto k = OwnKey(*c, m);
  if (!k) return;
  auto st = store ? store->DropForWriter(*k) : Status(Err(ENOENT));
  if (st) Reply(*c, m.req, Op::kDropped);
  else Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(st.error()));
}

// A node's bounds are its id's, not a connection's (a member may open any
// number once through the handshake): its connections share one serving
// share, and past kMaxConnsPerNode its oldest is closed. The newest wins:
// a node that reconnects holds it, and this holder may not yet have seen
// the old one go.
void Link::Impl::AdmitNode(const std::shared_ptr<Conn>& c) {
  std::vector<std::shared_ptr<Conn>> same;
  for (const auto& [ep, o] : conns)
    if (o != c && o->holder_side && o->st == Conn::St::kReady && o->peer_id == c->peer_id) same.push_back(o);
  if (same.empty()) return;
  c->share = same.front()->share;
  if (same.size() < kMaxConnsPerNode) return;
  // The oldest with nothing in flight (no replica open, nothing being
  // served), else the oldest: a live writer's transfer is spared.
  auto busy = [](const std::shared_ptr<Conn>& o) {
    std::erase_if(o->refused, [](const std::weak_ptr<Rx>& w) { return w.expired(); });
    return !o->rx.empty() || !o->refused.empty() || o->sends->sending() > 0;
  };
  auto oldest = *std::min_element(same.begin(), same.end(), [&](const auto& a, const auto& b) {
    return std::make_pair(busy(a), a->since) < std::make_pair(busy(b), b->since);
  });
  crowded_closed++;
  if (refuse_log.Take())
    LOG_WARN("replica link: node {} opened a connection past its {} here: its oldest ({}) closed", c->peer_id,
             kMaxConnsPerNode, oldest->addr);
  Close(oldest, true);
}

// A connection to the listener: taken in for its handshake, within the bounds.
bool Link::Impl::Accept() {
  if (conn_requests.empty()) return false;
  auto reqs_now = std::move(conn_requests);
  conn_requests.clear();
  // In their handshake, in all, per source address and per IPv6 /64
  // (HandshakePrefix). Conn::addr is "connection from HOST:PORT": the host
  // is between "from " and the last colon; "" for a peer whose address UCX
  // could not tell, bounded only in all.
  auto host_of = [](const std::string& addr) {
    const size_t colon = addr.rfind(':');
    if (colon == std::string::npos) return std::string();
    const size_t from = addr.rfind(' ', colon) + 1;  // npos + 1: the whole
    return addr.substr(from, colon - from);
  };
  HandshakeCount count(opts.max_handshakes, opts.max_handshakes_per_host, opts.max_handshakes_per_prefix);
  for (const auto& [ep, c] : conns)
    if (c->holder_side && (c->st == Conn::St::kAwaitHello || c->st == Conn::St::kAwaitProof))
      count.Add(host_of(c->addr));
  for (auto* r : reqs_now) {
    ucp_conn_request_attr_t ra{};
    ra.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string from = "an unnamed peer";
    if (ucp_conn_request_query(r, &ra) == UCS_OK) {
      char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
      if (getnameinfo(reinterpret_cast<sockaddr*>(&ra.client_address), sizeof ra.client_address, host, sizeof host,
                      port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
        from = std::string(host) + ":" + port;
    }
    const std::string addr = "connection from " + from, host = host_of(addr);
    if (const auto past = count.Admit(host)) {
      // Logged once per burst and reason (all, that host, its /64): the
      // first rejection after one went through.
      if (rejecting.insert(past->who).second) {
        if (past->who.empty()) LOG_WARN("replica link: {} connections are in their handshake: rejecting more", past->n);
        else
          LOG_WARN("replica link: {} connections from {} are in their handshake: rejecting more from it", past->n,
                   past->who);
      }
      peers_refused++;
      ucp_listener_reject(listener, r);
      continue;
    }
    rejecting.erase("");
    rejecting.erase(host);
    rejecting.erase(HandshakePrefix(host));
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = r;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::OnEpError;
    ep.err_handler.arg = this;
    auto c = std::make_shared<Conn>();
    c->holder_side = true;
    c->st = Conn::St::kAwaitHello;
    c->addr = addr;
    c->since = Clock::now();
    ucs_status_t st = ucp_ep_create(worker, &ep, &c->ep);
    if (st != UCS_OK) {
      LOG_WARN("replica link: cannot accept a {}: {}", c->addr, ucs_status_string(st));
      continue;
    }
    conns[c->ep] = c;
  }
  return true;
}

void Link::Impl::Get(const std::shared_ptr<Conn>& c, const Msg& m) {
  // A writer reads back its own replicas only (a restart's restore): the
  // others' bytes, by guessable inode and version, are not for it (loads
  // from peers ask by content checksum: Fetch).
  auto k = OwnKey(*c, m);
  if (!k) return;
  auto h = store ? store->OpenHeld(*k) : Result<std::pair<int, Held>>(Err(ENOENT));
  if (!h) return Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(h.error()));
  const auto [fd, held] = *h;
  // Asked for one run's copy: another run's (a replacement under the
  // writer's id put its own version of this key) is not it.
  if (m.c != 0) {
    auto meta = DecodeMeta(held.meta);
    if (meta && !SameIncarnation(meta->incarnation, IncarnationText(m.c))) {
      close(fd);
      return Reply(*c, m.req, Op::kRefused, ESTALE);
    }
  }
  const uint64_t off = std::min(m.a, held.size), n = std::min({m.b, kMaxRead, held.size - off});
  if (n && (*get_bytes + n > kServeBytes || c->share->Full(n))) {
    close(fd);
    return Reply(*c, m.req, Op::kRefused, EAGAIN);
  }
  *get_bytes += n;
  std::shared_ptr<std::string> buf(new std::string(n, '\0'),
                                   [this, counter = get_bytes, n, hold = c->share->Hold(n)](std::string* b) mutable {
                                     *counter -= n;
                                     delete b;
                                     hold.reset();
                                     MutexLock l(&serve_mu);  // a load of this asker's may wait for its share
                                     serve_cv.NotifyAll();
                                   });
  ssize_t got = n ? pread(fd, buf->data(), n, static_cast<off_t>(off)) : 0;
  const int e = errno;
  close(fd);
  if (got < 0) return Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(e));
  buf->resize(static_cast<size_t>(got));
  bytes_out += buf->size();
  Msg d{.op = Op::kData, .req = m.req, .a = off, .b = ChunkHash(buf->data(), buf->size())};
  if (buf->empty()) return Send(*c, d);
  SendServed(*c, d, buf->data(), buf->size(), buf);
}

void Link::Impl::SendServed(Conn& c, const Msg& m, const char* data, uint64_t n, std::shared_ptr<const void> buf) {
  // The bytes, and the asker's count of bytes sending, held until UCX is done with them.
  auto keep = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<void>>>(std::move(buf),
                                                                                              c.sends->Sending(n));
  Send(c, m, data, n, std::move(keep));
}

// A load: queued for the serving threads (the source may block on a fetch
// from the backend), answered from the loop once read.
void Link::Impl::Fetch(const std::shared_ptr<Conn>& c, const Msg& m) {
  auto content = Content::FromText(m.text, m.c, m.d);
  if (!content) return Reply(*c, m.req, Op::kRefused, EINVAL);
  const Link::Ask ask = m.op == Op::kFetch         ? Link::Ask::kHome
                        : m.op == Op::kFetchDirect ? Link::Ask::kDirect
                                                   : Link::Ask::kRelay;
  int err = 0;
  {
    MutexLock l(&serve_mu);  // the reply goes after it: a send's completion may take it
    // Bounded, and one asker's part of it too: past either the asker goes elsewhere.
    const auto mine =
        std::count_if(serve_q.begin(), serve_q.end(), [&](const ServeJob& j) { return j.share == c->share; });
    if (serve_stop || servers.empty()) err = ENOENT;
    else if (serve_q.size() >= kServeQueued || static_cast<size_t>(mine) >= kServeQueuedPerAsker) err = EAGAIN;
    else
      serve_q.push_back(ServeJob{c, c->share, nullptr, m.req, std::move(*content), m.a,
                                 std::min<uint64_t>(m.b, Link::kFetchPiece), ask, c->peer_id});
    serve_cv.NotifyAll();  // NotifyOne could wake a server that cannot take it (its asker's share full)
  }
  if (err) Reply(*c, m.req, Op::kRefused, static_cast<uint64_t>(err));
}

// The first queued load whose asker's share has room for it, its share
// taken; nullopt once the servers stop. Loads of askers gone are dropped.
std::optional<Link::Impl::ServeJob> Link::Impl::NextServeJob() {
  MutexLock l(&serve_mu);
  for (;;) {
    if (serve_stop) return std::nullopt;
    for (auto it = serve_q.begin(); it != serve_q.end();) {
      if (it->conn.expired()) {
        it = serve_q.erase(it);
        continue;
      }
      if (!it->share->Full(it->len)) {
        ServeJob j = std::move(*it);
        serve_q.erase(it);
        j.hold = j.share->Hold(j.len);
        return j;
      }
      ++it;
    }
    serve_cv.Wait(&serve_mu);
  }
}

void Link::Impl::ServeLoop() {
  for (;;) {
    std::optional<ServeJob> next = NextServeJob();
    if (!next) return;
    ServeJob j = std::move(*next);
    // Read with pread, not mapped: a source truncated meanwhile (a new
    // version written in place) gives a short read here, where a mapping
    // would give SIGBUS. No hash per piece: the asker checks the whole
    // file's content checksum.
    int err = 0;
    std::shared_ptr<char[]> buf;
    uint64_t n = 0;
    auto fd = opts.serve(j.content, j.asker, j.ask);
    if (fd && fd->fd < 0) {  // another member to ask; a kHome ask only
      if (fd->elsewhere.empty() || j.ask != Link::Ask::kHome) {
        err = ENOENT;
      } else {
        Post([this, wc = j.conn, req = j.req, to = std::move(fd->elsewhere)]() mutable {
          if (auto c = wc.lock(); c && c->st == Conn::St::kReady) Reply(*c, req, Op::kElsewhere, 0, std::move(to));
        });
        continue;
      }
    } else if (!fd) {
      err = fd.error();
    } else {
      const uint64_t off = std::min(j.offset, j.content.size);
      n = std::min(j.len, j.content.size - off);
      // Bounded: the pieces read and not yet sent (an asker that does not
      // read its socket holds them) make this thread wait, not the memory grow.
      {
        MutexLock l(&serve_mu);
        while (!serve_stop && serve_bytes > 0 && serve_bytes + n > kServeBytes) serve_cv.Wait(&serve_mu);
        if (serve_stop) {
          close(fd->fd);
          return;
        }
        serve_bytes += n;
      }
      buf = std::shared_ptr<char[]>(new char[std::max<uint64_t>(n, 1)], [this, n, hold = j.hold](char* p) mutable {
        delete[] p;
        hold.reset();
        MutexLock l(&serve_mu);
        serve_bytes -= n;
        serve_cv.NotifyAll();
      });
      if (int e = PreadFull(fd->fd, buf.get(), n, off)) err = e;  // EIO when it ends early
      close(fd->fd);
    }
    const uint64_t off = j.offset;
    Post([this, wc = j.conn, req = j.req, off, err, n, buf = std::move(buf)]() mutable {
      auto c = wc.lock();
      if (!c || c->st != Conn::St::kReady) return;
      if (err) return Reply(*c, req, Op::kRefused, static_cast<uint64_t>(err));
      loads_served++;
      load_bytes_served += n;
      bytes_out += n;
      const char* data = buf.get();
      SendServed(*c, Msg{.op = Op::kData, .req = req, .a = off}, data, n, std::move(buf));
    });
  }
}

void Link::Impl::StopServers() {
  {
    MutexLock l(&serve_mu);
    serve_stop = true;
    serve_cv.NotifyAll();
  }
  for (auto& t : servers) t.join();
  servers.clear();
}

}  // namespace ckpt::fs::replica
