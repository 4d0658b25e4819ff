// log.cc — spdlog set-up.
#include "fs/common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <vector>

namespace ckpt {

bool ValidLogLevel(const std::string& level) {
  return level == "trace" || level == "debug" || level == "info" || level == "warn" ||
         level == "error" || level == "critical" || level == "off";
}

Status InitLogging(const std::string& file, const std::string& level, bool to_stderr) {
  std::vector<spdlog::sink_ptr> sinks;
  try {
    if (!file.empty()) sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
    if (to_stderr || file.empty()) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  } catch (const spdlog::spdlog_ex&) {
    return Err(EACCES);
  }
  auto logger = std::make_shared<spdlog::logger>("ckptfs", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::from_str(level));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %L [%t] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace ckpt
