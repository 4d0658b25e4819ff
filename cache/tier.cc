// tier.cc — tier files on tmpfs and their budget.
#include "cache/tier.h"

#include "cache/tier_mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "common/io.h"
#include "common/log.h"

namespace ckpt::cache {
namespace {

uint64_t Allocated(const struct stat& st) { return static_cast<uint64_t>(st.st_blocks) * 512; }

// At most this much per copy_file_range: this kernel does not preempt a
// system call, so one call copying a 2 GiB version held its CPU for 0.8–6
// s (0.35–2.6 GB/s: fresh tmpfs pages are slow to come by on this VM), and
// the requests of the ring threads pinned there waited as long. Between
// calls whatever waits for the CPU runs: 2 MiB is 1–6 ms.
constexpr size_t kCopyChunk = 2 << 20;

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
      const size_t len = std::min(static_cast<size_t>(hole - in), kCopyChunk);
      ssize_t n = copy_file_range(from, &in, to, &out, len, 0);
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

Result<std::unique_ptr<Tier>> Tier::Open(const std::string& dir, uint64_t budget, std::string* why) {
  std::string ignored;
  if (!why) why = &ignored;
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    int e = errno;
    *why = fmt::format("cannot create it: {}", strerror(e));
    return Err(e);
  }
  // Everything below goes through this descriptor: a symlink planted at
  // the directory's name, or at any file's name in it, is never followed.
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    int e = errno;
    *why = e == ELOOP || e == ENOTDIR ? "it is not a directory (a symlink?)" : strerror(e);
    return Err(e == ELOOP ? ENOTDIR : e);
  }
  std::unique_ptr<Tier> t(new Tier(dir, budget, dfd));
  struct stat st;
  if (fstat(dfd, &st) != 0) return ErrFromErrno();
  if (st.st_uid != geteuid()) {
    *why = fmt::format("owned by uid {}, not by this daemon (uid {})", st.st_uid, geteuid());
    return Err(EPERM);
  }
  if ((st.st_mode & 077) != 0) (void)fchmod(dfd, 0700);
  // One daemon per tier directory, for the daemon's life: a second mount
  // given the same --tier-dir would otherwise delete this one's files as
  // "unknown" at its start-up.
  t->lock_fd_ = openat(dfd, kLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (t->lock_fd_ < 0) {
    int e = errno;
    *why = fmt::format("cannot create its lock file: {}", strerror(e));
    return Err(e);
  }
  if (flock(t->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    *why = "it is in use by another ckptfs daemon";
    return Err(e == EWOULDBLOCK ? EBUSY : e);
  }

  DIR* d = fdopendir(dup(dfd));
  if (!d) return ErrFromErrno();
  MutexLock lk(&t->mu_);  // nobody else sees the Tier yet: for the analysis
  int err = 0;
  while (struct dirent* de = readdir(d)) {
    std::string_view nm(de->d_name);
    if (nm == "." || nm == ".." || nm == kLockName) continue;
    if (nm == kOwnerName || nm == std::string(kOwnerName) + ".tmp") continue;
    struct stat fst;
    if (fstatat(dfd, de->d_name, &fst, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    if (nm == kOrphanDir) {
      if (!S_ISDIR(fst.st_mode) || fst.st_uid != geteuid()) {
        *why = fmt::format("{}/{} is not a directory this daemon made", dir, nm);
        err = EEXIST;
        break;
      }
      continue;
    }
    // Only regular files this user made under names this module gives out.
    uint64_t ino;
    bool tmp = nm.size() > 4 && nm.substr(nm.size() - 4) == ".tmp";
    std::string base(tmp ? nm.substr(0, nm.size() - 4) : nm);
    if (!S_ISREG(fst.st_mode) || fst.st_uid != geteuid() || !ParseName(base.c_str(), &ino)) {
      *why = fmt::format("{}/{} is not a file ckptfs made ({}); move it away", dir, nm,
                         S_ISLNK(fst.st_mode)      ? "a symlink"
                         : !S_ISREG(fst.st_mode)   ? "not a regular file"
                         : fst.st_uid != geteuid() ? "another user's file"
                                                   : "a foreign name");
      err = EEXIST;
      break;
    }
    if (tmp) {  // a snapshot copy cut short
      unlinkat(dfd, de->d_name, 0);
      continue;
    }
    File f;
    f.charged = Allocated(fst);
    t->used_ += f.charged;
    t->files_.emplace(ino, f);
    t->attached_.emplace_back(ino, static_cast<uint64_t>(fst.st_size));
  }
  closedir(d);
  if (err) return Err(err);
  t->orphans_ = t->CountOrphans();
  return t;
}

uint64_t Tier::CountOrphans() {
  int od = openat(dirfd_, kOrphanDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (od < 0) return 0;
  DIR* d = fdopendir(od);
  if (!d) {
    close(od);
    return 0;
  }
  uint64_t n = 0;
  while (struct dirent* de = readdir(d))
    if (de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

Status Tier::Orphan(uint64_t key) {
  MutexLock lk(&mu_);
  auto it = files_.find(key);
  if (it != files_.end() && it->second.pins > 0) return Err(EBUSY);
  if (mkdirat(dirfd_, kOrphanDir, 0700) != 0 && errno != EEXIST) return ErrFromErrno();
  std::string name = NameOf(key);
  std::string to = std::string(kOrphanDir) + "/" + name;
  if (renameat(dirfd_, name.c_str(), dirfd_, to.c_str()) != 0) {
    if (errno != ENOENT) return ErrFromErrno();
    if (it != files_.end()) {  // already gone: nothing to keep
      used_ -= it->second.charged;
      files_.erase(it);
    }
    return {};
  }
  if (it != files_.end()) {
    used_ -= it->second.charged;  // no longer the budget's: the operator's, until removed
    files_.erase(it);
  }
  orphans_++;
  space_cv_.NotifyAll();
  return {};
}

FdHolder::~FdHolder() {
  if (fd >= 0) close(fd);
}

Tier::~Tier() {
  files_.clear();
  if (lock_fd_ >= 0) close(lock_fd_);
  if (dirfd_ >= 0) close(dirfd_);
}

std::string Tier::NameOf(uint64_t ino) {
  char name[24];
  snprintf(name, sizeof name, "%016" PRIx64, ino);
  return name;
}

std::string Tier::PathOf(uint64_t ino) const { return dir_ + "/" + NameOf(ino); }

int Tier::OpenAt(const std::string& name, int flags) const {
  return openat(dirfd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0600);
}

Result<Tier::File*> Tier::OpenLocked(uint64_t ino, bool create) {
  auto it = files_.find(ino);
  if (it != files_.end() && it->second.fd) return &it->second;
  if (it == files_.end() && !create) return Err(ENOENT);
  int fd = OpenAt(NameOf(ino), O_RDWR | (create ? O_CREAT : 0));
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
  MutexLock lk(&mu_);
  auto f = OpenLocked(ino, create);
  if (!f) return Err(f.error());
  (*f)->pins++;
  return (*f)->fd->fd;
}

void Tier::Unpin(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = files_.find(ino);
  if (it == files_.end() || it->second.pins == 0) abort();  // broken invariant: unbalanced pin
  --it->second.pins;
  MaybeClose(&it->second);
}

Result<FdRef> Tier::Ref(uint64_t key) {
  MutexLock lk(&mu_);
  auto f = OpenLocked(key, false);
  if (!f) return Err(f.error());
  FdRef r = (*f)->fd;
  MaybeClose(*f);
  return r;
}

Status Tier::Snapshot(uint64_t ino, uint64_t snap_key, bool copy, bool wait, Deadline deadline) {
  auto ref = Ref(ino);
  if (!ref) return Err(ref.error());
  FdRef src = std::move(*ref);
  const std::string live = NameOf(ino), snap = NameOf(snap_key), tmp = snap + ".tmp";
  FdRef fresh;
  uint64_t reserve = 0;  // bytes reserved for the copy, until it is charged
  if (copy) {
    // The copy allocates what the source allocates (holes stay holes):
    // reserved before it starts, released once Recharge below counts it.
    struct stat st;
    if (fstat(src->fd, &st) != 0) return ErrFromErrno();
    reserve = static_cast<uint64_t>(st.st_blocks) * 512;
    if (auto r = Reserve(reserve, wait, true, deadline); !r) return r;
    int fd = OpenAt(tmp, O_RDWR | O_CREAT | O_TRUNC);
    int err = fd < 0 ? errno : 0;
    if (!err) {
      fresh = std::make_shared<const FdHolder>(fd);
      err = CopySparse(src->fd, fd, static_cast<uint64_t>(st.st_size));
    }
    if (err) {
      unlinkat(dirfd_, tmp.c_str(), 0);
      Unreserve(reserve);
      space_cv_.NotifyAll();
      LOG_ERROR("tier: snapshot copy of ino {} failed: {}", ino, strerror(err));
      return Err(err);
    }
  }
  MutexLock lk(&mu_);
  reserved_ -= reserve;  // from here on the copy is charged (Recharge) or gone
  space_cv_.NotifyAll();
  auto cur = files_.find(ino);
  if (cur == files_.end()) {  // removed meanwhile
    if (copy) unlinkat(dirfd_, tmp.c_str(), 0);
    return Err(ENOENT);
  }
  File old = cur->second;
  if (renameat(dirfd_, live.c_str(), dirfd_, snap.c_str()) != 0) {
    int e = errno;
    if (copy) unlinkat(dirfd_, tmp.c_str(), 0);
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
    if (renameat(dirfd_, tmp.c_str(), dirfd_, live.c_str()) != 0) abort();  // same directory, just created: cannot fail
    l.fd = fresh;
    Recharge(&l);
  } else if (old.pins > 0) {
    int fd = OpenAt(live, O_RDWR | O_CREAT | O_EXCL);
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
  MutexLock lk(&mu_);
  auto it = files_.find(from);
  if (it == files_.end()) return Err(ENOENT);
  if (renameat(dirfd_, NameOf(from).c_str(), dirfd_, NameOf(to).c_str()) != 0) return ErrFromErrno();
  if (auto old = files_.find(to); old != files_.end()) {
    used_ -= old->second.charged;
    files_.erase(old);
  }
  File f = it->second;
  files_.erase(it);
  files_[to] = f;
  return {};
}

Status Tier::CopyOut(uint64_t ino, uint64_t snap_key, bool wait, bool evict, Deadline deadline) {
  auto ref = Ref(ino);
  if (!ref) return Err(ref.error());
  FdRef src = std::move(*ref);
  const std::string snap = NameOf(snap_key), tmp = snap + ".tmp";
  struct stat st;
  if (fstat(src->fd, &st) != 0) return ErrFromErrno();
  const uint64_t reserve = Allocated(st);
  if (auto r = Reserve(reserve, wait, evict, deadline); !r) return r;
  int fd = OpenAt(tmp, O_RDWR | O_CREAT | O_TRUNC);
  int err = fd < 0 ? errno : 0;
  FdRef fresh;
  if (!err) {
    fresh = std::make_shared<const FdHolder>(fd);
    err = CopySparse(src->fd, fd, static_cast<uint64_t>(st.st_size));
  }
  if (!err && renameat(dirfd_, tmp.c_str(), dirfd_, snap.c_str()) != 0) err = errno;
  MutexLock lk(&mu_);
  reserved_ -= reserve;
  space_cv_.NotifyAll();
  if (err) {
    unlinkat(dirfd_, tmp.c_str(), 0);
    LOG_ERROR("tier: copy of ino {} for its snapshot failed: {}", ino, strerror(err));
    return Err(err);
  }
  File& s = files_[snap_key];
  used_ -= s.charged;  // a stale snapshot of the same key is replaced
  s.charged = 0;
  s.pins = 0;
  s.fd = fresh;
  Recharge(&s);
  MaybeClose(&s);
  return {};
}

void Tier::WarmPages(uint64_t bytes) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14
#endif
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0) {
    // An older kernel: one store per page faults it in the same way.
    const long page = sysconf(_SC_PAGESIZE);
    auto* c = static_cast<volatile char*>(p);
    for (uint64_t off = 0; off < bytes; off += static_cast<uint64_t>(page)) c[off] = 0;
  }
  munmap(p, bytes);
}

bool Tier::AddSpare(uint64_t bytes, uint64_t headroom, const std::function<bool()>& stop) {
  std::string name;
  {
    MutexLock lk(&mu_);
    if (closed_ || used_ + reserved_ + bytes + headroom > Budget() || making_spare_ > 0) return false;
    reserved_ += bytes;
    making_spare_ = bytes;
    room_wanted_ = false;
    // A name Open removes as a copy cut short (*.tmp), in a key range no
    // inode number reaches and outside the snapshot keys (no top bit).
    name = NameOf(0x7FFFFFFFFFF00000ULL | (next_spare_++ & 0xFFFFF)) + ".tmp";
  }
  const auto t0 = std::chrono::steady_clock::now();
  int fd = OpenAt(name, O_RDWR | O_CREAT | O_TRUNC);
  int err = fd < 0 ? errno : 0;
  uint64_t made = 0;
  while (!err && made < bytes && !(made > 0 && ((stop && stop()) || RoomWanted()))) {
    const uint64_t n = std::min(kWarmChunk, bytes - made);
    WarmPages(n);
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(made), static_cast<off_t>(n)) != 0) err = errno;
    else made += n;
  }
  struct stat st {};
  if (!err && fstat(fd, &st) != 0) err = errno;
  if (fd >= 0) close(fd);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MutexLock lk(&mu_);
  reserved_ -= bytes;
  making_spare_ = 0;
  warmed_bytes_ += made;
  warm_seconds_ += took;
  if (err || closed_ || made == 0) {
    unlinkat(dirfd_, name.c_str(), 0);
    space_cv_.NotifyAll();
    if (err && err != spare_err_)
      LOG_WARN("tier: cannot pre-allocate {} bytes for a spare: {} (not said again until a spare is made)", bytes,
               strerror(err));
    if (err) {
      spare_err_ = err;
      spare_failures_++;
    }
    return false;
  }
  spare_err_ = 0;
  used_ += Allocated(st);
  spares_.push_back({name, Allocated(st)});
  space_cv_.NotifyAll();  // a writer waiting for the room it held drops it now
  return true;
}

bool Tier::RoomWanted() {
  MutexLock lk(&mu_);
  return room_wanted_;
}

std::pair<uint64_t, int> Tier::SpareFailures() {
  MutexLock lk(&mu_);
  return {spare_failures_, spare_err_};
}

std::pair<uint64_t, double> Tier::SpareWarmth() {
  MutexLock lk(&mu_);
  return {warmed_bytes_, warm_seconds_};
}

Result<int> Tier::AdoptSpare(uint64_t ino, uint64_t want) {
  MutexLock lk(&mu_);
  // The smallest that holds `want`, else the largest (part of the file
  // still lands in allocated pages).
  auto best = spares_.end();
  for (auto it = spares_.begin(); it != spares_.end(); ++it)
    if (it->bytes >= want && (best == spares_.end() || it->bytes < best->bytes)) best = it;
  if (best == spares_.end())
    for (auto it = spares_.begin(); it != spares_.end(); ++it)
      if (best == spares_.end() || it->bytes > best->bytes) best = it;
  if (best == spares_.end()) return Err(ENOENT);
  auto cur = files_.find(ino);
  if (cur != files_.end() && cur->second.pins > 0) return Err(EBUSY);
  // Opened before it replaces the file: a descriptor the process cannot
  // get (EMFILE) leaves the old file where it was.
  int fd = OpenAt(best->name, O_RDWR);
  if (fd < 0 || renameat(dirfd_, best->name.c_str(), dirfd_, NameOf(ino).c_str()) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    LOG_WARN("tier: cannot use a pre-allocated file for ino {}: {}", ino, strerror(e));
    return Err(e);
  }
  File& f = files_[ino];
  used_ -= f.charged;  // the file it replaced is gone (a reader's descriptor keeps its bytes)
  f.fd = std::make_shared<const FdHolder>(fd);
  f.pins = 1;
  f.charged = best->bytes;
  spares_.erase(best);
  return fd;
}

void Tier::TrimBeyondEof(uint64_t ino) {
  MutexLock lk(&mu_);
  auto f = OpenLocked(ino, false);
  if (!f) return;
  struct stat st;
  int fd = (*f)->fd->fd;
  if (fstat(fd, &st) == 0 && Allocated(st) > static_cast<uint64_t>(st.st_size)) {
    const off_t page = 4096, from = (st.st_size + page - 1) / page * page;
    // Far enough past any end a budget allows.
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, from, off_t{1} << 60) != 0)
      LOG_WARN("tier: cannot free the unused pre-allocated pages of ino {}: {}", ino, strerror(errno));
    Recharge(*f);
    space_cv_.NotifyAll();
  }
  MaybeClose(*f);
}

void Tier::DropSpares() {
  MutexLock lk(&mu_);
  for (const Spare& sp : spares_) {
    unlinkat(dirfd_, sp.name.c_str(), 0);
    used_ -= sp.bytes;
  }
  if (!spares_.empty()) space_cv_.NotifyAll();
  spares_.clear();
}

uint64_t Tier::Charged(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = files_.find(ino);
  return it == files_.end() ? 0 : it->second.charged;
}

std::optional<struct stat> Tier::StatIfOpen(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = files_.find(ino);
  struct stat st;
  if (it == files_.end() || !it->second.fd || fstat(it->second.fd->fd, &st) != 0) return std::nullopt;
  return st;
}

std::pair<uint64_t, size_t> Tier::Spares() {
  MutexLock lk(&mu_);
  uint64_t b = 0;
  for (const Spare& sp : spares_) b += sp.bytes;
  return {b, spares_.size()};
}

Result<struct stat> Tier::Refresh(uint64_t ino) {
  MutexLock lk(&mu_);
  auto f = OpenLocked(ino, false);
  if (!f) return Err(f.error());
  struct stat st;
  if (fstat((*f)->fd->fd, &st) != 0) {
    MaybeClose(*f);
    return ErrFromErrno();
  }
  uint64_t now = Allocated(st);
  used_ = used_ - (*f)->charged + now;
  (*f)->charged = now;
  MaybeClose(*f);
  return st;
}

void Tier::Recharge(File* f) {
  struct stat st;
  if (!f->fd || fstat(f->fd->fd, &st) != 0) return;
  uint64_t now = Allocated(st);
  used_ = used_ - f->charged + now;
  f->charged = now;
}

Status Tier::Reserve(uint64_t n, bool wait, bool evict, Deadline by) {
  MutexLock lk(&mu_);
  if (n > budget_) return Err(ENOSPC);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = std::min(start + wait_limit_, by.value_or(start + wait_limit_));
  bool waited = false;
  while (used_ + reserved_ + n > Budget()) {
    uint64_t missing = used_ + reserved_ + n - Budget();
    if (!spares_.empty()) {  // pre-allocated pages go first: they hold nobody's bytes
      used_ -= spares_.back().bytes;
      unlinkat(dirfd_, spares_.back().name.c_str(), 0);
      spares_.pop_back();
      continue;
    }
    if (outside_relief_ && outside_ > 0) {  // others' spare pages and kept copies go before this node's files
      lk.Unlock();
      const uint64_t freed = outside_relief_(missing);
      lk.Lock();
      if (freed > 0) continue;
    }
    if (making_spare_ > 0 && making_spare_ >= missing) {
      // A spare being made (AddSpare) holds the room: it stops at its next
      // chunk, and what it made is dropped above. Waiting for that is
      // waiting for nobody's bytes — not ENOSPC, not the drain.
      // A caller that may not wait here (a FUSE worker; one holding the
      // lock AddSpare's stop check takes) is told to come back.
      room_wanted_ = true;
      if (!wait) return Err(EAGAIN);
      if (!evict) return Err(ENOSPC);
      space_cv_.WaitFor(&mu_, std::chrono::milliseconds(100));
      continue;
    }
    if (!evict) return Err(ENOSPC);
    if (evictor_) {
      lk.Unlock();  // the evictor takes InodeTable's lock, which comes first
      Relief r = evictor_(missing);
      lk.Lock();
      if (r == Relief::kFreed) continue;
      if (r == Relief::kHopeless) {
        LOG_WARN("tier: {} bytes requested, {} of {} in use, nothing can be drained or evicted: ENOSPC", n,
                 used_ + reserved_, budget_);
        return Err(ENOSPC);
      }
    } else if (wait_limit_.count() == 0) {
      return Err(ENOSPC);
    }
    if (!wait) return Err(EAGAIN);  // the caller waits elsewhere (not on a FUSE worker)
    if (closed_) return Err(ENOSPC);
    if (!waited) {
      waited = true;
      waits_++;
      if (Budget() < budget_)
        LOG_WARN("tier: memory pressure ({} bytes in use, {} allowed now); writer waits for the drain", used_ + reserved_,
                 Budget());
      else
        LOG_WARN("tier: full ({} of {} bytes in use); writer waits for the drain", used_ + reserved_, budget_);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      LOG_WARN("tier: gave up waiting for {} bytes after {} ms: ENOSPC", n,
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count());
      return Err(ENOSPC);
    }
    space_cv_.WaitFor(&mu_, std::chrono::milliseconds(100));
  }
  reserved_ += n;
  return {};
}

void Tier::set_pressure_limit(uint64_t limit) {
  MutexLock lk(&mu_);
  if (limit == pressure_limit_) return;
  pressure_limit_ = limit;
  space_cv_.NotifyAll();
}

void Tier::Unreserve(uint64_t n) {
  MutexLock lk(&mu_);
  reserved_ -= n;
}

Result<size_t> Tier::Write(uint64_t ino, uint64_t off, size_t len, const std::function<ssize_t(int)>& fn, bool wait,
                           Deadline deadline) {
  FdRef ref;
  {
    MutexLock lk(&mu_);
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
  if (auto r = Reserve(need, wait, true, deadline); !r) return Err(r.error());
  ssize_t n = fn(fd);
  {
    MutexLock lk(&mu_);
    reserved_ -= need;
    auto it = files_.find(ino);
    if (it != files_.end() && it->second.fd == ref) Recharge(&it->second);
  }
  space_cv_.NotifyAll();
  if (n < 0) return Err(static_cast<int>(-n));
  return static_cast<size_t>(n);
}

Status Tier::Truncate(uint64_t ino, uint64_t size) {
  MutexLock lk(&mu_);
  auto f = OpenLocked(ino, true);
  if (!f) return Err(f.error());
  Status res;
  if (ftruncate((*f)->fd->fd, static_cast<off_t>(size)) != 0) res = ErrFromErrno();
  Recharge(*f);
  MaybeClose(*f);
  space_cv_.NotifyAll();
  return res;
}

Status Tier::Fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, bool wait, Deadline deadline) {
  // Only allocating modes take pages; punching and collapsing give them back.
  bool allocates = !(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE));
  uint64_t need = allocates ? len : 0;
  if (auto r = Reserve(need, wait, true, deadline); !r) return r;
  MutexLock lk(&mu_);
  reserved_ -= need;
  auto f = OpenLocked(ino, true);
  if (!f) return Err(f.error());
  Status res;
  if (fallocate((*f)->fd->fd, mode, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) res = ErrFromErrno();
  Recharge(*f);
  MaybeClose(*f);
  space_cv_.NotifyAll();
  return res;
}

Status Tier::Fill(uint64_t ino, uint64_t size, const std::function<int(int)>& fn) {
  // A file larger than the whole budget can only be sparse (a write past
  // the budget fails), and the fetch writes its data only: it is charged
  // by what the fetch allocated, checked once it is done.
  const bool beyond_budget = size > budget_;
  const uint64_t reserve = beyond_budget ? 0 : size;
  if (auto r = Reserve(reserve, true); !r) return r;
  MutexLock lk(&mu_);
  reserved_ -= reserve;
  int fd = OpenAt(NameOf(ino), O_RDWR | O_CREAT | O_TRUNC);
  if (fd < 0) return ErrFromErrno();
  File& f = files_[ino];
  f.fd = std::make_shared<const FdHolder>(fd);
  f.pins++;
  int err = 0;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) err = errno;
  // Account the reservation now: the fill is about to fault in the pages.
  used_ = used_ - f.charged + reserve;
  f.charged = reserve;
  lk.Unlock();
  if (!err) err = fn(fd);
  lk.Lock();
  File& g = files_[ino];
  g.pins--;
  Recharge(&g);  // holes the fetch skipped are free
  if (!err && beyond_budget && g.charged > budget_) {
    LOG_WARN("tier: ino {} holds {} bytes of data, more than the whole budget ({})", ino, g.charged, budget_);
    err = ENOSPC;
  }
  MaybeClose(&g);
  if (err) {
    lk.Unlock();
    Remove(ino);
    return Err(err);
  }
  space_cv_.NotifyAll();
  return {};
}

void Tier::Remove(uint64_t ino) {
  {
    MutexLock lk(&mu_);
    auto it = files_.find(ino);
    if (unlinkat(dirfd_, NameOf(ino).c_str(), 0) != 0 && errno != ENOENT)
      LOG_ERROR("tier: cannot remove file of ino {}: {}", ino, strerror(errno));
    if (it == files_.end()) return;
    used_ -= it->second.charged;
    if (it->second.charged >= kFreedNoted) last_freed_ = std::chrono::steady_clock::now();
    files_.erase(it);
  }
  space_cv_.NotifyAll();
}

std::chrono::steady_clock::time_point Tier::LastFreed() {
  MutexLock lk(&mu_);
  return last_freed_;
}

bool Tier::Has(uint64_t ino) {
  MutexLock lk(&mu_);
  return files_.count(ino) != 0;
}

uint64_t Tier::AllocatedBytes(uint64_t ino) {
  MutexLock lk(&mu_);
  auto it = files_.find(ino);
  return it == files_.end() ? 0 : it->second.charged;
}

TierStats Tier::Stats() {
  MutexLock lk(&mu_);
  return TierStats{budget_, used_, reserved_, files_.size(), waits_, orphans_, outside_};
}

bool Tier::TakeOutside(uint64_t n, bool force) {
  MutexLock lk(&mu_);
  if (!force && (closed_ || used_ + reserved_ + n > Budget())) return false;
  outside_ += n;
  return true;
}

void Tier::GiveOutside(uint64_t n) {
  {
    MutexLock lk(&mu_);
    outside_ -= std::min(outside_, n);
  }
  space_cv_.NotifyAll();
}

bool Tier::Tight() {
  MutexLock lk(&mu_);
  uint64_t spare = 0;
  for (const Spare& x : spares_) spare += x.bytes;
  return used_ + reserved_ - spare > Budget() / 4 * 3;
}

void Tier::NotifySpace() { space_cv_.NotifyAll(); }

Status Tier::WriteOwner(std::string_view text) {
  const std::string tmp = std::string(kOwnerName) + ".tmp";
  int fd = OpenAt(tmp, O_WRONLY | O_CREAT | O_TRUNC);
  if (fd < 0) return ErrFromErrno();
  int e = PwriteFull(fd, text.data(), text.size(), 0);
  close(fd);
  if (e != 0 || renameat(dirfd_, tmp.c_str(), dirfd_, kOwnerName) != 0) {
    if (e == 0) e = errno;
    unlinkat(dirfd_, tmp.c_str(), 0);
    return Err(e);
  }
  return {};
}

std::string Tier::ReadOwner() const {
  int fd = OpenAt(kOwnerName, O_RDONLY);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  ssize_t n;
  // A small file this daemon wrote; anything larger is not ours to trust.
  while ((n = read(fd, buf, sizeof buf)) > 0 && out.size() < (64u << 10)) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

Result<uint64_t> Tier::RemoveAll() {
  DropSpares();
  MutexLock lk(&mu_);
  for (auto& [key, f] : files_)
    if (f.pins > 0) return Err(EBUSY);
  uint64_t freed = 0;
  for (auto it = files_.begin(); it != files_.end();) {
    if (unlinkat(dirfd_, NameOf(it->first).c_str(), 0) != 0 && errno != ENOENT) return ErrFromErrno();
    freed += it->second.charged;
    used_ -= it->second.charged;
    it = files_.erase(it);
  }
  closed_ = true;
  space_cv_.NotifyAll();
  if (orphans_ > 0) return Err(ENOTEMPTY);
  unlinkat(dirfd_, kOwnerName, 0);
  unlinkat(dirfd_, kLockName, 0);  // still flock'ed through lock_fd_ until the Tier goes
  // The tier's own tmpfs (--tier-huge) goes with it; the descriptors still
  // open into it keep it until the Tier goes.
  if (!UnmountTier(dir_)) return ErrFromErrno();
  if (rmdir(dir_.c_str()) != 0) return ErrFromErrno();
  return freed;
}

void Tier::Close() {
  {
    MutexLock lk(&mu_);
    closed_ = true;
  }
  DropSpares();  // a clean unmount leaves no pre-allocated pages behind
  space_cv_.NotifyAll();
}

}  // namespace ckpt::cache
