// tier_mount.cc — see tier_mount.h.
#include "cache/tier_mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/mounts.h"

namespace ckpt::cache {
namespace {

std::string Parent(const std::string& dir) {
  size_t slash = dir.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
}

bool Empty(int dfd) {
  DIR* d = fdopendir(dup(dfd));
  if (!d) return false;
  bool empty = true;
  while (struct dirent* de = readdir(d))
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) empty = false;
  closedir(d);
  return empty;
}

}  // namespace

bool IsMountPoint(const std::string& dir) {
  struct stat a, b;
  if (lstat(dir.c_str(), &a) != 0 || lstat(Parent(dir).c_str(), &b) != 0) return false;
  return a.st_dev != b.st_dev;
}

bool HasHugePages(const std::string& dir) {
  auto m = MountAt(dir);
  if (!m || m->fstype != "tmpfs") return false;
  std::string o = "," + m->fs_options + ",";
  return o.find(",huge=within_size,") != std::string::npos || o.find(",huge=always,") != std::string::npos;
}

HugeTier PrepareHugeTier(const std::string& dir) {
  HugeTier h;
  if (geteuid() != 0) {
    h.why = "needs root to mount the tier's tmpfs";
    return h;
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    h.why = std::string("cannot create the tier directory: ") + strerror(errno);
    return h;
  }
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    h.why = std::string("cannot open the tier directory: ") + strerror(errno);
    return h;
  }
  // Whoever holds this lock decides; the other then finds the mount.
  (void)flock(dfd, LOCK_EX);
  struct statfs pfs;
  struct stat st;
  if (IsMountPoint(dir)) {
    h.on = HasHugePages(dir);
    if (!h.on) h.why = "the tier directory is a mount without huge pages";
  } else if (fstat(dfd, &st) != 0 || st.st_uid != geteuid()) {
    h.why = "the tier directory is not this daemon's";
  } else if (statfs(Parent(dir).c_str(), &pfs) != 0 || pfs.f_type != TMPFS_MAGIC) {
    h.why = "the tier directory is not on tmpfs";
  } else if (!Empty(dfd)) {
    h.why = "the tier directory already holds files (a tier made without huge pages keeps them)";
  } else {
    // As large as the tmpfs it sits in: the budget, not this mount, limits the tier.
    const unsigned long long size = static_cast<unsigned long long>(pfs.f_blocks) * pfs.f_bsize;
    const std::string opts = "mode=0700,huge=within_size,size=" + std::to_string(size);
    // On the directory this descriptor holds (checked above), never on
    // whatever the name leads to by the time of the call.
    const std::string target = "/proc/self/fd/" + std::to_string(dfd);
    if (mount("ckptfs-tier", target.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts.c_str()) == 0) {
      h.on = HasHugePages(dir);
      if (!h.on) h.why = "the kernel mounted the tier's tmpfs without huge pages";
    } else {
      h.why = std::string("cannot mount the tier's tmpfs: ") + strerror(errno);
    }
  }
  close(dfd);  // drops the lock
  return h;
}

bool UnmountTier(const std::string& dir) {
  if (!IsMountPoint(dir) || !MountAt(dir) || MountAt(dir)->fstype != "tmpfs") return true;
  if (umount2(dir.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) return true;
  LOG_WARN("tier {}: cannot unmount its tmpfs: {}", dir, strerror(errno));
  return false;
}

}  // namespace ckpt::cache
