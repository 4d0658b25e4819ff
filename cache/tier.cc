// tier.cc — tier files on tmpfs and their budget.
#include "cache/tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "fs/common/log.h"

namespace ckpt::cache {
namespace {

uint64_t Allocated(const struct stat& st) { return static_cast<uint64_t>(st.st_blocks) * 512; }

// Copies the data ranges of `from` into `to` (holes stay holes).
int CopySparse(int from, int to, uint64_t size) {
  if (ftruncate(to, static_cast<off_t>(size)) != 0) return errno;
  off_t pos = 0;
  const off_t end = static_cast<off_t>(size);
  while (pos < end) {
    off_t data = lseek(from, pos, SEEK_DATA);
    if (data < 0) return errno == ENXIO ? 0 : errno;
    off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0) return errno;
    hole = std::min(hole, end);
    off_t in = data, out = data;
    while (in < hole) {
      ssize_t n = copy_file_range(from, &in, to, &out, static_cast<size_t>(hole - in), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) break;
    }
    pos = hole;
  }
  return 0;
}

bool ParseName(const char* name, uint64_t* ino) {
  if (strlen(name) != 16) return false;
  char* end = nullptr;
  *ino = strtoull(name, &end, 16);
  return end && *end == '\0';
}

}  // namespace

Result<std::unique_ptr<Tier>> Tier::Open(const std::string& dir, uint64_t budget) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int e = errno;
    LOG_ERROR("tier: cannot create {}: {}", dir, strerror(e));
    return Err(e);
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return ErrFromErrno();
  if (!S_ISDIR(st.st_mode)) {
    return Err(ENOTDIR);  // the caller reports it
  }
  if (st.st_uid != geteuid()) {
    return Err(EPERM);  // another user's tier: the caller reports it
  }
  if ((st.st_mode & 077) != 0) chmod(dir.c_str(), 0700);

  std::unique_ptr<Tier> t(new Tier(dir, budget));
  DIR* d = opendir(dir.c_str());
  if (!d) return ErrFromErrno();
  while (struct dirent* de = readdir(d)) {
    uint64_t ino;
    if (de->d_name[0] == '.') continue;
    std::string_view nm(de->d_name);
    if (nm.size() > 4 && nm.substr(nm.size() - 4) == ".tmp") {  // a snapshot copy cut short
      unlinkat(dirfd(d), de->d_name, 0);
      continue;
    }
    if (!ParseName(de->d_name, &ino)) {
      LOG_WARN("tier: ignoring stray file {}/{}", dir, de->d_name);
      continue;
    }
    struct stat fst;
    if (fstatat(dirfd(d), de->d_name, &fst, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fst.st_mode)) continue;
    File f;
    f.charged = Allocated(fst);
    t->used_ += f.charged;
    t->files_.emplace(ino, f);
    t->attached_.emplace_back(ino, static_cast<uint64_t>(fst.st_size));
  }
  closedir(d);
  return t;
}

FdHolder::~FdHolder() {
  if (fd >= 0) close(fd);
}

Tier::~Tier() = default;

std::string Tier::PathOf(uint64_t ino) const {
  char name[24];
  snprintf(name, sizeof name, "%016" PRIx64, ino);
  return dir_ + "/" + name;
}

Result<Tier::File*> Tier::OpenLocked(uint64_t ino, bool create) {
  auto it = files_.find(ino);
  if (it != files_.end() && it->second.fd) return &it->second;
  if (it == files_.end() && !create) return Err(ENOENT);
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = open(PathOf(ino).c_str(), flags, 0600);
  if (fd < 0) {
    int e = errno;
    if (e != ENOENT) LOG_ERROR("tier: open of ino {} failed: {}", ino, strerror(e));
    return Err(e);
  }
  File& f = files_[ino];
  f.fd = std::make_shared<const FdHolder>(fd);
  return &f;
}

Result<int> Tier::Pin(uint64_t ino, bool create) {
  std::lock_guard lk(mu_);
  auto f = OpenLocked(ino, create);
  if (!f) return Err(f.error());
  (*f)->pins++;
  return (*f)->fd->fd;
}

void Tier::Unpin(uint64_t ino) {
  std::lock_guard lk(mu_);
  auto it = files_.find(ino);
  if (it == files_.end() || it->second.pins == 0) abort();  // broken invariant: unbalanced pin
  --it->second.pins;
  MaybeClose(&it->second);
}

