// io.h — whole-range pread/pwrite: the loops every copy needs, once, and
// the hole-keeping write both backends' fetches use, and EmptyFile before a
// fetch is tried again.
//
// They retry EINTR and continue after short transfers. They return 0 or a
// positive errno, as liburing's completions do once negated, so the
// io_uring paths and these fallbacks report alike. Thread-safe as pread and
// pwrite are (no file offset is used).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

// Reads exactly `len` bytes at `off`: 0, or an errno (EIO when the file
// ends early).
int PreadFull(int fd, char* buf, uint64_t len, uint64_t off);

// Writes exactly `len` bytes at `off`: 0, or an errno (EIO when a write
// makes no progress).
int PwriteFull(int fd, const char* buf, uint64_t len, uint64_t off);

// True if the `n` bytes at `p` are all zero.
bool AllZero(const char* p, size_t n);

// Writes the bytes of `buf` (file offset `off`) that are not in `block`-sized
// runs of zeros (blocks aligned to file offsets; a block cut by the ends of
// `buf` is judged by its part inside), one PwriteFull per run of data: 0 or
// an errno. Zeros written as data become holes, so a fetched sparse file
// stays sparse in the tier.
// REQUIRES: the destination reads as zeros over the skipped blocks (a fresh
// file ftruncate'd to size, or those bytes rewritten with the same data).
int WriteNonZero(int fd, const char* buf, uint64_t len, uint64_t off, uint64_t block = 4096);

// Makes the file at `fd` `size` bytes of zeros (holes), dropping whatever a
// failed fetch wrote, so the next fetch may use WriteNonZero: 0 or an errno.
int EmptyFile(int fd, uint64_t size);

}  // namespace ckpt
