// history.cc — the checkpoint history file (fs/views/history.h).
#include "fs/views/history.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>

#include "common/io.h"
#include "common/log.h"

namespace ckpt::fs {

std::string History::Field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void History::Observe(const std::vector<CheckpointInfo>& list) {
  for (const auto& c : list) {
    if (!c.Timed()) continue;
    if (!recorded_.emplace(c.path, c.last_seal_ns).second) continue;
    const double to_ram = static_cast<double>(c.last_seal_ns - c.first_change_ns) / 1e9;
    const double to_durable = static_cast<double>(c.last_publish_ns - c.last_seal_ns) / 1e9;
    const double mb_s = to_durable > 0 ? static_cast<double>(c.bytes) / 1e6 / to_durable : 0;
    time_t t = static_cast<time_t>(c.last_seal_ns / 1000000000);
    struct tm tm;
    char when[32] = "";
    if (gmtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char nums[160];
    snprintf(nums, sizeof nums, ",%llu,%llu,%s,%.3f,%.3f,%.1f", static_cast<unsigned long long>(c.files),
             static_cast<unsigned long long>(c.bytes), when, to_ram, to_durable, mb_s);
    Append(Field(c.path) + nums);
  }
}

void History::Append(const std::string& line) {
  if (!counted_) {
    std::ifstream in(path_);
    std::string l;
    while (std::getline(in, l)) lines_++;
    counted_ = true;
  }
  if (lines_ >= max_lines_) {
    if (rename(path_.c_str(), (path_ + ".1").c_str()) != 0 && errno != ENOENT)
      LOG_WARN("history: cannot rotate {}: {}", path_, strerror(errno));
    lines_ = 0;
  }
  int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    LOG_WARN("history: cannot open {}: {}", path_, strerror(errno));
    return;
  }
  std::string out = lines_ == 0 ? std::string(kHistoryHeader) + "\n" + line + "\n" : line + "\n";
  if (write(fd, out.data(), out.size()) != static_cast<ssize_t>(out.size()))
    LOG_WARN("history: cannot write {}: {}", path_, strerror(errno));
  else
    lines_ += lines_ == 0 ? 2 : 1;
  close(fd);
}

}  // namespace ckpt::fs
