// gc.cc — `ckptfs gc`: memory tiers that no daemon holds any more.
//
// A tier directory outlives its daemon after a crash, `ckptfs umount
// --no-drain` or `--keep-cache`, or a plain `umount`; on /dev/shm it is RAM
// that nothing owns. gc finds them (every /dev/shm/ckptfs-*, or the
// directories named), takes each one's lock as a daemon would (one that a
// running daemon holds is left alone), reads who it belonged to from its
// .owner file (cache/tier.h) and looks into that state dir's metadata,
// read-only: if every file in the tier is in the backend and nothing is
// left to drain, the tier is removed — the next mount of that state dir
// reads those files from the backend. Others are kept unless --force (then
// the next mount lists their files as lost), like `docker system prune`.
// An empty tier (no files, no orphans) goes whoever made it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/tier.h"
#include "cli/commands.h"
#include "common/config.h"
#include "fs/meta/meta_store.h"

namespace ckpt::cli {

namespace {

namespace stdfs = std::filesystem;
using Json = nlohmann::json;

struct Row {
  std::string dir, state_dir, mountpoint, backend;
  long long pid = 0;
  uint64_t bytes = 0, files = 0;
  bool removable = false;  // every file persisted (or the verdict needs --force)
  bool held = false;       // a running daemon holds it: never touched
  bool error = false;      // not a tier at all, or it could not be looked into
  std::string verdict;     // why it is kept or may go
  std::string outcome;     // removed / kept / would be removed
};

// Reads what the owner's metadata says about the tier's files: sets
// r->removable and r->verdict.
void Judge(const cache::Tier& t, Row* r) {
  if (r->state_dir.empty()) {
    r->verdict = "owner unknown (no .owner file: made before ckptfs recorded owners)";
    return;
  }
  const std::string meta_dir = r->state_dir + "/meta";
  std::error_code ec;
  if (!stdfs::is_directory(meta_dir, ec)) {
    r->verdict = "its state dir " + EscapeName(r->state_dir) + " is gone: nothing can read these files back";
    return;
  }
  std::string why;
  auto kv = meta::OpenRocksKv(meta_dir, &why, /*read_only=*/true);
  if (!kv) {
    r->verdict = kv.error() == EBUSY ? "its state dir is in use by a daemon that mounted another tier"
                                     : "cannot read its metadata: " + (why.empty() ? ErrStr(kv.error()) : why);
    return;
  }
  meta::MetaStore store(std::move(*kv));
  uint64_t pending = 0, unsafe = 0;
  if (auto st = store.ForEachLogEntry([&](meta::LogEntry&&) { pending++; }); !st) {
    r->verdict = "cannot read its drain log: " + ErrStr(st.error());
    return;
  }
  for (const auto& [key, size] : t.attached()) {
    if (cache::IsSnapKey(key)) {  // a version kept for the drain
      unsafe++;
      continue;
    }
    auto rec = store.GetInode(key);
    if (!rec) {
      if (rec.error() == ENOENT) continue;  // bytes of no file: the next mount drops them too
      r->verdict = "cannot read its metadata: " + ErrStr(rec.error());
      return;
    }
    if (rec->state != meta::DataState::kPersisted && rec->state != meta::DataState::kRemote) unsafe++;
  }
  if (pending > 0 || unsafe > 0) {
    r->verdict = std::to_string(unsafe) + " files, " + std::to_string(pending) +
                 " changes not in the backend (mount the state dir again to drain them)";
    return;
  }
  r->removable = true;
  r->verdict = "every file is in the backend";
}

Row Look(const std::string& dir, bool force, bool dry_run) {
  Row r;
  r.dir = dir;
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    r.error = true;
    r.verdict = "not a directory";
    r.outcome = "skipped";
    return r;
  }
  std::string why;
  auto t = cache::Tier::Open(dir, UINT64_MAX / 4, &why);
  if (!t) {
    r.held = t.error() == EBUSY;
    r.error = !r.held;
    r.verdict = r.held ? "in use by a running daemon" : "not a ckptfs tier: " + why;
    r.outcome = "kept";
    return r;
  }
  cache::TierStats s = (*t)->Stats();
  r.bytes = s.used;
  r.files = s.files;
  Json owner = Json::parse((*t)->ReadOwner(), nullptr, /*allow_exceptions=*/false);
  if (owner.is_object()) {
    auto str = [&](const char* k) { return owner.contains(k) && owner[k].is_string() ? owner[k].get<std::string>() : ""; };
    r.state_dir = str("state_dir");
    r.mountpoint = str("mountpoint");
    r.backend = str("backend");
    if (owner.contains("pid") && owner["pid"].is_number_integer()) r.pid = owner["pid"].get<long long>();
  }
  if (s.files == 0 && s.orphans == 0) {  // nothing in it to lose, whoever it was
    r.removable = true;
    r.verdict = "empty";
  } else {
    Judge(**t, &r);
  }
  if (!(r.removable || force)) {
    r.outcome = "kept";
    return r;
  }
  if (dry_run) {
    r.outcome = "would be removed";
    return r;
  }
  auto freed = (*t)->RemoveAll();
  if (freed) {
    r.outcome = "removed";
  } else if (freed.error() == ENOTEMPTY) {
    r.outcome = "emptied (orphans/ kept)";
  } else {
    r.error = true;
    r.outcome = "could not remove: " + ErrStr(freed.error());
  }
  return r;
}

std::vector<std::string> DefaultDirs() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator("/dev/shm", ec)) {
    std::string name = e.path().filename().string();
    struct stat st;
    if (name.rfind("ckptfs-", 0) != 0 || lstat(e.path().c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode) && st.st_uid == geteuid()) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int CmdGc(const std::vector<std::string>& dirs_in, bool force, bool dry_run, bool json) {
  std::vector<std::string> dirs;
  for (const std::string& d : dirs_in) dirs.push_back(Absolute(d));
  if (dirs_in.empty()) dirs = DefaultDirs();
  std::vector<Row> rows;
  for (const std::string& d : dirs) rows.push_back(Look(d, force, dry_run));
  bool errors = false;
  uint64_t freed = 0, kept = 0;
  for (const Row& r : rows) {
    errors |= r.error;
    if (r.outcome == "removed" || r.outcome == "would be removed" || r.outcome.rfind("emptied", 0) == 0)
      freed += r.bytes;
    else kept++;
  }
  if (json) {
    Json out = Json::array();
    for (const Row& r : rows)
      out.push_back({{"tier_dir", r.dir},
                     {"state_dir", r.state_dir},
                     {"mountpoint", r.mountpoint},
                     {"backend", r.backend},
                     {"pid", r.pid},
                     {"bytes", r.bytes},
                     {"files", r.files},
                     {"in_use", r.held},
                     {"all_persisted", r.removable},
                     {"verdict", r.verdict},
                     {"outcome", r.outcome}});
    PrintJson(out);
    return errors ? 1 : 0;
  }
  if (rows.empty()) {
    printf("ckptfs gc: no memory tiers found\n");
    return 0;
  }
  for (const Row& r : rows) {
    printf("%s  %s, %llu files\n", EscapeName(r.dir).c_str(), HumanBytes(r.bytes).c_str(),
           static_cast<unsigned long long>(r.files));
    if (!r.state_dir.empty())
      printf("  owner: state %s, mount %s, backend %s, pid %lld\n", EscapeName(r.state_dir).c_str(),
             EscapeName(r.mountpoint).c_str(), EscapeName(r.backend).c_str(), r.pid);
    printf("  %s: %s\n", r.outcome.c_str(), EscapeName(r.verdict).c_str());
  }
  printf("ckptfs gc: %s %s; %llu kept%s\n", HumanBytes(freed).c_str(), dry_run ? "would be given back" : "given back",
         static_cast<unsigned long long>(kept),
         kept > 0 && !force ? " (--force removes those not in use; files not in the backend are then lost)" : "");
  return errors ? 1 : 0;
}

}  // namespace ckpt::cli
