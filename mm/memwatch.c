// SPDX-License-Identifier: GPL-2.0
/*
 * memwatch: tell user space, before munmap() returns, that the mapping of a
 * watched virtual range has changed.
 *
 * Each watch is an mmu_interval_notifier on the creator's mm. When the core
 * mm invalidates a range that overlaps a watch, the callback bumps the
 * watch's generation word in a page shared read-only with user space and
 * queues (or merges into) an event record saying which sub-range changed and
 * why. The callback runs inside the invalidation, before the system call that
 * changed the mapping returns, and never sleeps: it also serves the OOM
 * reaper's non-blockable invalidations.
 *
 * Every invalidation of the mm calls each watch that overlaps it, in the
 * context of whoever invalidates: kswapd, another process's reclaim,
 * compaction, the OOM reaper. So the watches of all descriptors of an mm
 * are kept in one interval tree as well, and ADD refuses a range that
 * vm.memwatch_max_overlap of them already overlap: no address of the mm is
 * under more watches than that, however many the process holds.
 *
 * Locking: ctx->lock (mutex) serialises lookups and reservations in the
 * descriptor's id map (an xarray, with a lock of its own), queue resize and
 * reads. ADD and REMOVE drop it before they wait for the mm
 * (mmu_interval_read_begin(), the notifier's removal) or copy to the user,
 * so a read() does not wait behind them; the first ADD of a process holds
 * it while it registers the mm's notifier (mm_take_all_locks()).
 * ctx->qlock (spinlock) protects the event ring, the statistics and the
 * generation words, and is the only lock the notifier callback takes.
 * memwatch_mm.lock, taken inside ctx->lock, protects the mm's tree.
 * ctx->pages_lock, taken inside ctx->lock and by the state area's fault
 * handler (inside the mmap lock), orders mapping a page of words against
 * taking it away (before i_mmap_rwsem, in unmap_mapping_range()).
 *
 * See Documentation/userspace-api/memwatch.rst.
 */
#include <linux/anon_inodes.h>
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/hashtable.h>
#include <linux/hrtimer.h>
#include <linux/interval_tree_generic.h>
#include <linux/math64.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/poll.h>
#include <linux/sched/mm.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/syscalls.h>
#include <linux/sysctl.h>
#include <linux/uaccess.h>
#include <linux/user_namespace.h>
#include <linux/vmalloc.h>
#include <linux/xarray.h>
#include <linux/memwatch.h>

/* Generation words per page of the state area; page 0 is the header. */
#define MEMWATCH_SLOTS_PER_PAGE	(PAGE_SIZE / sizeof(u64))
/* Watch ids per descriptor: enough for 4M watches, 32 MiB of words. */
#define MEMWATCH_MAX_SLOTS	BIT(22)
/* Records handed to user space per copy in read(). */
#define MEMWATCH_READ_BATCH	64
/*
 * Defaults of /proc/sys/user/max_memwatch_{watches,descriptors}: a pinned
 * registration cache needs one watch per cached registration (tens of
 * thousands in MPI runs); 1M watches is ~160 MiB of kernel memory, charged
 * to the memory cgroup (more if their ids are spread thin over the pages of
 * words: at worst a page per watch, see memwatch_slot_put()). Descriptors
 * bound the event rings: 128 of the largest (MEMWATCH_QUEUE_MAX records,
 * 2.5 MiB) is 320 MiB at most.
 */
#define MEMWATCH_USER_WATCHES	BIT(20)
#define MEMWATCH_USER_DESCRIPTORS 128
/*
 * Default of vm.memwatch_max_overlap. A registration cache's watches rarely
 * overlap: a few libraries' caches over one hot buffer, or small buffers
 * sharing a page. The bound is what one invalidation of a page may cost
 * others: 32 callbacks of a few stores each; reclaim of a region under 32
 * watches costs about 3 times as much, under 256 about 18 times.
 */
#define MEMWATCH_MAX_OVERLAP	32

/*
 * The watches of every descriptor of one mm, found by the mm: ADD counts
 * the watches a new range overlaps here.
 */
struct memwatch_mm {
	struct hlist_node link;		/* in memwatch_mms */
	struct mm_struct *mm;
	unsigned int descriptors;	/* under memwatch_mms_lock */
	struct mutex lock;		/* watches */
	struct rb_root_cached watches;
};

static DEFINE_HASHTABLE(memwatch_mms, 6);
/* Mapped where a freed page of words was (memwatch_fault()): all ones. */
static struct page *memwatch_dead_page __ro_after_init;
static DEFINE_MUTEX(memwatch_mms_lock);

struct memwatch_ctx {
	struct mm_struct *mm;		/* watched mm, held with mmgrab() */
	struct memwatch_mm *mmw;	/* its watches, all descriptors' */
	struct ucounts *ucounts;	/* per-user limits; holds one descriptor */
	struct mutex lock;
	spinlock_t qlock;		/* ring, stats, words; notifier-safe */
	struct xarray watches;		/* id -> struct memwatch_watch */
	struct xarray pages;		/* state area page index -> page */
	/*
	 * Taken by the fault handler around finding a page and mapping it,
	 * and by memwatch_slot_put() around taking a page away from the
	 * area: no mapping of a page can be made after it left.
	 */
	struct mutex pages_lock;
	struct address_space *mapping;	/* the state area's, once mapped */
	/* Under lock and pages_lock: the highest page of words ever made. */
	unsigned long top_index;
	/* Under lock: a new word page's words start here, past every freed one's. */
	u64 gen_floor;
	unsigned long spare;		/* under lock: an empty page kept, or 0 */
	struct memwatch_header *hdr;	/* page 0 */
	struct memwatch_event *ring;
	u32 qsize;
	u32 qlive;			/* unread records not discarded by REMOVE */
	u64 released;			/* watches that had the mm's RELEASE */
	u64 qhead;			/* next record to read */
	u64 qtail;			/* next record to write */
	wait_queue_head_t wqh;
	struct memwatch_stats stats;	/* under qlock; watches, queue_* filled on read */
	/* MEMWATCH_IOC_SET_WAKE: a wake-up put off to gather a burst. */
	struct hrtimer wake_timer;
	u64 wake_delay_ns;
	unsigned long wake_armed;	/* bit 0: wake_timer is set to fire */
	atomic64_t wakeups;
};

/*
 * 144 bytes: with the id map (~9 bytes a watch) a watch costs less than 160
 * bytes plus its generation word, which is found, not stored.
 */
