// replica_store.cc — see replica_store.h.
#include "fs/cluster/replica_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>

#include "backend/checksum.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/text.h"

namespace ckpt::fs::replica {
namespace {

// The content checksum of the first `size` bytes of `fd`, read a slice at a
// time (a replica committed without the checksum of its landing).
Result<std::pair<uint64_t, uint64_t>> HashFile(int fd, uint64_t size) {
  constexpr uint64_t kSlice = 4u << 20;
  backend::ContentHash hash;
  if (!hash.ok()) return Err(ENOMEM);
  std::unique_ptr<char[]> buf(new char[std::min(kSlice, std::max<uint64_t>(size, 1))]);
  for (uint64_t off = 0; off < size; off += kSlice) {
    const uint64_t n = std::min(kSlice, size - off);
    if (int e = PreadFull(fd, buf.get(), n, off); e != 0) return Err(e);
    hash.Update(off, buf.get(), n);
  }
  return hash.Finish(size);
}

constexpr char kPart[] = ".part-";
constexpr char kMeta[] = ".meta";
constexpr char kPublished[] = "published";
constexpr char kSpare[] = ".free-";  // a dropped replica's file, kept for the next one (never listed)  // the gate
                                     // field of a Retire()d replica

constexpr char kNote[] = ".note-";  // a dot: no node id starts so (ValidNodeId), no replica is taken for a note

// A small file's bytes (a replica's meta, a note), or nullopt (missing,
// or longer than `max`).
std::optional<std::string> ReadSmall(int dfd, const std::string& name, size_t max = kMaxText) {
  int fd = openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st;
  std::optional<std::string> s;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) <= max) {
    s.emplace(static_cast<size_t>(st.st_size), '\0');
    if (PreadFull(fd, s->data(), s->size(), 0) != 0) s.reset();
  }
  close(fd);
  return s;
}

// A note's file name: its key hashed (a key holds a node id and a run,
// whatever their bytes).
std::string NoteName(const std::string& key) { return kNote + HexHash(key); }

// A note's file: "KEYLEN TEXTLEN\nKEYTEXT" — both lengths exact, so a
// note cut short (a tier on a disk that lost power) is not taken for one.
std::string NoteFile(const std::string& key, const std::string& text) {
  return std::to_string(key.size()) + " " + std::to_string(text.size()) + "\n" + key + text;
}
std::optional<std::pair<std::string, std::string>> ParseNote(std::string_view file) {
  const size_t nl = file.find('\n');
  size_t klen = 0, tlen = 0;
  if (nl == std::string_view::npos) return std::nullopt;
  const char* end = file.data() + nl;
  auto [p, ec] = std::from_chars(file.data(), end, klen);
  if (ec != std::errc() || p == end || *p != ' ') return std::nullopt;
  auto [q, ec2] = std::from_chars(p + 1, end, tlen);
  if (ec2 != std::errc() || q != end || klen > file.size() - nl - 1 || tlen != file.size() - nl - 1 - klen)
    return std::nullopt;
  return std::make_pair(std::string(file.substr(nl + 1, klen)), std::string(file.substr(nl + 1 + klen)));
}

// "WRITER.INO.VERSION~GATE~HEX" → Held (size from the file).
bool ParseFinal(std::string_view name, Held* h) {
  const size_t t2 = name.rfind('~');
  if (t2 == std::string_view::npos || t2 == 0) return false;
  const size_t t1 = name.rfind('~', t2 - 1);
  if (t1 == std::string_view::npos) return false;
  auto key = Key::Parse(name.substr(0, t1));
  if (!key) return false;
  h->key = *key;
  const std::string_view gate = name.substr(t1 + 1, t2 - t1 - 1);
  if (gate == kPublished) {
    h->published = true;
    h->gate_us = 0;
    return backend::ParseChecksumHex(name.substr(t2 + 1), &h->hash_hi, &h->hash_lo);
  }
  auto [p, ec] = std::from_chars(gate.data(), gate.data() + gate.size(), h->gate_us);
  if (ec != std::errc() || p != gate.data() + gate.size()) return false;
  return backend::ParseChecksumHex(name.substr(t2 + 1), &h->hash_hi, &h->hash_lo);
}

