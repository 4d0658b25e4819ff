// test_container.cc — safetensors headers (gpu/container.h): the exact
// bytes written, and hostile headers refused with a reason, never a crash.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gpu/container.h"

using namespace ckpt;
using namespace ckpt::gpu;

namespace {

// A file holding `header` (length prefix included) and `data`; returns its fd.
int FileOf(const std::string& bytes) {
  char tmpl[] = "/tmp/gpu_container_XXXXXX";
  int fd = mkstemp(tmpl);
  cr_assert_geq(fd, 0);
  unlink(tmpl);
  cr_assert_eq(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  return fd;
}

std::string WithLength(const std::string& json) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int b = 0; b < 8; b++) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out + json;
}

int Parse(const std::string& bytes, std::string* why) {
  int fd = FileOf(bytes);
  auto p = ParseHeader(fd, bytes.size(), why);
  close(fd);
  return p ? 0 : p.error();
}

}  // namespace

Test(container, header_bytes_are_safetensors) {
  std::string why;
  auto l = BuildHeader({TensorSpec{"w", "F32", {2, 3}, false, 24}, TensorSpec{"b", "BF16", {}, true, 6}},
                       {{"step", "10"}}, &why);
  cr_assert(l.has_value(), "%s", why.c_str());
  std::string json = R"({"__metadata__":{"step":"10"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                     R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}})";
  uint64_t n = 0;
  for (int b = 7; b >= 0; b--) n = (n << 8) | static_cast<unsigned char>(l->header[b]);
  cr_assert_eq(n % 8, 0u, "the data starts 8-aligned");
  cr_assert_eq(n, l->header.size() - 8);
  std::string body = l->header.substr(8);
  cr_assert_eq(body.substr(0, json.size()), json, "got %s", body.c_str());
  cr_assert(body.find_first_not_of(' ', json.size()) == std::string::npos, "padded with spaces");
  cr_assert_eq(l->offsets[0], l->header.size());
  cr_assert_eq(l->offsets[1], l->header.size() + 24);
  cr_assert_eq(l->total, l->header.size() + 30);

  // And it reads back.
  int fd = FileOf(l->header + std::string(30, 'x'));
  auto p = ParseHeader(fd, l->total, &why);
  close(fd);
  cr_assert(p.has_value(), "%s", why.c_str());
  cr_assert_eq(p->tensors.size(), 2u);
  cr_assert_eq(p->tensors[1].name, "b");
  cr_assert_eq(p->tensors[1].shape.size(), 1u);
  cr_assert_eq(p->tensors[1].shape[0], 3);
  cr_assert_eq(p->meta[0].second, "10");
}

Test(container, names_are_escaped) {
  std::string why;
  std::string name = "layer\"0\"\\\n\x01/ü";
  auto l = BuildHeader({TensorSpec{name, "U8", {}, true, 1}}, {{"k\"", "v\n"}}, &why);
  cr_assert(l.has_value(), "%s", why.c_str());
  int fd = FileOf(l->header + "z");
  auto p = ParseHeader(fd, l->total, &why);
  close(fd);
  cr_assert(p.has_value(), "%s", why.c_str());
  cr_assert_eq(p->tensors[0].name, name);
  cr_assert_eq(p->meta[0].first, "k\"");
}

Test(container, bad_tensors_are_refused) {
  std::string why;
  cr_assert_eq(BuildHeader({TensorSpec{"a", "F32", {2}, false, 7}}, {}, &why).error(), EINVAL);
  cr_assert(why.find("not 7 bytes") != std::string::npos, "why: %s", why.c_str());
  cr_assert_eq(BuildHeader({TensorSpec{"a", "F33", {}, true, 4}}, {}, &why).error(), EINVAL);
  cr_assert_eq(BuildHeader({TensorSpec{"a", "F32", {}, true, 6}}, {}, &why).error(), EINVAL);
  cr_assert_eq(BuildHeader({TensorSpec{"__metadata__", "U8", {}, true, 1}}, {}, &why).error(), EINVAL);
  cr_assert_eq(BuildHeader({TensorSpec{"a", "U8", {-1}, false, 1}}, {}, &why).error(), EINVAL);
  cr_assert_eq(BuildHeader({TensorSpec{"a", "F64", {1ll << 40, 1ll << 40}, false, 8}}, {}, &why).error(), EINVAL);
}

Test(container, hostile_headers_are_refused) {
  std::string why;
  const char* cases[] = {
      "[1,2]",
      "{\"a\": 5}",
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}",   // 8 bytes wanted
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 400]}}", // past the end
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 0]}}",    // reversed
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}}",    // a gap before
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}}",    // does not cover
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [-4], \"data_offsets\": [0, 4]}}",
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [4.5], \"data_offsets\": [0, 4]}}",
      "{\"a\": {\"dtype\": \"XX\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
      "{\"__metadata__\": {\"k\": 1}}",
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}, "
      "\"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}",  // overlap
      "{not json",
  };
  for (const char* c : cases) {
    cr_assert_eq(Parse(WithLength(c) + "dddd", &why), EINVAL, "accepted: %s", c);
    cr_assert(!why.empty());
  }
  // Lengths that lie.
  std::string huge(8, '\xff');
  cr_assert_eq(Parse(huge + "{}", &why), EINVAL);
  cr_assert_eq(Parse(std::string("\x10\0\0\0\0\0\0\0{}", 10), &why), EINVAL);
  cr_assert_eq(Parse("abc", &why), EINVAL);
  // And a good one with the same shapes passes.
  cr_assert_eq(Parse(WithLength("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}") + "dddd",
                     &why),
               0, "%s", why.c_str());
}