struct memwatch_watch {
	struct mmu_interval_notifier notifier;
	/* In ctx->mmw->watches; the range is the notifier's. */
	struct rb_node mm_rb;
	unsigned long subtree_last;
	struct memwatch_ctx *ctx;
	u64 cookie;
	u32 queued;			/* 1 + ring index of its last record, or 0 */
	u32 id : 24;			/* < MEMWATCH_MAX_SLOTS */
	u32 mask : 8;			/* MEMWATCH_* reasons */
};

static struct kmem_cache *memwatch_watch_cache;

#define memwatch_start(w)	((w)->notifier.interval_tree.start)
#define memwatch_last(w)	((w)->notifier.interval_tree.last)
INTERVAL_TREE_DEFINE(struct memwatch_watch, mm_rb, unsigned long, subtree_last,
		     memwatch_start, memwatch_last, static, memwatch_tree);

/*
 * vm.unprivileged_memwatch: whether a process without CAP_IPC_LOCK may
 * create a descriptor. The first watch of a process registers its mm's
 * notifier, which takes every lock of the mm (mm_take_all_locks(): each
 * VMA, each mapped file's i_mmap_rwsem, each anon_vma), as the first ODP
 * MR or KVM VM does behind their device nodes; an administrator may keep
 * that from untrusted users. CAP_IPC_LOCK, because the users memwatch
 * serves (RDMA registration caches) are those that pin memory.
 */
static int sysctl_unprivileged_memwatch __read_mostly = 1;
/* vm.memwatch_max_overlap: see the top of this file. */
static int sysctl_memwatch_max_overlap __read_mostly = MEMWATCH_MAX_OVERLAP;

static const struct ctl_table memwatch_sysctls[] = {
	{
		.procname	= "unprivileged_memwatch",
		.data		= &sysctl_unprivileged_memwatch,
		.maxlen		= sizeof(sysctl_unprivileged_memwatch),
		.mode		= 0644,
		.proc_handler	= proc_dointvec_minmax,
		.extra1		= SYSCTL_ZERO,
		.extra2		= SYSCTL_ONE,
	},
	{
		.procname	= "memwatch_max_overlap",
		.data		= &sysctl_memwatch_max_overlap,
		.maxlen		= sizeof(sysctl_memwatch_max_overlap),
		.mode		= 0644,
		.proc_handler	= proc_dointvec_minmax,
		.extra1		= SYSCTL_ONE,
		.extra2		= SYSCTL_INT_MAX,
	},
};

/* The watches of @mm, shared by its descriptors; NULL without memory. */
static struct memwatch_mm *memwatch_mm_get(struct mm_struct *mm)
{
	struct memwatch_mm *mmw;

	mutex_lock(&memwatch_mms_lock);
	hash_for_each_possible(memwatch_mms, mmw, link, (unsigned long)mm)
		if (mmw->mm == mm)
			goto found;
	mmw = kzalloc_obj(*mmw, GFP_KERNEL_ACCOUNT);
	if (!mmw)
		goto out;
	mmw->mm = mm;
	mutex_init(&mmw->lock);
	mmw->watches = RB_ROOT_CACHED;
	hash_add(memwatch_mms, &mmw->link, (unsigned long)mm);
found:
	mmw->descriptors++;
out:
	mutex_unlock(&memwatch_mms_lock);
	return mmw;
}

/*
 * After the descriptor's last watch is gone. The descriptor holds its mm
 * with mmgrab() until after this, so no other mm can take the key.
 */
static void memwatch_mm_put(struct memwatch_mm *mmw)
{
	mutex_lock(&memwatch_mms_lock);
	if (!--mmw->descriptors) {
		hash_del(&mmw->link);
		kfree(mmw);
	}
	mutex_unlock(&memwatch_mms_lock);
}

/* How many of the mm's watches overlap [@start, @last], up to @max. */
static int memwatch_overlaps(struct memwatch_mm *mmw, unsigned long start,
			     unsigned long last, int max)
{
	struct memwatch_watch *w;
	int n = 0;

	lockdep_assert_held(&mmw->lock);
	for (w = memwatch_tree_iter_first(&mmw->watches, start, last);
	     w && n < max; w = memwatch_tree_iter_next(w, start, last))
		n++;
	return n;
}

static u32 memwatch_reason(enum mmu_notifier_event event)
{
	switch (event) {
	case MMU_NOTIFY_UNMAP:
		return MEMWATCH_UNMAP;
	case MMU_NOTIFY_CLEAR:
		return MEMWATCH_CLEAR;
	case MMU_NOTIFY_PROTECTION_VMA:
		return MEMWATCH_PROTECTION;
	case MMU_NOTIFY_PROTECTION_PAGE:
		return MEMWATCH_PROTECTION_PAGE;
	case MMU_NOTIFY_SOFT_DIRTY:
		return MEMWATCH_SOFT_DIRTY;
	case MMU_NOTIFY_RELEASE:
		return MEMWATCH_RELEASE;
	case MMU_NOTIFY_MIGRATE:
		return MEMWATCH_MIGRATE;
	case MMU_NOTIFY_EXCLUSIVE:
		return MEMWATCH_EXCLUSIVE;
	}
	/* An event this code does not know yet: report it as a clear. */
	return MEMWATCH_CLEAR;
}

/*
 * The part of a __u64 counter of the state area (a generation word, seq)
 * that the kernel changes: all of it on 64-bit kernels; the low-order 32
 * bits on 32-bit ones, which cannot store 64 bits at once (the upper half
 * stays 0). Either way user space reads it with one load, never torn.
 */
static unsigned long *memwatch_word(u64 *counter)
{
	unsigned long *word = (unsigned long *)counter;

#ifdef __BIG_ENDIAN
	word += sizeof(u64) / sizeof(long) - 1;
#endif
	return word;
}

/*
 * Count a change. The release store pairs with the acquire load of the
 * reader: a thread that sees the new value also sees what preceded it.
 */
static void memwatch_bump(u64 *counter)
{
	unsigned long *word = memwatch_word(counter);

	/* Release: pairs with the reader's acquire load of this word. */
	smp_store_release(word, READ_ONCE(*word) + 1);
}

/* The state area's page holding the generation word of id @id. */
static unsigned long memwatch_page_index(u32 id)
{
	return 1 + id / MEMWATCH_SLOTS_PER_PAGE;
}

