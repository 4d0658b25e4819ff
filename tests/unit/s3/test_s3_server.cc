// test_s3_server.cc — the S3 backend against a real S3-compatible server:
// s3rver on 127.0.0.1 (tests/s3/s3rver.sh, with strict SigV4 checks), one
// server per binary run (one bucket per test; a test run alone starts its own). Skipped, with the reason, when
// node or s3rver is not installed (npm install --prefix tests/s3/node s3rver@3).
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/checksum.h"
#include "backend/s3_backend.h"
#include "common/failpoint.h"

using namespace ckpt::backend;

namespace {

std::string g_dir, g_script, g_bucket = "ckptfs-test";
int g_port = 0;
bool g_own_server = false;  // this test started its own server (no shared one)

// One server for the whole binary: started before the first test (the report
// hook runs in Criterion's runner, whose environment every test process
// inherits), one bucket per test, claimed by creating a file in the shared
// directory. A node start-up costs ~0.7 s; 20 of them were most of this
// binary's time. A test run alone, or with the hook's server missing, starts
// its own.
constexpr int kSharedBuckets = 64;
const char kSharedEnv[] = "CKPTFS_TEST_S3RVER";  // "PORT:DIR"

std::string FindScript() {
  if (const char* src = std::getenv("CKPTFS_SRC_DIR")) return std::string(src) + "/tests/s3/s3rver.sh";
  std::filesystem::path p = std::filesystem::current_path();
  for (int i = 0; i < 6; i++, p = p.parent_path())
    if (std::filesystem::exists(p / "tests/s3/s3rver.sh")) return (p / "tests/s3/s3rver.sh").string();
  return {};
}

// Starts s3rver with `buckets` (comma-separated) under a new directory.
// Returns the exit code of s3rver.sh start (77: not installed).
int Launch(const std::string& buckets, std::string* dir, int* port) {
  char tmpl[] = "/tmp/ckpt-s3rver-XXXXXX";
  *dir = mkdtemp(tmpl);
  std::string cmd = g_script + " start " + *dir + " 0 " + buckets + " 2>" + *dir + "/start.err";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return 1;
  char buf[64] = {0};
  bool got = fgets(buf, sizeof buf, f) != nullptr;
  int rc = pclose(f);
  if (!WIFEXITED(rc)) return 1;
  *port = got ? std::atoi(buf) : 0;
  return WEXITSTATUS(rc) == 0 && *port <= 0 ? 1 : WEXITSTATUS(rc);
}

void Shutdown(const std::string& dir) {
  std::string cmd = g_script + " stop " + dir;
  if (std::system(cmd.c_str()) != 0) fprintf(stderr, "stopping s3rver failed\n");
  std::filesystem::remove_all(dir);
}

// A bucket of the shared server, if there is one and a bucket is left.
bool ClaimShared() {
  const char* env = std::getenv(kSharedEnv);
  if (!env) return false;
  std::string v = env;
  auto colon = v.find(':');
  if (colon == std::string::npos) return false;
  for (int i = 0; i < kSharedBuckets; i++) {
    std::string claim = v.substr(colon + 1) + "/claim-" + std::to_string(i);
    int fd = open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) continue;
    close(fd);
    g_port = std::atoi(v.c_str());
    g_bucket = "ckptfs-test-" + std::to_string(i);
    return true;
  }
  return false;
}

void StartServer() {
  g_script = FindScript();
  if (g_script.empty()) cr_skip_test("tests/s3/s3rver.sh not found (run from the source tree or set CKPTFS_SRC_DIR)");
  if (ClaimShared()) return;
  g_own_server = true;
  int rc = Launch(g_bucket, &g_dir, &g_port);
  if (rc == 77)
    cr_skip_test(
        "s3rver is not available: node or tests/s3/node/node_modules/s3rver missing "
        "(npm install --prefix tests/s3/node s3rver@3)");
  cr_assert(rc == 0, "s3rver did not start (see %s/start.err)", g_dir.c_str());
}

void StopServer() {
  if (g_own_server && !g_dir.empty()) Shutdown(g_dir);
}

std::string g_shared_dir;  // in the runner: the shared server's directory

S3Config Cfg(const std::string& prefix = "ck/run1") {
  S3Config c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(g_port);
  c.region = "us-east-1";
  c.bucket = g_bucket;
  c.prefix = prefix;
  c.access_key = "S3RVER";
  c.secret_key = "S3RVER";
  c.part_size = 5ull << 20;
  c.parallel = 4;
  c.retry_base_ms = 10;
  return c;
}

std::unique_ptr<Backend> Open(const S3Config& c) {
  auto be = OpenS3Backend(c);
  cr_assert(be.has_value(), "OpenS3Backend: %d", be.error());
  return std::move(*be);
}

// A temporary file holding `size` pseudo-random bytes (seeded), unlinked.
int SourceFile(uint64_t size, uint32_t seed, std::string* bytes) {
  char tmpl[] = "/tmp/ckpt-s3src-XXXXXX";
  int fd = mkstemp(tmpl);
  cr_assert(fd >= 0);
  unlink(tmpl);
  bytes->resize(size);
  std::mt19937 rng(seed);
  for (auto& c : *bytes) c = static_cast<char>(rng());
  cr_assert_eq(pwrite(fd, bytes->data(), size, 0), static_cast<ssize_t>(size));
  return fd;
}

