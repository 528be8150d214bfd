/* SPDX-License-Identifier: GPL-2.0 */
/* Helpers shared by the rxe On-Demand Paging tests. */
#ifndef RXE_ODP_UTIL_H
#define RXE_ODP_UTIL_H

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

/* The device under test: $RDMA_DEV, default rxe0. */
static inline const char *rdma_dev_name(void)
{
	return getenv("RDMA_DEV") ? getenv("RDMA_DEV") : "rxe0";
}

/* Open a device by name; NULL if there is none. */
static inline struct ibv_context *open_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	for (i = 0; list && list[i] && !ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return ctx;
}

/* Anonymous private read-write memory, never touched; NULL on failure. */
static inline void *map_anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

#endif /* RXE_ODP_UTIL_H */