// Whether held replica `x` is the one a writer offers again as `h`: held
// for its gate, not published, of the same size and meta (its path and
// seq, written once per version), and of the same checksum if `h` gives one.
bool SameReplica(const Held& x, const Held& h) {
  if (x.published || x.size != h.size || x.meta != h.meta) return false;
  return (h.hash_hi | h.hash_lo) == 0 || (x.hash_hi == h.hash_hi && x.hash_lo == h.hash_lo);
}

}  // namespace

Result<std::unique_ptr<Store>> Store::Open(const std::string& dir, uint64_t limit) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrFromErrno();
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return ErrFromErrno();
  // On /dev/shm anyone may have made it first: another user's directory
  // would let them read the members' checkpoints or plant replicas.
  struct stat dst;
  if (fstat(dfd, &dst) != 0 || dst.st_uid != geteuid() || ((dst.st_mode & 077) && fchmod(dfd, 0700) != 0)) {
    close(dfd);
    return Err(EPERM);
  }
  std::unique_ptr<Store> s(new Store(dir, dfd, limit));
  int scan = dup(dfd);
  DIR* d = scan >= 0 ? fdopendir(scan) : nullptr;
  if (!d) {
    if (scan >= 0) close(scan);
    return ErrFromErrno();
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  MutexLock l(&s->mu_);
  for (const std::string& name : names) {
    std::string_view n = name;
    if (n == "." || n == "..") continue;
    if (n.starts_with(kNote)) {  // kept when whole and named after its key
      auto file = ReadSmall(dfd, name, kMaxNote + kMaxText);
      auto note = file ? ParseNote(*file) : std::nullopt;
      if (note && NoteName(note->first) == name) {
        s->notes_[note->first] = std::move(note->second);
      } else if (unlinkat(dfd, name.c_str(), 0) != 0) {
        LOG_WARN("replicas: cannot remove {}/{}: {}", dir, name, ErrStr(errno));
      }
      continue;
    }
    if (n.ends_with(kMeta)) {  // kept with its replica, removed without one
      std::string data(n.substr(0, n.size() - strlen(kMeta)));
      if (!std::binary_search(names.begin(), names.end(), data) && unlinkat(dfd, name.c_str(), 0) != 0)
        LOG_WARN("replicas: cannot remove {}/{}: {}", dir, name, ErrStr(errno));
      continue;
    }
    Held h;
    struct stat st;
    auto meta = ReadSmall(dfd, name + kMeta);
    if (n.starts_with(kPart) || !ParseFinal(n, &h) || !meta ||
        fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      // An unfinished replica (its writer or this holder died mid-stream), or
      // nothing of ours: never counted, never served.
      if (unlinkat(dfd, name.c_str(), 0) != 0) LOG_WARN("replicas: cannot remove {}/{}: {}", dir, name, ErrStr(errno));
      unlinkat(dfd, (name + kMeta).c_str(), 0);
      continue;
    }
    h.size = static_cast<uint64_t>(st.st_size);
    h.meta = std::move(*meta);
    s->bytes_ += Charge(h);
    s->held_.push_back(h);
  }
  return s;
}

Store::~Store() { close(dirfd_); }

uint64_t Store::Charge(const Held& h) {
  constexpr uint64_t kPage = 4096, kInode = 1024;
  return h.size + (std::max<uint64_t>(h.meta.size(), 1) + kPage - 1) / kPage * kPage + 2 * kInode;
}

std::string Store::FinalName(const Held& h) const {
  return h.key.Name() + "~" + (h.published && !h.unnamed ? std::string(kPublished) : std::to_string(h.gate_us)) + "~" +
         backend::ChecksumHex(h.hash_hi, h.hash_lo);
}

Store::Incoming::Incoming(Store* s, Held h, int fd, std::string part)
    : store_(s), held_(std::move(h)), fd_(fd), part_(std::move(part)) {}

int Store::Incoming::Write(uint64_t off, const char* p, size_t n) const {
  if (off > held_.size || n > held_.size - off) return EINVAL;
  return PwriteFull(fd_, p, n, off);
}

int Store::Incoming::Read(uint64_t off, char* p, size_t n) const {
  if (off > held_.size || n > held_.size - off) return EINVAL;
  return PreadFull(fd_, p, n, off);
}

