// SPDX-License-Identifier: GPL-2.0
/*
 * A watch added while an invalidation of the mm is running. The interval
 * notifier's insertion is then deferred to the end of that invalidation,
 * which never calls the new watch. If MEMWATCH_IOC_ADD returned at once, a
 * registration made right after it (here: the page looked up in
 * /proc/self/pagemap, where a pin would take it) could catch a page the
 * running zap is about to free, under a generation word that never
 * changes: a stale registration memwatch calls valid.
 *
 * A thread zaps a populated region with MADV_DONTNEED, its last page last;
 * the test adds a watch on that page as the zap starts and looks the page
 * up. If the page was still mapped then, the zap must change the word.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <linux/memwatch.h>

#include "../kselftest_harness.h"
#include "memwatch_util.h"

#define ZAP_PAGES 8192		/* 32 MiB of 4 KiB pages: the zap takes a while */
#define MAX_ROUNDS 300
/* Within the harness's 30 s per test, on the debug kernel too. */
#define MAX_SECONDS 10

enum phase { POPULATED, ZAP_START, ZAP_DONE, CHECKED, STOP };

struct zapper {
	char *buf;
	long page;
	atomic_int phase;
};

/*
 * Yield while waiting: two threads spinning on a 2-CPU guest leave no CPU
 * to the kernel's own work (in a make check on a loaded host this test
 * once ran past the harness's 30 s; alone it takes 10 s).
 */
static void wait_phase(struct zapper *z, int want)
{
	while (atomic_load(&z->phase) != want && atomic_load(&z->phase) != STOP)
		sched_yield();
}

static void *zap_loop(void *arg)
{
	struct zapper *z = arg;
	long i;

	for (;;) {
		for (i = 0; i < ZAP_PAGES; i++)
			z->buf[i * z->page] = 1;
		atomic_store(&z->phase, ZAP_START);
		madvise(z->buf, ZAP_PAGES * z->page, MADV_DONTNEED);
		atomic_store(&z->phase, ZAP_DONE);
		wait_phase(z, CHECKED);
		if (atomic_load(&z->phase) == STOP)
			return NULL;
		atomic_store(&z->phase, POPULATED);
	}
}

/* Whether the page at @addr is mapped, from /proc/self/pagemap. */
static int page_present(int pagemap, void *addr, long page)
{
	uint64_t entry;
	off_t off = (uintptr_t)addr / page * sizeof(entry);

	if (pread(pagemap, &entry, sizeof(entry), off) != sizeof(entry))
		return -1;
	return !!(entry & (1ULL << 63));
}

TEST(add_racing_a_zap)
{
	long page = sysconf(_SC_PAGESIZE);
	struct zapper z = { .page = page, .phase = POPULATED };
	struct memwatch_header *hdr;
	int fd, pagemap, present, rounds, caught = 0, stale = 0, done;
	struct memwatch_add a;
	struct memwatch_remove r;
	struct timespec t0, t;
	pthread_t thread;
	__u64 *slots;
	void *last;

	fd = memwatch_create(MEMWATCH_CLOEXEC);
	ASSERT_LE(0, fd) TH_LOG("memwatch_create: %s", strerror(errno));
	hdr = mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, hdr);
	slots = (__u64 *)((char *)hdr + hdr->slots_offset);
	pagemap = open("/proc/self/pagemap", O_RDONLY);
	ASSERT_LE(0, pagemap);
	z.buf = mmap(NULL, ZAP_PAGES * page, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, z.buf);
	/* Small pages: a huge page would be zapped in one step. */
	ASSERT_EQ(0, madvise(z.buf, ZAP_PAGES * page, MADV_NOHUGEPAGE));
	last = z.buf + (ZAP_PAGES - 1) * page;
	/* A first watch registers the mm's notifier: later ADDs take no mmap_lock. */
	a = (struct memwatch_add){ .addr = (uintptr_t)z.buf, .len = page };
	ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_ADD, &a));

	ASSERT_EQ(0, pthread_create(&thread, NULL, zap_loop, &z));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (rounds = 0; rounds < MAX_ROUNDS; rounds++) {
		wait_phase(&z, ZAP_START);
		a = (struct memwatch_add){ .addr = (uintptr_t)last, .len = page };
		ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_ADD, &a));
		present = page_present(pagemap, last, page);
		ASSERT_LE(0, present);
		wait_phase(&z, ZAP_DONE);
		if (present) {
			/* Registered the old page: the zap must have said so. */
			caught++;
			if (__atomic_load_n(&slots[a.id], __ATOMIC_ACQUIRE) ==
			    a.generation)
				stale++;
		}
		r = (struct memwatch_remove){ .id = a.id };
		ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_REMOVE, &r));
		clock_gettime(CLOCK_MONOTONIC, &t);
		done = stale || rounds + 1 == MAX_ROUNDS ||
		       t.tv_sec - t0.tv_sec > MAX_SECONDS;
		/* The zapper waits for this, so STOP cannot be overwritten. */
		atomic_store(&z.phase, done ? STOP : CHECKED);
		if (done)
			break;
	}
	pthread_join(thread, NULL);
	TH_LOG("%d rounds: page mapped after ADD in %d, word unchanged in %d",
	       rounds + 1, caught, stale);
	EXPECT_EQ(0, stale);
	munmap(z.buf, ZAP_PAGES * page);
	munmap(hdr, 2 * page);
	close(pagemap);
	close(fd);
}

TEST_HARNESS_MAIN
