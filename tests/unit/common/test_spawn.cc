// test_spawn.cc — RunCommand: argv reaches the program as it is (no shell),
// exit statuses come back, a missing program is an error, not a crash.
#include <criterion/criterion.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/spawn.h"

using ckpt::RunCommand;

Test(run_command, exit_status) {
  cr_assert_eq(RunCommand({"true"}), 0);
  cr_assert_eq(RunCommand({"false"}), 1);
  cr_assert_eq(RunCommand({"sh", "-c", "exit 7"}), 7);
}

Test(run_command, no_shell_interprets_arguments) {
  char dir[] = "/tmp/ckpt-spawn-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  std::string pwned = std::string(dir) + "/pwned";
  std::string arg = "x'$(touch " + pwned + ")'`touch " + pwned + "`;touch " + pwned;
  cr_assert_eq(RunCommand({"test", "-n", arg}), 0);
  cr_assert_neq(access(pwned.c_str(), F_OK), 0, "a shell ran the argument");
  // The argument arrives byte for byte.
  std::string out = std::string(dir) + "/out";
  cr_assert_eq(RunCommand({"sh", "-c", "printf %s \"$1\" > \"$2\"", "sh", arg, out}), 0);
  FILE* f = fopen(out.c_str(), "r");
  cr_assert_not_null(f);
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  std::string got(buf, n);
  cr_assert(got == arg, "the argument arrived as \"%s\"", got.c_str());
  unlink(out.c_str());
  rmdir(dir);
}

Test(run_command, missing_program) {
  cr_assert_lt(RunCommand({"/nonexistent/ckpt-no-such-program"}), 0);
  cr_assert_lt(RunCommand({}), 0);
}

Test(run_command, killed_by_signal) { cr_assert_eq(RunCommand({"sh", "-c", "kill -9 $$"}), 128 + 9); }
