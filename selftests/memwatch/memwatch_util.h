/* SPDX-License-Identifier: GPL-2.0 */
/* Shared by the memwatch selftests. */
#ifndef MEMWATCH_UTIL_H
#define MEMWATCH_UTIL_H

#include <sys/syscall.h>
#include <unistd.h>

/* Until the C library's headers know the system call. */
#ifndef __NR_memwatch_create
#define __NR_memwatch_create 473
#endif

static inline int memwatch_create(unsigned int flags)
{
	return syscall(__NR_memwatch_create, flags);
}

#endif /* MEMWATCH_UTIL_H */
