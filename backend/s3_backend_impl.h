// s3_backend_impl.h — the S3 Backend's class, shared by the files that
// implement it: s3_backend.cc (the Backend interface, keys, moves),
// s3_multipart.cc (staging, multipart uploads and copies, leftover
// uploads) and s3_listing.cc (HEADs, listings, Stat, ListDir, records).
// Requests go through s3::Client (s3_client.h). Included by those files
// only; everyone else sees OpenS3Backend (s3_backend.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/s3_backend.h"
#include "backend/s3_client.h"
#include "backend/s3_xml.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/result.h"

namespace ckpt::backend::s3impl {

using s3::Md5Base64;
using s3::Query;
using s3::Request;
using s3::Response;
using s3::RunParallel;

inline constexpr uint64_t kMinPartSize = 5ull << 20;  // S3's smallest part (but the last)
inline constexpr uint64_t kMaxParts = 10000;
inline constexpr uint64_t kFetchRange = 8ull << 20;
inline constexpr uint64_t kReadChunk = 4ull << 20;
inline constexpr size_t kDeleteBatch = 1000;
// The checksum of backend/checksum.h ("xxh128s"); objects of older daemons
// carry x-amz-meta-ckptfs-xxh128 (dense XXH3-128), which is never compared.
inline constexpr char kMetaChecksum[] = "x-amz-meta-ckptfs-xxh128s";
inline constexpr char kMetaMode[] = "x-amz-meta-ckptfs-mode";
inline constexpr char kMetaMtime[] = "x-amz-meta-ckptfs-mtime";
inline constexpr char kMetaSymlink[] = "x-amz-meta-ckptfs-symlink";
// An exchange's temporary name and its journal (Rename): "xchg-" and a
// hash of the two keys, in the staging area.
inline constexpr char kExchangePrefix[] = "xchg-";

// What a HEAD says about an object.
struct ObjectInfo {
  uint64_t size = 0;
  std::string etag;
  bool has_checksum = false;
  uint64_t hi = 0, lo = 0;
  uint32_t mode = 0;
  bool has_mtime = false;
  int64_t last_modified = 0;  // the Last-Modified header (0: none)
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
  bool symlink = false;
  std::string target;
  std::vector<std::string> meta;  // "x-amz-meta-...: value" lines, to copy them
};

class S3Backend final : public Backend {
 public:
  explicit S3Backend(const S3Config& cfg)
      : cfg_(cfg),
        root_(cfg.prefix.empty() ? std::string() : cfg.prefix + "/"),
        tmp_root_(root_ + kTmpDir + "/"),
        stage_root_(tmp_root_ + (cfg.owner.empty() ? std::string() : cfg.owner + "/")),
        nonce_(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32)),
        http_(cfg_) {
    cfg_.parallel = std::max(1, cfg_.parallel);
    cfg_.max_attempts = std::max(1, cfg_.max_attempts);
    cfg_.list_max_keys = std::clamp(cfg_.list_max_keys, 1, 1000);
    cfg_.part_size = std::max(cfg_.part_size, kMinPartSize);
  }

  // A listing costs a HEAD per object (for the checksum): worth it only
  // for the few files a checkpoint directory has while it is written.
  size_t ListCheaperUpTo() const override { return 32; }
  std::string Describe() const override;

  Status Check() override;

  // Whether the staged object (or upload) `key`, made at `made_sec` (0:
  // unknown), is a leftover: see the file comment.
  bool Leftover(const std::string& key, int64_t made_sec, int64_t now) const;

  Result<Staged> Stage(int src_fd, uint64_t size, const std::function<bool()>& cancelled) override;

  Status Publish(const Staged& s, const std::string& path, const Attrs& a) override;

  void Abort(const Staged& s) override;

  Status Mkdir(const std::string& path, const Attrs& a) override;

  Status Rmdir(const std::string& path) override;

  Status Remove(const std::string& path) override;

