// log.h — spdlog set-up for the daemon and the control commands.
//
// The daemon logs to <state-dir>/ckptfs.log (and stderr when --foreground).
// One line per error, naming the inode or path; credentials are never logged.
// The log file is opened by OpenLogFile (never through a symlink) and
// written through that descriptor.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "common/result.h"

namespace ckpt {

// Returns false (with a message in *err) if the level name is unknown.
bool ValidLogLevel(const std::string& level);

// Opens `file` for appending: O_NOFOLLOW | O_CLOEXEC, created 0600, an
// existing one chmod-ed to 0600. Errors: ELOOP when `file` is a symbolic
// link; EPERM when it is not a regular file, has other hard links or
// belongs to another user; else open's errno.
[[nodiscard]] Result<int> OpenLogFile(const std::string& file);

// Installs the default logger. `file` may be empty (stderr only); else it
// is opened with OpenLogFile and its errors returned.
Status InitLogging(const std::string& file, const std::string& level, bool to_stderr);

// At most `n` lines of one kind per `window`, for lines anyone can cause
// (a stranger failing a handshake on purpose must not fill the state dir's
// disk with the log). Not thread-safe: one per thread or lock.
class LogBudget {
 public:
  LogBudget(int n, std::chrono::steady_clock::duration window) : n_(n), window_(window) {}
  // True: log this line; held() then says how many were held back before
  // it (and clears that count).
  bool Take(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    if (now - start_ >= window_) {
      start_ = now;
      used_ = 0;
    }
    if (used_ >= n_) {
      held_++;
      return false;
    }
    used_++;
    return true;
  }
  uint64_t held() { return std::exchange(held_, 0); }

 private:
  int n_, used_ = 0;
  std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point start_{};
  uint64_t held_ = 0;
};

}  // namespace ckpt

#define LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define LOG_INFO(...) spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) spdlog::error(__VA_ARGS__)
