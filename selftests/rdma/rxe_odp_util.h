/* SPDX-License-Identifier: GPL-2.0 */
/* Helpers shared by the rxe On-Demand Paging tests. */
#ifndef RXE_ODP_UTIL_H
#define RXE_ODP_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_cmds.h>

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

/*
 * The raw ADVISE_MR ioctl over @n SGEs (struct ibv_sge has the layout of
 * struct ib_uverbs_sge); returns 0 or an errno.
 */
static inline int advise_mr_sges(struct ibv_pd *pd, uint32_t advice,
				 uint32_t flags, const struct ibv_sge *sges,
				 unsigned int n)
{
	struct {
		struct ib_uverbs_ioctl_hdr hdr;
		struct ib_uverbs_attr attrs[4];
	} cmd = {
		.hdr = {
			.length = sizeof(cmd),
			.object_id = UVERBS_OBJECT_MR,
			.method_id = UVERBS_METHOD_ADVISE_MR,
			.num_attrs = 4,
			.driver_id = RDMA_DRIVER_RXE,	/* checked by the core */
		},
		.attrs = {
			{ .attr_id = UVERBS_ATTR_ADVISE_MR_PD_HANDLE,
			  .flags = UVERBS_ATTR_F_MANDATORY,
			  .data = pd->handle },
			{ .attr_id = UVERBS_ATTR_ADVISE_MR_ADVICE,
			  .len = sizeof(uint64_t),	/* an enum: always u64 */
			  .flags = UVERBS_ATTR_F_MANDATORY, .data = advice },
			{ .attr_id = UVERBS_ATTR_ADVISE_MR_FLAGS,
			  .len = sizeof(uint32_t),
			  .flags = UVERBS_ATTR_F_MANDATORY, .data = flags },
			{ .attr_id = UVERBS_ATTR_ADVISE_MR_SGE_LIST,
			  .len = n * sizeof(*sges),
			  .flags = UVERBS_ATTR_F_MANDATORY,
			  .data = (uintptr_t)sges },
		},
	};

	return ioctl(pd->context->cmd_fd, RDMA_VERBS_IOCTL, &cmd) ? errno : 0;
}

/* ADVISE_MR of one range; returns 0 or an errno. */
static inline int advise_mr(struct ibv_pd *pd, uint32_t advice, uint32_t flags,
			    uint64_t addr, uint32_t length, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	return advise_mr_sges(pd, advice, flags, &sge, 1);
}

/* A port hw counter; the core caches them for 10 ms: wait that out first. */
static inline uint64_t hw_counter(const char *name)
{
	const char *dev = rdma_dev_name();
	unsigned long long v = 0;
	char path[256];
	FILE *f;

	usleep(20 * 1000);
	snprintf(path, sizeof(path),
		 "/sys/class/infiniband/%s/ports/1/hw_counters/%s", dev, name);
	f = fopen(path, "r");
	if (!f)
		return UINT64_MAX;
	if (fscanf(f, "%llu", &v) != 1)
		v = UINT64_MAX;
	fclose(f);
	return v;
}

#endif /* RXE_ODP_UTIL_H */