int DestFile(uint64_t size) {
  char tmpl[] = "/tmp/ckpt-s3dst-XXXXXX";
  int fd = mkstemp(tmpl);
  cr_assert(fd >= 0);
  unlink(tmpl);
  cr_assert_eq(ftruncate(fd, static_cast<off_t>(size)), 0);
  return fd;
}

std::string ReadAll(int fd, uint64_t size) {
  std::string s(size, '\0');
  cr_assert_eq(pread(fd, s.data(), size, 0), static_cast<ssize_t>(size));
  return s;
}

const std::function<bool()> kNever = [] { return false; };

// Stages `size` random bytes and publishes them at `path`; returns the bytes.
std::string Put(Backend& be, const std::string& path, uint64_t size, uint32_t seed = 1) {
  std::string bytes;
  int fd = SourceFile(size, seed, &bytes);
  auto st = be.Stage(fd, size, kNever);
  close(fd);
  cr_assert(st.has_value(), "stage %s: %d", path.c_str(), st.error());
  auto [hi, lo] = ckpt::backend::ContentChecksum(bytes.data(), bytes.size());
  cr_expect_eq(st->checksum_hi, hi);
  cr_expect_eq(st->checksum_lo, lo);
  cr_expect_eq(st->size, size);
  auto pub = be.Publish(*st, path, {0640, 0, 0, false, 1700000000, 123456789});
  cr_assert(pub.has_value(), "publish %s: %d", path.c_str(), pub.error());
  return bytes;
}

void ExpectContent(Backend& be, const std::string& path, const std::string& bytes) {
  int fd = DestFile(bytes.size());
  auto h = be.Fetch(path, fd, bytes.size());
  cr_assert(h.has_value(), "fetch %s: %d", path.c_str(), h.error());
  auto want = ckpt::backend::ContentChecksum(bytes.data(), bytes.size());
  cr_expect_eq(h->first, want.first);
  cr_expect_eq(h->second, want.second);
  cr_expect(ReadAll(fd, bytes.size()) == bytes, "content of %s differs", path.c_str());
  close(fd);
}

std::map<std::string, Entry> ListAll(Backend& be, std::vector<std::string>* order = nullptr) {
  std::map<std::string, Entry> m;
  auto st = be.List([&](const Entry& e) {
    m[e.path] = e;
    if (order) order->push_back(e.path);
  });
  cr_assert(st.has_value(), "list: %d", st.error());
  return m;
}

// What the staging area holds (a backend rooted at it).
size_t StagedCount(const std::string& prefix = "ck/run1") {
  auto be = Open(Cfg(prefix.empty() ? ".ckptfs-tmp" : prefix + "/.ckptfs-tmp"));
  size_t n = 0;
  cr_assert(be->List([&](const Entry& e) { n += e.type != Entry::Type::kDir; }).has_value());
  return n;
}

// Removes every staged object, as a person or a lifecycle rule might
// behind the daemon's back.
void WipeStaging(const std::string& prefix = "ck/run1") {
  auto be = Open(Cfg(prefix + "/.ckptfs-tmp"));
  std::vector<std::string> files;
  cr_assert(be->List([&](const Entry& e) {
                  if (e.type != Entry::Type::kDir) files.push_back(e.path);
                }).has_value());
  for (const auto& f : files) cr_assert(be->Remove(f).has_value(), "remove staged %s", f.c_str());
}

}  // namespace

ReportHook(PRE_ALL)(struct criterion_test_set*) {
  g_script = FindScript();
  if (g_script.empty()) return;
  std::string buckets;
  for (int i = 0; i < kSharedBuckets; i++) buckets += (i ? ",ckptfs-test-" : "ckptfs-test-") + std::to_string(i);
  int port = 0;
  if (Launch(buckets, &g_shared_dir, &port) != 0) {
    std::filesystem::remove_all(g_shared_dir);  // each test starts its own, and says why it cannot
    g_shared_dir.clear();
    return;
  }
  setenv(kSharedEnv, (std::to_string(port) + ":" + g_shared_dir).c_str(), 1);
}

ReportHook(POST_ALL)(struct criterion_global_stats*) {
  if (!g_shared_dir.empty()) Shutdown(g_shared_dir);
}

TestSuite(s3_server, .init = StartServer, .fini = StopServer, .timeout = 120);

