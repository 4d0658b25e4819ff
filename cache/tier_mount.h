// tier_mount.h — huge pages for the memory tier (issue #15, --tier-huge).
//
// A tmpfs such as /dev/shm is mounted huge=never by default: every tier
// page is 4 KiB, so a write(2) into it and every read or fault out of it
// pays a page-cache lookup per 4 KiB. Measured on the 2-core VM (docs/
// benchmarks.md, "Huge pages"): writes into pre-allocated 2 MiB pages ran
// 1.3–1.4x, warm reads 1.2–1.5x those into and out of 4 KiB pages. Nothing
// can ask for huge pages per file on a huge=never tmpfs, so the tier gets a
// tmpfs of its own, mounted on the tier directory with huge=within_size
// (huge pages only where a file's size, or a spare's reservation, covers a
// whole 2 MiB: small files stay on small pages) and the size of the tmpfs
// it sits in. Being a mount, it outlives the daemon like /dev/shm itself:
// a restarted daemon finds it and its files; a reboot empties both.
//
// This module knows nothing of FUSE or the budget.
#pragma once

#include <string>

namespace ckpt::cache {

struct HugeTier {
  bool on = false;  // the tier directory is a tmpfs with huge pages
  std::string why;  // when off: the reason, for the log and status
};

// Makes `dir` (created 0700 if missing) a huge-page tmpfs of its own, when
// it can: as root, for a directory on tmpfs (the tier is memory anyway; a
// tier directory on a disk is left alone), never over files already there
// (they would be hidden: a tier from a mount before this option keeps its
// pages). A tmpfs already mounted there (this daemon's, before a restart)
// is kept as it is. Two daemons starting on one directory at once mount it
// once (a lock on the directory beneath).
HugeTier PrepareHugeTier(const std::string& dir);

// Is `dir` a tmpfs mount with huge pages (huge=within_size or always)?
bool HasHugePages(const std::string& dir);

// Is `dir` a mount point (another device than its parent's)?
bool IsMountPoint(const std::string& dir);

// Detaches a tmpfs mounted at `dir` (the tier's own, once its files are
// gone), so the directory beneath can be removed. False (errno set) if
// there was one and it could not be detached.
bool UnmountTier(const std::string& dir);

}  // namespace ckpt::cache
