// sent_sums.h — the content checksum this node sent with each of its
// replicas, kept in its own metadata store (issue #30, docs/replicas.md).
//
// A node restarted on its state dir with its memory tier gone reads its
// unpersisted files back from their holders (RestoreFromPeers). The link
// checks each chunk, and the holder's copy was checked against the
// checksum the writer sent when it arrived; but what the holder keeps and
// gives back later was, until stop 69, believed: a copy changed at rest
// on the holder (its tier is a directory anyone with root can write), or a
// member that answers with other bytes under consistent chunk hashes,
// became this node's file. Now the checksum computed as the first holder's
// chunks went (Replicator::Send) is put here, keyed by the version, and
// the read-back is compared with it: other bytes are not taken.
//
// Written without a sync (a crash of the process keeps it; a machine
// crash may lose it, and the read-back is then taken unchecked, as before:
// logged). Removed when the version's replicas are dropped (persisted) and,
// for what a crash or a superseded version left, by Sweep at the next start.
//
// Thread-safety: as the Kv (any thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "common/result.h"
#include "fs/meta/kv.h"

namespace ckpt::fs::replica {

// Puts ino@version's checksum. Errors: the Kv's.
Status RememberSentSum(meta::Kv* kv, uint64_t ino, uint64_t version, uint64_t hi, uint64_t lo);
// Removes it (none: nothing to do).
Status ForgetSentSum(meta::Kv* kv, uint64_t ino, uint64_t version);
// The checksum sent with ino@version's replicas; nullopt when none was kept
// (or its value is not 16 bytes: a foreign value is no checksum). Errors:
// the Kv's (EIO), never ENOENT.
Result<std::optional<std::pair<uint64_t, uint64_t>>> SentSum(meta::Kv* kv, uint64_t ino, uint64_t version);
// Removes every kept checksum for which `needed(ino, version)` is false;
// the number removed. `needed` is called after the scan, with no lock of
// the Kv's held (it may take the caller's locks).
Result<uint64_t> SweepSentSums(meta::Kv* kv, const std::function<bool(uint64_t ino, uint64_t version)>& needed);

}  // namespace ckpt::fs::replica
