// test_s3.cc — the S3 backend's pieces that need no server: key mapping,
// XML documents, retry classification, configuration from the environment
// and from ~/.aws files (HOME pointed at a temporary directory). Criterion
// forks per test, so the environment changes stay inside each test.
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "backend/s3_backend.h"
#include "backend/s3_backend_impl.h"
#include "backend/s3_config.h"
#include "backend/s3_xml.h"
#include "common/text.h"

using namespace ckpt::backend;

// ---------------------------------------------------------------- keys

Test(s3_keys, join_with_and_without_prefix) {
  cr_expect_eq(*s3::JoinKey("", "a/b"), std::string("a/b"));
  cr_expect_eq(*s3::JoinKey("ckpts/run1", "step_100/model.pt"), std::string("ckpts/run1/step_100/model.pt"));
  cr_expect_eq(*s3::JoinKey("p", ".hidden"), std::string("p/.hidden"));
  cr_expect_eq(*s3::JoinKey("p", "a/.ckptfs-tmp"), std::string("p/a/.ckptfs-tmp"));  // reserved only at the top
}

Test(s3_keys, join_rejects_bad_paths) {
  for (const char* bad : {"", "/a", "a/", "a//b", "./a", "a/./b", "a/../b", "..", ".ckptfs-tmp", ".ckptfs-tmp/x"}) {
    auto k = s3::JoinKey("p", bad);
    cr_expect(!k.has_value(), "'%s' accepted", bad);
    if (!k) cr_expect_eq(k.error(), EINVAL);
  }
  cr_expect(!s3::JoinKey("p", std::string("a\0b", 3)).has_value());
}

Test(s3_keys, relpath_inverts_join) {
  cr_expect_eq(*s3::RelPath("p", "p/a/b"), std::string("a/b"));
  cr_expect_eq(*s3::RelPath("p", "p/a/"), std::string("a/"));  // a directory marker
  cr_expect_eq(*s3::RelPath("", "a/b"), std::string("a/b"));
  cr_expect_eq(*s3::RelPath("x/y", "x/y/z"), std::string("z"));
}

Test(s3_keys, relpath_refuses_foreign_and_unsafe_keys) {
  cr_expect(!s3::RelPath("p", "p/").has_value());    // the prefix's own marker
  cr_expect(!s3::RelPath("p", "px/a").has_value());  // another prefix
  cr_expect(!s3::RelPath("p", "p").has_value());
  cr_expect(!s3::RelPath("p", "p/a//b").has_value());    // empty component
  cr_expect(!s3::RelPath("p", "p/../etc").has_value());  // escapes
  cr_expect(!s3::RelPath("p", "p/a/./b").has_value());
  cr_expect(!s3::RelPath("", "/a").has_value());
  cr_expect(!s3::RelPath("", "a//").has_value());
}

Test(s3_keys, uri_encoding) {
  cr_expect_eq(s3::UriEncode("a b/c~d-e_f.g", true), std::string("a%20b/c~d-e_f.g"));
  cr_expect_eq(s3::UriEncode("a b/c", false), std::string("a%20b%2Fc"));
  cr_expect_eq(s3::UriEncode("+=&\xc3\xa9", false), std::string("%2B%3D%26%C3%A9"));
  cr_expect_eq(ckpt::PercentDecode("a%20b%2Fc%C3%A9", false), std::string("a b/c\xc3\xa9"));
  cr_expect_eq(ckpt::PercentDecode(s3::UriEncode("../weird target ü", true), false), std::string("../weird target ü"));
}

Test(s3_config, normalize_prefix) {
  cr_expect_eq(*s3::NormalizePrefix("/a/b/"), std::string("a/b"));
  cr_expect_eq(*s3::NormalizePrefix(""), std::string(""));
  cr_expect_eq(*s3::NormalizePrefix("///"), std::string(""));
  cr_expect(!s3::NormalizePrefix("a//b").has_value());
  cr_expect(!s3::NormalizePrefix("a/../b").has_value());
  cr_expect(!s3::NormalizePrefix("./a").has_value());
}

