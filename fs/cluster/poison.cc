// poison.cc — see poison.h.
#include "fs/cluster/poison.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "fs/core/oplog.h"

namespace ckpt::fs::replica {

using meta::LogEntry;
using meta::LogOp;

namespace {
std::optional<uint64_t> ParseIno(std::string_view v) {
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return n;
}
}  // namespace

void PoisonView::Add(uint64_t seq, Poison p) {
  Poison& to = by_seq[seq];
  to.all = to.all || p.all;
  for (std::string& n : p.names) to.names.push_back(std::move(n));
  to.inos.merge(p.inos);
}

std::vector<std::string> NamesOf(const LogEntry& e) {
  std::vector<std::string> out{e.path};
  switch (e.op) {
    case LogOp::kPersist:  // the other names, NUL-separated
      for (size_t at = 0; at < e.path2.size();) {
        size_t end = e.path2.find('\0', at);
        if (end == std::string::npos) end = e.path2.size();
        if (end > at) out.emplace_back(e.path2, at, end - at);
        at = end + 1;
      }
      break;
    case LogOp::kRename:
    case LogOp::kLink: out.push_back(e.path2); break;
    default:  // mkdir, rmdir, unlink, setattr; a symlink's path2 is its target's text
      break;
  }
  return out;
}

Poison PoisonOf(const LogEntry& e) {
  Poison p;
  p.names = NamesOf(e);
  if ((e.op == LogOp::kPersist || e.op == LogOp::kLink) && e.ino != 0) p.inos.insert(e.ino);
  return p;
}

std::string EncodePoison(const Poison& p) {
  if (p.all) return "*";
  std::string out;
  auto item = [&](char kind, std::string_view v) {
    if (!out.empty()) out += '\0';
    out += kind;
    out += v;
  };
  for (const std::string& n : p.names) item('p', n);
  for (uint64_t ino : p.inos) item('i', std::to_string(ino));
  return out.empty() || out.size() > kMaxPoisonText ? "*" : out;
}

Poison DecodePoison(std::string_view text) {
  Poison p;
  if (text.empty() || text == "*") return Poison::All();
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\0', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(at, end - at);
    if (item.size() < 2) return Poison::All();
    const std::string_view v = item.substr(1);
    if (item[0] == 'p') {
      p.names.emplace_back(v);
    } else if (auto ino = item[0] == 'i' ? ParseIno(v) : std::nullopt) {
      p.inos.insert(*ino);
    } else {
      return Poison::All();
    }
    at = end + 1;
  }
  return p;
}

PoisonView PoisonFromHolders(const GaveUps& by_seq) {
  PoisonView v;
  for (const auto& [seq, values] : by_seq) {
    if (std::any_of(values.begin(), values.end(), [](const auto& hv) { return hv.second == kAppliedText; })) continue;
    for (const auto& [holder, t] : values) v.Add(seq, DecodePoison(t));
  }
  return v;
}

std::optional<uint64_t> Touches(const PoisonView& v, const LogEntry& e) {
  const std::vector<std::string> names = NamesOf(e);
  const bool file = e.op == LogOp::kPersist || e.op == LogOp::kLink;
  for (const auto& [seq, p] : v.by_seq) {
    if (seq >= e.seq) break;  // only what went before it: another holder still tries the very entry given up
    if (p.all || (file && e.ino != 0 && p.inos.count(e.ino))) return seq;
    for (const std::string& n : names)
      for (const std::string& m : p.names)
        if (PathUnder(n, m) || PathUnder(m, n)) return seq;
  }
  return std::nullopt;
}

}  // namespace ckpt::fs::replica
