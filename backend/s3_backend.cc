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
// remedy; without a prefix only keys under .ckptfs-tmp/ are ever
// leftovers: the rest of the bucket may be other tools'). Removing every one, as before, let a restarting node abort
// the upload another node was in the middle of. A half-done exchange's objects (xchg-*, Rename) are never removed: one
// may hold the only copy of a file. An upload whose abort fails (the store is down) is remembered and aborted again
// around the next multipart upload (before it starts and once it completes), so a store that comes back is left clean
// without a remount.
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
#include "backend/s3_backend_impl.h"
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

}  // namespace ckpt::backend

namespace ckpt::backend::s3impl {

std::string S3Backend::Describe() const {
  return "s3://" + cfg_.bucket + (cfg_.prefix.empty() ? "" : "/" + cfg_.prefix) + " (" + cfg_.endpoint + ")";
}

Status S3Backend::Check() {
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
    LOG_INFO("s3 backend: removed {} leftover staged objects under s3://{}/{}{}", stale.size(), cfg_.bucket, tmp_root_,
             kept ? fmt::format(" ({} of live daemons kept)", kept) : "");
  }
  return {};
}

bool S3Backend::Leftover(const std::string& key, int64_t made_sec, int64_t now) const {
  if (key.starts_with(tmp_root_)) {
    std::string_view rel = std::string_view(key).substr(tmp_root_.size());
    size_t slash = rel.rfind('/');
    std::string_view owner = slash == rel.npos ? std::string_view() : rel.substr(0, slash);
    if (auto n = StagedNonce(slash == rel.npos ? rel : rel.substr(slash + 1))) {
      if (*n == nonce_) return false;
      if (!cfg_.owner.empty() && owner == cfg_.owner) return true;
    }
  }
  // Without a prefix the bucket is not ours alone: an upload to a key
  // outside the staging area may be another tool's (a dataset's upload
  // that runs for hours), and is never aborted; ours there (a publish's
  // copy cut short) is left to the bucket's lifecycle rule.
  if (root_.empty() && !key.starts_with(tmp_root_)) return false;
  return made_sec > 0 && made_sec < now - kStaleStagedSec;
}

Result<Staged> S3Backend::Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
  try {
    if (size <= cfg_.part_size) return StageSmall(src_fd, size, cancelled);
    return StageMultipart(src_fd, size, cancelled);
  } catch (const std::bad_alloc&) {
    LOG_ERROR("s3 backend: stage of {} bytes: out of memory", size);
    return Err(ENOMEM);
  }
}