// ---------------------------------------------------------------- XML

static const char kListPage[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name><Prefix>ck/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <Contents><Key>ck/a/</Key><LastModified>2024-01-02T03:04:05.000Z</LastModified>
    <ETag>"d41d8cd98f00b204e9800998ecf8427e"</ETag><Size>0</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>ck/a/model.pt</Key><LastModified>2024-01-02T03:04:06.000Z</LastModified>
    <ETag>"9b2cf535f27731c974343645a3985328-3"</ETag><Size>41943040</Size><StorageClass>STANDARD</StorageClass></Contents>
</ListBucketResult>)";

// An hour-old upload is a leftover under this mount's prefix (a publish's
// copy cut short); without a prefix, only in the staging area: the rest of
// the bucket may be another tool's upload of many hours.
Test(s3_leftovers, an_old_upload_outside_the_staging_area_is_ours_only_under_a_prefix) {
  using ckpt::backend::s3impl::S3Backend;
  ckpt::backend::S3Config c;
  c.endpoint = "http://127.0.0.1:1";
  c.bucket = "b";
  c.owner = "node-a";
  const int64_t now = 1800000000, old = now - 2 * 3600, fresh = now - 60;
  S3Backend whole(c);
  cr_expect(!whole.Leftover("datasets/imagenet.tar", old, now), "another tool's upload in a shared bucket");
  cr_expect(!whole.Leftover("step_1/model.pt", old, now));
  cr_expect(whole.Leftover(".ckptfs-tmp/node-b/stage-1-2-3", old, now), "staged by a gone daemon, an hour ago");
  cr_expect(!whole.Leftover(".ckptfs-tmp/node-b/stage-1-2-3", fresh, now));
  c.prefix = "team/ckpts";
  S3Backend prefixed(c);
  cr_expect(prefixed.Leftover("team/ckpts/step_1/model.pt", old, now), "under the mount's prefix: ours");
  cr_expect(!prefixed.Leftover("team/ckpts/step_1/model.pt", fresh, now));
  cr_expect(prefixed.Leftover("team/ckpts/.ckptfs-tmp/node-b/stage-1-2-3", old, now));
}

Test(s3_xml, list_objects_v2) {
  auto page = s3::ParseListObjectsV2(kListPage);
  cr_assert(page.has_value());
  cr_expect(page->truncated);
  cr_expect_eq(page->next_token, std::string("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="));
  cr_assert_eq(page->objects.size(), 2u);
  cr_expect_eq(page->objects[0].key, std::string("ck/a/"));
  cr_expect_eq(page->objects[0].size, 0u);
  cr_expect_eq(page->objects[1].key, std::string("ck/a/model.pt"));
  cr_expect_eq(page->objects[1].size, 41943040u);
  cr_expect_eq(page->objects[1].etag, std::string("\"9b2cf535f27731c974343645a3985328-3\""));
  cr_expect_eq(page->objects[0].mtime_sec, 1704164645);
}

// xsd:boolean: "1" is true too (a listing read as ended after its first
// page made Rmdir leave keys and the merge drop entries that are there).
Test(s3_xml, is_truncated_as_an_xml_boolean) {
  std::string one = kListPage;
  one.replace(one.find("<IsTruncated>true"), 17, "<IsTruncated>1");
  cr_expect(s3::ParseListObjectsV2(one)->truncated);
  std::string zero = kListPage;
  zero.replace(zero.find("<IsTruncated>true"), 17, "<IsTruncated>0");
  cr_expect(!s3::ParseListObjectsV2(zero)->truncated);
  cr_expect(s3::ParseListMultipartUploads(
                "<ListMultipartUploadsResult><IsTruncated>1</IsTruncated><NextKeyMarker>k</NextKeyMarker>"
                "<NextUploadIdMarker>u</NextUploadIdMarker></ListMultipartUploadsResult>")
                ->truncated);
}