/*
 * The generation word of watch @id. Its page exists while the id is taken
 * (memwatch_slot_put()); xa_load() is RCU-safe in the notifier.
 */
static u64 *memwatch_gen(struct memwatch_ctx *ctx, u32 id)
{
	struct page *page = xa_load(&ctx->pages, memwatch_page_index(id));

	return (u64 *)page_address(page) + id % MEMWATCH_SLOTS_PER_PAGE;
}

static u64 memwatch_read_gen(u64 *gen)
{
	return READ_ONCE(*memwatch_word(gen));
}

/* The ring slot of queue position @pos (div_u64_rem: 32-bit arches too). */
static struct memwatch_event *memwatch_ring(struct memwatch_ctx *ctx, u64 pos)
{
	u32 index;

	div_u64_rem(pos, ctx->qsize, &index);
	return &ctx->ring[index];
}

/*
 * @w's record that user space has not read yet, or NULL. w->queued names a
 * ring slot, not a position: the slot still holds w's record if it lies
 * between head and tail and carries w's id (a watch has at most one unread
 * record, and a slot is reused only for a later record).
 */
static struct memwatch_event *memwatch_unread(struct memwatch_ctx *ctx,
					      struct memwatch_watch *w)
{
	u32 slot = w->queued - 1, head;

	if (!w->queued || slot >= ctx->qsize)
		return NULL;	/* none, or queued before a resize */
	div_u64_rem(ctx->qhead, ctx->qsize, &head);
	if ((slot + ctx->qsize - head) % ctx->qsize >= ctx->qtail - ctx->qhead)
		return NULL;
	return ctx->ring[slot].id == w->id ? &ctx->ring[slot] : NULL;
}

/*
 * Consume the records of removed watches at the head of the queue, so that
 * a queue without a live record is empty: it then has room, and poll() and
 * SET_QUEUE see it as it is. Under qlock.
 */
static void memwatch_skip_discarded(struct memwatch_ctx *ctx)
{
	while (ctx->qhead != ctx->qtail && !memwatch_ring(ctx, ctx->qhead)->reasons)
		ctx->qhead++;
}

/* Queue a record for @w, or merge into its unread one. Under qlock. */
static void memwatch_queue_event(struct memwatch_ctx *ctx,
				 struct memwatch_watch *w, u64 start, u64 end,
				 u32 reasons)
{
	struct memwatch_event *ev = memwatch_unread(ctx, w);
	u32 slot;

	if (ev) {
		ev->start = min(ev->start, start);
		ev->end = max(ev->end, end);
		ev->reasons |= reasons;
		ev->flags |= MEMWATCH_EVENT_COALESCED;
		ctx->stats.events_coalesced++;
		return;
	}
	if (ctx->qtail - ctx->qhead >= ctx->qsize) {
		/* Never block the unmapping thread: drop, flag, count. */
		ctx->stats.events_dropped++;
		WRITE_ONCE(ctx->hdr->overflow_count, ctx->stats.events_dropped);
		/* After the word, as seq: see memwatch_invalidate(). */
		smp_store_release(&ctx->hdr->overflow, 1);
		return;
	}
	div_u64_rem(ctx->qtail, ctx->qsize, &slot);
	ev = &ctx->ring[slot];
	*ev = (struct memwatch_event) {
		.cookie = w->cookie,
		.start = start,
		.end = end,
		.id = w->id,
		.reasons = reasons,
	};
	w->queued = slot + 1;
	ctx->qtail++;
	WRITE_ONCE(ctx->qlive, ctx->qlive + 1);
	ctx->stats.events_queued++;
}

/*
 * The waiters of a descriptor with a wake delay: the first change that finds
 * one arms the timer, later ones find it armed. The record is queued before
 * the bit is read (the full barrier of wq_has_sleeper() in our caller), and
 * the timer clears the bit before it wakes: a change that finds the bit set
 * has its record seen by the wake-up to come; one that finds it clear arms
 * the next. The plain read first spares a burst the locked operation.
 */
static void memwatch_wake_later(struct memwatch_ctx *ctx)
{
	if (!test_bit(0, &ctx->wake_armed) &&
	    !test_and_set_bit(0, &ctx->wake_armed))
		hrtimer_start(&ctx->wake_timer,
			      ns_to_ktime(READ_ONCE(ctx->wake_delay_ns)),
			      HRTIMER_MODE_REL_SOFT);
}

static enum hrtimer_restart memwatch_wake_timer(struct hrtimer *timer)
{
	struct memwatch_ctx *ctx = container_of(timer, struct memwatch_ctx,
						wake_timer);

	clear_bit(0, &ctx->wake_armed);
	smp_mb__after_atomic();	/* bit cleared, then the wake: see memwatch_wake_later() */
	atomic64_inc(&ctx->wakeups);
	/*
	 * No key: the records may have been read meanwhile, so a waiter that
	 * takes the key as the result (aio, io_uring) polls again.
	 */
	wake_up_interruptible(&ctx->wqh);
	return HRTIMER_NORESTART;
}

