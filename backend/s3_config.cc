// s3_config.cc — LoadS3Config: environment variables and ~/.aws files.
//
// The files are read with plain ifstreams; a missing file is not an error,
// only the absence of credentials everywhere is.
#include "backend/s3_config.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/config.h"
#include "common/log.h"

namespace ckpt::backend {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string r(s);
  for (char& c : r)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return r;
}

// Reads a whole file; false when it cannot be opened.
bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

std::string HomeFile(const char* env_override, const char* name) {
  std::string p = Env(env_override);
  if (!p.empty()) return p;
  std::string home = Env("HOME");
  return (home.empty() ? std::string(".") : home) + "/.aws/" + name;
}

// The section of `ini` for `profile`, or nullptr.
const std::map<std::string, std::string>* Section(const s3::IniFile& ini, const std::string& name) {
  auto it = ini.find(name);
  return it == ini.end() ? nullptr : &it->second;
}

std::string Get(const std::map<std::string, std::string>* sec, const char* key) {
  if (!sec) return {};
  auto it = sec->find(key);
  return it == sec->end() ? std::string() : it->second;
}

// Bucket names as S3 allows them (3-63 of [a-z0-9.-]); upper case and '_'
// are let through for older stores that accept them, '/' and spaces not.
bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 255) return false;
  for (char c : b) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

// Reads an integer tuning variable in [lo, hi] into *out (unchanged when
// unset). False, with *msg set, when it is set to anything else.
bool EnvInt(const char* name, long lo, long hi, int* out, std::string* msg) {
  std::string v = Env(name);
  if (v.empty()) return true;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || n < lo || n > hi) {
    *msg = std::string(name) + "='" + v + "' is not a number from " + std::to_string(lo) + " to " + std::to_string(hi);
    return false;
  }
  *out = static_cast<int>(n);
  return true;
}

}  // namespace

namespace s3 {

IniFile ParseIni(std::string_view text) {
  IniFile ini;
  std::string section;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = Trim(text.substr(pos, nl == std::string_view::npos ? text.size() - pos : nl - pos));
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      size_t close = line.find(']');
      if (close == std::string_view::npos) continue;
      // "[profile  x]" → "profile x": the AWS CLI allows extra spaces.
      std::string_view inner = Trim(line.substr(1, close - 1));
      if (inner.starts_with("profile ") || inner.starts_with("profile\t"))
        section = "profile " + std::string(Trim(inner.substr(8)));
      else section = std::string(inner);
      ini[section];
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || section.empty()) continue;
    ini[section][Lower(Trim(line.substr(0, eq)))] = std::string(Trim(line.substr(eq + 1)));
  }
  return ini;
}

Result<std::string> NormalizePrefix(std::string_view prefix) {
  while (!prefix.empty() && prefix.front() == '/') prefix.remove_prefix(1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  if (prefix.empty()) return std::string();
  size_t pos = 0;
  for (;;) {
    size_t slash = prefix.find('/', pos);
    std::string_view comp = prefix.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    if (comp.empty() || comp == "." || comp == ".." || comp.find('\0') != std::string_view::npos) return Err(EINVAL);
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }
  return std::string(prefix);
}

}  // namespace s3

