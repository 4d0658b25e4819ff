// keys.h — the metadata key schema, named once (3FS KeyPrefix-def.h).
// The same table is in docs/metadata-schema.md; change both together.
//
// | prefix | key                                   | value                                  |
// |--------|---------------------------------------|----------------------------------------|
// | 'F'    | "F"                                   | format record: magic, version, fs id   |
// | 'B'    | "B"                                   | backend this state dir is bound to     |
// | 'C'    | "C" + name                            | counter, u64 big-endian (next_ino, ..) |
// | 'I'    | "I" + ino (u64 BE)                    | InodeRecord (meta_store.cc encoding)   |
// | 'D'    | "D" + parent ino (u64 BE) + name      | child ino (u64 BE) + file type (u8)    |
// | 'X'    | "X" + ino (u64 BE) + name             | xattr value bytes                      |
// | 'L'    | "L" + seq (u64 BE)                    | drain log entry                        |
// | 'Z'    | "Z" + seq (u64 BE)                    | lost file: path \0 reason              |
// | 'Q'    | "Q" + seq (u64 BE)                    | failed log entry: path \0 reason       |
// | 'S'    | "S" + ino (u64 BE) + version (u64 BE) | content checksum sent with its replicas |
//
// Inode numbers and sequence numbers are big-endian so that a prefix scan
// returns them in numeric order (as JuiceFS does for chunk indexes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::meta {

inline constexpr char kFormatKey[] = "F";
inline constexpr char kBackendKey[] = "B";  // the backend URL this state dir belongs to
inline constexpr char kCounterPrefix = 'C';
inline constexpr char kInodePrefix = 'I';
inline constexpr char kDentryPrefix = 'D';
inline constexpr char kXattrPrefix = 'X';
inline constexpr char kLogPrefix = 'L';
inline constexpr char kLostPrefix = 'Z';    // Z <seq u64 BE> -> "path\0reason"
inline constexpr char kFailedPrefix = 'Q';  // Q <seq u64 BE> -> "path\0reason"
inline constexpr char kSentSumPrefix = 'S';  // S <ino u64 BE> <version u64 BE> -> hi, lo (u64 BE each)

inline constexpr uint64_t kRootIno = 1;

inline void AppendU64BE(std::string* s, uint64_t v) {
  for (int i = 7; i >= 0; i--) s->push_back(static_cast<char>((v >> (i * 8)) & 0xff));
}

inline uint64_t ReadU64BE(std::string_view s, size_t off = 0) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; i++) v = (v << 8) | static_cast<uint8_t>(s[off + i]);
  return v;
}

// Counter names (CounterKey).
inline constexpr char kNextInoCounter[] = "next_ino";     // the next inode number to hand out
inline constexpr char kAppliedCounter[] = "applied_seq";  // every log entry up to here is applied
inline constexpr char kImportedCounter[] = "imported";    // 1 once the backend was imported (first mount)
inline constexpr char kCheckpointCounter[] = "next_ckpt";  // the next checkpoint number (InodeRecord::ckpt_ord)

inline std::string CounterKey(std::string_view name) {
  std::string k(1, kCounterPrefix);
  k.append(name);
  return k;
}

inline std::string InodeKey(uint64_t ino) {
  std::string k(1, kInodePrefix);
  AppendU64BE(&k, ino);
  return k;
}

inline std::string DentryPrefix(uint64_t parent) {
  std::string k(1, kDentryPrefix);
  AppendU64BE(&k, parent);
  return k;
}

inline std::string DentryKey(uint64_t parent, std::string_view name) {
  std::string k = DentryPrefix(parent);
  k.append(name);
  return k;
}

inline std::string XattrPrefix(uint64_t ino) {
  std::string k(1, kXattrPrefix);
  AppendU64BE(&k, ino);
  return k;
}

inline std::string XattrKey(uint64_t ino, std::string_view name) {
  std::string k = XattrPrefix(ino);
  k.append(name);
  return k;
}

inline std::string LogKey(uint64_t seq) {
  std::string k(1, kLogPrefix);
  AppendU64BE(&k, seq);
  return k;
}

inline std::string LostKey(uint64_t seq) {
  std::string k(1, kLostPrefix);
  AppendU64BE(&k, seq);
  return k;
}

inline std::string FailedKey(uint64_t seq) {
  std::string k(1, kFailedPrefix);
  AppendU64BE(&k, seq);
  return k;
}

inline std::string SentSumKey(uint64_t ino, uint64_t version) {
  std::string k(1, kSentSumPrefix);
  AppendU64BE(&k, ino);
  AppendU64BE(&k, version);
  return k;
}

}  // namespace ckpt::meta