static bool memwatch_invalidate(struct mmu_interval_notifier *mni,
				const struct mmu_notifier_range *range,
				unsigned long cur_seq)
{
	struct memwatch_watch *w = container_of(mni, struct memwatch_watch,
						notifier);
	struct memwatch_ctx *ctx = w->ctx;
	bool exit = range->event == MMU_NOTIFY_RELEASE;
	u32 reason = memwatch_reason(range->event);
	u64 start = max(range->start, mni->interval_tree.start);
	u64 end = min(range->end, mni->interval_tree.last + 1);
	bool change, last = false, urgent = false;

	/*
	 * The end of the address space unmaps everything: a watch that asks
	 * for UNMAP but not RELEASE sees it as an unmap.
	 */
	if (exit && !(w->mask & MEMWATCH_RELEASE))
		reason = MEMWATCH_UNMAP;
	change = w->mask & reason;

	spin_lock(&ctx->qlock);
	/*
	 * Unconditionally, as the interval notifier API requires of a user
	 * of mmu_interval_read_begin(): it lets ADD's read_begin() also wait
	 * for an invalidation of the new watch that has already called us
	 * (a later one is reported by the word).
	 */
	mmu_interval_set_seq(mni, cur_seq);
	/*
	 * Once the mm's last user is gone, RELEASE (one call per watch) says
	 * all: the teardown's unmaps that follow it are not reported, so
	 * that once every watch has had its RELEASE, nothing more comes
	 * (EPOLLHUP in memwatch_poll()).
	 */
	if (!exit && !atomic_read(&ctx->mm->mm_users)) {
		spin_unlock(&ctx->qlock);
		return true;
	}
	ctx->stats.invalidations++;
	if (exit)
		last = ++ctx->released == ctx->stats.watches;
	if (change) {
		ctx->stats.changes++;
		/*
		 * The word first, then seq (and overflow), each a release
		 * store. A reader that loads seq with acquire and then the
		 * words cannot see the new seq with the old word:
		 *
		 *   here                        reader
		 *   store_release(word, g + 1)  s = load_acquire(seq)
		 *   store_release(seq, s0 + 1)  w = load(word)
		 *
		 * s == s0 + 1 implies w == g + 1, so a reader that finds seq
		 * unchanged may skip its rescan and one that finds it changed
		 * sees every word that made it change.
		 */
		memwatch_bump(memwatch_gen(ctx, w->id));
		memwatch_bump(&ctx->hdr->seq);
		memwatch_queue_event(ctx, w, start, end, reason);
		/* A reader held back by a wake delay must not lose records. */
		urgent = ctx->qtail - ctx->qhead >= ctx->qsize / 2;
	}
	spin_unlock(&ctx->qlock);
	/*
	 * Most unmaps have nobody waiting: skip the wait queue's irq-safe
	 * lock then. The last watch's RELEASE wakes a poller whether or not
	 * it queued a record: it is the end (EPOLLHUP once the queue is
	 * read). The full barrier in wq_has_sleeper() pairs with the one in
	 * memwatch_poll() and with set_current_state() in a blocking read.
	 */
	if ((change || last) && wq_has_sleeper(&ctx->wqh)) {
		/*
		 * The key is what a waiter may take as the result without
		 * polling again (io_uring, aio): a record is EPOLLIN; the end
		 * wakes with no key, so that each polls and finds EPOLLHUP.
		 */
		if (last) {
			wake_up_interruptible(&ctx->wqh);
		} else if (!urgent && READ_ONCE(ctx->wake_delay_ns)) {
			memwatch_wake_later(ctx);
		} else {
			atomic64_inc(&ctx->wakeups);
			wake_up_interruptible_poll(&ctx->wqh, EPOLLIN | EPOLLRDNORM);
		}
	}
	return true;
}

static void memwatch_destroy(struct memwatch_ctx *ctx,
			     struct memwatch_watch *w);

/* Shared by every watch; a watch finds its descriptor through w->ctx. */
static const struct mmu_interval_notifier_ops memwatch_notifier_ops = {
	.invalidate = memwatch_invalidate,
};

/*
 * Take page @index of the state area out of every mapping of it, so that
 * the next read faults (memwatch_fault()). Under ctx->pages_lock.
 */
static void memwatch_zap(struct memwatch_ctx *ctx, unsigned long index)
{
	if (ctx->mapping)
		unmap_mapping_range(ctx->mapping, (loff_t)index << PAGE_SHIFT,
				    PAGE_SIZE, 1);
}

/*
 * The generation word of the new id @id, in the page of words holding it,
 * allocated on first use; the page counts its ids in use (page_private).
 * Under ctx->lock.
 */
static u64 *memwatch_slot(struct memwatch_ctx *ctx, u32 id)
{
	unsigned long index = memwatch_page_index(id);
	struct page *page = xa_load(&ctx->pages, index);
	u64 *words;
	int i, err;

	if (!page) {
		page = alloc_page(GFP_KERNEL_ACCOUNT);
		if (!page)
			return NULL;
		words = page_address(page);
		for (i = 0; i < MEMWATCH_SLOTS_PER_PAGE; i++) {
			words[i] = 0;
			*memwatch_word(&words[i]) = ctx->gen_floor;
		}
		set_page_private(page, 0);
		mutex_lock(&ctx->pages_lock);
		err = xa_err(xa_store(&ctx->pages, index, page,
				      GFP_KERNEL_ACCOUNT));
		/* Where a freed page was, the dead page may be mapped. */
		if (!err && index <= ctx->top_index)
			memwatch_zap(ctx, index);
		if (!err)
			ctx->top_index = max(ctx->top_index, index);
		mutex_unlock(&ctx->pages_lock);
		if (err) {
			__free_page(page);
			return NULL;
		}
	}
	if (index == ctx->spare)
		ctx->spare = 0;
	set_page_private(page, page_private(page) + 1);
	return (u64 *)page_address(page) + id % MEMWATCH_SLOTS_PER_PAGE;
}

/*
 * Id @id is free again. The last id of a page of words frees the page, so
 * that adding and removing watches leaves no memory behind: it is taken
 * out of the state area first (its words then read as all ones, see
 * memwatch_fault()), and a new page there later starts its words past
 * every word this one had, so that no (id, generation) pair that user
 * space kept matches a later watch. One empty page is kept as a spare: a
 * cache whose size hovers at a multiple of 512 watches would otherwise
 * free and make the same page, and zap the mappings, again and again.
 * Only where a word is 64 bits: the floor of a 32-bit word would wrap.
 * Under ctx->lock.
 */
static void memwatch_slot_put(struct memwatch_ctx *ctx, u32 id)
{
	unsigned long index = memwatch_page_index(id);
	struct page *page = xa_load(&ctx->pages, index);
	unsigned long top = 0;
	u64 *words;
	int i;

	set_page_private(page, page_private(page) - 1);
	if (page_private(page) || !IS_ENABLED(CONFIG_64BIT))
		return;
	if (!ctx->spare) {
		ctx->spare = index;
		return;
	}
	mutex_lock(&ctx->pages_lock);
	xa_erase(&ctx->pages, index);
	memwatch_zap(ctx, index);
	mutex_unlock(&ctx->pages_lock);
	/* No watch of the page is left to bump a word: they are final. */
	words = page_address(page);
	for (i = 0; i < MEMWATCH_SLOTS_PER_PAGE; i++)
		top = max(top, *memwatch_word(&words[i]));
	ctx->gen_floor = max_t(u64, ctx->gen_floor, top + 1);
	__free_page(page);
}

/*
 * A descriptor belongs to the mm that created it: from any other mm (a fork
 * child, a process it was passed to) every operation fails with EPERM. Once
 * the watched mm has exited, whoever holds the descriptor may still @drain
 * the remaining events (RELEASE) and read the statistics.
 */
