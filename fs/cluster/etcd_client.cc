// etcd_client.cc — etcd v3 over its JSON gateway (etcd_client.h).
#include "fs/cluster/etcd_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/failpoint.h"
#include "common/log.h"

namespace ckpt::fs::etcd {

using Json = nlohmann::json;

namespace {

constexpr size_t kMaxEndpoints = 16;
constexpr size_t kMaxReplyBytes = 64 << 20;  // a reply larger than this is no etcd reply

std::string B64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::optional<std::string> Unb64(const std::string& s) {
  if (s.size() % 4 != 0) return std::nullopt;
  std::string out(3 * (s.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return std::nullopt;
  size_t pad = 0;
  if (!s.empty() && s.back() == '=') pad++;
  if (s.size() >= 2 && s[s.size() - 2] == '=') pad++;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// An int64 of the gateway: a JSON string (or a number), absent = 0.
int64_t I64(const Json& j, const char* f) {
  auto it = j.find(f);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

KeyValue ParseKv(const Json& j) {
  KeyValue kv;
  auto field = [&](const char* f) {
    auto it = j.find(f);
    if (it == j.end()) return std::string();
    auto d = Unb64(it->get<std::string>());
    if (!d) throw std::runtime_error("a key or value that is not base64");
    return *d;
  };
  kv.key = field("key");
  kv.value = field("value");
  kv.create_revision = I64(j, "create_revision");
  kv.mod_revision = I64(j, "mod_revision");
  kv.version = I64(j, "version");
  kv.lease = I64(j, "lease");
  return kv;
}

std::vector<KeyValue> ParseKvs(const Json& j) {
  std::vector<KeyValue> out;
  if (auto it = j.find("kvs"); it != j.end())
    for (const Json& kv : *it) out.push_back(ParseKv(kv));
  return out;
}

int64_t Revision(const Json& j) {
  auto it = j.find("header");
  return it == j.end() ? 0 : I64(*it, "revision");
}

struct Transfer {
  std::string* out;
  const std::function<bool(const char*, size_t)>* sink;
  const std::atomic<bool>* stop;
  bool too_big = false;
  bool cut = false;  // the fault etcd.cut stopped it
};

size_t OnBody(char* p, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  size_t len = size * n;
  if (t->sink) return (*t->sink)(p, len) ? len : 0;
  if (t->out->size() + len > kMaxReplyBytes) {
    t->too_big = true;
    return 0;
  }
  t->out->append(p, len);
  return len;
}

// One transfer through `m`, waiting in curl_multi_poll (which
// curl_multi_wakeup ends) until it is done or `stop` is set.
CURLcode PerformMulti(CURLM* m, CURL* h, const std::atomic<bool>* stop) {
  if (curl_multi_add_handle(m, h) != CURLM_OK) return CURLE_FAILED_INIT;
  CURLcode rc = CURLE_ABORTED_BY_CALLBACK;
  for (;;) {
    int running = 0;
    if (curl_multi_perform(m, &running) != CURLM_OK) {
      rc = CURLE_RECV_ERROR;
      break;
    }
    int left = 0;
    bool done = false;
    while (CURLMsg* msg = curl_multi_info_read(m, &left))
      if (msg->msg == CURLMSG_DONE && msg->easy_handle == h) rc = msg->data.result, done = true;
    if (done || running == 0 || (stop && stop->load())) break;
    if (curl_multi_poll(m, nullptr, 0, 1000, nullptr) != CURLM_OK) {
      rc = CURLE_RECV_ERROR;
      break;
    }
  }
  curl_multi_remove_handle(m, h);
  return rc;
}

int OnProgress(void* ud, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(ud);
  // Tests: a node cut off from etcd (CKPTFS_FAULT=etcd.cut:FILE) loses its
  // open watches too, as a partition would end them.
  if (FAULT("etcd.cut")) {
    t->cut = true;
    return 1;
  }
  return t->stop && t->stop->load() ? 1 : 0;
}

bool ValidHost(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  for (char c : h)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != ':' && c != '[' && c != ']')
      return false;
  return true;
}

}  // namespace

std::expected<std::vector<std::string>, std::string> ParseStoreUrl(const std::string& s) {
  std::string scheme;
  std::string rest;
  if (s.rfind("etcd://", 0) == 0) {
    scheme = "http://";
    rest = s.substr(7);
  } else if (s.rfind("etcds://", 0) == 0) {
    scheme = "https://";
    rest = s.substr(8);
  } else {
    return std::unexpected("'" + s + "' is no cluster store: etcd://HOST:PORT[,HOST:PORT...] or etcds://...");
  }
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= rest.size()) {
    size_t comma = rest.find(',', at);
    std::string ep = rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t colon = ep.rfind(':');
    if (ep.empty() || colon == std::string::npos || colon == 0)
      return std::unexpected("cluster store endpoint '" + ep + "' is not HOST:PORT");
    std::string host = ep.substr(0, colon), port = ep.substr(colon + 1);
    if (!ValidHost(host)) return std::unexpected("cluster store endpoint '" + ep + "': bad host name");
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return std::unexpected("cluster store endpoint '" + ep + "': the port must be 1-65535");
    out.push_back(scheme + ep);
    if (out.size() > kMaxEndpoints) return std::unexpected("cluster store: more than 16 endpoints");
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      c++;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Client::Client(Options o) : opt_(std::move(o)) { curl_global_init(CURL_GLOBAL_DEFAULT); }

Client::~Client() {
  MutexLock lk(&mu_);
  for (CURL* h : free_) curl_easy_cleanup(h);
}

CURL* Client::TakeHandle() {
  {
    MutexLock lk(&mu_);
    if (!free_.empty()) {
      CURL* h = free_.back();
      free_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void Client::GiveHandle(CURL* h) {
  curl_easy_reset(h);
  MutexLock lk(&mu_);
  free_.push_back(h);
}

void Client::SetError(std::string e) {
  MutexLock lk(&mu_);
  error_ = std::move(e);
}

std::string Client::LastError() {
  MutexLock lk(&mu_);
  return error_;
}

int Client::Perform(CURL* h, size_t endpoint, const std::string& path, const std::string& body, std::string* out,
                    long* status, const std::function<bool(const char*, size_t)>* sink, const std::atomic<bool>* stop,
                    int64_t timeout_ms, CURLM* multi) {
  if (timeout_ms <= 0) timeout_ms = opt_.timeout_ms;
  const std::string url = opt_.endpoints[endpoint] + path;
  auto cut = [&] {
    SetError(fmt::format("{}: unreachable (fault etcd.cut)", opt_.endpoints[endpoint]));
    return ECONNREFUSED;
  };
  if (FAULT("etcd.cut")) return cut();
  std::string token;
  {
    MutexLock lk(&mu_);
    token = token_;
  }
  curl_slist* hdrs = curl_slist_append(nullptr, "Content-Type: application/json");
  std::string auth = "Authorization: " + token;
  if (!token.empty()) hdrs = curl_slist_append(hdrs, auth.c_str());
  // A stream (a watch) requires a leader (etcd's "hasleader" metadata,
  // through the gateway): a member cut off from the others' majority ends
  // it with "no leader" and the watch moves to the next endpoint, where it
  // kept it open and silent for as long as the partition lasted (etcd-io/etcd#7593).
  if (sink) hdrs = curl_slist_append(hdrs, "Grpc-Metadata-Hasleader: true");
  Transfer t{out, sink, stop};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, std::min<int64_t>(timeout_ms, 2000));
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
  if (sink) {
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, OnProgress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  } else {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  }
  if (!opt_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, opt_.ca_file.c_str());
  if (!opt_.cert_file.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, opt_.cert_file.c_str());
  if (!opt_.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, opt_.key_file.c_str());
  CURLcode rc = multi ? PerformMulti(multi, h, stop) : curl_easy_perform(h);
  curl_slist_free_all(hdrs);
  *status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
  if (t.too_big) {
    SetError(fmt::format("{}: a reply of more than {} MiB", opt_.endpoints[endpoint], kMaxReplyBytes >> 20));
    return EIO;
  }
  if (t.cut) return cut();
  if (rc != CURLE_OK) {
    if (stop && stop->load()) return ECANCELED;
    SetError(fmt::format("{}: {}", opt_.endpoints[endpoint], curl_easy_strerror(rc)));
    return rc == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT : ECONNREFUSED;
  }
  return 0;
}

Status Client::Authenticate(size_t endpoint) {
  Json req = {{"name", opt_.user}, {"password", opt_.password}};
  CURL* h = TakeHandle();
  std::string out;
  long status = 0;
  {
    MutexLock lk(&mu_);
    token_.clear();
  }
  int e = Perform(h, endpoint, "/v3/auth/authenticate", req.dump(), &out, &status, nullptr, nullptr);
  GiveHandle(h);
  if (e) return Err(e);
  try {
    Json j = Json::parse(out);
    if (status == 200 && j.contains("token")) {
      MutexLock lk(&mu_);
      token_ = j.at("token").get<std::string>();
      return {};
    }
    SetError(fmt::format("{}: authentication of user '{}' failed: {}", opt_.endpoints[endpoint], opt_.user,
                         j.value("message", j.value("error", std::string("HTTP ") + std::to_string(status)))));
  } catch (const std::exception&) {
    SetError(fmt::format("{}: authentication: HTTP {} without JSON", opt_.endpoints[endpoint], status));
  }
  return Err(EACCES);
}

Result<std::string> Client::Call(const std::string& path, const std::string& body, int64_t timeout_ms) {
  size_t first;
  {
    MutexLock lk(&mu_);
    first = current_;
  }
  int last = ECONNREFUSED;
  for (size_t i = 0; i < opt_.endpoints.size(); i++) {
    const size_t ep = (first + i) % opt_.endpoints.size();
    bool need_auth;
    {
      MutexLock lk(&mu_);
      need_auth = !opt_.user.empty() && token_.empty();
    }
    if (need_auth) {
      if (auto st = Authenticate(ep); !st) {
        last = st.error();
        if (last == EACCES) return Err(EACCES);
        continue;
      }
    }
    for (int attempt = 0; attempt < 2; attempt++) {
      CURL* h = TakeHandle();
      std::string out;
      long status = 0;
      int e = Perform(h, ep, path, body, &out, &status, nullptr, nullptr, timeout_ms);
      GiveHandle(h);
      if (e) {
        last = e;
        break;  // the next endpoint
      }
      if (status < 500) unreachable_.store(false, std::memory_order_release);
      {
        MutexLock lk(&mu_);
        current_ = ep;
      }
      if (status == 200) return out;
      std::string msg;
      try {
        Json j = Json::parse(out);
        msg = j.value("message", j.value("error", std::string()));
      } catch (const std::exception&) {
        msg = "HTTP " + std::to_string(status);
      }
      // An expired or missing token: authenticate again, once.
      if (!opt_.user.empty() && attempt == 0 &&
          (msg.find("auth token") != std::string::npos || msg.find("user name is empty") != std::string::npos)) {
        if (auto st = Authenticate(ep); !st) return Err(st.error());
        continue;
      }
      SetError(fmt::format("{}{}: {}", opt_.endpoints[ep], path, msg.empty() ? "HTTP " + std::to_string(status) : msg));
      if (msg.find("too large") != std::string::npos) return Err(E2BIG);
      if (msg.find("permission denied") != std::string::npos || status == 401 || status == 403) return Err(EACCES);
      // Not the leader, no leader, a member that is stopping: the next one.
      if (status >= 500) {
        last = EIO;
        break;
      }
      return Err(EIO);
    }
  }
  // No endpoint answered (or each said it cannot serve: no leader).
  if (last != EACCES) unreachable_.store(true, std::memory_order_release);
  return Err(last);
}

template <class F>
static auto Parsed(Client* c, const Result<std::string>& r, F f) -> Result<decltype(f(Json()))> {
  if (!r) return Err(r.error());
  try {
    return f(Json::parse(*r));
  } catch (const std::exception& e) {
    LOG_DEBUG("etcd: a reply not understood: {}", e.what());
    return Err(EIO);
  }
}

// The body of a /v3/kv/range request for [key, range_end).
static Json RangeRequest(const std::string& key, const std::string& range_end) {
  Json req = {{"key", B64(key)}};
  if (!range_end.empty()) req["range_end"] = B64(range_end);
  return req;
}

static RangeResult ParseRange(const Json& j) {
  RangeResult r;
  r.revision = Revision(j);
  r.kvs = ParseKvs(j);
  r.more = j.value("more", false);
  return r;
}

Result<RangeResult> Client::Range(const std::string& key, const std::string& range_end, int64_t limit,
                                  int64_t timeout_ms, int64_t revision) {
  Json req = RangeRequest(key, range_end);
  if (limit > 0) req["limit"] = std::to_string(limit);
  if (revision > 0) req["revision"] = std::to_string(revision);
  return Parsed(this, Call("/v3/kv/range", req.dump(), timeout_ms), ParseRange);
}

Result<RangeResult> Client::RangeSince(const std::string& key, const std::string& range_end,
                                       int64_t min_mod_revision) {
  Json req = RangeRequest(key, range_end);
  req["min_mod_revision"] = std::to_string(min_mod_revision);
  return Parsed(this, Call("/v3/kv/range", req.dump()), ParseRange);
}

Result<int64_t> Client::Put(const std::string& key, const std::string& value, int64_t lease) {
  Json req = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease) req["lease"] = std::to_string(lease);
  return Parsed(this, Call("/v3/kv/put", req.dump()), [](const Json& j) { return Revision(j); });
}

Result<int64_t> Client::Delete(const std::string& key, const std::string& range_end) {
  Json req = {{"key", B64(key)}};
  if (!range_end.empty()) req["range_end"] = B64(range_end);
  return Parsed(this, Call("/v3/kv/deleterange", req.dump()), [](const Json& j) { return I64(j, "deleted"); });
}

static Json PutOp(const std::string& key, const std::string& value, int64_t lease) {
  Json put = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}

static TxnResult ParseTxn(const Json& j) {
  TxnResult r;
  r.succeeded = j.value("succeeded", false);
  r.revision = Revision(j);
  if (auto it = j.find("responses"); it != j.end())
    for (const Json& op : *it)
      if (auto rr = op.find("response_range"); rr != op.end())
        for (KeyValue& kv : ParseKvs(*rr)) r.kvs.push_back(std::move(kv));
  return r;
}

Result<TxnResult> Client::PutIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  Json req = {{"compare",
               Json::array({{{"key", B64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
              {"success", Json::array({PutOp(key, value, lease)})},
              {"failure", Json::array({{{"request_range", {{"key", B64(key)}}}}})}};
  return Parsed(this, Call("/v3/kv/txn", req.dump()), ParseTxn);
}

Result<TxnResult> Client::PutIfModRevision(const std::string& key, const std::string& value,
                                           const std::string& guard_key, int64_t guard_rev) {
  Json req = {{"compare", Json::array({{{"key", B64(guard_key)},
                                        {"target", "MOD"},
                                        {"result", "EQUAL"},
                                        {"mod_revision", std::to_string(guard_rev)}}})},
              {"success", Json::array({PutOp(key, value, 0)})},
              {"failure", Json::array({{{"request_range", {{"key", B64(guard_key)}}}}})}};
  return Parsed(this, Call("/v3/kv/txn", req.dump()), ParseTxn);
}

Result<TxnResult> Client::PutIfRevisions(const std::string& key, const std::string& value,
                                         const std::vector<std::pair<std::string, int64_t>>& guards) {
  Json cmp = Json::array();
  for (const auto& [k, rev] : guards)
    cmp.push_back({{"key", B64(k)}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", std::to_string(rev)}});
  Json req = {{"compare", cmp}, {"success", Json::array({PutOp(key, value, 0)})}};
  return Parsed(this, Call("/v3/kv/txn", req.dump()), ParseTxn);
}

Result<TxnResult> Client::PutIfEqual(const std::string& key, const std::string& value, int64_t lease,
                                     const std::string& guard_key, const std::string& guard_value) {
  Json req = {
      {"compare",
       Json::array({{{"key", B64(guard_key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", B64(guard_value)}}})},
      {"success", Json::array({PutOp(key, value, lease)})},
      {"failure", Json::array({{{"request_range", {{"key", B64(guard_key)}}}}})}};
  return Parsed(this, Call("/v3/kv/txn", req.dump()), ParseTxn);
}

Result<int64_t> Client::Txn(const std::vector<Op>& ops, int64_t timeout_ms) {
  Json success = Json::array();
  for (const Op& op : ops) {
    if (!op.del && op.guard_key.empty()) {
      success.push_back(PutOp(op.key, op.value, op.lease));
      continue;
    }
    if (!op.del) {
      Json cmp = {{"key", B64(op.guard_key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", B64(op.guard_value)}};
      success.push_back(
          {{"request_txn",
            {{"compare", Json::array({cmp})}, {"success", Json::array({PutOp(op.key, op.value, op.lease)})}}}});
      continue;
    }
    Json d = {{"key", B64(op.key)}};
    if (!op.range_end.empty()) d["range_end"] = B64(op.range_end);
    Json del = {{"request_delete_range", d}};
    if (op.if_mod_revision == 0) {
      success.push_back(std::move(del));
      continue;
    }
    Json cmp = {{"key", B64(op.key)},
                {"target", "MOD"},
                {"result", "EQUAL"},
                {"mod_revision", std::to_string(op.if_mod_revision)}};
    success.push_back({{"request_txn", {{"compare", Json::array({cmp})}, {"success", Json::array({del})}}}});
  }
  Json req = {{"success", success}};
  return Parsed(this, Call("/v3/kv/txn", req.dump(), timeout_ms), [](const Json& j) { return Revision(j); });
}

Result<int64_t> Client::Grant(int64_t ttl_s) {
  Json req = {{"TTL", std::to_string(ttl_s)}};
  return Parsed(this, Call("/v3/lease/grant", req.dump()), [](const Json& j) {
    if (j.contains("error") && !j.at("error").get<std::string>().empty())
      throw std::runtime_error(j.at("error").get<std::string>());
    return I64(j, "ID");
  });
}

Result<int64_t> Client::KeepAlive(int64_t id) {
  Json req = {{"ID", std::to_string(id)}};
  return Parsed(this, Call("/v3/lease/keepalive", req.dump()), [](const Json& j) {
    // One message of the stream; an expired lease has no TTL (0).
    const Json& r = j.contains("result") ? j.at("result") : j;
    return I64(r, "TTL");
  });
}

Status Client::Revoke(int64_t id) {
  Json req = {{"ID", std::to_string(id)}};
  auto r = Call("/v3/lease/revoke", req.dump());
  if (!r) return Err(r.error());
  return {};
}

int Client::Stream(size_t endpoint, const std::string& path, const std::string& body,
                   const std::function<bool(const char*, size_t)>& sink, const std::atomic<bool>* stop, CURLM* multi) {
  bool need_auth;
  {
    MutexLock lk(&mu_);
    need_auth = !opt_.user.empty() && token_.empty();
  }
  if (need_auth)
    if (auto st = Authenticate(endpoint); !st) return st.error();
  CURL* h = curl_easy_init();
  std::string unused;
  long status = 0;
  int e = Perform(h, endpoint, path, body, &unused, &status, &sink, stop, 0, multi);
  curl_easy_cleanup(h);
  return e;
}

Watch::Watch(Client* c, std::string key, std::string range_end, int64_t start_revision, Events on_events,
             std::function<void(const std::string&)> on_error, std::function<void()> on_reset)
    : c_(c),
      key_(std::move(key)),
      end_(std::move(range_end)),
      next_(start_revision),
      on_events_(std::move(on_events)),
      on_error_(std::move(on_error)),
      on_reset_(std::move(on_reset)),
      multi_(curl_multi_init()) {
  t_ = std::thread([this] { Run(); });
}

Watch::~Watch() {
  Stop();
  if (multi_) curl_multi_cleanup(multi_);
}

void Watch::Stop() {
  stop_ = true;
  if (multi_) curl_multi_wakeup(multi_);
  if (t_.joinable()) t_.join();
}

namespace {
Mutex g_delay_mu;
std::string g_delay_prefix GUARDED_BY(g_delay_mu);
int g_delay_ms GUARDED_BY(g_delay_mu) = 0;
}  // namespace

void Watch::DelayConnectForTest(std::string prefix, int ms) {
  MutexLock lk(&g_delay_mu);
  g_delay_prefix = std::move(prefix);
  g_delay_ms = ms;
}

void Watch::Run() {
  int delay_ms = 0;
  {
    MutexLock lk(&g_delay_mu);
    if (!g_delay_prefix.empty() && key_.starts_with(g_delay_prefix)) delay_ms = g_delay_ms;
  }
  for (int i = 0; i < delay_ms / 10 && !stop_; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  size_t ep = c_->current_endpoint() % std::max<size_t>(c_->endpoint_count(), 1);
  bool failing = false;
  while (!stop_) {
    Json create = {{"key", B64(key_)}};
    if (!end_.empty()) create["range_end"] = B64(end_);
    if (next_ > 0) create["start_revision"] = std::to_string(next_.load());
    const std::string body = Json{{"create_request", create}}.dump();
    std::string buf;
    bool reset = false, got = false;
    std::string problem;
    auto sink = [&](const char* p, size_t n) {
      buf.append(p, n);
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
        try {
          Json j = Json::parse(line);
          if (j.contains("error")) {
            problem = j.at("error").dump();
            return false;
          }
          const Json& r = j.at("result");
          got = true;
          if (I64(r, "compact_revision") > 0) {
            reset = true;
            next_ = I64(r, "compact_revision");
            return false;
          }
          if (r.value("canceled", false)) {
            problem = "the watch was cancelled: " + r.value("cancel_reason", std::string());
            return false;
          }
          std::vector<WatchEvent> evs;
          if (auto it = r.find("events"); it != r.end())
            for (const Json& ev : *it)
              evs.push_back({ev.value("type", std::string()) == "DELETE", ParseKv(ev.at("kv"))});
          const int64_t rev = Revision(r);
          if (!evs.empty()) next_ = std::max(next_.load(), evs.back().kv.mod_revision + 1);
          else if (next_ == 0 && rev > 0) next_ = rev + 1;
          if (!evs.empty() || r.value("created", false)) on_events_(evs, rev);
          if (failing) {
            failing = false;
            on_error_("");
          }
        } catch (const std::exception& e) {
          problem = std::string("a watch reply not understood: ") + e.what();
          return false;
        }
      }
      return true;
    };
    int e = c_->Stream(ep, "/v3/watch", body, sink, &stop_, multi_);
    if (stop_) break;
    if (reset) {
      LOG_WARN("etcd: a watch fell behind the store's compaction; reading again from revision {}", next_.load());
      on_reset_();
      continue;
    }
    if (!failing) {
      failing = true;
      on_error_(problem.empty() ? (e ? c_->LastError() : "the watch stream ended") : problem);
    }
    (void)got;
    ep = (ep + 1) % c_->endpoint_count();
    for (int i = 0; i < 10 && !stop_; i++) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace ckpt::fs::etcd
