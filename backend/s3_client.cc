// s3_client.cc — see s3_client.h.
#include "backend/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <system_error>
#include <thread>

#include "backend/s3_xml.h"
#include "common/log.h"
#include "common/text.h"

namespace ckpt::backend::s3 {

namespace {

constexpr uint64_t kBackoffCapMs = 5000;
constexpr char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct CallState {
  const Request* req;
  Response* resp;
  CURL* h;
  int sink_err = 0;
};

size_t OnBody(char* data, size_t size, size_t nmemb, void* user) {
  auto* st = static_cast<CallState*>(user);
  size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(st->h, CURLINFO_RESPONSE_CODE, &status);
  if (st->req->sink && status >= 200 && status < 300) {
    if (int e = st->req->sink(data, n)) {
      st->sink_err = e;
      return 0;  // CURLE_WRITE_ERROR
    }
    return n;
  }
  if (st->resp->body.size() + n > (64u << 20)) return 0;  // no reply of ours is that large
  st->resp->body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t nmemb, void* user) {
  auto* st = static_cast<CallState*>(user);
  size_t n = size * nmemb;
  std::string_view line(data, n);
  if (line.starts_with("HTTP/")) {
    st->resp->headers.clear();  // a new response (after 100 Continue)
    return n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string name(line.substr(0, colon));
  for (char& c : name)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  std::string_view v = line.substr(colon + 1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  st->resp->headers.emplace_back(std::move(name), std::string(v));
  return n;
}

int OnProgress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* st = static_cast<CallState*>(user);
  return st->req->cancelled && *st->req->cancelled && (*st->req->cancelled)() ? 1 : 0;
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  std::string r;
  r.reserve(s.size() + s.size() / 4);
  for (unsigned char c : s) {
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
                 c == '_' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      r.push_back(static_cast<char>(c));
    } else {
      r.push_back('%');
      r.push_back(kHexUpper[c >> 4]);
      r.push_back(kHexUpper[c & 15]);
    }
  }
  return r;
}

Verdict ClassifyCurl(int curl_code) {
  switch (static_cast<CURLcode>(curl_code)) {
    case CURLE_OK: return {false, 0};
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_AGAIN: return {true, EIO};
    case CURLE_ABORTED_BY_CALLBACK: return {false, ECANCELED};
    case CURLE_OUT_OF_MEMORY: return {false, ENOMEM};
    default: return {false, EIO};
  }
}

namespace {

// What an S3 error code means here, whatever the HTTP status it came with
// (S3 sends several transient errors as 400). From the Amazon S3 API
// Reference, "Error responses" (its list of error codes), plus the
// throttling codes that other AWS services and S3-compatible stores send.
// `retry`: the same request may succeed if sent again after a backoff;
// `err`: the errno when it is not (or no longer) retried. The drainer
// retries every errno but the permanent ones (backend.h): EIO, EACCES and
// ENOENT are transient there, ENAMETOOLONG, EFBIG and EINVAL are not.
struct CodeRule {
  std::string_view code;
  bool retry;
  int err;
};
constexpr CodeRule kCodeRules[] = {
    // The store, the network or the clock: the same request can succeed.
    {"InternalError", true, EIO},
    {"ServiceUnavailable", true, EIO},
    {"SlowDown", true, EIO},
    {"OperationAborted", true, EIO},  // a conflicting operation on the key is under way
    {"RequestTimeout", true, EIO},    // the connection sat idle too long
    {"IncompleteBody", true, EIO},    // fewer bytes arrived than Content-Length
    {"BadDigest", true, EIO},         // the body was corrupted in flight: send it again
    {"XAmzContentSHA256Mismatch", true, EIO},
    {"ExpiredToken", true, EIO},          // the session token expired (renewed keys need a remount: docs/s3.md)
    {"TokenRefreshRequired", true, EIO},  // likewise
    {"RequestTimeTooSkewed", true, EIO},  // this host's clock is 15 min or more off (Perform warns)
    {"Throttling", true, EIO},
    {"ThrottlingException", true, EIO},
    {"RequestLimitExceeded", true, EIO},
    {"TooManyRequests", true, EIO},
    // A multipart completion whose part list the store refuses: the same
    // list fails the same way, so it is not sent again; EIO (transient),
    // so the upload is aborted and the drainer's retry of the entry stages
    // or copies again with a new upload, which can succeed.
    {"InvalidPart", false, EIO},
    {"InvalidPartOrder", false, EIO},
    // The upload is gone: an abort is then done (AbortUpload); a
    // completion checks whether an earlier attempt completed it, and is
    // EIO otherwise (CompleteUpload); a part upload fails its Stage with
    // ENOENT, transient, and the retry stages again.
    {"NoSuchUpload", false, ENOENT},
    // Refusals: sending again cannot help.
    {"AccessDenied", false, EACCES},
    {"AccountProblem", false, EACCES},
    {"AllAccessDisabled", false, EACCES},
    {"InvalidAccessKeyId", false, EACCES},
    {"InvalidSecurity", false, EACCES},
    {"InvalidToken", false, EACCES},
    {"NotSignedUp", false, EACCES},
    {"SignatureDoesNotMatch", false, EACCES},
    {"NoSuchBucket", false, ENOENT},
    {"NoSuchKey", false, ENOENT},
    {"KeyTooLongError", false, ENAMETOOLONG},
    {"EntityTooLarge", false, EFBIG},
    {"EntityTooSmall", false, EINVAL},
    {"InvalidObjectName", false, EINVAL},  // Ceph RGW's
    {"InvalidArgument", false, EINVAL},
    {"InvalidRequest", false, EINVAL},
    {"InvalidRange", false, EINVAL},
    {"InvalidDigest", false, EINVAL},
    {"MalformedXML", false, EINVAL},
    {"MetadataTooLarge", false, EINVAL},
    {"NotImplemented", false, ENOTSUP},
    {"MethodNotAllowed", false, ENOTSUP},
};

}  // namespace

Verdict ClassifyHttp(long status, std::string_view code) {
  if (status >= 200 && status < 300 && code.empty()) return {false, 0};
  for (const auto& r : kCodeRules)
    if (r.code == code) return {r.retry, r.err};
  // A code not in the table (or none: a HEAD has no body): the status.
  if (status == 429 || status == 408 || (status >= 500 && status != 501)) return {true, EIO};
  switch (status) {
    case 400:
    case 416: return {false, EINVAL};
    case 403: return {false, EACCES};
    case 404: return {false, ENOENT};
    case 405:
    case 501: return {false, ENOTSUP};
    default: return {false, EIO};
  }
}

uint64_t BackoffMs(int attempt, uint64_t base_ms, uint64_t cap_ms, double unit) {
  uint64_t ceiling = base_ms;
  for (int i = 1; i < attempt && ceiling < cap_ms; i++) ceiling *= 2;
  ceiling = std::min(ceiling, cap_ms);
  return static_cast<uint64_t>(static_cast<double>(ceiling) * std::clamp(unit, 0.0, 1.0));
}

std::string Sha256Hex(std::string_view data) {
  if (data.empty()) return kEmptySha256;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return HexLower(md, len);
}

std::string Md5Base64(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_md5(), nullptr);
  unsigned char out[64];
  int n = EVP_EncodeBlock(out, md, static_cast<int>(len));
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
}

std::string Query(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [k, v] : params) k = UriEncode(k, false), v = UriEncode(v, false);
  std::sort(params.begin(), params.end());
  std::string q;
  for (const auto& [k, v] : params) {
    if (!q.empty()) q.push_back('&');
    q += k + "=" + v;
  }
  return q;
}

