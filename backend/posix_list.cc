// posix_list.cc — what the POSIX Backend reads of the tree: List (the
// whole tree, for the first mount's import), Stat and ListDir (the shared
// namespace), and the cluster records (PutRecord, ListRecords).
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "backend/checksum.h"
#include "backend/posix_backend_impl.h"
#include "backend/posix_copy.h"
#include "common/failpoint.h"
#include "common/io.h"

namespace ckpt::backend::posiximpl {

Status PosixBackend::List(const std::function<void(const Entry&)>& fn) {
  auto root = Root();
  if (!root) return Err(root.error());
  int fd = openat(root->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Fail(errno, "list: open", root_);
  return Walk(fd, "", fn);
}

Result<Entry> PosixBackend::Stat(const std::string& path) {
  if (!ValidPath(path)) return Fail(EINVAL, "stat: invalid path", path);
  auto root = Root();
  if (!root) return Err(root.error());
  // O_PATH is enough to fstatat, readlinkat and openat beneath it, and
  // needs no read permission on the directories on the way.
  Resolved r = OpenDirBeneath(root->get(), ParentOf(path), O_PATH, 0);
  if (!r.fd.ok()) return Fail(r.err == EXDEV ? ELOOP : r.err, "stat: open parent of", Show(path));
  auto e = EntryAt(r.fd.get(), LeafOf(path), path);
  if (!e) return Fail(e.error() == ENOTSUP ? EINVAL : e.error(), "stat", Show(path));
  return e;
}

Result<std::vector<Entry>> PosixBackend::ListDir(const std::string& dir) {
  if (!dir.empty() && !ValidPath(dir)) return Fail(EINVAL, "listdir: invalid path", dir);
  auto root = Root();
  if (!root) return Err(root.error());
  Resolved r = OpenDirBeneath(root->get(), dir, O_RDONLY, 0);
  if (!r.fd.ok()) return Fail(r.err == EXDEV ? ELOOP : r.err, "listdir: open", Show(dir));
  std::vector<std::string> names;
  if (int e = ReadNames(r.fd.get(), dir.empty(), &names)) return Fail(e, "listdir: readdir", Show(dir));
  std::vector<Entry> out;
  out.reserve(names.size());
  for (const auto& name : names) {
    auto e = EntryAt(r.fd.get(), name, dir.empty() ? name : dir + "/" + name);
    if (!e && (e.error() == ENOENT || e.error() == ENOTSUP)) continue;  // gone meanwhile, or a fifo...
    if (!e) return Fail(e.error(), "listdir", Show(dir, name));
    out.push_back(std::move(*e));
  }
  return out;
}

Status PosixBackend::PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) {
  if (!ValidRecordName(dir) || !ValidRecordName(name))
    return Fail(EINVAL, "put record: invalid name", dir + "/" + name);
  if (bytes.size() > kMaxRecordBytes) return Fail(EFBIG, "put record: too large", dir + "/" + name);
  auto root = Root();
  if (!root) return Err(root.error());
  auto d = OpenRecordDir(root->get(), dir, /*create=*/true);
  if (!d) return Err(d.error());
  const std::string where = Show(std::string(kClusterDir) + "/" + dir, name);
  std::string tmp;
  int raw = -1;
  for (int tries = 0; raw < 0; tries++) {
    tmp = UniqueName(".tmp-");
    raw = openat(d->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (raw < 0 && (errno != EEXIST || tries >= 8)) return Fail(errno, "put record: create temporary for", where);
  }
  Fd fd(raw);
  int err = PwriteFull(fd.get(), bytes.data(), bytes.size(), 0);
  if (!err && fsync(fd.get()) != 0) err = errno;
  if (!err && renameat(d->get(), tmp.c_str(), d->get(), name.c_str()) != 0) err = errno;
  if (err) {
    unlinkat(d->get(), tmp.c_str(), 0);
    return Fail(err, "put record", where);
  }
  return FsyncDirFd(d->get(), where);
}

Result<std::vector<std::pair<std::string, std::string>>> PosixBackend::ListRecords(const std::string& dir) {
  if (!ValidRecordName(dir)) return Fail(EINVAL, "list records: invalid name", dir);
  auto root = Root();
  if (!root) return Err(root.error());
  std::vector<std::pair<std::string, std::string>> out;
  auto d = OpenRecordDir(root->get(), dir, /*create=*/false);
  if (!d && d.error() == ENOENT) return out;
  if (!d) return Err(d.error());
  std::vector<std::string> names;
  if (int e = ReadNames(d->get(), false, &names)) return Fail(e, "list records: readdir", Show(kClusterDir, dir));
  for (const std::string& n : names) {
    if (!ValidRecordName(n)) continue;  // temporaries (".tmp-...") and anything not a record's name
    Fd fd(openat(d->get(), n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!fd.ok()) {
      if (errno == ENOENT || errno == ELOOP) continue;  // replaced meanwhile, or a symlink: not a record
      return Fail(errno, "list records: open", Show(std::string(kClusterDir) + "/" + dir, n));
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return Fail(errno, "list records: stat", Show(kClusterDir, dir));
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxRecordBytes) {
      LOG_DEBUG("posix backend: list records: '{}' is not a regular file of at most {} bytes; skipped", n,
                kMaxRecordBytes);
      continue;
    }
    std::string bytes(static_cast<size_t>(st.st_size), '\0');
    ssize_t got = pread(fd.get(), bytes.data(), bytes.size(), 0);
    if (got < 0) return Fail(errno, "list records: read", Show(std::string(kClusterDir) + "/" + dir, n));
    bytes.resize(static_cast<size_t>(got));
    out.emplace_back(n, std::move(bytes));
  }
  return out;
}

Result<Fd> PosixBackend::OpenRecordDir(int root, const std::string& dir, bool create) {
  Fd cur(openat(root, ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cur.ok()) return Fail(errno, "records: open root", root_);
  std::string done;
  for (const std::string& c : {std::string(kClusterDir), dir}) {
    done += done.empty() ? c : "/" + c;
    Fd fd(openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.ok() && errno == ENOENT && create) {
      if (mkdirat(cur.get(), c.c_str(), 0700) != 0 && errno != EEXIST) return Fail(errno, "records: mkdir", Show(done));
      fd = Fd(openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      Fd sync(openat(cur.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (sync.ok()) (void)fsync(sync.get());
    }
    if (!fd.ok()) {
      int e = errno;
      return Fail(e == ENOENT ? ENOENT : Classify(cur.get(), c, e), "records: open", Show(done));
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return Fail(errno, "records: stat", Show(done));
    if (st.st_uid != geteuid()) {
      LOG_WARN("posix backend: '{}' is owned by uid {}, not the daemon's; cluster records there are not used",
               Show(done), st.st_uid);
      return Err(EACCES);
    }
    cur = std::move(fd);
  }
  return cur;
}

int PosixBackend::ReadNames(int fd, bool at_root, std::vector<std::string>* names) {
  int dup_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup_fd < 0) return errno;
  DIR* d = fdopendir(dup_fd);
  if (!d) {
    int e = errno;
    close(dup_fd);
    return e;
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
  errno = 0;
  while (dirent* de = readdir(d)) {
    std::string_view n = de->d_name;
    if (n == "." || n == "..") continue;
    if (at_root && (n == kTmpDir || n == kClusterDir || n.starts_with(kProbePrefix))) continue;
    names->emplace_back(n);
  }
  if (errno != 0) return errno;
  std::sort(names->begin(), names->end());
  return 0;
}

Result<Entry> PosixBackend::EntryAt(int dfd, const std::string& name, const std::string& rel) {
  struct stat st;
  if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Err(errno);
  Entry e{};
  e.path = rel;
  e.mode = st.st_mode & 07777;
  e.mtime_sec = st.st_mtim.tv_sec;
  e.mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
  if (S_ISDIR(st.st_mode)) {
    e.type = Entry::Type::kDir;
  } else if (S_ISREG(st.st_mode)) {
    e.type = Entry::Type::kFile;
    e.size = static_cast<uint64_t>(st.st_size);
    // O_NONBLOCK: a file swapped for a fifo meanwhile must not hang us.
    Fd f(openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    char buf[64];
    ssize_t n = f.ok() ? fgetxattr(f.get(), kChecksumXattr, buf, sizeof buf) : -1;
    if (n > 0) e.has_checksum = ParseChecksumHex(std::string_view(buf, n), &e.checksum_hi, &e.checksum_lo);
  } else if (S_ISLNK(st.st_mode)) {
    e.type = Entry::Type::kSymlink;
    std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
    for (;;) {
      ssize_t n = readlinkat(dfd, name.c_str(), target.data(), target.size());
      if (n < 0) return Err(errno);
      if (static_cast<size_t>(n) < target.size()) {
        target.resize(static_cast<size_t>(n));
        e.target = std::move(target);
        break;
      }
      target.resize(target.size() * 2);  // grew since the stat
    }
  } else {
    return Err(ENOTSUP);
  }
  return e;
}

Status PosixBackend::Walk(int fd, const std::string& rel, const std::function<void(const Entry&)>& fn, int depth) {
  Fd dir(fd);
  std::vector<std::string> names;
  if (int e = ReadNames(dir.get(), rel.empty(), &names)) return Fail(e, "list: readdir", Show(rel));
  for (const auto& name : names) {
    std::string child = rel.empty() ? name : rel + "/" + name;
    auto e = EntryAt(dir.get(), name, child);
    if (!e) {
      if (e.error() == ENOENT) continue;  // removed while we walked
      if (e.error() == ENOTSUP) {
        LOG_WARN("posix backend: list: skipping '{}': not a file, directory or symlink", Show(child));
        continue;
      }
      return Fail(e.error(), "list: stat", Show(child));
    }
    fn(*e);
    if (e->type != Entry::Type::kDir) continue;
    if (depth + 1 >= kMaxTreeDepth) {
      LOG_WARN("posix backend: list: not entering '{}': deeper than {} levels", Show(child), kMaxTreeDepth);
      continue;
    }
    int sub = openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;  // changed while we walked
      return Fail(errno, "list: open", Show(child));
    }
    if (auto s = Walk(sub, child, fn, depth + 1); !s) return s;
  }
  return {};
}

}  // namespace ckpt::backend::posiximpl
