// s3_listing.cc — what the S3 Backend reads of the store: HEADs (an
// object's checksum, mode, mtime, symlink target), ListObjectsV2 pages,
// List, Stat, ListDir and the cluster records.
#include <curl/curl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "backend/checksum.h"
#include "backend/s3_backend_impl.h"
#include "common/failpoint.h"
#include "common/io.h"
#include "common/log.h"
#include "common/text.h"

namespace ckpt::backend::s3impl {

Status S3Backend::List(const std::function<void(const Entry&)>& fn) {
  std::unordered_set<std::string> dirs;  // emitted already
  auto emit_dirs = [&](std::string_view dir) {
    // Every ancestor of `dir` and `dir` itself, outermost first.
    for (size_t pos = 0; pos <= dir.size();) {
      size_t slash = dir.find('/', pos);
      size_t end = slash == std::string_view::npos ? dir.size() : slash;
      std::string d(dir.substr(0, end));
      if (!d.empty() && dirs.insert(d).second) {
        Entry e{};
        e.type = Entry::Type::kDir;
        e.path = d;
        fn(e);
      }
      pos = end + 1;
    }
  };
  // Each page's objects are HEADed in parallel, then emitted in key order.
  return ListPages(root_, [&](const s3::ListPage& page) -> Status {
    struct Item {
      std::string key, rel;
      uint64_t size;
      int64_t mtime;
      ObjectInfo info;
      bool gone = false;
    };
    std::vector<Item> items;
    for (auto& o : page.objects) {
      if (o.key == root_) continue;  // the prefix's own marker
      auto rel = s3::RelPath(cfg_.prefix, o.key);
      if (!rel) {
        LOG_ERROR("s3 backend: list: skipping s3://{}/{}: not a valid path (empty, '.' or '..' component)", cfg_.bucket,
                  o.key);
        continue;
      }
      if (rel->starts_with(std::string(kTmpDir) + "/") || *rel == kTmpDir) continue;
      if (rel->starts_with(std::string(kClusterDir) + "/") || *rel == kClusterDir) continue;
      items.push_back({o.key, std::move(*rel), o.size, o.mtime_sec, {}, false});
    }
    if (int err = HeadEach(items, "list: head", /*quiet_all=*/false)) return Err(err);
    for (auto& it : items) {
      if (it.gone) continue;
      Entry e{};
      e.mode = it.info.mode;
      e.mtime_sec = it.info.has_mtime ? it.info.mtime_sec : it.mtime;
      e.mtime_nsec = it.info.has_mtime ? it.info.mtime_nsec : 0;
      if (it.rel.ends_with('/')) {
        std::string d = it.rel.substr(0, it.rel.size() - 1);
        auto slash = d.rfind('/');
        if (slash != std::string::npos) emit_dirs(std::string_view(d).substr(0, slash));
        if (!dirs.insert(d).second) continue;
        e.type = Entry::Type::kDir;
        e.path = std::move(d);
        fn(e);
        continue;
      }
      auto slash = it.rel.rfind('/');
      if (slash != std::string::npos) emit_dirs(std::string_view(it.rel).substr(0, slash));
      e.path = it.rel;
      if (it.info.symlink) {
        e.type = Entry::Type::kSymlink;
        e.target = it.info.target;
      } else {
        e.type = Entry::Type::kFile;
        e.size = it.size;
        e.has_checksum = it.info.has_checksum;
        e.checksum_hi = it.info.hi;
        e.checksum_lo = it.info.lo;
      }
      fn(e);
    }
    return {};
  });
}

Result<Entry> S3Backend::Stat(const std::string& path) {
  auto key = s3::JoinKey(cfg_.prefix, path);
  if (!key) return Err(EINVAL);  // a name the store cannot hold: nothing there
  auto info = Head(*key, "stat: head", /*quiet_404=*/true, /*quiet_all=*/true);
  if (info) return EntryOf(path, *info, 0);
  if (info.error() != ENOENT) return Err(info.error());
  // Not an object: a directory if a valid key lies under "<key>/" (its
  // marker included). The listing also tells a missing bucket (EIO: the
  // store is unreachable as a whole) from a missing key, which HEAD's
  // empty 404 cannot.
  auto valid = HasValidKey(*key + "/");
  if (!valid) return Err(valid.error());
  if (!*valid) return Err(ENOENT);
  Entry e{};
  e.type = Entry::Type::kDir;
  e.path = path;
  return e;
}

Result<std::vector<Entry>> S3Backend::ListDir(const std::string& dir) {
  std::string prefix = root_;
  if (!dir.empty()) {
    auto key = s3::JoinKey(cfg_.prefix, dir);
    if (!key) return Err(EINVAL);
    prefix = *key + "/";
  }
  struct Item {
    std::string key, rel;
    int64_t mtime;
    ObjectInfo info;
    bool gone = false;
  };
  std::vector<Item> items, dirs;  // dirs: a common prefix, key with its '/'
  std::vector<Entry> out;
  bool any = false;  // anything under the prefix, its marker included
  auto st = ListPages(
      prefix,
      [&](const s3::ListPage& page) -> Status {
        for (const auto& cp : page.common_prefixes) {
          any = true;
          auto rel = s3::RelPath(cfg_.prefix, cp);
          if (!rel || !rel->ends_with('/')) continue;
          rel->pop_back();
          if (*rel == kTmpDir || *rel == kClusterDir) continue;
          dirs.push_back({cp, std::move(*rel), 0, {}, false});
        }
        for (const auto& o : page.objects) {
          any = true;
          if (o.key == prefix) continue;  // the directory's own marker
          auto rel = s3::RelPath(cfg_.prefix, o.key);
          if (!rel || rel->ends_with('/')) continue;
          items.push_back({o.key, std::move(*rel), o.mtime_sec, {}, false});
        }
        return {};
      },
      "/", /*quiet_all=*/true);
  if (!st) return Err(st.error());
  if (!any && !dir.empty()) return Err(ENOENT);
  // A common prefix is a directory only if a valid key lies under it (as
  // List decides): "a/../x" alone must not make "a" appear. Usually the
  // first key of one short listing settles it.
  int err = RunParallel(dirs.size(), cfg_.parallel * 4, [&](size_t i) -> int {
    auto valid = HasValidKey(dirs[i].key);
    if (!valid) return valid.error();
    dirs[i].gone = !*valid;
    return 0;
  });
  if (err) return Err(err);
  if (int e = HeadEach(items, "listdir: head", /*quiet_all=*/true)) return Err(e);
  // A key "a" and keys under "a/" both: the object is the entry, as List
  // and Stat have it (two entries of one name made the shared namespace
  // drop and adopt it again at every look) — an object that is there: one
  // gone or unreadable leaves the directory.
  std::unordered_set<std::string_view> objects;
  for (const auto& it : items)
    if (!it.gone) objects.insert(it.rel);
  for (auto& d : dirs) {
    if (d.gone || objects.count(d.rel)) continue;
    Entry e{};
    e.type = Entry::Type::kDir;
    e.path = std::move(d.rel);
    out.push_back(std::move(e));
  }
  for (auto& it : items)
    if (!it.gone) out.push_back(EntryOf(it.rel, it.info, it.mtime));
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.path < b.path; });
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> S3Backend::ListRecords(const std::string& dir) {
  if (!ValidRecordName(dir)) return Fail(EINVAL, "list records: invalid name", dir);
  const std::string prefix = root_ + kClusterDir + "/" + dir + "/";
  std::vector<s3::ListedObject> objs;
  if (auto st = ListKeys(prefix, [&](const s3::ListedObject& o) { objs.push_back(o); }); !st) return Err(st.error());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& o : objs) {
    std::string name = o.key.substr(prefix.size());
    if (!ValidRecordName(name)) continue;
    if (o.size > kMaxRecordBytes) {
      LOG_DEBUG("s3 backend: list records: s3://{}/{} holds {} bytes; skipped", cfg_.bucket, o.key, o.size);
      continue;
    }
    std::string body;
    Request get;
    get.key = o.key;
    get.quiet = {404};
    get.sink = [&](const char* data, size_t n) -> int {
      if (body.size() + n > kMaxRecordBytes) return EFBIG;
      body.append(data, n);
      return 0;
    };
    get.on_retry = [&] { body.clear(); };
    Response r;
    if (auto st = http_.Perform(get, "get record", &r); !st) {
      if (st.error() == ENOENT || st.error() == EFBIG) continue;  // deleted meanwhile, or grew past the cap
      return Err(st.error());
    }
    out.emplace_back(std::move(name), std::move(body));
  }
  return out;
}

