// cluster_record.cc — Cluster's reading of one member's record (JSON, as
// MakeRecord writes it, or a version 1 record in ms): what makes a record
// unreadable (a missing field, a time no member writes) and what refuses it
// (times in this node's future). Apart from cluster.cc for its size.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/log.h"
#include "fs/cluster/cluster.h"

namespace ckpt::fs {

using Json = nlohmann::json;

namespace {
constexpr int64_t kUsPerMs = 1000;  // as in cluster.cc: options are in ms, times in µs
}  // namespace

namespace {

// A time of a record (µs; `scale` 1000 for a version 1 record's ms): an
// integer from 0 to what µs since 1970 can be in an int64. A double
// (1e300), a negative (-9.2e18: now - heartbeat overflowed, so the record
// never aged into dead and held every drain) or an overflowing ms value
// makes the record unreadable (throws, as a missing field does).
int64_t TimeField(const nlohmann::json& v, int64_t scale) {
  if (!v.is_number_integer()) throw std::invalid_argument("a time that is not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw std::out_of_range("a time out of range");
  const int64_t t = v.get<int64_t>();
  if (t < 0 || t > INT64_MAX / scale) throw std::out_of_range("a time out of range");
  return t * scale;
}

}  // namespace

std::string NotedName(const ClusterRecord& r) { return r.incarnation.empty() ? r.node : r.node + "#" + r.incarnation; }

std::string Incarnation(const nlohmann::json& j) {
  auto it = j.find("incarnation");
  if (it == j.end()) return "";  // a version before it: unknown
  std::string s = it->get<std::string>();
  if (s.empty() || s.size() > kMaxIncarnation) throw std::invalid_argument("an incarnation no member writes");
  return s;
}

std::string Cluster::ParseRecord(const std::string& name, const std::string& bytes, int64_t now, Record* out) const {
  Record& r = *out;
  try {
    Json j = Json::parse(bytes);
    if (j.at("node").get<std::string>() != name || j.at("cluster").get<std::string>() != opt_.name) {
      LOG_DEBUG("cluster {}: record '{}' names another node or cluster; ignored", opt_.name, name);
      return "unreadable";
    }
    r.node = name;
    r.incarnation = Incarnation(j);
    r.state = j.at("state").get<std::string>();
    if (r.state != "live" && r.state != "left") return "unreadable";
    // A version 1 record (ms): the start of its millisecond, which errs
    // on the safe side for both (an older heartbeat, an earlier gate).
    const bool us = j.contains("heartbeat_us");
    auto us_field = [&](const char* f_us, const char* f_ms) -> std::optional<int64_t> {
      const Json& v = us ? j.at(f_us) : j.at(f_ms);
      if (v.is_null()) return std::nullopt;
      return us ? TimeField(v, 1) : TimeField(v, kUsPerMs);
    };
    r.heartbeat_us = us_field("heartbeat_us", "heartbeat_ms").value();
    r.watermark_us = us_field("watermark_us", "watermark_ms").value();
    r.oldest_gate_us = us_field("oldest_gate_us", "oldest_gate_ms");
    // Before U was written, every pending entry counted as lost with its node.
    if (auto it = j.find("unsafe_gate_us"); it != j.end())
      r.unsafe_gate_us = it->is_null() ? std::nullopt : std::optional<int64_t>(TimeField(*it, 1));
    else r.unsafe_gate_us = r.oldest_gate_us;
    r.unpersisted = j.at("unpersisted").get<uint64_t>();
    r.at_risk = j.value("at_risk", r.unpersisted);  // before stop 44: every unpersisted file
    r.paths = j.at("paths").get<std::vector<std::string>>();
    if (auto it = j.find("refused"); it != j.end())  // since version 2
      for (const Json& x : *it)
        r.refused.emplace_back(x.at("node").get<std::string>(), TimeField(x.at("heartbeat_us"), 1));
  } catch (const std::exception& e) {
    LOG_DEBUG("cluster {}: record '{}' is not readable ({}); ignored", opt_.name, name, e.what());
    return "unreadable";
  }
  return FutureProblem(&r, now);
}

std::string Cluster::FutureProblem(Record* r, int64_t now) const {
  // Times in this node's future beyond the skew: a clock ahead, or a
  // record no member wrote. Such a heartbeat never ages into "dead", and
  // nothing can be ordered against such gates: refused, no member.
  const int64_t ahead = std::max({r->heartbeat_us, r->watermark_us, r->oldest_gate_us.value_or(0)}) - now;
  if (ahead > opt_.max_skew_ms * kUsPerMs) {
    r->problem = fmt::format("its times lie {:.3f} s in this node's future (beyond --max-clock-skew {} ms)",
                             static_cast<double>(ahead) / (1000 * kUsPerMs), opt_.max_skew_ms);
    return "refused (" + r->problem + ")";
  }
  return "";
}

}  // namespace ckpt::fs
