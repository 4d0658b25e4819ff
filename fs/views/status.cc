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
// *escaped* names each: a control byte takes 6 bytes as \u00XX, a byte
// that is not UTF-8 3 as U+FFFD) and their totals given beside them; as a
// last guard the whole document is kept under kStatusMaxBytes by dropping
// list entries, then by shortening the long strings (paths, the last
// error), so a hostile name can never make the status unreadable.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "fs/cluster/etcd_names.h"
#include "fs/daemon.h"
#include "fs/fuse/reply_yield.h"

namespace ckpt::fs {

using Json = nlohmann::json;

namespace {

constexpr size_t kStatusMaxBytes = 60 * 1024;  // the whole document, at most (the xattr limit is 64 KiB)
constexpr size_t kStatusStringMax = 512;       // raw bytes of a path kept when the document is too long

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The bytes `s` takes in the document, quotes included.
size_t Encoded(const std::string& s) { return Dump(Json(s)).size(); }

// `s` cut to at most `max` raw bytes, marked when cut.
std::string Shorten(const std::string& s, size_t max) {
  return s.size() <= max ? s : s.substr(0, max) + "...[shortened]";
}

// Whether `who` may learn the name `path` (relative to the mount root):
// see Asker. A directory of the path that is not here (a lost file's,
// another node's) guards nothing below it.
bool MaySee(Daemon* d, const Asker& who, std::string_view path) {
  if (who.all) return true;
  Core& core = d->table->core();
  MutexLock lk(&core.mu());
  auto may = [&](const meta::InodeRecord& r, uint32_t bit) {  // bit: 1 search, 4 read
    const bool group = std::find(who.gids.begin(), who.gids.end(), r.gid) != who.gids.end();
    const uint32_t m = r.uid == who.uid ? r.mode >> 6 : group ? r.mode >> 3 : r.mode;
    return (m & bit) != 0;
  };
  const Inode* dir = core.Find(meta::kRootIno);
  while (dir) {
    if (!may(dir->rec, 1)) return false;
    const size_t slash = path.find('/');
    if (slash == std::string_view::npos) return may(dir->rec, 4);
    auto child = core.ns.Child(dir, path.substr(0, slash));
    if (!child || !(*child)->is_dir()) return true;
    dir = *child;
    path.remove_prefix(slash + 1);
  }
  return true;
}

// The errors a status shows another uid: each may name a file (Asker).
void HideErrors(Json* j) {
  if (j->is_array()) {
    for (Json& x : *j) HideErrors(&x);
    return;
  }
  if (!j->is_object()) return;
  for (auto& [k, v] : j->items()) {
    if ((k == "last_error" || k == "takeover_error") && v.is_string() && !v.get<std::string>().empty())
      v = "(not shown to this user: it may name another user's file; ask root)";
    else HideErrors(&v);
  }
}

}  // namespace

static uint64_t SubFloor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }  // read apart: may cross

