// mounts.cc — see mounts.h.
#include "common/mounts.h"

#include <libmount/libmount.h>

#include <memory>

namespace ckpt {

std::optional<MountInfo> MountAt(const std::string& dir, const char* table) {
  std::unique_ptr<libmnt_table, decltype(&mnt_unref_table)> tb(
      mnt_new_table_from_file(table ? table : "/proc/self/mountinfo"), &mnt_unref_table);
  if (!tb) return std::nullopt;
  // No cache set: targets compare as strings, with no realpath() (which
  // could block on a hung mount). Backward: the last line, the topmost.
  libmnt_fs* fs = mnt_table_find_target(tb.get(), dir.c_str(), MNT_ITER_BACKWARD);
  if (!fs) return std::nullopt;
  auto str = [](const char* s) { return s ? std::string(s) : std::string(); };
  MountInfo m;
  m.fstype = str(mnt_fs_get_fstype(fs));
  m.fs_options = str(mnt_fs_get_fs_options(fs));
  m.source = str(mnt_fs_get_source(fs));
  m.devno = mnt_fs_get_devno(fs);
  return m;
}

}  // namespace ckpt
