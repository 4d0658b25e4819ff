// test_posix_backend.cc — the POSIX directory backend: staging and publishing
// (io_uring and the pread/pwrite fallback), namespace replay, fetch and list,
// each in a fresh directory under /tmp with sources on /dev/shm.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

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

using ckpt::backend::Backend;
using ckpt::backend::Entry;
using ckpt::backend::Staged;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A backend over a fresh directory, checked (so the staging area exists).
struct Env {
  std::string root;
  std::unique_ptr<Backend> be;

  Env() {
    char tmpl[] = "/tmp/ckpt-backend-unit-XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl));
    root = tmpl;
    auto b = ckpt::backend::OpenPosixBackend(root);
    cr_assert(b.has_value(), "open: %d", b.error());
    be = std::move(*b);
    cr_assert(be->Check().has_value());
  }
  ~Env() { std::filesystem::remove_all(root); }

  std::string P(const std::string& rel) const { return root + "/" + rel; }
  std::string Tmp() const { return root + "/" + ckpt::backend::kTmpDir; }
  size_t TmpCount() const {
    auto it = std::filesystem::directory_iterator(Tmp());
    return static_cast<size_t>(std::distance(begin(it), end(it)));
  }
};

// A source file on /dev/shm holding `size` deterministic random bytes.
struct Source {
  int fd = -1;
  std::string bytes;

  Source(uint64_t size, uint64_t seed) {
    char tmpl[] = "/dev/shm/ckpt-backend-src-XXXXXX";
    fd = mkstemp(tmpl);
    cr_assert_geq(fd, 0);
    unlink(tmpl);
    std::mt19937_64 rng(seed);
    bytes.resize(size);
    for (uint64_t i = 0; i < size; i += 8) {
      uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, std::min<uint64_t>(8, size - i));
    }
    cr_assert_eq(pwrite(fd, bytes.data(), size, 0), static_cast<ssize_t>(size));
  }
  ~Source() { close(fd); }
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
  XXH128_hash_t h = XXH3_128bits(src.bytes.data(), src.bytes.size());
  cr_assert_eq(s->size, src.bytes.size());
  cr_assert_eq(s->checksum_hi, h.high64);
  cr_assert_eq(s->checksum_lo, h.low64);
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
    cr_assert(e.be->Publish(s, rel, 0640, sec, nsec).has_value());
    cr_assert_eq(e.TmpCount(), 0u);
    cr_assert(ReadFile(e.P(rel)) == src.bytes, "bytes differ for size %llu", (unsigned long long)size);
    struct stat st;
    cr_assert_eq(lstat(e.P(rel).c_str(), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0640u);
    cr_assert_eq(st.st_mtim.tv_sec, sec);
    cr_assert_eq(st.st_mtim.tv_nsec, nsec);
    char x[64];
    ssize_t n = getxattr(e.P(rel).c_str(), "user.ckptfs.xxh128", x, sizeof x);
    cr_assert_eq(n, 32);
    cr_assert(std::string(x, 32) == Hex(s.checksum_hi, s.checksum_lo));
    i++;
  }
  // Publishing over an existing file replaces it.
  Source again(5000, 77);
  Staged s = StageChecked(e, again);
  cr_assert(e.be->Publish(s, "d/e/f1", 0, 5, 0).has_value());
  cr_assert(ReadFile(e.P("d/e/f1")) == again.bytes);
  // The staged file is gone once published.
  cr_assert_eq(e.be->Publish(s, "d/e/f9", 0, 5, 0).error(), ENOENT);
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
  cr_assert_eq(e.be->Publish(s, "x", 0, 0, 0).error(), ENOENT);
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

