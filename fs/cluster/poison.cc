// poison.cc — see poison.h.
#include "fs/cluster/poison.h"

#include <string_view>

#include "fs/core/oplog.h"

namespace ckpt::fs::replica {

using meta::LogEntry;
using meta::LogOp;

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
