// test_pipeline.cc — the GPU path's engine (gpu/pipeline.h) with the host
// copier: staging through small buffers, ordering (Save returns only after
// its copies), errors, cancellation, concurrency, and loads. The CUDA build
// runs the same engine with another Copier; these tests are what covers
// its logic on machines without a GPU.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/pipeline.h"

using namespace ckpt;
using namespace ckpt::gpu;

namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/gpu_pipeline_XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  return tmpl;
}

std::vector<char> Bytes(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

// Tensors of the given sizes, with their own buffers ("device" memory).
struct Model {
  std::vector<std::vector<char>> data;
  std::vector<Tensor> tensors;
  Model(const std::vector<size_t>& sizes, uint32_t seed) {
    for (size_t i = 0; i < sizes.size(); i++) data.push_back(Bytes(sizes[i], seed + static_cast<uint32_t>(i)));
    for (size_t i = 0; i < sizes.size(); i++) {
      Tensor t;
      t.spec = TensorSpec{"layer" + std::to_string(i), "U8", {}, true, sizes[i]};
      t.ptr = reinterpret_cast<uint64_t>(data[i].data());
      tensors.push_back(t);
    }
  }
};

Options Small(int buffers = 2) {
  Options o;
  o.pinned_bytes = static_cast<uint64_t>(buffers) << 20;  // 1 MiB buffers: most tensors span several
  o.buffers = buffers;
  o.read_threads = 3;
  return o;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// Saves and waits; the file's tensor bytes must be the model's.
void SaveOk(Engine& e, const std::string& path, const Model& m) {
  std::string why;
  auto job = e.Save(path, m.tensors, {{"step", "7"}}, &why);
  cr_assert(job.has_value(), "save: %s", why.c_str());
  auto st = Engine::Wait(**job, &why);
  cr_assert(st.has_value(), "wait: %s", why.c_str());
}

void CheckFile(const std::string& path, const Model& m) {
  int fd = open(path.c_str(), O_RDONLY);
  cr_assert_geq(fd, 0);
  struct stat st;
  fstat(fd, &st);
  std::string why;
  auto p = ParseHeader(fd, static_cast<uint64_t>(st.st_size), &why);
  cr_assert(p.has_value(), "parse: %s", why.c_str());
  cr_assert_eq(p->tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); i++) {
    std::vector<char> got(p->tensors[i].nbytes);
    cr_assert_eq(pread(fd, got.data(), got.size(), static_cast<off_t>(p->tensors[i].offset)),
                 static_cast<ssize_t>(got.size()));
    cr_assert(got == m.data[i], "tensor %zu differs", i);
  }
  cr_assert_eq(p->meta.size(), 1u);
  close(fd);
}

}  // namespace

Test(pipeline, round_trip_through_small_buffers) {
  std::string dir = TempDir();
  // Sizes around the 1 MiB buffers: inside one, across two, exactly one,
  // several, empty, and tiny ones sharing a buffer with the header.
  Model m({0, 5, (1 << 20) - 100, 1 << 20, 3 * (1 << 20) + 17, 1, 4096, 0, 2 * (1 << 20)}, 1);
  Engine e(MakeHostCopier(), Small());
  SaveOk(e, dir + "/model.safetensors", m);
  CheckFile(dir + "/model.safetensors", m);
  cr_assert(Names(dir) == std::vector<std::string>{"model.safetensors"}, "only the file is left");

  Model back({0, 5, (1 << 20) - 100, 1 << 20, 3 * (1 << 20) + 17, 1, 4096, 0, 2 * (1 << 20)}, 99);
  std::string why;
  // By name, in another order than the file's.
  std::vector<Tensor> rev(back.tensors.rbegin(), back.tensors.rend());
  cr_assert(e.Load(dir + "/model.safetensors", rev, &why).has_value(), "load: %s", why.c_str());
  for (size_t i = 0; i < m.data.size(); i++) cr_assert(back.data[i] == m.data[i], "tensor %zu", i);
  std::filesystem::remove_all(dir);
}