// --replica-listen / --replicas (issue #30): what this node holds for the
// others, and what it sent of its own files.
static Json ReplicasJson(Daemon* d) {
  replica::Link::Counters lc = d->replica_link->counters();
  const auto list = d->replica_store->List();
  size_t files = 0, published = 0, entries = 0;
  uint64_t entry_bytes = 0;
  for (const auto& h : list) {
    const bool entry = h.key.ino == replica::kEntryIno;
    entries += entry;
    entry_bytes += entry ? replica::Store::Charge(h) : 0;
    published += !entry && h.published;
    files += !entry && !h.published;
  }
  const replica::Store::KeptTotal kept = d->replica_store->KeptNow();
  Json r = {{"listen", d->replica_link->address()},
            {"peers", d->replica_peers ? d->replica_peers->count() : 0},
            {"failure_group", replica::Peers::GroupOf(d->cfg.node, d->cfg.replica_group)},
            {"held_files", files},
            {"held_entries", entries},  // other members' namespace entries (mkdir, rename...)
            {"kept_published_files", published},
            // Published copies (files, entries) kept until their done marks
            // are in etcd (Store::Keep): never given back for room meanwhile.
            {"kept_for_marks_files", kept.files},
            {"kept_for_marks_entries", kept.entries},
            {"kept_for_marks_bytes", kept.bytes},
            {"held_bytes", SubFloor(d->replica_store->bytes(), d->replica_store->spare_bytes() + entry_bytes)},
            {"spare_bytes", d->replica_store->spare_bytes()},
            {"budget_bytes", d->replica_store->limit()},
            {"peers_refused", lc.peers_refused},
            {"chunks_refused", lc.chunks_refused},
            {"messages_refused", lc.messages_refused},
            {"stalled_closed", lc.stalled_closed},  // connections closed for a receive that stopped moving
            {"crowded_closed", lc.crowded_closed},  // a node's oldest, past its bound of connections
            {"bytes_in", lc.bytes_in},
            {"bytes_out", lc.bytes_out}};
  if (d->peer_loads) {
    replica::PeerLoads::Stats ps = d->peer_loads->stats();
    r["loads"] = Json{{"from_peers", ps.from_peers},
                      {"from_peers_bytes", ps.from_peers_bytes},
                      {"misses", ps.misses},
                      {"failures", ps.failures},
                      {"to_backend", ps.to_backend},
                      {"served", lc.loads_served},
                      {"served_bytes", lc.load_bytes_served},
                      {"served_from_replicas", ps.served_from_replicas},
                      {"served_from_tier", ps.served_from_tier},
                      {"served_after_fetch", ps.served_after_fetch},
                      {"sent_elsewhere", ps.sent_elsewhere},
                      {"from_relays", ps.from_relays},
                      {"last_error", ps.last_error}};
  }
  if (d->takeover) {
    replica::Takeover::Stats ts = d->takeover->stats();
    r["published_for_dead"] = ts.published;
    r["entries_applied_for_dead"] = ts.applied_entries;
    r["published_for_dead_bytes"] = ts.published_bytes;
    r["already_in_backend"] = ts.already_there;
    r["collected"] = ts.collected;
    r["takeover_failures"] = ts.failures;
    r["lost_for_dead"] = ts.lost;
    r["poisoned_for_dead"] = ts.poisoned;
    r["passed_over_for_dead"] = ts.passed_over;
    r["takeover_error"] = ts.last_error;
  }
  if (d->replicator) {
    replica::Replicator::Stats rs = d->replicator->stats();
    r["replicas"] = rs.replicas;
    r["queued"] = rs.queued;
    r["replicated_files"] = rs.replicated_files;
    r["replicated_bytes"] = rs.replicated_bytes;
    r["replicated_entries"] = rs.replicated_entries;
    r["dropped"] = rs.dropped;
    r["waits"] = rs.waits;
    r["same_group"] = rs.same_group;
    r["failures"] = rs.failures;
    r["last_error"] = rs.last_error;
  }
  return r;
}

