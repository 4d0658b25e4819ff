// failpoint.cc — see failpoint.h.
#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "common/log.h"

namespace ckpt {

namespace failpoint_detail {

const char* armed = nullptr;

namespace {
std::string name_;
long at_ = 1;
std::atomic<long> hits_{0};
}  // namespace

void Hit(std::string_view name) {
  if (name != name_) return;
  if (hits_.fetch_add(1) + 1 != at_) return;
  LOG_ERROR("failpoint {} reached (hit {}): killing the daemon", name, at_);
  spdlog::default_logger()->flush();
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

}  // namespace failpoint_detail

void InitFailpoints() {
  const char* v = getenv("CKPTFS_FAILPOINT");
  if (!v || !*v) return;
  std::string s(v);
  if (auto at = s.find('@'); at != std::string::npos) {
    failpoint_detail::at_ = std::max(1L, atol(s.c_str() + at + 1));
    s.resize(at);
  }
  failpoint_detail::name_ = s;
  failpoint_detail::armed = failpoint_detail::name_.c_str();
}

}  // namespace ckpt