Status S3Backend::Publish(const Staged& s, const std::string& path, const Attrs& a) {
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

void S3Backend::Abort(const Staged& s) {
  if (s.token.starts_with("mem:")) {
    MutexLock lock(&mu_);
    small_.erase(s.token);
  } else if (s.token.starts_with("tmp:") && ValidToken(s.token.substr(4))) {
    if (auto st = Delete(stage_root_ + s.token.substr(4)); !st)
      LOG_WARN("s3 backend: abort: staged object s3://{}/{}{} left behind (removed at next mount)", cfg_.bucket,
               stage_root_, s.token.substr(4));
  }
}

Status S3Backend::Mkdir(const std::string& path, const Attrs& a) {
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

Status S3Backend::Rmdir(const std::string& path) {
  auto key = KeyOf(path, "rmdir");
  if (!key) return Err(key.error());
  std::vector<std::string> keys;
  if (auto st = ListKeys(*key + "/", [&](const s3::ListedObject& o) { keys.push_back(o.key); }); !st) return st;
  return DeleteKeys(keys);
}

Status S3Backend::Remove(const std::string& path) {
  auto key = KeyOf(path, "remove");
  if (!key) return Err(key.error());
  return Delete(*key);
}

Status S3Backend::Rename(const std::string& from, const std::string& to, bool exchange) {
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

Status S3Backend::Symlink(const std::string& path, const std::string& target, const Attrs&) {
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

Status S3Backend::Link(const std::string& from, const std::string& to) {
  auto f = KeyOf(from, "link");
  if (!f) return Err(f.error());
  auto t = KeyOf(to, "link");
  if (!t) return Err(t.error());
  auto info = Head(*f, "link: head source");
  if (!info) return Err(info.error());
  return Copy(*f, *t, info->size, nullptr);
}

Status S3Backend::SetAttr(const std::string& path, const Attrs&) {
  if (!s3::ValidPath(path)) return Fail(EINVAL, "setattr: invalid path", path);
  LOG_DEBUG("s3 backend: setattr '{}': not kept by this store (mode and mtime are set at publish)", path);
  return {};
}

Result<std::pair<uint64_t, uint64_t>> S3Backend::Fetch(const std::string& path, int dst_fd, uint64_t size) {
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
      LOG_ERROR("s3 backend: fetch s3://{}/{}: range at {} returned {} bytes, {} expected (HTTP {})", cfg_.bucket, *key,
                off, done, len, r.status);
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

Status S3Backend::PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) {
  if (!ValidRecordName(dir) || !ValidRecordName(name))
    return Fail(EINVAL, "put record: invalid name", dir + "/" + name);
  if (bytes.size() > kMaxRecordBytes) return Fail(EFBIG, "put record: too large", dir + "/" + name);
  Request put;
  put.method = "PUT";
  put.key = root_ + kClusterDir + "/" + dir + "/" + name;
  put.body = bytes;
  put.headers.push_back("Content-Type: application/json");
  Response r;
  return http_.Perform(put, "put record", &r);
}

std::unexpected<int> S3Backend::Fail(int e, std::string_view what, std::string_view key) const {
  LOG_ERROR("s3 backend: {} s3://{}/{}: {}", what, cfg_.bucket, key, ErrStr(e));
  return Err(e);
}

std::unexpected<int> S3Backend::BadReply(std::string_view what, std::string_view key, const Response& r) const {
  LOG_ERROR("s3 backend: {} s3://{}/{}: HTTP {}: unexpected reply ({} bytes)", what, cfg_.bucket, key, r.status,
            r.body.size());
  return Err(EIO);
}

Result<std::string> S3Backend::KeyOf(const std::string& path, std::string_view op) const {
  auto k = s3::JoinKey(cfg_.prefix, path);
  if (!k) {
    LOG_ERROR("s3 backend: {}: invalid path '{}'", op, path);
    return Err(EINVAL);
  }
  return k;
}

bool S3Backend::ValidToken(std::string_view t) {
  return !t.empty() && t.find('/') == std::string_view::npos && t != "." && t != "..";
}

std::string S3Backend::UniqueName(std::string_view prefix) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.*s%x-%llx-%llx", static_cast<int>(prefix.size()), prefix.data(),
                static_cast<unsigned>(getpid()), static_cast<unsigned long long>(nonce_),
                static_cast<unsigned long long>(counter_.fetch_add(1)));
  return buf;
}

std::string S3Backend::ModeStr(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%o", mode & 07777);
  return buf;
}

std::string S3Backend::MtimeStr(int64_t sec, uint32_t nsec) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%09u", static_cast<long long>(sec), nsec);
  return buf;
}

std::unexpected<int> S3Backend::NoBucketIsEio(int e, const Response& r) const {
  if (e == ENOENT && r.error_code == "NoSuchBucket") {
    LOG_DEBUG("s3 backend: s3://{}: no such bucket", cfg_.bucket);
    return Err(EIO);
  }
  return Err(e);
}

Status S3Backend::Delete(const std::string& key) {
  Request req;
  req.method = "DELETE";
  req.key = key;
  req.quiet = {404};
  Response r;
  auto st = http_.Perform(req, "delete", &r);
  if (!st && st.error() == ENOENT) return {};  // some stores answer 404 for a missing key
  return st;
}

Status S3Backend::DeleteKeys(const std::vector<std::string>& keys) {
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

Status S3Backend::Move(const std::string& from, const std::string& to) {
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

Status S3Backend::MoveOnce(const std::string& from, const std::string& to) {
  auto fe = Exists(from);
  if (!fe) return Err(fe.error());
  if (*fe) return Move(from, to);
  auto te = Exists(to);
  if (!te) return Err(te.error());
  if (*te) return {};
  return Fail(ENOENT, "rename: exchange: neither side of a move is left:", from + "' -> '" + to);
}

Result<int> S3Backend::ExchangeMoves(const std::string& j) {
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

Status S3Backend::SetExchangeMoves(const std::string& j, int moves) {
  const std::string body(1, static_cast<char>('0' + moves));
  Request put;
  put.method = "PUT";
  put.key = j;
  put.body = body;
  Response r;
  return http_.Perform(put, "rename: exchange: write journal", &r);
}

bool S3Backend::Exchanging(std::string_view key) const {
  if (!key.starts_with(tmp_root_)) return false;
  std::string_view rel = key.substr(tmp_root_.size());
  size_t slash = rel.find('/');
  return rel.starts_with(kExchangePrefix) ||
         (slash != std::string_view::npos && rel.substr(slash + 1).starts_with(kExchangePrefix));
}

}  // namespace ckpt::backend::s3impl

namespace ckpt::backend {

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
    return std::make_unique<s3impl::S3Backend>(cfg);
  } catch (const std::bad_alloc&) {
    return Err(ENOMEM);
  }
}

}  // namespace ckpt::backend