Test(posix_backend, check_cleans_leftovers) {
  Env e;
  WriteFile(e.Tmp() + "/st-old", "partial");
  std::filesystem::create_directories(e.Tmp() + "/odd/dir");
  WriteFile(e.Tmp() + "/odd/dir/f", "x");
  cr_assert(symlink("nowhere", (e.Tmp() + "/sl-old").c_str()) == 0);
  WriteFile(e.P("keep"), "kept");
  cr_assert(e.be->Check().has_value());
  cr_assert_eq(e.TmpCount(), 0u);
  cr_assert(ReadFile(e.P("keep")) == "kept");
  // A root whose staging area is not a directory is refused.
  std::filesystem::remove_all(e.Tmp());
  WriteFile(e.Tmp(), "");
  cr_assert_eq(e.be->Check().error(), ENOTDIR);
}

Test(posix_backend, mkdir_rmdir_remove) {
  Env e;
  cr_assert(e.be->Mkdir("a/b/c", 0750).has_value());
  struct stat st;
  cr_assert_eq(stat(e.P("a/b/c").c_str(), &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0750u);
  cr_assert(e.be->Mkdir("a/b/c", 0700).has_value());  // exists: fine
  cr_assert(e.be->Mkdir("a", 0).has_value());
  WriteFile(e.P("a/file"), "data");
  cr_assert_eq(e.be->Mkdir("a/file", 0755).error(), EEXIST);
  cr_assert_eq(e.be->Mkdir("a/file/x", 0755).error(), ENOTDIR);

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
  cr_assert(e.be->Mkdir("outside", 0755).has_value());
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

  cr_assert(e.be->Symlink("s/l", "../f").has_value());
  char buf[64];
  ssize_t n = readlink(e.P("s/l").c_str(), buf, sizeof buf);
  cr_assert_eq(n, 4);
  cr_assert(std::string(buf, 4) == "../f");
  cr_assert(ReadFile(e.P("s/l")) == "data");
  cr_assert(e.be->Symlink("s/l", "/elsewhere").has_value());  // replaces
  n = readlink(e.P("s/l").c_str(), buf, sizeof buf);
  cr_assert(std::string(buf, n) == "/elsewhere");
  cr_assert(e.be->Symlink("other", "f").has_value());  // replaces a file
  n = readlink(e.P("other").c_str(), buf, sizeof buf);
  cr_assert(std::string(buf, n) == "f");
  cr_assert_eq(e.TmpCount(), 0u);
}

Test(posix_backend, setattr) {
  Env e;
  WriteFile(e.P("f"), "data");
  cr_assert(e.be->Mkdir("d", 0755).has_value());
  cr_assert(e.be->Symlink("l", "f").has_value());
  struct stat st;

  cr_assert(e.be->SetAttr("f", 0604, 1234, 5678).has_value());
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0604u);
  cr_assert_eq(st.st_mtim.tv_sec, 1234);
  cr_assert_eq(st.st_mtim.tv_nsec, 5678);

  cr_assert(e.be->SetAttr("f", 0, 99, 0).has_value());  // mode 0: unchanged
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0604u);
  cr_assert_eq(st.st_mtim.tv_sec, 99);

  cr_assert(e.be->SetAttr("d", 0711, 42, 1).has_value());
  cr_assert_eq(lstat(e.P("d").c_str(), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0711u);
  cr_assert_eq(st.st_mtim.tv_sec, 42);

  // The symlink itself, never its target.
  cr_assert(e.be->SetAttr("l", 0600, 7, 0).has_value());
  cr_assert_eq(lstat(e.P("l").c_str(), &st), 0);
  cr_assert_eq(st.st_mtim.tv_sec, 7);
  cr_assert_eq(lstat(e.P("f").c_str(), &st), 0);
  cr_assert_eq(st.st_mtim.tv_sec, 99);
  cr_assert_eq(st.st_mode & 07777, 0604u);

  cr_assert_eq(e.be->SetAttr("missing", 0644, 1, 0).error(), ENOENT);
  cr_assert_eq(e.be->SetAttr("f", 0644, 1, 1000000000u).error(), EINVAL);
}