// Leftovers (s3_backend.cc "Leftovers"): a daemon of another state dir
// (another node, another mount) stages under the same prefix and its
// objects and uploads stay; those of an earlier daemon of this state dir
// (same owner, another nonce) go at once.
Test(s3_server, check_ok_and_cleans_leftovers) {
  S3Config mine = Cfg(), theirs = Cfg();
  mine.owner = "node-a";
  theirs.owner = "node-b";
  auto be = Open(mine);
  cr_assert(be->Check().has_value());
  // Staged, never published: a large one (a multipart upload, completed at
  // the end of Stage) and a small one, by a daemon that then dies.
  std::string bytes;
  int fd = SourceFile(12ull << 20, 3, &bytes);
  auto st = be->Stage(fd, bytes.size(), kNever);
  close(fd);
  cr_assert(st.has_value());
  cr_expect_eq(StagedCount(), 1u);
  // The other node's mount, or its probe of a failed store, keeps it.
  auto other = Open(theirs);
  cr_assert(other->Check().has_value());
  cr_expect_eq(StagedCount(), 1u, "another node removed a live daemon's staged object");
  cr_assert(be->Publish(*st, "f", {0644, 0, 0, false, 1700000000, 0}).has_value());
  cr_expect_eq(StagedCount(), 0u);
  // Staged again; the daemon dies; its successor on the same state dir
  // removes it.
  fd = SourceFile(12ull << 20, 4, &bytes);
  st = be->Stage(fd, bytes.size(), kNever);
  close(fd);
  cr_assert(st.has_value());
  be.reset();
  auto be2 = Open(mine);
  cr_assert(be2->Check().has_value());
  cr_expect_eq(StagedCount(), 0u);
  auto left = ListAll(*be2);
  cr_expect_eq(left.size(), 1u);
  cr_expect(left.count("f"));
}

Test(s3_server, check_wrong_credentials_is_eacces) {
  S3Config c = Cfg();
  c.access_key = "NOSUCHKEY";
  auto st = Open(c)->Check();
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), EACCES);
  c = Cfg();
  c.secret_key = "wrong-secret";  // caught by the strict SigV4 check
  st = Open(c)->Check();
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), EACCES);
}

Test(s3_server, check_missing_bucket_is_enoent) {
  S3Config c = Cfg();
  c.bucket = "no-such-bucket";
  auto st = Open(c)->Check();
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), ENOENT);
}

Test(s3_server, unreachable_endpoint_retries_then_eio) {
  S3Config c = Cfg();
  c.endpoint = "http://127.0.0.1:1";  // nothing listens there
  c.max_attempts = 3;
  auto st = Open(c)->Check();
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), EIO);
}

Test(s3_server, small_file_stage_publish_fetch_list) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  std::string bytes = Put(*be, "step_1/model.pt", 1000003);
  std::string empty = Put(*be, "step_1/empty", 0);
  ExpectContent(*be, "step_1/model.pt", bytes);
  ExpectContent(*be, "step_1/empty", empty);

  std::vector<std::string> order;
  auto m = ListAll(*be, &order);
  cr_assert_eq(m.size(), 3u);
  cr_expect_eq(order.front(), std::string("step_1"));  // synthesized parent first
  cr_expect(m["step_1"].type == Entry::Type::kDir);
  const Entry& f = m["step_1/model.pt"];
  cr_expect(f.type == Entry::Type::kFile);
  cr_expect_eq(f.size, bytes.size());
  cr_expect_eq(f.mode, 0640u);
  cr_expect_eq(f.mtime_sec, 1700000000);
  cr_expect_eq(f.mtime_nsec, 123456789u);
  cr_expect(f.has_checksum);
  auto h = ckpt::backend::ContentChecksum(bytes.data(), bytes.size());
  cr_expect_eq(f.checksum_hi, h.first);
  cr_expect_eq(f.checksum_lo, h.second);

  int fd = DestFile(10);
  auto r = be->Fetch("step_1/model.pt", fd, 10);  // wrong size
  cr_assert(!r.has_value());
  cr_expect_eq(r.error(), EIO);
  r = be->Fetch("nope", fd, 10);
  cr_assert(!r.has_value());
  cr_expect_eq(r.error(), ENOENT);
  close(fd);
  cr_expect_eq(StagedCount(), 0u);
}

Test(s3_server, multipart_stage_publish_fetch) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  const uint64_t size = (40ull << 20) + 12345;  // 9 parts of 5 MiB, the last one short
  std::string bytes;
  int fd = SourceFile(size, 7, &bytes);
  auto st = be->Stage(fd, size, kNever);
  close(fd);
  cr_assert(st.has_value(), "stage: %d", st.error());
  // Nothing under the final name before Publish.
  cr_expect(ListAll(*be).empty());
  cr_expect_eq(StagedCount(), 1u);
  cr_assert(be->Publish(*st, "big/shard.bin", {0600, 0, 0, false, 1700000001, 0}).has_value());
  cr_expect_eq(StagedCount(), 0u);
  ExpectContent(*be, "big/shard.bin", bytes);
  auto m = ListAll(*be);
  cr_expect_eq(m["big/shard.bin"].size, size);
  cr_expect_eq(m["big/shard.bin"].mode, 0600u);
  cr_expect(m["big/shard.bin"].has_checksum);
}