ObjectInfo S3Backend::InfoFrom(const Response& r) {
  ObjectInfo info;
  info.size = std::strtoull(r.Header("content-length").c_str(), nullptr, 10);
  info.etag = r.Header("etag");
  info.last_modified = s3::ParseHttpTime(r.Header("last-modified")).value_or(0);
  for (const auto& [k, v] : r.headers) {
    if (!k.starts_with("x-amz-meta-")) continue;
    info.meta.push_back(k + ": " + v);
    if (k == kMetaChecksum) {
      info.has_checksum = ParseChecksumHex(v, &info.hi, &info.lo);
    } else if (k == kMetaMode) {
      info.mode = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 8)) & 07777;
    } else if (k == kMetaMtime) {
      long long s = 0;
      unsigned ns = 0;
      if (std::sscanf(v.c_str(), "%lld.%u", &s, &ns) >= 1 && ns < 1000000000u) {
        info.has_mtime = true;
        info.mtime_sec = s;
        info.mtime_nsec = ns;
      }
    } else if (k == kMetaSymlink) {
      info.symlink = true;
      info.target = PercentDecode(v, /*plus_is_space=*/false);
    }
  }
  return info;
}

Result<ObjectInfo> S3Backend::Head(const std::string& key, std::string_view what, bool quiet_404, bool quiet_all) {
  Request req;
  req.method = "HEAD";
  req.key = key;
  req.quiet_all = quiet_all;
  if (quiet_404) req.quiet = {404};
  Response r;
  if (auto st = http_.Perform(req, what, &r); !st) return Err(st.error());
  return InfoFrom(r);
}