static int memwatch_check_mm(struct memwatch_ctx *ctx, bool drain)
{
	if (current->mm == ctx->mm)
		return 0;
	if (drain && !atomic_read(&ctx->mm->mm_users))
		return 0;
	return -EPERM;
}

static long memwatch_add(struct memwatch_ctx *ctx, void __user *uarg)
{
	struct memwatch_add arg;
	struct memwatch_watch *w;
	int err, max_overlap;
	u64 *gen;
	u32 id;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || arg.reserved)
		return -EINVAL;
	if (arg.mask & ~MEMWATCH_ALL_REASONS)
		return -EINVAL;
	/* As madvise() and mlock(): a tagged pointer is its untagged address. */
	arg.addr = untagged_addr(arg.addr);
	if (!arg.len || !PAGE_ALIGNED(arg.addr) || !PAGE_ALIGNED(arg.len))
		return -EINVAL;
	if (arg.addr + arg.len < arg.addr || arg.addr + arg.len > TASK_SIZE)
		return -EINVAL;

	/* Charged to the creator, whoever adds: dec_ucount() undoes exactly this. */
	if (!inc_ucount(ctx->ucounts->ns, ctx->ucounts->uid,
			UCOUNT_MEMWATCH_WATCHES))
		return -ENOSPC;
	w = kmem_cache_zalloc(memwatch_watch_cache, GFP_KERNEL_ACCOUNT);
	if (!w) {
		err = -ENOMEM;
		goto out_ucount;
	}
	w->ctx = ctx;
	w->cookie = arg.cookie;
	w->mask = arg.mask ?: MEMWATCH_DEFAULT_MASK;

	mutex_lock(&ctx->lock);
	/*
	 * The id is reserved, not published: REMOVE cannot find the watch
	 * before ADD has returned its id (xa_store() below).
	 */
	err = xa_alloc(&ctx->watches, &id, NULL,
		       XA_LIMIT(0, MEMWATCH_MAX_SLOTS - 1), GFP_KERNEL_ACCOUNT);
	if (err) {
		err = err == -EBUSY ? -ENOSPC : err;
		goto out_unlock;
	}
	w->id = id;
	gen = memwatch_slot(ctx, id);
	if (!gen) {
		err = -ENOMEM;
		goto out_erase;
	}
	/*
	 * The generation is the word before the watch exists: only its own
	 * callback (and REMOVE of this id, reserved until ADD returns)
	 * changes the word, so every invalidation the watch's mask reports
	 * moves the word past what ADD returns, however soon after the
	 * insert it starts.
	 */
	arg.generation = memwatch_read_gen(gen);
	/* Counted and entered under one hold of the tree's lock. */
	mutex_lock(&ctx->mmw->lock);
	max_overlap = READ_ONCE(sysctl_memwatch_max_overlap);
	if (memwatch_overlaps(ctx->mmw, arg.addr, arg.addr + arg.len - 1,
			      max_overlap) >= max_overlap)
		err = -EMLINK;
	else
		err = mmu_interval_notifier_insert(&w->notifier, ctx->mm,
						   arg.addr, arg.len,
						   &memwatch_notifier_ops);
	if (!err)
		memwatch_tree_insert(w, &ctx->mmw->watches);
	mutex_unlock(&ctx->mmw->lock);
	if (err)
		goto out_slot;
	spin_lock(&ctx->qlock);
	ctx->stats.watches++;
	WRITE_ONCE(ctx->hdr->active_watches, ctx->stats.watches);
	spin_unlock(&ctx->qlock);
	mutex_unlock(&ctx->lock);

	/*
	 * An invalidation of the mm that is running now never calls the new
	 * watch: its insertion waits for that invalidation to end. Wait for
	 * the end too, so that what the caller registers after ADD returns
	 * is of the mapping the invalidation left, not of pages it is about
	 * to free; likewise for one of the watch's own range that began
	 * since the insert (it has moved the word past the generation
	 * already). This wait, and the copy out (which may fault into a
	 * userfaultfd range), hold no lock of the descriptor: read() and
	 * REMOVE of other watches go on meanwhile.
	 */
	mmu_interval_read_begin(&w->notifier);

	arg.id = id;
	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		/* A watch whose id the caller never learns is of no use. */
		memwatch_destroy(ctx, w);
		mutex_lock(&ctx->lock);
		xa_erase(&ctx->watches, id);
		memwatch_slot_put(ctx, id);
		mutex_unlock(&ctx->lock);
		return -EFAULT;
	}
	mutex_lock(&ctx->lock);
	xa_store(&ctx->watches, id, w, GFP_KERNEL_ACCOUNT);
	mutex_unlock(&ctx->lock);
	return 0;

out_slot:
	memwatch_slot_put(ctx, id);
out_erase:
	xa_erase(&ctx->watches, id);
out_unlock:
	mutex_unlock(&ctx->lock);
	kmem_cache_free(memwatch_watch_cache, w);
out_ucount:
	dec_ucount(ctx->ucounts, UCOUNT_MEMWATCH_WATCHES);
	return err;
}

/*
 * Remove one watch that nobody else can reach: its id is reserved (or the
 * descriptor is being released).
 */
static void memwatch_destroy(struct memwatch_ctx *ctx,
			     struct memwatch_watch *w)
{
	struct memwatch_event *ev;

	/* Counted until it can no longer be called. */
	mmu_interval_notifier_remove(&w->notifier);
	mutex_lock(&ctx->mmw->lock);
	memwatch_tree_remove(w, &ctx->mmw->watches);
	mutex_unlock(&ctx->mmw->lock);
	spin_lock(&ctx->qlock);
	/* A cached (id, generation) pair must not match a later watch. */
	memwatch_bump(memwatch_gen(ctx, w->id));
	/*
	 * Nor may its unread record be read under the id once a new watch
	 * has it: read() skips a record without reasons.
	 */
	ev = memwatch_unread(ctx, w);
	if (ev && ev->reasons) {
		ev->reasons = 0;
		WRITE_ONCE(ctx->qlive, ctx->qlive - 1);
		memwatch_skip_discarded(ctx);
	}
	ctx->stats.watches--;
	WRITE_ONCE(ctx->hdr->active_watches, ctx->stats.watches);
	spin_unlock(&ctx->qlock);
	kmem_cache_free(memwatch_watch_cache, w);
	dec_ucount(ctx->ucounts, UCOUNT_MEMWATCH_WATCHES);
}

