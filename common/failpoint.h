// failpoint.h — named crash points for the crash harness (tests/crash).
//
//   CKPTFS_FAILPOINT=name        the daemon kills itself (SIGKILL, no clean-up,
//                                like a crash) the first time it reaches `name`
//   CKPTFS_FAILPOINT=name@N      ... the Nth time
//
// Always compiled in. When the variable is unset, FAILPOINT(name) costs one
// predictable branch on a global read once at start-up.
//
// Names in use (keep docs/consistency.md in step):
//   drain.mid_transfer    a file's bytes are half staged in the backend
//   drain.after_publish   the backend shows the file under its final name,
//                         RocksDB does not yet record it as persisted
//   meta.after_commit     an operation's WriteBatch is committed, the kernel
//                         has not had the reply
//   evict.mid             eviction recorded "remote", the tier bytes not yet freed
//   load.recovery         start-up recovery half done (metadata fixed, log not
//                         yet resumed)
#pragma once

#include <string_view>

namespace ckpt {

namespace failpoint_detail {
extern const char* armed;  // nullptr when CKPTFS_FAILPOINT is unset
void Hit(std::string_view name);
}  // namespace failpoint_detail

// Reads CKPTFS_FAILPOINT. Call once at start-up, before any thread starts.
void InitFailpoints();

}  // namespace ckpt

#define FAILPOINT(name)                                                                 \
  do {                                                                                  \
    if (__builtin_expect(::ckpt::failpoint_detail::armed != nullptr, 0)) [[unlikely]] \
      ::ckpt::failpoint_detail::Hit(name);                                              \
  } while (0)
