// text.h — the small text codecs every module shares: hex digits, percent-
// decoding.
// Pure functions, thread-safe; nothing here allocates more than its result.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt {

inline constexpr char kHexLower[] = "0123456789abcdef";
inline constexpr char kHexUpper[] = "0123456789ABCDEF";

// The value of one hex digit (either case), or -1 when `c` is not one.
constexpr int HexValue(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

// `n` bytes at `p` as 2n lower-case hex digits.
std::string HexLower(const void* p, size_t n);

// A 64-bit hash (XXH3) of `s` as 16 lower-case hex digits: stable names
// derived from paths (state and tier dirs, node and staging owner ids).
// Inline, so that only its callers link libxxhash (not the GPU host
// library, which shares this file).
inline std::string HexHash(std::string_view s) {
  uint64_t h = XXH3_64bits(s.data(), s.size());
  std::string r(16, '0');
  for (int i = 15; i >= 0; i--, h >>= 4) r[i] = kHexLower[h & 15];
  return r;
}

// Percent-decoding: every "%HH" becomes its byte; a '%' not followed by two
// hex digits is kept as it is. With `plus_is_space` (form encoding, and S3's
// encoding-type=url), '+' becomes ' '.
std::string PercentDecode(std::string_view s, bool plus_is_space);

}  // namespace ckpt
