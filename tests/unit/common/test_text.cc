// test_text.cc — the shared text codecs (common/text.h) and whole-range
// pread/pwrite (common/io.h): hex, percent-decoding with and without '+'
// as a space, short or failed transfers; the mount table (common/mounts.h).
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/io.h"
#include "common/log.h"
#include "common/mounts.h"
#include "common/text.h"

using namespace ckpt;

Test(text, hex) {
  cr_expect_eq(HexValue('0'), 0);
  cr_expect_eq(HexValue('a'), 10);
  cr_expect_eq(HexValue('F'), 15);
  cr_expect_eq(HexValue('g'), -1);
  const unsigned char b[] = {0x00, 0x7f, 0xab, 0xff};
  cr_expect_eq(HexLower(b, sizeof b), std::string("007fabff"));
  cr_expect_eq(HexLower(b, 0), std::string());
  // XXH3-64, zero-padded: the names derived from paths stay what they were.
  cr_expect_eq(HexHash(""), std::string("2d06800538d394c2"));
  cr_expect_eq(HexHash("/var/lib/ckptfs/x"), std::string("6bbf83de0eb139e8"));
}

Test(text, percent_decode) {
  cr_expect_eq(PercentDecode("a%20b%2Fc%C3%A9", false), std::string("a b/c\xc3\xa9"));
  cr_expect_eq(PercentDecode("a+b%2B", false), std::string("a+b+"));
  cr_expect_eq(PercentDecode("a+b%2B", true), std::string("a b+"));
  // A '%' without two hex digits after it stays.
  cr_expect_eq(PercentDecode("100%", false), std::string("100%"));
  cr_expect_eq(PercentDecode("%4", false), std::string("%4"));
  cr_expect_eq(PercentDecode("%zz%41", false), std::string("%zzA"));
}

// The mount table through libmount (common/mounts.h): escaped targets,
// optional fields, and the topmost of two mounts at one place.
Test(mounts, topmost_mount_at_a_path) {
  char path[] = "/tmp/ckpt-mountinfo-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  const std::string table =
      "22 1 0:21 / /dev/shm rw,nosuid,nodev shared:2 - tmpfs tmpfs rw,size=100k\n"
      "30 22 0:40 / /mnt/a\\040b rw,relatime shared:7 master:1 - fuse.ckptfs ckptfs:/b rw,user_id=0\n"
      "31 22 0:41 / /dev/shm rw - tmpfs tier rw,size=2g,huge=within_size\n";
  cr_assert_eq(PwriteFull(fd, table.data(), table.size(), 0), 0);
  close(fd);
  auto m = ckpt::MountAt("/mnt/a b", path);
  cr_assert(m.has_value(), "an escaped space in the target");
  cr_expect_eq(m->fstype, std::string("fuse.ckptfs"));
  cr_expect_eq(m->source, std::string("ckptfs:/b"));
  cr_expect_eq(major(m->devno), 0u);
  cr_expect_eq(minor(m->devno), 40u);
  auto shm = ckpt::MountAt("/dev/shm", path);
  cr_assert(shm.has_value());
  cr_expect_eq(shm->fs_options, std::string("rw,size=2g,huge=within_size"), "the later line is the mount on top");
  cr_expect_not(ckpt::MountAt("/mnt/a", path).has_value());
  cr_expect_not(ckpt::MountAt("/dev/shm", "/nonexistent/mountinfo").has_value());
  unlink(path);
}

Test(io, full_transfers) {
  char path[] = "/tmp/ckpt-io-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  std::string data(1 << 20, 'x');
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<char>(i * 7);
  cr_assert_eq(PwriteFull(fd, data.data(), data.size(), 4096), 0);
  std::string back(data.size(), '\0');
  cr_assert_eq(PreadFull(fd, back.data(), back.size(), 4096), 0);
  cr_expect(back == data);
  // Past the end: the file ends early.
  cr_expect_eq(PreadFull(fd, back.data(), 10, 4096 + data.size() - 5), EIO);
  cr_expect_eq(PreadFull(fd, back.data(), 0, 1ull << 40), 0);
  close(fd);
  cr_expect_eq(PreadFull(fd, back.data(), 1, 0), EBADF);
  cr_expect_eq(PwriteFull(fd, back.data(), 1, 0), EBADF);
}

// Lines anyone can cause are bounded per window; what was held back is told
// by the next line that goes.
Test(log, a_budget_bounds_lines_per_window_and_counts_the_rest) {
  using namespace std::chrono_literals;
  ckpt::LogBudget b(3, 10s);
  const auto t0 = std::chrono::steady_clock::now();
  int went = 0;
  for (int i = 0; i < 100; i++) went += b.Take(t0 + std::chrono::milliseconds(i));
  cr_expect_eq(went, 3, "%d lines went in one window", went);
  cr_expect(b.Take(t0 + 11s), "the next window's first line was held back");
  cr_expect_eq(b.held(), 97u, "the held-back lines were not counted");
  cr_expect_eq(b.held(), 0u, "the count was not cleared once told");
}
