// fuse_abi.h — the parts of the kernel's FUSE wire format (include/uapi/
// linux/fuse.h) that ckptfs's own transport code reads and writes
// (fs/fuse/channel.cc, fs/fuse/fuse_uring.cc): Debian 12's headers predate the
// flags they need, so the layouts are spelled out here, once.
#pragma once

#include <cstdint>

namespace ckpt::fs::fuse_abi {

struct InHeader {  // struct fuse_in_header
  uint32_t len, opcode;
  uint64_t unique, nodeid;
  uint32_t uid, gid, pid;
  uint16_t total_extlen, padding;
};
static_assert(sizeof(InHeader) == 40);

struct OutHeader {  // struct fuse_out_header
  uint32_t len;
  int32_t error;
  uint64_t unique;
};
static_assert(sizeof(OutHeader) == 16);

}  // namespace ckpt::fs::fuse_abi