static long memwatch_remove(struct memwatch_ctx *ctx, void __user *uarg)
{
	struct memwatch_remove arg;
	struct memwatch_watch *w;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags)
		return -EINVAL;
	mutex_lock(&ctx->lock);
	w = xa_load(&ctx->watches, arg.id);
	if (!w) {
		mutex_unlock(&ctx->lock);
		return -ENOENT;
	}
	/*
	 * Reserved, not free, until the watch is gone: a second REMOVE finds
	 * nothing and ADD cannot take the id. The removal may wait for an
	 * invalidation of the mm to end; read() does not wait with it.
	 */
	xa_store(&ctx->watches, arg.id, NULL, GFP_KERNEL);
	mutex_unlock(&ctx->lock);
	memwatch_destroy(ctx, w);
	mutex_lock(&ctx->lock);
	xa_erase(&ctx->watches, arg.id);
	memwatch_slot_put(ctx, arg.id);
	mutex_unlock(&ctx->lock);
	return 0;
}

static void memwatch_stats_snapshot(struct memwatch_ctx *ctx,
				    struct memwatch_stats *st)
{
	spin_lock(&ctx->qlock);
	*st = ctx->stats;
	st->queue_size = ctx->qsize;
	st->queue_used = ctx->qtail - ctx->qhead;
	spin_unlock(&ctx->qlock);
	st->wakeups = atomic64_read(&ctx->wakeups);
}

static long memwatch_get_stats(struct memwatch_ctx *ctx, void __user *uarg)
{
	struct memwatch_stats st;

	memwatch_stats_snapshot(ctx, &st);
	return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
}

static long memwatch_set_queue(struct memwatch_ctx *ctx, void __user *uarg)
{
	struct memwatch_event *ring, *old;
	struct memwatch_queue arg;
	long err = 0;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || !arg.size || arg.size > MEMWATCH_QUEUE_MAX)
		return -EINVAL;
	ring = kvcalloc(arg.size, sizeof(*ring), GFP_KERNEL_ACCOUNT);
	if (!ring)
		return -ENOMEM;
	mutex_lock(&ctx->lock);
	spin_lock(&ctx->qlock);
	if (ctx->qtail != ctx->qhead) {
		err = -EBUSY;	/* read the queue empty first */
		old = ring;
	} else {
		old = ctx->ring;
		ctx->ring = ring;
		ctx->qsize = arg.size;
	}
	spin_unlock(&ctx->qlock);
	mutex_unlock(&ctx->lock);
	kvfree(old);
	return err;
}

static long memwatch_set_wake(struct memwatch_ctx *ctx, void __user *uarg)
{
	struct memwatch_wake arg;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags || arg.delay_us > MEMWATCH_WAKE_DELAY_MAX_US)
		return -EINVAL;
	/* A wake-up already armed still comes at its time (see the rst). */
	WRITE_ONCE(ctx->wake_delay_ns, (u64)arg.delay_us * NSEC_PER_USEC);
	return 0;
}

static long memwatch_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct memwatch_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;
	int err;

	err = memwatch_check_mm(ctx, cmd == MEMWATCH_IOC_STATS);
	if (err)
		return err;
	switch (cmd) {
	case MEMWATCH_IOC_ADD:
		return memwatch_add(ctx, uarg);
	case MEMWATCH_IOC_REMOVE:
		return memwatch_remove(ctx, uarg);
	case MEMWATCH_IOC_STATS:
		return memwatch_get_stats(ctx, uarg);
	case MEMWATCH_IOC_SET_QUEUE:
		return memwatch_set_queue(ctx, uarg);
	case MEMWATCH_IOC_SET_WAKE:
		return memwatch_set_wake(ctx, uarg);
	case MEMWATCH_IOC_CLEAR_OVERFLOW:
		spin_lock(&ctx->qlock);
		/* Release, as every store of overflow: see memwatch_invalidate(). */
		smp_store_release(&ctx->hdr->overflow, 0);
		spin_unlock(&ctx->qlock);
		return 0;
	}
	return -ENOTTY;
}

/*
 * The watched mm has exited and every watch has had its RELEASE, the last
 * record the mm gives, and those records are read: nothing more will come.
 */
static bool __memwatch_ended(struct memwatch_ctx *ctx)
{
	lockdep_assert_held(&ctx->qlock);
	return !ctx->qlive && !atomic_read(&ctx->mm->mm_users) &&
		ctx->released == ctx->stats.watches;
}

static bool memwatch_ended(struct memwatch_ctx *ctx)
{
	bool ended;

	spin_lock(&ctx->qlock);
	ended = __memwatch_ended(ctx);
	spin_unlock(&ctx->qlock);
	return ended;
}

static ssize_t memwatch_read(struct file *file, char __user *buf,
			     size_t count, loff_t *ppos)
{
	struct memwatch_ctx *ctx = file->private_data;
	struct memwatch_event *batch;
	bool ended;
	size_t n, i;
	ssize_t ret;

	ret = memwatch_check_mm(ctx, true);
	if (ret)
		return ret;
	if (count < sizeof(*batch))
		return -EINVAL;
	n = min_t(size_t, count / sizeof(*batch), MEMWATCH_READ_BATCH);
	batch = kmalloc_array(n, sizeof(*batch), GFP_KERNEL);
	if (!batch)
		return -ENOMEM;

	mutex_lock(&ctx->lock);
	for (;;) {
		/* Consume under qlock: a record being merged into is unread. */
		spin_lock(&ctx->qlock);
		for (i = 0; i < n && ctx->qhead != ctx->qtail; ctx->qhead++) {
			struct memwatch_event *ev = memwatch_ring(ctx, ctx->qhead);

			if (ev->reasons)	/* else its watch was removed */
				batch[i++] = *ev;
		}
		WRITE_ONCE(ctx->qlive, ctx->qlive - i);
		memwatch_skip_discarded(ctx);
		ctx->stats.events_read += i;
		ended = __memwatch_ended(ctx);
		spin_unlock(&ctx->qlock);
		if (i)
			break;
		mutex_unlock(&ctx->lock);
		/* Nothing more can come: end of file, as a pipe's. */
		ret = 0;
		if (ended)
			goto out_free;
		if (file->f_flags & O_NONBLOCK) {
			ret = -EAGAIN;
			goto out_free;
		}
		ret = wait_event_interruptible(ctx->wqh, READ_ONCE(ctx->qlive) ||
					       memwatch_ended(ctx));
		if (ret)
			goto out_free;
		mutex_lock(&ctx->lock);
	}
	mutex_unlock(&ctx->lock);
	n = i;
	/*
	 * These were the last records: a waiter for the end alone (no
	 * EPOLLIN in its events) was not woken by them, and is now.
	 */
	if (ended)
		wake_up_interruptible(&ctx->wqh);

	/*
	 * Records that cannot be copied out are gone from the queue: count
	 * them and raise overflow, so that user space rescans its words.
	 */
	i = (n * sizeof(*batch) - copy_to_user(buf, batch, n * sizeof(*batch))) /
	    sizeof(*batch);
	if (i < n) {
		spin_lock(&ctx->qlock);
		ctx->stats.events_read -= n - i;
		ctx->stats.events_lost += n - i;
		/* Release, as every store of overflow: see memwatch_invalidate(). */
		smp_store_release(&ctx->hdr->overflow, 1);
		spin_unlock(&ctx->qlock);
	}
	ret = i ? i * sizeof(*batch) : -EFAULT;
out_free:
	kfree(batch);
	return ret;
}

