// config.h — the daemon's settings and the parsing of user-supplied strings
// (sizes, backend URLs). Parsing returns a message instead of throwing, so the
// CLI can print one line and exit non-zero. Also the forms in which URLs and
// names are shown: a backend URL only ever appears in its display form
// (never with credentials), names from the filesystem escaped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace ckpt {

enum class FsyncMode { kMemory, kBackend };

// Names ckptfs keeps for itself at the top of a backend's root (the
// staging area and the cluster records: backend/backend.h), refused as a
// component of a backend's root or prefix (ParseBackendUrl).
inline constexpr char kReservedTmpDir[] = ".ckptfs-tmp";
inline constexpr char kReservedClusterDir[] = ".ckptfs-cluster";

struct BackendUrl {
  enum class Kind { kPosix, kS3 } kind = Kind::kPosix;
  std::string path;    // kPosix: absolute directory
  std::string bucket;  // kS3
  std::string prefix;  // kS3, without leading/trailing '/'
};

struct Config {
  std::string mountpoint;  // absolute
  BackendUrl backend;
  std::string backend_raw;      // as the user gave it: never shown (use backend_display)
  std::string backend_display;  // the URL for messages, logs, fsname and status (BackendDisplay)
  uint64_t cache_size = 0;      // bytes
  uint64_t max_file_size = 0;   // bytes; default 4 x cache_size (at least 1 MiB)
  std::string state_dir;        // absolute
  std::string tier_dir;         // absolute; default /dev/shm/ckptfs-<hash of state dir>
  FsyncMode fsync = FsyncMode::kMemory;
  bool foreground = false;
  std::string fuse_opts;  // extra -o options passed to libfuse
  bool passthrough = true;  // -o passthrough=off: every handle through the daemon
  // -o io_uring=off: requests through /dev/fuse even where the kernel has
  // FUSE over io_uring (fs/fuse/fuse_uring.h).
  bool io_uring = true;
  // -o reply_yield=off: ring threads hand replies over at normal priority,
  // and the scheduler may move each caller to an idle CPU
  // (fs/fuse/reply_yield.h).
  bool reply_yield = true;
  // -o on_refusal=hold|skip: an entry the backend refuses for good holds
  // the drain until it is fixed or `ckptfs skip` (hold, the default), or
  // is marked failed at once and the drain goes on (skip: liveness before
  // order). Reported the same way either way (fs/drain/drain.h).
  bool refusal_skip = false;
  // --tier-huge on|off (-o tier_huge=): the tier directory becomes a tmpfs
  // of its own with huge pages (cache/tier_mount.h). Off by default: on the
  // VMs measured, saves into fresh 2 MiB pages were slower (docs/benchmarks.md).
  bool tier_huge = false;
  // --prealloc: bytes of pre-allocated tier pages kept for passthrough
  // writers; kPreallocAuto (the default) sizes them from the files written.
  static constexpr uint64_t kPreallocAuto = ~0ULL;
  uint64_t prealloc = kPreallocAuto;
  // --min-free: below this much available memory (MemAvailable, or the
  // memory cgroup's headroom), persisted files are evicted and new tier
  // writes wait; kMinFreeAuto: 4% of RAM (or of the cgroup limit); 0: off.
  static constexpr uint64_t kMinFreeAuto = ~0ULL;
  uint64_t min_free = kMinFreeAuto;
  // --checkpoint-regex: the names (ECMAScript, whole name) of checkpoint
  // directories and single-file checkpoints (`ckptfs ls`, `ckptfs latest`).
  static constexpr char kDefaultCheckpointRegex[] =
      R"(step_?\d+|(tmp-)?checkpoint-\d+|global_step\d+|iter_\d{7}|epoch=\d+-step=\d+.*|.+\.ckpt)";
  std::string checkpoint_regex = kDefaultCheckpointRegex;
  // Checkpoint policies (0: off). --persist-every N: only checkpoints
  // number N, 2N, ... (in order of creation) drain; --persist-interval S:
  // one drains when S seconds passed since the last that did; the others
  // are memory-only. --keep-in-memory K: the newest K are evicted last.
  uint64_t persist_every = 0;
  uint64_t persist_interval_s = 0;
  uint64_t keep_in_memory = 0;
  // --shared-ttl SECONDS: several mounts over one backend see each other's
  // persisted files (docs/consistency.md "Shared namespace"): a local miss
  // asks the backend, a readdir merges its listing, a clean file changed
  // there is fetched again; each answer is reused for this long. 0: off
  // (the mount sees only what it wrote or found at its first mount).
  uint64_t shared_ttl_s = 1;
  // --drain-yield MS: the drain starts no transfer while a save is under
  // way (fs/core/save_activity.h), for at most this long in one busy stretch.
  // 0: it never waits.
  uint64_t drain_yield_ms = 1000;
  // Cross-node ordering (--cluster NAME; fs/cluster/cluster.h): "" is off. The node
  // id defaults to the hostname and a hash of the state dir's path.
  std::string cluster;
  std::string node;
  uint64_t member_timeout_s = 60;  // --member-timeout
  uint64_t max_clock_skew_ms = 50;  // --max-clock-skew
  bool cluster_opts_given = false;  // --node, --member-timeout, --max-clock-skew or --cluster-store* given
  // --cluster-store etcd://HOST:PORT[,...] (fs/cluster/etcd_records.h): the
  // members' records in etcd ("" : in the backend's reserved area), and
  // the credentials for it, from files (never on the command line).
  std::string cluster_store;
  std::string cluster_store_user;                                       // --cluster-store-user
  std::string cluster_store_password_file;                              // --cluster-store-password-file (mode 0600)
  std::string cluster_store_ca, cluster_store_cert, cluster_store_key;  // TLS (etcds://)
  // Replicas in peers' memory (issue #30, fs/cluster/replicator.h): each
  // closed file streamed to `replicas` other members; `replica_listen`
  // HOST:PORT where this node takes other members' replicas, into at most
  // `replica_budget` bytes (0: a quarter of the cache size); peers prove
  // they hold the secret in `cluster_secret` (a file, mode 0600).
  uint64_t replicas = 0;         // --replicas K
  std::string replica_listen;    // --replica-listen HOST:PORT
  std::string cluster_secret;    // --cluster-secret FILE
  uint64_t replica_budget = 0;   // --replica-budget SIZE
  uint64_t replica_group = 8;    // --replica-group N: member numbers per failure group
  uint64_t peer_fanout = 4;      // --peer-fanout N: askers of one file a member serves (0: all)
  std::string metrics;           // --metrics HOST:PORT ("" : off)
  std::string metrics_textfile;  // --metrics-textfile PATH ("" : off)
  std::string log_level = "info";
  std::string s3_endpoint;
};