Test(s3_xml, list_objects_v2_url_encoded_and_prefixes) {
  const char* xml = R"(<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>
    <Contents><Key>ck/a+b/%C3%A9t%C3%A9%26.pt</Key><Size>5</Size></Contents>
    <CommonPrefixes><Prefix>ck/dir%20x/</Prefix></CommonPrefixes></ListBucketResult>)";
  auto page = s3::ParseListObjectsV2(xml);
  cr_assert(page.has_value());
  cr_expect(!page->truncated);
  cr_assert_eq(page->objects.size(), 1u);
  cr_expect_eq(page->objects[0].key, std::string("ck/a b/\xc3\xa9t\xc3\xa9&.pt"));
  cr_assert_eq(page->common_prefixes.size(), 1u);
  cr_expect_eq(page->common_prefixes[0], std::string("ck/dir x/"));
}

Test(s3_xml, list_objects_v2_rejects_garbage) {
  cr_expect(!s3::ParseListObjectsV2("").has_value());
  cr_expect(!s3::ParseListObjectsV2("<html>oops</html>").has_value());
  cr_expect(!s3::ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents>"
                                    "</ListBucketResult>")
                 .has_value());
  // Truncated without a token: the listing could never finish.
  cr_expect(
      !s3::ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").has_value());
}

Test(s3_xml, initiate_multipart_upload) {
  const char* xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>example-bucket</Bucket><Key>ck/.ckptfs-tmp/st-1</Key>
  <UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId>
</InitiateMultipartUploadResult>)";
  auto id = s3::ParseInitiateMultipartUpload(xml);
  cr_assert(id.has_value());
  cr_expect_eq(*id, std::string("VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA"));
  cr_expect(!s3::ParseInitiateMultipartUpload("<InitiateMultipartUploadResult/>").has_value());
}

Test(s3_xml, list_multipart_uploads) {
  const char* xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>bucket</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>ck/.ckptfs-tmp/st-2</NextKeyMarker><NextUploadIdMarker>id-2</NextUploadIdMarker>
  <MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>ck/.ckptfs-tmp/st-1</Key><UploadId>id-1</UploadId><Initiated>2024-01-01T00:00:00.000Z</Initiated></Upload>
  <Upload><Key>ck/.ckptfs-tmp/st-2</Key><UploadId>id-2</UploadId></Upload>
</ListMultipartUploadsResult>)";
  auto page = s3::ParseListMultipartUploads(xml);
  cr_assert(page.has_value());
  cr_expect(page->truncated);
  cr_assert_eq(page->uploads.size(), 2u);
  cr_expect_eq(page->uploads[0].key, std::string("ck/.ckptfs-tmp/st-1"));
  cr_expect_eq(page->uploads[1].upload_id, std::string("id-2"));
  cr_expect_eq(page->next_key_marker, std::string("ck/.ckptfs-tmp/st-2"));
  cr_expect_eq(page->next_upload_id_marker, std::string("id-2"));
}

Test(s3_xml, error_documents) {
  const char* xml = R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>
<BucketName>nope</BucketName><RequestId>4442587FB7D0A2F9</RequestId></Error>)";
  auto e = s3::ParseError(xml);
  cr_assert(e.has_value());
  cr_expect_eq(e->code, std::string("NoSuchBucket"));
  cr_expect_eq(e->message, std::string("The specified bucket does not exist"));
  cr_expect(!s3::ParseError("").has_value());
  cr_expect(!s3::ParseError(kListPage).has_value());
  cr_expect(!s3::ParseError("not xml at all").has_value());
}

Test(s3_xml, copy_results_and_complete) {
  auto etag = s3::ParseETagResult(
      R"(<CopyObjectResult><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>"abc"</ETag></CopyObjectResult>)");
  cr_assert(etag.has_value());
  cr_expect_eq(*etag, std::string("\"abc\""));
  cr_expect(s3::ParseETagResult(R"(<CopyPartResult><ETag>"p1"</ETag></CopyPartResult>)").has_value());
  // A copy that failed after the 200 was sent.
  cr_expect(!s3::ParseETagResult("<Error><Code>InternalError</Code></Error>").has_value());
  std::string xml = s3::CompleteMultipartUploadXml({"\"e1\"", "\"e2\""});
  cr_expect(xml.find("<Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag></Part>") != std::string::npos ||
                xml.find("<Part><PartNumber>1</PartNumber><ETag>\"e1\"</ETag></Part>") != std::string::npos,
            "%s", xml.c_str());
  cr_expect(xml.find("<PartNumber>2</PartNumber>") != std::string::npos);
}