// A server that assembles a short object from the parts it acknowledged
// (s3rver did, on a busy machine): staging says EIO, so the drain tries
// again, instead of publishing a checkpoint shard 64 KiB short.
Test(s3_server, short_multipart_object_is_an_error) {
  const char* env = std::getenv(kSharedEnv);
  std::string dir = g_own_server ? g_dir : (env ? std::string(env).substr(std::string(env).find(':') + 1) : "");
  cr_assert(!dir.empty());
  const std::string flag = dir + "/fault-short-part-" + g_bucket;
  int ffd = open(flag.c_str(), O_CREAT | O_WRONLY, 0600);
  cr_assert(ffd >= 0);
  close(ffd);
  auto be = Open(Cfg());
  const uint64_t size = (11ull << 20) + 3;  // three parts
  std::string bytes;
  int fd = SourceFile(size, 9, &bytes);
  auto st = be->Stage(fd, size, kNever);
  close(fd);
  unlink(flag.c_str());
  cr_assert(!st.has_value(), "a short multipart object was staged");
  cr_expect_eq(st.error(), EIO);
  // Without the fault, the same bytes stage and publish whole.
  fd = SourceFile(size, 9, &bytes);
  auto ok = be->Stage(fd, size, kNever);
  close(fd);
  cr_assert(ok.has_value(), "stage: %d", ok.error());
  cr_assert(be->Publish(*ok, "whole.bin", {0600, 0, 0, false, 1700000002, 0}).has_value());
  ExpectContent(*be, "whole.bin", bytes);
}

// S3 sends a sparse file's zeros; the fetch leaves them out of the
// destination (holes), so a file far larger than the memory tier's budget
// can be fetched into it (issue #16, "the same rule for fetch").
Test(s3_server, fetch_leaves_zero_blocks_as_holes) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  const uint64_t size = (24ull << 20) + 100;  // 4 ranges of 8 MiB, the last one short
  std::string bytes(size, '\0');
  bytes[0] = 'h';
  bytes[(9ull << 20) + 4095] = 'X';  // the last byte of a block, in the second range
  bytes[(9ull << 20) + 4096] = 'Y';  // the first of the next
  bytes[size - 1] = 't';
  char tmpl[] = "/tmp/ckpt-s3src-XXXXXX";
  int src = mkstemp(tmpl);
  cr_assert(src >= 0);
  unlink(tmpl);
  cr_assert_eq(pwrite(src, bytes.data(), size, 0), static_cast<ssize_t>(size));
  auto st = be->Stage(src, size, kNever);
  close(src);
  cr_assert(st.has_value(), "stage: %d", st.error());
  cr_assert(be->Publish(*st, "sparse.bin", {0600, 0, 0, false, 1700000001, 0}).has_value());
  int fd = DestFile(size);
  auto h = be->Fetch("sparse.bin", fd, size);
  cr_assert(h.has_value(), "fetch: %d", h.error());
  auto want = ckpt::backend::ContentChecksum(bytes.data(), bytes.size());
  cr_expect_eq(h->first, want.first);
  cr_expect_eq(h->second, want.second);
  cr_expect(ReadAll(fd, size) == bytes, "content differs");
  struct stat sb;
  cr_assert_eq(fstat(fd, &sb), 0);
  cr_expect_lt(static_cast<uint64_t>(sb.st_blocks) * 512, 1ull << 20, "the fetched copy allocates %llu bytes",
               static_cast<unsigned long long>(sb.st_blocks) * 512);
  close(fd);
}

Test(s3_server, multipart_copy_paths) {
  // UploadPartCopy (s3rver answers 501: falls back to CopyObject), and the
  // GET + UploadPart path for objects over CopyObject's limit.
  S3Config c = Cfg();
  c.multipart_copy_threshold = 8ull << 20;
  auto be = Open(c);
  cr_assert(be->Check().has_value());
  std::string a = Put(*be, "a.bin", 21ull << 20, 11);
  ExpectContent(*be, "a.bin", a);
  c.max_copy_object_size = 6ull << 20;
  auto be2 = Open(c);
  std::string b = Put(*be2, "b.bin", 17ull << 20, 12);
  ExpectContent(*be2, "b.bin", b);
  cr_assert(be2->Rename("b.bin", "c.bin", false).has_value());
  ExpectContent(*be2, "c.bin", b);
  auto m = ListAll(*be2);
  cr_expect(m.count("b.bin") == 0);
  cr_expect_eq(m["c.bin"].mode, 0640u);  // metadata went along
  cr_expect(m["c.bin"].has_checksum);
}