std::string StatusJson(Daemon* d, const Asker& who) {
  cache::TierStats t = d->tier->Stats();
  NamespaceStats ns = d->table->core().ns.Stats();
  DataStats ds = d->table->DataStatistics();
  DrainStats dr = d->drainer ? d->drainer->Stats() : DrainStats{};
  auto pto = d->table->core().passthrough.Opens();
  auto spares = d->tier->Spares();
  auto warmth = d->tier->SpareWarmth();
  auto state = [&](meta::DataState s) {
    auto i = static_cast<size_t>(s);
    return Json{{"files", ds.files[i]}, {"bytes", ds.bytes[i]}};
  };

  // The entry the drain holds at (refused for good), null when none.
  Json held = nullptr;
  if (auto h = d->table->core().oplog.Held())
    held = Json{{"seq", h->seq},           {"path", MaySee(d, who, h->path) ? h->path : "(not shown to this user)"},
                {"reason", h->reason},     {"since", h->since},
                {"tried_ms", h->tried_ms}, {"behind", h->behind}};
  std::vector<std::string> lost_all = d->table->core().oplog.LostFiles();
  Json lost = Json::array();
  size_t bytes = 0;
  for (const std::string& p : lost_all) {
    if (!MaySee(d, who, p)) continue;
    size_t n = Encoded(p) + 1;
    if (lost.size() >= kStatusListMax || bytes + n > kStatusListBytes) break;
    bytes += n;
    lost.push_back(p);
  }
  std::vector<FailedEntry> failed_all = d->table->core().oplog.FailedEntries();
  Json failed = Json::array();
  bytes = 0;
  for (const auto& [path, reason] : failed_all) {
    if (!MaySee(d, who, path)) continue;
    Json entry{{"path", path}, {"reason", reason}};
    size_t n = Dump(entry).size() + 1;
    if (failed.size() >= kStatusListMax || bytes + n > kStatusListBytes) break;
    bytes += n;
    failed.push_back(std::move(entry));
  }

  const PressureStats mp = d->table->core().residency.MemoryPressure();
  Json j = {
      {"pid", getpid()},
      {"mountpoint", d->cfg.mountpoint},
      {"backend", d->cfg.backend_display},
      {"state_dir", d->cfg.state_dir},
      {"tier_dir", d->cfg.tier_dir},
      {"fsync", d->cfg.fsync == FsyncMode::kBackend ? "backend" : "memory"},
      {"max_file_size", d->cfg.max_file_size},
      {"read_only", d->table->core().ReadOnlyReason()},
      {"tier",
       {{"budget", t.budget},
        {"used", t.used},
        {"reserved", t.reserved},
        {"replica_bytes", t.outside},
        {"tier_files", t.files},
        {"waits", t.waits},
        {"writers_waiting", d->space_waiter ? d->space_waiter->Queued() : 0},
        {"orphans", t.orphans},
        {"huge_pages", d->huge.on},
        {"huge_pages_why_not", d->huge.on ? std::string() : d->huge.why}}},
      {"passthrough",
       {{"active", d->channel && d->channel->active()},
        {"why_not", d->channel ? d->channel->why() : std::string("not mounted yet")},
        {"handles", pto.first},
        {"writers", pto.second},
        {"opens", d->channel ? d->channel->opens() : 0},
        {"prealloc_bytes", spares.first},
        {"prealloc_files", spares.second},
        // What warming the spares' pages cost (Tier::WarmPages): a rate far
        // under the machine's memory bandwidth means the host was faulting
        // pages back in, a cost no save paid.
        {"prealloc_warmed_bytes", warmth.first},
        {"prealloc_warm_seconds", warmth.second}}},
      {"fuse_io_uring",
       {{"active", d->channel && d->channel->uring_active()},
        {"why_not", d->channel ? d->channel->uring_why() : std::string("not mounted yet")},
        {"requests", d->channel ? d->channel->uring_requests() : 0}}},
      {"reply_yield",
       {{"active", reply_yield::On() && d->channel && d->channel->uring_active()},
        {"why_not", !reply_yield::On()                            ? reply_yield::WhyNot()
                    : !(d->channel && d->channel->uring_active()) ? std::string("only over io_uring")
                                                                  : std::string()},
        {"rescued", reply_yield::Rescued()}}},
      {"namespace", {{"inodes", ns.inodes}, {"files", ns.files}, {"dirs", ns.dirs}, {"bytes", ns.bytes}}},
      {"dirty", state(meta::DataState::kDirty)},
      {"draining", state(meta::DataState::kDraining)},
      {"persisted", state(meta::DataState::kPersisted)},
      {"remote", state(meta::DataState::kRemote)},
      {"failed_files", state(meta::DataState::kFailed)},
      {"memory_only", state(meta::DataState::kMemoryOnly)},
      {"policies",
       {{"persist_every", d->cfg.persist_every},
        {"persist_interval_s", d->cfg.persist_interval_s},
        {"keep_in_memory", d->cfg.keep_in_memory}}},
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
        {"yield_ms", d->cfg.drain_yield_ms},
        {"yields", dr.yields},
        {"yielded_s", dr.yielded_s},
        {"yielding", dr.yielding},
        {"waits_for_holder_at_seq", dr.holder_wait_seq},
        {"in_error", dr.in_error},
        {"last_error", dr.last_error},
        {"last_error_time", dr.last_error_time},
        {"error_since", dr.error_since},
        {"on_refusal", d->cfg.refusal_skip ? "skip" : "hold"},
        {"held", held}}},
      {"lost", std::move(lost)},
      {"lost_count", lost_all.size()},
      {"failed", {{"count", failed_all.size()}, {"first", std::move(failed)}}},
      {"io", {{"bytes_written", d->bytes_written.load()}, {"bytes_read", d->bytes_read.load()}}},
      {"memory",
       {{"watched", d->memory_watch != nullptr},
        {"available", mp.available},
        {"min_free", mp.min_free},
        {"where", mp.where},
        {"under_pressure", mp.active},
        {"writers_wait", mp.writers_held},
        {"episodes", mp.episodes},
        {"evicted_files", mp.evicted_files},
        {"evicted_bytes", mp.evicted_bytes}}},
  };
  if (d->cluster) {
    // Members with their heartbeat age and watermark; the files of dead
    // members (lost: never to reach the backend from them) capped as the
    // other lists.
    ClusterStatus cs = d->cluster->Status();
    Json members = Json::array(), lost_files = Json::array();
    uint64_t lost_count = 0;
    size_t lbytes = 0;
    // At most kStatusListMax members are listed: this node, then the
    // dead, then the others (a cluster of a thousand nodes would not fit).
    std::stable_sort(cs.members.begin(), cs.members.end(), [](const ClusterMember& a, const ClusterMember& b) {
      auto rank = [](const ClusterMember& m) { return m.self ? 0 : m.state == "dead" ? 1 : 2; };
      return rank(a) < rank(b);
    });
    for (const ClusterMember& m : cs.members) {
      if (m.state == "dead") {
        lost_count += m.at_risk;
        for (const std::string& p : m.paths) {
          if (!MaySee(d, who, p)) continue;
          Json entry{{"node", m.node}, {"path", p}};
          size_t n = Dump(entry).size() + 1;
          if (lost_files.size() >= kStatusListMax || lbytes + n > kStatusListBytes) break;
          lbytes += n;
          lost_files.push_back(std::move(entry));
        }
      }
      if (members.size() >= kStatusListMax) continue;
      members.push_back({{"node", m.node},
                         {"self", m.self},
                         {"state", m.state},
                         {"heartbeat_ms", m.heartbeat_ms},
                         {"age_ms", m.age_ms},
                         {"watermark_ms", m.watermark_ms},
                         {"oldest_pending_gate_ms", m.oldest_gate_ms ? Json(*m.oldest_gate_ms) : Json(nullptr)},
                         {"unpersisted", m.unpersisted},
                         {"at_risk", m.at_risk},
                         {"record_problem", m.record_problem}});
    }
    // Records refused (times in this node's future): anyone who can write
    // the records' area can add them, so only the first few are listed.
    constexpr size_t kRefusedListed = 10;
    Json refused = Json::array();
    for (const RefusedRecord& r : cs.refused) {
      if (refused.size() >= kRefusedListed) break;
      refused.push_back({{"node", r.node}, {"reason", r.reason}, {"heartbeat_ms", r.heartbeat_ms},
                         {"unpersisted", r.unpersisted}});
    }
    j["cluster"] = {{"name", cs.name},
                    {"node", cs.node},
                    {"watermark_ms", cs.watermark_ms},
                    {"member_count", cs.members.size()},
                    {"store", cs.store},
                    {"live_members", cs.members_total},
                    {"leader", cs.leader},
                    {"members", std::move(members)},
                    {"waiting", cs.waiting},
                    {"wait_seq", cs.wait_seq},
                    {"wait_gate_ms", cs.wait_gate_ms},
                    {"waiting_for", cs.waiting_for},
                    {"waiting_since_ms", cs.waiting_since_ms},
                    {"last_error", cs.last_error},
                    {"node_id_clash", cs.node_id_clash},
                    {"publish_blocked_reason", cs.publish_blocked_reason},
                    {"refused_count", cs.refused.size()},
                    {"refused", std::move(refused)},
                    {"lost_count", lost_count},
                    {"lost", std::move(lost_files)},
                    {"kept_removals", cs.kept_removals},
                    {"kept_paths", Json::array()}};
    for (const std::string& p : cs.kept_paths)
      if (MaySee(d, who, p)) j["cluster"]["kept_paths"].push_back(p);
    if (d->etcd_names) {
      // The shared namespace in etcd (--cluster-store with --shared):
      // requests since mount, and those that failed (their changes seen
      // by the others within --shared-ttl of the drain instead).
      EtcdNames::Stats ns = d->etcd_names->stats();
      j["cluster"]["names"] = {
          {"puts", ns.puts}, {"deletes", ns.deletes}, {"gets", ns.gets}, {"failures", ns.failures}};
    }
    if (d->replica_link) j["cluster"]["replicas"] = ReplicasJson(d);
  }
  if (!who.all) HideErrors(&j);
  std::string out = Dump(j);
  // The lists fit kStatusListBytes each; what else is long is a few paths
  // and one error, each up to PATH_MAX bytes that may all be escaped.
  Json& lj = j["lost"];
  Json& fj = j["failed"]["first"];
  Json none = Json::array();
  Json& cj = j.contains("cluster") ? j["cluster"]["lost"] : none;
  while (out.size() > kStatusMaxBytes && (!lj.empty() || !fj.empty() || !cj.empty())) {
    for (Json* list : {&lj, &fj, &cj})
      if (!list->empty()) list->erase(list->size() - 1);
    out = Dump(j);
  }
  if (out.size() > kStatusMaxBytes) {
    for (const char* k : {"mountpoint", "backend", "state_dir", "tier_dir", "read_only"})
      j[k] = Shorten(j[k].get<std::string>(), kStatusStringMax);
    j["drain"]["last_error"] = Shorten(j["drain"]["last_error"].get<std::string>(), kStatusStringMax);
    if (j["drain"]["held"].is_object())
      j["drain"]["held"]["path"] = Shorten(j["drain"]["held"]["path"].get<std::string>(), kStatusStringMax);
    out = Dump(j);
  }
  return out;
}

