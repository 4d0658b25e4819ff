// checkpoints.cc — checkpoints as units (`ckptfs ls`, `ckptfs latest`):
// the directories and files whose names match the mount's checkpoint
// pattern, each with what its files add up to.
//
// One of the files of InodeTable (fs/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include <algorithm>

#include "fs/core_impl.h"

namespace ckpt::fs {

namespace {
constexpr int kMaxDepth = 8;  // checkpoints live near the top; deeper trees are not searched
}  // namespace

void InodeTable::AddToCheckpoint(Inode* n, CheckpointInfo* c, int depth) {
  if (n->is_dir()) {
    if (depth > 64) return;  // a pathological tree: counted as far as this
    for (auto& [name, ino] : n->children)
      if (Inode* child = Find(ino)) AddToCheckpoint(child, c, depth + 1);
    return;
  }
  if (!S_ISREG(n->rec.mode)) return;
  c->files++;
  c->bytes += n->rec.size;
  auto s = static_cast<size_t>(n->rec.state);
  if (s < 5) {
    c->state_files[s]++;
    c->state_bytes[s] += n->rec.size;
  }
  if (n->writers > 0 || n->data_gen != n->sealed_gen) c->open++;
  c->mtime_ns = std::max<int64_t>(c->mtime_ns, n->rec.mtime.sec * 1000000000LL + n->rec.mtime.nsec);
  if (n->t_change_ns == 0 || n->t_seal_ns == 0) c->times_known = false;
  if (n->t_change_ns > 0)
    c->first_change_ns = c->first_change_ns == 0 ? n->t_change_ns : std::min(c->first_change_ns, n->t_change_ns);
  c->last_seal_ns = std::max(c->last_seal_ns, n->t_seal_ns);
  c->last_publish_ns = std::max(c->last_publish_ns, n->t_publish_ns);
}

void InodeTable::FindCheckpoints(Inode* dir, const std::string& prefix, const std::regex& pattern, int depth,
                                 std::vector<CheckpointInfo>* out) {
  for (auto& [name, ino] : dir->children) {
    Inode* c = Find(ino);
    if (!c) continue;
    std::string path = prefix.empty() ? name : prefix + "/" + name;
    if ((c->is_dir() || S_ISREG(c->rec.mode)) && std::regex_match(name, pattern)) {
      CheckpointInfo info;
      info.path = path;
      info.dir = c->is_dir();
      AddToCheckpoint(c, &info, 0);
      const std::string under = path + "/";
      for (const std::string& l : lost_)
        if (l == path || l.compare(0, under.size(), under) == 0) info.lost++;
      out->push_back(std::move(info));
    } else if (c->is_dir() && depth < kMaxDepth) {
      FindCheckpoints(c, path, pattern, depth + 1, out);
    }
  }
}

std::vector<InodeTable::CheckpointInfo> InodeTable::Checkpoints(const std::regex& pattern) {
  std::vector<CheckpointInfo> out;
  {
    MutexLock lk(&mu_);
    if (Inode* root = Find(meta::kRootIno)) FindCheckpoints(root, "", pattern, 0, &out);
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
  });
  return out;
}

}  // namespace ckpt::fs