Test(s3_xml, delete_objects) {
  std::string body = s3::DeleteObjectsXml({"ck/a&b", "ck/c"});
  cr_expect(body.find("<Quiet>true</Quiet>") != std::string::npos);
  cr_expect(body.find("<Object><Key>ck/a&amp;b</Key></Object>") != std::string::npos, "%s", body.c_str());
  auto failed = s3::ParseDeleteResult(R"(<DeleteResult><Deleted><Key>ck/c</Key></Deleted>
    <Error><Key>ck/a&amp;b</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error></DeleteResult>)");
  cr_assert(failed.has_value());
  cr_assert_eq(failed->size(), 1u);
  cr_expect_eq((*failed)[0].key, std::string("ck/a&b"));
  cr_expect_eq((*failed)[0].code, std::string("AccessDenied"));
}

// ---------------------------------------------------------------- retries

Test(s3_retry, curl_codes) {
  for (CURLcode c : {CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR,
                     CURLE_RECV_ERROR, CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE}) {
    auto v = s3::ClassifyCurl(c);
    cr_expect(v.retry, "curl code %d not retried", c);
    cr_expect_eq(v.err, EIO);
  }
  cr_expect_eq(s3::ClassifyCurl(CURLE_OK).err, 0);
  cr_expect(!s3::ClassifyCurl(CURLE_URL_MALFORMAT).retry);
  cr_expect_eq(s3::ClassifyCurl(CURLE_URL_MALFORMAT).err, EIO);
  cr_expect(!s3::ClassifyCurl(CURLE_ABORTED_BY_CALLBACK).retry);
  cr_expect_eq(s3::ClassifyCurl(CURLE_ABORTED_BY_CALLBACK).err, ECANCELED);
}

Test(s3_retry, http_statuses) {
  struct {
    long status;
    const char* code;
    bool retry;
    int err;
  } cases[] = {
      {200, "", false, 0},
      {204, "", false, 0},
      {500, "InternalError", true, EIO},
      {502, "", true, EIO},
      {503, "SlowDown", true, EIO},
      {504, "", true, EIO},
      {429, "", true, EIO},
      {400, "RequestTimeout", true, EIO},
      {200, "InternalError", true, EIO},  // an <Error> inside a 200 copy reply
      {501, "NotImplemented", false, ENOTSUP},
      {405, "MethodNotAllowed", false, ENOTSUP},
      {403, "AccessDenied", false, EACCES},
      {403, "InvalidAccessKeyId", false, EACCES},
      {403, "SignatureDoesNotMatch", false, EACCES},
      {404, "NoSuchBucket", false, ENOENT},
      {404, "", false, ENOENT},
      {400, "InvalidArgument", false, EINVAL},
      {416, "InvalidRange", false, EINVAL},
      {409, "BucketNotEmpty", false, EIO},
      {412, "PreconditionFailed", false, EIO},
      // By the S3 error code first (the S3 API reference's "Error
      // responses"): several 400s are transient, whatever the status says.
      {400, "IncompleteBody", true, EIO},
      {400, "BadDigest", true, EIO},  // the body was corrupted in flight: send it again
      {400, "XAmzContentSHA256Mismatch", true, EIO},
      {400, "ExpiredToken", true, EIO},
      {400, "TokenRefreshRequired", true, EIO},
      {403, "RequestTimeTooSkewed", true, EIO},
      {409, "OperationAborted", true, EIO},
      {503, "ServiceUnavailable", true, EIO},
      {400, "Throttling", true, EIO},
      {400, "ThrottlingException", true, EIO},
      {503, "RequestLimitExceeded", true, EIO},
      {429, "TooManyRequests", true, EIO},
      {200, "SlowDown", true, EIO},
      // A completion that the same part list cannot fix: not sent again,
      // but transient (EIO), so the drainer's retry starts a new upload.
      {400, "InvalidPart", false, EIO},
      {400, "InvalidPartOrder", false, EIO},
      // The upload is gone: an abort is done, a completion checks the object.
      {404, "NoSuchUpload", false, ENOENT},
      // Permanent, with the errno that says why.
      {400, "KeyTooLongError", false, ENAMETOOLONG},
      {400, "EntityTooLarge", false, EFBIG},
      {400, "EntityTooSmall", false, EINVAL},
      {400, "InvalidObjectName", false, EINVAL},
      {400, "MalformedXML", false, EINVAL},
      {400, "InvalidRequest", false, EINVAL},
      {403, "AllAccessDisabled", false, EACCES},
      {403, "InvalidToken", false, EACCES},
      {404, "NoSuchKey", false, ENOENT},
      {500, "NotImplemented", false, ENOTSUP},  // the code wins over the status
      {400, "AccessDenied", false, EACCES},
      // A code not in the table: the status decides, as before.
      {400, "SomeNewCode", false, EINVAL},
      {403, "SomeNewCode", false, EACCES},
      {503, "SomeNewCode", true, EIO},
      {418, "SomeNewCode", false, EIO},
  };
  for (const auto& c : cases) {
    auto v = s3::ClassifyHttp(c.status, c.code);
    cr_expect_eq(v.retry, c.retry, "HTTP %ld %s: retry %d", c.status, c.code, v.retry);
    cr_expect_eq(v.err, c.err, "HTTP %ld %s: errno %d", c.status, c.code, v.err);
  }
}

