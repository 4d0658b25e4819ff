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
const char* fault_armed = nullptr;

namespace {
std::string name_;
long at_ = 1;
std::atomic<long> hits_{0};
std::string fault_name_, fault_file_;
std::atomic<bool> fault_logged_{false};
}  // namespace

void Hit(std::string_view name) {
  if (name != name_) return;
  if (hits_.fetch_add(1) + 1 != at_) return;
  LOG_ERROR("failpoint {} reached (hit {}): killing the daemon", name, at_);
  spdlog::default_logger()->flush();
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

bool FaultOn(std::string_view name) {
  // fault_name_: one name, or several separated by commas.
  bool named = false;
  for (std::string_view rest = fault_name_; !named && !rest.empty();) {
    const size_t comma = rest.find(',');
    named = rest.substr(0, comma) == name;
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  if (!named || access(fault_file_.c_str(), F_OK) != 0) return false;
  if (!fault_logged_.exchange(true)) LOG_WARN("fault {} on ({} exists): failing", name, fault_file_);
  return true;
}

}  // namespace failpoint_detail

void InitFailpoints() {
  if (const char* f = getenv("CKPTFS_FAULT"); f && *f) {
    std::string s(f);
    if (auto colon = s.find(':'); colon != std::string::npos) {
      failpoint_detail::fault_name_ = s.substr(0, colon);
      failpoint_detail::fault_file_ = s.substr(colon + 1);
      failpoint_detail::fault_armed = failpoint_detail::fault_name_.c_str();
    }
  }
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
