// io.cc — PreadFull and PwriteFull (io.h).
#include "common/io.h"

#include <unistd.h>

#include <cerrno>

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

}  // namespace ckpt