Test(pipeline, save_returns_only_after_its_copies) {
  // Each copy sleeps first: a Save that returned before its copies ran
  // would let the changes below reach the file.
  std::string dir = TempDir();
  Model m({3 << 20, 700000, 5 << 20}, 2);
  std::vector<std::vector<char>> before = m.data;
  HostCopierOptions slow;
  slow.delay_us = 3000;
  Engine e(MakeHostCopier(slow), Small());
  std::string why;
  auto job = e.Save(dir + "/a", m.tensors, {{"k", "v"}}, &why);
  cr_assert(job.has_value(), "%s", why.c_str());
  for (auto& d : m.data) std::memset(d.data(), 0x5a, d.size());  // the trainer goes on
  cr_assert(Engine::Wait(**job, &why).has_value(), "%s", why.c_str());
  m.data = before;
  CheckFile(dir + "/a", m);
  std::filesystem::remove_all(dir);
}

Test(pipeline, a_failed_copy_fails_the_save_and_leaves_nothing) {
  std::string dir = TempDir();
  Model m({4 << 20, 4 << 20}, 3);
  HostCopierOptions bad;
  bad.fail_after_bytes = 5 << 20;  // in the second tensor
  Engine e(MakeHostCopier(bad), Small());
  std::string why;
  auto job = e.Save(dir + "/a", m.tensors, {}, &why);
  cr_assert(!job.has_value());
  cr_assert_eq(job.error(), EFAULT);
  cr_assert(why.find("copy") != std::string::npos, "why: %s", why.c_str());
  cr_assert(Names(dir).empty(), "no file and no temporary file left");
  // The engine serves the next operation (the buffers were given back).
  Engine ok(MakeHostCopier(), Small());
  SaveOk(ok, dir + "/b", m);
  std::filesystem::remove_all(dir);
}

Test(pipeline, a_failed_write_is_reported_and_cleaned_up) {
  std::string dir = TempDir();
  Model m({6 << 20}, 4);
  Options o = Small();
  o.fail_write_at = 3 << 20;
  o.fail_write_errno = ENOSPC;
  Engine e(MakeHostCopier(), o);
  std::string why;
  auto job = e.Save(dir + "/a", m.tensors, {}, &why);
  Status st = job ? Engine::Wait(**job, &why) : Status(Err(job.error()));
  cr_assert(!st.has_value());
  cr_assert_eq(st.error(), ENOSPC);
  cr_assert(why.find("No space") != std::string::npos, "why: %s", why.c_str());
  cr_assert(Names(dir).empty(), "the temporary file is removed");
  std::filesystem::remove_all(dir);
}

Test(pipeline, cancel_removes_the_partial_file_and_keeps_the_old_one) {
  std::string dir = TempDir();
  Model old({1 << 20}, 5);
  Engine fast(MakeHostCopier(), Small());
  SaveOk(fast, dir + "/a", old);
  // A slow writer (50 ms a chunk, 7 chunks): the cancel comes while it is
  // still writing, after Save returned (the copies are done).
  Model m({2 << 20, 2 << 20, 2 << 20}, 6);
  Options o = Small(8);
  o.write_delay_us = 50000;
  Engine e(MakeHostCopier(), o);
  std::string why;
  auto job = e.Save(dir + "/a", m.tensors, {{"step", "8"}}, &why);
  cr_assert(job.has_value(), "%s", why.c_str());
  cr_assert(Engine::Cancel(**job), "the save had not finished");
  auto st = Engine::Wait(**job, &why);
  cr_assert(!st.has_value());
  cr_assert_eq(st.error(), ECANCELED);
  CheckFile(dir + "/a", old);  // the earlier file is untouched
  cr_assert(Names(dir) == std::vector<std::string>{"a"}, "the partial file is removed");
  cr_assert(!Engine::Cancel(**job), "a finished save cannot be cancelled");
  // And the engine serves the next save.
  SaveOk(e, dir + "/a", m);
  CheckFile(dir + "/a", m);
  std::filesystem::remove_all(dir);
}

Test(pipeline, saves_from_several_threads_take_turns) {
  std::string dir = TempDir();
  Engine e(MakeHostCopier(), Small());
  std::vector<Model> models;
  for (uint32_t i = 0; i < 4; i++) models.emplace_back(std::vector<size_t>{(1 << 20) + i * 4097, 3 << 19}, 10 + i);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++)
    threads.emplace_back([&, i] { SaveOk(e, dir + "/rank" + std::to_string(i), models[i]); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; i++) CheckFile(dir + "/rank" + std::to_string(i), models[i]);
  std::filesystem::remove_all(dir);
}

