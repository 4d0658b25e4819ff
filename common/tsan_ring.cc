// tsan_ring.cc — see tsan_ring.h.
#include "common/tsan_ring.h"

namespace ckpt {

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
namespace {
char g_ring_maps;
}  // namespace
void RingMapped() { __tsan_acquire(&g_ring_maps); }
void RingUnmapped() { __tsan_release(&g_ring_maps); }
#else
void RingMapped() {}
void RingUnmapped() {}
#endif

}  // namespace ckpt
