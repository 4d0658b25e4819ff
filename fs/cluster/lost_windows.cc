// lost_windows.cc — removals ordered after a lost member's lost entries
// (cluster_types.h: LostWindows; docs/consistency.md, "Removals ordered
// after what a lost node took with it").
#include <algorithm>
#include <map>
#include <set>

#include "common/config.h"
#include "fs/cluster/cluster_types.h"

namespace ckpt::fs {

void LostWindows::Note(const std::string& node, int64_t from_us, int64_t now) {
  // One window per (member, first lost gate): a member lost twice (it came
  // back, then died again) has two.
  if (std::any_of(windows_.begin(), windows_.end(),
                  [&](const Window& w) { return w.node == node && w.from_us == from_us; }))
    return;
  windows_.push_back(Window{node, from_us, now});
  if (windows_.size() > kMax) windows_.pop_front();
}

std::string LostWindows::Keeps(int64_t gate_us, const std::string& path) {
  for (const Window& w : windows_) {
    if (w.from_us >= gate_us || gate_us >= w.known_us) continue;
    kept_++;
    kept_paths_.push_back(path);
    if (kept_paths_.size() > kPaths) kept_paths_.pop_front();
    return w.node;
  }
  return "";
}

std::string LostFilesText(uint64_t unpersisted, uint64_t at_risk, const std::vector<std::string>& paths) {
  const uint64_t safe = unpersisted > at_risk ? unpersisted - at_risk : 0;
  std::string s = at_risk == 0 ? "its last record names no file left unreplicated"
                               : "its " + std::to_string(at_risk) + " unpersisted files not replicated are lost" +
                                     (paths.empty() ? "" : ", e.g. " + EscapeName(paths.front()));
  if (safe > 0) s += " (" + std::to_string(safe) + " replicated: their holders publish them)";
  return s;
}

void NotLostWhereHeld(ClusterRecord* gone, const std::map<std::string, ClusterRecord>& live) {
  // A path is named at risk by the members that have its bytes and no one
  // else: a live one naming it holds a copy (another holder of the dead
  // writer's file, which publishes it; or, rarely, its own file of that
  // name). Only the paths a record lists can be matched (the first ones,
  // kRecordPaths): a file past them stays counted lost, on the safe side.
  // The gate stays: the removals after it are kept out of the backend
  // until the copy is published (the live holder's own gate orders them
  // too), and at worst a removal is kept that could have gone.
  std::set<std::string> held;
  for (const auto& [node, r] : live)
    if (node != gone->node && r.state == "live") held.insert(r.paths.begin(), r.paths.end());
  const size_t before = gone->paths.size();
  std::erase_if(gone->paths, [&](const std::string& p) { return held.count(p) > 0; });
  const uint64_t elsewhere = before - gone->paths.size();
  gone->at_risk = gone->at_risk > elsewhere ? gone->at_risk - elsewhere : 0;
}

}  // namespace ckpt::fs
