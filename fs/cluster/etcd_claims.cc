// etcd_claims.cc — the holders' claims on a dead writer's entries
// (taken/ in etcd_records.h): put, marked, read back by the holder, read
// by the writer's run back (revoking a gone holder's) and pruned.
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "fs/cluster/etcd_records.h"

namespace ckpt::fs {

namespace {
constexpr char kMembers[] = "members/";
constexpr char kTaken[] = "taken/";
constexpr char kGaveUpDir[] = "gaveup/";
constexpr char kAppliedDir[] = "applied/";  // APPLIED/WRITER/RUN/SEQ/HOLDER: a done mark by seq (MarkTaken)
}  // namespace
namespace {
constexpr int64_t kPage = 10000;  // keys a range read brings at once (a run's claims can be many)

// A run as a key names it: "-" for one unknown (a writer of an earlier
// version); '/' (and '%') escaped, so that it stays one component.
std::string RunText(const std::string& run) {
  if (run.empty()) return "-";
  std::string out;
  for (char c : run) out += c == '/' ? "%2F" : c == '%' ? "%25" : std::string(1, c);
  return out;
}

// SEQ as a key names it: 20 digits (UINT64_MAX has 20), so keys sort as seqs do.
std::string SeqText(uint64_t seq) { return fmt::format("{:020}", seq); }

std::optional<uint64_t> ParseSeq(const std::string& s) {
  if (s.size() != 20 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (v > (UINT64_MAX - (c - '0')) / 10) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// A claim's value: its status, then the holder's run ("" : a version
// before it wrote one).
bool StatusChar(const std::string& v) {
  return !v.empty() && v.size() <= 1 + kMaxIncarnation &&
         (v[0] == EtcdRecords::kClaimed || v[0] == EtcdRecords::kDone || v[0] == EtcdRecords::kGaveUp ||
          v[0] == EtcdRecords::kRevoked);
}
std::string HolderRun(const std::string& v) { return v.substr(1); }

// A run from its key text (RunText's inverse).
std::string RunFromText(const std::string& t) {
  if (t == "-") return "";
  std::string out;
  for (size_t i = 0; i < t.size(); i++) {
    if (t.compare(i, 3, "%2F") == 0) out += '/', i += 2;
    else if (t.compare(i, 3, "%25") == 0) out += '%', i += 2;
    else out += t[i];
  }
  return out;
}

// Every key of [key, end), read a page at a time, every page as of one
// revision (the first page's): `*rev` says which.
Result<std::vector<etcd::KeyValue>> RangeAll(etcd::Client* c, std::string key, const std::string& end,
                                             int64_t* rev = nullptr) {
  std::vector<etcd::KeyValue> out;
  int64_t at = 0;
  for (;;) {
    auto r = c->Range(key, end, kPage, 0, at);
    if (!r) return Err(r.error());
    if (at == 0) at = r->revision;
    if (rev) *rev = at;
    for (etcd::KeyValue& kv : r->kvs) out.push_back(std::move(kv));
    if (!r->more || r->kvs.empty()) return out;
    key = out.back().key + '\0';  // the next key after the last
  }
}
}  // namespace

std::optional<uint64_t> EtcdRecords::AppliedSeqOf(const std::string& bytes) {
  {
    MutexLock lk(&mu_);
    if (run_claims_.empty()) return std::nullopt;  // nothing to prune: not parsed
  }
  // This run's own log position (the record names the run it is of).
  try {
    auto j = nlohmann::json::parse(bytes);
    if (!j.contains("applied_seq") || j.value("incarnation", std::string()) != opt_.incarnation) return std::nullopt;
    return j.at("applied_seq").get<uint64_t>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void EtcdRecords::PruneTaken(uint64_t applied) {
  // Each claim at or below `applied` is completed here: done or given up
  // (the drain completed it unapplied, or applied it), or claimed by a
  // holder gone since (applied); one a live holder has not marked holds
  // the drain before it, so it is never below. One range a holder, deleted
  // in one request; the read's view of them (no claim comes after it)
  // shrinks with it.
  const std::string dir = prefix_ + kTaken + opt_.node + "/" + RunText(opt_.incarnation) + "/";
  std::vector<etcd::Client::Op> ops;
  {
    MutexLock lk(&mu_);
    for (const auto& [holder, seqs] : run_claims_)
      if (!seqs.empty() && *seqs.begin() <= applied)
        ops.push_back({.del = true,
                       .key = dir + holder + "/" + SeqText(0),
                       .range_end = dir + holder + "/" + SeqText(applied) + '\0'});
  }
  // The holders' give-ups and done marks by seq among them (each has its
  // claim beside it): GAVEUP/SEQ/HOLDER and APPLIED/SEQ/HOLDER up to
  // `applied`.
  if (!ops.empty())
    for (const char* d : {kGaveUpDir, kAppliedDir}) {
      const std::string dir2 = prefix_ + d + opt_.node + "/" + RunText(opt_.incarnation) + "/";
      ops.push_back({.del = true,
                     .key = dir2 + SeqText(0),
                     .range_end = applied == UINT64_MAX ? etcd::PrefixEnd(dir2) : dir2 + SeqText(applied + 1)});
    }
  for (size_t i = 0; i < ops.size(); i += 128) {  // etcd's limit of operations in one transaction
    std::vector<etcd::Client::Op> part(ops.begin() + i, ops.begin() + std::min(ops.size(), i + 128));
    if (auto r = client_.Txn(part); !r) {
      LOG_WARN("cluster {}: deleting the claims this run's drain went past: {} (again at its next record)",
               opt_.cluster, client_.LastError());
      return;
    }
  }
  MutexLock lk(&mu_);
  for (auto it = run_claims_.begin(); it != run_claims_.end();) {
    it->second.erase(it->second.begin(), it->second.upper_bound(applied));
    it = it->second.empty() ? run_claims_.erase(it) : std::next(it);
  }
}

Status EtcdRecords::ReadTaken(bool first) {
  const std::string dir = prefix_ + kTaken + opt_.node + "/" + RunText(opt_.incarnation) + "/";
  int64_t rev = 0;
  auto r = RangeAll(&client_, dir, etcd::PrefixEnd(dir), &rev);
  if (!r) {
    SetError("reading what this node's holders took over: " + client_.LastError());
    return Err(r.error());
  }
  // HOLDER/SEQ under this run's directory, one key a claim.
  std::map<std::string, Claims> by_holder;
  std::map<std::pair<std::string, uint64_t>, const etcd::KeyValue*> keys;  // (holder, seq) -> its claim as read
  size_t odd = 0;
  for (const etcd::KeyValue& kv : *r) {
    const std::string rest = kv.key.substr(dir.size());
    const size_t slash = rest.find('/');
    auto seq = slash == std::string::npos ? std::nullopt : ParseSeq(rest.substr(slash + 1));
    if (!seq || !ValidClusterName(rest.substr(0, slash)) || !StatusChar(kv.value)) {
      odd++;
      continue;
    }
    by_holder[rest.substr(0, slash)][*seq] = kv.value[0];
    keys[{rest.substr(0, slash), *seq}] = &kv;
  }
  if (odd > 0)
    LOG_WARN("cluster {}: {} etcd keys under {} are not holders' claims; ignored", opt_.cluster, odd, EscapeName(dir));
  Taken taken;
  std::map<std::string, std::set<uint64_t>> seen;
  std::string who;  // for the log: each holder, and how many it took
  size_t done_n = 0, claimed_n = 0;
  for (const auto& [holder, claims] : by_holder) {
    size_t done = 0, claimed = 0;
    for (const auto& [seq, status] : claims) {
      done += status == kDone;
      claimed += status == kClaimed;
      seen[holder].insert(seq);
    }
    // Claimed and not done: the holder's run's to finish while it lives;
    // gone (its record absent, or another run's), the entry is this node's
    // again once the claim is revoked (it may have applied it before it
    // died: a second failure, within what K+1 losses may lose). The record
    // as of the claims' read: a holder that marked a claim and then died
    // between the two reads is not taken for one that did not mark it.
    bool record_absent = false;
    int64_t record_rev = 0;  // its mod_revision as read (0: absent)
    std::string record_run;
    if (claimed > 0) {
      auto m = client_.Range(prefix_ + kMembers + holder, "", 0, 0, rev);
      if (!m) {
        SetError("reading the record of holder " + holder + ": " + client_.LastError());
        return Err(m.error());
      }
      record_absent = m->kvs.empty() || m->kvs[0].lease == 0;  // (one without a lease: not a member's)
      record_rev = m->kvs.empty() ? 0 : m->kvs[0].mod_revision;
      if (!record_absent) try {
          record_run = Incarnation(nlohmann::json::parse(m->kvs[0].value));
        } catch (const std::exception&) {
          // a record this version does not read: its run unknown (live)
        }
    }
    bool gone = false;
    for (const auto& [seq, status] : claims) {
      if (status == kDone) taken.done.push_back(seq);
      if (status != kClaimed) continue;
      const etcd::KeyValue* kv = keys[{holder, seq}];
      if (!record_absent && SameIncarnation(record_run, HolderRun(kv->value))) {
        taken.claimed.push_back(seq);
        continue;
      }
      gone = true;
      auto revoked =
          Revoke(*kv, holder, HolderRun(kv->value), record_absent ? std::optional(record_rev) : std::nullopt);
      if (!revoked) return Err(revoked.error());
      if (!*revoked) taken.claimed.push_back(seq);  // changed since the read: waited for until the next
    }
    const bool holder_live = !gone;
    done_n += done;
    claimed_n += claimed;
    who += fmt::format("{}{} {}{}", who.empty() ? "" : ", ", holder, claims.size(), holder_live ? "" : " (gone since)");
  }
  {
    MutexLock lk(&mu_);
    run_claims_ = std::move(seen);
  }
  // One line a read (not one a claim); the refreshes of a drain waiting
  // at a claim, twice a second, at debug.
  if (!by_holder.empty()) {
    const std::string line = fmt::format(
        "cluster {}: holders took over {} of this run's entries while it was counted dead ({} done, {} not "
        "done; by holder: {})",
        opt_.cluster, r->size() - odd, done_n, claimed_n, who);
    if (first) LOG_INFO("{}", line);
    else LOG_DEBUG("{}", line);
  }
  if (on_taken_) on_taken_(taken);
  return {};
}

Result<bool> EtcdRecords::Revoke(const etcd::KeyValue& kv, const std::string& holder, const std::string& holder_run,
                                 std::optional<int64_t> record_rev) {
  // Guarded by the claim as read (a mark that landed since wins) and, for
  // a holder whose record was absent, by its absence: a holder that stood
  // again first re-reads its claims under its new record and keeps this
  // one; one that stands again after sees kRevoked and publishes nothing
  // of it. A record of another run stays another run's.
  std::vector<std::pair<std::string, int64_t>> guards{{kv.key, kv.mod_revision}};
  if (record_rev) guards.emplace_back(prefix_ + kMembers + holder, *record_rev);
  auto r = client_.PutIfRevisions(kv.key, std::string(1, kRevoked) + holder_run, guards);
  if (!r) {
    SetError("revoking the claim " + EscapeName(kv.key) + " of a holder gone: " + client_.LastError());
    return Err(r.error());
  }
  if (r->succeeded)
    LOG_WARN("cluster {}: holder {} ({}) claimed {} and is gone: revoked, this node applies the entry itself",
             opt_.cluster, holder, record_rev ? "its record expired" : "another run of the id is there",
             EscapeName(kv.key));
  return r->succeeded;
}

Result<bool> EtcdRecords::ClaimTaken(const std::string& writer, const std::string& run, uint64_t seq,
                                     int64_t writer_rev) {
  const std::string key = prefix_ + kTaken + writer + "/" + RunText(run) + "/" + opt_.node + "/" + SeqText(seq);
  const std::string mine = std::string(1, kClaimed) + opt_.incarnation;
  auto r = client_.PutIfRevisions(key, mine, {{prefix_ + kMembers + writer, writer_rev}, {key, 0}});
  if (r && r->succeeded) return true;
  // Refused, or the reply lost: this run's claim may be there already (an
  // earlier try's reply was lost). Unrecorded, this holder would never
  // finish it once the writer is back (its retry is refused), and the
  // writer's drain would wait for it for ever. One key read.
  auto back = client_.Range(key);
  if (back && !back->kvs.empty() && back->kvs[0].value == mine) return true;
  if (!r) return Err(r.error());
  if (!back) return Err(back.error());
  return false;
}

Status EtcdRecords::MarkTaken(const std::string& writer, const std::string& run, uint64_t seq, char status,
                              const std::string* names) {
  // Guarded by the claim itself, as this run claimed it: once the writer's
  // drain went past the entry it deleted the claim, and a mark put then
  // would stay for ever; a revoked claim stays revoked. The names go under
  // the same guard, first: etcd decides every nested compare before any
  // put, so both land or neither.
  const std::string key = prefix_ + kTaken + writer + "/" + RunText(run) + "/" + opt_.node + "/" + SeqText(seq);
  const std::string claimed = std::string(1, kClaimed) + opt_.incarnation;
  if (FAULT("takeover.mark")) {
    SetError("marking a claim: fault takeover.mark");
    return Err(EIO);
  }
  std::vector<etcd::Client::Op> ops;
  if (names)
    ops.push_back({.key = prefix_ + kGaveUpDir + writer + "/" + RunText(run) + "/" + SeqText(seq) + "/" + opt_.node,
                   .value = *names,
                   .guard_key = key,
                   .guard_value = claimed});
  // A done mark also says so by seq, where a holder about to give a later
  // entry up for another holder's give-up of this one looks first
  // (AppliedBy): done wins whichever mark lands first (K > 1). Not among
  // the give-ups: those are read at every entry, these only for the seqs
  // that poison one.
  if (status == kDone)
    ops.push_back({.key = prefix_ + kAppliedDir + writer + "/" + RunText(run) + "/" + SeqText(seq) + "/" + opt_.node,
                   .value = "+",
                   .guard_key = key,
                   .guard_value = claimed});
  ops.push_back(
      {.key = key, .value = std::string(1, status) + opt_.incarnation, .guard_key = key, .guard_value = claimed});
  auto r = client_.Txn(ops);
  if (!r) return Err(r.error());
  return {};
}

Result<size_t> EtcdRecords::ReadGaveUp(const std::string& writer, const std::string& run,
                                       std::map<uint64_t, std::map<std::string, std::string>>* into, int64_t* rev) {
  const std::string dir = prefix_ + kGaveUpDir + writer + "/" + RunText(run) + "/";
  std::vector<etcd::KeyValue> kvs;
  if (*rev == 0) {
    auto r = RangeAll(&client_, dir, etcd::PrefixEnd(dir), rev);
    if (!r) return Err(r.error());
    kvs = std::move(*r);
  } else {  // what was put since: O(new give-ups) sent back (etcd reads them all: give-ups only here)
    auto r = client_.RangeSince(dir, etcd::PrefixEnd(dir), *rev + 1);
    if (!r) return Err(r.error());
    kvs = std::move(r->kvs);
    *rev = std::max(*rev, r->revision);
  }
  for (etcd::KeyValue& kv : kvs) {  // SEQ/HOLDER
    auto seq = ParseSeq(kv.key.substr(dir.size(), 20));
    if (seq && kv.key.size() > dir.size() + 21 && kv.key[dir.size() + 20] == '/')
      (*into)[*seq][kv.key.substr(dir.size() + 21)] = std::move(kv.value);
  }
  return kvs.size();
}

Result<EtcdRecords::Applied> EtcdRecords::AppliedBy(const std::string& writer, const std::string& run, uint64_t seq) {
  const std::string tail = writer + "/" + RunText(run) + "/" + SeqText(seq) + "/";
  const std::string dir = prefix_ + kAppliedDir + tail;
  auto r = client_.Range(dir, etcd::PrefixEnd(dir), 1);
  if (!r) return Err(r.error());
  if (!r->kvs.empty()) return Applied::kByHolder;
  // The give-ups at the same revision: gone, the writer's prune went past
  // the entry (it deletes both ranges at once), so it is applied too.
  const std::string gave = prefix_ + kGaveUpDir + tail;
  auto g = client_.Range(gave, etcd::PrefixEnd(gave), 1, 0, r->revision);
  if (!g) return Err(g.error());
  return g->kvs.empty() ? Applied::kPruned : Applied::kNo;
}

Result<EtcdRecords::Claims> EtcdRecords::OwnClaims(const std::string& writer, const std::string& run) {
  const std::string dir = prefix_ + kTaken + writer + "/" + RunText(run) + "/" + opt_.node + "/";
  auto r = RangeAll(&client_, dir, etcd::PrefixEnd(dir));
  if (!r) return Err(r.error());
  Claims out;
  for (const etcd::KeyValue& kv : *r)
    if (auto seq = ParseSeq(kv.key.substr(dir.size()));
        seq && StatusChar(kv.value) && HolderRun(kv.value) == opt_.incarnation)
      out[*seq] = kv.value[0];
  return out;
}

Result<std::map<std::pair<std::string, std::string>, EtcdRecords::Claims>> EtcdRecords::AllOwnClaims(
    OthersClaims* others) {
  const std::string dir = prefix_ + kTaken;
  auto r = RangeAll(&client_, dir, etcd::PrefixEnd(dir));
  if (!r) return Err(r.error());
  std::map<std::pair<std::string, std::string>, Claims> out;
  for (const etcd::KeyValue& kv : *r) {
    // WRITER/RUN/HOLDER/SEQ
    const std::string rest = kv.key.substr(dir.size());
    const size_t a = rest.find('/'), b = a == std::string::npos ? a : rest.find('/', a + 1),
                 c = b == std::string::npos ? b : rest.find('/', b + 1);
    if (c == std::string::npos) continue;
    auto seq = ParseSeq(rest.substr(c + 1));
    if (!seq || !StatusChar(kv.value)) continue;
    std::pair<std::string, std::string> run{rest.substr(0, a), RunFromText(rest.substr(a + 1, b - a - 1))};
    const bool mine = c - b - 1 == opt_.node.size() && rest.compare(b + 1, c - b - 1, opt_.node) == 0 &&
                      HolderRun(kv.value) == opt_.incarnation;
    if (mine) {
      out[std::move(run)][*seq] = kv.value[0];
    } else if (others) {
      Others& o = (*others)[std::move(run)];
      o.last = std::max(o.last, *seq);
      if (kv.value[0] == kDone) o.done.insert(*seq);
    }
  }
  return out;
}

}  // namespace ckpt::fs
