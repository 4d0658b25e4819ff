// spawn.h — runs a program with an argv vector, never through a shell.
//
// Every external command ckptfs runs (fusermount3, umount) goes through
// RunCommand: paths are passed as separate arguments, so a quote, `$(...)`,
// a space or a newline in a mount point is data, never shell syntax.
#pragma once

#include <string>
#include <vector>

namespace ckpt {

// Runs argv[0] (looked up on PATH when it has no '/') with these arguments,
// the caller's environment, stdin/stdout/stderr, and waits for it.
// Returns its exit status (0-255), 128 + N when signal N killed it, or -1
// with errno set when it could not be started (empty argv: EINVAL; the
// program missing: ENOENT). Thread-safe; blocks the calling thread.
int RunCommand(const std::vector<std::string>& argv);

}  // namespace ckpt