static void FetchRoundTrip() {
  Env e;
  const uint64_t sizes[] = {0, 1, 4 * kMiB + 123, 40 * kMiB};
  int i = 0;
  for (uint64_t size : sizes) {
    Source src(size, 200 + i);
    Staged s = StageChecked(e, src);
    std::string rel = "fetch/f" + std::to_string(i++);
    cr_assert(e.be->Publish(s, rel, 0644, 1, 0).has_value());
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
  cr_assert(e.be->Publish(s, "f", 0644, 1, 0).has_value());
  Dest dst(src.bytes.size(), O_WRONLY);  // cannot be mapped for writing: buffered copy
  auto sum = e.be->Fetch("f", dst.fd, src.bytes.size());
  cr_assert(sum.has_value());
  cr_assert_eq(sum->first, s.checksum_hi);
  cr_assert_eq(sum->second, s.checksum_lo);
  cr_assert(dst.Read(src.bytes.size()) == src.bytes);
  Dest small(10);
  cr_assert_eq(e.be->Fetch("f", small.fd, src.bytes.size()).error(), EINVAL);
}

Test(posix_backend, list) {
  Env e;
  Source src(4 * kMiB + 123, 400);
  Staged s = StageChecked(e, src);
  cr_assert(e.be->Publish(s, "dir/sub/file", 0640, 1600000000, 42).has_value());
  cr_assert(e.be->Mkdir("empty", 0700).has_value());
  cr_assert(e.be->Symlink("dir/link", "sub/file").has_value());
  WriteFile(e.P("plain"), "abc");  // no checksum xattr
  cr_assert(setxattr(e.P("plain").c_str(), "user.ckptfs.xxh128", "zz", 2, 0) == 0 || errno == ENOTSUP);
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
    cr_assert_eq(e.be->Mkdir(p, 0755).error(), EINVAL, "mkdir '%s'", bad);
    cr_assert_eq(e.be->Rmdir(p).error(), EINVAL, "rmdir '%s'", bad);
    cr_assert_eq(e.be->Remove(p).error(), EINVAL, "remove '%s'", bad);
    cr_assert_eq(e.be->Rename("f", p, false).error(), EINVAL, "rename to '%s'", bad);
    cr_assert_eq(e.be->Rename(p, "g", false).error(), EINVAL, "rename from '%s'", bad);
    cr_assert_eq(e.be->Symlink(p, "t").error(), EINVAL, "symlink '%s'", bad);
    cr_assert_eq(e.be->Link("f", p).error(), EINVAL, "link '%s'", bad);
    cr_assert_eq(e.be->SetAttr(p, 0644, 0, 0).error(), EINVAL, "setattr '%s'", bad);
    cr_assert_eq(e.be->Fetch(p, dst.fd, 10).error(), EINVAL, "fetch '%s'", bad);
    cr_assert_eq(e.be->Publish(s, p, 0644, 0, 0).error(), EINVAL, "publish '%s'", bad);
  }
  // Names that merely look alike are fine.
  cr_assert(e.be->Mkdir("a/..b/.c/...", 0755).has_value());
  cr_assert(e.be->Mkdir("sub/.ckptfs-tmp", 0755).has_value());
  Staged forged = s;
  forged.token = "../f";
  cr_assert_eq(e.be->Publish(forged, "g", 0644, 0, 0).error(), EINVAL);
  cr_assert(e.be->Publish(s, "g", 0644, 0, 0).has_value());
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
      if (auto st = e.be->Publish(*s, "p/q/f" + std::to_string(i), 0644, 1, 0); !st) errs[i] = st.error();
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads; i++) {
    cr_assert_eq(errs[i], 0, "thread %d: %d", i, errs[i]);
    cr_assert(ReadFile(e.P("p/q/f" + std::to_string(i))) == srcs[i]->bytes);
  }
  cr_assert_eq(e.TmpCount(), 0u);
}
