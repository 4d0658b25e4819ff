// metrics.h — Prometheus metrics, opt-in: `--metrics HOST:PORT` serves
// /metrics (text exposition format 0.0.4, HELP and TYPE per family) over
// libmicrohttpd; `--metrics-textfile PATH` writes the same text for
// node_exporter's textfile collector (atomically, every 5 s).
#pragma once

#include <microhttpd.h>

#include <cstdint>
#include <string>

#include "common/result.h"

namespace ckpt::fs {

struct Daemon;

// The exposition text of everything the status shows that is a number.
std::string MetricsText(Daemon* d);

// "HOST:PORT" with HOST an IPv4 address (empty: 127.0.0.1) and PORT
// 1-65535; the one-line reason when it is not.
std::expected<std::pair<std::string, uint16_t>, std::string> ParseMetricsAddress(const std::string& s);

class MetricsServer {
 public:
  explicit MetricsServer(Daemon* d) : d_(d) {}
  ~MetricsServer() { Stop(); }
  // Listens on host:port; the reason in *why when it cannot.
  [[nodiscard]] Status Start(const std::string& host, uint16_t port, std::string* why);
  void Stop();

 private:
  static MHD_Result Handle(void* cls, MHD_Connection* c, const char* url, const char* method, const char* version,
                           const char* upload, size_t* upload_size, void** state);
  Daemon* d_;
  MHD_Daemon* mhd_ = nullptr;
};

// Writes MetricsText to `path` through a temporary file and a rename.
[[nodiscard]] Status WriteMetricsTextfile(Daemon* d, const std::string& path);

}  // namespace ckpt::fs
