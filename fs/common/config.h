// config.h — the daemon's settings and the parsing of user-supplied strings
// (sizes, backend URLs). Parsing returns a message instead of throwing, so the
// CLI can print one line and exit non-zero.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fs/common/result.h"

namespace ckpt {

enum class FsyncMode { kMemory, kBackend };

struct BackendUrl {
  enum class Kind { kPosix, kS3 } kind = Kind::kPosix;
  std::string path;    // kPosix: absolute directory
  std::string bucket;  // kS3
  std::string prefix;  // kS3, without leading/trailing '/'
};

struct Config {
  std::string mountpoint;       // absolute
  BackendUrl backend;
  std::string backend_raw;      // as the user gave it (for messages)
  uint64_t cache_size = 0;      // bytes
  std::string state_dir;        // absolute
  std::string tier_dir;         // absolute; default /dev/shm/ckptfs-<hash of state dir>
  FsyncMode fsync = FsyncMode::kMemory;
  bool foreground = false;
  std::string fuse_opts;        // extra -o options passed to libfuse
  std::string log_level = "info";
  std::string s3_endpoint;
};

// Parses "512M", "4G", "1.5GiB", "1073741824", "25%" (of RAM). Returns the size
// in bytes, or a message saying what is wrong.
std::expected<uint64_t, std::string> ParseSize(const std::string& s);

// Parses an absolute path, file:///path or s3://bucket/prefix.
std::expected<BackendUrl, std::string> ParseBackendUrl(const std::string& s);

// Total physical memory in bytes.
uint64_t PhysicalMemory();

// The default cache budget: a quarter of RAM, and never more than half of
// what the tier's filesystem can hold.
uint64_t DefaultCacheSize(const std::string& tier_dir);

// Formats a byte count for humans: "1.5 GiB".
std::string HumanBytes(uint64_t n);

}  // namespace ckpt