static __poll_t memwatch_poll(struct file *file, poll_table *wait)
{
	struct memwatch_ctx *ctx = file->private_data;
	__poll_t events = 0;

	poll_wait(file, &ctx->wqh, wait);
	/*
	 * Readiness is the file's, whoever asks: a fork child polling its
	 * parent's descriptor in a shared epoll set sees what the parent
	 * sees (and gets EPERM if it reads; a level-triggered epoll set of
	 * the child reports the parent's unread records until the parent
	 * reads them).
	 */
	/* On the wait queue before qlive is read: see memwatch_invalidate(). */
	smp_mb();
	if (READ_ONCE(ctx->qlive))
		events = EPOLLIN | EPOLLRDNORM;
	else if (memwatch_ended(ctx))
		events = EPOLLHUP;
	return events;
}

/*
 * The state area maps its pages by PFN: no struct page reference is taken
 * and GUP refuses the mapping (VM_IO | VM_PFNMAP), so nothing can pin the
 * kernel's pages through it (io_uring fixed buffers, an RDMA MR) and they
 * never count as mapped file pages. A page of words is taken out of every
 * mapping before it is freed (memwatch_slot_put()); the header page lives
 * until the file is released, which no mapping outlives.
 */
static vm_fault_t memwatch_fault(struct vm_fault *vmf)
{
	struct memwatch_ctx *ctx = vmf->vma->vm_file->private_data;
	struct page *page;
	vm_fault_t ret;

	mutex_lock(&ctx->pages_lock);
	page = xa_load(&ctx->pages, vmf->pgoff);
	/*
	 * A page of words freed when its last id was: all ones, which no
	 * generation is, so that a racing check of a removed watch reads
	 * "changed" and does not crash. Pages never made are not there.
	 */
	if (!page && vmf->pgoff <= ctx->top_index)
		page = memwatch_dead_page;
	if (!page)
		ret = VM_FAULT_SIGBUS;
	else
		ret = vmf_insert_pfn(vmf->vma, vmf->address, page_to_pfn(page));
	mutex_unlock(&ctx->pages_lock);
	return ret;
}

static const struct vm_operations_struct memwatch_vm_ops = {
	.fault = memwatch_fault,
};

static int memwatch_mmap_prepare(struct vm_area_desc *desc)
{
	struct memwatch_ctx *ctx = desc->file->private_data;
	unsigned long pages = 1 + MEMWATCH_MAX_SLOTS / MEMWATCH_SLOTS_PER_PAGE;

	if (desc->mm != ctx->mm)
		return -EPERM;
	if (vma_desc_test_any(desc, VMA_WRITE_BIT))
		return -EACCES;	/* as the VFS answers for MAP_SHARED */
	if (desc->pgoff || vma_desc_pages(desc) > pages)
		return -EINVAL;
	/*
	 * PFN-mapped (see memwatch_fault()); not inherited by fork, as the
	 * child's mm is not the watched one; not in core dumps.
	 */
	vma_desc_set_flags(desc, VMA_IO_BIT, VMA_PFNMAP_BIT, VMA_DONTEXPAND_BIT,
			   VMA_DONTDUMP_BIT, VMA_DONTCOPY_BIT);
	vma_desc_clear_flags(desc, VMA_MAYWRITE_BIT);
	desc->vm_ops = &memwatch_vm_ops;
	/* Whose mappings memwatch_slot_put() takes a page out of. */
	mutex_lock(&ctx->pages_lock);
	ctx->mapping = desc->file->f_mapping;
	mutex_unlock(&ctx->pages_lock);
	return 0;
}

static int memwatch_release(struct inode *inode, struct file *file)
{
	struct memwatch_ctx *ctx = file->private_data;
	struct memwatch_watch *w;
	struct page *page;
	unsigned long id;

	mutex_lock(&ctx->lock);
	xa_for_each(&ctx->watches, id, w) {
		memwatch_destroy(ctx, w);
		cond_resched();		/* there may be millions */
	}
	mutex_unlock(&ctx->lock);
	/* No callback is left to arm it again. */
	hrtimer_cancel(&ctx->wake_timer);
	xa_destroy(&ctx->watches);
	xa_for_each(&ctx->pages, id, page) {
		set_page_private(page, 0);
		__free_page(page);
	}
	xa_destroy(&ctx->pages);
	kvfree(ctx->ring);
	dec_ucount(ctx->ucounts, UCOUNT_MEMWATCH_DESCRIPTORS);
	memwatch_mm_put(ctx->mmw);
	mmdrop(ctx->mm);
	kfree(ctx);
	return 0;
}

#ifdef CONFIG_PROC_FS
/*
 * /proc/PID/fdinfo/FD: the counters of MEMWATCH_IOC_STATS, readable by
 * tools that look at another process's descriptors.
 */
