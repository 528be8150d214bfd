// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "spawn.hpp"

#include "verbs.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

namespace odpwatch::bench
{

pid_t spawn(std::vector<std::string> argv, int *out_fd, bool with_stderr)
{
	int fd[2];
	if (pipe2(fd, O_CLOEXEC))
		throw verbs::Error("pipe2", errno);
	pid_t pid = fork();
	if (pid < 0) {
		int err = errno;
		close(fd[0]);
		close(fd[1]);
		throw verbs::Error("fork", err);
	}
	if (pid == 0) {
		dup2(fd[1], STDOUT_FILENO);
		if (with_stderr)
			dup2(fd[1], STDERR_FILENO);
		std::vector<char *> args;
		for (auto &a : argv)
			args.push_back(a.data());
		args.push_back(nullptr);
		execvp(args[0], args.data());
		_exit(127);
	}
	close(fd[1]);
	*out_fd = fd[0];
	return pid;
}

std::string read_all(int fd)
{
	std::string s;
	char buf[4096];
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		s.append(buf, size_t(n));
	close(fd);
	return s;
}

Exit wait_for(pid_t pid, int fd, const std::string &what, int seconds)
{
	using clock = std::chrono::steady_clock;
	const auto deadline = clock::now() + std::chrono::seconds(seconds);
	std::string s;
	char buf[4096];
	bool late = false, exited = false;
	int st = 0;
	auto until = deadline;
	for (;;) {
		// Its exit, not only the end of its output: a process it started
		// may hold the output open (a ucx_perftest server on the wire
		// bench's node 1 sat a zombie for 900 s that way, and the client
		// found no server on the next port). What comes within a second
		// of the exit is kept.
		if (!exited && waitpid(pid, &st, WNOHANG) == pid) {
			exited = true;
			until = std::min(deadline, clock::now() + std::chrono::seconds(1));
		}
		auto left =
			std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
		if (left.count() <= 0) {
			late = !exited;
			break;
		}
		pollfd p = {fd, POLLIN, 0};
		int n = poll(&p, 1, int(std::min<long long>(left.count(), 100)));
		if (n < 0 && errno != EINTR)
			break;
		if (n <= 0)
			continue;
		ssize_t got = read(fd, buf, sizeof(buf));
		if (got <= 0)
			break;
		s.append(buf, size_t(got));
	}
	close(fd);
	// The output closed, yet the program may linger: its exit is bounded too.
	while (!late && !exited && waitpid(pid, &st, WNOHANG) == 0) {
		if (clock::now() >= deadline)
			late = true;
		else
			std::this_thread::sleep_for(std::chrono::milliseconds(50));
	}
	if (late) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		s += "\n[odpwatch bench: " + what + " did not finish within " +
		     std::to_string(seconds) + " s: killed]\n";
		std::fprintf(stderr, "odpwatch bench: %s did not finish within %d s: killed\n",
			     what.c_str(), seconds);
		return {s, false};
	}
	const bool ok = WIFEXITED(st) && !WEXITSTATUS(st);
	if (!ok) // how it ended, for the caller's report
		s += WIFSIGNALED(st) ? "\n[odpwatch bench: " + what + " killed by signal " +
					       std::to_string(WTERMSIG(st)) + "]\n"
				     : "\n[odpwatch bench: " + what + " exited with status " +
					       std::to_string(WEXITSTATUS(st)) + "]\n";
	return {s, ok};
}

Exit stop(pid_t pid, int fd)
{
	kill(pid, SIGKILL);
	std::string out = read_all(fd);
	waitpid(pid, nullptr, 0);
	return {out + "\n[odpwatch bench: stopped, its peer had failed]\n", false};
}

} // namespace odpwatch::bench
