// replica_fetch.cc — the asker's side of a load from a member
// (Link::FetchAll, replica_link.h): pieces in flight, each landing straight
// from the transport into a buffer of the call's. Apart from replica_link.cc
// (the loop, the requests, the writer's side of a replica) to keep each
// file readable (docs/style.md: 900 lines).
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "fs/cluster/replica_link.h"
#include "fs/cluster/replica_link_impl.h"

namespace ckpt::fs::replica {

Status Link::FetchAll(const std::string& peer, const Content& c, int64_t first_timeout_ms,
                      const std::function<Status(uint64_t, const char*, size_t)>& landed, Ask ask,
                      std::string* elsewhere) {
  if (c.Text().size() > kMaxText) return Err(ENAMETOOLONG);
  const Op op = ask == Ask::kHome ? Op::kFetch : ask == Ask::kDirect ? Op::kFetchDirect : Op::kFetchRelay;
  struct Piece {
    std::shared_ptr<Request> r;
    std::future<Result<uint64_t>> done;
    std::shared_ptr<char[]> buf;  // also held by the request while its receive may land
  };
  std::deque<Piece> q;
  // Buffers of landed pieces, used again: faulted in once per load, not per piece.
  std::vector<std::shared_ptr<char[]>> spare;
  uint64_t next = 0;
  auto start = [&] {
    auto r = std::make_shared<Request>();
    r->kind = Op::kFetch;
    r->ask_op = op;
    r->content = c;
    r->offset = next;
    r->len = std::min<uint64_t>(kFetchPiece, c.size - next);
    std::shared_ptr<char[]> buf;
    if (!spare.empty()) {
      buf = std::move(spare.back());
      spare.pop_back();
    } else {
      buf.reset(new char[kFetchPiece]);
    }
    r->dst = buf.get();
    r->dst_keep = buf;
    next += r->len;
    auto f = impl_->Start(r, peer, next == r->len ? first_timeout_ms : 0);
    q.push_back(Piece{std::move(r), std::move(f), std::move(buf)});
  };
  while (next < c.size && q.size() < kFetchDepth) start();
  while (!q.empty()) {
    Piece p = std::move(q.front());
    q.pop_front();
    auto res = p.done.get();
    if (!res && res.error() == EREMOTE && elsewhere) *elsewhere = p.r->elsewhere;
    if (!res) return Err(res.error());
    if (*res != p.r->len) return Err(EIO);  // shorter than the asker was told
    if (auto st = landed(p.r->offset, p.buf.get(), p.r->len); !st) return st;
    spare.push_back(std::move(p.buf));  // its receive is over: answered
    if (next < c.size) start();
  }
  return {};
}

}  // namespace ckpt::fs::replica
