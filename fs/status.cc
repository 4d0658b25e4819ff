// status.cc — what a running daemon tells `ckptfs status`, `drain`, `umount`
// and `lost`, through xattrs on the mount root: the status document
// (user.ckptfs.status) and the full lost list in pages (user.ckptfs.lost.N).
//
// The document is built with nlohmann::json, so every name is escaped
// correctly whatever bytes it holds. JSON text must be UTF-8: a byte that is
// not part of valid UTF-8 (a file or mount point named in another encoding,
// or hostile) is replaced by U+FFFD in the document — it stays parseable by
// any JSON reader, but that byte is lost there. The exact bytes travel only
// in the lost pages (raw, NUL-separated), which `ckptfs lost` prints with
// \xHH escapes. An xattr value is at most 64 KiB, so the lists in the
// document are capped (kStatusListMax entries, kStatusListBytes bytes of
// names each) and their totals given beside them.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "fs/daemon.h"

namespace ckpt::fs {

using Json = nlohmann::json;

std::string StatusJson(Daemon* d) {
  cache::TierStats t = d->tier->Stats();
  NamespaceStats ns = d->table->Stats();
  DataStats ds = d->table->DataStatistics();
  DrainStats dr = d->drainer ? d->drainer->Stats() : DrainStats{};
  auto state = [&](meta::DataState s) {
    auto i = static_cast<size_t>(s);
    return Json{{"files", ds.files[i]}, {"bytes", ds.bytes[i]}};
  };

  std::vector<std::string> lost_all = d->table->LostFiles();
  Json lost = Json::array();
  size_t bytes = 0;
  for (const std::string& p : lost_all) {
    if (lost.size() >= kStatusListMax || bytes + p.size() > kStatusListBytes) break;
    bytes += p.size();
    lost.push_back(p);
  }
  std::vector<FailedEntry> failed_all = d->table->FailedEntries();
  Json failed = Json::array();
  bytes = 0;
  for (const auto& [path, reason] : failed_all) {
    if (failed.size() >= kStatusListMax || bytes + path.size() + reason.size() > kStatusListBytes) break;
    bytes += path.size() + reason.size();
    failed.push_back(Json{{"path", path}, {"reason", reason}});
  }

  Json j = {
      {"pid", getpid()},
      {"mountpoint", d->cfg.mountpoint},
      {"backend", d->cfg.backend_display},
      {"state_dir", d->cfg.state_dir},
      {"tier_dir", d->cfg.tier_dir},
      {"fsync", d->cfg.fsync == FsyncMode::kBackend ? "backend" : "memory"},
      {"max_file_size", d->cfg.max_file_size},
      {"read_only", d->table->ReadOnlyReason()},
      {"tier",
       {{"budget", t.budget},
        {"used", t.used},
        {"reserved", t.reserved},
        {"tier_files", t.files},
        {"waits", t.waits},
        {"writers_waiting", d->space_waiter ? d->space_waiter->Queued() : 0},
        {"orphans", t.orphans}}},
      {"namespace", {{"inodes", ns.inodes}, {"files", ns.files}, {"dirs", ns.dirs}, {"bytes", ns.bytes}}},
      {"dirty", state(meta::DataState::kDirty)},
      {"draining", state(meta::DataState::kDraining)},
      {"persisted", state(meta::DataState::kPersisted)},
      {"remote", state(meta::DataState::kRemote)},
      {"failed_files", state(meta::DataState::kFailed)},
      {"drain",
       {{"queue", ds.log_len},
        {"head_seq", ds.head_seq},
        {"applied_seq", ds.applied_seq},
        {"rate", static_cast<uint64_t>(dr.rate > 0 ? dr.rate : 0)},
        {"bytes_persisted", dr.bytes_persisted},
        {"files_persisted", dr.files_persisted},
        {"skipped", dr.entries_skipped},
        {"failed", dr.entries_failed},
        {"retries", dr.retries},
        {"in_error", dr.in_error},
        {"last_error", dr.last_error},
        {"last_error_time", dr.last_error_time}}},
      {"lost", std::move(lost)},
      {"lost_count", lost_all.size()},
      {"failed", {{"count", failed_all.size()}, {"first", std::move(failed)}}},
      {"io", {{"bytes_written", d->bytes_written.load()}, {"bytes_read", d->bytes_read.load()}}},
  };
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<std::string> LostPage(Daemon* d, uint64_t page) {
  std::vector<std::string> lost = d->table->LostFiles();
  std::string out;
  uint64_t at = 0;
  for (const std::string& p : lost) {
    // An entry starts a new page when it would overflow this one; one
    // longer than a page has a page of its own.
    if (!out.empty() && out.size() + p.size() + 1 > kLostPageBytes) {
      if (at == page) return out;
      at++;
      out.clear();
    }
    out.append(p);
    out.push_back('\0');
  }
  if (at == page) return out;  // the last page; page 0 of an empty list is empty
  return Err(ENODATA);
}

}  // namespace ckpt::fs
