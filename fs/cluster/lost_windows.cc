// lost_windows.cc — removals ordered after a lost member's lost entries
// (cluster_types.h: LostWindows; docs/consistency.md, "Removals ordered
// after what a lost node took with it").
#include <algorithm>

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

}  // namespace ckpt::fs
