// recovery.h — start-up, as a function over the core's parts: the
// namespace, the drain log and the tier re-attached from fs/meta and the
// tier directory, orphans purged, lost files dropped and listed. Runs
// before the mount serves requests (InodeTable::Load).
//
// What it checks is the version rule of fs/core/versions.h: a pending
// version's bytes are in its snapshot, or unchanged in the live tier file;
// one found in neither is lost, unless the backend already holds it.
#pragma once

#include "common/result.h"
#include "fs/core/core.h"
#include "fs/core/types.h"

namespace ckpt::fs {

// Loads the namespace from the store (creating the root on first use,
// owned by `root_owner`), purges orphans (nlink 0) and moves tier files
// with no inode to the tier's orphans/. `track_removals`: the shared
// namespace is on (OpLog::set_track_removals). EIO if the store holds
// undecodable records, EUCLEAN if the parent pointers form a cycle.
[[nodiscard]] Status Recover(Core& core, Caller root_owner, bool track_removals);

// The files Recover kept aside for their replica holders
// (Core::keep_lost_for_peers) that none gave back: dropped and listed as
// lost, as Recover drops the others (`why`: the log line's reason).
[[nodiscard]] Status DropAwaited(Core& core, const std::vector<uint64_t>& inos, std::string_view why);

}  // namespace ckpt::fs
