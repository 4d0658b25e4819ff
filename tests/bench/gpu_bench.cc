// gpu_bench.cc — the GPU path against the physics (issue #14, docs/gpu.md).
//
// Built by `CUDA=1 make` (build/gpu_bench, against the CUDA runtime and
// libckptfs_cuda.so; no torch). On a machine with a GPU:
//
//   build/gpu_bench --dir /mnt/ckpt --tmpfs /dev/shm/x [--size 4G] [--reps 5]
//
// Device memory of --size bytes, as tensors of several sizes (256, 64, 16, 4
// and 1 MiB and a few KiB, in turn), filled with a pattern. Per repetition:
//   pinned D2H   cudaMemcpy of every tensor into one pinned buffer (the
//                physical limit of a save's stall)
//   pageable     cudaMemcpy into pageable memory + write() into a file in
//                --tmpfs (what torch.save of CUDA tensors does, roughly)
//   save stall   ckptfs_save_start into --dir until it returns; then the
//                wait for the file (close + rename) is timed apart
//   pinned H2D   cudaMemcpy from the pinned buffer into the tensors (the
//                limit of a load)
//   load         ckptfs_load of the file saved into the zeroed tensors; the
//                bytes are checked against the pattern on the device
// and prints each figure with min / median / max over the repetitions, and
// the goals' ratios: save stall ÷ pinned D2H (goal ≤ 1.1) and load ÷ pinned
// H2D bandwidth (goal ≥ 0.8). CKPTFS_CUDA_PINNED sizes the staging; a stall
// near the copy alone needs it at least as large as --size (docs/gpu.md).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/ckptfs_cuda.h"

namespace {

#define CUDA_OK(x)                                                                  \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #x, cudaGetErrorString(e_));     \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t ParseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  uint64_t m = 1;
  if (*end == 'K' || *end == 'k') m = 1ull << 10;
  if (*end == 'M' || *end == 'm') m = 1ull << 20;
  if (*end == 'G' || *end == 'g') m = 1ull << 30;
  if (v <= 0) {
    std::fprintf(stderr, "gpu_bench: bad size '%s'\n", s);
    std::exit(2);
  }
  return static_cast<uint64_t>(v * static_cast<double>(m));
}

struct Stat {
  std::vector<double> v;
  void Add(double x) { v.push_back(x); }
  double Min() const { return *std::min_element(v.begin(), v.end()); }
  double Max() const { return *std::max_element(v.begin(), v.end()); }
  double Median() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
  }
};

