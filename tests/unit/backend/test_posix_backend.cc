// test_posix_backend.cc — the POSIX directory backend: staging and publishing
// (io_uring and the pread/pwrite fallback), namespace replay, fetch and list,
// each in a fresh directory under /tmp with sources on /dev/shm.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/checksum.h"
#include "tests/unit/backend/source.h"

using ckpt::backend::Attrs;
using ckpt::backend::Backend;
using ckpt::backend::Entry;
using ckpt::backend::Staged;
using ckpt::test::Source;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Attributes with no owner.
Attrs A(uint32_t mode, int64_t sec = 0, uint32_t nsec = 0) {
  Attrs a;
  a.mode = mode;
  a.mtime_sec = sec;
  a.mtime_nsec = nsec;
  return a;
}

// A backend over a fresh directory, checked (so the staging area exists).
struct Env {
  std::string root;
  std::unique_ptr<Backend> be;

  std::string base;  // what the destructor removes: the root, or the directory above a long one

  // With `root_len`, the root is a directory about that long (its own path
  // counts nothing against the paths beneath it).
  explicit Env(size_t root_len = 0) {
    char tmpl[] = "/tmp/ckpt-backend-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    root = base = tmpl;
    while (root.size() + 1 < root_len) {
      root += "/" + std::string(std::min<size_t>(100, root_len - root.size() - 1), 'r');
      cr_assert_eq(mkdir(root.c_str(), 0755), 0);
    }
    auto b = ckpt::backend::OpenPosixBackend(root);
    cr_assert(b.has_value(), "open: %d", b.error());
    be = std::move(*b);
    cr_assert(be->Check().has_value());
  }
  ~Env() {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
    // Trees deeper than PATH_MAX: rm walks them by descriptors.
    if (ec) (void)!std::system(("rm -rf -- '" + base + "'").c_str());
  }

  std::string P(const std::string& rel) const { return root + "/" + rel; }
  std::string Tmp() const { return root + "/" + ckpt::backend::kTmpDir; }
  // Staged entries (not the backends' lock files, lk-NONCE).
  size_t TmpCount() const {
    size_t n = 0;
    for (const auto& en : std::filesystem::directory_iterator(Tmp()))
      n += !en.path().filename().string().starts_with("lk-");
    return n;
  }
};