Store::Incoming::~Incoming() {
  if (fd_ >= 0) close(fd_);
  if (!done_) {
    unlinkat(store_->dirfd_, part_.c_str(), 0);
    store_->Release(Charge(held_));
    MutexLock l(&store_->mu_);
    std::erase(store_->incoming_, held_.key);
  }
}

void Store::Release(uint64_t n) {
  MutexLock l(&mu_);
  Resize(n, 0);
}

void Store::ShareRoom(Room room) {
  MutexLock l(&mu_);
  room_ = std::move(room);
  if (room_.take) room_.take(bytes_, true);  // held before the mount: counted, even past the budget
}

uint64_t Store::Relieve(uint64_t need) {
  std::vector<std::string> names;
  uint64_t before;
  {
    MutexLock l(&mu_);
    before = bytes_;
    FreeUnneeded(need, &names);
    before -= bytes_;
  }
  Unlink(names);
  return before;
}

uint64_t Store::TakeWanted() {
  MutexLock l(&mu_);
  return std::exchange(wanted_, 0);
}

bool Store::Resize(uint64_t from, uint64_t to) {
  if (to > from) {
    if (room_.take && !room_.take(to - from, false)) return false;
    bytes_ += to - from;
  } else {
    const uint64_t n = std::min(bytes_, from - to);
    bytes_ -= n;
    if (room_.give) room_.give(n);
  }
  return true;
}

void Store::FreeUnneeded(uint64_t need, std::vector<std::string>* names) {
  // The spares, then published replicas (kept to serve loads), oldest first.
  uint64_t freed = 0;
  while (freed < need && !spares_.empty()) {
    freed += spares_.front().second;
    Resize(spares_.front().second, 0);
    names->push_back(spares_.front().first);
    spares_.erase(spares_.begin());
  }
  for (auto it = held_.begin(); freed < need && it != held_.end();) {
    if (!it->published || Kept(it->key)) {
      ++it;
      continue;
    }
    freed += Charge(*it);
    Resize(Charge(*it), 0);
    names->push_back(FinalName(*it));
    it = held_.erase(it);
  }
}

void Store::Unlink(const std::vector<std::string>& names) const {
  for (const std::string& name : names) {
    unlinkat(dirfd_, name.c_str(), 0);
    unlinkat(dirfd_, (name + kMeta).c_str(), 0);
  }
}

