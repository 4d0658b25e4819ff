// s3_config.h — where an S3 backend lives and how to sign for it: endpoint,
// region, bucket, prefix and credentials, gathered the way the AWS tools do.
//
// Precedence: the endpoint comes from --s3-endpoint, else AWS_ENDPOINT_URL,
// else https://s3.<region>.amazonaws.com. Credentials come from
// AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) when both
// are set, else from the profile (AWS_PROFILE, default "default") in
// ~/.aws/credentials (or AWS_SHARED_CREDENTIALS_FILE), else from the same
// profile in ~/.aws/config (or AWS_CONFIG_FILE), where it is spelled
// "[profile NAME]" except for "[default]". The region comes from
// AWS_REGION, AWS_DEFAULT_REGION, the profile's `region` in the config
// file, else us-east-1. What it gives up: no SSO, no assume-role, no
// credential_process, no instance metadata — static keys only.
//
// Tuning comes from the environment too, for stores (and tests) that want
// other values than the defaults below: CKPTFS_S3_PART_SIZE (a size such as
// 64M, 5 MiB to 5 GiB), CKPTFS_S3_PARALLEL (1-64), CKPTFS_S3_LIST_MAX_KEYS
// (1-1000), CKPTFS_S3_MAX_ATTEMPTS (1-100) and CKPTFS_S3_ADDRESSING
// (path | virtual).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/result.h"

namespace ckpt::backend {

struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  std::string region;
  std::string bucket;
  std::string prefix;  // no leading or trailing '/', may be empty
  std::string access_key, secret_key, session_token;
  bool path_style = true;            // https://host/bucket/key; false: https://bucket.host/key
  uint64_t part_size = 16ull << 20;  // staging part size; files up to this size are sent in one PUT
  int parallel = 4;                  // transfers in flight per Stage, Fetch, copy or listing step
  // Who stages: the same for every daemon of one state dir (one at a time),
  // different between mounts ("": this process alone). Check removes the
  // staged objects of this owner's earlier daemons at once, and others'
  // once kStaleStagedSec old (s3_backend.cc).
  std::string owner;

  // Tuning that tests lower; the defaults suit real stores.
  uint64_t multipart_copy_threshold = 256ull << 20;  // larger objects are copied part by part
  uint64_t max_copy_object_size = 5ull << 30;        // CopyObject's limit (S3: 5 GiB)
  int list_max_keys = 1000;                          // keys per ListObjectsV2 page
  int max_attempts = 5;                              // per request, then EIO
  int retry_base_ms = 100;                           // first backoff; doubles, with jitter, capped at 5 s
};

// Builds the configuration for s3://bucket/prefix. `endpoint_override`
// (--s3-endpoint) wins over AWS_ENDPOINT_URL when not empty.
// Errors: EINVAL (bad bucket, prefix, endpoint or tuning variable), EACCES
// (no credentials found; the message says where it looked). On error the
// message is logged and, when `why` is not null, stored there (one line, for
// the user). Never logs or returns a secret.
[[nodiscard]] Result<S3Config> LoadS3Config(const std::string& bucket, const std::string& prefix,
                                            const std::string& endpoint_override, std::string* why = nullptr);

namespace s3 {

// An INI file as the AWS tools read it: section → key → value, keys
// lower-cased, '#'/';' comment lines skipped, whitespace trimmed.
using IniFile = std::map<std::string, std::map<std::string, std::string>>;
IniFile ParseIni(std::string_view text);

// "a/b/" → "a/b"; EINVAL when a component is empty, "." or "..".
[[nodiscard]] Result<std::string> NormalizePrefix(std::string_view prefix);

}  // namespace s3
}  // namespace ckpt::backend