Result<S3Config> LoadS3Config(const std::string& bucket, const std::string& prefix,
                              const std::string& endpoint_override, std::string* why) {
  auto fail = [why](int e, const std::string& msg) {
    LOG_ERROR("s3 config: {}", msg);
    if (why) *why = msg;
    return Err(e);
  };
  S3Config cfg;
  // s3://KEY:SECRET@bucket: ParseBackendUrl refuses it first; never echo it.
  if (bucket.find('@') != std::string::npos || bucket.find(':') != std::string::npos)
    return fail(EINVAL, std::string(kCredentialsInUrl));
  if (!ValidBucket(bucket)) return fail(EINVAL, "invalid bucket name '" + bucket + "'");
  cfg.bucket = bucket;
  auto p = s3::NormalizePrefix(prefix);
  if (!p) return fail(EINVAL, "invalid prefix '" + prefix + "' (empty, '.' or '..' component)");
  cfg.prefix = *p;

  std::string profile = Env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::string cred_path = HomeFile("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  std::string conf_path = HomeFile("AWS_CONFIG_FILE", "config");
  std::string text;
  s3::IniFile creds_ini, conf_ini;
  if (ReadFile(cred_path, &text)) creds_ini = s3::ParseIni(text);
  if (ReadFile(conf_path, &text)) conf_ini = s3::ParseIni(text);
  const auto* cred_sec = Section(creds_ini, profile);
  const auto* conf_sec = Section(conf_ini, profile == "default" ? profile : "profile " + profile);
  if (!conf_sec && profile == "default") conf_sec = Section(conf_ini, "profile default");

  std::string ak = Env("AWS_ACCESS_KEY_ID"), sk = Env("AWS_SECRET_ACCESS_KEY");
  if (!ak.empty() && !sk.empty()) {
    cfg.access_key = ak;
    cfg.secret_key = sk;
    cfg.session_token = Env("AWS_SESSION_TOKEN");
  } else if (!Get(cred_sec, "aws_access_key_id").empty() && !Get(cred_sec, "aws_secret_access_key").empty()) {
    cfg.access_key = Get(cred_sec, "aws_access_key_id");
    cfg.secret_key = Get(cred_sec, "aws_secret_access_key");
    cfg.session_token = Get(cred_sec, "aws_session_token");
  } else if (!Get(conf_sec, "aws_access_key_id").empty() && !Get(conf_sec, "aws_secret_access_key").empty()) {
    cfg.access_key = Get(conf_sec, "aws_access_key_id");
    cfg.secret_key = Get(conf_sec, "aws_secret_access_key");
    cfg.session_token = Get(conf_sec, "aws_session_token");
  } else {
    return fail(EACCES, "no AWS credentials for s3://" + bucket +
                            ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put "
                            "aws_access_key_id/aws_secret_access_key in profile '" +
                            profile + "' of " + cred_path + " or " + conf_path);
  }

  cfg.region = Env("AWS_REGION");
  if (cfg.region.empty()) cfg.region = Env("AWS_DEFAULT_REGION");
  if (cfg.region.empty()) cfg.region = Get(conf_sec, "region");
  if (cfg.region.empty()) cfg.region = Get(cred_sec, "region");
  if (cfg.region.empty()) cfg.region = "us-east-1";

  cfg.endpoint = endpoint_override;
  if (cfg.endpoint.empty()) cfg.endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (cfg.endpoint.empty()) cfg.endpoint = Env("AWS_ENDPOINT_URL");
  if (cfg.endpoint.empty()) cfg.endpoint = Get(conf_sec, "endpoint_url");
  if (cfg.endpoint.empty()) cfg.endpoint = "https://s3." + cfg.region + ".amazonaws.com";
  while (!cfg.endpoint.empty() && cfg.endpoint.back() == '/') cfg.endpoint.pop_back();
  if (cfg.endpoint.find('@') != std::string::npos)  // user:password@host: never echo it
    return fail(EINVAL,
                "credentials in the S3 endpoint are not accepted; use AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY or a profile");
  if (!cfg.endpoint.starts_with("http://") && !cfg.endpoint.starts_with("https://"))
    return fail(EINVAL, "endpoint '" + cfg.endpoint + "' must start with http:// or https://");
  if (cfg.endpoint.find('/', cfg.endpoint.find("//") + 2) != std::string::npos ||
      cfg.endpoint.find('?') != std::string::npos)
    return fail(EINVAL, "endpoint '" + cfg.endpoint + "' must be scheme://host[:port] without a path");

  if (std::string v = Env("CKPTFS_S3_PART_SIZE"); !v.empty()) {
    auto sz = v.find('%') == std::string::npos ? ParseSize(v) : std::unexpected(std::string());
    if (!sz || *sz < (5ull << 20) || *sz > (5ull << 30))
      return fail(EINVAL, "CKPTFS_S3_PART_SIZE='" + v + "' is not a size from 5M to 5G");
    cfg.part_size = *sz;
  }
  std::string msg;
  if (!EnvInt("CKPTFS_S3_PARALLEL", 1, 64, &cfg.parallel, &msg) ||
      !EnvInt("CKPTFS_S3_LIST_MAX_KEYS", 1, 1000, &cfg.list_max_keys, &msg) ||
      !EnvInt("CKPTFS_S3_MAX_ATTEMPTS", 1, 100, &cfg.max_attempts, &msg))
    return fail(EINVAL, msg);
  if (std::string v = Env("CKPTFS_S3_ADDRESSING"); !v.empty()) {
    if (v != "path" && v != "virtual") return fail(EINVAL, "CKPTFS_S3_ADDRESSING='" + v + "' is not path or virtual");
    cfg.path_style = v == "path";
  }
  return cfg;
}

}  // namespace ckpt::backend
