// capi.cc — the C API (ckptfs_cuda.h) over one process-wide Engine.
//
// The engine is made at the first call, with the CUDA copier in CUDA=1
// builds and the host copier otherwise, and options from the environment
// (CKPTFS_CUDA_PINNED, CKPTFS_CUDA_READ_THREADS). It is never destroyed by
// a static destructor: at exit the CUDA runtime may already be torn down,
// so ckptfs_shutdown() is the way to free it (the Python module calls it
// from atexit, after waiting for its saves).
#include "gpu/ckptfs_cuda.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/mutex.h"
#include "gpu/pipeline.h"

namespace ckpt::gpu {
namespace {

thread_local std::string g_error;

Mutex g_mu;
Engine* g_engine GUARDED_BY(g_mu) = nullptr;

int Fail(int e, std::string why) {
  g_error = std::move(why);
  return e;
}

// The process's engine, made on first use.
Result<Engine*> GetEngine() EXCLUDES(g_mu) {
  MutexLock lk(&g_mu);
  if (g_engine) return g_engine;
  std::string why;
  auto opts = OptionsFromEnv(&why);
  if (!opts) return Err(Fail(opts.error(), why));
#ifdef CKPT_HAVE_CUDA
  auto copier = MakeCudaCopier(&why);
  if (!copier) return Err(Fail(copier.error(), why));
  g_engine = new Engine(std::move(*copier), *opts);
#else
  g_engine = new Engine(MakeHostCopier(), *opts);
#endif
  return g_engine;
}

// The tensors of a C call; names and dtypes filled in as documented.
std::vector<Tensor> FromC(const ckptfs_tensor* t, size_t n, bool saving) {
  std::vector<Tensor> out(n);
  for (size_t i = 0; i < n; i++) {
    TensorSpec& s = out[i].spec;
    s.name = t[i].name ? t[i].name : (saving ? "t" + std::to_string(i) : "");
    s.dtype = t[i].dtype ? t[i].dtype : (saving ? "U8" : "");
    s.flat = t[i].ndim < 0 || (t[i].ndim > 0 && !t[i].shape);
    if (!s.flat)
      for (int32_t d = 0; d < t[i].ndim; d++) s.shape.push_back(t[i].shape[d]);
    s.nbytes = t[i].nbytes;
    out[i].ptr = t[i].ptr;
  }
  return out;
}

// Runs `fn`, turning a C++ exception (bad_alloc from a huge name list, say)
// into an errno: none may cross the C boundary.
template <class Fn>
int Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(ENOMEM, "out of memory");
  } catch (const std::exception& e) {
    return Fail(EIO, e.what());
  }
}

}  // namespace
}  // namespace ckpt::gpu

using ckpt::gpu::Fail;
using ckpt::gpu::Guard;

struct ckptfs_save {
  std::shared_ptr<ckpt::gpu::SaveJob> job;
};

extern "C" {

const char* ckptfs_engine(void) {
#ifdef CKPT_HAVE_CUDA
  return "cuda";
#else
  return "host";
#endif
}

int ckptfs_save_start(const char* path, const ckptfs_tensor* tensors, size_t n, const char* const* meta,
                      size_t n_meta, ckptfs_save** out) {
  return Guard([&] {
    if (!path || !out || (n && !tensors) || (n_meta && !meta)) return Fail(EINVAL, "save: a null argument");
    *out = nullptr;
    auto engine = ckpt::gpu::GetEngine();
    if (!engine) return engine.error();
    ckpt::gpu::Metadata m;
    for (size_t i = 0; i < n_meta; i++) {
      if (!meta[2 * i] || !meta[2 * i + 1]) return Fail(EINVAL, "save: a null metadata key or value");
      m.emplace_back(meta[2 * i], meta[2 * i + 1]);
    }
    std::string why;
    auto job = (*engine)->Save(path, ckpt::gpu::FromC(tensors, n, true), m, &why);
    if (!job) return Fail(job.error(), why);
    *out = new ckptfs_save{std::move(*job)};
    return 0;
  });
}

int ckptfs_save_wait(ckptfs_save* h) {
  if (!h) return Fail(EINVAL, "wait: a null handle");
  std::string why;
  auto st = ckpt::gpu::Engine::Wait(*h->job, &why);
  delete h;
  return st ? 0 : Fail(st.error(), why);
}

int ckptfs_save_cancel(ckptfs_save* h) { return h && ckpt::gpu::Engine::Cancel(*h->job) ? 1 : 0; }

int ckptfs_save_done(ckptfs_save* h) { return h && ckpt::gpu::Engine::Done(*h->job) ? 1 : 0; }

int ckptfs_load(const char* path, const ckptfs_tensor* tensors, size_t n) {
  return Guard([&] {
    if (!path || (n && !tensors)) return Fail(EINVAL, "load: a null argument");
    auto engine = ckpt::gpu::GetEngine();
    if (!engine) return engine.error();
    std::string why;
    auto st = (*engine)->Load(path, ckpt::gpu::FromC(tensors, n, false), &why);
    return st ? 0 : Fail(st.error(), why);
  });
}

int ckptfs_read_header(const char* path, char** json) {
  return Guard([&] {
    if (!path || !json) return Fail(EINVAL, "read_header: a null argument");
    std::string why;
    auto p = ckpt::gpu::Engine::ReadHeader(path, &why);
    if (!p) return Fail(p.error(), why);
    *json = strdup(p->json.c_str());
    return *json ? 0 : Fail(ENOMEM, "out of memory");
  });
}

void ckptfs_free(void* p) { std::free(p); }

const char* ckptfs_last_error(void) { return ckpt::gpu::g_error.c_str(); }

void ckptfs_shutdown(void) {
  ckpt::MutexLock lk(&ckpt::gpu::g_mu);
  delete ckpt::gpu::g_engine;  // waits for the saves in flight
  ckpt::gpu::g_engine = nullptr;
}

}  // extern "C"
