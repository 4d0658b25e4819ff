// config.cc — parsing of sizes and backend URLs.
#include "fs/common/config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>

namespace ckpt {

std::expected<uint64_t, std::string> ParseSize(const std::string& s) {
  auto bad = [&] {
    return std::unexpected("invalid size '" + s + "' (expected e.g. 512M, 4G, 1.5GiB, 25%)");
  };
  if (s.empty()) return bad();
  size_t i = 0;
  while (i < s.size() && (isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) i++;
  if (i == 0) return bad();
  std::string num = s.substr(0, i);
  if (num.find('.') != num.rfind('.')) return bad();
  double v;
  try {
    size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) return bad();
  } catch (...) {
    return bad();
  }
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "%") {
    if (v <= 0 || v > 100) return std::unexpected("invalid size '" + s + "': percentage must be in (0, 100]");
    return static_cast<uint64_t>(static_cast<double>(PhysicalMemory()) * v / 100.0);
  }
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 9.0e18) return bad();
  return static_cast<uint64_t>(bytes);
}

std::expected<BackendUrl, std::string> ParseBackendUrl(const std::string& s) {
  BackendUrl u;
  std::string rest = s;
  if (s.rfind("s3://", 0) == 0) {
    u.kind = BackendUrl::Kind::kS3;
    rest = s.substr(5);
    auto slash = rest.find('/');
    u.bucket = rest.substr(0, slash);
    if (slash != std::string::npos) u.prefix = rest.substr(slash + 1);
    while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
    if (u.bucket.empty()) return std::unexpected("invalid backend '" + s + "': no bucket in s3:// URL");
    return u;
  }
  if (s.rfind("file://", 0) == 0) rest = s.substr(7);
  else if (s.find("://") != std::string::npos)
    return std::unexpected("invalid backend '" + s + "': expected a directory, file:///path or s3://bucket/prefix");
  if (rest.empty() || rest[0] != '/')
    return std::unexpected("invalid backend '" + s + "': the path must be absolute");
  while (rest.size() > 1 && rest.back() == '/') rest.pop_back();
  u.path = rest;
  return u;
}

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long psz = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || psz <= 0) return 1ull << 32;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(psz);
}

uint64_t DefaultCacheSize(const std::string& tier_dir) {
  uint64_t quarter = PhysicalMemory() / 4;
  struct statvfs sv;
  if (statvfs(tier_dir.c_str(), &sv) == 0) {
    uint64_t fs_total = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
    if (fs_total / 2 < quarter) return fs_total / 2;
  }
  return quarter;
}

std::string HumanBytes(uint64_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  char buf[32];
  if (u == 0) snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace ckpt