Result<std::unique_ptr<Store::Incoming>> Store::Begin(const Held& h) {
  if (h.size > limit_) return Err(EINVAL);  // first: Charge of a size near 2^64 wraps
  const uint64_t need = Charge(h);
  if (need > limit_) return Err(EINVAL);
  std::vector<std::string> evict;
  std::string reuse;  // a spare's file, renamed to the part file below
  {
    MutexLock l(&mu_);
    for (Held& x : held_) {
      if (x.key != h.key || x.published) continue;
      if (!SameReplica(x, h)) return Err(ESTALE);
      // Offered again under another gate: its writer restarted and sends
      // what it had pending anew, under the gate its record names now (its
      // exact times died with it: Cluster::GateTime). The replica takes it,
      // so that this node's record and a takeover order it as the writer's
      // record does (kept at the old gate, it held the writer's own drain).
      if (h.gate_us != 0 && h.gate_us != x.gate_us) {
        const uint64_t was = x.gate_us;
        Held to = x;
        to.gate_us = h.gate_us;
        if (Rename(&x, std::move(to)))
          LOG_INFO("replicas: {} offered again by its writer: its gate is now {} (was {})", h.key.Name(), h.gate_us,
                   was);
        else
          LOG_WARN("replicas: {} offered again under gate {}: cannot rename it in {} ({}); kept at gate {}",
                   h.key.Name(), h.gate_us, dir_, strerror(errno), was);
      }
      return Err(EEXIST);
    }
    if (std::find(incoming_.begin(), incoming_.end(), h.key) != incoming_.end()) return Err(EBUSY);
    // The very replica this node published in its writer's place, offered
    // again (the writer's run back re-sends what its log still had
    // pending): held, and stays published — a new unpublished copy would
    // be published again, at a name a later rename may have left.
    for (const Held& x : held_) {
      Held as_held = x;
      as_held.published = false;
      if (x.key == h.key && x.published && SameReplica(as_held, h)) return Err(EEXIST);
    }
    // A published copy under the name (kept to serve loads: it is in the
    // backend) gives way: a new run of its writer's id numbers its files
    // from 1 again (Takeover), and was refused this holder for as long as
    // the copy stayed. Not while it is kept for its claim's mark (Keep):
    // the new replica waits until the mark is in.
    if (Kept(h.key)) return Err(EAGAIN);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->key != h.key) {
        ++it;
        continue;
      }
      Resize(Charge(*it), 0);
      evict.push_back(FinalName(*it));
      it = held_.erase(it);
    }
    // The spare closest in size (the smallest that is large enough, else the
    // largest): its pages are written over; the rest of them, if any, freed.
    auto best = spares_.end();
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      const bool fits = it->second >= h.size;
      if (best == spares_.end() || (fits && (best->second < h.size || it->second < best->second)) ||
          (!fits && best->second < h.size && it->second > best->second))
        best = it;
    }
    uint64_t reused = 0;
    if (best != spares_.end()) {
      reuse = best->first;
      reused = best->second;
      spares_.erase(best);
    }
    // Within the limit, and within the node's one budget (the tier's room,
    // ShareRoom): the other spares and the published copies make room first.
    if (bytes_ - std::min(bytes_, reused) + need > limit_)
      FreeUnneeded(bytes_ - std::min(bytes_, reused) + need - limit_, &evict);
    bool fits = bytes_ - std::min(bytes_, reused) + need <= limit_ && Resize(reused, need);
    if (!fits && bytes_ - std::min(bytes_, reused) + need <= limit_) {
      FreeUnneeded(need, &evict);  // the tier is full: what this store holds for nobody goes first
      fits = Resize(reused, need);
      if (!fits) wanted_ = std::max(wanted_, need > reused ? need - reused : 0);
    }
    if (!fits) {
      if (!reuse.empty()) {  // no room even so: it goes
        Resize(reused, 0);
        evict.push_back(reuse);
      }
      Unlink(evict);
      return Err(EAGAIN);
    }
    incoming_.push_back(h.key);
  }
  Unlink(evict);
  const std::string part = kPart + h.key.Name();
  const bool reused = !reuse.empty() && renameat(dirfd_, reuse.c_str(), dirfd_, part.c_str()) == 0;
  if (!reuse.empty() && !reused) unlinkat(dirfd_, reuse.c_str(), 0);
  int fd = openat(dirfd_, part.c_str(), O_RDWR | O_CREAT | (reused ? 0 : O_TRUNC) | O_NOFOLLOW | O_CLOEXEC, 0600);
  int err = 0;
  if (fd < 0) err = errno;
  else if (reused && ftruncate(fd, static_cast<off_t>(h.size)) != 0)  // a larger one's tail freed
    err = errno;
  else if (h.size && fallocate(fd, 0, 0, static_cast<off_t>(h.size)) != 0 &&
           ftruncate(fd, static_cast<off_t>(h.size)) != 0)
    err = errno;
  // From here the Incoming owns the reservation: its destructor undoes it.
  auto in = std::unique_ptr<Incoming>(new Incoming(this, h, fd, part));
  if (err) return Err(err == ENOSPC ? EAGAIN : err);
  return in;
}

