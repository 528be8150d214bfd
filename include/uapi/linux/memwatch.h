/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * memwatch: learn, with one memory load and before munmap() returns, that
 * the mapping of a watched virtual range has changed.
 *
 * memwatch_create(flags) returns a file descriptor. Watches are added and
 * removed with ioctls; mmap() of the descriptor gives a read-only area with
 * a header and one generation word per watch slot. A watch's word changes
 * inside the kernel's mmu notifier, before the system call that changed the
 * mapping returns, so a registration cache checks validity with one acquire
 * load and a compare. read() returns struct memwatch_event records saying
 * which sub-range changed and why; poll()/epoll report them.
 *
 * The protocol of a registration cache: ADD, then register (pin); use the
 * registration while words[id] equals the generation ADD returned (never
 * one read from the word); when it moves, deregister, REMOVE and ADD again;
 * after an overflow, MEMWATCH_IOC_CLEAR_OVERFLOW first, then rescan.
 *
 * See Documentation/userspace-api/memwatch.rst.
 */
#ifndef _UAPI_LINUX_MEMWATCH_H
#define _UAPI_LINUX_MEMWATCH_H

#include <linux/ioctl.h>
#include <linux/types.h>

/*
 * The layout of struct memwatch_header. It stays 1: what a kernel adds is
 * announced in memwatch_header.features (and a longer header by its
 * header_size), never by a new version.
 */
#define MEMWATCH_ABI_VERSION	1

/*
 * memwatch_header.features: what this kernel offers beyond ADD, REMOVE,
 * STATS and CLEAR_OVERFLOW. Test a bit before relying on what it names;
 * bits not defined here are 0.
 */
#define MEMWATCH_FEATURE_SET_QUEUE	(1ULL << 0) /* MEMWATCH_IOC_SET_QUEUE */
#define MEMWATCH_FEATURE_SET_WAKE	(1ULL << 1) /* MEMWATCH_IOC_SET_WAKE */

/*
 * memwatch_create() flags. O_CLOEXEC and O_NONBLOCK come from <fcntl.h>
 * (not included here: <linux/fcntl.h> clashes with the C library's).
 */
#define MEMWATCH_CLOEXEC	O_CLOEXEC
#define MEMWATCH_NONBLOCK	O_NONBLOCK

/*
 * Reasons, one bit each: a watch's event mask selects which reasons bump its
 * generation word and queue an event; an event carries the reasons it merges.
 * The contract is the default mask's: the word changes whenever the pages
 * backing the range may have changed. Reasons are hints whose causes may
 * widen from one kernel to the next (see memwatch.rst).
 */
#define MEMWATCH_UNMAP		(1U << 0) /* munmap, mremap, MAP_FIXED, shmdt, brk */
#define MEMWATCH_CLEAR		(1U << 1) /* pages zapped or replaced (madvise, truncate, COW) */
#define MEMWATCH_PROTECTION	(1U << 2) /* mprotect(), NUMA hinting, uffd-wp */
#define MEMWATCH_PROTECTION_PAGE (1U << 3) /* pages write-protected: fork's COW, write-back */
#define MEMWATCH_SOFT_DIRTY	(1U << 4) /* soft-dirty tracking reset */
#define MEMWATCH_RELEASE	(1U << 5) /* the address space is gone (exit) */
#define MEMWATCH_MIGRATE	(1U << 6) /* migration to device-private memory */
#define MEMWATCH_EXCLUSIVE	(1U << 7) /* conversion to device-exclusive entries */
#define MEMWATCH_ALL_REASONS	0xffU

/*
 * What changes which page backs an address; used when a watch's mask is 0.
 * MIGRATE moves an unpinned page to device-private memory and back (HMM,
 * SVM), each time to another page; a pinned page stays, though a range
 * migrated around it reports MIGRATE too.
 */
#define MEMWATCH_DEFAULT_MASK	(MEMWATCH_UNMAP | MEMWATCH_CLEAR | MEMWATCH_RELEASE | \
				 MEMWATCH_MIGRATE)

/* struct memwatch_event flags */
#define MEMWATCH_EVENT_COALESCED (1U << 0) /* more than one change merged here */

/* One record of read(): the changed sub-range, clipped to the watch. */
struct memwatch_event {
	__u64 cookie;		/* the watch's cookie */
	__u64 start;		/* changed range [start, end) */
	__u64 end;
	__u32 id;		/* the watch's id (its slot) */
	__u32 reasons;		/* MEMWATCH_* reasons merged in this record */
	__u32 flags;		/* MEMWATCH_EVENT_* */
	__u32 reserved;
};

/* MEMWATCH_IOC_ADD: watch [addr, addr + len). */
struct memwatch_add {
	__u64 addr;		/* in: page aligned */
	__u64 len;		/* in: non-zero, page aligned */
	__u64 cookie;		/* in: returned in events */
	__u32 mask;		/* in: reasons to report, 0 for MEMWATCH_DEFAULT_MASK */
	__u32 flags;		/* in: must be 0 */
	__u64 generation;	/* out: the slot's generation word at add time */
	__u32 id;		/* out: watch id, the index of its generation word */
	__u32 reserved;		/* must be 0 */
};