  // Cost: a file is one server-side copy and a delete; a directory is a
  // LIST plus one copy per object under it (O(bytes) on the store, never
  // through this host unless the store lacks UploadPartCopy for objects
  // over 5 GiB) plus batched deletes. None of it is atomic; see the file
  // comment.
  //
  // An exchange is three moves through a temporary name X in this owner's
  // staging area, (1) f → X, (2) t → f, (3) X → t, each a Move (copies,
  // then deletes). A failure between them must not lose a side: the
  // drainer retries the same entry (this daemon, or the next one after a
  // crash), which must finish the exchange, not see a missing side and
  // answer ENOENT ("nothing to do"). So X is named after the two keys, and
  // a journal J next to it records how many moves are done ("1" after the
  // first, "2" after the second; written once a move has deleted its
  // source, deleted after the third): which names exist cannot tell, as
  // f, t and X all exist between a copy and its delete in every move. A
  // retry reads J:
  //   no J, no X   not started: f and t must both exist (ENOENT if not);
  //   no J, X      move 1 was under way: redone (f partly deleted or gone
  //                is fine: X holds all of f once f's deletion begins);
  //   J = 1        move 1 done, move 2 redone;
  //   J = 2        moves 1 and 2 done, move 3 redone, then J deleted.
  // A move redone (MoveOnce) copies what is left of its source again (the
  // copies are of the same bytes) and deletes it; a source gone with its
  // destination there is a move that finished. J = 2 with X gone is move 3
  // finished, J not yet deleted. Check never removes X or J (Exchanging):
  // X may hold the only copy of f. A whole exchange that finished but was
  // not recorded by the drainer (a crash in between) is swapped again by
  // its replay, as a POSIX replay of renameat2 would.
  Status Rename(const std::string& from, const std::string& to, bool exchange) override;

  Status Symlink(const std::string& path, const std::string& target, const Attrs&) override;

  Status Link(const std::string& from, const std::string& to) override;

  Status SetAttr(const std::string& path, const Attrs&) override;

  Result<std::pair<uint64_t, uint64_t>> Fetch(const std::string& path, int dst_fd, uint64_t size) override;

  Status List(const std::function<void(const Entry&)>& fn) override;

  Result<Entry> Stat(const std::string& path) override;

  // One ListObjectsV2 walk with delimiter '/' (CommonPrefixes are the
  // subdirectories), then a HEAD of each object, `parallel`×4 in flight,
  // for its type, mode, mtime and checksum.
  Result<std::vector<Entry>> ListDir(const std::string& dir) override;

  Status PutRecord(const std::string& dir, const std::string& name, const std::string& bytes) override;

  Result<std::vector<std::pair<std::string, std::string>>> ListRecords(const std::string& dir) override;

 private:
  std::unexpected<int> Fail(int e, std::string_view what, std::string_view key) const;

  std::unexpected<int> BadReply(std::string_view what, std::string_view key, const Response& r) const;

  Result<std::string> KeyOf(const std::string& path, std::string_view op) const;

  static bool ValidToken(std::string_view t);

  std::string UniqueName(std::string_view prefix);

  static std::string ModeStr(uint32_t mode);

  static std::string MtimeStr(int64_t sec, uint32_t nsec);

  static ObjectInfo InfoFrom(const Response& r);

  // HEADs every listed item's key (`parallel`×4 in flight) into its
  // `info`; one removed while it was listed is marked `gone`, and so is
  // one these credentials may list but not read (403: a bucket policy on
  // that key), with a warning: one such object failed the whole listing,
  // and so the mount. A 400 still fails it: a HEAD has no body to tell an
  // SSE-C object from an expired token. 0 or an errno.
  template <class Item>
  int HeadEach(std::vector<Item>& items, std::string_view what, bool quiet_all) {
    return RunParallel(items.size(), cfg_.parallel * 4, [&](size_t i) -> int {
      auto info = Head(items[i].key, what, /*quiet_404=*/true, quiet_all);
      if (!info && info.error() == ENOENT) {
        items[i].gone = true;  // removed while we listed
        return 0;
      }
      if (!info && info.error() == EACCES) {
        LOG_WARN(
            "s3 backend: {}: skipping '{}': listed, but its HEAD is refused ({}): not readable with these "
            "credentials",
            what, EscapeName(items[i].key), ErrStr(info.error()));
        items[i].gone = true;
        return 0;
      }
      if (!info) return info.error();
      items[i].info = std::move(*info);
      return 0;
    });
  }

  // `quiet_all`: no error line at all (Stat, ListDir: their caller logs).
  Result<ObjectInfo> Head(const std::string& key, std::string_view what, bool quiet_404 = false,
                          bool quiet_all = false);

  // Whether a key with a valid relative path (s3::RelPath) lies under
  // `key_prefix`: what makes a prefix a directory, as List decides. Stops
  // at the first one: one short listing in the usual case. No error line.
  Result<bool> HasValidKey(const std::string& key_prefix);

  // The Entry of the object at relative `path` that a HEAD described;
  // where the object has no mtime of ours, `listed_mtime` (the listing's
  // LastModified) or else the HEAD's Last-Modified: the same second, so an
  // object another tool wrote does not look changed between List, ListDir
  // and Stat.
  static Entry EntryOf(const std::string& path, const ObjectInfo& info, int64_t listed_mtime);

