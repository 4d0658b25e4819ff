// tree.h — a bare Namespace with a root directory, and entries added by
// hand, for the unit tests of what reads the tree (Namespace,
// CheckpointCatalog).
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>

#include "common/mutex.h"
#include "fs/core/namespace.h"

namespace ckpt::test {

// A namespace with a root directory; Add puts an entry under a parent.
struct Tree {
  fs::Namespace ns;
  Tree() {
    ckpt::MutexLock lk(&ns.mu());
    auto root = std::make_unique<fs::Inode>();
    root->rec.ino = root->rec.parent = meta::kRootIno;
    root->rec.mode = S_IFDIR | 0755;
    root->rec.nlink = 2;
    ns.Insert(std::move(root));
  }
  // Adds `name` under `parent`; returns its number.
  uint64_t Add(uint64_t parent, const std::string& name, uint32_t mode, uint64_t size = 0) {
    ckpt::MutexLock lk(&ns.mu());
    auto n = std::make_unique<fs::Inode>();
    n->rec.ino = ns.TakeIno();
    n->rec.parent = parent;
    n->rec.name = name;
    n->rec.mode = mode;
    n->rec.size = size;
    n->rec.nlink = S_ISDIR(mode) ? 2 : 1;
    uint64_t ino = n->rec.ino;
    ns.Find(parent)->children.emplace(name, ino);
    ns.Insert(std::move(n));
    return ino;
  }
};

}  // namespace ckpt::test
