// mounts.h — what is mounted where: the kernel's mount table
// (/proc/self/mountinfo) read with libmount (util-linux), which parses its
// fields, escapes and optional tags, so no module parses it by hand (three
// did: the tier's huge-page check, the FUSE read-ahead tuning and the CLI's
// "is it a ckptfs mount" test).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

namespace ckpt {

struct MountInfo {
  std::string fstype;      // "tmpfs", "fuse.ckptfs", ...
  std::string fs_options;  // the superblock's options ("rw,size=...,huge=within_size")
  std::string source;
  dev_t devno = 0;         // the st_dev of files on it
};

// The topmost mount whose target is exactly `dir` (an absolute, normal
// path; symlinks are not resolved), or nullopt if nothing is mounted there
// or the table cannot be read. `table`: another mountinfo file (tests).
std::optional<MountInfo> MountAt(const std::string& dir, const char* table = nullptr);

}  // namespace ckpt
