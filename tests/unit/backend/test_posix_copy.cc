// test_posix_copy.cc — the drain's copy (backend/posix_copy.h RingStage):
// aligned chunks go through the O_DIRECT descriptor, the unaligned tail
// through the buffered one, and the bytes and their hash are those of the
// source; a direct write the file system refuses goes on buffered
// (SlotQueue::Resume). The destination is a file under /var/tmp (a disk
// file system: tmpfs took O_DIRECT only from Linux 6.6); where it refuses
// O_DIRECT the direct cases are skipped, counted (tests/unit/expected_skips.txt).
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "backend/checksum.h"
#include "backend/posix_copy.h"
#include "backend/uring.h"
#include "tests/unit/backend/source.h"

using namespace ckpt::backend;
using namespace ckpt::backend::posix;
using ckpt::test::Source;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A file under /var/tmp, opened buffered and (when the file system lets
// it) O_DIRECT; removed at the end.
struct DiskFile {
  std::string path;
  int fd = -1, direct = -1;
  DiskFile() {
    char tmpl[] = "/var/tmp/ckpt-copy-unit-XXXXXX";
    fd = mkstemp(tmpl);
    cr_assert_geq(fd, 0);
    path = tmpl;
    direct = open(tmpl, O_WRONLY | O_DIRECT | O_CLOEXEC);
  }
  ~DiskFile() {
    close(fd);
    if (direct >= 0) close(direct);
    unlink(path.c_str());
  }
  std::string Read() const {
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    std::string s(static_cast<size_t>(st.st_size), '\0');
    int f = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(f, 0);
    cr_assert_eq(pread(f, s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
    close(f);
    return s;
  }
};

std::unique_ptr<Ring> RingOrSkip() {
  auto ring = Ring::Create(kQueueDepth);
  if (!ring) cr_skip_test("no io_uring here: Ring::Create: %s", strerror(ring.error()));
  return std::move(*ring);
}

// Stages `src` into `dst` (direct when `use_direct`) and checks the bytes
// and the hash; returns what the copy said.
StageTarget StageInto(const Source& src, DiskFile& dst, bool use_direct) {
  auto ring = RingOrSkip();
  cr_assert_eq(ftruncate(dst.fd, static_cast<off_t>(src.bytes.size())), 0);
  StageTarget out{.fd = dst.fd, .direct_fd = use_direct ? dst.direct : -1};
  Extents ext(src.fd, src.bytes.size());
  ContentHash hash;
  bool read_failed = false;
  cr_assert_eq(RingStage(*ring, src.fd, ext, &out, {}, &hash, &read_failed), 0);
  cr_assert_not(read_failed);
  cr_assert_eq(fdatasync(dst.fd), 0);
  cr_assert(dst.Read() == src.bytes, "the staged bytes differ from the source");
  auto want = ContentChecksum(src.bytes.data(), src.bytes.size());
  cr_assert(hash.Finish(src.bytes.size()) == want);
  return out;
}

}  // namespace

// 10 MiB + 123: two whole 4 MiB chunks and an aligned 2 MiB one go direct;
// the last 123 bytes buffered.
Test(posix_copy, aligned_chunks_direct_tail_buffered) {
  DiskFile dst;
  if (dst.direct < 0) cr_skip_test("/var/tmp refuses O_DIRECT: %s", strerror(errno));
  Source src(10 * kMiB + 123, 1);
  StageTarget out = StageInto(src, dst, true);
  cr_assert_eq(out.direct_bytes, 10 * kMiB);
  cr_assert_not(out.direct_refused);
}

// Without a direct descriptor everything is buffered (the fallback).
Test(posix_copy, buffered_without_direct_fd) {
  DiskFile dst;
  Source src(9 * kMiB + 4096 + 7, 2);
  StageTarget out = StageInto(src, dst, false);
  cr_assert_eq(out.direct_bytes, 0u);
}

// A direct write the file system refuses (an unaligned length: EINVAL) is
// resumed on another descriptor of the same file and completes there.
Test(posix_copy, refused_direct_write_resumes_buffered) {
  DiskFile dst;
  if (dst.direct < 0) cr_skip_test("/var/tmp refuses O_DIRECT: %s", strerror(errno));
  auto ring = RingOrSkip();
  SlotQueue q(*ring, dst.fd, SlotQueue::Op::kWrite, 1, 2 * 4096);
  cr_assert(q.ok());
  std::memset(q[0].buf, 'z', 4097);
  q.Start(0, 0, 0, 4097, dst.direct);
  cr_assert(q.Submit().has_value());
  auto d = q.Reap(true);
  cr_assert(d.has_value());
  cr_assert_eq(d->err, EINVAL, "an unaligned O_DIRECT write: %s", strerror(d->err));
  q.Resume(0, dst.fd);
  cr_assert(q.Submit().has_value());
  d = q.Reap(true);
  cr_assert(d.has_value());
  cr_assert_eq(d->err, 0);
  cr_assert(q[0].complete);
  cr_assert(dst.Read() == std::string(4097, 'z'));
}

// OpenDirect: files smaller than kDirectMin get none.
Test(posix_copy, open_direct_only_for_large_files) {
  DiskFile dst;
  std::string dir = dst.path.substr(0, dst.path.rfind('/'));
  std::string name = dst.path.substr(dir.size() + 1);
  int dfd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  cr_assert_geq(dfd, 0);
  cr_assert_lt(OpenDirect(dfd, name.c_str(), kDirectMin - 1).get(), 0);
  // (CKPTFS_BACKEND_NO_DIRECT=1 turns them off for everyone.)
  if (dst.direct >= 0 && !std::getenv("CKPTFS_BACKEND_NO_DIRECT"))
    cr_assert_geq(OpenDirect(dfd, name.c_str(), kDirectMin).get(), 0);
  close(dfd);
}
