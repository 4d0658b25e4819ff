// etcd_client.h — a client of etcd v3 (--cluster-store etcd://...) over
// etcd's JSON gateway (/v3/kv/*, /v3/lease/*, /v3/watch, /v3/auth/*) and the
// libcurl the S3 backend already links. docs/architecture.md "Libraries"
// says why not gRPC: Debian ships no C++ etcd client and no etcd .proto
// files, so gRPC would mean vendoring etcd's API definitions and their
// generated code, for a few small requests a second per node.
//
// Keys and values are bytes (the gateway carries them base64-encoded);
// int64 fields come as JSON strings. Each request goes to the endpoint that
// answered last and, on a connection failure, to the next: a client of a
// 3-member etcd keeps working while one member is down. With a user, the
// client authenticates (/v3/auth/authenticate) and sends the token; an
// expired token is renewed once per request. The password and TLS key are
// never logged.
//
// Thread-safety: every method may be called from any thread; a Watch runs on
// a thread of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <expected>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/result.h"

typedef void CURL;
typedef void CURLM;

namespace ckpt::fs::etcd {

// "etcd://HOST:PORT[,HOST:PORT...]" (http) or "etcds://..." (https): the
// endpoints as URLs ("http://HOST:PORT"), or why the text is not one.
std::expected<std::vector<std::string>, std::string> ParseStoreUrl(const std::string& s);

// The end of the range of every key that starts with `prefix`.
std::string PrefixEnd(const std::string& prefix);

struct Options {
  std::vector<std::string> endpoints;        // from ParseStoreUrl
  std::string user, password;                // auth (password read from a file by the caller)
  std::string ca_file, cert_file, key_file;  // TLS (etcds://)
  int64_t timeout_ms = 5000;                 // one request, connection included
};

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision the result is of
  std::vector<KeyValue> kvs;
  bool more = false;
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<KeyValue> kvs;  // on failure: the key compared, as the store holds it (if it exists)
};

struct WatchEvent {
  bool deleted = false;
  KeyValue kv;
};

