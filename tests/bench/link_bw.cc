// link_bw.cc — the replica link alone (issue #30's "replication ÷ what
// loopback TCP carries"): a writer's Link streams one tier-sized file of
// /dev/shm to a holder's Link into a replica Store on /dev/shm, in one
// process (each link drives its own UCX worker on its own thread), REPS
// times; the holder's spare from each replica dropped is what the next one
// lands in, as on a holder between two saves. Prints one line a repetition:
//   link_bw rep=N bytes=B seconds=S gbps=G
// Usage: link_bw DIR SIZE_MIB REPS [fork]   (DIR on tmpfs: the source file
// and the store; fork: the holder in a child process, as between daemons)
// LINK_BW_SETSID=1 (with fork): the child in a session, an autogroup, of
// its own, as a daemon is; LINK_BW_PAUSE=S: S seconds idle before each
// replication (a holder's spare waits minutes between two saves).
#include <fcntl.h>
#include <sys/wait.h>
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
  const bool fork_holder = argc == 5 && std::string(argv[4]) == "fork";
  if (argc != 4 && !fork_holder) {
    std::fprintf(stderr, "usage: link_bw DIR SIZE_MIB REPS [fork]\n");
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
  const std::string secret(32, 's');
  // The holder: its store and link, here or in a child that tells its
  // address through a pipe and drops each replica when told (one byte).
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return 1;
  pid_t child = fork_holder ? fork() : 0;
  std::unique_ptr<Store> store;
  std::unique_ptr<Link> holder;
  if (fork_holder && child == 0 && getenv("LINK_BW_SETSID")) setsid();
  if (child == 0) {
    auto s = Store::Open(dir + "/link_bw.replicas", 2 * size + (64 << 20));
    if (!s) {
      std::fprintf(stderr, "link_bw: cannot open the store: %s\n", std::strerror(s.error()));
      return 1;
    }
    store = std::move(*s);
    auto h = Link::Open({.node_id = "holder", .secret = secret, .listen = "127.0.0.1:0"}, store.get());
    if (!h) {
      std::fprintf(stderr, "link_bw: %s\n", h.error().c_str());
      return 1;
    }
    holder = std::move(*h);
  }
  if (fork_holder && child == 0) {
    close(to_child[1]);
    close(from_child[0]);
    const std::string a = holder->address() + "\n";
    if (write(from_child[1], a.data(), a.size()) < 0) _exit(1);
    char c;
    for (int rep = 1; read(to_child[0], &c, 1) == 1; rep++)
      (void)store->Drop(Key{.writer = "writer", .ino = 1, .version = static_cast<uint64_t>(rep)});
    holder.reset();
    store.reset();
    _exit(0);
  }
  std::string addr;
  if (fork_holder) {
    close(to_child[0]);
    close(from_child[1]);
    char c;
    while (read(from_child[0], &c, 1) == 1 && c != '\n') addr += c;
  } else {
    addr = holder->address();
  }
  auto writer = Link::Open({.node_id = "writer", .secret = secret}, nullptr);
  if (!writer) {
    std::fprintf(stderr, "link_bw: %s\n", writer.error().c_str());
    return 1;
  }
  for (int rep = 1; rep <= reps; rep++) {
    const Key k{.writer = "writer", .ino = 1, .version = static_cast<uint64_t>(rep)};
    uint64_t hi = 0, lo = 0;
    if (const char* pause = getenv("LINK_BW_PAUSE")) sleep(static_cast<unsigned>(std::atoi(pause)));
    const auto t0 = std::chrono::steady_clock::now();
    auto st = (*writer)->Replicate(addr, k, fd, size, 1000 + rep, &hi, &lo, "{\"path\": \"f\"}");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st) {
      std::fprintf(stderr, "link_bw: replication failed: %s\n", std::strerror(st.error()));
      return 1;
    }
    std::printf("link_bw rep=%d bytes=%llu seconds=%.3f gbps=%.2f\n", rep, static_cast<unsigned long long>(size), s,
                size / s / 1e9);
    std::fflush(stdout);
    if (fork_holder) {
      if (write(to_child[1], "d", 1) != 1) return 1;
    } else {
      (void)store->Drop(k);
    }
  }
  if (fork_holder) {
    close(to_child[1]);
    waitpid(child, nullptr, 0);
  }
  close(fd);
  unlink(src.c_str());
  return 0;
}
