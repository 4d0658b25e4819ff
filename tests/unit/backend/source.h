// source.h — the backend unit tests' source file: `size` deterministic
// random bytes in a /dev/shm file (as the memory tier holds them), and the
// bytes themselves to compare with.
#pragma once

#include <criterion/criterion.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace ckpt::test {

struct Source {
  int fd = -1;
  std::string bytes;

  Source(uint64_t size, uint64_t seed) {
    char tmpl[] = "/dev/shm/ckpt-backend-src-XXXXXX";
    fd = mkstemp(tmpl);
    cr_assert_geq(fd, 0);
    unlink(tmpl);
    std::mt19937_64 rng(seed);
    bytes.resize(size);
    for (uint64_t i = 0; i < size; i += 8) {
      uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, std::min<uint64_t>(8, size - i));
    }
    cr_assert_eq(pwrite(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
  }
  ~Source() { close(fd); }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
};

}  // namespace ckpt::test
