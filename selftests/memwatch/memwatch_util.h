/* SPDX-License-Identifier: GPL-2.0 */
/* Shared by the memwatch selftests. */
#ifndef MEMWATCH_UTIL_H
#define MEMWATCH_UTIL_H

#include <errno.h>
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
