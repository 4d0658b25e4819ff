// log.cc — spdlog set-up.
//
// The log file is opened here, not by spdlog's file sink (which opens by
// name and follows symlinks): O_NOFOLLOW | O_CLOEXEC | O_APPEND, created
// 0600, and checked on the descriptor itself (a regular file of ours with
// one link), so a ckptfs.log planted as a symlink or hard link to another
// file never makes the daemon append to that file. FdSink then writes to
// that descriptor.
#include "common/log.h"

#include <fcntl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <vector>

namespace ckpt {
namespace {

// A sink writing each formatted line to a descriptor it owns, with one
// write(2) per line (O_APPEND keeps lines whole).
class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FdSink(int fd) : fd_(fd) {}
  ~FdSink() override { close(fd_); }
  FdSink(const FdSink&) = delete;
  FdSink& operator=(const FdSink&) = delete;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    const char* p = buf.data();
    size_t n = buf.size();
    while (n > 0) {
      ssize_t w = write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        return;  // nowhere to report a failing log
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void flush_() override {}

 private:
  int fd_;
};

}  // namespace

bool ValidLogLevel(const std::string& level) {
  return level == "trace" || level == "debug" || level == "info" || level == "warn" || level == "error" ||
         level == "critical" || level == "off";
}

Result<int> OpenLogFile(const std::string& file) {
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  int fd = open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) return Err(errno);
  struct stat st;
  int err = 0;
  if (fstat(fd, &st) != 0) err = errno;
  else if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) err = EPERM;
  else if ((st.st_mode & 07777) != 0600 && fchmod(fd, 0600) != 0) err = errno;
  else if (fcntl(fd, F_SETFL, O_WRONLY | O_APPEND) != 0) err = errno;
  if (err != 0) {
    close(fd);
    return Err(err);
  }
  return fd;
}

Status InitLogging(const std::string& file, const std::string& level, bool to_stderr) {
  std::vector<spdlog::sink_ptr> sinks;
  if (!file.empty()) {
    auto fd = OpenLogFile(file);
    if (!fd) return Err(fd.error());
    try {
      sinks.push_back(std::make_shared<FdSink>(*fd));
    } catch (...) {
      close(*fd);
      return Err(ENOMEM);
    }
  }
  try {
    if (to_stderr || file.empty()) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  } catch (const spdlog::spdlog_ex&) {
    return Err(EIO);
  }
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::from_str(level));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %L [%t] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace ckpt
