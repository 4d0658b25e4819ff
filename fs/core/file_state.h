// file_state.h — the per-file data state machine as one table.
//
// A regular file's bytes are in one of six states (meta::DataState): dirty
// (in the tier, not yet in the backend), draining (the current sealed
// version is being copied), persisted (in the backend and the tier), remote
// (in the backend only), failed (in the tier only; the backend refused
// it for good) and memory-only (in the tier only, by policy: a sealed
// version in a memory-only checkpoint, see --persist-every). Every change of state while the mount runs is one of the
// events below, and NextState is the only place that says where it leads;
// Transition (fs/core/versions.h) applies it. Start-up recovery (fs/core/recovery.cc)
// does not replay events: it re-derives each file's state from its record
// and what the tier holds, and writes it directly.
//
// The seal and copy-on-write rules are not states but conditions on the
// inode (fs::Inode: data_gen, sealed_gen, seal_seq; see
// file_state.cc): a version is sealed when data_gen == sealed_gen, pending
// while seal_seq > applied_seq, and its bytes are copied aside before the
// first change after the seal.
#pragma once

#include <cstdint>
#include <optional>

#include "fs/meta/meta_store.h"

namespace ckpt::fs {

enum class FileEvent : uint8_t {
  kChange,    // the bytes change (write, truncate, fallocate, O_TRUNC, open for writing)
  kStage,     // the drain starts copying the current sealed version
  kStageEnd,  // that copy stopped (an error, a stop) or published a version rewritten since
  kPublish,   // the current sealed version is in the backend
  kRefuse,    // the backend refused the current version for good
  kEvict,     // a clean file's bytes leave the tier
  kFetch,     // a remote file's bytes are back in the tier (fetched, or an eviction undone)
  kKeep,      // the version just sealed belongs to a memory-only checkpoint: it stays in RAM only
  kQueue,     // `ckptfs persist`: a memory-only version is queued for the backend after all
};

const char* FileEventName(FileEvent e);

// The state after `e` in state `s`; nullopt if `e` cannot happen in `s`
// (a broken invariant: the caller logs it and keeps `s`).
std::optional<meta::DataState> NextState(meta::DataState s, FileEvent e);

}  // namespace ckpt::fs