void Print(const char* what, const Stat& s, const char* unit) {
  std::printf("%-44s %10.3f %10.3f %10.3f  %s\n", what, s.Min(), s.Median(), s.Max(), unit);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, tmpfs = "/dev/shm";
  uint64_t size = 4ull << 30;
  int reps = 5;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--tmpfs" && i + 1 < argc) tmpfs = argv[++i];
    else if (a == "--size" && i + 1 < argc) size = ParseSize(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: gpu_bench --dir DIR [--tmpfs DIR] [--size 4G] [--reps 5]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "gpu_bench: --dir (a ckptfs mount, or any directory) is required\n");
    return 2;
  }
  int dev = 0;
  CUDA_OK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s; engine: %s; size %.2f GiB; CKPTFS_CUDA_PINNED=%s\n", prop.name, ckptfs_engine(),
              static_cast<double>(size) / (1 << 30), std::getenv("CKPTFS_CUDA_PINNED") ?: "(default 512M)");

  // Tensors of several sizes, in turn, until `size` is reached.
  const uint64_t kSizes[] = {256ull << 20, 64ull << 20, 16ull << 20, 4ull << 20, 1ull << 20, 12345};
  std::vector<void*> dptr;
  std::vector<uint64_t> nbytes;
  std::vector<std::string> names;
  for (uint64_t at = 0, k = 0; at < size; k++) {
    uint64_t n = std::min(kSizes[k % 6], size - at);
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, n));
    CUDA_OK(cudaMemset(p, static_cast<int>(k * 37 + 11) & 0xff, n));
    dptr.push_back(p);
    nbytes.push_back(n);
    names.push_back("t" + std::to_string(k));
    at += n;
  }
  std::vector<ckptfs_tensor> tensors(dptr.size());
  for (size_t i = 0; i < dptr.size(); i++)
    tensors[i] = ckptfs_tensor{names[i].c_str(), "U8", -1, nullptr, reinterpret_cast<uint64_t>(dptr[i]), nbytes[i]};

  char* pinned = nullptr;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), size, cudaHostAllocDefault));
  std::vector<char> pageable(size);
  std::memset(pageable.data(), 1, size);  // touch: page faults are not the copy

  // A first save allocates the engine's pinned staging (cudaHostAlloc is
  // slow): once, before anything is timed.
  {
    ckptfs_save* h = nullptr;
    std::string warm = dir + "/gpu_bench.warmup";
    if (int e = ckptfs_save_start(warm.c_str(), tensors.data() + tensors.size() - 1, 1, nullptr, 0, &h);
        e || (e = ckptfs_save_wait(h))) {
      std::fprintf(stderr, "gpu_bench: save into %s: %s (%s)\n", dir.c_str(), std::strerror(e), ckptfs_last_error());
      return 1;
    }
    unlink(warm.c_str());
  }

  Stat d2h, pageable_write, stall, wait_t, h2d, load, r_stall, r_load;
  const double gb = static_cast<double>(size) / 1e9;
  for (int r = 0; r < reps; r++) {
    double t0 = Now();
    for (size_t i = 0, at = 0; i < dptr.size(); at += nbytes[i], i++)
      CUDA_OK(cudaMemcpy(pinned + at, dptr[i], nbytes[i], cudaMemcpyDeviceToHost));
    double t_d2h = Now() - t0;
    d2h.Add(t_d2h);

    std::string tf = tmpfs + "/gpu_bench.pageable";
    t0 = Now();
    int fd = open(tf.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      std::perror(tf.c_str());
      return 1;
    }
    for (size_t i = 0, at = 0; i < dptr.size(); at += nbytes[i], i++) {
      CUDA_OK(cudaMemcpy(pageable.data() + at, dptr[i], nbytes[i], cudaMemcpyDeviceToHost));
      for (uint64_t w = 0; w < nbytes[i];) {
        ssize_t n = write(fd, pageable.data() + at + w, nbytes[i] - w);
        if (n <= 0) {
          std::perror("write");
          return 1;
        }
        w += static_cast<uint64_t>(n);
      }
    }
    close(fd);
    pageable_write.Add(Now() - t0);
    unlink(tf.c_str());

    std::string path = dir + "/gpu_bench.safetensors";
    ckptfs_save* h = nullptr;
    t0 = Now();
    if (int e = ckptfs_save_start(path.c_str(), tensors.data(), tensors.size(), nullptr, 0, &h)) {
      std::fprintf(stderr, "gpu_bench: save: %s (%s)\n", std::strerror(e), ckptfs_last_error());
      return 1;
    }
    double t_stall = Now() - t0;
    t0 = Now();
    if (int e = ckptfs_save_wait(h)) {
      std::fprintf(stderr, "gpu_bench: save wait: %s (%s)\n", std::strerror(e), ckptfs_last_error());
      return 1;
    }
    stall.Add(t_stall);
    wait_t.Add(Now() - t0);
    r_stall.Add(t_stall / t_d2h);

    t0 = Now();
    for (size_t i = 0, at = 0; i < dptr.size(); at += nbytes[i], i++)
      CUDA_OK(cudaMemcpy(dptr[i], pinned + at, nbytes[i], cudaMemcpyHostToDevice));
    double t_h2d = Now() - t0;
    h2d.Add(gb / t_h2d);

    for (size_t i = 0; i < dptr.size(); i++) CUDA_OK(cudaMemset(dptr[i], 0, nbytes[i]));
    CUDA_OK(cudaDeviceSynchronize());
    t0 = Now();
    if (int e = ckptfs_load(path.c_str(), tensors.data(), tensors.size())) {
      std::fprintf(stderr, "gpu_bench: load: %s (%s)\n", std::strerror(e), ckptfs_last_error());
      return 1;
    }
    double t_load = Now() - t0;
    load.Add(gb / t_load);
    r_load.Add(t_h2d / t_load);

    // The bytes, back from the device: each tensor is its pattern.
    for (size_t i = 0, at = 0; i < dptr.size(); at += nbytes[i], i++) {
      CUDA_OK(cudaMemcpy(pinned + at, dptr[i], nbytes[i], cudaMemcpyDeviceToHost));
      char want = static_cast<char>((i * 37 + 11) & 0xff);
      for (uint64_t j = 0; j < nbytes[i]; j += 4093)
        if (pinned[at + j] != want) {
          std::fprintf(stderr, "gpu_bench: tensor %zu byte %llu differs after the round trip\n", i,
                       static_cast<unsigned long long>(j));
          return 1;
        }
      if (pinned[at + nbytes[i] - 1] != want) {
        std::fprintf(stderr, "gpu_bench: tensor %zu differs at its end\n", i);
        return 1;
      }
    }
  }
  std::printf("%-44s %10s %10s %10s\n", "figure (over repetitions)", "min", "median", "max");
  Print("pinned D2H copy (s)", d2h, "s");
  Print("pageable D2H + write into tmpfs (s)", pageable_write, "s");
  Print("ckptfs save stall (s)", stall, "s");
  Print("ckptfs save, wait after the stall (s)", wait_t, "s");
  Print("pinned H2D bandwidth", h2d, "GB/s");
  Print("ckptfs load bandwidth", load, "GB/s");
  Print("goal: save stall / pinned D2H (<= 1.1)", r_stall, "x");
  Print("goal: load / pinned H2D bandwidth (>= 0.8)", r_load, "x");
  std::printf("round trip: %zu tensors, bytes identical\n", dptr.size());
  ckptfs_shutdown();
  return 0;
}
