// membw.c — the physical limits under a checkpoint write on this machine
// (issue #15, docs/benchmarks.md "What is left"): memcpy between buffers
// whose pages are already there, a write(2) into a fresh tmpfs file (the
// kernel allocates and zeroes each page, then copies), and a write(2) into
// a tmpfs file whose pages were allocated beforehand (fallocate
// KEEP_SIZE, as ckptfs's spares). Prints GB/s for each, REPS times.
//
//   cc -O2 -o /tmp/membw tests/bench/membw.c && /tmp/membw /dev/shm 1024 3
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static double write_file(const char* path, const char* src, size_t bytes, int prealloc) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return perror(path), -1;
  if (prealloc && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) != 0) return perror("fallocate"), -1;
  const size_t bs = 1 << 20;
  double t0 = now();
  for (size_t off = 0; off < bytes; off += bs)
    if (write(fd, src + off % (64u << 20), bs) != (ssize_t)bs) return perror("write"), -1;
  double t = now() - t0;
  close(fd);
  unlink(path);
  return bytes / t / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: membw TMPFS_DIR MIB REPS\n");
    return 2;
  }
  size_t bytes = strtoull(argv[2], NULL, 10) << 20;
  int reps = atoi(argv[3]);
  char path[4096];
  snprintf(path, sizeof path, "%s/membw-%d", argv[1], getpid());
  char* src = malloc(64u << 20);  // a 64 MiB source, like a tensor in cache-unfriendly sizes
  char* dst = malloc(bytes);
  if (!src || !dst) return perror("malloc"), 1;
  memset(src, 7, 64u << 20);
  memset(dst, 1, bytes);  // faulted in
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    for (size_t off = 0; off < bytes; off += 1 << 20) memcpy(dst + off, src + off % (64u << 20), 1 << 20);
    double mc = bytes / (now() - t0) / 1e9;
    double fresh = write_file(path, src, bytes, 0);
    double pre = write_file(path, src, bytes, 1);
    printf("rep %d: memcpy %.2f GB/s, write into fresh tmpfs pages %.2f GB/s, into pre-allocated pages %.2f GB/s\n",
           r + 1, mc, fresh, pre);
  }
  return 0;
}