Result<FdRef> Tier::Ref(uint64_t key) {
  std::lock_guard lk(mu_);
  auto f = OpenLocked(key, false);
  if (!f) return Err(f.error());
  FdRef r = (*f)->fd;
  MaybeClose(*f);
  return r;
}

Status Tier::Snapshot(uint64_t ino, uint64_t snap_key, bool copy) {
  FdRef src;
  {
    std::lock_guard lk(mu_);
    auto f = OpenLocked(ino, false);
    if (!f) return Err(f.error());
    src = (*f)->fd;
    MaybeClose(*f);
  }
  const std::string live = PathOf(ino), snap = PathOf(snap_key), tmp = snap + ".tmp";
  FdRef fresh;
  if (copy) {
    // Not reserved: callers hold the namespace lock, which the evictor
    // needs. The copy is charged when done and may take the tier over its
    // budget for a moment; writers then wait until the drain frees it.
    struct stat st;
    int err = fstat(src->fd, &st) != 0 ? errno : 0;
    int fd = err ? -1 : open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (!err && fd < 0) err = errno;
    if (!err) {
      fresh = std::make_shared<const FdHolder>(fd);
      err = CopySparse(src->fd, fd, static_cast<uint64_t>(st.st_size));
    }
    if (err) {
      unlink(tmp.c_str());
      LOG_ERROR("tier: snapshot copy of ino {} failed: {}", ino, strerror(err));
      return Err(err);
    }
  }
  std::unique_lock lk(mu_);
  auto cur = files_.find(ino);
  if (cur == files_.end()) {  // removed meanwhile
    if (copy) unlink(tmp.c_str());
    return Err(ENOENT);
  }
  File old = cur->second;
  if (rename(live.c_str(), snap.c_str()) != 0) {
    int e = errno;
    if (copy) unlink(tmp.c_str());
    LOG_ERROR("tier: snapshot of ino {} failed: {}", ino, strerror(e));
    return Err(e);
  }
  File& s = files_[snap_key];
  used_ -= s.charged;  // a stale snapshot of the same key is replaced
  s.fd = nullptr;
  s.pins = 0;
  s.charged = old.charged;
  File& l = files_[ino];
  l.charged = 0;
  l.fd = nullptr;
  if (copy) {
    if (rename(tmp.c_str(), live.c_str()) != 0) abort();  // same directory, just created: cannot fail
    l.fd = fresh;
    Recharge(&l);
  } else if (old.pins > 0) {
    int fd = open(live.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      LOG_ERROR("tier: cannot create new file for ino {}: {}", ino, strerror(e));
      files_.erase(ino);
      return Err(e);
    }
    l.fd = std::make_shared<const FdHolder>(fd);
  } else {
    files_.erase(ino);
    return {};
  }
  MaybeClose(&l);
  return {};
}

Status Tier::Rekey(uint64_t from, uint64_t to) {
  std::lock_guard lk(mu_);
  auto it = files_.find(from);
  if (it == files_.end()) return Err(ENOENT);
  if (rename(PathOf(from).c_str(), PathOf(to).c_str()) != 0) return ErrFromErrno();
  if (auto old = files_.find(to); old != files_.end()) {
    used_ -= old->second.charged;
    files_.erase(old);
  }
  File f = it->second;
  files_.erase(it);
  files_[to] = f;
  return {};
}

void Tier::Recharge(File* f) {
  struct stat st;
  if (!f->fd || fstat(f->fd->fd, &st) != 0) return;
  uint64_t now = Allocated(st);
  used_ = used_ - f->charged + now;
  f->charged = now;
}

Status Tier::Reserve(uint64_t n) {
  std::unique_lock lk(mu_);
  if (n > budget_) return Err(ENOSPC);
  auto deadline = std::chrono::steady_clock::now() + wait_limit_;
  bool waited = false;
  while (used_ + reserved_ + n > budget_) {
    uint64_t missing = used_ + reserved_ + n - budget_;
    if (evictor_) {
      lk.unlock();
      Relief r = evictor_(missing);
      lk.lock();
      if (r == Relief::kFreed) continue;
      if (r == Relief::kHopeless) {
        LOG_WARN("tier: {} bytes requested, {} of {} in use, nothing can be drained or evicted: ENOSPC", n,
                 used_ + reserved_, budget_);
        return Err(ENOSPC);
      }
    } else if (wait_limit_.count() == 0) {
      return Err(ENOSPC);
    }
    if (!waited) {
      waited = true;
      waits_++;
      LOG_WARN("tier: full ({} of {} bytes in use); writer waits for the drain", used_ + reserved_, budget_);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      LOG_WARN("tier: gave up waiting for {} bytes after {} ms: ENOSPC", n, wait_limit_.count());
      return Err(ENOSPC);
    }
    space_cv_.wait_for(lk, std::chrono::milliseconds(100));
  }
  reserved_ += n;
  return {};
}