Test(s3_retry, backoff_grows_with_jitter_and_cap) {
  cr_expect_eq(s3::BackoffMs(1, 100, 5000, 1.0), 100u);
  cr_expect_eq(s3::BackoffMs(2, 100, 5000, 1.0), 200u);
  cr_expect_eq(s3::BackoffMs(4, 100, 5000, 1.0), 800u);
  cr_expect_eq(s3::BackoffMs(30, 100, 5000, 1.0), 5000u);
  cr_expect_eq(s3::BackoffMs(3, 100, 5000, 0.0), 0u);
  cr_expect_eq(s3::BackoffMs(3, 100, 5000, 0.5), 200u);
}

// ---------------------------------------------------------------- config

namespace {

void ClearAwsEnv() {
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                        "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "CKPTFS_S3_PART_SIZE", "CKPTFS_S3_PARALLEL",
                        "CKPTFS_S3_LIST_MAX_KEYS", "CKPTFS_S3_MAX_ATTEMPTS", "CKPTFS_S3_ADDRESSING"})
    unsetenv(v);
}

// A fresh HOME with ~/.aws/credentials and ~/.aws/config.
std::string FakeHome(const std::string& credentials, const std::string& config) {
  char tmpl[] = "/tmp/ckpt-s3-home-XXXXXX";
  std::string home = mkdtemp(tmpl);
  std::filesystem::create_directories(home + "/.aws");
  if (!credentials.empty()) std::ofstream(home + "/.aws/credentials") << credentials;
  if (!config.empty()) std::ofstream(home + "/.aws/config") << config;
  setenv("HOME", home.c_str(), 1);
  return home;
}

}  // namespace

Test(s3_config, from_environment) {
  ClearAwsEnv();
  std::string home = FakeHome("", "");
  setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "secretenv", 1);
  setenv("AWS_SESSION_TOKEN", "tok", 1);
  setenv("AWS_DEFAULT_REGION", "eu-central-1", 1);
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
  auto cfg = LoadS3Config("bucket", "/ckpts/run1/", "");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->access_key, std::string("AKIDENV"));
  cr_expect_eq(cfg->secret_key, std::string("secretenv"));
  cr_expect_eq(cfg->session_token, std::string("tok"));
  cr_expect_eq(cfg->region, std::string("eu-central-1"));
  cr_expect_eq(cfg->endpoint, std::string("http://127.0.0.1:9000"));
  cr_expect_eq(cfg->prefix, std::string("ckpts/run1"));
  cr_expect_eq(cfg->bucket, std::string("bucket"));

  setenv("AWS_REGION", "us-west-2", 1);  // wins over AWS_DEFAULT_REGION
  cfg = LoadS3Config("bucket", "", "http://override:1234");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->region, std::string("us-west-2"));
  cr_expect_eq(cfg->endpoint, std::string("http://override:1234"));
  std::filesystem::remove_all(home);
}