/* MEMWATCH_IOC_REMOVE */
struct memwatch_remove {
	__u32 id;
	__u32 flags;		/* must be 0 */
};

/* MEMWATCH_IOC_STATS */
struct memwatch_stats {
	__u64 watches;		/* active watches */
	__u64 invalidations;	/* notifier calls that hit a watch */
	__u64 changes;		/* of those, reasons in the watch's mask */
	__u64 events_queued;	/* records queued (coalesced ones count once) */
	__u64 events_coalesced;	/* changes merged into a queued record */
	__u64 events_read;
	__u64 events_dropped;	/* lost to a full queue */
	__u32 queue_size;	/* capacity of the event queue, in records */
	__u32 queue_used;
	__u64 events_lost;	/* taken by a read() that could not copy them out */
	__u64 wakeups;		/* wake-ups of waiters for records */
	__u64 reserved[2];
};

/* MEMWATCH_IOC_SET_QUEUE: resize the event queue (empty queue only). */
struct memwatch_queue {
	__u32 size;		/* records, 1 .. MEMWATCH_QUEUE_MAX */
	__u32 flags;		/* must be 0 */
};

#define MEMWATCH_QUEUE_DEFAULT	4096
#define MEMWATCH_QUEUE_MAX	(1U << 16)

/*
 * MEMWATCH_IOC_SET_WAKE: how soon a record wakes a waiter. With delay_us 0
 * (the default) every change that queues or merges a record wakes the
 * waiters at once. Otherwise the first change that finds a waiter arms a
 * wake-up delay_us later, and the changes until it fires wake nobody: a burst
 * of unmaps costs one wake-up. A queue half full wakes at once. The words,
 * seq and the record change before the unmap returns, as always, and poll()
 * and read() see the record; epoll and io_uring report it only when the
 * wake-up comes. A wake-up armed before a shorter delay is set keeps its time.
 */
struct memwatch_wake {
	__u32 delay_us;		/* 0 .. MEMWATCH_WAKE_DELAY_MAX_US */
	__u32 flags;		/* must be 0 */
};

#define MEMWATCH_WAKE_DELAY_MAX_US	1000000

/*
 * The mmap()ed state area, read-only: this header, then at slots_offset one
 * __u64 generation word per watch id. A watch is valid while its word equals
 * the generation returned by MEMWATCH_IOC_ADD. Load the word (and seq,
 * overflow) with acquire semantics; the kernel stores the word before seq
 * and overflow, with release semantics. A 32-bit kernel changes only the low
 * 32 bits of a word or of seq: the upper half stays 0.
 *
 * A 32-bit process, on any kernel, loads the low 32 bits of a word (or of
 * seq) with a 32-bit load and compares them with the low 32 bits of its
 * generation: a 64-bit atomic load of a read-only page may be a
 * compare-and-swap, which faults, or a lock. The low half repeats after
 * 2^32 changes of one watch. overflow_count and active_watches are
 * informational and may tear on a 32-bit reader.
 */
struct memwatch_header {
	__u32 abi_version;	/* MEMWATCH_ABI_VERSION */
	__u32 header_size;	/* sizeof(struct memwatch_header) */
	__u64 seq;		/* bumped on every change reported to any watch */
	__u32 overflow;		/* non-zero: events were dropped; clear, then rescan */
	__u32 reserved0;
	__u64 overflow_count;	/* events dropped since creation */
	__u64 active_watches;
	__u64 slots_offset;	/* byte offset of the generation words */
	__u64 max_slots;	/* generation words the area can hold */
	__u64 features;		/* MEMWATCH_FEATURE_* */
	__u64 reserved;
};

#define MEMWATCH_IOC_MAGIC	0xB9
#define MEMWATCH_IOC_ADD	_IOWR(MEMWATCH_IOC_MAGIC, 0, struct memwatch_add)
#define MEMWATCH_IOC_REMOVE	_IOW(MEMWATCH_IOC_MAGIC, 1, struct memwatch_remove)
#define MEMWATCH_IOC_STATS	_IOR(MEMWATCH_IOC_MAGIC, 2, struct memwatch_stats)
#define MEMWATCH_IOC_SET_QUEUE	_IOW(MEMWATCH_IOC_MAGIC, 3, struct memwatch_queue)
#define MEMWATCH_IOC_CLEAR_OVERFLOW _IO(MEMWATCH_IOC_MAGIC, 4)
#define MEMWATCH_IOC_SET_WAKE	_IOW(MEMWATCH_IOC_MAGIC, 5, struct memwatch_wake)

#endif /* _UAPI_LINUX_MEMWATCH_H */
