// mem_records.h — the members' records of a cluster in memory, for the
// cluster unit tests: the test plays the store (and, where it writes
// records itself, the other members).
#pragma once

#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fs/cluster/cluster_types.h"

namespace ckpt::test {

struct MemRecords : fs::RecordStore {
  std::mutex mu;
  std::map<std::string, std::string> recs;
  bool down = false;       // both writes and reads fail
  bool put_fails = false;  // writes fail, reads work (a bucket policy, a full disk)
  // Set (even to ""): the store reduces, and members read this digest
  // (what the elected member wrote) instead of every record.
  std::optional<std::string> digest;
  std::string standing;  // RecordStore::Standing: "" a member; else why the others may count this node dead

  Status Put(const std::string& node, const std::string& bytes) override {
    std::lock_guard lk(mu);
    if (down || put_fails) return std::unexpected(EIO);
    recs[node] = bytes;
    return {};
  }
  Result<std::vector<std::pair<std::string, std::string>>> List() override {
    std::lock_guard lk(mu);
    if (down) return std::unexpected(EIO);
    return std::vector<std::pair<std::string, std::string>>(recs.begin(), recs.end());
  }
  std::optional<std::string> Digest() override {
    std::lock_guard lk(mu);
    return digest;
  }
  std::string Standing() override {
    std::lock_guard lk(mu);
    return standing;
  }
};

}  // namespace ckpt::test
