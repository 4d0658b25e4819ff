// s3_xml.cc — pugixml readers and writers for the S3 backend's documents.
#include "backend/s3_xml.h"

#include <cstdlib>
#include <ctime>
#include <pugixml.hpp>
#include <sstream>

#include "common/text.h"

namespace ckpt::backend::s3 {

namespace {

// The local name of an element ("s3:Key" → "Key").
std::string_view Local(const pugi::xml_node& n) {
  std::string_view name = n.name();
  size_t colon = name.find(':');
  return colon == std::string_view::npos ? name : name.substr(colon + 1);
}

pugi::xml_node Child(const pugi::xml_node& parent, std::string_view name) {
  for (pugi::xml_node c = parent.first_child(); c; c = c.next_sibling())
    if (c.type() == pugi::node_element && Local(c) == name) return c;
  return {};
}

std::string Text(const pugi::xml_node& parent, std::string_view name) {
  pugi::xml_node c = Child(parent, name);
  return c ? std::string(c.child_value()) : std::string();
}

// Parses `xml` and returns its root element when its local name is `root`.
bool Load(pugi::xml_document& doc, std::string_view xml, std::string_view root, pugi::xml_node* out) {
  pugi::xml_parse_result r = doc.load_buffer(xml.data(), xml.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!r) return false;
  pugi::xml_node e = doc.document_element();
  if (!e || Local(e) != root) return false;
  *out = e;
  return true;
}

bool ParseU64(const std::string& s, uint64_t* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(s.c_str(), &end, 10);
  if (errno || *end || s.front() == '-') return false;
  *v = x;
  return true;
}

std::string Save(const pugi::xml_document& doc) {
  std::ostringstream ss;
  doc.save(ss, "", pugi::format_raw);
  return ss.str();
}

// An xsd:boolean's true: "true" or "1" (a store that says 1 has more
// pages too; read as false, a listing ended after its first page).
bool Truthy(std::string_view v) { return v == "true" || v == "1"; }

// Values of encoding-type=url replies: percent-encoded, '+' for a space.
std::string UrlDecode(std::string_view s) { return PercentDecode(s, /*plus_is_space=*/true); }

}  // namespace

std::optional<int64_t> ParseIsoTime(std::string_view s) {
  int y, mo, d, h, mi, sec;
  std::string str(s);
  if (std::sscanf(str.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &sec) != 6) return std::nullopt;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return static_cast<int64_t>(timegm(&tm));
}

std::optional<int64_t> ParseHttpTime(std::string_view s) {
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  int d, y, h, mi, sec, end = 0;
  char mon[4] = {0};
  std::string str(s);
  if (std::sscanf(str.c_str(), "%*3[A-Za-z], %2d %3[A-Za-z] %4d %2d:%2d:%2d GMT%n", &d, mon, &y, &h, &mi, &sec,
                  &end) != 6 ||
      end == 0)
    return std::nullopt;
  int mo = -1;
  for (int i = 0; i < 12; i++)
    if (std::string_view(mon) == kMonths[i]) mo = i;
  if (mo < 0 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return static_cast<int64_t>(timegm(&tm));
}

Result<ListPage> ParseListObjectsV2(std::string_view xml) {
  pugi::xml_document doc;
  pugi::xml_node root;
  if (!Load(doc, xml, "ListBucketResult", &root)) return Err(EIO);
  bool url = Text(root, "EncodingType") == "url";
  ListPage page;
  page.truncated = Truthy(Text(root, "IsTruncated"));
  page.next_token = Text(root, "NextContinuationToken");
  for (pugi::xml_node c = root.first_child(); c; c = c.next_sibling()) {
    if (c.type() != pugi::node_element) continue;
    if (Local(c) == "Contents") {
      ListedObject o;
      o.key = Text(c, "Key");
      if (url) o.key = UrlDecode(o.key);
      if (o.key.empty() || !ParseU64(Text(c, "Size"), &o.size)) return Err(EIO);
      o.etag = Text(c, "ETag");
      o.mtime_sec = ParseIsoTime(Text(c, "LastModified")).value_or(0);
      page.objects.push_back(std::move(o));
    } else if (Local(c) == "CommonPrefixes") {
      std::string p = Text(c, "Prefix");
      page.common_prefixes.push_back(url ? UrlDecode(p) : p);
    }
  }
  if (page.truncated && page.next_token.empty()) return Err(EIO);  // no way to go on
  return page;
}

Result<std::string> ParseInitiateMultipartUpload(std::string_view xml) {
  pugi::xml_document doc;
  pugi::xml_node root;
  if (!Load(doc, xml, "InitiateMultipartUploadResult", &root)) return Err(EIO);
  std::string id = Text(root, "UploadId");
  if (id.empty()) return Err(EIO);
  return id;
}

Result<UploadsPage> ParseListMultipartUploads(std::string_view xml) {
  pugi::xml_document doc;
  pugi::xml_node root;
  if (!Load(doc, xml, "ListMultipartUploadsResult", &root)) return Err(EIO);
  bool url = Text(root, "EncodingType") == "url";
  UploadsPage page;
  page.truncated = Truthy(Text(root, "IsTruncated"));
  page.next_key_marker = Text(root, "NextKeyMarker");
  page.next_upload_id_marker = Text(root, "NextUploadIdMarker");
  if (url) page.next_key_marker = UrlDecode(page.next_key_marker);
  for (pugi::xml_node c = root.first_child(); c; c = c.next_sibling()) {
    if (c.type() != pugi::node_element || Local(c) != "Upload") continue;
    Upload u{Text(c, "Key"), Text(c, "UploadId"), ParseIsoTime(Text(c, "Initiated")).value_or(0)};
    if (url) u.key = UrlDecode(u.key);
    if (u.key.empty() || u.upload_id.empty()) return Err(EIO);
    page.uploads.push_back(std::move(u));
  }
  if (page.truncated && page.next_key_marker.empty()) return Err(EIO);
  return page;
}

Result<std::string> ParseETagResult(std::string_view xml) {
  pugi::xml_document doc;
  pugi::xml_parse_result r = doc.load_buffer(xml.data(), xml.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!r) return Err(EIO);
  pugi::xml_node root = doc.document_element();
  std::string_view name = root ? Local(root) : std::string_view();
  if (name != "CopyObjectResult" && name != "CopyPartResult" && name != "CompleteMultipartUploadResult")
    return Err(EIO);
  std::string etag = Text(root, "ETag");
  if (etag.empty()) return Err(EIO);
  return etag;
}

Result<std::vector<DeleteFailure>> ParseDeleteResult(std::string_view xml) {
  pugi::xml_document doc;
  pugi::xml_node root;
  if (!Load(doc, xml, "DeleteResult", &root)) return Err(EIO);
  std::vector<DeleteFailure> failed;
  for (pugi::xml_node c = root.first_child(); c; c = c.next_sibling())
    if (c.type() == pugi::node_element && Local(c) == "Error")
      failed.push_back({Text(c, "Key"), Text(c, "Code"), Text(c, "Message")});
  return failed;
}

std::optional<ErrorDoc> ParseError(std::string_view xml) {
  if (xml.empty()) return std::nullopt;
  pugi::xml_document doc;
  pugi::xml_node root;
  if (!Load(doc, xml, "Error", &root)) return std::nullopt;
  return ErrorDoc{Text(root, "Code"), Text(root, "Message")};
}

std::string CompleteMultipartUploadXml(const std::vector<std::string>& etags) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  for (size_t i = 0; i < etags.size(); i++) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber").text().set(static_cast<unsigned long long>(i + 1));
    part.append_child("ETag").text().set(etags[i].c_str());
  }
  return Save(doc);
}

std::string DeleteObjectsXml(const std::vector<std::string>& keys) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("Delete");
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  root.append_child("Quiet").text().set("true");
  for (const auto& k : keys) root.append_child("Object").append_child("Key").text().set(k.c_str());
  return Save(doc);
}

}  // namespace ckpt::backend::s3