Status Store::Commit(std::unique_ptr<Incoming> in, std::optional<std::pair<uint64_t, uint64_t>> landed,
                     std::optional<std::pair<uint64_t, uint64_t>> want) {
  if ((in->held_.hash_hi | in->held_.hash_lo) == 0 && want) {
    in->held_.hash_hi = want->first;  // the writer hashed it while sending
    in->held_.hash_lo = want->second;
  }
  const Held& h = in->held_;
  if ((h.hash_hi | h.hash_lo) == 0) return Err(EBADMSG);  // no checksum to hold it to
  if (want && (want->first != h.hash_hi || want->second != h.hash_lo)) return Err(EBADMSG);  // PUT and END differ
  std::pair<uint64_t, uint64_t> sum;
  if (landed) sum = *landed;
  else if (auto s = HashFile(in->fd_, h.size)) sum = *s;
  else return Err(s.error());
  if (sum.first != h.hash_hi || sum.second != h.hash_lo) return Err(EBADMSG);  // ~Incoming discards it
  const std::string final_name = FinalName(h), meta_tmp = in->part_ + kMeta;
  int mfd = openat(dirfd_, meta_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (mfd < 0) return ErrFromErrno();
  const bool wrote = write(mfd, h.meta.data(), h.meta.size()) == static_cast<ssize_t>(h.meta.size());
  close(mfd);
  if (!wrote || renameat(dirfd_, meta_tmp.c_str(), dirfd_, (final_name + kMeta).c_str()) != 0) {
    int e = errno ? errno : EIO;
    unlinkat(dirfd_, meta_tmp.c_str(), 0);
    return Err(e);
  }
  if (renameat(dirfd_, in->part_.c_str(), dirfd_, final_name.c_str()) != 0) return ErrFromErrno();
  in->done_ = true;
  MutexLock l(&mu_);
  std::erase(incoming_, h.key);
  held_.push_back(h);
  return {};
}

void Store::SetClaimed(const Key& k) {
  MutexLock l(&mu_);
  if (std::find(claimed_.begin(), claimed_.end(), k) == claimed_.end()) claimed_.push_back(k);
}

Status Store::DropForWriter(const Key& k) {
  {
    MutexLock l(&mu_);
    if (std::find(claimed_.begin(), claimed_.end(), k) != claimed_.end()) return {};
  }
  return Drop(k);
}

Status Store::Drop(const Key& k) {
  MutexLock l(&mu_);  // held across the renames: Begin takes spares under it
  std::erase(claimed_, k);
  kept_.erase(k);
  auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& x) { return x.key == k; });
  if (it == held_.end()) return Err(ENOENT);
  const Held h = *it;
  held_.erase(it);
  const std::string name = FinalName(h), spare = kSpare + std::to_string(next_spare_++);
  unlinkat(dirfd_, (name + kMeta).c_str(), 0);  // first: a replica without its meta is never listed again
  if (h.size > 0 && renameat(dirfd_, name.c_str(), dirfd_, spare.c_str()) == 0) {
    Resize(Charge(h), h.size);  // the meta's part freed, the file's bytes still counted
    spares_.emplace_back(spare, h.size);
    return {};
  }
  Resize(Charge(h), 0);
  if (unlinkat(dirfd_, name.c_str(), 0) != 0 && errno != ENOENT) return ErrFromErrno();
  return {};
}

bool Store::Retire(const Key& k, bool keep) {
  MutexLock l(&mu_);  // held across the renames: no Drop or OpenHeld between them
  auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& x) { return x.key == k; });
  if (it == held_.end()) return false;
  if (!it->published || it->unnamed) (void)NamePublished(&*it);
  if (keep) kept_.insert(k);
  return true;
}

bool Store::NamePublished(Held* x) {
  Held to = *x;
  to.published = true;
  to.unnamed = false;
  if (Rename(x, std::move(to))) return true;
  if (!x->unnamed)
    LOG_WARN("replicas: cannot rename {} in {} as published ({}): published in memory, under its old name",
             x->key.Name(), dir_, ErrStr(errno));
  x->published = x->unnamed = true;
  return false;
}

size_t Store::NameUnnamed() {
  MutexLock l(&mu_);
  size_t left = 0;
  for (Held& h : held_)
    if (h.unnamed && !NamePublished(&h)) left++;
  return left;
}

bool Store::Kept(const Key& k) const { return kept_.count(k) > 0; }

bool Store::Keep(const Key& k) {
  MutexLock l(&mu_);
  auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& x) { return x.key == k; });
  if (it == held_.end() || !it->published) return false;
  kept_.insert(k);
  return true;
}

void Store::Unkeep(const Key& k) {
  MutexLock l(&mu_);
  kept_.erase(k);
}

void Store::KeepPublished() {
  MutexLock l(&mu_);
  for (const Held& h : held_)
    if (h.published) kept_.insert(h.key);
}

Store::KeptTotal Store::KeptNow() const {
  MutexLock l(&mu_);
  KeptTotal t;
  for (const Held& h : held_)
    if (h.published && Kept(h.key)) {
      (h.key.ino == kEntryIno ? t.entries : t.files)++;
      t.bytes += h.size;
    }
  return t;
}