Test(s3_config, from_aws_files_and_profiles) {
  ClearAwsEnv();
  std::string home = FakeHome(
      "[default]\naws_access_key_id = AKIDDEF\naws_secret_access_key = secretdef\n\n"
      "# a comment\n[prod]\naws_access_key_id=AKIDPROD\naws_secret_access_key=secretprod\n"
      "aws_session_token = tokprod\n",
      "[default]\nregion = ap-south-1\n\n[profile prod]\nregion = eu-west-1\n");
  auto cfg = LoadS3Config("bucket", "x", "");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->access_key, std::string("AKIDDEF"));
  cr_expect_eq(cfg->secret_key, std::string("secretdef"));
  cr_expect_eq(cfg->region, std::string("ap-south-1"));
  cr_expect_eq(cfg->endpoint, std::string("https://s3.ap-south-1.amazonaws.com"));

  setenv("AWS_PROFILE", "prod", 1);
  cfg = LoadS3Config("bucket", "x", "");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->access_key, std::string("AKIDPROD"));
  cr_expect_eq(cfg->session_token, std::string("tokprod"));
  cr_expect_eq(cfg->region, std::string("eu-west-1"));
  std::filesystem::remove_all(home);
}

Test(s3_config, credentials_in_config_file) {
  ClearAwsEnv();
  std::string home = FakeHome("", "[profile dev]\naws_access_key_id=AKIDCONF\naws_secret_access_key=s\n");
  setenv("AWS_PROFILE", "dev", 1);
  auto cfg = LoadS3Config("bucket", "", "");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->access_key, std::string("AKIDCONF"));
  cr_expect_eq(cfg->region, std::string("us-east-1"));
  std::filesystem::remove_all(home);
}

Test(s3_config, missing_credentials_and_bad_input) {
  ClearAwsEnv();
  std::string home = FakeHome("[other]\naws_access_key_id=A\naws_secret_access_key=B\n", "");
  auto cfg = LoadS3Config("bucket", "", "");
  cr_assert(!cfg.has_value());
  cr_expect_eq(cfg.error(), EACCES);
  setenv("AWS_ACCESS_KEY_ID", "A", 1);  // half a key pair is no key pair
  cr_expect_eq(LoadS3Config("bucket", "", "").error(), EACCES);
  setenv("AWS_SECRET_ACCESS_KEY", "B", 1);
  cr_expect_eq(LoadS3Config("bucket", "a/../b", "").error(), EINVAL);
  cr_expect_eq(LoadS3Config("b", "", "").error(), EINVAL);
  cr_expect_eq(LoadS3Config("bad/bucket", "", "").error(), EINVAL);
  cr_expect_eq(LoadS3Config("bucket", "", "ftp://host").error(), EINVAL);
  cr_expect_eq(LoadS3Config("bucket", "", "http://host/path").error(), EINVAL);
  std::filesystem::remove_all(home);
}

