/* ckptfs_cuda.h — the C API of libckptfs_cuda.so (and of its host-only twin,
 * libckptfs_gpuhost.so, which copies with memcpy and takes host addresses).
 *
 * Save GPU tensors into a file on a ckptfs mount (or any directory) with a
 * stall of the device-to-host copy, and load them back. The file is a
 * safetensors container (docs/gpu.md). Every function returns 0 or a
 * positive errno; ckptfs_last_error() then says what went wrong, naming
 * the path. Thread-safe: operations from several threads are served in
 * turn (they share the pinned staging buffers).
 *
 *   ckptfs_tensor t[2] = {{"w", "F32", 2, shape_w, (uint64_t)dev_w, bytes_w},
 *                         {"b", "F32", 1, shape_b, (uint64_t)dev_b, bytes_b}};
 *   ckptfs_save* h;
 *   if (ckptfs_save_start("/mnt/ckpt/step_10/model.safetensors", t, 2, NULL, 0, &h) == 0) {
 *     ... the tensors may change now ...
 *     int err = ckptfs_save_wait(h);  // the file is in place (closed, renamed)
 *   }
 */
#ifndef CKPTFS_CUDA_H
#define CKPTFS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckptfs_tensor {
  const char* name;     /* unique in a file; NULL: "t<index>" on save, "in order" on load */
  const char* dtype;    /* safetensors dtype ("F32", "BF16", "U8", ...); NULL: "U8" on save, any on load */
  int32_t ndim;         /* -1: no shape (1-D of nbytes / element size) */
  const int64_t* shape; /* ndim dimensions */
  uint64_t ptr;         /* device address (host address in the host library) */
  uint64_t nbytes;
} ckptfs_tensor;

typedef struct ckptfs_save ckptfs_save;

/* "cuda" or "host". */
const char* ckptfs_engine(void);

/* Starts saving `n` tensors into `path` with `n_meta` string pairs
 * (meta[2i] = key, meta[2i+1] = value) as the header's __metadata__.
 * Returns once every device-to-host copy has finished: the tensors may
 * change from then on. *out must be passed to ckptfs_save_wait exactly once. */
int ckptfs_save_start(const char* path, const ckptfs_tensor* tensors, size_t n, const char* const* meta,
                      size_t n_meta, ckptfs_save** out);

/* Waits until the file is closed and renamed onto its path (or removed,
 * after an error or a cancel), frees the handle, and returns the outcome:
 * 0, ECANCELED, or the write's errno. */
int ckptfs_save_wait(ckptfs_save* h);

/* Asks a save to stop. 1 if it had not finished, else 0. */
int ckptfs_save_cancel(ckptfs_save* h);

/* 1 once the save has finished (ckptfs_save_wait will not block), else 0. */
int ckptfs_save_done(ckptfs_save* h);

/* Loads tensors from `path` into device memory: by name when every tensor
 * has one, else all of the file's in order. Sizes (and dtypes, when given)
 * must match. */
int ckptfs_load(const char* path, const ckptfs_tensor* tensors, size_t n);

/* The header's JSON of the container at `path`, in *json (free it with
 * ckptfs_free). */
int ckptfs_read_header(const char* path, char** json);
void ckptfs_free(void* p);

/* The message of this thread's last error ("" if none). */
const char* ckptfs_last_error(void);

/* Waits for every save in flight and frees the pinned buffers; the next
 * call starts afresh (and reads CKPTFS_CUDA_PINNED again). No other call
 * may run meanwhile; handles of finished saves stay valid for wait. */
void ckptfs_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* CKPTFS_CUDA_H */
