// s3_backend.cc — the S3 Backend: keys, staging, copies, listing, over
// s3::Client. See s3_backend.h for the layout and the staging design.
//
// Requests: s3::Client (backend/s3_client.h) signs, sends, retries and
// classifies each one.
//
// Parallelism: Stage reads parts in order on the caller's thread (so the
// checksum of backend/checksum.h is computed in order; holes of the source
// are read and sent as zeros) and hands them to `parallel` uploader
// threads; Fetch, copies and listing HEADs run on `parallel` short-lived
// threads each. Memory: (parallel + 1) × part_size per large Stage, plus
// the in-memory staged small files until they are published or aborted.
//
// What it gives up: directory renames and exchanges are copies of every
// object under the directory (server-side, but O(bytes)) followed by
// deletes, and are not atomic: a crash in between leaves both names, and
// the drainer's retry of the entry finishes the job (copies are
// idempotent; an exchange keeps a journal for it: Rename). Owners
// (Attrs::uid/gid) are not kept. SetAttr is a no-op:
// mode and mtime are written at Publish and Mkdir only (a chmod after a file was persisted survives only in the
// mount's own metadata). List HEADs every object to learn its type, mode,
// mtime and checksum: one request per object at mount time, `parallel`×4
// in flight.
//
// Leftovers. Several daemons may stage under one prefix (a --cluster job,
// mounts sharing a namespace), so Check (at mount, and when the drain
// probes a failed store) removes only what no live daemon can be using:
// staged keys are <prefix>/.ckptfs-tmp/OWNER/NAME-PID-NONCE-N (OWNER: one
// per state dir, S3Config::owner; NONCE: this backend object's), and a
// staged object or multipart upload is a leftover when its OWNER is ours
// and its NONCE is not (an earlier daemon of this state dir: at most one
// runs), or, whoever staged it, once it is kStaleStagedSec (an hour) old
// by LastModified / Initiated (a store that gives neither time keeps
// other owners' leftovers: a lifecycle rule on .ckptfs-tmp/ is the
// remedy). Removing every one, as before, let a restarting node abort the
// upload another node was in the middle of. A half-done exchange's objects
// (xchg-*, Rename) are never removed: one may hold the only copy of a
// file. An upload whose abort fails (the store
// is down) is remembered and aborted again around the next multipart
// upload (before it starts and once it completes), so a store that comes
// back is left clean without a remount.
#include "backend/s3_backend.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/checksum.h"
#include "backend/s3_xml.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/text.h"

namespace ckpt::backend {

namespace s3 {

namespace {
// Whether every '/'-separated component of `p` is non-empty and not "." or "..".
bool CleanComponents(std::string_view p) {
  if (p.empty()) return false;
  size_t pos = 0;
  for (;;) {
    size_t slash = p.find('/', pos);
    std::string_view comp = p.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    if (comp.empty() || comp == "." || comp == "..") return false;
    if (slash == std::string_view::npos) return true;
    pos = slash + 1;
  }
}
}  // namespace

bool ValidPath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string_view::npos) return false;
  if (!CleanComponents(path)) return false;
  std::string_view first = path.substr(0, path.find('/'));
  return first != kTmpDir && first != kClusterDir;
}

Result<std::string> JoinKey(std::string_view prefix, std::string_view path) {
  if (!ValidPath(path)) return Err(EINVAL);
  if (prefix.empty()) return std::string(path);
  std::string k;
  k.reserve(prefix.size() + 1 + path.size());
  k.append(prefix).push_back('/');
  k.append(path);
  return k;
}

std::optional<std::string> RelPath(std::string_view prefix, std::string_view key) {
  std::string_view rel = key;
  if (!prefix.empty()) {
    if (key.size() <= prefix.size() + 1 || !key.starts_with(prefix) || key[prefix.size()] != '/') return std::nullopt;
    rel = key.substr(prefix.size() + 1);
  }
  std::string_view body = rel;
  if (body.ends_with('/')) body.remove_suffix(1);
  if (body.empty() || body.front() == '/' || body.find('\0') != std::string_view::npos || !CleanComponents(body))
    return std::nullopt;
  return std::string(rel);
}

}  // namespace s3

namespace {

using s3::Request;
using s3::Response;
using s3::RunParallel;
using s3::Query;
using s3::Md5Base64;

constexpr uint64_t kMinPartSize = 5ull << 20;  // S3's smallest part (but the last)
constexpr uint64_t kMaxParts = 10000;
constexpr uint64_t kFetchRange = 8ull << 20;
constexpr uint64_t kReadChunk = 4ull << 20;
constexpr size_t kDeleteBatch = 1000;
// The checksum of backend/checksum.h ("xxh128s"); objects of older daemons
// carry x-amz-meta-ckptfs-xxh128 (dense XXH3-128), which is never compared.
constexpr char kMetaChecksum[] = "x-amz-meta-ckptfs-xxh128s";
constexpr char kMetaMode[] = "x-amz-meta-ckptfs-mode";
constexpr char kMetaMtime[] = "x-amz-meta-ckptfs-mtime";
constexpr char kMetaSymlink[] = "x-amz-meta-ckptfs-symlink";
// An exchange's temporary name and its journal (Rename): "xchg-" and a
// hash of the two keys, in the staging area.
constexpr char kExchangePrefix[] = "xchg-";

// What a HEAD says about an object.
struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;
  bool has_checksum = false;
  uint64_t hi = 0, lo = 0;
  uint32_t mode = 0;
  bool has_mtime = false;
  int64_t last_modified = 0;  // the Last-Modified header (0: none)
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
  bool symlink = false;
  std::string target;
  std::vector<std::string> meta;  // "x-amz-meta-...: value" lines, to copy them
};

