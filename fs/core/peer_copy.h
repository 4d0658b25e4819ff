// peer_copy.h — the core's side of loads from peers (issue #30,
// fs/cluster/peer_loads.h): what this mount hands a member that asks for a
// file's bytes.
#pragma once

#include <cstdint>
#include <string>

#include "fs/core/inode_table.h"

namespace ckpt::fs {

// A read-only descriptor (the caller closes it) of the file at `path`
// (relative to the mount's root, as the backend names it) if this mount
// holds exactly the persisted bytes of `size` bytes whose checksum is
// hi/lo in its tier. A file whose state is remote is fetched from the
// backend first when `fetch` (ENOENT otherwise). ENOENT: no such file
// here, another version, or bytes not persisted. Blocks (lookups in the
// shared namespace, the fetch): never on a FUSE worker.
Result<int> LocalCopyForPeer(InodeTable* t, const std::string& path, uint64_t size, uint64_t hi, uint64_t lo,
                             bool fetch);

}  // namespace ckpt::fs