Test(s3_server, rename_directory_and_exchange) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  cr_assert(be->Mkdir("a", {0750}).has_value());
  cr_assert(be->Mkdir("a/empty", {0700}).has_value());
  std::string x = Put(*be, "a/x", 1000, 1);
  std::string y = Put(*be, "a/sub/y", 7ull << 20, 2);  // multipart-staged
  cr_assert(be->Rename("a", "b", false).has_value());
  auto m = ListAll(*be);
  for (const char* gone : {"a", "a/x", "a/sub", "a/sub/y", "a/empty"})
    cr_expect(m.count(gone) == 0, "%s still there", gone);
  for (const char* there : {"b", "b/x", "b/sub", "b/sub/y", "b/empty"})
    cr_expect(m.count(there) == 1, "%s missing", there);
  cr_expect_eq(m["b"].mode, 0750u);
  cr_expect_eq(m["b/empty"].mode, 0700u);
  ExpectContent(*be, "b/sub/y", y);
  ExpectContent(*be, "b/x", x);

  auto st = be->Rename("nope", "other", false);
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), ENOENT);

  std::string p = Put(*be, "p", 100, 5), q = Put(*be, "q", 200, 6);
  cr_assert(be->Rename("p", "q", true).has_value());
  ExpectContent(*be, "p", q);
  ExpectContent(*be, "q", p);
  cr_assert(be->Rename("b", "p", true).has_value());  // a directory with a file
  m = ListAll(*be);
  cr_expect(m["b"].type == Entry::Type::kFile);
  cr_expect(m["p"].type == Entry::Type::kDir);
  ExpectContent(*be, "p/sub/y", y);
  cr_expect_eq(StagedCount(), 0u);
}

// A staged object deleted behind the daemon's back: Publish answers ESTALE
// (backend.h), whichever copy it makes, so the drainer stages the bytes
// again instead of retrying a staged object that is gone for ever.
Test(s3_server, publish_of_vanished_staged_object_is_estale) {
  S3Config copy_object = Cfg(), part_copy = Cfg(), through_client = Cfg();
  part_copy.multipart_copy_threshold = 8ull << 20;  // UploadPartCopy (s3rver: 501, then CopyObject)
  through_client.multipart_copy_threshold = 8ull << 20;
  through_client.max_copy_object_size = 6ull << 20;  // GET + UploadPart
  for (const S3Config& c : {copy_object, part_copy, through_client}) {
    auto be = Open(c);
    cr_assert(be->Check().has_value());
    std::string bytes;
    int fd = SourceFile(12ull << 20, 21, &bytes);
    auto st = be->Stage(fd, bytes.size(), kNever);
    cr_assert(st.has_value(), "stage: %d", st.error());
    cr_assert_eq(StagedCount(), 1u);
    WipeStaging();
    auto pub = be->Publish(*st, "f", {0644, 0, 0, false, 1700000000, 0});
    cr_assert(!pub.has_value(), "published a staged object that is gone");
    cr_expect_eq(pub.error(), ESTALE, "publish of a vanished staged object: errno %d (%s), ESTALE expected",
                 pub.error(), strerror(pub.error()));
    cr_expect(ListAll(*be).empty());
    // What the drainer does then: abort it, stage again, publish.
    be->Abort(*st);
    st = be->Stage(fd, bytes.size(), kNever);
    close(fd);
    cr_assert(st.has_value(), "stage again: %d", st.error());
    cr_assert(be->Publish(*st, "f", {0644, 0, 0, false, 1700000000, 0}).has_value());
    ExpectContent(*be, "f", bytes);
    cr_assert(be->Remove("f").has_value());
    cr_expect_eq(StagedCount(), 0u);
  }
}

// An exchange is three moves through a temporary name (Rename in
// s3_backend.cc). A failure after the first (the fault
// s3.exchange.after_first_move) leaves it half done; the retry of the same
// entry, by this daemon or by the next one after its Check, finishes it:
// both sides swapped, nothing left in staging.
Test(s3_server, exchange_resumes_after_a_failure) {
  char flag[] = "/tmp/ckpt-s3fault-XXXXXX";
  int ffd = mkstemp(flag);
  cr_assert(ffd >= 0);
  close(ffd);
  setenv("CKPTFS_FAULT", (std::string("s3.exchange.after_first_move:") + flag).c_str(), 1);
  ckpt::InitFailpoints();
  S3Config c = Cfg();
  c.owner = "node-a";
  auto be = Open(c);
  cr_assert(be->Check().has_value());
  std::string p = Put(*be, "p", 1000, 31), q = Put(*be, "q", 2000, 32);
  auto st = be->Rename("p", "q", true);
  cr_assert(!st.has_value(), "the fault did not fire");
  cr_expect_eq(st.error(), EIO);
  cr_expect(be->Stat("p").error() == ENOENT, "p is not in the temporary name");
  st = be->Rename("p", "q", true);  // the store still fails: the retry stops at the same point
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), EIO, "retry of a half-done exchange: errno %d (%s), EIO expected", st.error(),
               strerror(st.error()));
  unlink(flag);
  st = be->Rename("p", "q", true);
  cr_assert(st.has_value(), "retry of a half-done exchange: errno %d (%s)", st.error(), strerror(st.error()));
  ExpectContent(*be, "p", q);
  ExpectContent(*be, "q", p);
  size_t staged = StagedCount();
  cr_expect_eq(staged, 0u, "the exchange left %zu objects in staging", staged);

  // A directory with a file; the daemon stops after the failure and the
  // next one's Check (an earlier daemon's staged objects go at once) keeps
  // the half-done exchange, which its retry finishes.
  std::string x = Put(*be, "d/x", 100, 33), y = Put(*be, "d/sub/y", 7ull << 20, 34);
  cr_assert(be->Mkdir("d/empty", {0700}).has_value());
  close(open(flag, O_CREAT | O_WRONLY, 0600));
  st = be->Rename("d", "p", true);
  cr_assert(!st.has_value(), "the fault did not fire");
  be.reset();
  unlink(flag);
  // And the journal's write after the first move was lost too: the retry
  // tells the first move done from its source gone.
  {
    auto staging = Open(Cfg("ck/run1/.ckptfs-tmp"));
    std::vector<std::string> journals;
    cr_assert(staging->List([&](const Entry& e) {
                        if (e.path.ends_with(".moves")) journals.push_back(e.path);
                      }).has_value());
    cr_assert_eq(journals.size(), 1u);
    cr_assert(staging->Remove(journals[0]).has_value());
  }
  auto be2 = Open(c);
  cr_assert(be2->Check().has_value());
  st = be2->Rename("d", "p", true);
  cr_assert(st.has_value(), "retry by the next daemon: errno %d (%s)", st.error(), strerror(st.error()));
  auto m = ListAll(*be2);
  cr_expect(m.count("d") && m["d"].type == Entry::Type::kFile);
  cr_expect(m.count("p") && m["p"].type == Entry::Type::kDir);
  cr_expect(m.count("p/empty") && m["p/empty"].mode == 0700u);
  cr_expect(m.count("d/x") == 0 && m.count("d/sub/y") == 0);
  ExpectContent(*be2, "d", q);  // p held q's bytes since the first exchange
  ExpectContent(*be2, "p/x", x);
  ExpectContent(*be2, "p/sub/y", y);
  staged = StagedCount();
  cr_expect_eq(staged, 0u, "the exchange left %zu objects in staging", staged);
}

