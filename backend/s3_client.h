// s3_client.h — the HTTP side of the S3 backend: one request, signed by
// libcurl, retried on what the S3 documentation calls transient, with its
// failure classified by the S3 error code (not the HTTP status alone).
//
// Requests: one curl easy handle per request, taken from a pool so that
// connections are reused (curl_easy_reset keeps them), signed by libcurl
// (CURLOPT_AWS_SIGV4). libcurl 7.88 signs the query string as given and
// the payload as the SHA-256 of CURLOPT_POSTFIELDS (of "" without), and
// does not send x-amz-content-sha256, which S3 requires; so every query is
// built sorted and encoded (Query()), every body is sent from memory as
// POSTFIELDS with the method in CURLOPT_CUSTOMREQUEST, and the same hash is
// sent in x-amz-content-sha256 (newer libcurls take it from there). Bodies
// are therefore signed, at the cost of hashing each part (SHA-256, ~1-2 GB/s).
// Each request runs on its caller's thread (docs/architecture.md,
// "Libraries", says why not curl's multi interface).
//
// Thread-safety: Client::Perform from any thread; the free functions are
// pure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/s3_config.h"
#include "common/mutex.h"
#include "common/result.h"

typedef void CURL;

namespace ckpt::backend::s3 {

// RFC 3986 percent-encoding as SigV4 wants it: everything but A-Z a-z 0-9
// - . _ ~ is encoded, and '/' too unless `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);

// What to do after one attempt of a request.
struct Verdict {
  bool retry = false;  // transient: try again after a backoff
  int err = 0;         // the errno if it is not (or no longer) retried; 0 = success
};
// From a curl result code (CURLcode as int); CURLE_OK → success.
Verdict ClassifyCurl(int curl_code);
// From an HTTP status and the S3 error code of its body (may be empty):
// by the code where s3_client.cc's table has it, else by the status.
Verdict ClassifyHttp(long status, std::string_view error_code);

// The backoff before attempt `attempt` (1 = the first retry): a uniform
// draw in [0, min(cap, base·2^(attempt-1))] milliseconds; `unit` in [0,1).
uint64_t BackoffMs(int attempt, uint64_t base_ms, uint64_t cap_ms, double unit);

// Hex SHA-256 of `data` (the payload hash SigV4 signs).
std::string Sha256Hex(std::string_view data);
// Base64 MD5 of `data` (the Content-MD5 that DeleteObjects requires).
std::string Md5Base64(std::string_view data);
// Parameters sorted by name, names and values encoded: the canonical query
// string of SigV4, which libcurl 7.88 signs as given.
std::string Query(std::vector<std::pair<std::string, std::string>> params);
// Runs fn(0..n-1) on up to `parallel` threads (the caller's included);
// stops handing out indices after the first error and returns it.
int RunParallel(size_t n, int parallel, const std::function<int(size_t)>& fn);

// One HTTP request, as the backend describes it.
struct Request {
  const char* method = "GET";
  std::string key;    // object key (prefix included); empty: the bucket
  std::string query;  // from Query()
  std::vector<std::string> headers;
  std::string_view body;                         // PUT/POST payload
  bool error_in_200 = false;                     // a 200 reply may still carry <Error> (copy, complete)
  std::vector<long> quiet;                       // final statuses that are expected: no error line
  bool quiet_all = false;                        // no error line whatever happens (the caller reports)
  std::function<int(const char*, size_t)> sink;  // 2xx body bytes go here (0 or an errno)
  std::function<void()> on_retry;                // resets what the sink wrote
  const std::function<bool()>* cancelled = nullptr;
};

struct Response {
  long status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string error_code, error_message;

  std::string Header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return {};
  }
};

// Owns idle curl handles; connections stay with them between requests.
class EasyPool {
 public:
  EasyPool() = default;
  EasyPool(const EasyPool&) = delete;
  EasyPool& operator=(const EasyPool&) = delete;
  ~EasyPool();
  CURL* Acquire();
  void Release(CURL* h);

 private:
  Mutex mu_;  // a leaf
  std::vector<CURL*> free_ GUARDED_BY(mu_);
};

class Client {
 public:
  // `cfg` must outlive the client (the backend owns both).
  explicit Client(const S3Config& cfg) : cfg_(cfg), sigv4_("aws:amz:" + cfg.region + ":s3") {}
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request, retrying transient failures (up to
  // cfg.max_attempts, backoff with full jitter from cfg.retry_base_ms). On
  // failure *out holds the last attempt's status and error code, and one
  // line is logged (unless the status is in req.quiet, or req.quiet_all).
  // Errors: the verdict's errno; EIO once retries are spent; ECANCELED.
  [[nodiscard]] Status Perform(const Request& req, std::string_view what, Response* out);

 private:
  std::string Url(const std::string& key, const std::string& query) const;
  static double Unit();
  // Sleeps `ms`, polling `cancelled`; false when cancelled.
  static bool Sleep(uint64_t ms, const std::function<bool()>* cancelled);

  const S3Config& cfg_;
  const std::string sigv4_;
  EasyPool pool_;
};

}  // namespace ckpt::backend::s3
