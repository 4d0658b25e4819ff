// failpoint.h — named crash points for the crash harness (tests/crash),
// and named I/O faults for the mounted cases.
//
//   CKPTFS_FAILPOINT=name        the daemon kills itself (SIGKILL, no clean-up,
//                                like a crash) the first time it reaches `name`
//   CKPTFS_FAILPOINT=name@N      ... the Nth time
//
// Always compiled in. When the variable is unset, FAILPOINT(name) costs one
// predictable branch on a global read once at start-up.
//
// Names in use (keep docs/consistency.md in step):
//   drain.mid_transfer    a file's bytes are half staged in the backend
//   drain.after_publish   the backend shows the file under its final name,
//                         RocksDB does not yet record it as persisted
//   meta.after_commit     an operation's WriteBatch is committed, the kernel
//                         has not had the reply
//   evict.mid             eviction recorded "remote", the tier bytes not yet freed
//   load.recovery         start-up recovery half done (metadata fixed, log not
//                         yet resumed)
//   replica.rename.mid    a replica store's rename: the meta linked to the new
//                         name, the data not yet renamed
//   takeover.published    a holder published a dead writer's file to the
//                         backend, its replica not yet marked published nor
//                         its claim marked done
//   replica.held          a holder of a writer's file version answered HELD
//                         (each holder's HELD is a hit); nothing after it
//                         done (its checksum for a restart's read-back must
//                         be kept already)
//   takeover.gave_up      a holder gave a dead writer's entry up and dropped
//                         its replica; its mark (with the entry's names) may
//                         not be in etcd yet
//
//   CKPTFS_FAULT=name:FILE       FAULT(name) is true, and the caller fails its
//                                operation (EIO, or as its entry says), each time it is reached
//                                while FILE exists: a disk error a test turns
//                                on (touch FILE) at the moment it chooses;
//                                name may be several, comma-separated
//
// Always compiled in; unset, FAULT(name) costs one predictable branch.
//
// Faults in use (keep docs/consistency.md in step):
//   meta.write            a metadata write or WAL sync (fs/meta/rocks_kv.cc),
//                         as when the state dir's disk fails
//   fuse.throw            every FUSE callback throws std::runtime_error at its
//                         top (fs/fuse/fuse_ops.cc Guard): it must answer EIO
//   fuse.nomem            ... throws std::bad_alloc: it must answer ENOMEM
//   etcd.cut              every request to etcd fails and open watches end
//                         (fs/cluster/etcd_client.cc): a node cut off from
//                         the cluster store
//   takeover.publish      a holder's publish of a dead writer's file fails
//                         before anything reaches the backend (fs/cluster/
//                         takeover.cc Publish): tried again next pass
//   takeover.mark         a holder's mark of a claimed entry (done, given up,
//                         with a give-up's names) fails (fs/cluster/
//                         etcd_claims.cc MarkTaken): its names not in etcd
//   replica.note          a holder's note of a mark (Store::KeepNote) cannot
//                         be written, as on a full tier: the give-up keeps
//                         its replica until the mark is in etcd instead
//   s3.exchange.after_first_move   an S3 Rename with exchange stops after its
//                         first move (backend/s3_backend.cc Rename): a
//                         half-done exchange for the retry to finish
#pragma once

#include <string_view>

namespace ckpt {

namespace failpoint_detail {
extern const char* armed;  // nullptr when CKPTFS_FAILPOINT is unset
void Hit(std::string_view name);
extern const char* fault_armed;  // nullptr when CKPTFS_FAULT is unset
bool FaultOn(std::string_view name);
}  // namespace failpoint_detail

// Reads CKPTFS_FAILPOINT and CKPTFS_FAULT. Call once at start-up, before any thread starts.
void InitFailpoints();

}  // namespace ckpt

#define FAILPOINT(name)                                                               \
  do {                                                                                \
    if (__builtin_expect(::ckpt::failpoint_detail::armed != nullptr, 0)) [[unlikely]] \
      ::ckpt::failpoint_detail::Hit(name);                                            \
  } while (0)

#define FAULT(name) \
  (__builtin_expect(::ckpt::failpoint_detail::fault_armed != nullptr, 0) && ::ckpt::failpoint_detail::FaultOn(name))
