// SPDX-License-Identifier: GPL-2.0
/*
 * On a kernel without memwatch every suite of this directory must skip, not
 * fail. Each runs here under a seccomp filter that answers memwatch_create()
 * with ENOSYS, as such a kernel does, and must exit with KSFT_SKIP.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "../kselftest_harness.h"
#define MEMWATCH_NO_PROBE
#include "memwatch_util.h"

static const char *const suites[] = {
	"memwatch_test", "memwatch_bad_input", "memwatch_scale", "memwatch_race",
};

/* In a child: make memwatch_create() fail with ENOSYS, then run @path. */
static void run_without_memwatch(const char *path, int out)
{
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memwatch_create, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {
		.len = ARRAY_SIZE(filter),
		.filter = filter,
	};

	if (setpgid(0, 0) || dup2(out, STDOUT_FILENO) < 0 ||
	    dup2(out, STDERR_FILENO) < 0)
		_exit(125);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		printf("seccomp filter: %s (CONFIG_SECCOMP_FILTER=n?)\n",
		       strerror(errno));
		_exit(126);
	}
	execl(path, path, (char *)NULL);
	_exit(127);
}

TEST(suites_skip_without_the_system_call)
{
	char self[PATH_MAX], path[PATH_MAX + 32], output[4096];
	const char *dir;
	ssize_t len;
	unsigned int i;

	len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	ASSERT_LT(0, len);
	self[len] = '\0';
	dir = dirname(self);	/* the suites are built beside this test */
	for (i = 0; i < ARRAY_SIZE(suites); i++) {
		int pipefd[2], status;
		struct pollfd pfd;
		size_t got = 0;
		pid_t pid;

		snprintf(path, sizeof(path), "%s/%s", dir, suites[i]);
		ASSERT_EQ(0, access(path, X_OK)) TH_LOG("%s: %s", path,
							strerror(errno));
		ASSERT_EQ(0, pipe(pipefd));
		pid = fork();
		ASSERT_LE(0, pid);
		if (!pid) {
			close(pipefd[0]);
			run_without_memwatch(path, pipefd[1]);
		}
		close(pipefd[1]);
		/*
		 * A suite that skips is done at once (end of file); one that
		 * runs is stopped after a minute of silence. (A debug kernel
		 * beside another guest took over 5 s to start one.)
		 */
		pfd = (struct pollfd){ .fd = pipefd[0], .events = POLLIN };
		while (got < sizeof(output) - 1 && poll(&pfd, 1, 60000) == 1) {
			len = read(pipefd[0], output + got,
				   sizeof(output) - 1 - got);
			if (len <= 0)
				break;
			got += len;
		}
		output[got] = '\0';
		close(pipefd[0]);
		kill(-pid, SIGKILL);	/* its whole group; gone if it ended */
		ASSERT_EQ(pid, waitpid(pid, &status, 0));
		EXPECT_TRUE(WIFEXITED(status) &&
			    WEXITSTATUS(status) == KSFT_SKIP)
			TH_LOG("%s exits with status 0x%x, not KSFT_SKIP:\n%.600s",
			       suites[i], status, output);
		EXPECT_NE(NULL, strstr(output, "# SKIP"))
			TH_LOG("%s says no SKIP:\n%.600s", suites[i], output);
	}
}

TEST_HARNESS_MAIN
