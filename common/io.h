// io.h — whole-range pread/pwrite: the loops every copy needs, once.
//
// Both retry EINTR and continue after short transfers. They return 0 or a
// positive errno, as liburing's completions do once negated, so the
// io_uring paths and these fallbacks report alike. Thread-safe as pread and
// pwrite are (no file offset is used).
#pragma once

#include <cstdint>

namespace ckpt {

// Reads exactly `len` bytes at `off`: 0, or an errno (EIO when the file
// ends early).
int PreadFull(int fd, char* buf, uint64_t len, uint64_t off);

// Writes exactly `len` bytes at `off`: 0, or an errno (EIO when a write
// makes no progress).
int PwriteFull(int fd, const char* buf, uint64_t len, uint64_t off);

}  // namespace ckpt
