// SPDX-License-Identifier: GPL-2.0
/*
 * memwatch at scale: MEMWATCH_SCALE_WATCHES (default 1M) one-page watches
 * in one process. Checks that all are added, that one munmap() invalidates
 * exactly the watches it covers, and that closing tears them all down;
 * reports kernel memory per watch and the cost of add and invalidation at
 * scale relative to a single watch (ratios, not absolute times). With
 * MEMWATCH_SCALE_MAX_BYTES set, slab growth per watch must stay within it
 * (set on production kernels; slab debugging and KASAN redzones add more).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/memwatch.h>

#include "../kselftest_harness.h"
#include "memwatch_util.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A /proc/meminfo field, in KiB. */
static long kib_of(const char *field)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)) &&
		    line[strlen(field)] == ':')
			v = atol(line + strlen(field) + 1);
	if (f)
		fclose(f);
	return v;
}

/* Seconds for one munmap+mmap of one page at @p (a page some watch covers). */
static double remap_cost(char *p, long page)
{
	double t = now();

	munmap(p, page);
	mmap(p, page, PROT_READ | PROT_WRITE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	return now() - t;
}

#define PMD_BLOCK (2UL << 20)

/*
 * Read all queued records. Besides the remapped page's watch (@target), only
 * CLEAR records inside the 2 MiB block [@lo, @hi) may appear: splitting a VMA
 * there makes the core mm invalidate the whole block (split_huge_pmd), a
 * documented false positive. Counts the others and the violations.
 */
static void drain(int fd, __u32 target, __u64 lo, __u64 hi, int *others,
		  int *bad)
{
	struct memwatch_event ev[64];
	ssize_t n;
	int j;

	while ((n = read(fd, ev, sizeof(ev))) > 0)
		for (j = 0; j < n / (ssize_t)sizeof(ev[0]); j++) {
			if (ev[j].id == target)
				continue;
			(*others)++;
			if (ev[j].reasons != MEMWATCH_CLEAR || ev[j].start < lo ||
			    ev[j].end > hi)
				(*bad)++;
		}
}

/* Add watch @i of the big set: page @i of @area. */
/*
 * Raise the per-user watch limit to at least @want for this test (the
 * default, 1M, is what a cache needs, not a scale test); returns the old
 * value for restore_limit(), or -1.
 */
static const char *const limit_path = "/proc/sys/user/max_memwatch_watches";

static long raise_limit(unsigned long want)
{
	char buf[32];
	long old = -1;
	FILE *f = fopen(limit_path, "r+");

	if (!f)
		return -1;
	if (fscanf(f, "%ld", &old) == 1 && (unsigned long)old < want) {
		snprintf(buf, sizeof(buf), "%lu\n", want);
		rewind(f);
		fputs(buf, f);
	}
	fclose(f);
	return old;
}

static void restore_limit(long old)
{
	FILE *f = fopen(limit_path, "w");

	if (f) {
		fprintf(f, "%ld\n", old);
		fclose(f);
	}
}

static int add_one(int fd, char *area, long page, unsigned long i)
{
	struct memwatch_add a = {
		.addr = (__u64)(area + i * page), .len = page, .cookie = i,
	};

	return ioctl(fd, MEMWATCH_IOC_ADD, &a);
}

/*
 * No state of its own; a fixture only for the timeout: adding and freeing
 * the watches takes longer than the harness's default 30 s on the debug
 * kernel beside another guest (make check at 618384c: killed by the
 * timeout after all its measurements, while freeing 65536 watches).
 */
FIXTURE(scale) {};
FIXTURE_SETUP(scale) {}
FIXTURE_TEARDOWN(scale) {}

TEST_F_TIMEOUT(scale, many_watches, 300)
{
	const unsigned long probe = 1024;	/* adds timed at each end */
	long page = sysconf(_SC_PAGESIZE);
	unsigned long n = getenv("MEMWATCH_SCALE_WATCHES") ?
			  strtoul(getenv("MEMWATCH_SCALE_WATCHES"), NULL, 0) :
			  1UL << 20;
	struct memwatch_stats st;
	int others = 0, bad = 0;
	__u64 target, lo, hi;
	double t, add_first, add_last, inv_small = 1e9, inv_big = 1e9;
	long slab0, slab1, free0, free1;
	size_t words_len;
	unsigned long i;
	__u64 *words;
	char *area;
	int fd, k;
	long limit;

	ASSERT_LT(2 * probe, n);
	limit = raise_limit(n + 1);
	ASSERT_LT(0, limit) TH_LOG("%s: %s", limit_path, strerror(errno));
	area = mmap(NULL, (n + 1) * page, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ASSERT_NE(MAP_FAILED, area);
	fd = memwatch_create(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
	ASSERT_LE(0, fd);
	words_len = page * (1 + ((n + 1) * 8 + page - 1) / page);
	words = mmap(NULL, words_len, PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(MAP_FAILED, words);

	/* One watch (id 0, the last page): the baseline for invalidation. */
	ASSERT_EQ(0, add_one(fd, area, page, n));
	for (k = 0; k < 5; k++) {
		double c = remap_cost(area + n * page, page);

		inv_small = c < inv_small ? c : inv_small;
		drain(fd, 0, 0, 0, &others, &bad);
	}

	slab0 = kib_of("Slab");
	free0 = kib_of("MemFree");
	t = now();
	for (i = 0; i < probe; i++)
		ASSERT_EQ(0, add_one(fd, area, page, i));
	add_first = (now() - t) / probe;
	for (; i < n - probe; i++)
		if (add_one(fd, area, page, i)) {
			TH_LOG("add %lu of %lu: %s", i, n, strerror(errno));
			break;
		}
	ASSERT_EQ(n - probe, i);
	t = now();
	for (; i < n; i++)
		ASSERT_EQ(0, add_one(fd, area, page, i));
	add_last = (now() - t) / probe;
	slab1 = kib_of("Slab");
	free1 = kib_of("MemFree");
	ASSERT_EQ(0, ioctl(fd, MEMWATCH_IOC_STATS, &st));
	EXPECT_EQ(n + 1, st.watches);

	/* Remap page n/2 (watch id n/2 + 1) among all the others. */
	target = (__u64)(area + (n / 2) * page);
	lo = target & ~(PMD_BLOCK - 1);
	hi = lo + PMD_BLOCK;
	for (k = 0; k < 5; k++) {
		double c = remap_cost(area + (n / 2) * page, page);

		inv_big = c < inv_big ? c : inv_big;
		drain(fd, n / 2 + 1, lo, hi, &others, &bad);
	}
	words = (__u64 *)((char *)words + page);
	EXPECT_NE(0, words[n / 2 + 1]);
	EXPECT_EQ(0, bad);
	/* Watches of the pages just outside the block never change. */
	if (lo - page >= (__u64)area)
		EXPECT_EQ(0, words[(lo - page - (__u64)area) / page + 1]);
	if (hi < (__u64)(area + n * page))
		EXPECT_EQ(0, words[(hi - (__u64)area) / page + 1]);
	words = (__u64 *)((char *)words - page);
	TH_LOG("other watches' records: %d, all CLEAR within the remapped page's 2 MiB block",
	       others);

	TH_LOG("%lu watches: slab +%ld KiB (%.1f bytes/watch)",
	       n, slab1 - slab0, (slab1 - slab0) * 1024.0 / n);
	TH_LOG("memory +%ld KiB (%.1f bytes/watch, generation words included)",
	       free0 - free1, (free0 - free1) * 1024.0 / n);
	if (getenv("MEMWATCH_SCALE_MAX_BYTES"))
		EXPECT_GE(strtod(getenv("MEMWATCH_SCALE_MAX_BYTES"), NULL),
			  (slab1 - slab0) * 1024.0 / n);
	TH_LOG("add: %.2f us for the last %lu vs %.2f us for the first (ratio %.2f)",
	       add_last * 1e6, probe, add_first * 1e6, add_last / add_first);
	TH_LOG("remap of a watched page: %.2f us among %lu watches",
	       inv_big * 1e6, n + 1);
	TH_LOG("  vs %.2f us with one watch (ratio %.2f)",
	       inv_small * 1e6, inv_big / inv_small);

	/* The mapping holds the file too: teardown runs at the last of both. */
	t = now();
	ASSERT_EQ(0, munmap(words, words_len));
	ASSERT_EQ(0, close(fd));
	TH_LOG("teardown of %lu watches: %.3f s", n + 1, now() - t);
	munmap(area, (n + 1) * page);
	restore_limit(limit);
}

TEST_HARNESS_MAIN