bool Store::Rename(Held* x, Held to) {
  // Each step leaves what Open reads back as one of the two, so that a
  // crash between them keeps the replica (its writer, told HELD, does not
  // send it again): the meta linked to the new name first (the data keeps
  // a meta of its own name throughout; a meta without its data is removed
  // at start), then the data renamed, then the old meta's name removed.
  // (The meta renamed first, a crash before the data's rename left a data
  // file without its meta, which Open discards.)
  const std::string from = FinalName(*x), name = FinalName(to);
  if (from != name) {
    (void)unlinkat(dirfd_, (name + kMeta).c_str(), 0);  // a failed try's, or a leftover
    if (linkat(dirfd_, (from + kMeta).c_str(), dirfd_, (name + kMeta).c_str(), 0) != 0) return false;
    FAILPOINT("replica.rename.mid");
    if (renameat(dirfd_, from.c_str(), dirfd_, name.c_str()) != 0) {
      const int e = errno;
      (void)unlinkat(dirfd_, (name + kMeta).c_str(), 0);
      errno = e;
      return false;
    }
    (void)unlinkat(dirfd_, (from + kMeta).c_str(), 0);
  }
  *x = std::move(to);
  return true;
}

Result<std::pair<int, Held>> Store::OpenHeld(const Key& k) const {
  // Opened outside the lock (a tier file's open is not free): a rename
  // (Retire, NameUnnamed, a new gate) between the copy and the open gives
  // ENOENT, and the replica is looked up again under its new name.
  for (int tries = 0;; tries++) {
    Held h;
    {
      MutexLock l(&mu_);
      auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& x) { return x.key == k; });
      if (it == held_.end()) return Err(ENOENT);
      h = *it;
    }
    int fd = openat(dirfd_, FinalName(h).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return std::make_pair(fd, h);
    if (errno != ENOENT || tries == 3) return ErrFromErrno();
  }
}

std::vector<Held> Store::List() const {
  MutexLock l(&mu_);
  return held_;
}

uint64_t Store::MinGate() const {
  MutexLock l(&mu_);
  uint64_t g = 0;
  for (const Held& h : held_)
    if (!h.published && (g == 0 || (h.gate_us > 0 && h.gate_us < g))) g = h.gate_us;
  return g;
}

Status Store::KeepNote(const std::string& key, const std::string& text) {
  if (key.size() > kMaxText || text.size() > kMaxNote) return Err(EINVAL);
  if (FAULT("replica.note")) return Err(ENOSPC);
  const std::string name = NoteName(key), part = kPart + name;
  const std::string file = NoteFile(key, text);
  int fd = openat(dirfd_, part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrFromErrno();
  int e = PwriteFull(fd, file.data(), file.size(), 0);
  if (close(fd) != 0 && e == 0) e = errno;
  if (e == 0 && renameat(dirfd_, part.c_str(), dirfd_, name.c_str()) != 0) e = errno;
  if (e != 0) {
    unlinkat(dirfd_, part.c_str(), 0);
    return Err(e);
  }
  MutexLock l(&mu_);
  notes_[key] = text;
  return {};
}

std::optional<std::string> Store::Note(const std::string& key) const {
  MutexLock l(&mu_);
  auto it = notes_.find(key);
  if (it == notes_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Store::NoteKeys() const {
  MutexLock l(&mu_);
  std::vector<std::string> keys;
  for (const auto& [key, text] : notes_) keys.push_back(key);
  return keys;
}

void Store::DropNote(const std::string& key) {
  {
    MutexLock l(&mu_);
    if (!notes_.erase(key)) return;
  }
  if (unlinkat(dirfd_, NoteName(key).c_str(), 0) != 0 && errno != ENOENT)
    LOG_WARN("replicas: cannot remove the note {}/{}: {}", dir_, NoteName(key), ErrStr(errno));
}

uint64_t Store::bytes() const {
  MutexLock l(&mu_);
  return bytes_;
}

uint64_t Store::spare_bytes() const {
  MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [name, size] : spares_) n += size;
  return n;
}

}  // namespace ckpt::fs::replica