  // A missing bucket answers 404 NoSuchBucket, read as ENOENT elsewhere;
  // for Stat and ListDir it means the store is unreachable: EIO.
  std::unexpected<int> NoBucketIsEio(int e, const Response& r) const;

  // Whether the object `key` itself exists (not a directory under it). A
  // missing bucket is EIO (ListPages), never "no".
  Result<bool> ObjectExists(const std::string& key);

  // Whether `key` names an object or a non-empty directory.
  Result<bool> Exists(const std::string& key);

  Status Delete(const std::string& key);

  // Calls fn for every object under `key_prefix`, in key order.
  Status ListKeys(const std::string& key_prefix, const std::function<void(const s3::ListedObject&)>& fn);

  // Calls fn for every page of ListObjectsV2 under `key_prefix` (keys
  // decoded), in key order; stops at the first error, fn's included.
  // With a `delimiter`, keys past it are rolled up into common prefixes.
  // A missing bucket is EIO here (the store is unreachable), not ENOENT.
  Status ListPages(const std::string& key_prefix, const std::function<Status(const s3::ListPage&)>& fn,
                   const std::string& delimiter = {}, bool quiet_all = false);

  // DeleteObjects in batches of 1000 (Content-MD5 is required by S3).
  Status DeleteKeys(const std::vector<std::string>& keys);

  Status AbortLeftoverUploads(int64_t now);

  Status AbortUpload(const std::string& key, const std::string& upload_id);

  void RememberOrphan(const std::string& key, const std::string& upload_id);

  // Aborts the uploads whose abort failed earlier; keeps those that fail again.
  void AbortOrphans();

  Result<std::string> InitiateUpload(const std::string& key, const std::vector<std::string>& headers);

  Status CompleteUpload(const std::string& key, const std::string& upload_id, const std::vector<std::string>& etags,
                        uint64_t size);

  Result<Staged> StageSmall(int src_fd, uint64_t size, const std::function<bool()>& cancelled);

  // Parts are read in order here (hashing them) and uploaded by `parallel`
  // threads; at most parallel + 1 part buffers exist.
  Result<Staged> StageMultipart(int src_fd, uint64_t size, const std::function<bool()>& cancelled);

  // Copies object `src` (`size` bytes) to `dst`. With `meta`, the copy gets
  // those metadata headers (REPLACE); without, it keeps the source's.
  Status Copy(const std::string& src, const std::string& dst, uint64_t size, const std::vector<std::string>* meta);

  // A multipart copy: UploadPartCopy, or GET + UploadPart when
  // `through_client`. ENOTSUP when the store has no UploadPartCopy.
  Status CopyMultipart(const std::string& src, const std::string& dst, uint64_t size,
                       const std::vector<std::string>& headers, bool through_client);

  // Moves the object `from` and everything under `from/` to `to`: copies
  // first, deletes after, so a failure leaves the source whole.
  Status Move(const std::string& from, const std::string& to);

  // Move for an exchange that may be resumed (Rename): redone while any of
  // `from` is left; `from` gone with `to` there is a move that finished.
  Status MoveOnce(const std::string& from, const std::string& to);

  // The moves an exchange's journal `j` records as done: 0 (none, or no
  // journal), 1 or 2.
  Result<int> ExchangeMoves(const std::string& j);

  Status SetExchangeMoves(const std::string& j, int moves);

  // Whether `key` is an exchange's temporary, under it, or its journal:
  // "<tmp_root_>[OWNER/]xchg-..." (OWNER is one component).
  bool Exchanging(std::string_view key) const;

  S3Config cfg_;
  const std::string root_;        // "<prefix>/" or "" — every key starts with it
  const std::string tmp_root_;    // "<prefix>/.ckptfs-tmp/"
  const std::string stage_root_;  // where this backend stages: tmp_root_ + "OWNER/"
  const uint64_t nonce_;
  std::atomic<uint64_t> counter_{0};
  std::atomic<bool> no_part_copy_{false};  // the store answered UploadPartCopy with 501
  s3::Client http_;                        // after cfg_, which it reads
  Mutex mu_;                               // a leaf
  std::unordered_map<std::string, std::shared_ptr<std::string>> small_ GUARDED_BY(mu_);  // staged in memory
  std::vector<std::pair<std::string, std::string>> orphans_ GUARDED_BY(mu_);             // (key, upload id) to abort
};

}  // namespace ckpt::backend::s3impl
