// core_impl.h — what the implementation files of the core share (core.cc,
// inode_table.cc, file_state.cc, persist.cc, evict_fetch.cc, checkpoints.cc,
// drain_port.cc, shared.cc, recovery.cc): their includes and short names.
// Included by those files only; no header includes it.
#pragma once

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/xattr.h>
#include <time.h>

#include <algorithm>
#include <set>
#include <thread>

#include "common/failpoint.h"
#include "common/log.h"
#include "fs/core/file_state.h"
#include "fs/core/inode_table.h"

namespace ckpt::fs {

using meta::Batch;
using meta::DataState;
using meta::kAppliedCounter;
using meta::kCheckpointCounter;
using meta::kImportedCounter;
using meta::kNextInoCounter;
using meta::LogEntry;
using meta::LogOp;
using meta::MetaStore;

}  // namespace ckpt::fs