Test(s3_config, tuning_from_environment_and_messages) {
  ClearAwsEnv();
  std::string home = FakeHome("", "");
  setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "topsecret", 1);
  auto cfg = LoadS3Config("bucket", "", "http://h:1");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->part_size, 16ull << 20);  // the defaults
  cr_expect_eq(cfg->list_max_keys, 1000);
  cr_expect(cfg->path_style);
  setenv("CKPTFS_S3_PART_SIZE", "8M", 1);
  setenv("CKPTFS_S3_PARALLEL", "2", 1);
  setenv("CKPTFS_S3_LIST_MAX_KEYS", "7", 1);
  setenv("CKPTFS_S3_MAX_ATTEMPTS", "3", 1);
  setenv("CKPTFS_S3_ADDRESSING", "virtual", 1);
  cfg = LoadS3Config("bucket", "", "http://h:1");
  cr_assert(cfg.has_value());
  cr_expect_eq(cfg->part_size, 8ull << 20);
  cr_expect_eq(cfg->parallel, 2);
  cr_expect_eq(cfg->list_max_keys, 7);
  cr_expect_eq(cfg->max_attempts, 3);
  cr_expect(!cfg->path_style);

  std::string why;
  for (auto [name, value] : {std::pair{"CKPTFS_S3_PART_SIZE", "1M"},
                             {"CKPTFS_S3_PART_SIZE", "10%"},
                             {"CKPTFS_S3_PART_SIZE", "6G"},
                             {"CKPTFS_S3_PARALLEL", "0"},
                             {"CKPTFS_S3_LIST_MAX_KEYS", "1001"},
                             {"CKPTFS_S3_MAX_ATTEMPTS", "x"},
                             {"CKPTFS_S3_ADDRESSING", "dns"}}) {
    std::string saved = std::getenv(name) ? std::getenv(name) : "";
    setenv(name, value, 1);
    why.clear();
    auto bad = LoadS3Config("bucket", "", "http://h:1", &why);
    cr_expect(!bad.has_value() && bad.error() == EINVAL, "%s=%s accepted", name, value);
    cr_expect(why.find(name) != std::string::npos, "message '%s' does not name %s", why.c_str(), name);
    if (saved.empty()) unsetenv(name);
    else setenv(name, saved.c_str(), 1);
  }

  // The messages for the user say what is wrong and never hold a secret.
  why.clear();
  cr_expect_eq(LoadS3Config("AKID:topsecret@bucket", "", "http://h:1", &why).error(), EINVAL);
  cr_expect(why.find("topsecret") == std::string::npos && why.find("credentials") != std::string::npos, "%s",
            why.c_str());
  why.clear();
  cr_expect_eq(LoadS3Config("bucket", "", "http://u:topsecret@h:1", &why).error(), EINVAL);
  cr_expect(why.find("topsecret") == std::string::npos && !why.empty(), "%s", why.c_str());
  unsetenv("AWS_SECRET_ACCESS_KEY");
  why.clear();
  cr_expect_eq(LoadS3Config("bucket", "", "http://h:1", &why).error(), EACCES);
  cr_expect(why.find("AWS_ACCESS_KEY_ID") != std::string::npos, "%s", why.c_str());
  std::filesystem::remove_all(home);
}

Test(s3_config, ini_parser) {
  auto ini = s3::ParseIni("; c\n[a]\nKey = v1 \n[profile  b]\nk=v2\r\nno equals\n[broken\nx=y\n");
  cr_expect_eq(ini["a"]["key"], std::string("v1"));
  cr_expect_eq(ini["profile b"]["k"], std::string("v2"));
}

// Last-Modified of a HEAD, for objects with no ckptfs mtime: the same
// second as the listing's LastModified (shared namespace, issue #11).
Test(s3_xml, http_time) {
  using ckpt::backend::s3::ParseHttpTime;
  using ckpt::backend::s3::ParseIsoTime;
  cr_expect_eq(ParseHttpTime("Sun, 06 Nov 1994 08:49:37 GMT").value_or(-1), 784111777);
  cr_expect_eq(ParseHttpTime("Tue, 24 Nov 2026 07:49:05 GMT").value_or(-1),
               ParseIsoTime("2026-11-24T07:49:05.123Z").value_or(-2));
  for (const char* bad : {"", "Sun, 06 Foo 1994 08:49:37 GMT", "06 Nov 1994", "Sun, 32 Nov 1994 08:49:37 GMT",
                          "Sun, 06 Nov 1994 25:49:37 GMT", "Sun, 06 Nov 1994 08:49:37"})
    cr_expect(!ParseHttpTime(bad).has_value(), "'%s' parsed", bad);
}
