// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Running another program from a benchmark (perftest, the cache peers) with
// its output read through a pipe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace odpwatch::bench
{

// Starts argv[0] (searched in PATH) with stdout, and stderr too if
// @with_stderr, into a pipe whose read end goes to *out_fd; returns the pid.
// Throws verbs::Error when the pipe or the fork fails.
pid_t spawn(std::vector<std::string> argv, int *out_fd, bool with_stderr);

// Everything the descriptor gives until end of file; closes it.
std::string read_all(int fd);

// What a spawned program printed, and whether it exited with status 0.
struct Exit {
	std::string out;
	bool ok;
};

// Reads the output of @pid (spawned with *out_fd = @fd) to its end and
// reaps it. Nothing waits for ever: past @seconds the program is killed,
// and its output ends with a line naming @what and the limit (ok false).
Exit wait_for(pid_t pid, int fd, const std::string &what, int seconds = 900);

// Kills @pid (a server whose client failed, so it would wait for ever),
// reads what it printed and reaps it; ok is false.
Exit stop(pid_t pid, int fd);

} // namespace odpwatch::bench
