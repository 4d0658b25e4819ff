// io.cc — PreadFull, PwriteFull, AllZero, WriteNonZero and EmptyFile (io.h).
#include "common/io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ckpt {

int PreadFull(int fd, char* buf, uint64_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // the file ended early
    buf += n, len -= static_cast<uint64_t>(n), off += static_cast<uint64_t>(n);
  }
  return 0;
}

int PwriteFull(int fd, const char* buf, uint64_t len, uint64_t off) {
  while (len > 0) {
    ssize_t n = pwrite(fd, buf, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    buf += n, len -= static_cast<uint64_t>(n), off += static_cast<uint64_t>(n);
  }
  return 0;
}

bool AllZero(const char* p, size_t n) {
  // Data blocks usually differ from zero in their first bytes: test those
  // word by word, then compare the block with itself shifted by one byte.
  size_t i = 0;
  for (; i + 8 <= n && i < 64; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    if (v) return false;
  }
  if (n <= 64) {
    for (; i < n; i++)
      if (p[i]) return false;
    return true;
  }
  return p[0] == 0 && std::memcmp(p, p + 1, n - 1) == 0;
}

int WriteNonZero(int fd, const char* buf, uint64_t len, uint64_t off, uint64_t block) {
  uint64_t p = 0;
  auto piece = [&](uint64_t at) { return std::min(len - at, block - (off + at) % block); };
  while (p < len) {
    uint64_t n = piece(p);
    if (AllZero(buf + p, n)) {
      p += n;
      continue;
    }
    uint64_t run = p;
    while (p < len && !AllZero(buf + p, piece(p))) p += piece(p);
    if (int e = PwriteFull(fd, buf + run, p - run, off + run)) return e;
  }
  return 0;
}

int EmptyFile(int fd, uint64_t size) {
  if (ftruncate(fd, 0) != 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) return errno;
  return 0;
}

}  // namespace ckpt