class S3Backend final : public Backend {
 public:
  explicit S3Backend(const S3Config& cfg)
      : cfg_(cfg),
        root_(cfg.prefix.empty() ? std::string() : cfg.prefix + "/"),
        tmp_root_(root_ + kTmpDir + "/"),
        stage_root_(tmp_root_ + (cfg.owner.empty() ? std::string() : cfg.owner + "/")),
        nonce_(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32)),
        http_(cfg_) {
    cfg_.parallel = std::max(1, cfg_.parallel);
    cfg_.max_attempts = std::max(1, cfg_.max_attempts);
    cfg_.list_max_keys = std::clamp(cfg_.list_max_keys, 1, 1000);
    cfg_.part_size = std::max(cfg_.part_size, kMinPartSize);
  }

  // A listing costs a HEAD per object (for the checksum): worth it only
  // for the few files a checkpoint directory has while it is written.
  size_t ListCheaperUpTo() const override { return 32; }
  std::string Describe() const override {
    return "s3://" + cfg_.bucket + (cfg_.prefix.empty() ? "" : "/" + cfg_.prefix) + " (" + cfg_.endpoint + ")";
  }

  Status Check() override {
    Response r;
    Request list;
    list.query = Query({{"list-type", "2"}, {"max-keys", "1"}, {"prefix", root_}});
    list.quiet = {403, 404};
    if (auto st = http_.Perform(list, "check: list", &r); !st) {
      if (st.error() == EACCES)
        LOG_ERROR(
            "s3 backend: s3://{}: access denied (HTTP {} {}): check the credentials (AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and the bucket policy",
            cfg_.bucket, r.status, r.error_code);
      else if (st.error() == ENOENT)
        LOG_ERROR("s3 backend: s3://{}: no such bucket at {} (HTTP {} {})", cfg_.bucket, cfg_.endpoint, r.status,
                  r.error_code);
      return st;
    }
    if (auto p = s3::ParseListObjectsV2(r.body); !p) return BadReply("check: list", root_, r);

    // Writable: a probe object in the staging area.
    std::string probe = stage_root_ + UniqueName("probe-");
    Request put;
    put.method = "PUT";
    put.key = probe;
    if (auto st = http_.Perform(put, "check: write probe", &r); !st) return st;
    if (auto st = Delete(probe); !st) return st;

    // Leftovers of daemons that are gone (the file comment says how they
    // are told): uploads never completed or aborted, and staged objects
    // never published.
    const int64_t now = static_cast<int64_t>(time(nullptr));
    if (auto st = AbortLeftoverUploads(now); !st) return st;
    std::vector<std::string> stale;
    size_t kept = 0;
    auto st = ListKeys(tmp_root_, [&](const s3::ListedObject& o) {
      // A half-done exchange may hold the only copy of a file, however old
      // it is: the retry of its entry finishes it (Rename).
      if (Exchanging(o.key)) return;
      if (Leftover(o.key, o.mtime_sec, now)) {
        stale.push_back(o.key);
      } else {
        kept++;
      }
    });
    if (!st) return st;
    if (!stale.empty()) {
      if (auto d = DeleteKeys(stale); !d) return d;
      LOG_INFO("s3 backend: removed {} leftover staged objects under s3://{}/{}{}", stale.size(), cfg_.bucket,
               tmp_root_, kept ? fmt::format(" ({} of live daemons kept)", kept) : "");
    }
    return {};
  }

  // Whether the staged object (or upload) `key`, made at `made_sec` (0:
  // unknown), is a leftover: see the file comment.
  bool Leftover(const std::string& key, int64_t made_sec, int64_t now) const {
    if (key.starts_with(tmp_root_)) {
      std::string_view rel = std::string_view(key).substr(tmp_root_.size());
      size_t slash = rel.rfind('/');
      std::string_view owner = slash == rel.npos ? std::string_view() : rel.substr(0, slash);
      if (auto n = StagedNonce(slash == rel.npos ? rel : rel.substr(slash + 1))) {
        if (*n == nonce_) return false;
        if (!cfg_.owner.empty() && owner == cfg_.owner) return true;
      }
    }
    return made_sec > 0 && made_sec < now - kStaleStagedSec;
  }

  Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) override {
    try {
      if (size <= cfg_.part_size) return StageSmall(src_fd, size, cancelled);
      return StageMultipart(src_fd, size, cancelled);
    } catch (const std::bad_alloc&) {
      LOG_ERROR("s3 backend: stage of {} bytes: out of memory", size);
      return Err(ENOMEM);
    }
  }

  Status Publish(const Staged& s, const std::string& path, const Attrs& a) override {
    auto key = KeyOf(path, "publish");
    if (!key) return Err(key.error());
    if (a.mtime_nsec >= 1000000000u) return Fail(EINVAL, "publish: invalid mtime nsec for", *key);
    std::vector<std::string> meta = {
        std::string(kMetaChecksum) + ": " + ChecksumHex(s.checksum_hi, s.checksum_lo),
        std::string(kMetaMode) + ": " + ModeStr(a.mode),
        std::string(kMetaMtime) + ": " + MtimeStr(a.mtime_sec, a.mtime_nsec),
    };
    if (s.token.starts_with("mem:")) {
      std::shared_ptr<std::string> buf;
      {
        MutexLock lock(&mu_);
        auto it = small_.find(s.token);
        if (it != small_.end()) buf = it->second;
      }
      if (!buf) return Fail(EINVAL, "publish: unknown staged token for", *key);
      Request put;
      put.method = "PUT";
      put.key = *key;
      put.headers = meta;
      put.body = *buf;
      put.headers.push_back("Content-Type: application/octet-stream");
      Response r;
      if (auto st = http_.Perform(put, "publish: put", &r); !st) return st;
      MutexLock lock(&mu_);
      small_.erase(s.token);
      return {};
    }
    if (!s.token.starts_with("tmp:") || !ValidToken(s.token.substr(4)))
      return Fail(EINVAL, "publish: invalid staged token for", *key);
    std::string tmp = stage_root_ + s.token.substr(4);
    if (auto st = Copy(tmp, *key, s.size, &meta); !st) {
      // ENOENT: the staged object is gone (deleted behind our back), or
      // the bucket is. Only the first is ESTALE (backend.h): the drainer
      // stages again, where ENOENT would have it retry this copy for ever.
      if (st.error() != ENOENT) return st;
      auto there = ObjectExists(tmp);
      if (!there) return Err(there.error());
      if (!*there) return Fail(ESTALE, "publish: staged object gone, stage again:", tmp);
      return st;
    }
    if (auto st = Delete(tmp); !st)
      LOG_WARN("s3 backend: publish: staged object s3://{}/{} left behind (removed at next mount)", cfg_.bucket, tmp);
    return {};
  }

  void Abort(const Staged& s) override {
    if (s.token.starts_with("mem:")) {
      MutexLock lock(&mu_);
      small_.erase(s.token);
    } else if (s.token.starts_with("tmp:") && ValidToken(s.token.substr(4))) {
      if (auto st = Delete(stage_root_ + s.token.substr(4)); !st)
        LOG_WARN("s3 backend: abort: staged object s3://{}/{}{} left behind (removed at next mount)", cfg_.bucket,
                 stage_root_, s.token.substr(4));
    }
  }

  Status Mkdir(const std::string& path, const Attrs& a) override {
    const uint32_t mode = a.mode;
    auto key = KeyOf(path, "mkdir");
    if (!key) return Err(key.error());
    auto now = std::chrono::system_clock::now().time_since_epoch();
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
    Request put;
    put.method = "PUT";
    put.key = *key + "/";
    put.headers = {std::string(kMetaMode) + ": " + ModeStr(mode ? mode : 0755),
                   std::string(kMetaMtime) + ": " + MtimeStr(ns / 1000000000, static_cast<uint32_t>(ns % 1000000000))};
    Response r;
    return http_.Perform(put, "mkdir: put marker", &r);
  }

  Status Rmdir(const std::string& path) override {
    auto key = KeyOf(path, "rmdir");
    if (!key) return Err(key.error());
    std::vector<std::string> keys;
    if (auto st = ListKeys(*key + "/", [&](const s3::ListedObject& o) { keys.push_back(o.key); }); !st) return st;
    return DeleteKeys(keys);
  }

  Status Remove(const std::string& path) override {
    auto key = KeyOf(path, "remove");
    if (!key) return Err(key.error());
    return Delete(*key);
  }

  // Cost: a file is one server-side copy and a delete; a directory is a
  // LIST plus one copy per object under it (O(bytes) on the store, never
  // through this host unless the store lacks UploadPartCopy for objects
  // over 5 GiB) plus batched deletes. None of it is atomic; see the file
  // comment.
  //
  // An exchange is three moves through a temporary name X in this owner's
  // staging area, (1) f → X, (2) t → f, (3) X → t, each a Move (copies,
  // then deletes). A failure between them must not lose a side: the
  // drainer retries the same entry (this daemon, or the next one after a
  // crash), which must finish the exchange, not see a missing side and
  // answer ENOENT ("nothing to do"). So X is named after the two keys, and
  // a journal J next to it records how many moves are done ("1" after the
  // first, "2" after the second; written once a move has deleted its
  // source, deleted after the third): which names exist cannot tell, as
  // f, t and X all exist between a copy and its delete in every move. A
  // retry reads J:
  //   no J, no X   not started: f and t must both exist (ENOENT if not);
  //   no J, X      move 1 was under way: redone (f partly deleted or gone
  //                is fine: X holds all of f once f's deletion begins);
  //   J = 1        move 1 done, move 2 redone;
  //   J = 2        moves 1 and 2 done, move 3 redone, then J deleted.
  // A move redone (MoveOnce) copies what is left of its source again (the
  // copies are of the same bytes) and deletes it; a source gone with its
  // destination there is a move that finished. J = 2 with X gone is move 3
  // finished, J not yet deleted. Check never removes X or J (Exchanging):
  // X may hold the only copy of f. A whole exchange that finished but was
  // not recorded by the drainer (a crash in between) is swapped again by
  // its replay, as a POSIX replay of renameat2 would.
  Status Rename(const std::string& from, const std::string& to, bool exchange) override {
    auto f = KeyOf(from, "rename");
    if (!f) return Err(f.error());
    auto t = KeyOf(to, "rename");
    if (!t) return Err(t.error());
    if (*f == *t) return {};
    if (!exchange) return Move(*f, *t);
    const std::string x = stage_root_ + kExchangePrefix + HexHash(*f + '\0' + *t), j = x + ".moves";
    auto done = ExchangeMoves(j);
    if (!done) return Err(done.error());
    if (*done == 0) {
      auto xe = Exists(x);
      if (!xe) return Err(xe.error());
      if (!*xe) {
        auto fe = Exists(*f);
        if (!fe) return Err(fe.error());
        auto te = Exists(*t);
        if (!te) return Err(te.error());
        if (!*fe || !*te) return Fail(ENOENT, "rename: exchange: missing side of", *f + "' <-> '" + *t);
      }
      if (auto st = MoveOnce(*f, x); !st) return st;
      if (auto st = SetExchangeMoves(j, 1); !st) return st;
    }
    if (FAULT("s3.exchange.after_first_move")) return Fail(EIO, "rename: exchange: fault after the first move of", *f);
    if (*done <= 1) {
      if (auto st = MoveOnce(*t, *f); !st) return st;
      if (auto st = SetExchangeMoves(j, 2); !st) return st;
    }
    if (auto st = MoveOnce(x, *t); !st) return st;
    return Delete(j);
  }

  Status Symlink(const std::string& path, const std::string& target, const Attrs&) override {
    auto key = KeyOf(path, "symlink");
    if (!key) return Err(key.error());
    if (target.empty() || target.find('\0') != std::string::npos)
      return Fail(EINVAL, "symlink: invalid target for", *key);
    Request put;
    put.method = "PUT";
    put.key = *key;
    put.headers = {std::string(kMetaSymlink) + ": " + s3::UriEncode(target, true), std::string(kMetaMode) + ": 777"};
    Response r;
    return http_.Perform(put, "symlink: put", &r);
  }

  Status Link(const std::string& from, const std::string& to) override {
    auto f = KeyOf(from, "link");
    if (!f) return Err(f.error());
    auto t = KeyOf(to, "link");
    if (!t) return Err(t.error());
    auto info = Head(*f, "link: head source");
    if (!info) return Err(info.error());
    return Copy(*f, *t, info->size, nullptr);
  }

  Status SetAttr(const std::string& path, const Attrs&) override {
    if (!s3::ValidPath(path)) return Fail(EINVAL, "setattr: invalid path", path);
    LOG_DEBUG("s3 backend: setattr '{}': not kept by this store (mode and mtime are set at publish)", path);
    return {};
  }

  Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd, uint64_t size) override {
    auto key = KeyOf(path, "fetch");
    if (!key) return Err(key.error());
    auto info = Head(*key, "fetch: head");
    if (!info) return Err(info.error());
    if (info->size != size) {
      LOG_ERROR("s3 backend: fetch s3://{}/{}: holds {} bytes, {} expected", cfg_.bucket, *key, info->size, size);
      return Err(EIO);
    }
    const uint64_t nranges = (size + kFetchRange - 1) / kFetchRange;
    int err = RunParallel(nranges, cfg_.parallel, [&](size_t i) -> int {
      const uint64_t off = i * kFetchRange, len = std::min(kFetchRange, size - off);
      uint64_t done = 0;
      Request get;
      get.key = *key;
      get.headers = {"Range: bytes=" + std::to_string(off) + "-" + std::to_string(off + len - 1)};
      if (!info->etag.empty()) get.headers.push_back("If-Match: " + info->etag);
      // Zeros are not written: dst_fd is a fresh file of `size` bytes, so
      // they stay holes (and a sparse file larger than the tier's budget
      // can be read back); the checksum counts them all the same. A retry
      // rewrites the same bytes.
      get.sink = [&](const char* data, size_t n) -> int {
        if (done + n > len) return EIO;
        if (int e = WriteNonZero(dst_fd, data, n, off + done, kChecksumBlock)) return e;
        done += n;
        return 0;
      };
      get.on_retry = [&] { done = 0; };
      Response r;
      if (auto st = http_.Perform(get, "fetch: get range", &r); !st) return st.error();
      if (done != len) {
        LOG_ERROR("s3 backend: fetch s3://{}/{}: range at {} returned {} bytes, {} expected (HTTP {})", cfg_.bucket,
                  *key, off, done, len, r.status);
        return EIO;
      }
      return 0;
    });
    if (err) return Err(err);

    // The checksum (backend/checksum.h) of what landed in dst_fd, read back in order.
    ContentHash hash;
    if (!hash.ok()) return Fail(ENOMEM, "fetch: hash state for", *key);
    std::unique_ptr<char[]> buf(new (std::nothrow) char[kReadChunk]);
    if (!buf) return Fail(ENOMEM, "fetch: buffer for", *key);
    for (uint64_t off = 0; off < size; off += kReadChunk) {
      uint64_t len = std::min(kReadChunk, size - off);
      if (int e = PreadFull(dst_fd, buf.get(), len, off)) return Fail(e, "fetch: read back destination for", *key);
      hash.Update(off, buf.get(), len);
    }
    auto [hi, lo] = hash.Finish(size);
    if (info->has_checksum && (info->hi != hi || info->lo != lo)) {
      LOG_ERROR("s3 backend: fetch s3://{}/{}: checksum {} does not match the stored {}", cfg_.bucket, *key,
                ChecksumHex(hi, lo), ChecksumHex(info->hi, info->lo));
      return Err(EIO);
    }
    return std::pair<uint64_t, uint64_t>{hi, lo};
  }

  Status List(const std::function<void(const Entry&)>& fn) override {
    std::unordered_set<std::string> dirs;  // emitted already
    auto emit_dirs = [&](std::string_view dir) {
      // Every ancestor of `dir` and `dir` itself, outermost first.
      for (size_t pos = 0; pos <= dir.size();) {
        size_t slash = dir.find('/', pos);
        size_t end = slash == std::string_view::npos ? dir.size() : slash;
        std::string d(dir.substr(0, end));
        if (!d.empty() && dirs.insert(d).second) {
          Entry e{};
          e.type = Entry::Type::kDir;
          e.path = d;
          fn(e);
        }
        pos = end + 1;
      }
    };
    // Each page's objects are HEADed in parallel, then emitted in key order.
    return ListPages(root_, [&](const s3::ListPage& page) -> Status {
      struct Item {
        std::string key, rel;
        uint64_t size;
        int64_t mtime;
        ObjectInfo info;
        bool gone = false;
      };
      std::vector<Item> items;
      for (auto& o : page.objects) {
        if (o.key == root_) continue;  // the prefix's own marker
        auto rel = s3::RelPath(cfg_.prefix, o.key);
        if (!rel) {
          LOG_ERROR("s3 backend: list: skipping s3://{}/{}: not a valid path (empty, '.' or '..' component)",
                    cfg_.bucket, o.key);
          continue;
        }
        if (rel->starts_with(std::string(kTmpDir) + "/") || *rel == kTmpDir) continue;
        if (rel->starts_with(std::string(kClusterDir) + "/") || *rel == kClusterDir) continue;
        items.push_back({o.key, std::move(*rel), o.size, o.mtime_sec, {}, false});
      }
      if (int err = HeadEach(items, "list: head", /*quiet_all=*/false)) return Err(err);
      for (auto& it : items) {
        if (it.gone) continue;
        Entry e{};
        e.mode = it.info.mode;
        e.mtime_sec = it.info.has_mtime ? it.info.mtime_sec : it.mtime;
        e.mtime_nsec = it.info.has_mtime ? it.info.mtime_nsec : 0;
        if (it.rel.ends_with('/')) {
          std::string d = it.rel.substr(0, it.rel.size() - 1);
          auto slash = d.rfind('/');
          if (slash != std::string::npos) emit_dirs(std::string_view(d).substr(0, slash));
          if (!dirs.insert(d).second) continue;
          e.type = Entry::Type::kDir;
          e.path = std::move(d);
          fn(e);
          continue;
        }
        auto slash = it.rel.rfind('/');
        if (slash != std::string::npos) emit_dirs(std::string_view(it.rel).substr(0, slash));
        e.path = it.rel;
        if (it.info.symlink) {
          e.type = Entry::Type::kSymlink;
          e.target = it.info.target;
        } else {
          e.type = Entry::Type::kFile;
          e.size = it.size;
          e.has_checksum = it.info.has_checksum;
          e.checksum_hi = it.info.hi;
          e.checksum_lo = it.info.lo;
        }
        fn(e);
      }
      return {};
    });
  }

  Result<Entry> Stat(const std::string& path) override {
    auto key = s3::JoinKey(cfg_.prefix, path);
    if (!key) return Err(EINVAL);  // a name the store cannot hold: nothing there
    auto info = Head(*key, "stat: head", /*quiet_404=*/true, /*quiet_all=*/true);
    if (info) return EntryOf(path, *info, 0);
    if (info.error() != ENOENT) return Err(info.error());
    // Not an object: a directory if a valid key lies under "<key>/" (its
    // marker included). The listing also tells a missing bucket (EIO: the
    // store is unreachable as a whole) from a missing key, which HEAD's
    // empty 404 cannot.
    auto valid = HasValidKey(*key + "/");
    if (!valid) return Err(valid.error());
    if (!*valid) return Err(ENOENT);
    Entry e{};
    e.type = Entry::Type::kDir;
    e.path = path;
    return e;
  }

  // One ListObjectsV2 walk with delimiter '/' (CommonPrefixes are the
  // subdirectories), then a HEAD of each object, `parallel`×4 in flight,
  // for its type, mode, mtime and checksum.
  Result<std::vector<Entry>> ListDir(const std::string& dir) override {
    std::string prefix = root_;
    if (!dir.empty()) {
      auto key = s3::JoinKey(cfg_.prefix, dir);
      if (!key) return Err(EINVAL);
      prefix = *key + "/";
    }
    struct Item {
      std::string key, rel;
      int64_t mtime;
      ObjectInfo info;
      bool gone = false;
    };
    std::vector<Item> items, dirs;  // dirs: a common prefix, key with its '/'
    std::vector<Entry> out;
    bool any = false;  // anything under the prefix, its marker included
    auto st = ListPages(
        prefix,
        [&](const s3::ListPage& page) -> Status {
          for (const auto& cp : page.common_prefixes) {
            any = true;
            auto rel = s3::RelPath(cfg_.prefix, cp);
            if (!rel || !rel->ends_with('/')) continue;
            rel->pop_back();
            if (*rel == kTmpDir || *rel == kClusterDir) continue;
            dirs.push_back({cp, std::move(*rel), 0, {}, false});
          }
          for (const auto& o : page.objects) {
            any = true;
            if (o.key == prefix) continue;  // the directory's own marker
            auto rel = s3::RelPath(cfg_.prefix, o.key);
            if (!rel || rel->ends_with('/')) continue;
            items.push_back({o.key, std::move(*rel), o.mtime_sec, {}, false});
          }
          return {};
        },
        "/", /*quiet_all=*/true);
    if (!st) return Err(st.error());
    if (!any && !dir.empty()) return Err(ENOENT);
    // A common prefix is a directory only if a valid key lies under it (as
    // List decides): "a/../x" alone must not make "a" appear. Usually the
    // first key of one short listing settles it.
    int err = RunParallel(dirs.size(), cfg_.parallel * 4, [&](size_t i) -> int {
      auto valid = HasValidKey(dirs[i].key);
      if (!valid) return valid.error();
      dirs[i].gone = !*valid;
      return 0;
    });
    if (err) return Err(err);
    for (auto& d : dirs) {
      if (d.gone) continue;
      Entry e{};
      e.type = Entry::Type::kDir;
      e.path = std::move(d.rel);
      out.push_back(std::move(e));
    }
    if (int e = HeadEach(items, "listdir: head", /*quiet_all=*/true)) return Err(e);
    for (auto& it : items)
      if (!it.gone) out.push_back(EntryOf(it.rel, it.info, it.mtime));
    std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.path < b.path; });
    return out;
  }

  Status PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) override {
    if (!ValidRecordName(dir) || !ValidRecordName(name)) return Fail(EINVAL, "put record: invalid name", dir + "/" + name);
    if (bytes.size() > kMaxRecordBytes) return Fail(EFBIG, "put record: too large", dir + "/" + name);
    Request put;
    put.method = "PUT";
    put.key = root_ + kClusterDir + "/" + dir + "/" + name;
    put.body = bytes;
    put.headers.push_back("Content-Type: application/json");
    Response r;
    return http_.Perform(put, "put record", &r);
  }

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& dir) override {
    if (!ValidRecordName(dir)) return Fail(EINVAL, "list records: invalid name", dir);
    const std::string prefix = root_ + kClusterDir + "/" + dir + "/";
    std::vector<s3::ListedObject> objs;
    if (auto st = ListKeys(prefix, [&](const s3::ListedObject& o) { objs.push_back(o); }); !st) return Err(st.error());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& o : objs) {
      std::string name = o.key.substr(prefix.size());
      if (!ValidRecordName(name)) continue;
      if (o.size > kMaxRecordBytes) {
        LOG_DEBUG("s3 backend: list records: s3://{}/{} holds {} bytes; skipped", cfg_.bucket, o.key, o.size);
        continue;
      }
      std::string body;
      Request get;
      get.key = o.key;
      get.quiet = {404};
      get.sink = [&](const char* data, size_t n) -> int {
        if (body.size() + n > kMaxRecordBytes) return EFBIG;
        body.append(data, n);
        return 0;
      };
      get.on_retry = [&] { body.clear(); };
      Response r;
      if (auto st = http_.Perform(get, "get record", &r); !st) {
        if (st.error() == ENOENT || st.error() == EFBIG) continue;  // deleted meanwhile, or grew past the cap
        return Err(st.error());
      }
      out.emplace_back(std::move(name), std::move(body));
    }
    return out;
  }

 private:
  std::unexpected<int> Fail(int e, std::string_view what, std::string_view key) const {
    LOG_ERROR("s3 backend: {} s3://{}/{}: {}", what, cfg_.bucket, key, ErrStr(e));
    return Err(e);
  }

  std::unexpected<int> BadReply(std::string_view what, std::string_view key, const Response& r) const {
    LOG_ERROR("s3 backend: {} s3://{}/{}: HTTP {}: unexpected reply ({} bytes)", what, cfg_.bucket, key, r.status,
              r.body.size());
    return Err(EIO);
  }

  Result<std::string> KeyOf(const std::string& path, std::string_view op) const {
    auto k = s3::JoinKey(cfg_.prefix, path);
    if (!k) {
      LOG_ERROR("s3 backend: {}: invalid path '{}'", op, path);
      return Err(EINVAL);
    }
    return k;
  }

  static bool ValidToken(std::string_view t) {
    return !t.empty() && t.find('/') == std::string_view::npos && t != "." && t != "..";
  }

  std::string UniqueName(std::string_view prefix) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.*s%x-%llx-%llx", static_cast<int>(prefix.size()), prefix.data(),
                  static_cast<unsigned>(getpid()), static_cast<unsigned long long>(nonce_),
                  static_cast<unsigned long long>(counter_.fetch_add(1)));
    return buf;
  }

  static std::string ModeStr(uint32_t mode) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%o", mode & 07777);
    return buf;
  }

  static std::string MtimeStr(int64_t sec, uint32_t nsec) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%lld.%09u", static_cast<long long>(sec), nsec);
    return buf;
  }

  static ObjectInfo InfoFrom(const Response& r) {
    ObjectInfo info;
    info.size = std::strtoull(r.Header("content-length").c_str(), nullptr, 10);
    info.etag = r.Header("etag");
    info.last_modified = s3::ParseHttpTime(r.Header("last-modified")).value_or(0);
    for (const auto& [k, v] : r.headers) {
      if (!k.starts_with("x-amz-meta-")) continue;
      info.meta.push_back(k + ": " + v);
      if (k == kMetaChecksum) {
        info.has_checksum = ParseChecksumHex(v, &info.hi, &info.lo);
      } else if (k == kMetaMode) {
        info.mode = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 8)) & 07777;
      } else if (k == kMetaMtime) {
        long long s = 0;
        unsigned ns = 0;
        if (std::sscanf(v.c_str(), "%lld.%u", &s, &ns) >= 1 && ns < 1000000000u) {
          info.has_mtime = true;
          info.mtime_sec = s;
          info.mtime_nsec = ns;
        }
      } else if (k == kMetaSymlink) {
        info.symlink = true;
        info.target = PercentDecode(v, /*plus_is_space=*/false);
      }
    }
    return info;
  }

  // HEADs every listed item's key (`parallel`×4 in flight) into its
  // `info`; one removed while it was listed is marked `gone`. 0 or an errno.
  template <class Item>
  int HeadEach(std::vector<Item>& items, std::string_view what, bool quiet_all) {
    return RunParallel(items.size(), cfg_.parallel * 4, [&](size_t i) -> int {
      auto info = Head(items[i].key, what, /*quiet_404=*/true, quiet_all);
      if (!info && info.error() == ENOENT) {
        items[i].gone = true;  // removed while we listed
        return 0;
      }
      if (!info) return info.error();
      items[i].info = std::move(*info);
      return 0;
    });
  }

  // `quiet_all`: no error line at all (Stat, ListDir: their caller logs).
  Result<ObjectInfo> Head(const std::string& key, std::string_view what, bool quiet_404 = false,
                          bool quiet_all = false) {
    Request req;
    req.method = "HEAD";
    req.key = key;
    req.quiet_all = quiet_all;
    if (quiet_404) req.quiet = {404};
    Response r;
    if (auto st = http_.Perform(req, what, &r); !st) return Err(st.error());
    return InfoFrom(r);
  }

  // Whether a key with a valid relative path (s3::RelPath) lies under
  // `key_prefix`: what makes a prefix a directory, as List decides. Stops
  // at the first one: one short listing in the usual case. No error line.
  Result<bool> HasValidKey(const std::string& key_prefix) {
    constexpr int kFound = -1;  // not an errno: stops the listing
    auto st = ListPages(
        key_prefix,
        [&](const s3::ListPage& page) -> Status {
          for (const auto& o : page.objects)
            if (s3::RelPath(cfg_.prefix, o.key)) return Err(kFound);
          return {};
        },
        {}, /*quiet_all=*/true);
    if (st) return false;
    if (st.error() == kFound) return true;
    return Err(st.error());
  }

  // The Entry of the object at relative `path` that a HEAD described;
  // where the object has no mtime of ours, `listed_mtime` (the listing's
  // LastModified) or else the HEAD's Last-Modified: the same second, so an
  // object another tool wrote does not look changed between List, ListDir
  // and Stat.
  static Entry EntryOf(const std::string& path, const ObjectInfo& info, int64_t listed_mtime) {
    Entry e{};
    e.path = path;
    e.mode = info.mode;
    e.mtime_sec = info.has_mtime ? info.mtime_sec : listed_mtime ? listed_mtime : info.last_modified;
    e.mtime_nsec = info.has_mtime ? info.mtime_nsec : 0;
    if (info.symlink) {
      e.type = Entry::Type::kSymlink;
      e.target = info.target;
    } else {
      e.type = Entry::Type::kFile;
      e.size = info.size;
      e.has_checksum = info.has_checksum;
      e.checksum_hi = info.hi;
      e.checksum_lo = info.lo;
    }
    return e;
  }

  // A missing bucket answers 404 NoSuchBucket, read as ENOENT elsewhere;
  // for Stat and ListDir it means the store is unreachable: EIO.
  std::unexpected<int> NoBucketIsEio(int e, const Response& r) const {
    if (e == ENOENT && r.error_code == "NoSuchBucket") {
      LOG_DEBUG("s3 backend: s3://{}: no such bucket", cfg_.bucket);
      return Err(EIO);
    }
    return Err(e);
  }

  // Whether the object `key` itself exists (not a directory under it). A
  // missing bucket is EIO (ListPages), never "no".
  Result<bool> ObjectExists(const std::string& key) {
    constexpr int kFound = -1;  // not an errno: stops the listing
    auto st = ListPages(
        key,
        [&](const s3::ListPage& page) -> Status {
          for (const auto& o : page.objects)
            if (o.key == key) return Err(kFound);
          return {};
        },
        {}, /*quiet_all=*/true);
    if (st) return false;
    if (st.error() == kFound) return true;
    return Err(st.error());
  }

  // Whether `key` names an object or a non-empty directory.
  Result<bool> Exists(const std::string& key) {
    auto info = Head(key, "exists: head", true);
    if (info) return true;
    if (info.error() != ENOENT) return Err(info.error());
    Request req;
    req.query = Query({{"list-type", "2"}, {"max-keys", "1"}, {"prefix", key + "/"}});
    Response r;
    if (auto st = http_.Perform(req, "exists: list", &r); !st) return Err(st.error());
    auto page = s3::ParseListObjectsV2(r.body);
    if (!page) return BadReply("exists: list", key, r);
    return !page->objects.empty();
  }

  Status Delete(const std::string& key) {
    Request req;
    req.method = "DELETE";
    req.key = key;
    req.quiet = {404};
    Response r;
    auto st = http_.Perform(req, "delete", &r);
    if (!st && st.error() == ENOENT) return {};  // some stores answer 404 for a missing key
    return st;
  }

  // Calls fn for every object under `key_prefix`, in key order.
  Status ListKeys(const std::string& key_prefix, const std::function<void(const s3::ListedObject&)>& fn) {
    return ListPages(key_prefix, [&](const s3::ListPage& page) -> Status {
      for (const auto& o : page.objects) fn(o);
      return {};
    });
  }

  // Calls fn for every page of ListObjectsV2 under `key_prefix` (keys
  // decoded), in key order; stops at the first error, fn's included.
  // With a `delimiter`, keys past it are rolled up into common prefixes.
  // A missing bucket is EIO here (the store is unreachable), not ENOENT.
  Status ListPages(const std::string& key_prefix, const std::function<Status(const s3::ListPage&)>& fn,
                   const std::string& delimiter = {}, bool quiet_all = false) {
    std::string token;
    for (;;) {
      std::vector<std::pair<std::string, std::string>> params = {{"list-type", "2"},
                                                                 {"prefix", key_prefix},
                                                                 {"encoding-type", "url"},
                                                                 {"max-keys", std::to_string(cfg_.list_max_keys)}};
      if (!token.empty()) params.emplace_back("continuation-token", token);
      if (!delimiter.empty()) params.emplace_back("delimiter", delimiter);
      Request req;
      req.query = Query(params);
      req.quiet_all = quiet_all;
      Response r;
      if (auto st = http_.Perform(req, "list", &r); !st) return NoBucketIsEio(st.error(), r);
      auto page = s3::ParseListObjectsV2(r.body);
      if (!page) return BadReply("list", key_prefix, r);
      if (auto st = fn(*page); !st) return st;
      if (!page->truncated) return {};
      token = page->next_token;
    }
  }

  // DeleteObjects in batches of 1000 (Content-MD5 is required by S3).
  Status DeleteKeys(const std::vector<std::string>& keys) {
    for (size_t i = 0; i < keys.size(); i += kDeleteBatch) {
      std::vector<std::string> batch(keys.begin() + static_cast<ptrdiff_t>(i),
                                     keys.begin() + static_cast<ptrdiff_t>(std::min(keys.size(), i + kDeleteBatch)));
      std::string body = s3::DeleteObjectsXml(batch);
      Request req;
      req.method = "POST";
      req.query = Query({{"delete", ""}});
      req.body = body;
      req.headers = {"Content-MD5: " + Md5Base64(body), "Content-Type: application/xml"};
      Response r;
      if (auto st = http_.Perform(req, "delete objects", &r); !st) return st;
      auto failed = s3::ParseDeleteResult(r.body);
      if (!failed) return BadReply("delete objects", batch.front(), r);
      for (const auto& f : *failed) {
        if (f.code == "NoSuchKey") continue;
        LOG_ERROR("s3 backend: delete s3://{}/{}: {} {}", cfg_.bucket, f.key, f.code, f.message);
        return Err(f.code == "AccessDenied" ? EACCES : EIO);
      }
    }
    return {};
  }

  Status AbortLeftoverUploads(int64_t now) {
    std::string key_marker, id_marker;
    size_t aborted = 0;
    for (;;) {
      std::vector<std::pair<std::string, std::string>> params = {{"uploads", ""}, {"prefix", root_}};
      if (!key_marker.empty()) params.emplace_back("key-marker", key_marker);
      if (!id_marker.empty()) params.emplace_back("upload-id-marker", id_marker);
      Request req;
      req.query = Query(params);
      req.quiet = {501};
      Response r;
      if (auto st = http_.Perform(req, "check: list uploads", &r); !st) {
        if (st.error() == ENOTSUP) {
          LOG_INFO("s3 backend: {} cannot list multipart uploads; leftover uploads are not cleaned", cfg_.endpoint);
          return {};
        }
        return st;
      }
      auto page = s3::ParseListMultipartUploads(r.body);
      if (!page) return BadReply("check: list uploads", root_, r);
      for (const auto& u : page->uploads) {
        if (!Leftover(u.key, u.initiated_sec, now)) continue;
        if (auto st = AbortUpload(u.key, u.upload_id); !st) return st;
        aborted++;
      }
      if (!page->truncated) break;
      key_marker = page->next_key_marker;
      id_marker = page->next_upload_id_marker;
    }
    if (aborted)
      LOG_INFO("s3 backend: aborted {} leftover multipart uploads under s3://{}/{}", aborted, cfg_.bucket, root_);
    return {};
  }

  Status AbortUpload(const std::string& key, const std::string& upload_id) {
    Request req;
    req.method = "DELETE";
    req.key = key;
    req.query = Query({{"uploadId", upload_id}});
    req.quiet = {404, 405, 501};
    Response r;
    auto st = http_.Perform(req, "abort multipart upload", &r);
    if (!st && st.error() == ENOENT) return {};
    if (!st && st.error() == ENOTSUP) {
      // s3rver, for one: the parts stay until the store expires them.
      LOG_DEBUG("s3 backend: {} cannot abort multipart uploads", cfg_.endpoint);
      return {};
    }
    return st;
  }

  void RememberOrphan(const std::string& key, const std::string& upload_id) {
    MutexLock lock(&mu_);
    orphans_.emplace_back(key, upload_id);
  }

  // Aborts the uploads whose abort failed earlier; keeps those that fail again.
  void AbortOrphans() {
    std::vector<std::pair<std::string, std::string>> todo;
    {
      MutexLock lock(&mu_);
      todo.swap(orphans_);
    }
    for (const auto& [key, id] : todo) {
      if (auto st = AbortUpload(key, id); !st) {
        RememberOrphan(key, id);
      } else {
        LOG_INFO("s3 backend: aborted the multipart upload of s3://{}/{} left behind earlier", cfg_.bucket, key);
      }
    }
  }

  Result<std::string> InitiateUpload(const std::string& key, const std::vector<std::string>& headers) {
    Request req;
    req.method = "POST";
    req.key = key;
    req.query = Query({{"uploads", ""}});
    req.headers = headers;
    req.headers.push_back("Content-Type: application/octet-stream");
    Response r;
    if (auto st = http_.Perform(req, "create multipart upload", &r); !st) return Err(st.error());
    auto id = s3::ParseInitiateMultipartUpload(r.body);
    if (!id) return BadReply("create multipart upload", key, r);
    return id;
  }

  Status CompleteUpload(const std::string& key, const std::string& upload_id, const std::vector<std::string>& etags,
                        uint64_t size) {
    std::string body = s3::CompleteMultipartUploadXml(etags);
    Request req;
    req.method = "POST";
    req.key = key;
    req.query = Query({{"uploadId", upload_id}});
    req.body = body;
    req.headers = {"Content-Type: application/xml"};
    req.error_in_200 = true;
    req.quiet = {404};
    Response r;
    auto st = http_.Perform(req, "complete multipart upload", &r);
    if (!st && st.error() == ENOENT && r.error_code == "NoSuchUpload") {
      // A retry after a completion whose reply was lost: check the object.
      auto info = Head(key, "complete multipart upload: head");
      if (info && info->size == size) return {};
      LOG_ERROR("s3 backend: complete multipart upload s3://{}/{}: upload vanished", cfg_.bucket, key);
      return Err(EIO);
    }
    return st;
  }

  Result<Staged> StageSmall(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
    auto buf = std::make_shared<std::string>(size, '\0');
    ContentHash hash;
    if (!hash.ok()) return Err(ENOMEM);
    for (uint64_t off = 0; off < size; off += kReadChunk) {
      if (cancelled && cancelled()) return Err(ECANCELED);
      uint64_t len = std::min(kReadChunk, size - off);
      if (int e = PreadFull(src_fd, buf->data() + off, len, off)) {
        LOG_ERROR("s3 backend: stage: read source fd {} at {}: {}", src_fd, off, ErrStr(e));
        return Err(e);
      }
      hash.Update(off, buf->data() + off, len);
    }
    auto [hi, lo] = hash.Finish(size);
    std::string token = "mem:" + UniqueName("");
    MutexLock lock(&mu_);
    small_[token] = std::move(buf);
    return Staged{token, size, hi, lo};
  }

  // Parts are read in order here (hashing them) and uploaded by `parallel`
  // threads; at most parallel + 1 part buffers exist.
  Result<Staged> StageMultipart(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
    uint64_t psize = cfg_.part_size;
    if ((size + psize - 1) / psize > kMaxParts)
      psize = ((size + kMaxParts - 1) / kMaxParts + (1 << 20) - 1) & ~uint64_t((1 << 20) - 1);
    const uint64_t nparts = (size + psize - 1) / psize;
    AbortOrphans();
    std::string name = UniqueName("st-");
    std::string key = stage_root_ + name;
    auto upload = InitiateUpload(key, {});
    if (!upload) return Err(upload.error());

    ContentHash hash;
    if (!hash.ok()) return Err(ENOMEM);

    std::vector<std::string> etags(nparts);
    std::atomic<uint64_t> parts_done{0};
    // What this thread (reading parts) and the workers (uploading them) share.
    struct Shared {
      Mutex mu;    // a leaf
      CondVar cv;  // a part queued or uploaded, or done
      std::deque<std::pair<uint64_t, std::unique_ptr<std::string>>> queue GUARDED_BY(mu);
      std::vector<std::unique_ptr<std::string>> spare GUARDED_BY(mu);
      size_t buffers GUARDED_BY(mu) = 0;
      bool done GUARDED_BY(mu) = false;
      int err GUARDED_BY(mu) = 0;
    } sh;
    const auto nworkers = static_cast<size_t>(std::min<uint64_t>(nparts, static_cast<uint64_t>(cfg_.parallel)));

    auto worker = [&] {
      for (;;) {
        std::pair<uint64_t, std::unique_ptr<std::string>> job;
        {
          MutexLock lock(&sh.mu);
          while (sh.queue.empty() && !sh.done) sh.cv.Wait(&sh.mu);
          if (sh.queue.empty()) return;
          job = std::move(sh.queue.front());
          sh.queue.pop_front();
        }
        Request put;
        put.method = "PUT";
        put.key = key;
        put.query = Query({{"partNumber", std::to_string(job.first + 1)}, {"uploadId", *upload}});
        put.body = *job.second;
        put.cancelled = &cancelled;
        Response r;
        int e = 0;
        if (auto st = http_.Perform(put, "stage: upload part", &r); !st) e = st.error();
        else if ((etags[job.first] = r.Header("etag")).empty()) e = EIO;
        // The crash harness's "half staged": a part is in the store, the
        // upload is not complete.
        if (e == 0 && parts_done.fetch_add(1) == 0) FAILPOINT("drain.mid_transfer");
        MutexLock lock(&sh.mu);
        if (e && !sh.err) sh.err = e;
        if (e) {
          sh.done = true;
          sh.queue.clear();  // the upload is lost anyway
        }
        sh.spare.push_back(std::move(job.second));
        sh.cv.NotifyAll();
      }
    };
    std::vector<std::thread> threads;
    int read_err = 0;
    try {
      for (size_t i = 0; i < nworkers; i++) threads.emplace_back(worker);
      for (uint64_t part = 0; part < nparts; part++) {
        if (cancelled && cancelled()) {
          read_err = ECANCELED;
          break;
        }
        std::unique_ptr<std::string> buf;
        {
          MutexLock lock(&sh.mu);
          while (!sh.err && sh.spare.empty() && sh.buffers >= nworkers + 1) sh.cv.Wait(&sh.mu);
          if (sh.err) break;
          if (!sh.spare.empty()) {
            buf = std::move(sh.spare.back());
            sh.spare.pop_back();
          } else {
            sh.buffers++;
          }
        }
        if (!buf) buf = std::make_unique<std::string>();
        const uint64_t off = part * psize, len = std::min(psize, size - off);
        buf->resize(len);
        if (int e = PreadFull(src_fd, buf->data(), len, off)) {
          LOG_ERROR("s3 backend: stage: read source fd {} at {}: {}", src_fd, off, ErrStr(e));
          read_err = e;
          break;
        }
        hash.Update(off, buf->data(), len);
        MutexLock lock(&sh.mu);
        sh.queue.emplace_back(part, std::move(buf));
        sh.cv.NotifyAll();
      }
    } catch (const std::exception&) {
      read_err = ENOMEM;
    }
    {
      MutexLock lock(&sh.mu);
      sh.done = true;
      if (read_err) sh.queue.clear();
      sh.cv.NotifyAll();
    }
    for (auto& t : threads) t.join();
    int e = read_err;
    if (!e) {
      MutexLock lock(&sh.mu);  // the workers are gone: for the analysis
      e = sh.err;
    }
    if (!e && threads.empty()) e = EAGAIN;
    if (!e) {
      if (auto st = CompleteUpload(key, *upload, etags, size); !st) e = st.error();
    }
    if (e) {
      if (auto st = AbortUpload(key, *upload); !st) {
        LOG_WARN("s3 backend: stage: multipart upload of s3://{}/{} left behind (aborted later)", cfg_.bucket, key);
        RememberOrphan(key, *upload);
      }
      if (e == ECANCELED) LOG_DEBUG("s3 backend: stage of {} bytes into {} cancelled", size, key);
      return Err(e);
    }
    AbortOrphans();  // the store answers again: clean up what it could not take earlier
    auto [hi, lo] = hash.Finish(size);
    return Staged{"tmp:" + name, size, hi, lo};
  }

  // Copies object `src` (`size` bytes) to `dst`. With `meta`, the copy gets
  // those metadata headers (REPLACE); without, it keeps the source's.
  Status Copy(const std::string& src, const std::string& dst, uint64_t size, const std::vector<std::string>* meta) {
    if (size > cfg_.multipart_copy_threshold || size > cfg_.max_copy_object_size) {
      std::vector<std::string> headers;
      if (meta) {
        headers = *meta;
      } else {
        auto info = Head(src, "copy: head source");
        if (!info) return Err(info.error());
        headers = info->meta;
      }
      if (!no_part_copy_.load()) {
        auto st = CopyMultipart(src, dst, size, headers, /*through_client=*/false);
        if (st || st.error() != ENOTSUP) return st;
        no_part_copy_ = true;
        LOG_INFO("s3 backend: {} has no UploadPartCopy; large copies go {}", cfg_.endpoint,
                 "through CopyObject up to 5 GiB, through this host above");
      }
      if (size > cfg_.max_copy_object_size) return CopyMultipart(src, dst, size, headers, /*through_client=*/true);
    }
    Request put;
    put.method = "PUT";
    put.key = dst;
    put.headers = {"x-amz-copy-source: /" + cfg_.bucket + "/" + s3::UriEncode(src, true),
                   std::string("x-amz-metadata-directive: ") + (meta ? "REPLACE" : "COPY")};
    if (meta) put.headers.insert(put.headers.end(), meta->begin(), meta->end());
    put.error_in_200 = true;
    Response r;
    if (auto st = http_.Perform(put, "copy from " + src + " to", &r); !st) return st;
    if (auto etag = s3::ParseETagResult(r.body); !etag) return BadReply("copy to", dst, r);
    return {};
  }

  // A multipart copy: UploadPartCopy, or GET + UploadPart when
  // `through_client`. ENOTSUP when the store has no UploadPartCopy.
  Status CopyMultipart(const std::string& src, const std::string& dst, uint64_t size,
                       const std::vector<std::string>& headers, bool through_client) {
    uint64_t psize = std::max(cfg_.part_size, (size + kMaxParts - 1) / kMaxParts);
    const uint64_t nparts = (size + psize - 1) / psize;
    auto upload = InitiateUpload(dst, headers);
    if (!upload) return Err(upload.error());
    std::vector<std::string> etags(nparts);
    const std::string source = "/" + cfg_.bucket + "/" + s3::UriEncode(src, true);
    int err = RunParallel(nparts, cfg_.parallel, [&](size_t i) -> int {
      const uint64_t off = i * psize, len = std::min(psize, size - off);
      const std::string range = "bytes=" + std::to_string(off) + "-" + std::to_string(off + len - 1);
      std::string q = Query({{"partNumber", std::to_string(i + 1)}, {"uploadId", *upload}});
      Response r;
      if (!through_client) {
        Request put;
        put.method = "PUT";
        put.key = dst;
        put.query = q;
        put.headers = {"x-amz-copy-source: " + source, "x-amz-copy-source-range: " + range};
        put.error_in_200 = true;
        put.quiet = {501};
        if (auto st = http_.Perform(put, "copy part", &r); !st) return st.error();
        auto etag = s3::ParseETagResult(r.body);
        if (!etag) return BadReply("copy part", dst, r).error();
        etags[i] = *etag;
        return 0;
      }
      std::string data;
      Request get;
      get.key = src;
      get.headers = {"Range: " + range};
      get.sink = [&](const char* p, size_t n) {
        data.append(p, n);
        return 0;
      };
      get.on_retry = [&] { data.clear(); };
      if (auto st = http_.Perform(get, "copy: get range", &r); !st) return st.error();
      if (data.size() != len) return BadReply("copy: get range", src, r).error();
      Request put;
      put.method = "PUT";
      put.key = dst;
      put.query = q;
      put.body = data;
      if (auto st = http_.Perform(put, "copy: upload part", &r); !st) return st.error();
      etags[i] = r.Header("etag");
      return etags[i].empty() ? EIO : 0;
    });
    if (!err) {
      if (auto st = CompleteUpload(dst, *upload, etags, size); !st) err = st.error();
    }
    if (err) {
      if (auto st = AbortUpload(dst, *upload); !st) RememberOrphan(dst, *upload);
      return Err(err);
    }
    return {};
  }

  // Moves the object `from` and everything under `from/` to `to`: copies
  // first, deletes after, so a failure leaves the source whole.
  Status Move(const std::string& from, const std::string& to) {
    auto info = Head(from, "rename: head source", true);
    if (!info && info.error() != ENOENT) return Err(info.error());
    std::vector<s3::ListedObject> under;
    if (auto st = ListKeys(from + "/", [&](const s3::ListedObject& o) { under.push_back(o); }); !st) return st;
    if (!info && under.empty()) return Fail(ENOENT, "rename: no such file or directory", from);
    if (info) {
      if (auto st = Copy(from, to, info->size, nullptr); !st) return st;
    }
    int err = RunParallel(under.size(), cfg_.parallel, [&](size_t i) -> int {
      std::string dst = to + under[i].key.substr(from.size());
      auto st = Copy(under[i].key, dst, under[i].size, nullptr);
      return st ? 0 : st.error();
    });
    if (err) return Err(err);
    std::vector<std::string> keys;
    if (info) keys.push_back(from);
    for (const auto& o : under) keys.push_back(o.key);
    return DeleteKeys(keys);
  }

  // Move for an exchange that may be resumed (Rename): redone while any of
  // `from` is left; `from` gone with `to` there is a move that finished.
  Status MoveOnce(const std::string& from, const std::string& to) {
    auto fe = Exists(from);
    if (!fe) return Err(fe.error());
    if (*fe) return Move(from, to);
    auto te = Exists(to);
    if (!te) return Err(te.error());
    if (*te) return {};
    return Fail(ENOENT, "rename: exchange: neither side of a move is left:", from + "' -> '" + to);
  }

  // The moves an exchange's journal `j` records as done: 0 (none, or no
  // journal), 1 or 2.
  Result<int> ExchangeMoves(const std::string& j) {
    std::string body;
    Request get;
    get.key = j;
    get.quiet = {404};
    get.sink = [&](const char* data, size_t n) -> int {
      if (body.size() + n > 16) return EIO;
      body.append(data, n);
      return 0;
    };
    get.on_retry = [&] { body.clear(); };
    Response r;
    if (auto st = http_.Perform(get, "rename: exchange: read journal", &r); !st) {
      if (st.error() == ENOENT && r.error_code != "NoSuchBucket") return 0;
      return NoBucketIsEio(st.error(), r);
    }
    if (body == "1" || body == "2") return body[0] - '0';
    return BadReply("rename: exchange: read journal", j, r);
  }

  Status SetExchangeMoves(const std::string& j, int moves) {
    const std::string body(1, static_cast<char>('0' + moves));
    Request put;
    put.method = "PUT";
    put.key = j;
    put.body = body;
    Response r;
    return http_.Perform(put, "rename: exchange: write journal", &r);
  }

  // Whether `key` is an exchange's temporary, under it, or its journal:
  // "<tmp_root_>[OWNER/]xchg-..." (OWNER is one component).
  bool Exchanging(std::string_view key) const {
    if (!key.starts_with(tmp_root_)) return false;
    std::string_view rel = key.substr(tmp_root_.size());
    size_t slash = rel.find('/');
    return rel.starts_with(kExchangePrefix) ||
           (slash != std::string_view::npos && rel.substr(slash + 1).starts_with(kExchangePrefix));
  }

  S3Config cfg_;
  const std::string root_;      // "<prefix>/" or "" — every key starts with it
  const std::string tmp_root_;  // "<prefix>/.ckptfs-tmp/"
  const std::string stage_root_;  // where this backend stages: tmp_root_ + "OWNER/"
  const uint64_t nonce_;
  std::atomic<uint64_t> counter_{0};
  std::atomic<bool> no_part_copy_{false};  // the store answered UploadPartCopy with 501
  s3::Client http_;  // after cfg_, which it reads
  Mutex mu_;                                                                             // a leaf
  std::unordered_map<std::string, std::shared_ptr<std::string>> small_ GUARDED_BY(mu_);  // staged in memory
  std::vector<std::pair<std::string, std::string>> orphans_ GUARDED_BY(mu_);             // (key, upload id) to abort
};

}  // namespace

Result<std::unique_ptr<Backend>> OpenS3Backend(const S3Config& cfg) {
  if (cfg.bucket.empty() || cfg.endpoint.empty() || cfg.region.empty() || cfg.access_key.empty() ||
      cfg.secret_key.empty()) {
    LOG_ERROR("s3 backend: incomplete configuration for s3://{} (bucket, endpoint, region and credentials needed)",
              cfg.bucket);
    return Err(EINVAL);
  }
  if (auto p = s3::NormalizePrefix(cfg.prefix); !p || *p != cfg.prefix) {
    LOG_ERROR("s3 backend: prefix '{}' is not normalized (use LoadS3Config)", cfg.prefix);
    return Err(EINVAL);
  }
  static std::once_flag once;
  static CURLcode init_rc = CURLE_OK;
  std::call_once(once, [] { init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init_rc != CURLE_OK) {
    LOG_ERROR("s3 backend: curl_global_init: {}", curl_easy_strerror(init_rc));
    return Err(EIO);
  }
  try {
    return std::make_unique<S3Backend>(cfg);
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

}  // namespace ckpt::backend
