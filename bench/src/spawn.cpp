// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "spawn.hpp"

#include "verbs.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

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

Exit wait_for(pid_t pid, int fd)
{
	std::string out = read_all(fd);
	int st = 0;
	waitpid(pid, &st, 0);
	return {out, WIFEXITED(st) && !WEXITSTATUS(st)};
}

} // namespace odpwatch::bench