Test(s3_server, rmdir_remove_symlink_link) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  cr_assert(be->Mkdir("d", {0755}).has_value());
  cr_assert(be->Mkdir("d", {0755}).has_value());  // idempotent
  Put(*be, "d/e/f", 10);
  std::string g = Put(*be, "g", 4096, 9);
  cr_assert(be->Symlink("d/link", "../g target", {}).has_value());
  cr_assert(be->Link("g", "d/hard").has_value());
  cr_assert(be->SetAttr("g", {0600, 0, 0, false, 1, 2}).has_value());
  auto m = ListAll(*be);
  cr_expect(m["d/link"].type == Entry::Type::kSymlink);
  cr_expect_eq(m["d/link"].target, std::string("../g target"));
  ExpectContent(*be, "d/hard", g);

  cr_assert(be->Rmdir("d").has_value());
  cr_assert(be->Rmdir("d").has_value());  // missing: fine
  cr_assert(be->Remove("g").has_value());
  cr_assert(be->Remove("g").has_value());
  cr_expect(ListAll(*be).empty());
  cr_expect_eq(be->Mkdir("../x", {0755}).error(), EINVAL);
  cr_expect_eq(be->Remove(".ckptfs-tmp/x").error(), EINVAL);
}

Test(s3_server, cancel_and_abort_leave_nothing) {
  auto be = Open(Cfg());
  cr_assert(be->Check().has_value());
  std::string bytes;
  int fd = SourceFile(30ull << 20, 4, &bytes);
  std::atomic<int> calls{0};  // polled by every part upload's thread
  auto st = be->Stage(fd, bytes.size(), [&] { return ++calls > 2; });
  cr_assert(!st.has_value());
  cr_expect_eq(st.error(), ECANCELED);
  auto big = be->Stage(fd, bytes.size(), kNever);
  cr_assert(big.has_value());
  be->Abort(*big);
  auto small = be->Stage(fd, 1000, kNever);
  cr_assert(small.has_value());
  be->Abort(*small);
  close(fd);
  cr_expect_eq(be->Publish(*small, "x", {0644, 0, 0, false, 0, 0}).error(), EINVAL);
  cr_expect_eq(StagedCount(), 0u);
  cr_expect(ListAll(*be).empty());
}

Test(s3_server, empty_prefix) {
  auto be = Open(Cfg(""));
  cr_assert(be->Check().has_value());
  std::string bytes = Put(*be, "top.bin", 5000);
  ExpectContent(*be, "top.bin", bytes);
  auto m = ListAll(*be);
  cr_expect_eq(m.size(), 1u);
  cr_expect_eq(StagedCount(""), 0u);
}

