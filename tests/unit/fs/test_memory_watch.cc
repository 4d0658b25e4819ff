// test_memory_watch.cc — the headroom arithmetic and /proc/self/cgroup
// parsing of fs/memory_watch (Residency::RelieveMemory is tested with the
// drain, tests/unit/fs/test_drain.cc).
#include <criterion/criterion.h>

#include <string>

#include "fs/core/memory_watch.h"

using ckpt::fs::CgroupHeadroom;
using ckpt::fs::MemoryCgroupPath;
constexpr uint64_t M = 1ull << 20;

Test(memory_watch, cgroup_headroom_counts_tmpfs_as_pinned) {
  // 700M limit, 600M charged of which 450M page cache, 400M of it tmpfs:
  // 50M of cache is reclaimable, so 550M are pinned, 150M left.
  cr_assert_eq(CgroupHeadroom(700 * M, 600 * M, 450 * M, 400 * M), 150 * M);
  cr_assert_eq(CgroupHeadroom(700 * M, 800 * M, 0, 0), 0u, "over the limit");
  cr_assert_eq(CgroupHeadroom(700 * M, 100 * M, 50 * M, 80 * M), 600 * M, "shmem above cache: none reclaimable");
}

Test(memory_watch, cgroup_path_v1_and_v2) {
  bool v2 = true;
  auto path = [&](const char* text) { return MemoryCgroupPath(text, &v2); };
  cr_assert(path("12:pids:/\n4:memory:/pod/abc\n0::/\n") == "/pod/abc");
  cr_assert(!v2);
  cr_assert(path("5:cpu,memory:/x\n") == "/x", "a joint controller line");
  cr_assert(path("0::/system.slice/train.service\n") == "/system.slice/train.service");
  cr_assert(v2);
  cr_assert(path("0::/\n").empty());
  cr_assert(v2, "the v2 root");
  cr_assert(path("garbage\n").empty());
  cr_assert(!v2);
}