Result<bool> S3Backend::HasValidKey(const std::string& key_prefix) {
  constexpr int kFound = -1;  // not an errno: stops the listing
  auto st = ListPages(
      key_prefix,
      [&](const s3::ListPage& page) -> Status {
        for (const auto& o : page.objects)
          if (s3::RelPath(cfg_.prefix, o.key)) return Err(kFound);
        return {};
      },
      {}, /*quiet_all=*/true);
  if (st) return false;
  if (st.error() == kFound) return true;
  return Err(st.error());
}

Entry S3Backend::EntryOf(const std::string& path, const ObjectInfo& info, int64_t listed_mtime) {
  Entry e{};
  e.path = path;
  e.mode = info.mode;
  e.mtime_sec = info.has_mtime ? info.mtime_sec : listed_mtime ? listed_mtime : info.last_modified;
  e.mtime_nsec = info.has_mtime ? info.mtime_nsec : 0;
  if (info.symlink) {
    e.type = Entry::Type::kSymlink;
    e.target = info.target;
  } else {
    e.type = Entry::Type::kFile;
    e.size = info.size;
    e.has_checksum = info.has_checksum;
    e.checksum_hi = info.hi;
    e.checksum_lo = info.lo;
  }
  return e;
}

Result<bool> S3Backend::ObjectExists(const std::string& key) {
  constexpr int kFound = -1;  // not an errno: stops the listing
  auto st = ListPages(
      key,
      [&](const s3::ListPage& page) -> Status {
        for (const auto& o : page.objects)
          if (o.key == key) return Err(kFound);
        return {};
      },
      {}, /*quiet_all=*/true);
  if (st) return false;
  if (st.error() == kFound) return true;
  return Err(st.error());
}

Result<bool> S3Backend::Exists(const std::string& key) {
  auto info = Head(key, "exists: head", true);
  if (info) return true;
  if (info.error() != ENOENT) return Err(info.error());
  Request req;
  req.query = Query({{"list-type", "2"}, {"max-keys", "1"}, {"prefix", key + "/"}});
  Response r;
  if (auto st = http_.Perform(req, "exists: list", &r); !st) return Err(st.error());
  auto page = s3::ParseListObjectsV2(r.body);
  if (!page) return BadReply("exists: list", key, r);
  return !page->objects.empty();
}

Status S3Backend::ListKeys(const std::string& key_prefix, const std::function<void(const s3::ListedObject&)>& fn) {
  return ListPages(key_prefix, [&](const s3::ListPage& page) -> Status {
    for (const auto& o : page.objects) fn(o);
    return {};
  });
}

Status S3Backend::ListPages(const std::string& key_prefix, const std::function<Status(const s3::ListPage&)>& fn,
                            const std::string& delimiter, bool quiet_all) {
  std::string token;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> params = {{"list-type", "2"},
                                                               {"prefix", key_prefix},
                                                               {"encoding-type", "url"},
                                                               {"max-keys", std::to_string(cfg_.list_max_keys)}};
    if (!token.empty()) params.emplace_back("continuation-token", token);
    if (!delimiter.empty()) params.emplace_back("delimiter", delimiter);
    Request req;
    req.query = Query(params);
    req.quiet_all = quiet_all;
    Response r;
    if (auto st = http_.Perform(req, "list", &r); !st) return NoBucketIsEio(st.error(), r);
    auto page = s3::ParseListObjectsV2(r.body);
    if (!page) return BadReply("list", key_prefix, r);
    if (auto st = fn(*page); !st) return st;
    if (!page->truncated) return {};
    // More follows, but from where? Without a new token the next request
    // would start over (or ask for the same page) forever.
    if (page->next_token.empty() || page->next_token == token)
      return BadReply("list: no new continuation token", key_prefix, r);
    token = page->next_token;
  }
}

}  // namespace ckpt::backend::s3impl
