// namespace.cc — the inode map and the tree's queries (see namespace.h).
#include "fs/core/namespace.h"

#include <cstdlib>
#include <vector>

namespace ckpt::fs {

Inode* Namespace::Find(uint64_t ino) const {
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : it->second.get();
}

Result<Inode*> Namespace::FindDir(uint64_t ino) const {
  Inode* n = Find(ino);
  if (!n) return Err(ENOENT);
  if (!n->is_dir()) return Err(ENOTDIR);
  return n;
}

Result<Inode*> Namespace::Child(const Inode* dir, std::string_view name) const {
  auto it = dir->children.find(name);
  if (it == dir->children.end()) return Err(ENOENT);
  Inode* c = Find(it->second);
  if (!c) abort();  // broken invariant: a directory entry without its inode
  return c;
}

Inode* Namespace::Insert(std::unique_ptr<Inode> n) {
  uint64_t ino = n->rec.ino;
  auto [it, added] = inodes_.emplace(ino, std::move(n));
  if (!added) abort();  // broken invariant: an inode number given twice
  ReserveUpTo(ino + 1);
  return it->second.get();
}

void Namespace::Erase(uint64_t ino) { inodes_.erase(ino); }

bool Namespace::IsAncestor(uint64_t maybe_ancestor, uint64_t ino) const {
  // Walks up from ino; true if maybe_ancestor is ino or above it. A tree is
  // as deep as it has inodes at most: a walk longer than that is a cycle
  // (Load refuses them), answered "yes", so the rename is refused (EINVAL).
  // It stopped at 100000 steps and aborted: a user who renamed directories
  // into a chain that deep took the mount down for everyone.
  for (size_t depth = 0; depth <= inodes_.size(); depth++) {
    if (ino == maybe_ancestor) return true;
    if (ino == meta::kRootIno) return false;
    Inode* n = Find(ino);
    if (!n) return false;
    ino = n->rec.parent;
  }
  return true;
}

std::string Namespace::DirPath(uint64_t dir_ino) const {
  std::vector<const std::string*> parts;
  for (uint64_t ino = dir_ino; ino != meta::kRootIno;) {
    Inode* n = Find(ino);
    if (!n || parts.size() > inodes_.size()) break;  // Load refused cycles; never loop
    parts.push_back(&n->rec.name);
    ino = n->rec.parent;
  }
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!out.empty()) out.push_back('/');
    out.append(**it);
  }
  return out;
}

std::string Namespace::EntryPath(uint64_t parent, std::string_view name) const {
  std::string p = DirPath(parent);
  if (!p.empty()) p.push_back('/');
  p.append(name);
  return p;
}

size_t Namespace::SubtreePathLen(const Inode* n) const {
  size_t longest = 0;
  std::vector<std::pair<const Inode*, size_t>> stack{{n, 0}};
  while (!stack.empty()) {
    auto [d, base] = stack.back();
    stack.pop_back();
    for (auto& [name, ino] : d->children) {
      size_t len = base + (base ? 1 : 0) + name.size();
      longest = std::max(longest, len);
      const Inode* c = Find(ino);
      if (c && c->is_dir()) stack.emplace_back(c, len);
    }
  }
  return longest;
}

NamespaceStats Namespace::Stats() {
  MutexLock lk(&mu_);
  NamespaceStats s;
  for (auto& [ino, n] : inodes_) {
    s.inodes++;
    if (n->is_dir()) s.dirs++;
    if (S_ISREG(n->rec.mode)) {
      s.files++;
      s.bytes += n->rec.size;
    }
  }
  return s;
}

}  // namespace ckpt::fs
