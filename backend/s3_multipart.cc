// s3_multipart.cc — the S3 Backend's staging (a small file in memory, a
// large one as a multipart upload under .ckptfs-tmp/), its server-side
// copies (CopyObject, UploadPartCopy, or GET + UploadPart where the store
// has no UploadPartCopy) and the uploads left over by earlier daemons.
// See s3_backend.h for why a copy at Publish time.
#include <curl/curl.h>
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
#include <unordered_set>

#include "backend/checksum.h"
#include "backend/s3_backend_impl.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/text.h"

namespace ckpt::backend::s3impl {

Status S3Backend::AbortLeftoverUploads(int64_t now) {
  std::string key_marker, id_marker;
  size_t aborted = 0;
  for (;;) {
    // encoding-type=url: a key with a CR (which XML reads as LF) comes back as it is, and its abort finds it.
    std::vector<std::pair<std::string, std::string>> params = {
        {"uploads", ""}, {"prefix", root_}, {"encoding-type", "url"}};
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
    if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker)
      return BadReply("check: list uploads: no new marker", root_, r);
    key_marker = page->next_key_marker;
    id_marker = page->next_upload_id_marker;
  }
  if (aborted)
    LOG_INFO("s3 backend: aborted {} leftover multipart uploads under s3://{}/{}", aborted, cfg_.bucket, root_);
  return {};
}

Status S3Backend::AbortUpload(const std::string& key, const std::string& upload_id) {
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

void S3Backend::RememberOrphan(const std::string& key, const std::string& upload_id) {
  MutexLock lock(&mu_);
  orphans_.emplace_back(key, upload_id);
}

void S3Backend::AbortOrphans() {
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

Result<std::string> S3Backend::InitiateUpload(const std::string& key, const std::vector<std::string>& headers) {
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

Status S3Backend::CompleteUpload(const std::string& key, const std::string& upload_id,
                                 const std::vector<std::string>& etags, uint64_t size) {
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
  if (!st) return st;
  // The object must hold every byte sent: a server that answers a part
  // before it is on disk can assemble a short object and say nothing (an
  // s3rver did, 64 KiB short). One HEAD per multipart object; a short one
  // is an error the drain retries, never a published checkpoint.
  auto info = Head(key, "complete multipart upload: head");
  if (!info) return Err(info.error());
  if (info->size != size) {
    LOG_ERROR("s3 backend: complete multipart upload s3://{}/{}: the object holds {} bytes, {} were sent; removed",
              cfg_.bucket, key, info->size, size);
    if (auto d = Delete(key); !d) return d;  // no reader gets wrong bytes under that name
    return Err(EIO);
  }
  return {};
}

Result<Staged> S3Backend::StageSmall(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
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

Result<Staged> S3Backend::StageMultipart(int src_fd, uint64_t size, const std::function<bool()>& cancelled) {
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

Status S3Backend::Copy(const std::string& src, const std::string& dst, uint64_t size,
                       const std::vector<std::string>* meta) {
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

Status S3Backend::CopyMultipart(const std::string& src, const std::string& dst, uint64_t size,
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
      if (data.size() + n > len) return EIO;  // a store that ignores Range: not the whole object in RAM
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

}  // namespace ckpt::backend::s3impl
