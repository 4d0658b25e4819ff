// commands.h — the ckptfs client commands, one function each, called by
// cli/main.cc once CLI11 has parsed the command line. Each returns the
// process's exit status, or exits itself (Die) after one line on stderr.
// `mount` (mount.cc) starts a daemon and returns once the mount is ready;
// the others (commands.cc) talk to a running daemon through xattrs on its
// mount root.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"

namespace ckpt::cli {

// Prints "ckptfs: <msg>" on stderr and exits 1.
[[noreturn]] void Die(const std::string& msg);

using Json = nlohmann::json;

// The daemon's status document (the root's user.ckptfs.status xattr):
// ReadStatus returns 0 or the errno of the read (EBADMSG: not a JSON
// object); StatusOrDie exits with one line instead.
int ReadStatus(const std::string& mnt, Json* out);
Json StatusOrDie(const std::string& mnt);
// Field readers that take a missing field (an older or newer daemon) as
// its default instead of throwing.
uint64_t U64(const Json& j, const char* key);
double Dbl(const Json& j, const char* key);
std::string Str(const Json& j, const char* key);
bool Bool(const Json& j, const char* key);
const Json& Obj(const Json& j, const char* key);
// Prints `j` indented, for --json (bytes that are not UTF-8 become U+FFFD).
void PrintJson(const Json& j);

// `p` made absolute and normalized; Die when it cannot be.
std::string Absolute(const std::string& p);

// The filesystem type mounted at `path` (the last mount there, as
// /proc/self/mounts lists it), or "" if none.
std::string MountedType(const std::string& path);

// Sizes given on the command line; nullopt when the option was not given
// (an empty string given is an error, not the default).
struct SizeArgs {
  std::optional<std::string> cache_size;
  std::optional<std::string> max_file_size;
  std::optional<std::string> replica_budget;
};

// ckptfs mount: checks everything it can before forking the daemon, then
// waits for the daemon's report (foreground: runs the daemon here).
int CmdMount(Config cfg, const SizeArgs& sizes);

// ckptfs umount: waits for the drain unless `no_drain`, unmounts (`lazy`:
// detaches even if busy) and waits for the daemon to exit, which gives the
// memory tier back (all of it persisted) unless `keep_cache` or `no_drain`.
struct UmountArgs {
  bool no_drain = false, lazy = false, keep_cache = false;
};
int CmdUmount(const std::string& mnt_in, const UmountArgs& a);

// ckptfs gc: tier directories no daemon holds (`dirs`, or every
// /dev/shm/ckptfs-*): lists them with their owner and bytes, and removes
// those whose files are all in the backend (all of them with `force`;
// none with `dry_run`).
int CmdGc(const std::vector<std::string>& dirs, bool force, bool dry_run, bool json);

// ckptfs ls: one row per checkpoint (a directory or file whose name
// matches the mount's --checkpoint-regex), oldest first.
int CmdLs(const std::string& mnt_in, bool json);

// ckptfs latest: the newest checkpoint whose files are all closed (with
// `persisted`, all in the backend): its path on stdout; 1 if there is none.
// `ckptfs persist PATH [--wait]`: the memory-only checkpoint holding PATH
// drains after all (with --wait: waits as `ckptfs drain` does).
int CmdPersist(const std::string& path, bool wait);
// `which`: "complete", "persisted" or "safe" (the checkpoint JSON's flag).
int CmdLatest(const std::string& mnt_in, const std::string& which);
// ckptfs skip MNT PATH: the drain holds at PATH (the backend refuses it for
// good); the operator gives it up: it is recorded as failed and the drain
// goes on. PATH as status names it, or absolute inside MNT.
int CmdSkip(const std::string& mnt_in, const std::string& path);

// ckptfs history: STATE_DIR/history.csv (and the rotated .1) as a table,
// or as CSV.
int CmdHistory(const std::string& mnt_in, bool csv);

// ckptfs warmup: fetches the remote files under `paths` (all in one mount)
// into the memory tier, as many as fit the budget beside dirty data; 1 if
// a fetch failed.
int CmdWarmup(const std::vector<std::string>& paths);

// ckptfs drain: waits until everything closed so far is persisted; 1 after
// `timeout_s` (0: no limit).
int CmdDrain(const std::string& mnt_in, double timeout_s);

// ckptfs status: the daemon's status, for people or as JSON.
int CmdStatus(const std::string& mnt_in, bool json);

// ckptfs lost: every file lost at a node reboot (or, with `clear`, clears
// the list).
int CmdLost(const std::string& mnt_in, bool json, bool clear);

}  // namespace ckpt::cli
