// test_tier_mount.cc — the tier's own huge-page tmpfs (cache/tier_mount.h):
// mounted on an empty tier directory on tmpfs, kept and found again, never
// over files, never through a symlink, never for a directory on another file
// system; detached by UnmountTier and by Tier::RemoveAll. Needs root (mount);
// skipped otherwise.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cache/tier.h"
#include "cache/tier_mount.h"

using namespace ckpt::cache;

namespace {

std::string g_dir;  // a fresh directory under /dev/shm per test

void Setup() {
  if (geteuid() != 0) cr_skip_test("needs root (mount)");
  char tmpl[] = "/dev/shm/ckpt-unit-mount-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  g_dir = tmpl;
}

void Teardown() {
  if (g_dir.empty()) return;
  for (const char* sub : {"/tier", "/tier2"}) (void)umount2((g_dir + sub).c_str(), MNT_DETACH);
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

}  // namespace

TestSuite(tier_mount, .init = Setup, .fini = Teardown);

Test(tier_mount, mounts_huge_pages_on_an_empty_directory_and_keeps_it) {
  const std::string dir = g_dir + "/tier";
  HugeTier h = PrepareHugeTier(dir);  // creates it
  cr_assert(h.on, "not on: %s", h.why.c_str());
  cr_assert(IsMountPoint(dir));
  cr_assert(HasHugePages(dir));
  struct stat st;
  cr_assert_eq(stat(dir.c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700u, "mode %o", st.st_mode & 0777);
  struct statfs a, b;
  cr_assert_eq(statfs(dir.c_str(), &a), 0);
  cr_assert_eq(statfs(g_dir.c_str(), &b), 0);
  cr_assert_eq(static_cast<uint64_t>(a.f_blocks) * a.f_bsize, static_cast<uint64_t>(b.f_blocks) * b.f_bsize,
               "sized like the tmpfs beneath");
  // Again (a restart): the same mount, not a second one on top.
  std::ofstream(dir + "/f") << "bytes";
  h = PrepareHugeTier(dir);
  cr_assert(h.on, "%s", h.why.c_str());
  cr_assert(std::filesystem::exists(dir + "/f"), "a second tmpfs hid the first one's files");
  cr_assert(UnmountTier(dir));
  cr_assert_not(IsMountPoint(dir));
  cr_assert_not(std::filesystem::exists(dir + "/f"));
}

Test(tier_mount, leaves_a_directory_holding_files_alone) {
  const std::string dir = g_dir + "/tier";
  cr_assert_eq(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/0000000000000002") << "a tier from before";
  HugeTier h = PrepareHugeTier(dir);
  cr_assert_not(h.on);
  cr_assert(h.why.find("already holds files") != std::string::npos, "%s", h.why.c_str());
  cr_assert_not(IsMountPoint(dir));
}

Test(tier_mount, never_mounts_through_a_symlink) {
  const std::string target = g_dir + "/target", link = g_dir + "/tier";
  cr_assert_eq(mkdir(target.c_str(), 0700), 0);
  cr_assert_eq(symlink(target.c_str(), link.c_str()), 0);
  HugeTier h = PrepareHugeTier(link);
  cr_assert_not(h.on);
  cr_assert_not(IsMountPoint(target), "mounted where the symlink points");
}

Test(tier_mount, leaves_a_directory_owned_by_another_user_alone) {
  const std::string dir = g_dir + "/tier";
  cr_assert_eq(mkdir(dir.c_str(), 0700), 0);
  cr_assert_eq(chown(dir.c_str(), 65534, 65534), 0);
  HugeTier h = PrepareHugeTier(dir);
  cr_assert_not(h.on);
  cr_assert_not(IsMountPoint(dir));
}

Test(tier_mount, leaves_a_directory_off_tmpfs_alone) {
  char tmpl[] = "/var/tmp/ckpt-unit-mount-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  const std::string dir = std::string(tmpl) + "/tier";
  struct statfs fs;
  cr_assert_eq(statfs(tmpl, &fs), 0);
  HugeTier h = PrepareHugeTier(dir);
  const bool on_tmpfs = fs.f_type == 0x01021994;
  if (!on_tmpfs) {
    cr_expect_not(h.on);
    cr_expect(h.why.find("not on tmpfs") != std::string::npos, "%s", h.why.c_str());
  }
  (void)UnmountTier(dir);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

Test(tier_mount, removing_the_tier_detaches_its_tmpfs) {
  const std::string dir = g_dir + "/tier2";
  cr_assert(PrepareHugeTier(dir).on);
  {
    auto t = Tier::Open(dir, 64 << 20);
    cr_assert(t.has_value(), "Tier::Open: %d", t ? 0 : t.error());
    cr_assert((*t)->Truncate(2, 4 << 20).has_value());
    auto freed = (*t)->RemoveAll();
    cr_assert(freed.has_value(), "RemoveAll: %d", freed ? 0 : freed.error());
  }
  cr_assert_not(std::filesystem::exists(dir), "the tier directory is still there");
}