class Client {
 public:
  explicit Client(Options o);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Errors: ECONNREFUSED (no endpoint answers), ETIMEDOUT, EACCES (auth),
  // E2BIG (request too large), EIO (anything else); LastError() says more.
  // `timeout_ms` as for Txn; `revision` (0: the latest) reads the keys as
  // they were at that revision (one consistent view over several reads).
  Result<RangeResult> Range(const std::string& key, const std::string& range_end = "", int64_t limit = 0,
                            int64_t timeout_ms = 0, int64_t revision = 0);
  // The keys of [key, range_end) put at `min_mod_revision` or later (what
  // changed since a revision: O(changes) sent back — etcd itself still
  // reads the whole range and filters it, so keep such ranges small).
  Result<RangeResult> RangeSince(const std::string& key, const std::string& range_end, int64_t min_mod_revision);
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);  // the revision
  Result<int64_t> Delete(const std::string& key, const std::string& range_end = "");         // keys deleted
  // key = value (with `lease`) if the key does not exist.
  Result<TxnResult> PutIfAbsent(const std::string& key, const std::string& value, int64_t lease);
  // key = value (with `lease`) if guard_key holds guard_value.
  Result<TxnResult> PutIfEqual(const std::string& key, const std::string& value, int64_t lease,
                               const std::string& guard_key, const std::string& guard_value);
  // key = value (no lease) while guard_key's mod_revision is `guard_rev`
  // (0: while it does not exist).
  Result<TxnResult> PutIfModRevision(const std::string& key, const std::string& value, const std::string& guard_key,
                                     int64_t guard_rev);
  // key = value (no lease) while each (guard key, mod_revision) holds (a
  // mod_revision 0: while that key does not exist); succeeded false if one
  // does not.
  Result<TxnResult> PutIfRevisions(const std::string& key, const std::string& value,
                                   const std::vector<std::pair<std::string, int64_t>>& guards);
  // Puts and deletes in one transaction (at most 128: etcd's limit).
  struct Op {
    bool del = false;
    std::string key{}, range_end{};  // range_end: deletes only ("" : the key alone)
    std::string value{};
    int64_t lease = 0;
    // A delete of one key only while its mod_revision is this one (0:
    // whatever it is): a key another writer put since stays. Each such
    // delete is a transaction nested in this one (etcd >= 3.3), decided on
    // its own: the others go on whether it deletes or not.
    int64_t if_mod_revision = 0;
    // A put only while guard_key holds guard_value ("" : whatever), also
    // decided on its own (the others go on either way).
    std::string guard_key{}, guard_value{};
  };
  // The revision. `timeout_ms` (0: Options::timeout_ms) bounds each
  // endpoint's exchange: a caller that must not wait long passes less.
  Result<int64_t> Txn(const std::vector<Op>& ops, int64_t timeout_ms = 0);
  // Leases: a new one of `ttl_s` seconds (its id); a keep-alive (the TTL
  // left: 0 if the lease expired); a revocation (its keys are deleted).
  Result<int64_t> Grant(int64_t ttl_s);
  Result<int64_t> KeepAlive(int64_t id);
  Status Revoke(int64_t id);

  // The last failure, as one line without credentials ("" : none yet).
  std::string LastError();
  // False once a request failed on every endpoint, until one answers
  // again (a keep-alive, a heartbeat): callers on a reply's path skip the
  // store meanwhile instead of waiting for its timeouts each time.
  bool reachable() const { return !unreachable_.load(std::memory_order_acquire); }

  // The whole exchange with one endpoint: POST `path` with the JSON `body`,
  // the reply's body bytes to `sink` (a stream: called as they come; false
  // stops the transfer). For Watch; the methods above use Call. Driven by
  // `multi` (the watch's), so that curl_multi_wakeup ends a wait at once
  // once `stop` is set (curl's progress callback runs once a second on an
  // idle stream: each watch held an unmount up to a second).
  int Stream(size_t endpoint, const std::string& path, const std::string& body,
             const std::function<bool(const char*, size_t)>& sink, const std::atomic<bool>* stop, CURLM* multi);
  size_t endpoint_count() const { return opt_.endpoints.size(); }
  // The endpoint that answered last (where a new watch starts).
  size_t current_endpoint() const {
    MutexLock lk(&mu_);
    return current_;
  }

 private:
  // POST `path` with `body`; the reply's JSON text. Fails over endpoints.
  Result<std::string> Call(const std::string& path, const std::string& body, int64_t timeout_ms = 0);
  int Perform(CURL* h, size_t endpoint, const std::string& path, const std::string& body, std::string* out,
              long* status, const std::function<bool(const char*, size_t)>* sink, const std::atomic<bool>* stop,
              int64_t timeout_ms = 0, CURLM* multi = nullptr);
  Status Authenticate(size_t endpoint) EXCLUDES(mu_);
  CURL* TakeHandle() EXCLUDES(mu_);
  void GiveHandle(CURL* h) EXCLUDES(mu_);
  void SetError(std::string e) EXCLUDES(mu_);

  const Options opt_;
  mutable Mutex mu_;
  std::vector<CURL*> free_ GUARDED_BY(mu_);
  size_t current_ GUARDED_BY(mu_) = 0;  // the endpoint that answered last
  std::string token_ GUARDED_BY(mu_);   // auth token ("" : none)
  std::string error_ GUARDED_BY(mu_);
  std::atomic<bool> unreachable_{false};
};

// A watch of [key, range_end) from `start_revision` (0: now), on a thread of
// its own: `on_events` gets each batch of events with the revision it
// brings the watcher to; after a broken stream the watch is made again from
// the next revision, on the next endpoint (`on_error` is told, once per
// failure episode). If the store compacted past that revision, `on_reset`
// is called (the caller reads the range again) and the watch restarts at
// the store's revision.
class Watch {
 public:
  using Events = std::function<void(const std::vector<WatchEvent>&, int64_t revision)>;
  Watch(Client* c, std::string key, std::string range_end, int64_t start_revision, Events on_events,
        std::function<void(const std::string&)> on_error, std::function<void()> on_reset);
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  void Stop();

  // Tests: watches made after this on a key that starts with `prefix`
  // open their stream `ms` later than asked (a stream slow to connect, as
  // on a loaded machine); an empty prefix turns it off.
  static void DelayConnectForTest(std::string prefix, int ms);

 private:
  void Run();
  Client* const c_;
  const std::string key_, end_;
  std::atomic<int64_t> next_;
  const Events on_events_;
  const std::function<void(const std::string&)> on_error_;
  const std::function<void()> on_reset_;
  std::atomic<bool> stop_{false};
  CURLM* const multi_;  // drives the stream; Stop wakes it
  std::thread t_;
};

}  // namespace ckpt::fs::etcd
