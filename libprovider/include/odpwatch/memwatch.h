/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * memwatch for registration caches, the C ABI of libodpwatch: learn with one
 * memory load that the mapping behind a cached registration has changed.
 * The kernel bumps a watched range's generation word before munmap(),
 * madvise() or mremap() returns, and queues an event saying which sub-range
 * changed and why. See odpwatch_memwatch_create(3).
 *
 * Self-contained: needs neither <infiniband/verbs.h> nor the kernel's
 * <linux/memwatch.h>. Functions return 0 (or a count) or a negative errno.
 */
#ifndef ODPWATCH_MEMWATCH_H
#define ODPWATCH_MEMWATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ODPWATCH_API
#define ODPWATCH_API __attribute__((visibility("default")))
#endif

/* Why a range changed: one bit each, as the kernel reports them. */
enum odpwatch_memwatch_reason {
	ODPWATCH_MEMWATCH_UNMAP = 1 << 0,	    /* munmap, mremap, MAP_FIXED, brk */
	ODPWATCH_MEMWATCH_CLEAR = 1 << 1,	    /* pages zapped or replaced */
	ODPWATCH_MEMWATCH_PROTECTION = 1 << 2,	    /* mprotect(), NUMA hinting */
	ODPWATCH_MEMWATCH_PROTECTION_PAGE = 1 << 3, /* write-protected: fork's COW */
	ODPWATCH_MEMWATCH_SOFT_DIRTY = 1 << 4,	    /* soft-dirty tracking reset */
	ODPWATCH_MEMWATCH_RELEASE = 1 << 5,	    /* the address space is gone */
	ODPWATCH_MEMWATCH_MIGRATE = 1 << 6,	    /* moved to device-private memory */
	ODPWATCH_MEMWATCH_EXCLUSIVE = 1 << 7,	    /* made device-exclusive */
};

/* What changes the pages behind an address; used for reasons 0. */
#define ODPWATCH_MEMWATCH_DEFAULT_REASONS                                                          \
	(ODPWATCH_MEMWATCH_UNMAP | ODPWATCH_MEMWATCH_CLEAR | ODPWATCH_MEMWATCH_RELEASE |           \
	 ODPWATCH_MEMWATCH_MIGRATE)

/* odpwatch_memwatch_create() flags */
#define ODPWATCH_MEMWATCH_NONBLOCK (1U << 0) /* reads return 0 events instead of waiting */

struct odpwatch_memwatch;

/* A watched range, filled in by odpwatch_memwatch_add(). */
struct odpwatch_memwatch_range {
	/* the range's word in the shared area, until the range is removed */
	const uint64_t *gen_word;
	uint64_t generation; /* its value while the range is valid */
	uint32_t id;
	uint32_t reserved;
	uint64_t start; /* the watched pages: [start, end) */
	uint64_t end;
};

/* odpwatch_memwatch_event flags */
#define ODPWATCH_MEMWATCH_EVENT_COALESCED (1U << 0) /* several changes merged */

struct odpwatch_memwatch_event {
	uint64_t cookie; /* as given to odpwatch_memwatch_add() */
	uint64_t start;	 /* changed pages [start, end), inside the range */
	uint64_t end;
	uint32_t id;	  /* the range's id */
	uint32_t reasons; /* enum odpwatch_memwatch_reason bits */
	uint32_t flags;
	uint32_t reserved;
};

struct odpwatch_memwatch_stats {
	uint64_t watches;	   /* ranges watched now */
	uint64_t invalidations;	   /* kernel invalidations that hit a range */
	uint64_t changes;	   /* of those, with a watched reason */
	uint64_t events_queued;	   /* records queued */
	uint64_t events_coalesced; /* changes merged into a queued record */
	uint64_t events_read;
	uint64_t events_dropped; /* lost to a full queue */
	uint32_t queue_size;
	uint32_t queue_used;
	uint32_t overflow; /* events were dropped: check every range */
	uint32_t reserved;
};

/*
 * A memwatch of the calling process's address space. @flags:
 * ODPWATCH_MEMWATCH_NONBLOCK or 0; @queue_size: events the kernel queue
 * holds, 0 for its default. -EOPNOTSUPP on a kernel without memwatch.
 */
ODPWATCH_API int odpwatch_memwatch_create(uint32_t flags, uint32_t queue_size,
					  struct odpwatch_memwatch **mw);
ODPWATCH_API int odpwatch_memwatch_destroy(struct odpwatch_memwatch *mw);
/* The descriptor to poll for events: readable when one is queued. */
ODPWATCH_API int odpwatch_memwatch_fd(const struct odpwatch_memwatch *mw);

/*
 * Watch the pages holding [addr, addr + length) for @reasons (0: the
 * default ones); @cookie comes back in its events.
 */
ODPWATCH_API int odpwatch_memwatch_add(struct odpwatch_memwatch *mw, const void *addr,
				       size_t length, uint64_t cookie, uint32_t reasons,
				       struct odpwatch_memwatch_range *range);
ODPWATCH_API int odpwatch_memwatch_remove(struct odpwatch_memwatch *mw,
					  const struct odpwatch_memwatch_range *range);

/*
 * True while nothing has changed the range's mapping: one acquire load, so
 * that whatever made the range valid is visible to the caller.
 */
static inline bool odpwatch_memwatch_is_valid(const struct odpwatch_memwatch_range *range)
{
	return __atomic_load_n(range->gen_word, __ATOMIC_ACQUIRE) == range->generation;
}

/* Up to @max_events queued events: how many (0 if none, non-blocking). */
ODPWATCH_API ssize_t odpwatch_memwatch_read_events(struct odpwatch_memwatch *mw,
						   struct odpwatch_memwatch_event *events,
						   size_t max_events);
ODPWATCH_API int odpwatch_memwatch_query(struct odpwatch_memwatch *mw,
					 struct odpwatch_memwatch_stats *stats);
/* After an overflow (events dropped) the caller checked every range. */
ODPWATCH_API int odpwatch_memwatch_clear_overflow(struct odpwatch_memwatch *mw);
/*
 * Wake a thread waiting on the descriptor up to @delay_us after a change
 * instead of at once (0, the default): a burst of unmaps costs one wake-up.
 * Ranges turn invalid and events are queued at once all the same.
 * -EINVAL beyond one second, -EOPNOTSUPP on a kernel without it.
 */
ODPWATCH_API int odpwatch_memwatch_set_wake_delay(struct odpwatch_memwatch *mw, uint32_t delay_us);

#ifdef __cplusplus
}
#endif

#endif /* ODPWATCH_MEMWATCH_H */