// A destination like the memory tier's: a /dev/shm file sized to `size`.
struct Dest {
  int fd = -1;
  Dest(uint64_t size, int flags = O_RDWR) {
    char tmpl[] = "/dev/shm/ckpt-backend-dst-XXXXXX";
    int f = mkstemp(tmpl);
    cr_assert_geq(f, 0);
    cr_assert_eq(ftruncate(f, static_cast<off_t>(size)), 0);
    fd = open(tmpl, flags | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    close(f);
    unlink(tmpl);
  }
  ~Dest() { close(fd); }
  std::string Read(uint64_t size) const {
    std::string s(size, '\0');
    int f = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY);
    cr_assert_geq(f, 0);
    cr_assert_eq(pread(f, s.data(), size, 0), static_cast<ssize_t>(size));
    close(f);
    return s;
  }
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  cr_assert(out.good());
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string Hex(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

const std::function<bool()> kNever = [] { return false; };

// Stages `src`, checks what Stage promises, and publishes it at `rel`.
Staged StageChecked(Env& e, const Source& src) {
  auto s = e.be->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert(s.has_value(), "stage: %d", s.error());
  auto [hi, lo] = ckpt::backend::ContentChecksum(src.bytes.data(), src.bytes.size());
  cr_assert_eq(s->size, src.bytes.size());
  cr_assert_eq(s->checksum_hi, hi);
  cr_assert_eq(s->checksum_lo, lo);
  return *s;
}

void StagePublishSizes() {
  Env e;
  const uint64_t sizes[] = {0, 1, 4095, 4 * kMiB + 123, 40 * kMiB};
  int i = 0;
  for (uint64_t size : sizes) {
    Source src(size, 1000 + i);
    Staged s = StageChecked(e, src);
    std::string rel = "d/e/f" + std::to_string(i);
    // Staged, but nothing under the final name yet.
    cr_assert_not(Exists(e.P(rel)));
    cr_assert_eq(e.TmpCount(), 1u);
    int64_t sec = 1700000000 + i;
    uint32_t nsec = 123456789;
    cr_assert(e.be->Publish(s, rel, A(0640, sec, nsec)).has_value());
    cr_assert_eq(e.TmpCount(), 0u);
    cr_assert(ReadFile(e.P(rel)) == src.bytes, "bytes differ for size %llu", (unsigned long long)size);
    struct stat st;
    cr_assert_eq(lstat(e.P(rel).c_str(), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0640u);
    cr_assert_eq(st.st_mtim.tv_sec, sec);
    cr_assert_eq(st.st_mtim.tv_nsec, nsec);
    char x[64];
    ssize_t n = getxattr(e.P(rel).c_str(), ckpt::backend::kChecksumXattr, x, sizeof x);
    cr_assert_eq(n, 32);
    cr_assert(std::string(x, 32) == Hex(s.checksum_hi, s.checksum_lo));
    i++;
  }
  // Publishing over an existing file replaces it.
  Source again(5000, 77);
  Staged s = StageChecked(e, again);
  cr_assert(e.be->Publish(s, "d/e/f1", A(0, 5, 0)).has_value());
  cr_assert(ReadFile(e.P("d/e/f1")) == again.bytes);
  // The staged file is gone once published: stage again.
  cr_assert_eq(e.be->Publish(s, "d/e/f9", A(0, 5, 0)).error(), ESTALE);
  cr_assert_not(Exists(e.P("d/e/f9")));
}

}  // namespace

Test(posix_backend, open_and_describe) {
  cr_assert_eq(ckpt::backend::OpenPosixBackend("/nonexistent/ckpt-x").error(), ENOENT);
  cr_assert_eq(ckpt::backend::OpenPosixBackend("/etc/hostname").error(), ENOTDIR);
  Env e;
  cr_assert(e.be->Describe() == "posix:" + e.root);
  struct stat st;
  cr_assert_eq(stat(e.Tmp().c_str(), &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, 0700u);
}

Test(posix_backend, stage_publish_sizes) { StagePublishSizes(); }

Test(posix_backend, stage_publish_sizes_without_uring) {
  setenv("CKPTFS_BACKEND_NO_URING", "1", 1);
  StagePublishSizes();
}

Test(posix_backend, abort_leaves_nothing) {
  Env e;
  Source src(4 * kMiB + 1, 5);
  Staged s = StageChecked(e, src);
  cr_assert_eq(e.TmpCount(), 1u);
  e.be->Abort(s);
  cr_assert_eq(e.TmpCount(), 0u);
  e.be->Abort(s);  // twice is harmless
  cr_assert_eq(e.be->Publish(s, "x", A(0, 0, 0)).error(), ESTALE);
  cr_assert_not(Exists(e.P("x")));
}

Test(posix_backend, cancel_leaves_nothing) {
  Env e;
  Source src(40 * kMiB, 6);
  int polls = 0;
  auto r = e.be->Stage(src.fd, src.bytes.size(), [&] { return ++polls > 2; });
  cr_assert_eq(r.error(), ECANCELED);
  cr_assert_eq(e.TmpCount(), 0u);
  r = e.be->Stage(src.fd, src.bytes.size(), [] { return true; });
  cr_assert_eq(r.error(), ECANCELED);
  cr_assert_eq(e.TmpCount(), 0u);
}

Test(posix_backend, cancel_without_uring) {
  setenv("CKPTFS_BACKEND_NO_URING", "1", 1);
  Env e;
  Source src(20 * kMiB, 7);
  int polls = 0;
  cr_assert_eq(e.be->Stage(src.fd, src.bytes.size(), [&] { return ++polls > 2; }).error(), ECANCELED);
  cr_assert_eq(e.TmpCount(), 0u);
}

Test(posix_backend, stage_short_source_is_eio) {
  Env e;
  Source src(1000, 8);
  cr_assert_eq(e.be->Stage(src.fd, 2000, kNever).error(), EIO);
  cr_assert_eq(e.TmpCount(), 0u);
}

// Sets the mtime of `p` (not following a symlink) `age` seconds back.
void Age(const std::string& p, int64_t age) {
  timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= age;
  t[1] = t[0];
  cr_assert_eq(utimensat(AT_FDCWD, p.c_str(), t, AT_SYMLINK_NOFOLLOW), 0, "%s", p.c_str());
}

// Entries of no known owner (an older version's names, anything else) are
// leftovers once an hour old; younger ones may be a live daemon's.
Test(posix_backend, check_cleans_leftovers) {
  Env e;
  WriteFile(e.Tmp() + "/st-old", "partial");
  std::filesystem::create_directories(e.Tmp() + "/odd/dir");
  WriteFile(e.Tmp() + "/odd/dir/f", "x");
  cr_assert(symlink("nowhere", (e.Tmp() + "/sl-old").c_str()) == 0);
  WriteFile(e.Tmp() + "/st-young", "maybe in use");
  for (const char* n : {"/st-old", "/odd", "/sl-old"}) Age(e.Tmp() + n, 3700);
  WriteFile(e.P("keep"), "kept");
  cr_assert(e.be->Check().has_value());
  cr_assert_eq(e.TmpCount(), 1u);
  cr_assert(Exists(e.Tmp() + "/st-young"));
  cr_assert(ReadFile(e.P("keep")) == "kept");
  // A root whose staging area is not a directory is refused.
  std::filesystem::remove_all(e.Tmp());
  WriteFile(e.Tmp(), "");
  cr_assert_eq(e.be->Check().error(), ENOTDIR);
}

// Two daemons on one backend (a cluster's nodes, mounts sharing it): the
// Check of one, at its mount or after a backend failure, keeps what the
// other staged and has not published yet; once the other is gone (its lock
// released: closed, or killed), its leftovers go at the next Check.
Test(posix_backend, check_keeps_a_live_daemons_staged_files) {
  Env e;
  auto other = ckpt::backend::OpenPosixBackend(e.root);
  cr_assert(other.has_value());
  Source src(5000, 17);
  auto staged = (*other)->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert(staged.has_value());
  Age(e.Tmp() + "/" + staged->token, 7200);  // old, but its daemon lives
  cr_assert(e.be->Check().has_value());
  cr_assert_eq(e.TmpCount(), 1u);
  cr_assert((*other)->Publish(*staged, "f", A(0644, 1, 0)).has_value(), "the other's staged file was removed");
  cr_assert(ReadFile(e.P("f")) == src.bytes);
  // It stages again and goes away without publishing (a killed daemon's
  // lock goes the same way: with its file descriptors).
  staged = (*other)->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert(staged.has_value());
  other->reset();
  cr_assert_eq(e.TmpCount(), 1u);
  cr_assert(e.be->Check().has_value());
  cr_assert_eq(e.TmpCount(), 0u);
  size_t locks = 0;
  for (const auto& en : std::filesystem::directory_iterator(e.Tmp()))
    locks += en.path().filename().string().starts_with("lk-");
  cr_assert_eq(locks, 1u, "the gone daemon's lock file was left (or ours removed)");
  // A daemon's own staged files survive its own Check (the drain probes a
  // failed backend with it).
  auto mine = e.be->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert(mine.has_value());
  cr_assert(e.be->Check().has_value());
  cr_assert(e.be->Publish(*mine, "g", A(0644, 1, 0)).has_value());
}

Test(posix_backend, mkdir_rmdir_remove) {
  Env e;
  cr_assert(e.be->Mkdir("a/b/c", A(0750)).has_value());
  struct stat st;
  cr_assert_eq(stat(e.P("a/b/c").c_str(), &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0750u);
  cr_assert(e.be->Mkdir("a/b/c", A(0700)).has_value());  // exists: fine
  cr_assert(e.be->Mkdir("a", A(0)).has_value());
  WriteFile(e.P("a/file"), "data");
  cr_assert_eq(e.be->Mkdir("a/file", A(0755)).error(), EEXIST);
  cr_assert_eq(e.be->Mkdir("a/file/x", A(0755)).error(), ENOTDIR);

  // Remove: files only, a missing one is fine.
  cr_assert(e.be->Remove("a/file").has_value());
  cr_assert_not(Exists(e.P("a/file")));
  cr_assert(e.be->Remove("a/file").has_value());
  cr_assert(e.be->Remove("nope/deeper").has_value());
  cr_assert_eq(e.be->Remove("a/b").error(), EISDIR);
  cr_assert(symlink("a/b", e.P("ln").c_str()) == 0);
  cr_assert(e.be->Remove("ln").has_value());  // the link, not its target
  cr_assert_not(Exists(e.P("ln")));
  cr_assert(Exists(e.P("a/b")));

  // Rmdir takes the whole tree, never following symlinks out of it.
  WriteFile(e.P("a/b/c/f1"), "1");
  WriteFile(e.P("a/b/f2"), "2");
  cr_assert(e.be->Mkdir("outside", A(0755)).has_value());
  WriteFile(e.P("outside/keep"), "k");
  cr_assert(symlink(e.P("outside").c_str(), e.P("a/b/c/escape").c_str()) == 0);
  cr_assert(e.be->Rmdir("a/b").has_value());
  cr_assert_not(Exists(e.P("a/b")));
  cr_assert(Exists(e.P("a")));
  cr_assert(ReadFile(e.P("outside/keep")) == "k");
  cr_assert(e.be->Rmdir("a/b").has_value());  // missing: fine
  WriteFile(e.P("a/f"), "f");
  cr_assert_eq(e.be->Rmdir("a/f").error(), ENOTDIR);
}

Test(posix_backend, rename_and_exchange) {
  Env e;
  WriteFile(e.P("f"), "one");
  cr_assert(e.be->Rename("f", "new/dir/g", false).has_value());  // creates the parents
  cr_assert_not(Exists(e.P("f")));
  cr_assert(ReadFile(e.P("new/dir/g")) == "one");
  cr_assert_eq(e.be->Rename("f", "h", false).error(), ENOENT);

  WriteFile(e.P("h"), "two");
  cr_assert(e.be->Rename("h", "new/dir/g", false).has_value());  // replaces
  cr_assert(ReadFile(e.P("new/dir/g")) == "two");

  // Exchange two files, then a file and a directory.
  WriteFile(e.P("x"), "X");
  WriteFile(e.P("y"), "Y");
  cr_assert(e.be->Rename("x", "y", true).has_value());
  cr_assert(ReadFile(e.P("x")) == "Y");
  cr_assert(ReadFile(e.P("y")) == "X");
  cr_assert(e.be->Rename("x", "new", true).has_value());
  cr_assert(ReadFile(e.P("new")) == "Y");
  cr_assert(ReadFile(e.P("x/dir/g")) == "two");
  cr_assert_eq(e.be->Rename("x", "missing", true).error(), ENOENT);

  // A directory moves with its contents.
  cr_assert(e.be->Rename("x", "moved/x2", false).has_value());
  cr_assert(ReadFile(e.P("moved/x2/dir/g")) == "two");
}

Test(posix_backend, link_and_symlink) {
  Env e;
  WriteFile(e.P("f"), "data");
  cr_assert(e.be->Link("f", "sub/g").has_value());
  struct stat a, b;
  cr_assert_eq(stat(e.P("f").c_str(), &a), 0);
  cr_assert_eq(stat(e.P("sub/g").c_str(), &b), 0);
  cr_assert_eq(a.st_ino, b.st_ino);
  cr_assert_eq(b.st_nlink, 2u);
  // Again (a replayed entry): same inode, nothing left behind.
  cr_assert(e.be->Link("f", "sub/g").has_value());
  cr_assert_eq(e.TmpCount(), 0u);
  cr_assert_eq(stat(e.P("f").c_str(), &a), 0);
  cr_assert_eq(a.st_nlink, 2u);
  // Over another file: replaced.
  WriteFile(e.P("other"), "other");
  cr_assert(e.be->Link("f", "other").has_value());
  cr_assert(ReadFile(e.P("other")) == "data");
  cr_assert_eq(e.be->Link("missing", "z").error(), ENOENT);
  cr_assert_not(Exists(e.P("z")));

  cr_assert(e.be->Symlink("s/l", "../f", {}).has_value());
  char buf[64];
  ssize_t n = readlink(e.P("s/l").c_str(), buf, sizeof buf);
  cr_assert_eq(n, 4);
  cr_assert(std::string(buf, 4) == "../f");
  cr_assert(ReadFile(e.P("s/l")) == "data");
  cr_assert(e.be->Symlink("s/l", "/elsewhere", {}).has_value());  // replaces
  n = readlink(e.P("s/l").c_str(), buf, sizeof buf);
  cr_assert(std::string(buf, n) == "/elsewhere");
  cr_assert(e.be->Symlink("other", "f", {}).has_value());  // replaces a file
  n = readlink(e.P("other").c_str(), buf, sizeof buf);
  cr_assert(std::string(buf, n) == "f");
  cr_assert_eq(e.TmpCount(), 0u);
}

Test(posix_backend, setattr) {
  Env e;
  WriteFile(e.P("f"), "data");
  cr_assert(e.be->Mkdir("d", A(0755)).has_value());
  cr_assert(e.be->Symlink("l", "f", {}).has_value());
  struct stat st;

  cr_assert(e.be->SetAttr("f", A(0604, 1234, 5678)).has_value());
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0604u);
  cr_assert_eq(st.st_mtim.tv_sec, 1234);
  cr_assert_eq(st.st_mtim.tv_nsec, 5678);

  cr_assert(e.be->SetAttr("f", A(0, 99, 0)).has_value());  // mode 0: unchanged
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0604u);
  cr_assert_eq(st.st_mtim.tv_sec, 99);

  cr_assert(e.be->SetAttr("d", A(0711, 42, 1)).has_value());
  cr_assert_eq(lstat(e.P("d").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0711u);
  cr_assert_eq(st.st_mtim.tv_sec, 42);

  // The symlink itself, never its target.
  cr_assert(e.be->SetAttr("l", A(0600, 7, 0)).has_value());
  cr_assert_eq(lstat(e.P("l").c_str(), &st), 0);
  cr_assert_eq(st.st_mtim.tv_sec, 7);
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mtim.tv_sec, 99);
  cr_assert_eq(st.st_mode & 07777, 0604u);

  cr_assert_eq(e.be->SetAttr("missing", A(0644, 1, 0)).error(), ENOENT);
  cr_assert_eq(e.be->SetAttr("f", A(0644, 1, 1000000000u)).error(), EINVAL);
}

static void FetchRoundTrip() {
  Env e;
  const uint64_t sizes[] = {0, 1, 4 * kMiB + 123, 40 * kMiB};
  int i = 0;
  for (uint64_t size : sizes) {
    Source src(size, 200 + i);
    Staged s = StageChecked(e, src);
    std::string rel = "fetch/f" + std::to_string(i++);
    cr_assert(e.be->Publish(s, rel, A(0644, 1, 0)).has_value());
    Dest dst(size);
    auto sum = e.be->Fetch(rel, dst.fd, size);
    cr_assert(sum.has_value(), "fetch: %d", sum.error());
    cr_assert_eq(sum->first, s.checksum_hi);
    cr_assert_eq(sum->second, s.checksum_lo);
    cr_assert(dst.Read(size) == src.bytes);
    if (size > 0) cr_assert_eq(e.be->Fetch(rel, dst.fd, size - 1).error(), EIO);
    cr_assert_eq(e.be->Fetch(rel, dst.fd, size + 1).error(), EIO);
  }
  Dest dst(10);
  cr_assert_eq(e.be->Fetch("fetch/none", dst.fd, 10).error(), ENOENT);
  cr_assert_eq(e.be->Fetch("fetch", dst.fd, 10).error(), EIO);  // a directory
}

Test(posix_backend, fetch_round_trip) { FetchRoundTrip(); }

Test(posix_backend, fetch_round_trip_without_uring) {
  setenv("CKPTFS_BACKEND_NO_URING", "1", 1);
  FetchRoundTrip();
}

Test(posix_backend, fetch_into_unmappable_destination) {
  Env e;
  Source src(9 * kMiB + 7, 300);
  Staged s = StageChecked(e, src);
  cr_assert(e.be->Publish(s, "f", A(0644, 1, 0)).has_value());
  Dest dst(src.bytes.size(), O_WRONLY);  // cannot be mapped for writing: buffered copy
  auto sum = e.be->Fetch("f", dst.fd, src.bytes.size());
  cr_assert(sum.has_value());
  cr_assert_eq(sum->first, s.checksum_hi);
  cr_assert_eq(sum->second, s.checksum_lo);
  cr_assert(dst.Read(src.bytes.size()) == src.bytes);
  Dest small(10);
  cr_assert_eq(e.be->Fetch("f", small.fd, src.bytes.size()).error(), EINVAL);
}

// A tree planted deeper than kMaxTreeDepth (256) is listed down to that
// depth: the mount goes on, with one descriptor and one stack frame per
// level only that far.
Test(posix_backend, list_stops_at_the_depth_limit) {
  Env e;
  std::string rel;
  for (int i = 0; i < 300; i++) {
    rel += (rel.empty() ? "" : "/") + std::string("d");
    cr_assert_eq(mkdir(e.P(rel).c_str(), 0755), 0, "level %d", i);
  }
  size_t entries = 0, deepest = 0;
  cr_assert(e.be->List([&](const Entry& en) {
                  entries++;
                  deepest = std::max<size_t>(deepest, std::count(en.path.begin(), en.path.end(), '/') + 1);
                })
                .has_value());
  cr_expect_eq(deepest, 256u);
  cr_expect_eq(entries, 256u);
}

Test(posix_backend, list) {
  Env e;
  Source src(4 * kMiB + 123, 400);
  Staged s = StageChecked(e, src);
  cr_assert(e.be->Publish(s, "dir/sub/file", A(0640, 1600000000, 42)).has_value());
  cr_assert(e.be->Mkdir("empty", A(0700)).has_value());
  cr_assert(e.be->Symlink("dir/link", "sub/file", {}).has_value());
  WriteFile(e.P("plain"), "abc");  // no checksum xattr
  cr_assert(setxattr(e.P("plain").c_str(), ckpt::backend::kChecksumXattr, "zz", 2, 0) == 0 || errno == ENOTSUP);
  // Something staged but never published is not listed.
  Source other(10, 401);
  Staged pending = StageChecked(e, other);
  (void)pending;

  std::vector<Entry> got;
  cr_assert(e.be->List([&](const Entry& en) { got.push_back(en); }).has_value());
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < got.size(); i++) at[got[i].path] = i;
  cr_assert_eq(got.size(), 6u, "got %zu entries", got.size());
  for (const char* p : {"dir", "dir/sub", "dir/sub/file", "dir/link", "empty", "plain"})
    cr_assert(at.count(p), "missing %s", p);
  for (auto& en : got) {
    cr_assert(en.path.find(ckpt::backend::kTmpDir) == std::string::npos);
    cr_assert_neq(en.path[0], '/');
  }
  cr_assert_lt(at["dir"], at["dir/sub"]);
  cr_assert_lt(at["dir/sub"], at["dir/sub/file"]);
  cr_assert_lt(at["dir"], at["dir/link"]);

  const Entry& f = got[at["dir/sub/file"]];
  cr_assert(f.type == Entry::Type::kFile);
  cr_assert_eq(f.size, src.bytes.size());
  cr_assert_eq(f.mode, 0640u);
  cr_assert_eq(f.mtime_sec, 1600000000);
  cr_assert_eq(f.mtime_nsec, 42u);
  cr_assert(f.has_checksum);
  cr_assert_eq(f.checksum_hi, s.checksum_hi);
  cr_assert_eq(f.checksum_lo, s.checksum_lo);

  const Entry& l = got[at["dir/link"]];
  cr_assert(l.type == Entry::Type::kSymlink);
  cr_assert(l.target == "sub/file");

  const Entry& d = got[at["empty"]];
  cr_assert(d.type == Entry::Type::kDir);
  cr_assert_eq(d.mode, 0700u);

  const Entry& p = got[at["plain"]];
  cr_assert(p.type == Entry::Type::kFile);
  cr_assert_eq(p.size, 3u);
  cr_assert_not(p.has_checksum);
}

Test(posix_backend, path_validation) {
  Env e;
  WriteFile(e.P("f"), "data");
  Source src(10, 500);
  Staged s = StageChecked(e, src);
  Dest dst(10);
  for (const char* bad : {"../x", "/abs", "a//b", "", ".", "..", "a/./b", "a/../b", "a/", ".ckptfs-tmp",
                          ".ckptfs-tmp/x", ".ckptfs-probe-1"}) {
    std::string p = bad;
    cr_assert_eq(e.be->Mkdir(p, A(0755)).error(), EINVAL, "mkdir '%s'", bad);
    cr_assert_eq(e.be->Rmdir(p).error(), EINVAL, "rmdir '%s'", bad);
    cr_assert_eq(e.be->Remove(p).error(), EINVAL, "remove '%s'", bad);
    cr_assert_eq(e.be->Rename("f", p, false).error(), EINVAL, "rename to '%s'", bad);
    cr_assert_eq(e.be->Rename(p, "g", false).error(), EINVAL, "rename from '%s'", bad);
    cr_assert_eq(e.be->Symlink(p, "t", {}).error(), EINVAL, "symlink '%s'", bad);
    cr_assert_eq(e.be->Link("f", p).error(), EINVAL, "link '%s'", bad);
    cr_assert_eq(e.be->SetAttr(p, A(0644, 0, 0)).error(), EINVAL, "setattr '%s'", bad);
    cr_assert_eq(e.be->Fetch(p, dst.fd, 10).error(), EINVAL, "fetch '%s'", bad);
    cr_assert_eq(e.be->Publish(s, p, A(0644, 0, 0)).error(), EINVAL, "publish '%s'", bad);
  }
  // Names that merely look alike are fine.
  cr_assert(e.be->Mkdir("a/..b/.c/...", A(0755)).has_value());
  cr_assert(e.be->Mkdir("sub/.ckptfs-tmp", A(0755)).has_value());
  Staged forged = s;
  forged.token = "../f";
  cr_assert_eq(e.be->Publish(forged, "g", A(0644, 0, 0)).error(), EINVAL);
  cr_assert(e.be->Publish(s, "g", A(0644, 0, 0)).has_value());
  cr_assert(ReadFile(e.P("f")) == "data");
}

Test(posix_backend, parallel_stage_and_publish) {
  Env e;
  constexpr int kThreads = 6;
  std::vector<std::unique_ptr<Source>> srcs;
  for (int i = 0; i < kThreads; i++) srcs.push_back(std::make_unique<Source>(6 * kMiB + i, 600 + i));
  std::vector<Staged> staged(kThreads);
  std::vector<int> errs(kThreads, 0);
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; i++)
    ts.emplace_back([&, i] {
      auto s = e.be->Stage(srcs[i]->fd, srcs[i]->bytes.size(), kNever);
      if (!s) {
        errs[i] = s.error();
        return;
      }
      staged[i] = *s;
      if (auto st = e.be->Publish(*s, "p/q/f" + std::to_string(i), A(0644, 1, 0)); !st) errs[i] = st.error();
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads; i++) {
    cr_assert_eq(errs[i], 0, "thread %d: %d", i, errs[i]);
    cr_assert(ReadFile(e.P("p/q/f" + std::to_string(i))) == srcs[i]->bytes);
  }
  cr_assert_eq(e.TmpCount(), 0u);
}

// ---- Issue #16: symlinks in the backend are never followed (item 1) ----

namespace {

// A directory outside the backend root, standing for a root-only directory
// an attacker would like the daemon to write into.
struct Outside {
  std::string dir;
  Outside() {
    char tmpl[] = "/tmp/ckpt-backend-outside-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    dir = tmpl;
    WriteFile(dir + "/a", "victim");
    cr_assert_eq(chmod((dir + "/a").c_str(), 0600), 0);
  }
  ~Outside() { std::filesystem::remove_all(dir); }
  std::string P(const std::string& rel) const { return dir + "/" + rel; }
  // Names in the directory, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> v;
    for (auto& de : std::filesystem::directory_iterator(dir)) v.push_back(de.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  void ExpectUntouched() const {
    cr_assert(Names() == std::vector<std::string>{"a"}, "the outside directory changed");
    cr_assert(ReadFile(P("a")) == "victim");
    struct stat st;
    cr_assert_eq(lstat(P("a").c_str(), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600u);
  }
};

// "team" in the backend, then replaced by a symlink to `o`.
void PlantTeamLink(Env& e, const Outside& o) {
  cr_assert(e.be->Mkdir("team", A(0755)).has_value());
  std::filesystem::remove_all(e.P("team"));
  cr_assert_eq(symlink(o.dir.c_str(), e.P("team").c_str()), 0);
}

}  // namespace

Test(posix_backend_symlink, publish_through_symlinked_parent) {
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  Source src(100, 900);
  Staged s = StageChecked(e, src);
  cr_assert_eq(e.be->Publish(s, "team/b", A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Publish(s, "team/a", A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Publish(s, "team/new/deeper", A(0644, 1, 0)).error(), ELOOP);
  o.ExpectUntouched();
  // The staged copy is still there and publishes elsewhere.
  cr_assert(e.be->Publish(s, "other/c", A(0644, 1, 0)).has_value());
  cr_assert(ReadFile(e.P("other/c")) == src.bytes);
}

Test(posix_backend_symlink, mkdir_remove_rmdir_through_symlink) {
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  cr_assert_eq(e.be->Mkdir("team/x", A(0755)).error(), ELOOP);
  cr_assert_eq(e.be->Mkdir("team/x/y", A(0755)).error(), ELOOP);
  cr_assert_eq(e.be->Remove("team/a").error(), ELOOP);
  std::filesystem::create_directory(o.P("sub"));
  WriteFile(o.P("sub/f"), "x");
  cr_assert_eq(e.be->Rmdir("team/sub").error(), ELOOP);
  cr_assert(ReadFile(o.P("sub/f")) == "x");
  std::filesystem::remove_all(o.P("sub"));
  // Rmdir of the symlink itself: refused, not followed.
  cr_assert_eq(e.be->Rmdir("team").error(), ELOOP);
  o.ExpectUntouched();
}

Test(posix_backend_symlink, rmdir_tree_with_symlink_to_outside) {
  Env e;
  Outside o;
  cr_assert(e.be->Mkdir("t/d", A(0755)).has_value());
  WriteFile(e.P("t/d/f"), "f");
  cr_assert_eq(symlink(o.dir.c_str(), e.P("t/d/escape").c_str()), 0);
  cr_assert_eq(symlink(o.dir.c_str(), e.P("t/escape2").c_str()), 0);
  cr_assert(e.be->Rmdir("t").has_value());
  cr_assert_not(Exists(e.P("t")));
  o.ExpectUntouched();
}

Test(posix_backend_symlink, rename_from_and_to_symlinked_dir) {
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  cr_assert_eq(e.be->Rename("team/a", "stolen", false).error(), ELOOP);
  cr_assert_not(Exists(e.P("stolen")));
  WriteFile(e.P("mine"), "mine");
  cr_assert_eq(e.be->Rename("mine", "team/a", false).error(), ELOOP);
  cr_assert_eq(e.be->Rename("mine", "team/new/a", false).error(), ELOOP);
  cr_assert_eq(e.be->Rename("mine", "team/a", true).error(), ELOOP);
  cr_assert(ReadFile(e.P("mine")) == "mine");
  o.ExpectUntouched();
  // A symlink entry itself (one ckptfs made) moves as a link.
  cr_assert(e.be->Symlink("ln", "target", {}).has_value());
  cr_assert(e.be->Rename("ln", "ln2", false).has_value());
  char buf[16];
  cr_assert_eq(readlink(e.P("ln2").c_str(), buf, sizeof buf), 6);
}

Test(posix_backend_symlink, setattr_link_symlink_fetch_through_symlink) {
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  cr_assert_eq(e.be->SetAttr("team/a", A(0666, 1, 0)).error(), ELOOP);
  WriteFile(e.P("f"), "data");
  cr_assert_eq(e.be->Link("f", "team/g").error(), ELOOP);
  cr_assert_eq(e.be->Link("team/a", "g").error(), ELOOP);
  cr_assert_not(Exists(e.P("g")));
  cr_assert_eq(e.be->Symlink("team/l", "x", {}).error(), ELOOP);
  Dest dst(6);
  cr_assert_eq(e.be->Fetch("team/a", dst.fd, 6).error(), ELOOP);
  o.ExpectUntouched();
  // A file that is itself a symlink to an outside file is not fetched either.
  cr_assert_eq(symlink(o.P("a").c_str(), e.P("direct").c_str()), 0);
  cr_assert_eq(e.be->Fetch("direct", dst.fd, 6).error(), ELOOP);
  cr_assert(e.be->SetAttr("direct", A(0666, 1, 0)).has_value());  // the link itself: mode ignored
  o.ExpectUntouched();
}

Test(posix_backend_symlink, non_directory_component_is_enotdir) {
  Env e;
  WriteFile(e.P("file"), "x");
  Source src(10, 901);
  Staged s = StageChecked(e, src);
  cr_assert_eq(e.be->Publish(s, "file/b", A(0644, 1, 0)).error(), ENOTDIR);
  cr_assert_eq(e.be->Mkdir("file/d", A(0755)).error(), ENOTDIR);
  cr_assert_eq(e.be->Remove("file/b").error(), ENOTDIR);
  cr_assert(ReadFile(e.P("file")) == "x");
}

Test(posix_backend_symlink, escaping_paths_refused) {
  Env e;
  Outside o;
  Dest dst(6);
  std::string rel_out = "../" + std::filesystem::path(o.dir).filename().string() + "/a";
  cr_assert_eq(e.be->Fetch(rel_out, dst.fd, 6).error(), EINVAL);
  cr_assert_eq(e.be->Remove(rel_out).error(), EINVAL);
  cr_assert_eq(e.be->SetAttr(rel_out, A(0666, 1, 0)).error(), EINVAL);
  cr_assert_eq(e.be->Rename(rel_out, "x", false).error(), EINVAL);
  o.ExpectUntouched();
}

// ---- Issue #16 item 10: the staging area and staged files may vanish ----

Test(posix_backend_vanish, stage_recreates_staging_dir) {
  Env e;
  std::filesystem::remove_all(e.Tmp());
  Source src(5000, 910);
  Staged s = StageChecked(e, src);
  struct stat st;
  cr_assert_eq(lstat(e.Tmp().c_str(), &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0700u);
  cr_assert_eq(st.st_uid, geteuid());
  cr_assert(e.be->Publish(s, "f", A(0644, 1, 0)).has_value());
  cr_assert(ReadFile(e.P("f")) == src.bytes);
  // Between two Stage calls.
  Staged first = StageChecked(e, src);
  std::filesystem::remove_all(e.Tmp());
  Staged second = StageChecked(e, src);
  cr_assert_eq(e.be->Publish(first, "g", A(0644, 1, 0)).error(), ESTALE);
  cr_assert(e.be->Publish(second, "g", A(0644, 1, 0)).has_value());
  cr_assert(ReadFile(e.P("g")) == src.bytes);
}

Test(posix_backend_vanish, vanished_staged_file_is_estale) {
  Env e;
  Source src(5000, 911);
  Staged s = StageChecked(e, src);
  std::filesystem::remove(e.Tmp() + "/" + s.token);
  cr_assert_eq(e.be->Publish(s, "f", A(0644, 1, 0)).error(), ESTALE);
  Staged s2 = StageChecked(e, src);
  std::filesystem::remove_all(e.Tmp());
  cr_assert_eq(e.be->Publish(s2, "f", A(0644, 1, 0)).error(), ESTALE);
  cr_assert_not(Exists(e.P("f")));
}

Test(posix_backend_vanish, bad_staging_dir_refused) {
  Env e;
  Outside o;
  Source src(100, 912);
  std::filesystem::remove_all(e.Tmp());
  cr_assert_eq(symlink(o.dir.c_str(), e.Tmp().c_str()), 0);
  auto r = e.be->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert_not(r.has_value());
  cr_assert_neq(r.error(), ELOOP);  // not an entry's fault: retried, not dropped
  cr_assert_neq(r.error(), ENOTDIR);
  o.ExpectUntouched();
  cr_assert_eq(unlink(e.Tmp().c_str()), 0);
  WriteFile(e.Tmp(), "");
  cr_assert_not(e.be->Stage(src.fd, src.bytes.size(), kNever).has_value());
  cr_assert_eq(unlink(e.Tmp().c_str()), 0);
  if (geteuid() == 0) {
    cr_assert_eq(mkdir(e.Tmp().c_str(), 0700), 0);
    cr_assert_eq(chown(e.Tmp().c_str(), 65534, 65534), 0);
    cr_assert_not(e.be->Stage(src.fd, src.bytes.size(), kNever).has_value());
    struct stat st;
    cr_assert_eq(lstat(e.Tmp().c_str(), &st), 0);
    cr_assert_eq(st.st_uid, 65534u);  // left as it is, not renamed aside
  }
}

Test(posix_backend_vanish, root_moved_away_and_back) {
  Env e;
  Source src(100, 913);
  std::string away = e.root + ".away";
  cr_assert_eq(rename(e.root.c_str(), away.c_str()), 0);
  auto r = e.be->Stage(src.fd, src.bytes.size(), kNever);
  cr_assert_not(r.has_value());
  cr_assert_neq(r.error(), ENOENT);  // ENOENT would read as "nothing to do" for namespace entries
  cr_assert_neq(e.be->Mkdir("d", A(0755)).error(), ENOENT);
  cr_assert_neq(e.be->Remove("d").error(), 0);
  cr_assert_eq(rename(away.c_str(), e.root.c_str()), 0);
  Staged s = StageChecked(e, src);
  cr_assert(e.be->Publish(s, "d/f", A(0644, 1, 0)).has_value());
  cr_assert(ReadFile(e.P("d/f")) == src.bytes);
}

// ---- Issue #16 item 13: sparse files stay sparse ----

namespace {

constexpr uint64_t kTiB = 1ull << 40;

// A /dev/shm file of apparent size `size` holding two 4 KiB extents.
struct SparseSource {
  int fd = -1;
  uint64_t size;
  std::string x1, x2;
  uint64_t off1 = 12345 * 4096ull, off2;
  explicit SparseSource(uint64_t sz) : size(sz), off2(sz - 8192) {
    char tmpl[] = "/dev/shm/ckpt-backend-sparse-XXXXXX";
    fd = mkstemp(tmpl);
    cr_assert_geq(fd, 0);
    unlink(tmpl);
    cr_assert_eq(ftruncate(fd, static_cast<off_t>(size)), 0);
    x1.assign(4096, 'a');
    x2.assign(4096, 'b');
    cr_assert_eq(pwrite(fd, x1.data(), 4096, static_cast<off_t>(off1)), 4096);
    cr_assert_eq(pwrite(fd, x2.data(), 4096, static_cast<off_t>(off2)), 4096);
  }
  ~SparseSource() { close(fd); }
};

}  // namespace

Test(posix_backend_sparse, stage_and_fetch_keep_holes, .timeout = 120) {
  Env e;
  SparseSource src(kTiB);
  auto start = std::chrono::steady_clock::now();
  auto s = e.be->Stage(src.fd, src.size,
                       [&] { return std::chrono::steady_clock::now() - start > std::chrono::seconds(20); });
  cr_assert(s.has_value(), "stage: %d", s.error());
  cr_assert(e.be->Publish(*s, "sparse", A(0644, 1, 0)).has_value());
  struct stat st;
  cr_assert_eq(stat(e.P("sparse").c_str(), &st), 0);
  cr_assert_eq(static_cast<uint64_t>(st.st_size), src.size);
  cr_assert_lt(static_cast<uint64_t>(st.st_blocks) * 512, 1 * kMiB, "%lld blocks", (long long)st.st_blocks);
  Dest dst(src.size);
  auto sum = e.be->Fetch("sparse", dst.fd, src.size);
  cr_assert(sum.has_value(), "fetch: %d", sum.error());
  cr_assert_eq(sum->first, s->checksum_hi);
  cr_assert_eq(sum->second, s->checksum_lo);
  cr_assert_eq(fstat(dst.fd, &st), 0);
  cr_assert_lt(static_cast<uint64_t>(st.st_blocks) * 512, 1 * kMiB);
  std::string got(4096, '\0');
  cr_assert_eq(pread(dst.fd, got.data(), 4096, static_cast<off_t>(src.off2)), 4096);
  cr_assert(got == src.x2);
}

// The sparse checksum agrees with one computed from the extents alone.
Test(posix_backend_sparse, checksum_of_extents_matches) {
  SparseSource src(kTiB);
  Env e;
  auto s = e.be->Stage(src.fd, src.size, kNever);
  cr_assert(s.has_value());
  ckpt::backend::ContentHash h;
  h.Update(src.off1, src.x1.data(), src.x1.size());
  h.Update(src.off2, src.x2.data(), src.x2.size());
  auto [hi, lo] = h.Finish(src.size);
  cr_assert_eq(s->checksum_hi, hi);
  cr_assert_eq(s->checksum_lo, lo);
}

Test(posix_backend_sparse, without_uring_and_fetch_skips_zero_blocks) {
  setenv("CKPTFS_BACKEND_NO_URING", "1", 1);
  Env e;
  SparseSource src(64 * kMiB + 100);
  auto s = e.be->Stage(src.fd, src.size, kNever);
  cr_assert(s.has_value());
  cr_assert(e.be->Publish(*s, "f", A(0644, 1, 0)).has_value());
  struct stat st;
  cr_assert_eq(stat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(static_cast<uint64_t>(st.st_size), src.size);
  cr_assert_lt(static_cast<uint64_t>(st.st_blocks) * 512, 1 * kMiB);
  // A dense backend copy (an NFS without holes): Fetch still leaves the
  // zero blocks out of the destination, and the checksum is the same.
  std::string dense(src.size, '\0');
  std::memcpy(dense.data() + src.off1, src.x1.data(), 4096);
  std::memcpy(dense.data() + src.off2, src.x2.data(), 4096);
  WriteFile(e.P("dense"), dense);
  cr_assert_eq(stat(e.P("dense").c_str(), &st), 0);
  cr_assert_gt(static_cast<uint64_t>(st.st_blocks) * 512, 32 * kMiB);
  Dest dst(src.size);
  auto sum = e.be->Fetch("dense", dst.fd, src.size);
  cr_assert(sum.has_value());
  cr_assert_eq(sum->first, s->checksum_hi);
  cr_assert_eq(sum->second, s->checksum_lo);
  cr_assert_eq(fstat(dst.fd, &st), 0);
  cr_assert_lt(static_cast<uint64_t>(st.st_blocks) * 512, 1 * kMiB);
  cr_assert(dst.Read(src.size) == dense);
}

// ---- The checksum (backend/checksum.h) ----

Test(checksum, layout_independent) {
  using ckpt::backend::ContentChecksum;
  using ckpt::backend::ContentHash;
  std::mt19937_64 rng(42);
  for (uint64_t size : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 3 * 4096ull + 17, 1ull << 20}) {
    std::string data(size, '\0');
    // Random bytes with runs of zeros, some block-aligned, some not.
    for (uint64_t i = 0; i < size; i++) data[i] = (i / 3000) % 3 == 1 ? 0 : static_cast<char>(rng() | 1);
    auto whole = ContentChecksum(data.data(), data.size());
    // The same content fed in random pieces, skipping arbitrary zero runs.
    for (int round = 0; round < 20; round++) {
      ContentHash h;
      uint64_t off = 0;
      while (off < size) {
        uint64_t n = std::min<uint64_t>(size - off, 1 + rng() % 9000);
        bool zeros = std::all_of(data.begin() + off, data.begin() + off + n, [](char c) { return c == 0; });
        if (!zeros || rng() % 2) h.Update(off, data.data() + off, n);
        off += n;
      }
      auto pieces = h.Finish(size);
      cr_assert(pieces == whole, "size %llu round %d", (unsigned long long)size, round);
    }
  }
  // It depends on content, position and size.
  std::string a(8192, '\0'), b(8192, '\0');
  a[10] = 1;
  b[4096 + 10] = 1;
  cr_assert(ContentChecksum(a.data(), a.size()) != ContentChecksum(b.data(), b.size()));
  cr_assert(ContentChecksum(a.data(), 8192) != ContentChecksum(a.data(), 8191));
  cr_assert(ContentChecksum(a.data(), 0) != ContentChecksum(a.data(), 4096));
}

// The checksum is XXH3-128 of its definition's stream (checksum.h), however
// the library computes it: ContentHash goes through libxxhash's x86
// dispatch (AVX2/AVX-512, common/xxhash_fast.h); here the stream is built
// by hand and hashed by the plain (SSE2) entry point, so a checksum stored
// by one build is what the other verifies.
Test(checksum, is_plain_xxh3_of_its_definition) {
#undef XXH3_128bits  // the library's baseline symbol, not the dispatch
  std::mt19937_64 rng(7);
  for (uint64_t size : {1ull, 4096ull, 5 * 4096ull + 100, 3ull << 20}) {
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; i++) data[i] = (i / 4096) % 4 == 2 ? 0 : static_cast<char>(rng());
    std::string stream;
    for (uint64_t b = 0; b * 4096 < size; b++) {
      uint64_t n = std::min<uint64_t>(4096, size - b * 4096);
      if (std::all_of(data.begin() + b * 4096, data.begin() + b * 4096 + n, [](char c) { return c == 0; })) continue;
      for (int i = 0; i < 8; i++) stream.push_back(static_cast<char>(b >> (8 * i)));
      stream.append(data, b * 4096, n);
    }
    for (int i = 0; i < 8; i++) stream.push_back(static_cast<char>(size >> (8 * i)));
    XXH128_hash_t want = XXH3_128bits(stream.data(), stream.size());
    auto got = ckpt::backend::ContentChecksum(data.data(), data.size());
    cr_assert(got == std::make_pair(want.high64, want.low64), "size %llu", (unsigned long long)size);
  }
}

// ---- Issue #16 item 12: owners ----

Test(posix_backend_owner, publish_mkdir_symlink_setattr_apply_owner) {
  if (geteuid() != 0) cr_skip_test("needs root");
  Env e;
  Source src(10000, 920);
  Staged s = StageChecked(e, src);
  Attrs a = A(0600, 5, 0);
  a.uid = 65534;
  a.gid = 65533;
  a.has_owner = true;
  cr_assert(e.be->Publish(s, "implicit/parent/f", a).has_value());
  struct stat st;
  cr_assert_eq(lstat(e.P("implicit/parent/f").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 65534u);
  cr_assert_eq(st.st_gid, 65533u);
  cr_assert_eq(st.st_mode & 07777, 0600u);
  // Implicit parents belong to the daemon, 0755.
  cr_assert_eq(lstat(e.P("implicit/parent").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 0u);
  cr_assert_eq(st.st_mode & 07777, 0755u);

  Attrs d = A(02750);
  d.uid = 65534;
  d.gid = 65533;
  d.has_owner = true;
  cr_assert(e.be->Mkdir("dir", d).has_value());
  cr_assert_eq(lstat(e.P("dir").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 65534u);
  cr_assert_eq(st.st_gid, 65533u);
  cr_assert_eq(st.st_mode & 07777, 02750u);  // set after the chown: kept

  cr_assert(e.be->Symlink("dir/l", "../f", d).has_value());
  cr_assert_eq(lstat(e.P("dir/l").c_str(), &st), 0);
  cr_assert(S_ISLNK(st.st_mode));
  cr_assert_eq(st.st_uid, 65534u);

  // chown replay, and without has_owner nothing changes.
  Attrs c = A(0, 7, 0);
  c.uid = 1234;
  c.gid = 4321;
  c.has_owner = true;
  cr_assert(e.be->SetAttr("implicit/parent/f", c).has_value());
  cr_assert_eq(lstat(e.P("implicit/parent/f").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 1234u);
  cr_assert_eq(st.st_gid, 4321u);
  cr_assert_eq(st.st_mode & 07777, 0600u);
  cr_assert(e.be->SetAttr("implicit/parent/f", A(0640, 7, 0)).has_value());
  cr_assert_eq(lstat(e.P("implicit/parent/f").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 1234u);
  cr_assert_eq(st.st_mode & 07777, 0640u);
  cr_assert(e.be->SetAttr("dir/l", c).has_value());  // the link itself
  cr_assert_eq(lstat(e.P("dir/l").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 1234u);
  cr_assert_eq(lstat(e.P("dir").c_str(), &st), 0);
  cr_assert_eq(st.st_uid, 65534u);
}

// The symlink cases again, resolving one component at a time (kernels
// without openat2).
Test(posix_backend_symlink, walk_fallback) {
  setenv("CKPTFS_BACKEND_NO_OPENAT2", "1", 1);
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  Source src(100, 930);
  Staged s = StageChecked(e, src);
  cr_assert_eq(e.be->Publish(s, "team/b", A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Publish(s, "team/new/deeper", A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Mkdir("team/x", A(0755)).error(), ELOOP);
  cr_assert_eq(e.be->Remove("team/a").error(), ELOOP);
  cr_assert_eq(e.be->SetAttr("team/a", A(0666, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Rename("team/a", "x", false).error(), ELOOP);
  Dest dst(6);
  cr_assert_eq(e.be->Fetch("team/a", dst.fd, 6).error(), ELOOP);
  WriteFile(e.P("file"), "x");
  cr_assert_eq(e.be->Mkdir("file/d", A(0755)).error(), ENOTDIR);
  o.ExpectUntouched();
  cr_assert(e.be->Publish(s, "ok/deep/f", A(0644, 1, 0)).has_value());
  cr_assert(ReadFile(e.P("ok/deep/f")) == src.bytes);
  // The root moved away: EIO, then back.
  std::string away = e.root + ".away";
  cr_assert_eq(rename(e.root.c_str(), away.c_str()), 0);
  cr_assert_eq(e.be->Mkdir("d", A(0755)).error(), EIO);
  cr_assert_eq(rename(away.c_str(), e.root.c_str()), 0);
  cr_assert(e.be->Mkdir("d", A(0755)).has_value());
}

// ---- Issue #11: Stat and ListDir (the shared namespace) ----

namespace {

// Stat and ListDir over a tree with a file (published: checksum, mode,
// mtime), a directory, a symlink and hostile names.
void StatAndListDir() {
  Env e;
  Source src(1000, 950);
  Staged s = StageChecked(e, src);
  cr_assert(e.be->Publish(s, "step/shard 0", A(0640, 1600000000, 42)).has_value());
  cr_assert(e.be->Mkdir("step/sub", A(0750)).has_value());
  cr_assert(e.be->Symlink("step/link", "../elsewhere", {}).has_value());
  const std::string odd = "n\xff%?*\n'\"\\ ;x";  // not UTF-8, shell and URL specials, a newline
  WriteFile(e.P("step/" + odd), "odd");
  cr_assert_eq(mkfifo(e.P("step/fifo").c_str(), 0600), 0);  // neither listed nor stat-able

  auto f = e.be->Stat("step/shard 0");
  cr_assert(f.has_value(), "stat: %d", f.error());
  cr_expect(f->type == Entry::Type::kFile);
  cr_expect_eq(f->path, std::string("step/shard 0"));
  cr_expect_eq(f->size, 1000u);
  cr_expect_eq(f->mode, 0640u);
  cr_expect_eq(f->mtime_sec, 1600000000);
  cr_expect_eq(f->mtime_nsec, 42u);
  cr_expect(f->has_checksum && f->checksum_hi == s.checksum_hi && f->checksum_lo == s.checksum_lo);

  auto d = e.be->Stat("step/sub");
  cr_assert(d.has_value());
  cr_expect(d->type == Entry::Type::kDir);
  cr_expect_eq(d->mode, 0750u);
  auto l = e.be->Stat("step/link");  // the link itself, never its target
  cr_assert(l.has_value());
  cr_expect(l->type == Entry::Type::kSymlink);
  cr_expect_eq(l->target, std::string("../elsewhere"));
  auto o = e.be->Stat("step/" + odd);
  cr_assert(o.has_value());
  cr_expect_eq(o->size, 3u);

  cr_expect_eq(e.be->Stat("step/missing").error(), ENOENT);
  cr_expect_eq(e.be->Stat("nodir/missing").error(), ENOENT);
  cr_expect_eq(e.be->Stat("step/fifo").error(), EINVAL);
  for (const char* bad : {"", "/abs", "a/../b", "..", "a//b", "./a", ".ckptfs-tmp", ".ckptfs-tmp/x"})
    cr_expect_eq(e.be->Stat(bad).error(), EINVAL, "%s", bad);
  cr_expect_eq(e.be->Stat("step/shard 0/below").error(), ENOTDIR);

  auto ls = e.be->ListDir("step");
  cr_assert(ls.has_value(), "listdir: %d", ls.error());
  std::vector<std::string> names;
  for (auto& en : *ls) names.push_back(en.path);
  std::vector<std::string> want = {"step/" + odd, "step/link", "step/shard 0", "step/sub"};
  std::sort(want.begin(), want.end());
  cr_assert(names == want, "got %zu entries", names.size());
  for (auto& en : *ls)
    if (en.path == "step/shard 0") cr_expect(en.has_checksum && en.size == 1000 && en.mode == 0640);

  // The root: the staging area and probes are never listed; one level only.
  auto top = e.be->ListDir("");
  cr_assert(top.has_value());
  cr_assert_eq(top->size(), 1u);
  cr_expect_eq((*top)[0].path, std::string("step"));
  cr_expect((*top)[0].type == Entry::Type::kDir);

  auto empty = e.be->ListDir("step/sub");
  cr_assert(empty.has_value());
  cr_expect(empty->empty());
  cr_expect_eq(e.be->ListDir("nope").error(), ENOENT);
  cr_expect_eq(e.be->ListDir("step/shard 0").error(), ENOTDIR);
  cr_expect_eq(e.be->ListDir("step/link").error(), ELOOP);
  cr_expect_eq(e.be->ListDir("a/../step").error(), EINVAL);
  cr_expect_eq(e.be->ListDir(".ckptfs-tmp").error(), EINVAL);
}

// "team" replaced by a symlink to a directory outside the root: neither
// Stat nor ListDir looks through it.
void StatListDirThroughSymlink() {
  Env e;
  Outside o;
  PlantTeamLink(e, o);
  cr_expect_eq(e.be->Stat("team/a").error(), ELOOP);
  cr_expect_eq(e.be->ListDir("team").error(), ELOOP);
  auto link = e.be->Stat("team");
  cr_assert(link.has_value());
  cr_expect(link->type == Entry::Type::kSymlink);
  cr_expect_eq(link->target, o.dir);
  o.ExpectUntouched();
}

}  // namespace

Test(posix_backend_shared, stat_and_listdir) { StatAndListDir(); }

Test(posix_backend_shared, stat_and_listdir_walk_fallback) {
  setenv("CKPTFS_BACKEND_NO_OPENAT2", "1", 1);
  StatAndListDir();
}

Test(posix_backend_shared, never_through_symlinks) { StatListDirThroughSymlink(); }

Test(posix_backend_shared, never_through_symlinks_walk_fallback) {
  setenv("CKPTFS_BACKEND_NO_OPENAT2", "1", 1);
  StatListDirThroughSymlink();
}

Test(posix_backend_shared, vanished_root_is_eio_not_enoent) {
  Env e;
  cr_assert(e.be->Mkdir("d", A(0755)).has_value());
  std::string away = e.root + ".away";
  cr_assert_eq(rename(e.root.c_str(), away.c_str()), 0);
  auto st = e.be->Stat("d");
  cr_assert_not(st.has_value());
  cr_expect_eq(st.error(), EIO);
  cr_expect_eq(e.be->Stat("missing").error(), EIO);
  cr_expect_eq(e.be->ListDir("").error(), EIO);
  cr_expect_eq(e.be->ListDir("d").error(), EIO);
  cr_assert_eq(rename(away.c_str(), e.root.c_str()), 0);
  cr_expect(e.be->Stat("d").has_value());
  cr_expect(e.be->ListDir("d").has_value());
}

// Cluster records: atomic replace, listed by name, hidden from every other
// method and never reachable through one, refused through symlinks.
Test(posix_backend_records, put_list_replace_and_hidden) {
  Env e;
  cr_expect(e.be->ListRecords("job").value().empty());  // nothing yet: empty, not an error
  cr_assert(e.be->PutRecord("job", "nodeB", "{\"b\":1}").has_value());
  cr_assert(e.be->PutRecord("job", "nodeA", "{\"a\":1}").has_value());
  cr_assert(e.be->PutRecord("job", "nodeA", "{\"a\":2}").has_value());  // replaced
  auto l = e.be->ListRecords("job");
  cr_assert(l.has_value(), "list records: %d", l.error());
  cr_assert_eq(l->size(), 2u);
  cr_expect_eq((*l)[0].first, std::string("nodeA"));
  cr_expect_eq((*l)[0].second, std::string("{\"a\":2}"));
  cr_expect_eq((*l)[1].first, std::string("nodeB"));
  cr_expect(e.be->ListRecords("other").value().empty());
  // Private, and no temporary left behind.
  struct stat st;
  cr_assert_eq(stat(e.P(".ckptfs-cluster/job").c_str(), &st), 0);
  cr_expect_eq(st.st_mode & 07777, 0700u);
  cr_expect_eq(std::distance(std::filesystem::directory_iterator(e.P(".ckptfs-cluster/job")), {}), 2);

  // Invisible and unreachable through the namespace methods.
  auto top = e.be->ListDir("");
  cr_assert(top.has_value());
  cr_expect(top->empty());
  size_t listed = 0;
  cr_assert(e.be->List([&](const Entry&) { listed++; }).has_value());
  cr_expect_eq(listed, 0u);
  for (const char* bad : {".ckptfs-cluster", ".ckptfs-cluster/job", ".ckptfs-cluster/job/nodeA"}) {
    cr_expect_eq(e.be->Stat(bad).error(), EINVAL, "%s", bad);
    cr_expect_eq(e.be->ListDir(bad).error(), EINVAL, "%s", bad);
    cr_expect_eq(e.be->Mkdir(bad, A(0755)).error(), EINVAL, "%s", bad);
    cr_expect_eq(e.be->Remove(bad).error(), EINVAL, "%s", bad);
    Source s(10, 3);
    auto staged = e.be->Stage(s.fd, 10, [] { return false; });
    cr_assert(staged.has_value());
    cr_expect_eq(e.be->Publish(*staged, bad, A(0644)).error(), EINVAL, "%s", bad);  // no forged record
    e.be->Abort(*staged);
  }
  cr_expect_eq(e.be->Rename("x", ".ckptfs-cluster/job/nodeA", false).error(), EINVAL);
  // Not reserved below the top.
  cr_expect(e.be->Mkdir("sub/.ckptfs-cluster", A(0755)).has_value());

  // Bad names and sizes.
  for (const char* bad : {"", ".", "..", ".hidden", "a/b", ".tmp-x"}) {
    cr_expect_eq(e.be->PutRecord("job", bad, "x").error(), EINVAL, "name %s", bad);
    cr_expect_eq(e.be->PutRecord(bad, "n", "x").error(), EINVAL, "dir %s", bad);
  }
  cr_expect_eq(e.be->PutRecord("job", "big", std::string(ckpt::backend::kMaxRecordBytes + 1, 'x')).error(), EFBIG);
  cr_expect(e.be->PutRecord("job", "max", std::string(ckpt::backend::kMaxRecordBytes, 'x')).has_value());
}

Test(posix_backend_records, symlinks_and_foreign_files_are_not_records) {
  Env e;
  char outside[] = "/tmp/ckpt-backend-out-XXXXXX";
  cr_assert_not_null(mkdtemp(outside));
  // The area itself a symlink: refused, nothing written outside.
  cr_assert_eq(symlink(outside, e.P(".ckptfs-cluster").c_str()), 0);
  cr_expect_eq(e.be->PutRecord("job", "n", "x").error(), ELOOP);
  cr_expect_eq(e.be->ListRecords("job").error(), ELOOP);
  cr_expect(std::filesystem::is_empty(outside));
  cr_assert_eq(unlink(e.P(".ckptfs-cluster").c_str()), 0);
  // A record that is a symlink or a directory, or too large, is left out.
  cr_assert(e.be->PutRecord("job", "real", "r").has_value());
  std::string secret = std::string(outside) + "/secret";
  std::ofstream(secret) << "not a record";
  cr_assert_eq(symlink(secret.c_str(), e.P(".ckptfs-cluster/job/link").c_str()), 0);
  cr_assert_eq(mkdir(e.P(".ckptfs-cluster/job/dir").c_str(), 0700), 0);
  {
    std::ofstream big(e.P(".ckptfs-cluster/job/big"));
    big << std::string(ckpt::backend::kMaxRecordBytes + 1, 'x');
  }
  auto l = e.be->ListRecords("job");
  cr_assert(l.has_value(), "%d", l.error());
  cr_assert_eq(l->size(), 1u);
  cr_expect_eq((*l)[0].first, std::string("real"));
  // The dir of another user is not used.
  cr_assert_eq(chown(e.P(".ckptfs-cluster/job").c_str(), 65534, 65534), 0);
  if (geteuid() == 0) {
    cr_expect_eq(e.be->ListRecords("job").error(), EACCES);
    cr_expect_eq(e.be->PutRecord("job", "n", "x").error(), EACCES);
  }
  std::filesystem::remove_all(outside);
}

// ---- Paths longer than PATH_MAX beneath the root ----
//
// PATH_MAX bounds the path of one system call, not how deep a tree goes: a
// mount holds any path whose names fit NAME_MAX (pjdfstest's */03.t make
// 4095-byte paths relative to their working directory, anywhere in the
// mount). The backend holds them too, under a root whose own path is long.

namespace {

// A relative path of exactly `len` bytes: 200-byte components of `c` (the
// last one shorter), like pjdfstest's dirgen_max.
std::string DeepPath(char c, size_t len) {
  std::string p;
  while (p.size() < len) {
    if (!p.empty()) p.push_back('/');
    p.append(std::min<size_t>(200, len - p.size()), c);
  }
  cr_assert(p.size() == len && p.back() != '/');
  return p;
}

// The directory `rel` beneath `root`, opened one component at a time (the
// test's own view of the backend, which no single path can name).
int OpenDirLong(const std::string& root, const std::string& rel) {
  int fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (size_t pos = 0; fd >= 0 && pos < rel.size();) {
    size_t slash = std::min(rel.find('/', pos), rel.size());
    int next = openat(fd, rel.substr(pos, slash - pos).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    fd = next;
    pos = slash + 1;
  }
  return fd;
}

std::string ReadAt(int dfd, const std::string& name) {
  int fd = openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  cr_assert_geq(fd, 0, "open %s...: %d", name.substr(0, 8).c_str(), errno);
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// Every namespace operation, publish and fetch at a path of `len` bytes.
void LongPathRoundTrip(size_t len) {
  Env e(230);
  const std::string f = DeepPath('a', len);
  const std::string dir = f.substr(0, f.rfind('/')), leaf = f.substr(f.rfind('/') + 1);
  const std::string top = f.substr(0, f.find('/'));
  auto sibling = [&](char c) { return dir + "/" + std::string(1, c) + leaf.substr(1); };
  auto sib_leaf = [&](char c) { return std::string(1, c) + leaf.substr(1); };

  auto md = e.be->Mkdir(dir, A(0750));
  cr_assert(md.has_value(), "mkdir of a %zu-byte path: %d", dir.size(), md.error());
  auto d = e.be->Stat(dir);
  cr_assert(d.has_value(), "stat dir: %d", d.error());
  cr_assert(d->type == Entry::Type::kDir && d->mode == 0750);

  Source src(100000, len);
  Staged s = StageChecked(e, src);
  auto pub = e.be->Publish(s, f, A(0640, 1700000000, 5));
  cr_assert(pub.has_value(), "publish at %zu bytes: %d", len, pub.error());
  int dfd = OpenDirLong(e.root, dir);
  cr_assert_geq(dfd, 0);
  cr_assert(ReadAt(dfd, leaf) == src.bytes);
  auto st = e.be->Stat(f);
  cr_assert(st.has_value(), "stat: %d", st.error());
  cr_assert(st->type == Entry::Type::kFile && st->size == src.bytes.size() && st->has_checksum);
  cr_assert(st->checksum_hi == s.checksum_hi && st->checksum_lo == s.checksum_lo);
  Dest dst(src.bytes.size());
  auto sum = e.be->Fetch(f, dst.fd, src.bytes.size());
  cr_assert(sum.has_value(), "fetch: %d", sum.error());
  cr_assert(dst.Read(src.bytes.size()) == src.bytes);

  cr_assert(e.be->SetAttr(f, A(0600, 42, 7)).has_value());
  struct stat a;
  cr_assert_eq(fstatat(dfd, leaf.c_str(), &a, AT_SYMLINK_NOFOLLOW), 0);
  cr_assert_eq(a.st_mode & 07777, 0600u);
  cr_assert_eq(a.st_mtim.tv_sec, 42);

  cr_assert(e.be->Link(f, sibling('l')).has_value());
  struct stat b;
  cr_assert_eq(fstatat(dfd, sib_leaf('l').c_str(), &b, AT_SYMLINK_NOFOLLOW), 0);
  cr_assert_eq(b.st_ino, a.st_ino);
  cr_assert_eq(b.st_nlink, 2u);

  cr_assert(e.be->Symlink(sibling('s'), "target", {}).has_value());
  char buf[16];
  ssize_t n = readlinkat(dfd, sib_leaf('s').c_str(), buf, sizeof buf);
  cr_assert(n == 6 && std::string(buf, 6) == "target");

  cr_assert(e.be->Rename(f, sibling('r'), false).has_value());
  cr_assert_eq(e.be->Stat(f).error(), ENOENT);
  cr_assert(ReadAt(dfd, sib_leaf('r')) == src.bytes);

  auto ls = e.be->ListDir(dir);
  cr_assert(ls.has_value(), "listdir: %d", ls.error());
  std::vector<std::string> names;
  for (auto& en : *ls) names.push_back(en.path);
  cr_assert(names == (std::vector<std::string>{sibling('l'), sibling('r'), sibling('s')}));
  size_t listed = 0;
  cr_assert(e.be->List([&](const Entry& en) { listed += en.path == sibling('r') && en.has_checksum; }).has_value());
  cr_assert_eq(listed, 1u);

  cr_assert(e.be->Remove(sibling('l')).has_value());
  cr_assert(e.be->Remove(sibling('s')).has_value());
  cr_assert_eq(fstatat(dfd, sib_leaf('l').c_str(), &b, AT_SYMLINK_NOFOLLOW), -1);
  close(dfd);
  cr_assert(e.be->Rmdir(top).has_value());
  cr_assert_eq(e.be->Stat(top).error(), ENOENT);
  cr_assert_eq(e.TmpCount(), 0u);
}

// A component past the first PATH_MAX bytes replaced by a symlink to a
// directory outside: nothing goes through it.
void LongPathNeverThroughSymlinks() {
  Env e(230);
  Outside o;
  const std::string f = DeepPath('a', 6000);
  const std::string dir = f.substr(0, f.rfind('/'));
  cr_assert(e.be->Mkdir(dir, A(0755)).has_value());
  const size_t cut = f.find('/', 4500);  // "a.../<link>" with the link past 4096 bytes
  const std::string link = f.substr(0, cut), link_parent = link.substr(0, link.rfind('/'));
  int pfd = OpenDirLong(e.root, link_parent);
  cr_assert_geq(pfd, 0);
  const std::string name = link.substr(link.rfind('/') + 1);
  cr_assert_eq(renameat(pfd, name.c_str(), pfd, "moved"), 0);
  cr_assert_eq(symlinkat(o.dir.c_str(), pfd, name.c_str()), 0);
  close(pfd);
  const std::string via = link + "/a";  // would be o.dir + "/a"
  Source src(100, 940);
  Staged s = StageChecked(e, src);
  cr_assert_eq(e.be->Publish(s, via, A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Publish(s, f, A(0644, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Mkdir(link + "/x", A(0755)).error(), ELOOP);
  cr_assert_eq(e.be->Remove(via).error(), ELOOP);
  cr_assert_eq(e.be->SetAttr(via, A(0666, 1, 0)).error(), ELOOP);
  cr_assert_eq(e.be->Stat(via).error(), ELOOP);
  cr_assert_eq(e.be->ListDir(link).error(), ELOOP);
  Dest dst(6);
  cr_assert_eq(e.be->Fetch(via, dst.fd, 6).error(), ELOOP);
  o.ExpectUntouched();
}

}  // namespace

Test(posix_backend_long, path_max_minus_one) { LongPathRoundTrip(4095); }
Test(posix_backend_long, past_path_max) { LongPathRoundTrip(6000); }
Test(posix_backend_long, past_path_max_walk_fallback) {
  setenv("CKPTFS_BACKEND_NO_OPENAT2", "1", 1);
  LongPathRoundTrip(6000);
}
Test(posix_backend_long, never_through_symlinks) { LongPathNeverThroughSymlinks(); }
Test(posix_backend_long, never_through_symlinks_walk_fallback) {
  setenv("CKPTFS_BACKEND_NO_OPENAT2", "1", 1);
  LongPathNeverThroughSymlinks();
}
