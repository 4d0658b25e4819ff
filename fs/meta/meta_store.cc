// meta_store.cc — encoding of the metadata schema.
//
// InodeRecord is encoded as a version byte, fixed-width fields in host byte
// order (memcpy: little-endian on x86-64 and arm64; a state dir is not
// portable to a big-endian host), then two length-prefixed strings. Decoding checks lengths, so a torn or foreign
// value is an EIO, never a crash. Older formats still decode: an inode of
// format 2 carries a checksum of the dense bytes (checksum version 1), which
// is dropped (0, 0: verified by size only, logged once at load) rather than
// compared with the sparse-aware checksum of backend/checksum.h; a log
// entry of format 2 has no owner (has_owner = false).
#include "fs/meta/meta_store.h"

#include <cstring>
#include <random>

#include "common/log.h"

namespace ckpt::meta {
namespace {

// 2: sealed_size; 3: checksum of backend/checksum.h; 4: checkpoint number
// and memory-only flag (formats 2 and 3 are read as 0 and false).
constexpr uint8_t kInodeFormat = 4;
constexpr uint8_t kOldInodeFormat = 2;
constexpr uint8_t kNoCheckpointFormat = 3;
constexpr uint8_t kLogFormat = 3;     // 3: uid, gid, has_owner
constexpr uint8_t kOldLogFormat = 2;  // the inode format's byte, shared until format 3
constexpr char kMagic[] = "ckptfs-meta";
constexpr uint32_t kFormatVersion = 2;  // 2: sealed_size, snapshots, lost list

template <class T>
void PutRaw(std::string* s, T v) {
  char buf[sizeof(T)];
  memcpy(buf, &v, sizeof(T));
  s->append(buf, sizeof(T));
}

void PutStr(std::string* s, const std::string& v) {
  PutRaw<uint32_t>(s, static_cast<uint32_t>(v.size()));
  s->append(v);
}

class Reader {
 public:
  explicit Reader(std::string_view v) : v_(v) {}
  template <class T>
  bool Get(T* out) {
    if (pos_ + sizeof(T) > v_.size()) return false;
    memcpy(out, v_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetStr(std::string* out) {
    uint32_t n;
    if (!Get(&n) || pos_ + n > v_.size()) return false;
    out->assign(v_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == v_.size(); }

 private:
  std::string_view v_;
  size_t pos_ = 0;
};

}  // namespace

const char* DataStateName(DataState s) {
  switch (s) {
    case DataState::kDirty: return "dirty";
    case DataState::kDraining: return "draining";
    case DataState::kPersisted: return "persisted";
    case DataState::kRemote: return "remote";
    case DataState::kFailed: return "failed";
    case DataState::kMemoryOnly: return "memory-only";
  }
  return "unknown";
}

std::string EncodeInode(const InodeRecord& r) {
  std::string s;
  s.reserve(128 + r.name.size() + r.target.size());
  PutRaw<uint8_t>(&s, kInodeFormat);
  PutRaw(&s, r.ino);
  PutRaw(&s, r.parent);
  PutRaw(&s, r.mode);
  PutRaw(&s, r.uid);
  PutRaw(&s, r.gid);
  PutRaw(&s, r.nlink);
  PutRaw(&s, r.size);
  PutRaw(&s, r.rdev);
  for (const Timespec* t : {&r.atime, &r.mtime, &r.ctime}) {
    PutRaw(&s, t->sec);
    PutRaw(&s, t->nsec);
  }
  PutRaw(&s, r.version);
  PutRaw(&s, static_cast<uint8_t>(r.state));
  PutRaw(&s, r.checksum_hi);
  PutRaw(&s, r.checksum_lo);
  PutRaw(&s, r.sealed_size);
  PutStr(&s, r.name);
  PutStr(&s, r.target);
  PutRaw(&s, r.ckpt_ord);
  PutRaw<uint8_t>(&s, r.memory_only ? 1 : 0);
  return s;
}

Result<InodeRecord> DecodeInode(std::string_view v) {
  Reader rd(v);
  InodeRecord r;
  uint8_t fmt = 0, state = 0;
  bool ok = rd.Get(&fmt) && (fmt == kInodeFormat || fmt == kNoCheckpointFormat || fmt == kOldInodeFormat) &&
            rd.Get(&r.ino) && rd.Get(&r.parent) &&
            rd.Get(&r.mode) && rd.Get(&r.uid) && rd.Get(&r.gid) && rd.Get(&r.nlink) && rd.Get(&r.size) &&
            rd.Get(&r.rdev);
  for (Timespec* t : {&r.atime, &r.mtime, &r.ctime}) ok = ok && rd.Get(&t->sec) && rd.Get(&t->nsec);
  ok = ok && rd.Get(&r.version) && rd.Get(&state) && state < kDataStates && rd.Get(&r.checksum_hi) &&
       rd.Get(&r.checksum_lo) && rd.Get(&r.sealed_size) && rd.GetStr(&r.name) && rd.GetStr(&r.target);
  uint8_t memory_only = 0;
  if (fmt == kInodeFormat) ok = ok && rd.Get(&r.ckpt_ord) && rd.Get(&memory_only) && memory_only <= 1;
  ok = ok && rd.done();
  if (!ok) return Err(EIO);
  r.memory_only = memory_only != 0;
  r.state = static_cast<DataState>(state);
  if (fmt == kOldInodeFormat) r.checksum_hi = r.checksum_lo = 0;  // another kind of checksum: unknown
  return r;
}

const char* LogOpName(LogOp op) {
  switch (op) {
    case LogOp::kPersist: return "persist";
    case LogOp::kMkdir: return "mkdir";
    case LogOp::kRmdir: return "rmdir";
    case LogOp::kUnlink: return "unlink";
    case LogOp::kRename: return "rename";
    case LogOp::kSymlink: return "symlink";
    case LogOp::kLink: return "link";
    case LogOp::kSetattr: return "setattr";
  }
  return "unknown";
}

std::string EncodeLogEntry(const LogEntry& e) {
  std::string s;
  PutRaw<uint8_t>(&s, kLogFormat);
  PutRaw(&s, e.seq);
  PutRaw(&s, static_cast<uint8_t>(e.op));
  PutRaw(&s, e.flags);
  PutRaw(&s, e.ino);
  PutRaw(&s, e.version);
  PutRaw(&s, e.mode);
  PutRaw(&s, e.mtime.sec);
  PutRaw(&s, e.mtime.nsec);
  PutStr(&s, e.path);
  PutStr(&s, e.path2);
  PutRaw(&s, e.uid);
  PutRaw(&s, e.gid);
  PutRaw<uint8_t>(&s, e.has_owner ? 1 : 0);
  return s;
}

Result<LogEntry> DecodeLogEntry(std::string_view v) {
  Reader rd(v);
  LogEntry e;
  uint8_t fmt = 0, op = 0;
  bool ok = rd.Get(&fmt) && (fmt == kLogFormat || fmt == kOldLogFormat) && rd.Get(&e.seq) && rd.Get(&op) && op >= 1 &&
            op <= 8 && rd.Get(&e.flags) && rd.Get(&e.ino) && rd.Get(&e.version) && rd.Get(&e.mode) &&
            rd.Get(&e.mtime.sec) && rd.Get(&e.mtime.nsec) && rd.GetStr(&e.path) && rd.GetStr(&e.path2);
  uint8_t has_owner = 0;
  if (ok && fmt == kLogFormat) ok = rd.Get(&e.uid) && rd.Get(&e.gid) && rd.Get(&has_owner) && has_owner <= 1;
  ok = ok && rd.done();
  if (!ok) return Err(EIO);
  e.has_owner = has_owner == 1;
  e.op = static_cast<LogOp>(op);
  return e;
}

Status MetaStore::ForEachLogEntry(const std::function<void(LogEntry&&)>& fn) {
  int err = 0;
  auto st = kv_->Scan(std::string(1, kLogPrefix), [&](std::string_view k, std::string_view v) {
    auto e = DecodeLogEntry(v);
    if (!e || k.size() != 9 || ReadU64BE(k, 1) != e->seq) {
      LOG_ERROR("metadata: undecodable drain log entry");
      err = EIO;
      return false;
    }
    fn(std::move(*e));
    return true;
  });
  if (!st) return st;
  if (err) return Err(err);
  return {};
}

namespace {
std::string PathNote(std::string_view path, std::string_view reason) {
  std::string v(path);
  v.push_back('\0');
  v.append(reason);
  return v;
}
}  // namespace

void MetaStore::PutLost(Batch* b, uint64_t seq, std::string_view path, std::string_view reason) {
  b->Put(LostKey(seq), PathNote(path, reason));
}

void MetaStore::PutFailed(Batch* b, uint64_t seq, std::string_view path, std::string_view reason) {
  b->Put(FailedKey(seq), PathNote(path, reason));
}

Status MetaStore::ScanPathNotes(char prefix,
                                const std::function<void(uint64_t, std::string_view, std::string_view)>& fn) {
  return kv_->Scan(std::string(1, prefix), [&](std::string_view k, std::string_view v) {
    if (k.size() != 9) return true;
    size_t z = v.find('\0');
    fn(ReadU64BE(k, 1), v.substr(0, z), z == std::string_view::npos ? std::string_view() : v.substr(z + 1));
    return true;
  });
}

void MetaStore::PutDentry(Batch* b, uint64_t parent, std::string_view name, uint64_t ino, uint8_t type) {
  std::string v;
  AppendU64BE(&v, ino);
  v.push_back(static_cast<char>(type));
  b->Put(DentryKey(parent, name), v);
}

void MetaStore::PutCounter(Batch* b, std::string_view name, uint64_t v) {
  std::string s;
  AppendU64BE(&s, v);
  b->Put(CounterKey(name), s);
}

Result<uint64_t> MetaStore::GetCounter(std::string_view name) {
  auto v = kv_->Get(CounterKey(name));
  if (!v) return v.error() == ENOENT ? Result<uint64_t>(0) : Err(v.error());
  if (v->size() != 8) return Err(EIO);
  return ReadU64BE(*v);
}

Result<InodeRecord> MetaStore::GetInode(uint64_t ino) {
  auto v = kv_->Get(InodeKey(ino));
  if (!v) return Err(v.error());
  return DecodeInode(*v);
}

Status MetaStore::ForEachInode(const std::function<void(InodeRecord&&)>& fn) {
  int err = 0;
  uint64_t old_sums = 0;
  auto st = kv_->Scan(std::string(1, kInodePrefix), [&](std::string_view k, std::string_view v) {
    auto r = DecodeInode(v);
    if (!r || k.size() != 9 || ReadU64BE(k, 1) != r->ino) {
      LOG_ERROR("metadata: undecodable inode record under key of {} bytes", k.size());
      err = EIO;
      return false;
    }
    if (!v.empty() && static_cast<uint8_t>(v[0]) == kOldInodeFormat && r->state >= DataState::kPersisted) old_sums++;
    fn(std::move(*r));
    return true;
  });
  if (old_sums)
    LOG_WARN(
        "metadata: {} persisted files carry a checksum of the older, dense kind; they are fetched without "
        "checksum verification until written again",
        old_sums);
  if (!st) return st;
  if (err) return Err(err);
  return {};
}

Status MetaStore::ForEachDentry(const std::function<void(uint64_t, std::string_view, DentryValue)>& fn) {
  int err = 0;
  auto st = kv_->Scan(std::string(1, kDentryPrefix), [&](std::string_view k, std::string_view v) {
    if (k.size() < 10 || v.size() != 9) {
      LOG_ERROR("metadata: malformed directory entry");
      err = EIO;
      return false;
    }
    fn(ReadU64BE(k, 1), k.substr(9), DentryValue{ReadU64BE(v), static_cast<uint8_t>(v[8])});
    return true;
  });
  if (!st) return st;
  if (err) return Err(err);
  return {};
}

Status MetaStore::ForEachXattr(const std::function<void(uint64_t, std::string_view, std::string_view)>& fn) {
  return kv_->Scan(std::string(1, kXattrPrefix), [&](std::string_view k, std::string_view v) {
    if (k.size() > 9) fn(ReadU64BE(k, 1), k.substr(9), v);
    return true;
  });
}

Result<uint64_t> MetaStore::EnsureFormat() {
  auto v = kv_->Get(kFormatKey);
  if (v) {
    size_t mlen = sizeof(kMagic) - 1;
    if (v->size() != mlen + 12 || v->compare(0, mlen, kMagic) != 0) return Err(EINVAL);
    uint32_t ver;
    memcpy(&ver, v->data() + mlen, 4);
    if (ver != kFormatVersion) return Err(EINVAL);
    return ReadU64BE(*v, mlen + 4);
  }
  if (v.error() != ENOENT) return Err(v.error());
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) | rd();
  std::string s(kMagic);
  PutRaw<uint32_t>(&s, kFormatVersion);
  AppendU64BE(&s, id);
  Batch b;
  b.Put(kFormatKey, s);
  if (auto st = kv_->Write(b, true); !st) return Err(st.error());
  return id;
}

Status MetaStore::BindBackend(std::string_view url, std::string* bound) {
  auto v = kv_->Get(kBackendKey);
  if (v) {
    if (*v == url) return {};
    *bound = *v;
    return Err(EXDEV);
  }
  if (v.error() != ENOENT) return Err(v.error());
  Batch b;
  b.Put(kBackendKey, url);
  return kv_->Write(b, true);
}

}  // namespace ckpt::meta
