/* SPDX-License-Identifier: GPL-2.0 */
/* Shared by the memwatch selftests. */
#ifndef MEMWATCH_UTIL_H
#define MEMWATCH_UTIL_H

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../kselftest.h"

/* Until the C library's headers know the system call. */
#ifndef __NR_memwatch_create
#define __NR_memwatch_create 473
#endif

static inline int memwatch_create(unsigned int flags)
{
	return syscall(__NR_memwatch_create, flags);
}

/* Pass descriptor @fd over the unix socket @sock (SCM_RIGHTS). */
static inline int send_fd(int sock, int fd)
{
	char buf[CMSG_SPACE(sizeof(int))] = { 0 };
	char c = 0;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = buf, .msg_controllen = sizeof(buf),
	};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static inline int recv_fd(int sock)
{
	char buf[CMSG_SPACE(sizeof(int))] = { 0 };
	char c;
	struct iovec iov = { .iov_base = &c, .iov_len = 1 };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = buf, .msg_controllen = sizeof(buf),
	};
	struct cmsghdr *cm;
	int fd;

	if (recvmsg(sock, &msg, 0) != 1)
		return -1;
	cm = CMSG_FIRSTHDR(&msg);
	if (!cm || cm->cmsg_type != SCM_RIGHTS)
		return -1;
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	return fd;
}

#ifndef MEMWATCH_NO_PROBE
/*
 * A kernel without memwatch (CONFIG_MEMWATCH=n, or older) answers ENOSYS:
 * the suite then skips as a whole instead of failing test after test.
 */
static void __attribute__((constructor)) memwatch_probe(void)
{
	int fd = memwatch_create(0);

	if (fd >= 0)
		close(fd);
	else if (errno == ENOSYS)
		ksft_exit_skip("memwatch_create() is not implemented by this kernel\n");
}
#endif

#endif /* MEMWATCH_UTIL_H */
