// checksum.cc — ContentHash: the sparse-aware file checksum of checksum.h.
#include "backend/checksum.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ckpt::backend {

ContentHash::ContentHash() : state_(XXH3_createState()) {
  if (state_) XXH3_128bits_reset(state_);
}

ContentHash::~ContentHash() {
  if (state_) XXH3_freeState(state_);
}

void ContentHash::Block(uint64_t index, const char* p, size_t n) {
  if (AllZero(p, n)) return;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = static_cast<unsigned char>(index >> (8 * i));
  XXH3_128bits_update(state_, le, sizeof le);
  XXH3_128bits_update(state_, p, n);
}

void ContentHash::SkipTo(uint64_t off) {
  if (off <= pos_) return;
  if (uint64_t in = pos_ % kChecksumBlock; in != 0) {
    uint64_t start = pos_ - in, end = start + kChecksumBlock;
    if (off < end) {
      std::memset(partial_ + in, 0, off - pos_);
      pos_ = off;
      return;
    }
    std::memset(partial_ + in, 0, kChecksumBlock - in);
    Block(start / kChecksumBlock, partial_, kChecksumBlock);
    pos_ = end;
  }
  // Whole blocks of zeros in between cost nothing.
  pos_ = off;
  if (uint64_t in = off % kChecksumBlock; in != 0) std::memset(partial_, 0, in);
}

void ContentHash::Update(uint64_t off, const char* data, size_t len) {
  SkipTo(off);
  while (len > 0) {
    uint64_t in = pos_ % kChecksumBlock;
    if (in == 0 && len >= kChecksumBlock) {
      Block(pos_ / kChecksumBlock, data, kChecksumBlock);
      data += kChecksumBlock, len -= kChecksumBlock, pos_ += kChecksumBlock;
      continue;
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(kChecksumBlock - in, len));
    std::memcpy(partial_ + in, data, n);
    data += n, len -= n, pos_ += n;
    if (pos_ % kChecksumBlock == 0) Block(pos_ / kChecksumBlock - 1, partial_, kChecksumBlock);
  }
}

std::pair<uint64_t, uint64_t> ContentHash::Finish(uint64_t size) {
  if (uint64_t in = pos_ % kChecksumBlock; in != 0 && size > pos_) {
    uint64_t start = pos_ - in;
    uint64_t end = std::min(start + kChecksumBlock, size);  // the EOF block is short
    std::memset(partial_ + in, 0, end - pos_);
    Block(start / kChecksumBlock, partial_, end - start);
    pos_ = end;
  } else if (in != 0) {
    Block((pos_ - in) / kChecksumBlock, partial_, in);  // EOF right here
  }
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = static_cast<unsigned char>(size >> (8 * i));
  XXH3_128bits_update(state_, le, sizeof le);
  XXH128_hash_t h = XXH3_128bits_digest(state_);
  return {h.high64, h.low64};
}

std::pair<uint64_t, uint64_t> ContentChecksum(const char* data, size_t size) {
  ContentHash h;
  if (!h.ok()) return {0, 0};
  h.Update(0, data, size);
  return h.Finish(size);
}

std::string ChecksumHex(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return std::string(buf, 32);
}

bool ParseChecksumHex(std::string_view s, uint64_t* hi, uint64_t* lo) {
  if (s.size() != 32) return false;
  uint64_t v[2] = {0, 0};
  for (size_t i = 0; i < 32; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v[i / 16] = v[i / 16] << 4 | static_cast<uint64_t>(d);
  }
  *hi = v[0], *lo = v[1];
  return true;
}

}  // namespace ckpt::backend