Result<std::string> LostPage(Daemon* d, uint64_t page, const Asker& who) {
  std::vector<std::string> lost = d->table->core().oplog.LostFiles();
  std::string out;
  uint64_t at = 0;
  for (const std::string& p : lost) {
    if (!MaySee(d, who, p)) continue;
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

namespace {

// One checkpoint as `ckptfs ls` shows it; the state is decided here, once.
Json CheckpointJson(const CheckpointInfo& c) {
  using meta::DataState;
  auto sb = [&](DataState s) { return c.state_bytes[static_cast<size_t>(s)]; };
  const uint64_t done = sb(DataState::kPersisted) + sb(DataState::kRemote);
  const uint64_t pending = sb(DataState::kDirty) + sb(DataState::kDraining);
  int progress = c.bytes > 0 ? static_cast<int>(100 * static_cast<double>(done) / static_cast<double>(c.bytes)) : 100;
  std::string state;
  if (c.files == 0) state = "empty";
  else if (c.lost > 0) state = "partly lost";
  else if (c.Files(DataState::kFailed) > 0) state = "failed";
  else if (c.open > 0) state = "writing";
  else if (c.memory_only) state = "memory-only";
  else if (c.Persisted()) state = c.Files(DataState::kRemote) == c.files ? "remote" : "persisted";
  else if (done > 0 || c.Files(DataState::kDraining) > 0) state = "draining " + std::to_string(progress) + "%";
  else state = "in RAM";
  Json j = {{"path", c.path},
            {"dir", c.dir},
            {"files", c.files},
            {"bytes", c.bytes},
            {"state", state},
            {"progress", progress},
            {"complete", c.Complete()},
            {"persisted", c.Persisted()},
            {"safe", c.Safe()},
            {"replicated_files", c.replicated},
            {"open_files", c.open},
            {"lost_files", c.lost},
            {"failed_files", c.Files(DataState::kFailed)},
            {"memory_only", c.memory_only},
            {"number", c.ord},
            {"pending_bytes", pending},
            {"mtime_ns", c.mtime_ns},
            {"closed_at_ns", c.last_seal_ns > 0 ? c.last_seal_ns : c.mtime_ns}};
  // Times, when every file was written since the mount: first change to
  // last close (RAM), and last close to the last publish (durable).
  if (c.times_known && c.last_seal_ns >= c.first_change_ns && c.first_change_ns > 0)
    j["time_to_ram_s"] = static_cast<double>(c.last_seal_ns - c.first_change_ns) / 1e9;
  if (c.Timed()) j["time_to_durable_s"] = static_cast<double>(c.last_publish_ns - c.last_seal_ns) / 1e9;
  return j;
}

}  // namespace

Result<std::string> CheckpointsPage(Daemon* d, uint64_t page, const Asker& who) {
  auto list = d->table->Checkpoints(d->checkpoint_pattern);
  std::string cur = "[";  // rows joined by ',' ; "]" closes it
  uint64_t at = 0;
  for (const auto& c : list) {
    if (!MaySee(d, who, c.path)) continue;
    std::string row = Dump(CheckpointJson(c));
    // A row starts a new page when it would overflow this one.
    if (cur.size() > 1 && cur.size() + row.size() + 2 > kLostPageBytes) {
      if (at == page) return cur + "]";
      at++;
      cur = "[";
    }
    if (cur.size() > 1) cur += ',';
    cur += row;
  }
  if (at == page) return cur + "]";
  return Err(ENODATA);
}

}  // namespace ckpt::fs