int RunParallel(size_t n, int parallel, const std::function<int(size_t)>& fn) {
  if (n == 0) return 0;
  std::atomic<size_t> next{0};
  std::atomic<int> err{0};
  auto worker = [&] {
    for (;;) {
      if (err.load()) return;
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      if (int e = fn(i)) {
        int zero = 0;
        err.compare_exchange_strong(zero, e);
      }
    }
  };
  size_t nthreads = std::min<size_t>(n, static_cast<size_t>(std::max(1, parallel)));
  std::vector<std::thread> threads;
  try {
    for (size_t i = 1; i < nthreads; i++) threads.emplace_back(worker);
  } catch (const std::system_error&) {
    // Fewer threads than asked: the ones we have do the work.
  }
  worker();
  for (auto& t : threads) t.join();
  return err.load();
}

EasyPool::~EasyPool() {
  for (CURL* h : free_) curl_easy_cleanup(h);
}

CURL* EasyPool::Acquire() {
  {
    MutexLock lock(&mu_);
    if (!free_.empty()) {
      CURL* h = free_.back();
      free_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void EasyPool::Release(CURL* h) {
  MutexLock lock(&mu_);
  free_.push_back(h);
}

// Sends one request, retrying transient failures. On failure *out holds
// the last attempt's status and error code, and one line is logged
// (unless the status is in req.quiet).
Status Client::Perform(const Request& req, std::string_view what, Response* out) {
  std::string url = Url(req.key, req.query);
  std::string sha = Sha256Hex(req.body);
  Verdict v;
  std::string reason;
  bool skew_logged = false;
  for (int attempt = 1;; attempt++) {
    if (attempt > 1) {
      if (!Sleep(BackoffMs(attempt - 1, static_cast<uint64_t>(cfg_.retry_base_ms), kBackoffCapMs, Unit()),
                 req.cancelled))
        return Err(ECANCELED);
      if (req.on_retry) req.on_retry();
    }
    *out = Response{};
    CURL* h = pool_.Acquire();
    if (!h) {
      LOG_ERROR("s3 backend: {} s3://{}/{}: no curl handle", what, cfg_.bucket, req.key);
      return Err(ENOMEM);
    }
    CallState st{&req, out, h};
    curl_slist* hdrs = nullptr;
    hdrs = curl_slist_append(hdrs, ("x-amz-content-sha256: " + sha).c_str());
    if (!cfg_.session_token.empty())
      hdrs = curl_slist_append(hdrs, ("x-amz-security-token: " + cfg_.session_token).c_str());
    hdrs = curl_slist_append(hdrs, "Expect:");
    for (const auto& x : req.headers) hdrs = curl_slist_append(hdrs, x.c_str());

    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, cfg_.access_key.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, cfg_.secret_key.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // stalled for a minute: a timeout
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &st);
    if (req.cancelled) {
      curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, OnProgress);
      curl_easy_setopt(h, CURLOPT_XFERINFODATA, &st);
    }
    std::string_view m = req.method;
    if (m == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (m == "PUT" || m == "POST") {
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.empty() ? "" : req.body.data());
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method);
    } else if (m != "GET") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(hdrs);
    // Forget the credentials in the idle handle.
    curl_easy_setopt(h, CURLOPT_USERNAME, "");
    curl_easy_setopt(h, CURLOPT_PASSWORD, "");
    pool_.Release(h);

    if (rc == CURLE_WRITE_ERROR && st.sink_err) {
      LOG_ERROR("s3 backend: {} s3://{}/{}: writing the reply: {}", what, cfg_.bucket, req.key, ErrStr(st.sink_err));
      return Err(st.sink_err);
    }
    if (rc != CURLE_OK) {
      v = ClassifyCurl(rc);
      reason = curl_easy_strerror(rc);
    } else {
      bool failed = out->status < 200 || out->status >= 300;
      if (failed || (req.error_in_200 && out->status == 200)) {
        if (auto e = ParseError(out->body)) {
          out->error_code = e->code;
          out->error_message = e->message;
          failed = true;
          if (out->status == 200) out->status = 500;  // failed after the headers were sent
        }
      }
      if (!failed) return {};
      v = ClassifyHttp(out->status, out->error_code);
      if (out->error_code == "RequestTimeTooSkewed" && !skew_logged) {
        skew_logged = true;  // once per request: the final failure has its own line
        LOG_WARN("s3 backend: {} s3://{}/{}: the store says this host's clock is 15 minutes or more off "
                 "(RequestTimeTooSkewed); retrying, but the clock needs fixing (NTP)",
                 what, cfg_.bucket, req.key);
      }
      reason = "HTTP " + std::to_string(out->status) + (out->error_code.empty() ? "" : " " + out->error_code);
    }
    if (v.err == ECANCELED) return Err(ECANCELED);
    if (!v.retry || attempt >= cfg_.max_attempts) {
      bool quiet =
          req.quiet_all || std::find(req.quiet.begin(), req.quiet.end(), out->status) != req.quiet.end();
      if (quiet) LOG_DEBUG("s3 backend: {} s3://{}/{}: {}", what, cfg_.bucket, req.key, reason);
      else
        LOG_ERROR("s3 backend: {} s3://{}/{}: {}{}{}{}", what, cfg_.bucket, req.key, reason,
                  out->error_message.empty() ? "" : ": ", out->error_message,
                  v.retry ? " (after " + std::to_string(attempt) + " attempts)" : "");
      return Err(v.retry ? EIO : v.err);
    }
    LOG_DEBUG("s3 backend: {} s3://{}/{}: {}; retry {}", what, cfg_.bucket, req.key, reason, attempt);
  }
}

std::string Client::Url(const std::string& key, const std::string& query) const {
  std::string u;
  if (cfg_.path_style) {
    u = cfg_.endpoint + "/" + cfg_.bucket;
    if (!key.empty()) u += "/" + s3::UriEncode(key, true);
  } else {
    size_t sep = cfg_.endpoint.find("://");
    u = cfg_.endpoint.substr(0, sep + 3) + cfg_.bucket + "." + cfg_.endpoint.substr(sep + 3) + "/" +
        s3::UriEncode(key, true);
  }
  if (!query.empty()) u += "?" + query;
  return u;
}

double Client::Unit() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// Sleeps `ms`, polling `cancelled`; false when cancelled.
bool Client::Sleep(uint64_t ms, const std::function<bool()>* cancelled) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (cancelled && *cancelled && (*cancelled)()) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(20), until - std::chrono::steady_clock::now()));
  }
  return true;
}

}  // namespace ckpt::backend::s3