Test(s3_server, listing_pages_and_parents_first) {
  S3Config c = Cfg();
  // Continuation tokens (with '+', '/', '=') on every page. s3rver lists in
  // directory-walk order, not S3's byte order ("a/x" before "a-b"), and
  // resumes after the last key in byte order, so names like "a-b" next to a
  // directory "a" would be skipped by s3rver itself; they are avoided here.
  c.list_max_keys = 2;
  auto be = Open(c);
  cr_assert(be->Check().has_value());
  for (const char* p : {"z/1", "b-c", "a/b/c/d", "a/b/e", "m n/o+p", "a/x"}) Put(*be, p, 10);
  cr_assert(be->Mkdir("q/r", {0711}).has_value());
  std::vector<std::string> order;
  auto m = ListAll(*be, &order);
  for (const char* p :
       {"z", "z/1", "b-c", "a", "a/b", "a/b/c", "a/b/c/d", "a/b/e", "m n", "m n/o+p", "a/x", "q", "q/r"})
    cr_expect(m.count(p) == 1, "%s missing", p);
  cr_expect_eq(m.size(), 13u);
  cr_expect_eq(m["q/r"].mode, 0711u);
  // Parents before children.
  std::map<std::string, size_t> pos;
  for (size_t i = 0; i < order.size(); i++) pos[order[i]] = i;
  cr_expect_eq(pos.size(), order.size(), "an entry was reported twice");
  for (const auto& [path, i] : pos) {
    auto slash = path.rfind('/');
    if (slash != std::string::npos) cr_expect_lt(pos[path.substr(0, slash)], i, "%s before its parent", path.c_str());
  }
  cr_assert(be->Rmdir("a").has_value());  // several delete batches' worth of listing pages
  m = ListAll(*be);
  cr_expect(m.count("a/b/e") == 0);
  cr_expect(m.count("b-c") == 1);
}

// ---- Issue #11: Stat and ListDir (the shared namespace) ----

Test(s3_server, stat_and_listdir) {
  S3Config c = Cfg();
  c.list_max_keys = 2;  // several pages, common prefixes split across them
  auto be = Open(c);
  cr_assert(be->Check().has_value());
  const std::string odd = "sp ace+plus%25&amp?q#h\xc3\xa9=;'\"";  // URL, XML and shell specials
  std::string shard = Put(*be, "step/shard 0", 1000, 71);
  Put(*be, "step/" + odd, 10, 72);
  Put(*be, "step/a/deep/f", 5, 73);  // "step/a": a directory with no marker
  cr_assert(be->Mkdir("step/empty", {0750, 0, 0, false, 0, 0}).has_value());
  cr_assert(be->Symlink("step/link", "../elsewhere", {}).has_value());
  Put(*be, "top", 3, 74);
  // A sibling prefix that must not leak into ck/run1's listing.
  auto sibling = Open(Cfg("ck/run10"));
  Put(*sibling, "step/intruder", 4, 75);

  auto f = be->Stat("step/shard 0");
  cr_assert(f.has_value(), "stat: %d", f.error());
  cr_expect(f->type == Entry::Type::kFile);
  cr_expect_eq(f->size, 1000u);
  cr_expect_eq(f->mode, 0640u);
  cr_expect_eq(f->mtime_sec, 1700000000);
  cr_expect_eq(f->mtime_nsec, 123456789u);
  auto want = ckpt::backend::ContentChecksum(shard.data(), shard.size());
  cr_expect(f->has_checksum && f->checksum_hi == want.first && f->checksum_lo == want.second);
  auto o = be->Stat("step/" + odd);
  cr_assert(o.has_value(), "stat odd: %d", o.error());
  cr_expect_eq(o->size, 10u);
  auto l = be->Stat("step/link");
  cr_assert(l.has_value());
  cr_expect(l->type == Entry::Type::kSymlink);
  cr_expect_eq(l->target, std::string("../elsewhere"));
  for (const char* dir : {"step", "step/a", "step/a/deep", "step/empty"}) {
    auto d = be->Stat(dir);
    cr_assert(d.has_value(), "stat %s: %d", dir, d.error());
    cr_expect(d->type == Entry::Type::kDir, "%s", dir);
  }
  cr_expect_eq(be->Stat("step/missing").error(), ENOENT);
  cr_expect_eq(be->Stat("nodir/missing").error(), ENOENT);
  cr_expect_eq(be->Stat("ste").error(), ENOENT);  // a prefix of a name is not a name
  for (const char* bad : {"", "/abs", "a/../b", "..", "a//b", ".ckptfs-tmp", ".ckptfs-tmp/x"})
    cr_expect_eq(be->Stat(bad).error(), EINVAL, "%s", bad);

  auto ls = be->ListDir("step");
  cr_assert(ls.has_value(), "listdir: %d", ls.error());
  std::vector<std::string> names;
  for (auto& e : *ls) names.push_back(e.path);
  std::vector<std::string> expect = {"step/" + odd, "step/a", "step/empty", "step/link", "step/shard 0"};
  std::sort(expect.begin(), expect.end());
  cr_assert(names == expect, "got %zu entries", names.size());
  for (auto& e : *ls) {
    if (e.path == "step/shard 0") cr_expect(e.type == Entry::Type::kFile && e.size == 1000 && e.has_checksum);
    if (e.path == "step/link") cr_expect(e.type == Entry::Type::kSymlink && e.target == "../elsewhere");
    if (e.path == "step/a" || e.path == "step/empty") cr_expect(e.type == Entry::Type::kDir);
  }
  auto top = be->ListDir("");  // the staging area is never listed
  cr_assert(top.has_value());
  cr_assert_eq(top->size(), 2u);
  cr_expect_eq((*top)[0].path, std::string("step"));
  cr_expect_eq((*top)[1].path, std::string("top"));
  auto empty = be->ListDir("step/empty");
  cr_assert(empty.has_value());
  cr_expect(empty->empty());
  cr_expect_eq(be->ListDir("nope").error(), ENOENT);
  cr_expect_eq(be->ListDir("a/../step").error(), EINVAL);
  cr_expect_eq(be->ListDir(".ckptfs-tmp").error(), EINVAL);
}

