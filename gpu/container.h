// container.h — the file format of the GPU path: safetensors.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON (padded
// with spaces to a multiple of 8, so the data that follows is 8-aligned),
// then the tensors' bytes, back to back in the order given, with no gaps:
//
//   {"__metadata__": {"step": "100"},
//    "w": {"dtype": "F32", "shape": [1024, 1024], "data_offsets": [0, 4194304]}, ...}
//
// data_offsets are relative to the first data byte. This is the safetensors
// format exactly (huggingface/safetensors, docs "Format"), so its readers —
// the safetensors package, candle, transformers — read what ckptfs writes,
// and ckptfs reads theirs. Why not torch's zip format: it needs torch to
// write or read, its members are compressed-or-stored by Python code, and its
// layout is not a plain stream of tensor bytes, which the pipeline copies in
// one pass.
//
// ParseHeader checks everything a hostile file could lie about (length,
// JSON, dtype, shape × element size = byte range, ranges inside the file,
// contiguous, no overlap) and says what is wrong in `why`: EINVAL for a file
// that is not a container, EIO for a read error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace ckpt::gpu {

// The header's size limit (the safetensors reader refuses more too).
inline constexpr uint64_t kMaxHeader = 100ull << 20;

struct TensorSpec {
  std::string name;
  std::string dtype;           // "F32", "BF16", "U8", ... (safetensors names)
  std::vector<int64_t> shape;  // empty with `flat`: [nbytes / element size]
  bool flat = false;           // no shape given
  uint64_t nbytes = 0;
};

using Metadata = std::vector<std::pair<std::string, std::string>>;

struct Layout {
  std::string header;            // the length, the JSON and its padding
  std::vector<uint64_t> offsets;  // each tensor's offset in the file
  uint64_t total = 0;             // the file's size
};

// Bytes per element of a safetensors dtype, 0 for a name it does not know.
uint64_t DtypeSize(const std::string& dtype);

// The header for these tensors, in this order. EINVAL (with `why`) for a
// duplicate or reserved name, an unknown dtype, or a shape whose size is
// not nbytes.
[[nodiscard]] Result<Layout> BuildHeader(const std::vector<TensorSpec>& tensors, const Metadata& meta,
                                         std::string* why);

struct StoredTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in the file
  uint64_t nbytes = 0;
};

struct Parsed {
  std::vector<StoredTensor> tensors;  // in file order
  Metadata meta;
  uint64_t data_start = 0;
  std::string json;  // the header's JSON as stored (padding trimmed)
};

// Reads and checks the header of the container open at `fd`, `size` bytes.
[[nodiscard]] Result<Parsed> ParseHeader(int fd, uint64_t size, std::string* why);

}  // namespace ckpt::gpu
