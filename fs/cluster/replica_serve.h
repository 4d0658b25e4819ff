// replica_serve.h — what a member serving loads to other members
// (Link::Options::serve, and GET reads of replicas) lends each asker of
// its memory, so that one asker that stops taking its bytes (stopped,
// hung, or hostile) can hold neither all of it nor any of it for long.
//
// Every piece read for an asker is held, from the read until the transport
// is done with it, against two bounds: the holder's (kServeBytes for
// loads, as much again for GETs, shared by every asker) and the asker's
// share (kServeShare: one load's pieces in flight, a quarter of it; one
// share per node id, over all its connections). A piece handed to the
// transport is also counted as sending on its connection's own
// ServeShare, with the time that connection's sends last moved:
// Link::Impl::Sweep disconnects a connection whose sends have not moved
// for the link's idle time, which cancels them and gives their memory
// back. (The clock is per connection: a node's new connection does not
// inherit an old one's stall, nor keep a stuck one open.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

namespace ckpt::fs::replica {

inline constexpr uint64_t kServeBytes = 128ull << 20;     // read for askers and not yet sent, all askers
inline constexpr uint64_t kServeShare =
    kServeBytes / 4;  // of which one asker (a node id, all its connections) may hold
inline constexpr size_t kServeQueued = 1024;              // loads queued, all askers
inline constexpr size_t kServeQueuedPerAsker = 64;        // of which one asker's

class ServeShare : public std::enable_shared_from_this<ServeShare> {
 public:
  using Clock = std::chrono::steady_clock;

  // Whether `n` more bytes would take this asker past its share (one piece
  // is always allowed while it holds nothing).
  bool Full(uint64_t n) const {
    const uint64_t h = held_.load();
    return h > 0 && h + n > kServeShare;
  }
  // `n` bytes held for this asker until the returned token goes (from any
  // thread).
  std::shared_ptr<void> Hold(uint64_t n);
  // `n` bytes handed to the transport until the returned token goes (when
  // the send is over: done, failed or cancelled).
  std::shared_ptr<void> Sending(uint64_t n);
  // Sends outstanding and none of them done for `idle`.
  bool Stalled(Clock::time_point now, Clock::duration idle) const;
  uint64_t held() const { return held_.load(); }
  uint64_t sending() const { return sending_.load(); }

 private:
  void Moved() { moved_ = Clock::now().time_since_epoch().count(); }
  std::atomic<uint64_t> held_{0}, sending_{0};
  std::atomic<Clock::rep> moved_{0};
};

}  // namespace ckpt::fs::replica