// The largest size ParseSize accepts: 1 EiB (1048576T), so that sums of
// sizes and 4 x a budget never overflow 64 bits.
inline constexpr uint64_t kMaxSizeBytes = 1ull << 60;

// Parses "512M", "4G", "1.5GiB", "1073741824", "25%" (of RAM): DIGITS[.DIGITS]
// then B, K, M, G, T (optionally with B or iB; binary, case-insensitive) or
// %, nothing else (no spaces, signs or exponents). Returns the size in bytes
// (fractions rounded down; at least 1, at most kMaxSizeBytes; a percentage
// in (0, 100]), or a one-line message naming the input and what is wrong.
std::expected<uint64_t, std::string> ParseSize(const std::string& s);

// Parses a count of at least 1 (a checkpoint count, a number of seconds):
// DIGITS only, at most 1,000,000,000; otherwise a one-line message naming
// the input (0, a sign, a fraction, garbage).
std::expected<uint64_t, std::string> ParseCount(const std::string& s);
// The same, with 0 (off) allowed too (--replicas, --peer-fanout).
std::expected<uint64_t, std::string> ParseCountOrZero(const std::string& s);

// Parses --shared-ttl / -o shared_ttl=: whole seconds from 0 (the shared
// namespace off) to kMaxSharedTtl, DIGITS only; otherwise a one-line
// message naming the input.
inline constexpr uint64_t kMaxSharedTtl = 86400;
std::expected<uint64_t, std::string> ParseTtl(const std::string& s);

// The one line for a backend URL holding userinfo: it never echoes the URL.
inline constexpr std::string_view kCredentialsInUrl =
    "credentials in the backend URL are not accepted; use AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile";

// Parses an absolute path, file:///path or s3://bucket/prefix. A URL with
// userinfo (scheme://user[:password]@..., or a ':' in an s3:// or file://
// authority, as in s3://KEY:SECRET/x@bucket) is refused with
// kCredentialsInUrl; every other message names the input.
std::expected<BackendUrl, std::string> ParseBackendUrl(const std::string& s);

// The form of a parsed backend URL shown everywhere (messages, the log, the
// FUSE fsname in /proc/mounts, status JSON): s3://bucket[/prefix], the
// directory, or file:///directory when `raw` was a file:// URL.
std::string BackendDisplay(const BackendUrl& u, const std::string& raw);

// `text` with the userinfo of every "scheme://user:pw@host" in it replaced
// by "***" (everything from "://" to the last '@' of that word). For text
// that may quote an unparsed URL back, such as a command-line parser's
// error.
std::string RedactUserinfo(const std::string& text);

// A name (path, error text) as a terminal may show it, with its exact bytes
// recoverable (printf '%b'): valid UTF-8 kept, '\' as '\\', \n and \t, every
// other control byte and every byte that is not part of valid UTF-8 as \xHH.
std::string EscapeName(std::string_view s);

// Parses --max-clock-skew and --drain-yield: milliseconds, 0 to 60000
// (digits only).
std::expected<uint64_t, std::string> ParseMillis(const std::string& s);

// Takes ckptfs's own options out of a -o list (comma-separated), leaving
// libfuse's: passthrough=, io_uring=, reply_yield=, tier_huge= (on|off), the checkpoint
// policies, shared_ttl=, drain_yield=MS,
// cluster=NAME, node=ID, member_timeout=SECONDS, max_clock_skew=MS.
// Returns a one-line message for a bad value.
std::expected<void, std::string> TakeOwnOptions(std::string* fuse_opts, Config* cfg);

// Total physical memory in bytes.
uint64_t PhysicalMemory();

// The default cache budget: a quarter of RAM, and never more than half of
// what the tier's filesystem can hold.
uint64_t DefaultCacheSize(const std::string& tier_dir);

// MemAvailable from /proc/meminfo, in bytes; 0 if it cannot be read.
uint64_t MemAvailable();

// The most a default budget may claim at mount: what the kernel says is
// available (`mem_available`) plus what the tier already holds
// (`in_tier`: its pages are in use, not available, and remain the tier's).
// 0 for `mem_available` means unknown: no cap.
uint64_t CapToAvailable(uint64_t budget, uint64_t mem_available, uint64_t in_tier);

// The size of the filesystem holding `path`, or of its nearest existing
// ancestor (f_blocks x f_frsize); 0 if none can be stat-ed.
uint64_t FilesystemSize(const std::string& path);

// How much of a tier filesystem of `fs_size` bytes a budget may use: all
// but 1/16, left for the tier's metadata and other users of the filesystem.
uint64_t TierUsable(uint64_t fs_size);

// Formats a byte count for humans: "1.5 GiB".
std::string HumanBytes(uint64_t n);

}  // namespace ckpt