Test(pipeline, load_refuses_what_does_not_match) {
  std::string dir = TempDir();
  Model m({1000, 2000}, 7);
  Engine e(MakeHostCopier(), Small());
  SaveOk(e, dir + "/a", m);
  std::string why;
  Model wrong({1000, 2001}, 8);
  cr_assert_eq(e.Load(dir + "/a", wrong.tensors, &why).error(), EINVAL);
  cr_assert(why.find("2000 bytes") != std::string::npos, "why: %s", why.c_str());
  Model fewer({1000}, 8);
  fewer.tensors[0].spec.name = "";
  cr_assert_eq(e.Load(dir + "/a", fewer.tensors, &why).error(), EINVAL);
  Model other({1000}, 8);
  other.tensors[0].spec.name = "nope";
  cr_assert_eq(e.Load(dir + "/a", other.tensors, &why).error(), ENOENT);
  Model typed({1000}, 8);
  typed.tensors[0].spec.dtype = "F32";
  typed.tensors[0].spec.flat = true;
  cr_assert_eq(e.Load(dir + "/a", typed.tensors, &why).error(), EINVAL);
  cr_assert_eq(e.Load(dir + "/missing", m.tensors, &why).error(), ENOENT);
  // A subset by name reads only what it needs.
  Model one({2000}, 9);
  one.tensors[0].spec.name = "layer1";
  cr_assert(e.Load(dir + "/a", one.tensors, &why).has_value(), "%s", why.c_str());
  cr_assert(one.data[0] == m.data[1]);
  std::filesystem::remove_all(dir);
}

Test(pipeline, bad_arguments_leave_nothing) {
  std::string dir = TempDir();
  Engine e(MakeHostCopier(), Small());
  std::string why;
  Model m({10, 10}, 11);
  m.tensors[1].spec.name = m.tensors[0].spec.name;
  cr_assert_eq(e.Save(dir + "/a", m.tensors, {}, &why).error(), EINVAL);
  cr_assert(why.find("twice") != std::string::npos, "why: %s", why.c_str());
  Model n({10}, 12);
  n.tensors[0].ptr = 0;
  cr_assert_eq(e.Save(dir + "/a", n.tensors, {}, &why).error(), EFAULT);
  Model ok({10}, 13);
  cr_assert_eq(e.Save(dir + "/", ok.tensors, {}, &why).error(), EINVAL);
  cr_assert_eq(e.Save(dir + "/no/such/dir/a", ok.tensors, {}, &why).error(), ENOENT);
  cr_assert(Names(dir).empty());
  std::filesystem::remove_all(dir);
}

Test(pipeline, options_from_the_environment) {
  std::string why;
  unsetenv("CKPTFS_CUDA_PINNED");
  auto d = OptionsFromEnv(&why);
  cr_assert(d.has_value());
  cr_assert_eq(d->pinned_bytes, kDefaultPinned);
  cr_assert_eq(d->buffers, 2);
  setenv("CKPTFS_CUDA_PINNED", "1G", 1);
  cr_assert_eq(OptionsFromEnv(&why)->pinned_bytes, 1ull << 30);
  setenv("CKPTFS_CUDA_PINNED", "4x128M", 1);
  auto four = OptionsFromEnv(&why);
  cr_assert(four.has_value(), "%s", why.c_str());
  cr_assert_eq(four->buffers, 4);
  cr_assert_eq(four->pinned_bytes, 512ull << 20);
  for (const char* bad : {"0", "lots", "512K", "0x64M", "17x64M", "50%", "2x", "-1G"}) {
    setenv("CKPTFS_CUDA_PINNED", bad, 1);
    auto r = OptionsFromEnv(&why);
    cr_assert(!r.has_value(), "'%s' accepted", bad);
    cr_assert(why.find("CKPTFS_CUDA_PINNED") != std::string::npos, "why: %s", why.c_str());
  }
  unsetenv("CKPTFS_CUDA_PINNED");
  setenv("CKPTFS_CUDA_READ_THREADS", "0", 1);
  cr_assert(!OptionsFromEnv(&why).has_value());
  unsetenv("CKPTFS_CUDA_READ_THREADS");
}
