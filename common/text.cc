// text.cc — hex and percent-decoding (text.h).
#include "common/text.h"

namespace ckpt {

std::string HexLower(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::string r(n * 2, '0');
  for (size_t i = 0; i < n; i++) r[2 * i] = kHexLower[b[i] >> 4], r[2 * i + 1] = kHexLower[b[i] & 15];
  return r;
}

std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      r.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      r.push_back(' ');
    } else {
      r.push_back(s[i]);
    }
  }
  return r;
}

}  // namespace ckpt