void Tier::Unreserve(uint64_t n) {
  std::lock_guard lk(mu_);
  reserved_ -= n;
}

Result<size_t> Tier::Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int)>& fn) {
  FdRef ref;
  {
    std::lock_guard lk(mu_);
    auto it = files_.find(ino);
    if (it == files_.end() || !it->second.fd) abort();  // REQUIRES: pinned
    ref = it->second.fd;
  }
  int fd = ref->fd;
  // Only bytes past the current end need new pages; writes inside the file
  // are charged after the fact by Recharge (holes are rare in checkpoints).
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrFromErrno();
  uint64_t end = off + len;
  uint64_t cur = static_cast<uint64_t>(st.st_size);
  uint64_t need = end <= cur ? 0 : (off >= cur ? len : end - cur);
  if (auto r = Reserve(need); !r) return Err(r.error());
  ssize_t n = fn(fd);
  {
    std::lock_guard lk(mu_);
    reserved_ -= need;
    auto it = files_.find(ino);
    if (it != files_.end() && it->second.fd == ref) Recharge(&it->second);
  }
  space_cv_.notify_all();
  if (n < 0) return Err(static_cast<int>(-n));
  return static_cast<size_t>(n);
}

Status Tier::Truncate(uint64_t ino, uint64_t size) {
  std::lock_guard lk(mu_);
  auto f = OpenLocked(ino, true);
  if (!f) return Err(f.error());
  Status res;
  if (ftruncate((*f)->fd->fd, static_cast<off_t>(size)) != 0) res = ErrFromErrno();
  Recharge(*f);
  MaybeClose(*f);
  space_cv_.notify_all();
  return res;
}

Status Tier::Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len) {
  // Only allocating modes take pages; punching and collapsing give them back.
  bool allocates = !(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE));
  uint64_t need = allocates ? len : 0;
  if (auto r = Reserve(need); !r) return r;
  std::lock_guard lk(mu_);
  reserved_ -= need;
  auto f = OpenLocked(ino, true);
  if (!f) return Err(f.error());
  Status res;
  if (fallocate((*f)->fd->fd, mode, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) res = ErrFromErrno();
  Recharge(*f);
  MaybeClose(*f);
  space_cv_.notify_all();
  return res;
}

Status Tier::Fill(uint64_t ino, uint64_t size, const std::function<int(int)>& fn) {
  if (auto r = Reserve(size); !r) return r;
  std::unique_lock lk(mu_);
  reserved_ -= size;
  int fd = open(PathOf(ino).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrFromErrno();
  File& f = files_[ino];
  f.fd = std::make_shared<const FdHolder>(fd);
  f.pins++;
  int err = 0;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) err = errno;
  // Account the full size now: the fill is about to fault in every page.
  used_ = used_ - f.charged + size;
  f.charged = size;
  lk.unlock();
  if (!err) err = fn(fd);
  lk.lock();
  File& g = files_[ino];
  g.pins--;
  MaybeClose(&g);
  if (err) {
    lk.unlock();
    Remove(ino);
    return Err(err);
  }
  return {};
}

void Tier::Remove(uint64_t ino) {
  {
    std::lock_guard lk(mu_);
    auto it = files_.find(ino);
    if (unlink(PathOf(ino).c_str()) != 0 && errno != ENOENT)
      LOG_ERROR("tier: cannot remove file of ino {}: {}", ino, strerror(errno));
    if (it == files_.end()) return;
    used_ -= it->second.charged;
    files_.erase(it);
  }
  space_cv_.notify_all();
}

bool Tier::Has(uint64_t ino) {
  std::lock_guard lk(mu_);
  return files_.count(ino) != 0;
}

uint64_t Tier::AllocatedBytes(uint64_t ino) {
  std::lock_guard lk(mu_);
  auto it = files_.find(ino);
  return it == files_.end() ? 0 : it->second.charged;
}

TierStats Tier::Stats() {
  std::lock_guard lk(mu_);
  return TierStats{budget_, used_, reserved_, files_.size(), waits_};
}

void Tier::NotifySpace() { space_cv_.notify_all(); }

}  // namespace ckpt::cache
