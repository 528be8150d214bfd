/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * memwatch as libfabric's memory monitor, through libfabric's public import
 * API (fi_open("mr_cache") + fi_import_fid, rdma/fi_ext.h): libodpwatch-ofi.
 *
 * libfabric's MR cache asks its monitor to subscribe each cached region,
 * asks valid() on every cache hit, and flushes the regions the monitor
 * notifies. This monitor watches each region with memwatch: valid() is one
 * load of the region's generation word, which the kernel changes before
 * munmap(), madvise() or mremap() returns, however they were called (libc
 * or a raw system call); a thread reads memwatch's events and notifies
 * libfabric of the changed ranges, so their registrations are released.
 *
 * Import before the first libfabric domain is opened: the providers take
 * the monitor at domain open. libodpwatch-ofi-preload.so does it in its
 * constructor (LD_PRELOAD; ODPWATCH_OFI_MONITOR=0 turns it off).
 *
 * Functions return 0 or a negative errno value.
 */
#ifndef ODPWATCH_OFI_MONITOR_H
#define ODPWATCH_OFI_MONITOR_H

#include <stdint.h>

#include <odpwatch/odpwatch.h>

#ifdef __cplusplus
extern "C" {
#endif

struct odpwatch_ofi_stats {
	uint64_t regions;    /* regions watched now */
	uint64_t subscribes; /* regions libfabric asked to watch */
	uint64_t unsubscribes;
	uint64_t hits;	   /* valid() true: the region's pages are unchanged */
	uint64_t stale;	   /* valid() false: they changed */
	uint64_t notifies; /* changed ranges passed to libfabric */
	uint64_t events;   /* memwatch events read */
	uint64_t rescans;  /* event queue overflows, recovered by a scan */
	uint64_t refused;  /* subscribes refused (memwatch error, child of fork) */
	uint64_t reserved[7];
};

/*
 * Makes the memwatch monitor libfabric's default monitor of host memory.
 * -EOPNOTSUPP: the kernel has no memwatch; -EBUSY: a monitor was imported
 * already (Open MPI imports its own) or the default one is in use; -EALREADY:
 * this one is imported; other errors from fi_open().
 */
ODPWATCH_API int odpwatch_ofi_monitor_import(void);
/* Gives the import back to libfabric; -EBUSY while a domain's cache uses it. */
ODPWATCH_API int odpwatch_ofi_monitor_close(void);
ODPWATCH_API int odpwatch_ofi_monitor_stats(struct odpwatch_ofi_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* ODPWATCH_OFI_MONITOR_H */
