// passthrough_files.cc — files the kernel reads and writes without the
// daemon (fs/core/passthrough_files.h).
#include "fs/core/passthrough_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

namespace ckpt::fs {

Status PassthroughFiles::Start(Inode* n, int flags) {
  const bool writable = (flags & O_ACCMODE) != O_RDONLY;
  const uint64_t ino = n->rec.ino;
  if (n->pt_opens == 0) {
    auto ref = tier_->Ref(ino);
    if (!ref) return Err(ref.error());
    auto id = backing_->OpenBacking((*ref)->fd);
    if (!id) return Err(id.error());
    n->backing_id = *id;
  }
  n->pt_opens++;
  if ((flags & O_ACCMODE) == O_RDWR) n->pt_rdwr++;
  const bool first_writer = writable && n->pt_writers++ == 0;
  if (first_writer) {
    auto st = tier_->Refresh(ino);
    n->pt_size = st ? static_cast<uint64_t>(st->st_size) : n->rec.size;
    n->pt_mtime_ns = st ? st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec : 0;
  }
  const uint64_t expected = first_writer ? Expected(n) : 0;
  MutexLock lk(&mu_);
  handles_++;
  if (first_writer) writing_[ino] = Writer{expected, n->pt_size, n->pt_mtime_ns, std::chrono::steady_clock::now()};
  return {};
}

void PassthroughFiles::End(Inode* n, int flags) {
  const uint64_t ino = n->rec.ino;
  const bool writable = (flags & O_ACCMODE) != O_RDONLY;
  n->pt_opens--;
  if ((flags & O_ACCMODE) == O_RDWR && n->pt_rdwr > 0) n->pt_rdwr--;
  const bool last_writer = writable && n->pt_writers > 0 && --n->pt_writers == 0;
  {
    MutexLock lk(&mu_);
    handles_--;
    if (last_writer) writing_.erase(ino);
  }
  if (last_writer) {
    tier_->TrimBeyondEof(ino);  // the pre-allocated pages it did not use
    (void)tier_->Refresh(ino);
  }
  if (n->pt_opens == 0 && n->backing_id > 0) {
    backing_->CloseBacking(n->backing_id);
    n->backing_id = 0;
  }
}

bool PassthroughFiles::Room(const Inode* n, bool trunc, uint64_t max_file_size) const {
  // A writer expected past --max-file-size takes the copying path, whose
  // writes stop at the limit; a passthrough writer is cut back only at its
  // close (Core::CutToLimit), after filling the tier with bytes then lost.
  const uint64_t expected = residency_->ExpectedSize();
  return expected > 0 && expected <= max_file_size && Shortfall(n, trunc) == 0;
}

uint64_t PassthroughFiles::Expected(const Inode* n) const {
  return std::max(n->rec.sealed_size, residency_->ExpectedSize());
}

uint64_t PassthroughFiles::Shortfall(const Inode* n, bool trunc) const {
  // The other passthrough writers: (ino, bytes they are taken to hold:
  // what one still writing was expected to write, at least what it wrote;
  // what an idle one wrote).
  std::vector<std::pair<uint64_t, uint64_t>> others;
  const auto gap = residency_->save_gap();
  {
    MutexLock lk(&mu_);
    const auto now = std::chrono::steady_clock::now();
    // A look older than half the gap (the spare thread, at its lower
    // priority, held up) says nothing: every writer is taken as writing.
    const bool stale = now >= sampled_at_ + gap / 2;
    for (const auto& [ino, w] : writing_)
      if (ino != n->rec.ino) others.emplace_back(ino, stale || now < w.moved_at + gap ? w.expected : 0);
  }
  cache::TierStats s = tier_->Stats();
  uint64_t taken = s.used + s.reserved - std::min(s.used, tier_->Spares().first);  // spares are free space
  // Beyond what the tier has counted of their files (all of it for an
  // adopted spare, whose pages are charged whole; the kernel's writes only
  // once taken in: Core::Absorb).
  for (auto [ino, expected] : others) {
    auto st = tier_->StatIfOpen(ino);
    const uint64_t holds = std::max(expected, st ? static_cast<uint64_t>(st->st_size) : 0);
    taken += holds - std::min(holds, tier_->Charged(ino));
  }
  uint64_t free = s.for_files() > taken ? s.for_files() - taken : 0;
  // The kernel writes without asking: the last version's size must fit,
  // with an eighth of the budget to spare; otherwise the copying path,
  // which can make the writer wait for space.
  // A file with no history is expected to be as large as the largest one
  // sealed since the mount; the first file of a mount as large as the
  // spare made for it (sized from --prealloc or a quarter of the budget:
  // what the operator said to expect), else (no spare: --prealloc 0, no
  // room) it takes the copying path, so a budget smaller than one
  // checkpoint is not overrun by a writer nobody could stop.
  const uint64_t want = std::max(Expected(n), trunc ? 0 : n->rec.size) + s.budget / 8;
  return free >= want ? 0 : want - free;
}

std::pair<uint64_t, uint64_t> PassthroughFiles::Opens() {
  MutexLock lk(&mu_);
  return {handles_, writing_.size()};
}

std::vector<uint64_t> PassthroughFiles::Writers() {
  MutexLock lk(&mu_);
  std::vector<uint64_t> out;
  for (const auto& w : writing_) out.push_back(w.first);
  return out;
}

uint64_t PassthroughFiles::SampleWrites() {
  std::vector<std::pair<uint64_t, struct stat>> seen;
  for (uint64_t ino : Writers())
    if (auto st = tier_->StatIfOpen(ino)) seen.emplace_back(ino, *st);
  MutexLock lk(&mu_);
  const auto now = std::chrono::steady_clock::now();
  sampled_at_ = now;
  for (const auto& [ino, st] : seen) {
    auto it = writing_.find(ino);
    if (it == writing_.end()) continue;  // closed meanwhile
    Writer& w = it->second;
    const auto size = static_cast<uint64_t>(st.st_size);
    const int64_t mtime = st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    const bool grew = size >= w.size + Residency::kMovedBytes, in_place = size == w.size && mtime != w.mtime_ns;
    // A file this large is a checkpoint's, not a log's: its writer may be
    // paused between tensors or storing through a shared mapping (tmpfs
    // sets no mtime for those), and is never taken for idle.
    const bool large = size >= kNeverIdle;
    if (grew || in_place || large) {
      moved_bytes_ += grew ? size - w.size : Residency::kMovedBytes;
      w.moved_at = now;
    }
    if (grew || in_place || size < w.size) {  // a truncate starts over from its size
      w.size = size;
      w.mtime_ns = mtime;
    }
  }
  return moved_bytes_;
}

}  // namespace ckpt::fs
