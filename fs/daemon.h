// daemon.h — what one mounted ckptfs daemon owns, its start (daemon.cc), the
// FUSE operation table (fuse_ops.cc) that serves it, and the status channel
// the control commands read through xattrs on the mount root (status.cc).
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse3/fuse_lowlevel.h>

#include <atomic>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/tier.h"
#include "cache/tier_mount.h"
#include "common/config.h"
#include "fs/cluster/cluster.h"
#include "fs/cluster/etcd_names.h"
#include "fs/cluster/etcd_records.h"
#include "fs/cluster/peer_loads.h"
#include "fs/cluster/replicator.h"
#include "fs/cluster/takeover.h"
#include "fs/core/inode_table.h"
#include "fs/core/memory_watch.h"
#include "fs/drain/drain.h"
#include "fs/fuse/channel.h"
#include "fs/fuse/offload_queue.h"
#include "fs/meta/meta_store.h"
#include "fs/views/history.h"
#include "fs/views/metrics.h"

namespace ckpt::fs {

struct Daemon {
  Config cfg;
  uint64_t fs_id = 0;
  std::unique_ptr<meta::MetaStore> store;
  std::unique_ptr<cache::Tier> tier;
  cache::HugeTier huge;  // whether the tier has huge pages (--tier-huge), and why not
  std::unique_ptr<backend::Backend> backend;
  std::unique_ptr<InodeTable> table;
  // --cluster: the cross-node ordering (null without it). Declared before
  // the drainer, which asks it and stops first.
  std::unique_ptr<LogView> cluster_log;
  std::unique_ptr<RecordStore> cluster_store;
  EtcdRecords* etcd_records = nullptr;  // cluster_store, with --cluster-store etcd://
  std::unique_ptr<EtcdNames> etcd_names;  // with it and the shared namespace on
  std::unique_ptr<Cluster> cluster;
  // --replica-listen / --replicas (issue #30): other members' replicas held
  // here, the link to the peers, where they listen, and what this node
  // sends. Null without them. Stopped before the cluster store closes.
  std::unique_ptr<replica::Store> replica_store;
  std::unique_ptr<replica::PeerLoads> peer_loads;  // loads from peers; outlives the link that serves it
  std::unique_ptr<replica::Link> replica_link;
  std::unique_ptr<replica::Peers> replica_peers;
  std::unique_ptr<replica::Replicator> replicator;
  std::unique_ptr<replica::Takeover> takeover;  // publishes dead members' replicas held here
  std::unique_ptr<Drainer> drainer;
  std::unique_ptr<OffloadQueue> space_waiter;  // writes waiting for tier space (null: they wait in place)
  std::unique_ptr<OffloadQueue> fetcher;       // opens that fetch an evicted file first (null: in place)
  std::unique_ptr<OffloadQueue> copier;        // writes that first copy a sealed version aside (null: in place)
  std::unique_ptr<MemoryWatch> memory_watch;  // gives tier memory back under pressure
  std::unique_ptr<FuseChannel> channel;       // our side of /dev/fuse: passthrough, io_uring (null: not mounted yet)
  double attr_timeout = 10.0;                 // the daemon is the only writer of its namespace
  double entry_timeout = 10.0;
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> bytes_read{0};
  // Set by `ckptfs umount` once the drain is done (user.ckptfs.release):
  // at exit the tier is given back if everything in it is persisted.
  std::atomic<bool> release_tier{false};
  std::regex checkpoint_pattern;  // cfg.checkpoint_regex, compiled at start
  std::unique_ptr<History> history;  // STATE_DIR/history.csv
  std::unique_ptr<MetricsServer> metrics;  // --metrics
};

// Runs the daemon in this process: opens the log, metadata, tier and
// backend, mounts cfg.mountpoint and serves until it is unmounted. Reports
// "OK", or the one-line reason it could not start, to `report_fd` (when >= 0,
// then closed; else the reason goes to stderr) once the mount is ready.
// `warnings` (found by the command line before the fork) go to the log.
// Returns the process's exit status (0 after a clean unmount).
int RunDaemon(Config cfg, int report_fd, const std::vector<std::string>& warnings);

// The low-level operation table; fuse_session_new(..., &FuseOps(), ..., daemon).
const fuse_lowlevel_ops& FuseOps();

// status.cc: what the control commands read through xattrs on the root.
inline constexpr char kStatusXattr[] = "user.ckptfs.status";
inline constexpr char kLostXattrPrefix[] = "user.ckptfs.lost.";      // + page number: the lost list
inline constexpr char kCheckpointsXattrPrefix[] = "user.ckptfs.checkpoints.";  // + page: `ckptfs ls`
inline constexpr char kReleaseXattr[] = "user.ckptfs.release";  // setxattr "1": release the tier at exit
inline constexpr char kLostClearXattr[] = "user.ckptfs.lost.clear";  // setxattr: clears it
// setxattr PATH (relative to the mount): `ckptfs skip`, the drain gives up
// on the entry it holds at (OpLog::RequestSkip).
inline constexpr char kSkipXattr[] = "user.ckptfs.skip";
// setxattr "1": the drain retries a held entry now (`ckptfs drain` after
// the operator fixed the backend waits for no backoff timer).
inline constexpr char kRetryXattr[] = "user.ckptfs.retry";
// setxattr on a file or directory in a memory-only checkpoint: `ckptfs
// persist` (InodeTable::PersistCheckpoint).
inline constexpr char kPersistXattr[] = "user.ckptfs.persist";
inline constexpr size_t kLostPageBytes = 60 * 1024;                  // under the kernel's 64 KiB xattr limit
inline constexpr size_t kStatusListMax = 100;                        // entries of each list in the status
inline constexpr size_t kStatusListBytes = 16 * 1024;                // bytes of names of each list in the status

// Who reads the status lists. Root and the mount's owner see every path;
// on a mount other users can reach (allow_other), another uid sees a path
// only where it could learn that name itself: it may search each directory
// above it that exists here, and read the one holding it (a 0700 directory
// of another user hides its checkpoints and lost files, as `ls` would).
// Counts stay whole: they name nothing. fs/views/status.cc.
struct Asker {
  bool all = true;  // root, or the daemon's own uid
  uint32_t uid = 0;
  std::vector<uint32_t> gids;  // primary and supplementary
};

// The JSON document served as the root's user.ckptfs.status xattr (and
// printed by `ckptfs status`): always valid UTF-8 (bytes that are not are
// replaced by U+FFFD) and under 64 KiB (lists capped, totals beside them).
// Paths `who` may not see are left out of its lists (the drain's held
// entry's path and its last error: replaced by a note). May throw std::bad_alloc.
std::string StatusJson(Daemon* d, const Asker& who = {});

// Page `page` of the full lost list: whole paths, raw bytes, each followed by
// a NUL, at most kLostPageBytes (a longer path has a page of its own).
// Page 0 always exists (empty when nothing is lost); ENODATA past the end.
[[nodiscard]] Result<std::string> LostPage(Daemon* d, uint64_t page, const Asker& who = {});

// Page `page` of the checkpoint list (`ckptfs ls`): a JSON array of
// objects, oldest first, each page under kLostPageBytes. Page 0 always
// exists; ENODATA past the end.
[[nodiscard]] Result<std::string> CheckpointsPage(Daemon* d, uint64_t page, const Asker& who = {});

// A node restarted on its state dir with its memory tier gone reads its
// unpersisted files back from their replica holders, each checked against
// the checksum sent with its replicas (fs/cluster/sent_sums.h), before it
// serves; what none gives back is listed lost. "" or why it must not
// mount (one line). fs/restore_peers.cc.
std::string RestoreFromPeers(Daemon* d);

}  // namespace ckpt::fs
