// config.cc — parsing of sizes and backend URLs, and the forms in which
// URLs and names are shown to people.
#include "common/config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/text.h"

namespace ckpt {

namespace {

constexpr uint64_t kMaxSize = kMaxSizeBytes;

// The authority of "scheme://authority/path": the text between "://" and
// the next '/'; npos when `s` has no "://".
size_t AuthorityEnd(const std::string& s, size_t start) {
  size_t slash = s.find('/', start);
  return slash == std::string::npos ? s.size() : slash;
}

}  // namespace

std::expected<uint64_t, std::string> ParseCount(const std::string& s) {
  constexpr uint64_t kMax = 1000000000;
  const std::string want = "want a whole number from 1 to 1000000000, not '" + EscapeName(s) + "'";
  if (s.empty() || s.size() > 10 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::unexpected(want);
  uint64_t v = std::stoull(s);
  if (v == 0 || v > kMax) return std::unexpected(want);
  return v;
}

std::expected<uint64_t, std::string> ParseCountOrZero(const std::string& s) {
  if (s == "0") return 0;
  auto v = ParseCount(s);
  if (!v) return std::unexpected("want 0 or a whole number up to 1000000000, not '" + EscapeName(s) + "'");
  return v;
}

std::expected<uint64_t, std::string> ParseTtl(const std::string& s) {
  const std::string want = "want whole seconds from 0 (off) to " + std::to_string(kMaxSharedTtl) + ", not '" +
                           EscapeName(s) + "'";
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::unexpected(want);
  uint64_t v = std::stoull(s);
  if (v > kMaxSharedTtl) return std::unexpected(want);
  return v;
}

std::expected<uint64_t, std::string> ParseSize(const std::string& s) {
  const char* kExpect = " (expected e.g. 512M, 4G, 1.5GiB, 25%)";
  auto bad = [&] { return std::unexpected("invalid size '" + s + "'" + kExpect); };
  if (s.empty()) return std::unexpected(std::string("invalid size '': empty") + kExpect);
  auto digit = [&](size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
  // DIGITS [. DIGITS] [UNIT | %], in integers: a double would round large
  // byte counts and let 8000000T through as "representable".
  size_t i = 0;
  uint64_t whole = 0;
  bool overflow = false;
  for (; digit(i); i++) {
    auto d = static_cast<uint64_t>(s[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) overflow = true;
    else whole = whole * 10 + d;
  }
  if (i == 0) return bad();
  uint64_t frac = 0, den = 1;  // the fraction frac/den, 18 digits kept
  if (i < s.size() && s[i] == '.') {
    size_t start = ++i;
    for (; digit(i); i++) {
      if (den < 1000000000000000000ull) {
        frac = frac * 10 + static_cast<uint64_t>(s[i] - '0');
        den *= 10;
      }
    }
    if (i == start) return bad();
  }
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  if (unit == "%") {
    using U128 = unsigned __int128;
    U128 scaled = static_cast<U128>(whole) * den + frac;  // percent x den
    if (overflow || scaled == 0 || scaled > static_cast<U128>(100) * den)
      return std::unexpected("invalid size '" + s + "': percentage must be in (0, 100]");
    return static_cast<uint64_t>(static_cast<U128>(PhysicalMemory()) * scaled / (static_cast<U128>(100) * den));
  }
  uint64_t mult;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1ull << 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1ull << 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1ull << 30;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1ull << 40;
  else return bad();
  using U128 = unsigned __int128;
  U128 bytes = static_cast<U128>(whole) * mult + static_cast<U128>(frac) * mult / den;
  if (overflow || bytes > kMaxSize)
    return std::unexpected("invalid size '" + s + "': larger than the largest size accepted, 1048576T (1 EiB)");
  if (bytes < 1) return bad();
  return static_cast<uint64_t>(bytes);
}

namespace {

// A component of a backend's root or prefix that ckptfs keeps for itself
// inside a backend (kReservedTmpDir, kReservedClusterDir), or null. A
// mount whose backend lies in another mount's staging area would see its
// staged files removed as that mount's leftovers an hour on.
const char* ReservedComponent(std::string_view path) {
  for (const char* name : {kReservedTmpDir, kReservedClusterDir}) {
    const std::string_view n(name);
    for (size_t pos = path.find(n); pos != std::string_view::npos; pos = path.find(n, pos + 1)) {
      const bool starts = pos == 0 || path[pos - 1] == '/';
      const bool ends = pos + n.size() == path.size() || path[pos + n.size()] == '/';
      if (starts && ends) return name;
    }
  }
  return nullptr;
}

std::unexpected<std::string> Reserved(const std::string& s, const char* name) {
  return std::unexpected(
      "invalid backend '" + s + "': '" + name +
      "' is a name ckptfs keeps for itself inside a backend; choose a directory or prefix outside it");
}

}  // namespace

std::expected<BackendUrl, std::string> ParseBackendUrl(const std::string& s) {
  // Userinfo (user:password@) in any URL is refused before anything else,
  // with a message that does not echo the URL: every later message may.
  if (size_t sep = s.find("://"); sep != std::string::npos) {
    size_t start = sep + 3, end = AuthorityEnd(s, start);
    std::string_view auth(s.data() + start, end - start);
    // s3://KEY:SECRET/x@bucket (a '/' in the secret, not encoded) ends the
    // authority early: no bucket or file host has a ':' either.
    bool colon = auth.find(':') != std::string_view::npos && (s.starts_with("s3://") || s.starts_with("file://"));
    if (auth.find('@') != std::string_view::npos || colon) return std::unexpected(std::string(kCredentialsInUrl));
  }
  BackendUrl u;
  std::string rest = s;
  if (s.rfind("s3://", 0) == 0) {
    u.kind = BackendUrl::Kind::kS3;
    rest = s.substr(5);
    auto slash = rest.find('/');
    u.bucket = rest.substr(0, slash);
    if (slash != std::string::npos) u.prefix = rest.substr(slash + 1);
    // The prefix is stored without leading or trailing '/': s3://b//p and
    // s3://b/p/ name the same keys as s3://b/p.
    while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
    while (!u.prefix.empty() && u.prefix.front() == '/') u.prefix.erase(0, 1);
    if (u.bucket.empty()) return std::unexpected("invalid backend '" + s + "': no bucket in s3:// URL");
    if (const char* r = ReservedComponent(u.prefix)) return Reserved(s, r);
    return u;
  }
  if (s.rfind("file://", 0) == 0) rest = s.substr(7);
  else if (s.find("://") != std::string::npos)
    return std::unexpected("invalid backend '" + s + "': expected a directory, file:///path or s3://bucket/prefix");
  if (rest.empty() || rest[0] != '/') return std::unexpected("invalid backend '" + s + "': the path must be absolute");
  while (rest.size() > 1 && rest.back() == '/') rest.pop_back();
  if (const char* r = ReservedComponent(rest)) return Reserved(s, r);
  u.path = rest;
  return u;
}

std::string BackendDisplay(const BackendUrl& u, const std::string& raw) {
  if (u.kind == BackendUrl::Kind::kS3) return "s3://" + u.bucket + (u.prefix.empty() ? "" : "/" + u.prefix);
  return raw.starts_with("file://") ? "file://" + u.path : u.path;
}

std::string RedactUserinfo(const std::string& text) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t sep = text.find("://", pos);
    if (sep == std::string::npos) break;
    size_t start = sep + 3;
    size_t end = start;
    while (end < text.size() && !isspace(static_cast<unsigned char>(text[end]))) end++;
    size_t at = text.rfind('@', end == 0 ? 0 : end - 1);
    out.append(text, pos, start - pos);
    if (at != std::string::npos && at >= start && at < end) {
      out += "***";
      pos = at;
    } else {
      pos = start;
    }
  }
  out.append(text, pos, std::string::npos);
  return out;
}

std::string EscapeName(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    out += "\\x";
    out += kHexLower[c >> 4];
    out += kHexLower[c & 15];
  };
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
      i++;
    } else if (c == '\n') {
      out += "\\n";
      i++;
    } else if (c == '\t') {
      out += "\\t";
      i++;
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
      i++;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      i++;
    } else {
      // A well-formed UTF-8 sequence (no overlong forms, no surrogates, at
      // most U+10FFFF) is kept; any other byte is escaped on its own.
      size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
      bool ok = n > 0 && c <= 0xf4 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; k++) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok && n >= 3) {
        auto c1 = static_cast<unsigned char>(s[i + 1]);
        if (c == 0xe0 && c1 < 0xa0) ok = false;   // overlong
        if (c == 0xed && c1 >= 0xa0) ok = false;  // surrogates
        if (c == 0xf0 && c1 < 0x90) ok = false;   // overlong
        if (c == 0xf4 && c1 >= 0x90) ok = false;  // past U+10FFFF
      }
      if (ok) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        hex(c);
        i++;
      }
    }
  }
  return out;
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

