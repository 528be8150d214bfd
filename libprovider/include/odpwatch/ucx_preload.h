/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * memwatch for an unmodified UCX: libodpwatch-ucx-preload.so (LD_PRELOAD).
 *
 * UCX's registration cache (ucs_rcache, UCP's memory handles) learns of
 * unmaps only through its ucm hooks on the C library: a raw system call,
 * madvise() through process_madvise() or io_uring, leaves a registration
 * of the old pages in the cache. The preload closes that gap with UCX's
 * public API alone:
 *  - each pinned registration UCX makes (ibv_reg_mr*) gets a memwatch
 *    watch, added before the pages are pinned and removed after the
 *    deregistration; registrations on demand (ODP) need none;
 *  - before each UCP call that may look up the cache for a user buffer
 *    (tag, stream, active-message, RMA operations and ucp_mem_map), the
 *    calling thread loads memwatch's seq; only when it moved does it read
 *    the events and pass each changed watch's range to UCX as an unmap
 *    (ucm_vm_munmap()), which UCX's cache handles before its next lookup.
 * The kernel moves seq before munmap() returns, so a thread that sends from
 * a buffer after it (or another thread) unmapped and remapped the address
 * always finds the range invalidated first: no window. A watch the kernel
 * refuses (a limit) invalidates its range at the next UCP call of any
 * thread, so that registration serves until then. In a child of fork() the
 * preload starts afresh with a descriptor of the child's own.
 *
 * ODPWATCH_UCX=0 turns the preload off; ODPWATCH_UCX_DEBUG=1 prints its
 * counters on stderr at exit; ODPWATCH_UCX_QUEUE=N sizes memwatch's event
 * queue (N records; an overflow costs a scan of every watch's word).
 */
#ifndef ODPWATCH_UCX_PRELOAD_H
#define ODPWATCH_UCX_PRELOAD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct odpwatch_ucx_stats {
	uint64_t registrations; /* pinned registrations made (ibv_reg_mr*) */
	uint64_t on_demand;	/* registrations on demand: not watched */
	uint64_t watched;	/* pinned registrations watched */
	uint64_t unwatched;	/* watches refused: used for one call */
	uint64_t deregistrations;
	uint64_t drains;	/* calls that found seq moved and read events */
	uint64_t invalidations; /* ranges passed to UCX as unmapped */
	uint64_t overflows;	/* event queue overflows, recovered by a scan */
	uint64_t reserved[8];
};

/*
 * The preload's counters in this process (all 0 before its first
 * registration): 0, or -ENOENT when it is off (ODPWATCH_UCX=0).
 */
__attribute__((visibility("default"))) int
odpwatch_ucx_preload_stats(struct odpwatch_ucx_stats *stats);

/*
 * Hands UCX the ranges that changed since the last call, now: what the
 * preload does before each UCP call it interposes.
 */
__attribute__((visibility("default"))) void odpwatch_ucx_preload_sync(void);

#ifdef __cplusplus
}
#endif

#endif /* ODPWATCH_UCX_PRELOAD_H */