// Names a listing cannot show as they are. A key and keys under it as a
// prefix (made by another tool, or a store that kept a file and a
// directory of one name): one entry, the object, as Stat says. An object
// these credentials may list but not read (a bucket policy on that key;
// the test server refuses HEAD and GET of forbidden-*): skipped with a
// warning, where it failed the whole listing, and so the mount.
Test(s3_server, listdir_shows_one_entry_a_name_and_skips_what_it_cannot_read) {
  auto be = Open(Cfg("ck/clash"));
  cr_assert(be->Check().has_value());
  Put(*be, "step/ckpt", 7, 81);
  Put(*be, "step/ckpt/x", 5, 82);
  Put(*be, "step/forbidden-shard", 5, 84);
  auto ls = be->ListDir("step");
  cr_assert(ls.has_value(), "listdir: %d", ls.error());
  cr_assert_eq(ls->size(), 1u, "got %zu entries", ls->size());
  cr_expect_eq((*ls)[0].path, std::string("step/ckpt"));
  cr_expect((*ls)[0].type == Entry::Type::kFile);
  auto st = be->Stat("step/ckpt");
  cr_assert(st.has_value());
  cr_expect(st->type == Entry::Type::kFile);
  auto all = ListAll(*be);
  cr_expect(all.count("step/ckpt/x") && !all.count("step/forbidden-shard"), "got %zu entries", all.size());
}

Test(s3_server, stat_and_listdir_missing_bucket_is_eio) {
  S3Config c = Cfg();
  c.bucket = "no-such-bucket";
  auto be = Open(c);
  // ENOENT would read as "nothing there": the store is unreachable instead.
  cr_expect_eq(be->Stat("x").error(), EIO);
  cr_expect_eq(be->Stat("d/x").error(), EIO);
  cr_expect_eq(be->ListDir("").error(), EIO);
  cr_expect_eq(be->ListDir("d").error(), EIO);
}

// Cluster records: one PUT each under <prefix>/.ckptfs-cluster/DIR/, listed
// with their bytes, hidden from List/ListDir/Stat and unreachable by them.
Test(s3_server, cluster_records) {
  auto be = Open(Cfg("ck/records"));
  cr_assert(be->Check().has_value());
  cr_expect(be->ListRecords("job").value().empty());
  cr_assert(be->PutRecord("job", "nodeB", "{\"b\":1}").has_value());
  cr_assert(be->PutRecord("job", "nodeA", "{\"a\":1}").has_value());
  cr_assert(be->PutRecord("job", "nodeA", "{\"a\":2}").has_value());
  cr_assert(be->PutRecord("job2", "nodeC", "c").has_value());
  auto l = be->ListRecords("job");
  cr_assert(l.has_value(), "list records: %d", l.error());
  cr_assert_eq(l->size(), 2u);
  cr_expect_eq((*l)[0].first, std::string("nodeA"));
  cr_expect_eq((*l)[0].second, std::string("{\"a\":2}"));
  cr_expect_eq((*l)[1].second, std::string("{\"b\":1}"));
  Put(*be, "step/shard", 10);
  auto all = ListAll(*be);
  cr_expect_eq(all.size(), 2u);  // step and step/shard only
  for (auto& [p, en] : all) cr_expect(p.find(".ckptfs-cluster") == std::string::npos, "%s", p.c_str());
  auto top = be->ListDir("");
  cr_assert(top.has_value());
  cr_assert_eq(top->size(), 1u);
  cr_expect_eq((*top)[0].path, std::string("step"));
  for (const char* bad : {".ckptfs-cluster", ".ckptfs-cluster/job/nodeA"}) {
    cr_expect_eq(be->Stat(bad).error(), EINVAL, "%s", bad);
    cr_expect_eq(be->ListDir(bad).error(), EINVAL, "%s", bad);
    cr_expect_eq(be->Remove(bad).error(), EINVAL, "%s", bad);
  }
  std::string bytes;
  int fd = SourceFile(10, 5, &bytes);
  auto st = be->Stage(fd, 10, kNever);
  close(fd);
  cr_assert(st.has_value());
  cr_expect_eq(be->Publish(*st, ".ckptfs-cluster/job/nodeA", {0644, 0, 0, false, 0, 0}).error(), EINVAL);
  be->Abort(*st);
  cr_expect_eq(be->ListRecords("job").value()[0].second, std::string("{\"a\":2}"));
  cr_expect_eq(be->PutRecord("job", ".x", "x").error(), EINVAL);
  cr_expect_eq(be->PutRecord("a/b", "x", "x").error(), EINVAL);
  cr_expect_eq(be->PutRecord("job", "big", std::string(ckpt::backend::kMaxRecordBytes + 1, 'x')).error(), EFBIG);
}