static void memwatch_show_fdinfo(struct seq_file *m, struct file *file)
{
	struct memwatch_ctx *ctx = file->private_data;
	struct memwatch_stats st;

	memwatch_stats_snapshot(ctx, &st);
	seq_printf(m, "memwatch-watches:\t%llu\n", st.watches);
	seq_printf(m, "memwatch-invalidations:\t%llu\n", st.invalidations);
	seq_printf(m, "memwatch-changes:\t%llu\n", st.changes);
	seq_printf(m, "memwatch-events-queued:\t%llu\n", st.events_queued);
	seq_printf(m, "memwatch-events-coalesced:\t%llu\n", st.events_coalesced);
	seq_printf(m, "memwatch-events-read:\t%llu\n", st.events_read);
	seq_printf(m, "memwatch-events-dropped:\t%llu\n", st.events_dropped);
	seq_printf(m, "memwatch-events-lost:\t%llu\n", st.events_lost);
	seq_printf(m, "memwatch-queue:\t%u/%u\n", st.queue_used, st.queue_size);
	seq_printf(m, "memwatch-wakeups:\t%llu\n", st.wakeups);
	seq_printf(m, "memwatch-wake-delay-us:\t%llu\n",
		   div_u64(READ_ONCE(ctx->wake_delay_ns), NSEC_PER_USEC));
	seq_printf(m, "memwatch-overflow:\t%u\n", READ_ONCE(ctx->hdr->overflow));
}
#endif

static const struct file_operations memwatch_fops = {
	.release = memwatch_release,
	.read = memwatch_read,
	.poll = memwatch_poll,
	.unlocked_ioctl = memwatch_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap_prepare = memwatch_mmap_prepare,
	.llseek = noop_llseek,
#ifdef CONFIG_PROC_FS
	.show_fdinfo = memwatch_show_fdinfo,
#endif
};

SYSCALL_DEFINE1(memwatch_create, unsigned int, flags)
{
	struct ucounts *ucounts;
	struct memwatch_ctx *ctx;
	struct page *hdr;
	int fd, err = -ENOMEM;

	BUILD_BUG_ON(MEMWATCH_CLOEXEC != O_CLOEXEC);
	BUILD_BUG_ON(MEMWATCH_NONBLOCK != O_NONBLOCK);
	if (flags & ~(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK))
		return -EINVAL;
	if (!current->mm)
		return -EINVAL;
	if (!READ_ONCE(sysctl_unprivileged_memwatch) && !capable(CAP_IPC_LOCK))
		return -EPERM;
	/* As inotify's instances: the per-user limit gives EMFILE. */
	ucounts = inc_ucount(current_ucounts()->ns, current_ucounts()->uid,
			     UCOUNT_MEMWATCH_DESCRIPTORS);
	if (!ucounts)
		return -EMFILE;

	ctx = kzalloc_obj(*ctx, GFP_KERNEL_ACCOUNT);
	if (!ctx)
		goto err_ucount;
	mutex_init(&ctx->lock);
	mutex_init(&ctx->pages_lock);
	spin_lock_init(&ctx->qlock);
	init_waitqueue_head(&ctx->wqh);
	hrtimer_setup(&ctx->wake_timer, memwatch_wake_timer, CLOCK_MONOTONIC,
		      HRTIMER_MODE_REL_SOFT);
	xa_init_flags(&ctx->watches, XA_FLAGS_ALLOC | XA_FLAGS_ACCOUNT);
	xa_init_flags(&ctx->pages, XA_FLAGS_ACCOUNT);
	ctx->qsize = MEMWATCH_QUEUE_DEFAULT;
	ctx->ring = kvcalloc(ctx->qsize, sizeof(*ctx->ring), GFP_KERNEL_ACCOUNT);
	if (!ctx->ring)
		goto err_ctx;
	hdr = alloc_page(GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!hdr)
		goto err_ring;
	err = xa_err(xa_store(&ctx->pages, 0, hdr, GFP_KERNEL_ACCOUNT));
	if (err) {
		__free_page(hdr);
		goto err_ring;
	}
	ctx->hdr = page_address(hdr);
	ctx->hdr->abi_version = MEMWATCH_ABI_VERSION;
	ctx->hdr->header_size = sizeof(*ctx->hdr);
	ctx->hdr->slots_offset = PAGE_SIZE;
	ctx->hdr->max_slots = MEMWATCH_MAX_SLOTS;
	ctx->hdr->features = MEMWATCH_FEATURE_SET_QUEUE | MEMWATCH_FEATURE_SET_WAKE;
	ctx->ucounts = ucounts;
	mmgrab(current->mm);
	ctx->mm = current->mm;
	ctx->mmw = memwatch_mm_get(ctx->mm);
	if (!ctx->mmw) {
		err = -ENOMEM;
		goto err_mm;
	}

	/*
	 * An inode of its own, as userfaultfd's: the state area's mappings
	 * join this descriptor's i_mmap tree, not one that every anonymous
	 * inode file shares, and an LSM has an inode to label.
	 */
	fd = anon_inode_create_getfd("[memwatch]", &memwatch_fops, ctx,
				     O_RDONLY | (flags & (O_CLOEXEC | O_NONBLOCK)),
				     NULL);
	if (fd < 0) {
		/* memwatch_release() has not run: undo by hand. */
		memwatch_mm_put(ctx->mmw);
		err = fd;
		goto err_mm;
	}
	return fd;

err_mm:
	mmdrop(ctx->mm);
	__free_page(hdr);
	xa_destroy(&ctx->pages);
err_ring:
	kvfree(ctx->ring);
err_ctx:
	kfree(ctx);
err_ucount:
	dec_ucount(ucounts, UCOUNT_MEMWATCH_DESCRIPTORS);
	return err;
}

static int __init memwatch_init(void)
{
	BUILD_BUG_ON(sizeof(struct memwatch_watch) > 144);
	/* Ids and masks fit the watch's bit fields. */
	BUILD_BUG_ON((MEMWATCH_MAX_SLOTS - 1) >> 24);
	BUILD_BUG_ON(MEMWATCH_ALL_REASONS >> 8);
	BUILD_BUG_ON(sizeof(struct memwatch_event) != 40);
	memwatch_watch_cache = KMEM_CACHE(memwatch_watch,
					  SLAB_ACCOUNT | SLAB_PANIC);
	memwatch_dead_page = alloc_page(GFP_KERNEL);
	if (!memwatch_dead_page)
		panic("memwatch: no page for the words of freed ids\n");
	memset(page_address(memwatch_dead_page), 0xff, PAGE_SIZE);
	init_user_ns.ucount_max[UCOUNT_MEMWATCH_WATCHES] = MEMWATCH_USER_WATCHES;
	init_user_ns.ucount_max[UCOUNT_MEMWATCH_DESCRIPTORS] =
		MEMWATCH_USER_DESCRIPTORS;
	register_sysctl_init("vm", memwatch_sysctls);
	return 0;
}
fs_initcall(memwatch_init);
