// replica_serve.cc — an asker's share of what a member serves (replica_serve.h).
#include "fs/cluster/replica_serve.h"

namespace ckpt::fs::replica {

namespace {

// Runs `fn` when the last copy of the returned pointer goes.
template <class Fn>
std::shared_ptr<void> OnRelease(Fn fn) {
  return std::shared_ptr<void>(nullptr, [fn = std::move(fn)](void*) mutable { fn(); });
}

}  // namespace

std::shared_ptr<void> ServeShare::Hold(uint64_t n) {
  held_ += n;
  return OnRelease([self = shared_from_this(), n] { self->held_ -= n; });
}

std::shared_ptr<void> ServeShare::Sending(uint64_t n) {
  // The clock of a stall starts when the first send goes out, not at the
  // last one done long ago.
  if (sending_.load() == 0) Moved();
  sending_ += n;
  return OnRelease([self = shared_from_this(), n] {
    self->Moved();
    self->sending_ -= n;
  });
}

bool ServeShare::Stalled(Clock::time_point now, Clock::duration idle) const {
  if (sending_.load() == 0) return false;
  return now - Clock::time_point(Clock::duration(moved_.load())) > idle;
}

}  // namespace ckpt::fs::replica
