// checksum.h — the file checksum every backend computes and verifies: a
// function of a file's logical content (its size and bytes) that costs
// nothing for holes.
//
// Definition (format "xxh128s", version 2 of ckptfs checksums): cut the
// file into 4 KiB blocks at offsets 0, 4096, ...; the last block ends at
// the file size. The checksum is XXH3-128 over, for every block that is not
// all zero bytes in order of offset, the block index (u64 little-endian)
// followed by the block's bytes; then the file size (u64 little-endian).
// Blocks of zeros — holes, or zeros written as data — contribute nothing,
// so a reader that only visits data extents (SEEK_DATA) and one that reads
// every byte (S3, an NFS without SEEK_DATA) get the same value, whatever
// the extents of the file system at hand look like, and a 100 TiB hole
// costs no hashing at all. Every record has a fixed length except the one
// block that holds EOF, whose length follows from the size at the end, so
// the encoding is unambiguous.
//
// Version 1 (until issue #16) was XXH3-128 of the dense bytes, stored as
// `user.ckptfs.xxh128`; it is never compared with a version-2 value: the
// xattr and S3 metadata names differ, and metadata records of the older
// format drop their checksum when read (fs/meta/meta_store.cc).
//
// Thread-safety: a ContentHash belongs to one thread; the functions are
// reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/io.h"
#include "common/xxhash_fast.h"

namespace ckpt::backend {

inline constexpr uint64_t kChecksumBlock = 4096;
// Where the posix backend keeps the checksum, and S3's metadata header.
inline constexpr char kChecksumXattr[] = "user.ckptfs.xxh128s";

using ckpt::AllZero;  // common/io.h: true if the `n` bytes at `p` are all zero

// Streams a file's content in increasing offset order: Update() with the
// bytes at `off` (any length, any alignment; ranges never overlap and come
// in order; whatever lies between two ranges counts as zeros), then
// Finish(size) once.
class ContentHash {
 public:
  ContentHash();
  ~ContentHash();
  ContentHash(const ContentHash&) = delete;
  ContentHash& operator=(const ContentHash&) = delete;
  bool ok() const { return state_ != nullptr; }  // false: out of memory

  void Update(uint64_t off, const char* data, size_t len);
  // The checksum of a file of `size` bytes. REQUIRES: size >= the end of
  // every range given.
  std::pair<uint64_t, uint64_t> Finish(uint64_t size);

 private:
  // Moves the cursor to `off`, closing the partial block if `off` leaves it.
  void SkipTo(uint64_t off);
  void Block(uint64_t index, const char* p, size_t n);

  XXH3_state_t* state_;
  uint64_t pos_ = 0;              // logical offset consumed so far
  char partial_[kChecksumBlock];  // the block holding pos_, when pos_ is not aligned
};

// The checksum of a whole buffer (tests, small files).
std::pair<uint64_t, uint64_t> ContentChecksum(const char* data, size_t size);

// 32 lowercase hex digits, hi then lo; and its inverse.
std::string ChecksumHex(uint64_t hi, uint64_t lo);
bool ParseChecksumHex(std::string_view s, uint64_t* hi, uint64_t* lo);

}  // namespace ckpt::backend
