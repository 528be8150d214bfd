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
 * add_racing_a_zap: a thread zaps a populated region with MADV_DONTNEED,
 * its last page last; the test adds a watch on that page as the zap starts
 * and looks the page up. If the page was still mapped then, the zap must
 * change the word. add_absorbs_no_invalidation: the watch's own range is
 * zapped the moment a deferred insertion ends, before the woken ADD reads
 * the word (see there).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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
		/*
		 * Past POPULATED, not at ZAP_START: a descheduled test thread
		 * may find the zap done already (then waiting for ZAP_START
		 * would wait for ever, as the zapper waits for CHECKED).
		 */
		while (atomic_load(&z.phase) == POPULATED ||
		       atomic_load(&z.phase) == CHECKED)
			sched_yield();
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

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define REGION_PAGES 16384	/* 64 MiB: each zap takes a while */

enum step { READY, ZAPPING, ZAPPED, SEEN, QUIT };

struct two_zaps {
	char *r1, *r2;		/* r1 holds a watch, r2 ends with the page */
	char *quiet;		/* a page nobody zaps */
	long page;
	int fd2;		/* the second zapper's descriptor */
	int pagemap;
	int add_cpu, zap_cpu;	/* -1: not pinned */
	atomic_int step;
	atomic_int adding;	/* this round's ADD is under way */
	atomic_int added;	/* and has returned */
	atomic_int failed;
};

static void wait_step(struct two_zaps *z, int want)
{
	while (atomic_load(&z->step) != want && atomic_load(&z->step) != QUIT)
		sched_yield();
}

static void pin_to(int cpu)
{
	cpu_set_t one;

	if (cpu < 0)
		return;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	sched_setaffinity(0, sizeof(one), &one);
}

/* Whether r1's zap is under way: its first page is gone. */
static bool r1_zapping(struct two_zaps *z)
{
	return atomic_load(&z->step) == ZAPPING &&
	       page_present(z->pagemap, z->r1, z->page) == 0;
}

/* The first zapper, on the ADD thread's CPU: populate, then zap r1. */
static void *zap_r1_loop(void *arg)
{
	struct two_zaps *z = arg;
	size_t len = REGION_PAGES * z->page;

	pin_to(z->add_cpu);
	for (;;) {
		if (madvise(z->r1, len, MADV_POPULATE_WRITE) ||
		    madvise(z->r2, len, MADV_POPULATE_WRITE)) {
			atomic_store(&z->failed, 1);
			atomic_store(&z->step, QUIT);
			return NULL;
		}
		atomic_store(&z->adding, 0);
		atomic_store(&z->added, 0);
		atomic_store(&z->step, ZAPPING);
		madvise(z->r1, len, MADV_DONTNEED);
		wait_step(z, SEEN);
		if (atomic_load(&z->step) == QUIT)
			return NULL;
		atomic_store(&z->step, READY);
	}
}

/*
 * The second zapper, on a CPU of its own: an ADD of its own made during r1's
 * zap wakes when that zap ends, as the test's ADD does, and r2's zap starts
 * at once.
 */
static void *zap_r2_loop(void *arg)
{
	struct two_zaps *z = arg;
	size_t len = REGION_PAGES * z->page;
	struct memwatch_remove r;
	struct memwatch_add a;

	pin_to(z->zap_cpu);
	for (;;) {
		while (atomic_load(&z->step) != QUIT && !r1_zapping(z))
			sched_yield();
		if (atomic_load(&z->step) == QUIT)
			return NULL;
		a = (struct memwatch_add){ .addr = (uintptr_t)z->quiet,
					   .len = z->page };
		if (ioctl(z->fd2, MEMWATCH_IOC_ADD, &a)) {
			atomic_store(&z->failed, 1);
			atomic_store(&z->step, QUIT);
			return NULL;
		}
		madvise(z->r2, len, MADV_DONTNEED);
		r = (struct memwatch_remove){ .id = a.id };
		ioctl(z->fd2, MEMWATCH_IOC_REMOVE, &r);
		atomic_store(&z->step, ZAPPED);
		while (atomic_load(&z->step) == ZAPPED)
			sched_yield();
	}
}

/*
 * Takes the ADD thread's CPU while an ADD is under way, so that the ADD
 * thread (at nice 19) wakes late from its wait for the end of r1's zap.
 */
static void *hog_loop(void *arg)
{
	struct two_zaps *z = arg;

	pin_to(z->add_cpu);
	while (atomic_load(&z->step) != QUIT) {
		if (atomic_load(&z->adding) && !atomic_load(&z->added))
			continue;
		usleep(100);
	}
	return NULL;
}

