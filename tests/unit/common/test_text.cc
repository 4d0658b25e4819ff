// test_text.cc — the shared text codecs (common/text.h) and whole-range
// pread/pwrite (common/io.h): hex, percent-decoding with and without '+'
// as a space, /proc mountinfo escapes, and short or failed transfers.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/io.h"
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

Test(text, unescape_mountinfo) {
  cr_expect_eq(UnescapeMountinfo("/mnt/a\\040b"), std::string("/mnt/a b"));
  cr_expect_eq(UnescapeMountinfo("/mnt/x\\134y\\011z\\012"), std::string("/mnt/x\\y\tz\n"));
  // Not three octal digits: kept as they are.
  cr_expect_eq(UnescapeMountinfo("/mnt/\\9ab"), std::string("/mnt/\\9ab"));
  cr_expect_eq(UnescapeMountinfo("/mnt/\\04"), std::string("/mnt/\\04"));
  cr_expect_eq(UnescapeMountinfo("plain"), std::string("plain"));
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
