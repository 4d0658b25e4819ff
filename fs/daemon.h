// daemon.h — what one mounted ckptfs daemon owns, and the FUSE operation
// table (fuse_ops.cc) that serves it.
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse3/fuse_lowlevel.h>

#include <atomic>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "cache/tier.h"
#include "fs/common/config.h"
#include "fs/drain.h"
#include "fs/inode_table.h"
#include "fs/meta/meta_store.h"
#include "fs/space_waiter.h"

namespace ckpt::fs {

struct Daemon {
  Config cfg;
  uint64_t fs_id = 0;
  std::unique_ptr<meta::MetaStore> store;
  std::unique_ptr<cache::Tier> tier;
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<InodeTable> table;
  std::unique_ptr<Drainer> drainer;
  std::unique_ptr<SpaceWaiter> space_waiter;  // writes waiting for tier space (null: they wait in place)
  double attr_timeout = 10.0;   // the daemon is the only writer of its namespace
  double entry_timeout = 10.0;
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> bytes_read{0};
};

// The low-level operation table; fuse_session_new(..., &FuseOps(), ..., daemon).
const fuse_lowlevel_ops& FuseOps();

// The JSON document served as the root's user.ckptfs.status xattr (and
// printed by `ckptfs status`).
std::string StatusJson(Daemon* d);

inline constexpr char kStatusXattr[] = "user.ckptfs.status";

}  // namespace ckpt::fs