/*
 * The generation ADD returns includes no invalidation still running. An ADD
 * made while a zap of another watch's range (r1) runs is inserted when that
 * zap ends, and wakes then; a zap of its own range (r2) that starts at that
 * moment, on another CPU, bumps the word before the woken ADD, which shares
 * its CPU with a busy thread at a lower priority, gets to read it. Had ADD
 * returned the bumped word, a pin taken right after it (here: the page
 * looked up in /proc/self/pagemap) would hold a page r2's zap is about to
 * free, under a word that never changes again.
 */
TEST(add_absorbs_no_invalidation)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t len = REGION_PAGES * page;
	struct two_zaps z = { .page = page, .step = READY,
			      .add_cpu = -1, .zap_cpu = -1 };
	int fd, present, rounds, caught = 0, stale = 0, done, cpu;
	pthread_t zap1, zap2, hog;
	struct memwatch_header *hdr;
	struct memwatch_add a;
	struct memwatch_remove r;
	struct timespec t0, t;
	cpu_set_t all;
	__u64 *slots;
	void *last;

	fd = memwatch_create(MEMWATCH_CLOEXEC);
	ASSERT_LE(0, fd) TH_LOG("memwatch_create: %s", strerror(errno));
	z.fd2 = memwatch_create(MEMWATCH_CLOEXEC);
	ASSERT_LE(0, z.fd2);
	hdr = mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, hdr);
	slots = (__u64 *)((char *)hdr + hdr->slots_offset);
	z.pagemap = open("/proc/self/pagemap", O_RDONLY);
	ASSERT_LE(0, z.pagemap);
	z.r1 = mmap(NULL, len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	z.r2 = mmap(NULL, len, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	z.quiet = mmap(NULL, page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, z.r1);
	ASSERT_NE(MAP_FAILED, z.r2);
	ASSERT_NE(MAP_FAILED, z.quiet);
	/* Small pages, zapped one by one, the last one last. */
	ASSERT_EQ(0, madvise(z.r1, len, MADV_NOHUGEPAGE));
	ASSERT_EQ(0, madvise(z.r2, len, MADV_NOHUGEPAGE));
	last = z.r2 + len - page;
	/* r1's zap is an invalidation of the mm's interval tree. */
	a = (struct memwatch_add){ .addr = (uintptr_t)z.r1, .len = page };
	ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_ADD, &a));

	/* This thread, the hog and r1's zapper on one CPU; r2's on another. */
	ASSERT_EQ(0, sched_getaffinity(0, sizeof(all), &all));
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		if (!CPU_ISSET(cpu, &all))
			continue;
		if (z.add_cpu < 0)
			z.add_cpu = cpu;
		else if (z.zap_cpu < 0)
			z.zap_cpu = cpu;
	}
	if (z.zap_cpu < 0)
		SKIP(return, "needs two CPUs");
	pin_to(z.add_cpu);
	ASSERT_EQ(0, pthread_create(&zap1, NULL, zap_r1_loop, &z));
	ASSERT_EQ(0, pthread_create(&zap2, NULL, zap_r2_loop, &z));
	ASSERT_EQ(0, pthread_create(&hog, NULL, hog_loop, &z));
	/* This thread only: a new thread takes its creator's nice value. */
	ASSERT_EQ(0, setpriority(PRIO_PROCESS, syscall(SYS_gettid), 19));

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (rounds = 0; rounds < MAX_ROUNDS; rounds++) {
		/* Past READY, not at ZAPPING: the zaps may be over already. */
		while (atomic_load(&z.step) == READY ||
		       atomic_load(&z.step) == SEEN)
			sched_yield();
		ASSERT_NE(QUIT, atomic_load(&z.step));
		/* While r1's zap runs, so that the insertion waits for its end. */
		while (atomic_load(&z.step) == ZAPPING && !r1_zapping(&z))
			sched_yield();
		atomic_store(&z.adding, 1);
		a = (struct memwatch_add){ .addr = (uintptr_t)last, .len = page };
		ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_ADD, &a));
		atomic_store(&z.added, 1);
		present = page_present(z.pagemap, last, page);
		ASSERT_LE(0, present);
		wait_step(&z, ZAPPED);
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
		atomic_store(&z.step, done ? QUIT : SEEN);
		if (done)
			break;
	}
	pthread_join(zap1, NULL);
	pthread_join(zap2, NULL);
	pthread_join(hog, NULL);
	EXPECT_EQ(0, atomic_load(&z.failed)) TH_LOG("a zapper failed");
	TH_LOG("%d rounds: page mapped after ADD in %d, word unchanged in %d",
	       rounds + 1, caught, stale);
	EXPECT_EQ(0, stale);
	munmap(z.r1, len);
	munmap(z.r2, len);
	munmap(z.quiet, page);
	munmap(hdr, 2 * page);
	close(z.pagemap);
	close(z.fd2);
	close(fd);
}

TEST_HARNESS_MAIN
