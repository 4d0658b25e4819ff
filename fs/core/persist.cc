// persist.cc — what the facade says of the drain: waits for the backend
// (fsync=backend, `ckptfs drain`), the shutdown that answers them, and the
// counts status shows. The drain's own side is drain_port.cc.
//
// One of the files of InodeTable (fs/core/inode_table.h), split by
// responsibility; docs/architecture.md maps them.
#include "fs/core/core_impl.h"

namespace ckpt::fs {

void InodeTable::WhenApplied(uint64_t seq, uint64_t ino, std::function<void(int err)> fn) {
  OpLog::Due due;  // an answer known now runs once the namespace lock is released
  MutexLock lk(&mu());
  // A file whose version the backend refused: its fsync fails at once.
  // Outcomes after this moment reach the waiter through the log; both are
  // decided under the namespace lock, which every completion holds too.
  Inode* n = ino ? core_.Find(ino) : nullptr;
  if (n && n->rec.state == DataState::kFailed) {
    due.fns.emplace_back(std::move(fn), EIO);
    return;
  }
  core_.oplog.WhenApplied(seq, std::move(fn), &due);
}

int InodeTable::WaitApplied(uint64_t seq, uint64_t ino) {
  return OpLog::Await([&](std::function<void(int)> fn) { WhenApplied(seq, ino, std::move(fn)); });
}

void InodeTable::Shutdown() {
  core_.oplog.Shutdown();  // waiters hear EIO
  MutexLock lk(&mu());
  shutdown_ = true;
  fetch_cv_.NotifyAll();
}

DataStats InodeTable::DataStatistics() {
  MutexLock lk(&mu());
  DataStats s;
  for (auto& [ino, n] : core_.ns.all()) {
    if (!S_ISREG(n->rec.mode) || n->rec.nlink == 0) continue;
    auto i = static_cast<size_t>(n->rec.state);
    s.files[i]++;
    s.bytes[i] += n->rec.size;
  }
  s.log_len = core_.oplog.size();
  s.head_seq = core_.oplog.LoggedSeq();
  s.applied_seq = core_.oplog.AppliedSeq();
  return s;
}

}  // namespace ckpt::fs