uint64_t MemAvailable() {
  FILE* f = fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
  fclose(f);
  return found ? static_cast<uint64_t>(kb) * 1024 : 0;
}

uint64_t CapToAvailable(uint64_t budget, uint64_t mem_available, uint64_t in_tier) {
  if (mem_available == 0) return budget;
  return std::min(budget, mem_available + in_tier);
}

uint64_t FilesystemSize(const std::string& path) {
  std::string p = path;
  struct statvfs sv;
  for (;;) {
    if (statvfs(p.c_str(), &sv) == 0) return static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
    if (errno != ENOENT || p.empty() || p == "/") return 0;
    size_t slash = p.find_last_of('/');
    p = slash == 0 ? "/" : slash == std::string::npos ? "" : p.substr(0, slash);
  }
}

uint64_t TierUsable(uint64_t fs_size) { return fs_size - fs_size / 16; }

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

std::expected<uint64_t, std::string> ParseMillis(const std::string& s) {
  const std::string want = "want milliseconds from 0 to 60000, not '" + EscapeName(s) + "'";
  if (s.empty() || s.size() > 5 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::unexpected(want);
  uint64_t v = std::stoull(s);
  if (v > 60000) return std::unexpected(want);
  return v;
}

std::expected<void, std::string> TakeOwnOptions(std::string* fuse_opts, Config* cfg) {
  std::string rest;
  size_t at = 0;
  while (at <= fuse_opts->size()) {
    size_t end = fuse_opts->find(',', at);
    if (end == std::string::npos) end = fuse_opts->size();
    std::string opt = fuse_opts->substr(at, end - at);
    at = end + 1;
    // on|off switches: NAME, NAME=on, NAME=off.
    bool taken = false;
    for (auto [name, out] : {std::pair{std::string_view("passthrough"), &cfg->passthrough},
                             std::pair{std::string_view("io_uring"), &cfg->io_uring},
                             std::pair{std::string_view("reply_yield"), &cfg->reply_yield},
                             std::pair{std::string_view("tier_huge"), &cfg->tier_huge}}) {
      if (!opt.starts_with(name)) continue;
      const std::string n(name);
      if (opt == n + "=off") *out = false;
      else if (opt == n + "=on" || opt == n) *out = true;
      else return std::unexpected("-o " + EscapeName(opt) + ": want " + n + "=on or " + n + "=off");
      taken = true;
    }
    // Numbers: the checkpoint policies (also as FUSE-style options for
    // fstab and mount.ckptfs), the drain's yield, the shared namespace's
    // TTL, and the cluster's timings.
    using Parser = std::expected<uint64_t, std::string> (*)(const std::string&);
    struct Number {
      const char* key;
      Parser parse;
      uint64_t* out;
      bool cluster;  // counts as a cluster option (--node etc.)
    };
    for (const Number& o : {Number{"keep_in_memory=", ParseCount, &cfg->keep_in_memory, false},
                            Number{"persist_every=", ParseCount, &cfg->persist_every, false},
                            Number{"persist_interval=", ParseCount, &cfg->persist_interval_s, false},
                            Number{"drain_yield=", ParseMillis, &cfg->drain_yield_ms, false},
                            Number{"shared_ttl=", ParseTtl, &cfg->shared_ttl_s, false},
                            Number{"member_timeout=", ParseCount, &cfg->member_timeout_s, true},
                            Number{"max_clock_skew=", ParseMillis, &cfg->max_clock_skew_ms, true}}) {
      if (!opt.starts_with(o.key)) continue;
      auto v = o.parse(opt.substr(strlen(o.key)));
      if (!v) return std::unexpected("-o " + EscapeName(opt) + ": " + v.error());
      *o.out = *v;
      if (o.cluster) cfg->cluster_opts_given = true;
      taken = true;
    }
    if (opt.starts_with("on_refusal=")) {
      const std::string v = opt.substr(11);
      if (v != "hold" && v != "skip") return std::unexpected("-o " + EscapeName(opt) + ": want on_refusal=hold or on_refusal=skip");
      cfg->refusal_skip = v == "skip";
      taken = true;
    }
    if (taken) continue;
    // Cross-node ordering (names are checked with the command line's).
    if (opt.starts_with("cluster=")) {
      cfg->cluster = opt.substr(8);
      if (cfg->cluster.empty()) return std::unexpected("-o cluster=: want a cluster name");
      continue;
    }
    if (opt.starts_with("node=")) {
      cfg->node = opt.substr(5);
      cfg->cluster_opts_given = true;
      continue;
    }
    if (opt.empty()) continue;
    if (!rest.empty()) rest += ',';
    rest += opt;
  }
  *fuse_opts = rest;
  return {};
}

}  // namespace ckpt
