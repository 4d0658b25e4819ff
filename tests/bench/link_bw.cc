// link_bw.cc — the replica link alone (issue #30's "replication ÷ what
// loopback TCP carries"): a writer's Link streams one tier-sized file of
// /dev/shm to a holder's Link into a replica Store on /dev/shm, in one
// process (each link drives its own UCX worker on its own thread), REPS
// times; the holder's spare from each replica dropped is what the next one
// lands in, as on a holder between two saves. Prints one line a repetition:
//   link_bw rep=N bytes=B seconds=S gbps=G
// Usage: link_bw DIR SIZE_MIB REPS   (DIR on tmpfs: the source file and the store)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/checksum.h"
#include "fs/cluster/replica_link.h"
#include "fs/cluster/replica_store.h"

using ckpt::fs::replica::Key;
using ckpt::fs::replica::Link;
using ckpt::fs::replica::Store;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: link_bw DIR SIZE_MIB REPS\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t size = std::strtoull(argv[2], nullptr, 10) << 20;
  const int reps = std::atoi(argv[3]);
  if (size == 0 || reps <= 0) {
    std::fprintf(stderr, "link_bw: SIZE_MIB and REPS must be positive\n");
    return 2;
  }
  const std::string src = dir + "/link_bw.src";
  int fd = open(src.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    std::perror(src.c_str());
    return 1;
  }
  std::vector<char> buf(4 << 20);
  uint64_t x = 88172645463325252ull;
  for (uint64_t off = 0; off < size; off += buf.size()) {
    for (size_t i = 0; i < buf.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&buf[i], &x, 8);
    }
    if (pwrite(fd, buf.data(), std::min<uint64_t>(buf.size(), size - off), off) < 0) return 1;
  }
  auto store = Store::Open(dir + "/link_bw.replicas", 2 * size + (64 << 20));
  if (!store) {
    std::fprintf(stderr, "link_bw: cannot open the store: %s\n", std::strerror(store.error()));
    return 1;
  }
  const std::string secret(32, 's');
  auto holder = Link::Open({.node_id = "holder", .secret = secret, .listen = "127.0.0.1:0"}, store->get());
  auto writer = Link::Open({.node_id = "writer", .secret = secret}, nullptr);
  if (!holder || !writer) {
    std::fprintf(stderr, "link_bw: %s\n", !holder ? holder.error().c_str() : writer.error().c_str());
    return 1;
  }
  for (int rep = 1; rep <= reps; rep++) {
    const Key k{.writer = "writer", .ino = 1, .version = static_cast<uint64_t>(rep)};
    uint64_t hi = 0, lo = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto st = (*writer)->Replicate((*holder)->address(), k, fd, size, 1000 + rep, &hi, &lo, "{\"path\": \"f\"}");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st) {
      std::fprintf(stderr, "link_bw: replication failed: %s\n", std::strerror(st.error()));
      return 1;
    }
    std::printf("link_bw rep=%d bytes=%llu seconds=%.3f gbps=%.2f\n", rep, static_cast<unsigned long long>(size), s,
                size / s / 1e9);
    std::fflush(stdout);
    (void)(*store)->Drop(k);
  }
  close(fd);
  unlink(src.c_str());
  return 0;
}
