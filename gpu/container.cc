// container.cc — building and checking safetensors headers (container.h),
// with nlohmann::json (the JSON library the CLI already uses): ordered_json
// keeps the tensors in the order they were given.
#include "gpu/container.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/io.h"

namespace ckpt::gpu {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kMetaKey[] = "__metadata__";

std::unexpected<int> Fail(std::string* why, std::string msg) {
  *why = std::move(msg);
  return Err(EINVAL);
}

// prod(shape) * size, or false when it does not fit 64 bits or a dimension
// is negative.
bool ShapeBytes(const std::vector<int64_t>& shape, uint64_t size, uint64_t* out) {
  unsigned __int128 n = size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<uint64_t>(d);
    if (n > UINT64_MAX) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

uint64_t DtypeSize(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},      {"I8", 1},       {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},
      {"F16", 2},  {"BF16", 2},    {"I32", 4},      {"U32", 4},     {"F32", 4},     {"I64", 8}, {"U64", 8},
      {"F64", 8},  {"C64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

Result<Layout> BuildHeader(const std::vector<TensorSpec>& tensors, const Metadata& meta, std::string* why) {
  Json j = Json::object();
  if (!meta.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : meta) m[k] = v;
    j[kMetaKey] = std::move(m);
  }
  Layout out;
  uint64_t at = 0;
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); i++) {
    const TensorSpec& t = tensors[i];
    std::string what = "tensor " + std::to_string(i) + " '" + t.name + "'";
    if (t.name == kMetaKey) return Fail(why, what + ": the name is reserved");
    if (!names.insert(t.name).second) return Fail(why, what + ": the name is used twice");
    uint64_t size = DtypeSize(t.dtype);
    if (!size) return Fail(why, what + ": unknown dtype '" + t.dtype + "'");
    std::vector<int64_t> shape = t.shape;
    if (t.flat) {
      if (t.nbytes % size) return Fail(why, what + ": " + std::to_string(t.nbytes) + " bytes is not whole " + t.dtype);
      shape = {static_cast<int64_t>(t.nbytes / size)};
    }
    uint64_t want = 0;
    if (!ShapeBytes(shape, size, &want) || want != t.nbytes)
      return Fail(why, what + ": shape " + ShapeText(shape) + " of " + t.dtype + " is not " +
                           std::to_string(t.nbytes) + " bytes");
    j[t.name] = Json{{"dtype", t.dtype}, {"shape", shape}, {"data_offsets", {at, at + t.nbytes}}};
    out.offsets.push_back(at);
    at += t.nbytes;
  }
  std::string body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  body.resize((body.size() + 7) / 8 * 8, ' ');
  if (body.size() > kMaxHeader) return Fail(why, "the header would be " + std::to_string(body.size()) + " bytes");
  uint64_t n = body.size();
  out.header.resize(8);
  for (int b = 0; b < 8; b++) out.header[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  out.header += body;
  for (uint64_t& o : out.offsets) o += out.header.size();
  out.total = out.header.size() + at;
  return out;
}

Result<Parsed> ParseHeader(int fd, uint64_t size, std::string* why) {
  auto fail = [&](std::string msg) -> Result<Parsed> {
    *why = std::move(msg);
    return Err(EINVAL);
  };
  if (size < 8) return fail("not a safetensors file: " + std::to_string(size) + " bytes");
  unsigned char len[8];
  if (int e = PreadFull(fd, reinterpret_cast<char*>(len), 8, 0)) {
    *why = "reading the header: " + ErrStr(e);
    return Err(e);
  }
  uint64_t n = 0;
  for (int b = 7; b >= 0; b--) n = (n << 8) | len[b];
  if (n < 2 || n > kMaxHeader || n > size - 8)
    return fail("not a safetensors file: header length " + std::to_string(n) + " in a file of " +
                std::to_string(size) + " bytes");
  Parsed p;
  p.json.resize(n);
  if (int e = PreadFull(fd, p.json.data(), n, 8)) {
    *why = "reading the header: " + ErrStr(e);
    return Err(e);
  }
  p.data_start = 8 + n;
  while (!p.json.empty() && p.json.back() == ' ') p.json.pop_back();
  Json j = Json::parse(p.json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("not a safetensors file: the header is not a JSON object");
  uint64_t data = size - p.data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == kMetaKey) {
      if (!v.is_object()) return fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return fail("__metadata__ '" + m.key() + "' is not a string");
        p.meta.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    std::string what = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return fail(what + ": wants dtype, shape and data_offsets");
    StoredTensor t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    for (const Json& d : v["shape"]) {
      if (!d.is_number_unsigned()) return fail(what + ": a dimension is not a whole number");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) return fail(what + ": a dimension is too large");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const Json& o = v["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) return fail(what + ": bad data_offsets");
    uint64_t b = o[0].get<uint64_t>(), e = o[1].get<uint64_t>();
    if (b > e || e > data) return fail(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                                       "] outside the " + std::to_string(data) + " data bytes");
    uint64_t esize = DtypeSize(t.dtype), want = 0;
    if (!esize) return fail(what + ": unknown dtype '" + t.dtype + "'");
    if (!ShapeBytes(t.shape, esize, &want) || want != e - b)
      return fail(what + ": shape " + ShapeText(t.shape) + " of " + t.dtype + " is not " + std::to_string(e - b) +
                  " bytes");
    t.offset = p.data_start + b;
    t.nbytes = e - b;
    p.tensors.push_back(std::move(t));
  }
  std::stable_sort(p.tensors.begin(), p.tensors.end(),
                   [](const StoredTensor& a, const StoredTensor& b) { return a.offset < b.offset; });
  uint64_t at = p.data_start;
  for (const StoredTensor& t : p.tensors) {
    if (t.offset != at) return fail("tensor '" + t.name + "': the data has a gap or an overlap before it");
    at += t.nbytes;
  }
  if (at != size) return fail("the tensors cover " + std::to_string(at - p.data_start) + " of " +
                              std::to_string(data) + " data bytes");
  return p;
}

}  // namespace ckpt::gpu
