// history.h — STATE_DIR/history.csv: one line per checkpoint when it
// becomes persisted (name, files, bytes, closed at, time to RAM, time to
// durable, drain MB/s), for `ckptfs history`. Bounded: past kMaxLines the
// file moves to history.csv.1 (the one before is dropped).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fs/core/inode_table.h"

namespace ckpt::fs {

inline constexpr char kHistoryHeader[] =
    "checkpoint,files,bytes,closed_at,time_to_ram_s,time_to_durable_s,drain_mb_s";

class History {
 public:
  explicit History(std::string path, size_t max_lines = 10000) : path_(std::move(path)), max_lines_(max_lines) {}
  // Appends a line for each checkpoint of `list` that is persisted, was
  // written during this mount (its times are known) and has no line yet
  // for that close. Called from one thread.
  void Observe(const std::vector<CheckpointInfo>& list);

  // One CSV field: quoted when it holds a comma, a quote or a line break.
  static std::string Field(const std::string& s);

 private:
  void Append(const std::string& line);
  std::string path_;
  size_t max_lines_;
  size_t lines_ = 0;  // in the current file (counted at the first append)
  bool counted_ = false;
  std::set<std::pair<std::string, int64_t>> recorded_;  // (path, last seal)
};

}  // namespace ckpt::fs
