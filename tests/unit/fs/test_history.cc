// test_history.cc — STATE_DIR/history.csv (fs/views/history.h): CSV quoting, one
// line per persisted checkpoint and close, nothing for checkpoints still
// draining or written before the mount, and rotation.
#include <criterion/criterion.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "fs/views/history.h"

using ckpt::fs::History;
using Info = ckpt::fs::CheckpointInfo;

namespace {

std::string Slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Info Persisted(const std::string& path, int64_t seal_ns) {
  Info c;
  c.path = path;
  c.dir = true;
  c.files = 2;
  c.bytes = 4000000;
  c.state_files[static_cast<size_t>(ckpt::meta::DataState::kPersisted)] = 2;
  c.first_change_ns = seal_ns - 2000000000;
  c.last_seal_ns = seal_ns;
  c.last_publish_ns = seal_ns + 1000000000;
  return c;
}

}  // namespace

Test(history, field_quoting) {
  cr_assert(History::Field("global_step7") == "global_step7");
  cr_assert(History::Field("a,b") == "\"a,b\"");
  cr_assert(History::Field("say \"hi\"") == "\"say \"\"hi\"\"\"");
  cr_assert(History::Field("line\nbreak") == "\"line\nbreak\"");
}

Test(history, one_line_per_persisted_checkpoint_and_rotation) {
  char tmpl[] = "/tmp/ckpt-history-unit-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  const std::string dir = tmpl, path = dir + "/history.csv";
  History h(path, /*max_lines=*/4);
  Info draining = Persisted("step_2", 3000000000000000000);
  draining.state_files[static_cast<size_t>(ckpt::meta::DataState::kDirty)] = 1;
  Info old = Persisted("step_0", 2000000000000000000);
  old.times_known = false;  // written before this mount
  h.Observe({Persisted("step_1", 1700000000000000000), draining, old});
  h.Observe({Persisted("step_1", 1700000000000000000)});  // the same close: no second line
  std::string text = Slurp(path);
  cr_assert(text.rfind(std::string(ckpt::fs::kHistoryHeader) + "\n", 0) == 0, "header: %s", text.c_str());
  cr_assert(text.find("step_1,2,4000000,2023-11-14T22:13:20Z,2.000,1.000,4.0\n") != std::string::npos, "%s",
            text.c_str());
  cr_assert(text.find("step_2") == std::string::npos, "a draining checkpoint has a line");
  cr_assert(text.find("step_0") == std::string::npos, "a checkpoint of before the mount has a line");
  // Past 4 lines (header included) the file moves to .1.
  h.Observe({Persisted("step_3", 1700000001000000000), Persisted("step_4", 1700000002000000000),
             Persisted("step_5", 1700000003000000000)});
  cr_assert(std::filesystem::exists(path + ".1"), "no rotation");
  cr_assert(Slurp(path + ".1").find("step_4") != std::string::npos);
  std::string now = Slurp(path);
  cr_assert(now.rfind(std::string(ckpt::fs::kHistoryHeader) + "\nstep_5,", 0) == 0, "after rotation: %s", now.c_str());
  std::filesystem::remove_all(dir);
}
