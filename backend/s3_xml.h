// s3_xml.h — the few S3 XML documents the S3 backend reads and writes,
// parsed with pugixml (element names, never string search).
//
// Parsers take the response body and return EIO (with no log line; the
// caller knows the bucket and key and logs) when the document is not what
// was expected. Element lookups ignore namespaces, since stores differ in
// whether they send xmlns. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace ckpt::backend::s3 {

struct ListedObject {
  std::string key;  // decoded when the store used encoding-type=url
  uint64_t size = 0;
  std::string etag;
  int64_t mtime_sec = 0;  // LastModified, 0 when absent or unparsable
};

// ListObjectsV2Result (ListBucketResult).
struct ListPage {
  std::vector<ListedObject> objects;
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken
};
[[nodiscard]] Result<ListPage> ParseListObjectsV2(std::string_view xml);

// InitiateMultipartUploadResult → the UploadId.
[[nodiscard]] Result<std::string> ParseInitiateMultipartUpload(std::string_view xml);

// ListMultipartUploadsResult.
struct Upload {
  std::string key, upload_id;
  int64_t initiated_sec = 0;  // Initiated, 0 when absent or unparsable
};
struct UploadsPage {
  std::vector<Upload> uploads;
  bool truncated = false;
  std::string next_key_marker, next_upload_id_marker;
};
[[nodiscard]] Result<UploadsPage> ParseListMultipartUploads(std::string_view xml);

// CopyObjectResult / CopyPartResult / CompleteMultipartUploadResult → the ETag.
[[nodiscard]] Result<std::string> ParseETagResult(std::string_view xml);

// DeleteResult → the keys that were not deleted, with their error codes.
struct DeleteFailure {
  std::string key, code, message;
};
[[nodiscard]] Result<std::vector<DeleteFailure>> ParseDeleteResult(std::string_view xml);

// An <Error> document (a failed request, or a 200 reply of CopyObject or
// CompleteMultipartUpload that failed after the headers were sent);
// nullopt when `xml` is not one.
struct ErrorDoc {
  std::string code, message;
};
std::optional<ErrorDoc> ParseError(std::string_view xml);

// Request bodies.
std::string CompleteMultipartUploadXml(const std::vector<std::string>& etags);  // parts 1..n
std::string DeleteObjectsXml(const std::vector<std::string>& keys);             // Quiet mode

// ISO 8601 "2024-01-02T03:04:05.000Z" → seconds since the epoch (UTC);
// nullopt when it does not parse.
std::optional<int64_t> ParseIsoTime(std::string_view s);

// An HTTP date (Last-Modified: "Sun, 06 Nov 1994 08:49:37 GMT") → seconds
// since the epoch; nullopt when it does not parse.
std::optional<int64_t> ParseHttpTime(std::string_view s);

}  // namespace ckpt::backend::s3
