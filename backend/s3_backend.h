// s3_backend.h — the Backend over S3-compatible object storage (AWS S3,
// MinIO, Ceph RGW, s3rver), with libcurl and its built-in SigV4 signing.
//
// Layout: the file at relative path "a/b" is the object "<prefix>/a/b"; a
// directory is a key prefix, and Mkdir also writes an empty marker object
// "<prefix>/a/" so that empty directories survive. The staging area is
// "<prefix>/.ckptfs-tmp/"; cluster records are "<prefix>/.ckptfs-cluster/
// DIR/NAME" (one PUT each: S3 replaces an object atomically). Files keep their checksum, mode and mtime in
// x-amz-meta-ckptfs-xxh128 / -mode / -mtime; symlinks are empty objects
// with x-amz-meta-ckptfs-symlink (the URL-encoded target).
//
// Staging (the Backend interface keeps Stage path-less, on purpose):
//  - a file of at most part_size bytes is read into memory by Stage and
//    sent by Publish in one PUT with its metadata;
//  - a larger file is uploaded by Stage as a multipart upload (part_size
//    parts, `parallel` in flight) to a temporary key under .ckptfs-tmp/,
//    completed there; Publish copies it server-side to the final key
//    (CopyObject, or UploadPartCopy in parallel parts above
//    multipart_copy_threshold, or GET + UploadPart where the store has no
//    UploadPartCopy) with the final metadata, then deletes the temporary.
// Why not a multipart upload on the final key, started by Stage: S3 orders
// a multipart upload by the time it was *initiated*, so a Remove or an
// older version's Publish applied between that Stage and its Publish could
// win over it, and the backend would no longer replay the mount's history
// in order. A copy at Publish time is a write at Publish time. The price is
// one server-side copy per large file.
//
// Stat (the shared namespace) is a HEAD of the key and, on a 404, a LIST
// of "<key>/" (a directory is any prefix with a valid key under it, as List
// decides: "a/../x" alone makes no "a"). ListDir is ListObjectsV2 with
// delimiter '/' (CommonPrefixes are the subdirectories, each checked the
// same way: one short LIST) plus one HEAD per object, as List does. Neither
// logs errors (their caller does). A missing bucket is EIO for both (and
// for every listing), never ENOENT.
//
// Requests go through s3::Client (backend/s3_client.h). Every request is
// retried (exponential backoff with full jitter) on
// connection errors, timeouts and the transient S3 error codes (SlowDown,
// RequestTimeout, BadDigest, ExpiredToken... whatever their HTTP status),
// up to max_attempts, then fails with EIO; a refusal fails at once with
// the errno its code gives (KeyTooLongError → ENAMETOOLONG, EntityTooLarge
// → EFBIG, AccessDenied → EACCES, NoSuchKey → ENOENT...: the table in
// s3_client.cc). A reply without a code known there goes by its HTTP
// status: 5xx, 429 and 408 retried, 403 → EACCES, 404 → ENOENT, 400 →
// EINVAL. Each failure is logged once with bucket, key and HTTP status;
// credentials and signatures never reach the log.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "backend/s3_client.h"
#include "backend/s3_config.h"

namespace ckpt::backend {

// Opens an S3 backend (no request is made; Check() talks to the store).
// Errors: EINVAL (bad configuration), ENOMEM.
[[nodiscard]] Result<std::unique_ptr<Backend>> OpenS3Backend(const S3Config& cfg);

namespace s3 {

// Whether `path` is a relative path the backend accepts: not empty, no
// leading '/', no empty, "." or ".." component, no NUL, and not under the
// reserved top-level names ".ckptfs-tmp" and ".ckptfs-cluster".
bool ValidPath(std::string_view path);

// "<prefix>/<path>" (just `path` when the prefix is empty); EINVAL when
// !ValidPath(path).
[[nodiscard]] Result<std::string> JoinKey(std::string_view prefix, std::string_view path);

// The relative path of `key` under `prefix` (the inverse of JoinKey; a
// trailing '/' — a directory marker — is kept). nullopt when the key is not
// under the prefix, is the prefix's own marker, or has an empty, "." or
// ".." component.
std::optional<std::string> RelPath(std::string_view prefix, std::string_view key);

}  // namespace s3
}  // namespace ckpt::backend
