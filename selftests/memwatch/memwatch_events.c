// SPDX-License-Identifier: GPL-2.0
/*
 * Every kind of invalidation, caused on purpose: for each, a watch with the
 * default mask must change exactly when the page behind an address may have
 * changed (checked against /proc/self/pagemap), and a watch with every
 * reason must see the reason memwatch.rst documents for it.
 *
 * Some tests change system-wide settings (KSM, khugepaged, NUMA balancing,
 * a zram swap device, a memory cgroup); each puts them back when it ends.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/memwatch.h>
#include <linux/userfaultfd.h>

#include "../../../../lib/test_hmm_uapi.h"
#include "../../../../mm/gup_test.h"

#include "../kselftest_harness.h"
#include "memwatch_util.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define MPOL_MF_MOVE 2	/* <numaif.h> */
#define HPAGE (2UL << 20)
#define MAX_COOKIE 16
#define DEFAULT 0	/* the pair's default-mask watch, cookie 2k */
#define ALL 1		/* its every-reason watch, cookie 2k + 1 */

/* A range watched twice: with the default mask and with every reason. */
struct pair {
	struct memwatch_add w[2];
};

/* What the queued records said, per cookie. */
struct seen {
	__u32 reasons;
	__u64 start, end;
};

/* A descriptor, its words, what its records said, the settings changed. */
struct state {
	int fd;
	__u64 *slots;
	struct seen seen[MAX_COOKIE];
	/* A system setting changed by the test, restored by the teardown. */
	char knob[8][PATH_MAX];
	char old[8][64];
	int knobs;
};

FIXTURE(ev)
{
	long page;
	size_t map_len;
	struct memwatch_header *hdr;
	struct state s;
};

FIXTURE_SETUP(ev)
{
	self->page = sysconf(_SC_PAGESIZE);
	self->s.fd = memwatch_create(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
	ASSERT_LE(0, self->s.fd) TH_LOG("memwatch_create: %s", strerror(errno));
	self->map_len = self->page * 2;
	self->hdr = mmap(NULL, self->map_len, PROT_READ, MAP_SHARED, self->s.fd, 0);
	ASSERT_NE(MAP_FAILED, self->hdr);
	self->s.slots = (__u64 *)((char *)self->hdr + self->hdr->slots_offset);
	self->s.knobs = 0;
}

static int write_file(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	close(fd);
	return n < 0 ? -errno : 0;
}

static int read_file(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

FIXTURE_TEARDOWN(ev)
{
	struct state *st = &self->s;

	while (st->knobs--)
		write_file(st->knob[st->knobs], st->old[st->knobs]);
	munmap(self->hdr, self->map_len);
	close(st->fd);
}

/* Set a /proc or /sys knob for this test; the teardown puts it back. */
static int set_knob(struct __test_metadata *_metadata, struct state *st,
		    const char *path, const char *val)
{
	int i = st->knobs, ret;

	if (i == 8 || read_file(path, st->old[i], sizeof(st->old[i])))
		return -1;
	snprintf(st->knob[i], sizeof(st->knob[i]), "%s", path);
	ret = write_file(path, val);
	if (ret) {
		TH_LOG("cannot set %s to %s: %s", path, val, strerror(-ret));
		return -1;
	}
	st->knobs++;
	return 0;
}

static void watch_pair(struct state *st, void *addr, size_t len,
		       int k, struct pair *p)
{
	for (int i = 0; i < 2; i++) {
		p->w[i] = (struct memwatch_add){
			.addr = (uintptr_t)addr, .len = len, .cookie = 2 * k + i,
			.mask = i == ALL ? MEMWATCH_ALL_REASONS : 0,
		};
		if (ioctl(st->fd, MEMWATCH_IOC_ADD, &p->w[i]))
			p->w[i].id = UINT32_MAX;
	}
}

static bool valid(struct state *st, const struct memwatch_add *w)
{
	return __atomic_load_n(&st->slots[w->id], __ATOMIC_ACQUIRE) ==
	       w->generation;
}

/* Read every queued record into st->seen (cleared first). */
static void collect(struct state *st)
{
	struct memwatch_event ev[64];
	ssize_t n;

	memset(st->seen, 0, sizeof(st->seen));
	while ((n = read(st->fd, ev, sizeof(ev))) > 0) {
		for (size_t i = 0; i < n / sizeof(ev[0]); i++) {
			struct seen *s;

			if (ev[i].cookie >= MAX_COOKIE)
				continue;
			s = &st->seen[ev[i].cookie];
			if (!s->reasons || ev[i].start < s->start)
				s->start = ev[i].start;
			if (ev[i].end > s->end)
				s->end = ev[i].end;
			s->reasons |= ev[i].reasons;
		}
	}
}

static __u32 reasons(struct state *st, const struct pair *p, int which)
{
	return st->seen[p->w[which].cookie].reasons;
}

/* The pagemap entry of each page: PFN, present and swapped bits. */
static void read_pagemap(long page, const void *addr, int n, __u64 *out)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);

	for (int i = 0; i < n; i++)
		out[i] = 0;
	if (fd < 0)
		return;
	if (pread(fd, out, n * sizeof(*out),
		  (uintptr_t)addr / page * sizeof(*out)) < 0)
		memset(out, 0, n * sizeof(*out));
	close(fd);
}

#define PM_PRESENT 0x8000000000000000ULL
#define PM_SWAPPED 0x4000000000000000ULL
#define PM_PFN(e) ((e) & 0x7fffffffffffffULL)

/* Pages whose backing changed (or went away) between two pagemap reads. */
static int changed_pages(const __u64 *before, const __u64 *after, int n)
{
	int c = 0;

	for (int i = 0; i < n; i++)
		c += !(after[i] & PM_PRESENT) ||
		     PM_PFN(after[i]) != PM_PFN(before[i]);
	return c;
}

static char *map_touched(long page, int n)
{
	char *p = mmap(NULL, page * n, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	for (int i = 0; i < n; i++)
		memset(p + i * page, i + 1, page);
	return p;
}

/* A 2 MiB aligned range of 4 KiB pages, every page written. */
static char *map_small_pages_block(void)
{
	char *raw = mmap(NULL, 2 * HPAGE, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p;

	if (raw == MAP_FAILED)
		return NULL;
	p = (char *)(((uintptr_t)raw + HPAGE - 1) & ~(HPAGE - 1));
	if (madvise(p, HPAGE, MADV_NOHUGEPAGE))
		return NULL;
	for (size_t off = 0; off < HPAGE; off += 4096)
		p[off] = (char)(off >> 12);
	return p;
}

static bool content_intact(const char *p)
{
	for (size_t off = 0; off < HPAGE; off += 4096)
		if (p[off] != (char)(off >> 12))
			return false;
	return true;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Wait up to @seconds for a kernel thread to change @w's word. */
static void wait_for_change(struct state *st, const struct memwatch_add *w,
			    double seconds)
{
	for (double t0 = now(); valid(st, w) && now() - t0 < seconds;)
		usleep(50000);
}

/* mprotect keeps the pages: only a watch asking for PROTECTION changes. */
TEST_F(ev, mprotect_keeps_the_pages)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	struct pair p;

	ASSERT_NE(NULL, buf);
	watch_pair(&self->s, buf, 4 * self->page, 0, &p);
	read_pagemap(self->page, buf, 4, before);
	ASSERT_EQ(0, mprotect(buf, 4 * self->page, PROT_READ));
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	EXPECT_EQ(0, changed_pages(before, after, 4));
	EXPECT_TRUE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_FALSE(valid(&self->s, &p.w[ALL]));
	EXPECT_EQ(MEMWATCH_PROTECTION, reasons(&self->s, &p, ALL));
	munmap(buf, 4 * self->page);
}

/* Resetting soft-dirty bits (clear_refs 4) write-protects, keeps the pages. */
TEST_F(ev, soft_dirty_reset)
{
	char *buf = map_touched(self->page, 2);
	struct pair p;

	ASSERT_NE(NULL, buf);
	watch_pair(&self->s, buf, 2 * self->page, 0, &p);
	ASSERT_EQ(0, write_file("/proc/self/clear_refs", "4"));
	collect(&self->s);
	EXPECT_TRUE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_SOFT_DIRTY, reasons(&self->s, &p, ALL));
	munmap(buf, 2 * self->page);
}

/*
 * fork() write-protects the parent's pages (same pages: the default watch
 * stays valid); the parent's next write copies the page (CLEAR, only that
 * page): the stale registration every fork-unsafe cache hands out.
 */
TEST_F(ev, fork_write_protect_then_copy_on_write)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	struct pair p;
	int pipefd[2], status;
	pid_t pid;

	ASSERT_NE(NULL, buf);
	ASSERT_EQ(0, pipe(pipefd));
	watch_pair(&self->s, buf, 4 * self->page, 0, &p);
	read_pagemap(self->page, buf, 4, before);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char c;

		close(pipefd[1]);
		/* Keep the pages shared until told. */
		_exit(read(pipefd[0], &c, 1) < 0);
	}
	close(pipefd[0]);
	collect(&self->s);
	EXPECT_TRUE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_PROTECTION_PAGE, reasons(&self->s, &p, ALL));

	buf[self->page] = 42;	/* the parent writes page 1 */
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	close(pipefd[1]);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_EQ(1, changed_pages(before, after, 4));
	EXPECT_NE(PM_PFN(before[1]), PM_PFN(after[1]));
	EXPECT_FALSE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT));
	EXPECT_EQ((uintptr_t)buf + self->page, self->s.seen[0].start);
	EXPECT_EQ((uintptr_t)buf + 2 * self->page, self->s.seen[0].end);
	munmap(buf, 4 * self->page);
}

/* userfaultfd write-protection goes through change_protection(), as mprotect. */
TEST_F(ev, userfaultfd_write_protect)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = {
		.range = { .start = (uintptr_t)buf, .len = 4 * self->page },
		.mode = UFFDIO_REGISTER_MODE_WP,
	};
	struct uffdio_writeprotect wp = {
		.range = reg.range, .mode = UFFDIO_WRITEPROTECT_MODE_WP,
	};
	struct pair p;
	int uffd;

	ASSERT_NE(NULL, buf);
	uffd = syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	ASSERT_LE(0, uffd) TH_LOG("userfaultfd: %s", strerror(errno));
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_API, &api));
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_REGISTER, &reg))
		TH_LOG("UFFDIO_REGISTER (WP): %s", strerror(errno));
	watch_pair(&self->s, buf, 4 * self->page, 0, &p);
	read_pagemap(self->page, buf, 4, before);
	ASSERT_EQ(0, ioctl(uffd, UFFDIO_WRITEPROTECT, &wp));
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	EXPECT_EQ(0, changed_pages(before, after, 4));
	EXPECT_TRUE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_PROTECTION, reasons(&self->s, &p, ALL));
	close(uffd);
	munmap(buf, 4 * self->page);
}

/* MADV_FREE lets reclaim drop the pages without notice: CLEAR at once. */
TEST_F(ev, madv_free)
{
	char *buf = map_touched(self->page, 4);
	struct pair p, rest;

	ASSERT_NE(NULL, buf);
	watch_pair(&self->s, buf, 2 * self->page, 0, &p);
	watch_pair(&self->s, buf + 2 * self->page, 2 * self->page, 1, &rest);
	ASSERT_EQ(0, madvise(buf, 2 * self->page, MADV_FREE));
	collect(&self->s);
	EXPECT_FALSE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT));
	EXPECT_TRUE(valid(&self->s, &rest.w[DEFAULT]));
	EXPECT_TRUE(valid(&self->s, &rest.w[ALL]));
	munmap(buf, 4 * self->page);
}

/* mremap growing in place changes nothing; shrinking unmaps only the tail. */
TEST_F(ev, mremap_grow_in_place_then_shrink)
{
	char *buf = map_touched(self->page, 8);
	struct pair head, tail;

	ASSERT_NE(NULL, buf);
	ASSERT_EQ(0, munmap(buf + 4 * self->page, 4 * self->page));
	watch_pair(&self->s, buf, 2 * self->page, 0, &head);
	watch_pair(&self->s, buf + 2 * self->page, 2 * self->page, 1, &tail);
	ASSERT_EQ(buf, mremap(buf, 4 * self->page, 8 * self->page, 0));
	collect(&self->s);
	EXPECT_TRUE(valid(&self->s, &head.w[ALL]));
	EXPECT_TRUE(valid(&self->s, &tail.w[ALL]));
	EXPECT_EQ(0U, reasons(&self->s, &tail, ALL));

	ASSERT_EQ(buf, mremap(buf, 8 * self->page, 2 * self->page, 0));
	collect(&self->s);
	EXPECT_TRUE(valid(&self->s, &head.w[ALL]));
	EXPECT_FALSE(valid(&self->s, &tail.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_UNMAP, reasons(&self->s, &tail, DEFAULT));
	munmap(buf, 2 * self->page);
}

/* Under a shared file mapping: punching a hole and truncating zap exactly. */
TEST_F(ev, shared_file_hole_punch_and_truncate)
{
	struct pair first, second, tail;
	int mfd = memfd_create("memwatch_events", MFD_CLOEXEC);
	char *buf;

	ASSERT_LE(0, mfd);
	ASSERT_EQ(0, ftruncate(mfd, 4 * self->page));
	buf = mmap(NULL, 4 * self->page, PROT_READ | PROT_WRITE, MAP_SHARED,
		   mfd, 0);
	ASSERT_NE(MAP_FAILED, buf);
	memset(buf, 7, 4 * self->page);
	watch_pair(&self->s, buf, self->page, 0, &first);
	watch_pair(&self->s, buf + self->page, self->page, 1, &second);
	watch_pair(&self->s, buf + 2 * self->page, 2 * self->page, 2, &tail);

	ASSERT_EQ(0, fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			       0, self->page));
	collect(&self->s);
	EXPECT_FALSE(valid(&self->s, &first.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &first, DEFAULT));
	EXPECT_TRUE(valid(&self->s, &second.w[ALL]));
	EXPECT_TRUE(valid(&self->s, &tail.w[ALL]));
	EXPECT_EQ(0, buf[0]);	/* the hole reads as zeros */

	ASSERT_EQ(0, ftruncate(mfd, 2 * self->page));
	collect(&self->s);
	EXPECT_TRUE(valid(&self->s, &second.w[ALL]));
	EXPECT_FALSE(valid(&self->s, &tail.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &tail, DEFAULT));
	munmap(buf, 4 * self->page);
	close(mfd);
}

/* MADV_COLLAPSE copies 512 small pages into one huge page: CLEAR. */
TEST_F(ev, thp_collapse_by_madvise)
{
	__u64 before[4], after[4];
	char *blk = map_small_pages_block();
	struct pair p;
	int ret, tries = 0;

	ASSERT_NE(NULL, blk);
	/*
	 * Watched before MADV_HUGEPAGE: that registers the mm with khugepaged,
	 * which may collapse the block first (then MADV_COLLAPSE finds it done).
	 */
	watch_pair(&self->s, blk, HPAGE, 0, &p);
	read_pagemap(self->page, blk, 4, before);
	ASSERT_EQ(0, madvise(blk, HPAGE, MADV_HUGEPAGE));
	/* EAGAIN: no huge page free at the moment (a transient failure). */
	while ((ret = madvise(blk, HPAGE, MADV_COLLAPSE)) && errno == EAGAIN &&
	       ++tries < 10)
		usleep(100000);
	ASSERT_EQ(0, ret) TH_LOG("MADV_COLLAPSE: %s", strerror(errno));
	read_pagemap(self->page, blk, 4, after);
	collect(&self->s);
	EXPECT_EQ(4, changed_pages(before, after, 4));
	EXPECT_EQ(PM_PFN(after[0]) + 3, PM_PFN(after[3]));	/* one huge page */
	EXPECT_FALSE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT) & MEMWATCH_CLEAR);
	EXPECT_TRUE(content_intact(blk));
	munmap(blk, HPAGE);
}

/*
 * Splitting a VMA inside a 2 MiB block mapped by a page table splits no
 * huge pmd: the block's other pages keep their words. (Before the core mm
 * looked at the pmd first, the whole block was invalidated with CLEAR.)
 */
TEST_F(ev, vma_split_inside_a_block_of_small_pages)
{
	char *blk = map_small_pages_block();
	struct pair first, last, mid;
	__u64 before[512], after[512];

	ASSERT_NE(NULL, blk);
	watch_pair(&self->s, blk, self->page, 0, &first);
	watch_pair(&self->s, blk + 256 * self->page, self->page, 1, &mid);
	watch_pair(&self->s, blk + HPAGE - self->page, self->page, 2, &last);
	read_pagemap(self->page, blk, 512, before);
	/* Two splits at addresses that are not 2 MiB aligned. */
	ASSERT_EQ(0, mprotect(blk + 256 * self->page, self->page, PROT_READ));
	read_pagemap(self->page, blk, 512, after);
	collect(&self->s);
	EXPECT_EQ(0, changed_pages(before, after, 512));
	EXPECT_TRUE(valid(&self->s, &first.w[ALL]))
		TH_LOG("first page: reasons 0x%x", reasons(&self->s, &first, ALL));
	EXPECT_TRUE(valid(&self->s, &last.w[ALL]))
		TH_LOG("last page: reasons 0x%x", reasons(&self->s, &last, ALL));
	EXPECT_TRUE(valid(&self->s, &mid.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_PROTECTION, reasons(&self->s, &mid, ALL));
	munmap(blk, HPAGE);
}

/* khugepaged does the same from its own thread, on its own schedule. */
TEST_F_TIMEOUT(ev, thp_collapse_by_khugepaged, 150)
{
	const char *k = "/sys/kernel/mm/transparent_hugepage/khugepaged/";
	char path[PATH_MAX];
	__u64 before[4], after[4];
	char *blk = map_small_pages_block();
	struct pair p;

	ASSERT_NE(NULL, blk);
	snprintf(path, sizeof(path), "%sscan_sleep_millisecs", k);
	ASSERT_EQ(0, set_knob(_metadata, &self->s, path, "10"));
	snprintf(path, sizeof(path), "%salloc_sleep_millisecs", k);
	ASSERT_EQ(0, set_knob(_metadata, &self->s, path, "10"));
	snprintf(path, sizeof(path), "%spages_to_scan", k);
	ASSERT_EQ(0, set_knob(_metadata, &self->s, path, "65536"));
	watch_pair(&self->s, blk, HPAGE, 0, &p);
	read_pagemap(self->page, blk, 4, before);
	/* MADV_HUGEPAGE makes the block eligible and registers the mm. */
	ASSERT_EQ(0, madvise(blk, HPAGE, MADV_HUGEPAGE));
	wait_for_change(&self->s, &p.w[DEFAULT], 120);
	read_pagemap(self->page, blk, 4, after);
	collect(&self->s);
	ASSERT_FALSE(valid(&self->s, &p.w[DEFAULT]))
		TH_LOG("khugepaged did not collapse the block in 120 s");
	EXPECT_EQ(4, changed_pages(before, after, 4));
	EXPECT_EQ(PM_PFN(after[0]) + 3, PM_PFN(after[3]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT) & MEMWATCH_CLEAR);
	EXPECT_TRUE(content_intact(blk));
	munmap(blk, HPAGE);
}

/* KSM merging two equal pages maps both to one page: CLEAR. */
TEST_F_TIMEOUT(ev, ksm_merge, 150)
{
	__u64 before[3], after[3];
	char *buf = map_touched(self->page, 3);
	struct pair p, unique;

	ASSERT_NE(NULL, buf);
	memset(buf, 0x5a, 2 * self->page);	/* pages 0 and 1 equal */
	ASSERT_EQ(0, set_knob(_metadata, &self->s, "/sys/kernel/mm/ksm/sleep_millisecs", "10"));
	ASSERT_EQ(0, set_knob(_metadata, &self->s, "/sys/kernel/mm/ksm/pages_to_scan", "1000"));
	ASSERT_EQ(0, set_knob(_metadata, &self->s, "/sys/kernel/mm/ksm/run", "1"));
	/* Restored first: run 2 unmerges every page, then the old value. */
	ASSERT_EQ(0, set_knob(_metadata, &self->s, "/sys/kernel/mm/ksm/run", "1"));
	snprintf(self->s.old[self->s.knobs - 1], 64, "2");
	watch_pair(&self->s, buf, 2 * self->page, 0, &p);
	watch_pair(&self->s, buf + 2 * self->page, self->page, 1, &unique);
	read_pagemap(self->page, buf, 3, before);
	ASSERT_EQ(0, madvise(buf, 3 * self->page, MADV_MERGEABLE));
	wait_for_change(&self->s, &p.w[DEFAULT], 120);
	/*
	 * KSM write-protects one page (the watch changes), then maps the
	 * other to it: on a slow kernel the first pagemap read can fall in
	 * between. Give the merge 30 s to complete.
	 */
	for (double t0 = now(); now() - t0 < 30; usleep(50000)) {
		read_pagemap(self->page, buf, 3, after);
		if (PM_PFN(after[0]) == PM_PFN(after[1]))
			break;
	}
	collect(&self->s);
	ASSERT_FALSE(valid(&self->s, &p.w[DEFAULT]))
		TH_LOG("KSM merged nothing in 120 s");
	EXPECT_EQ(PM_PFN(after[0]), PM_PFN(after[1]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT));
	EXPECT_EQ(PM_PFN(before[2]), PM_PFN(after[2]));
	EXPECT_TRUE(valid(&self->s, &unique.w[DEFAULT]));
	ASSERT_EQ(0, madvise(buf, 3 * self->page, MADV_UNMERGEABLE));
	munmap(buf, 3 * self->page);
}

#define NUMA_KNOB "/proc/sys/kernel/numa_balancing"

/*
 * KSM finds a twin of a page it cannot merge (one with references beyond
 * its mappings: pinned, or held by a pipe) and gives up on it, but must not
 * invalidate it first: the change would tell whoever watches the page that
 * a page with the same content exists somewhere, on every pass. The pin is
 * gup_test's, held from START to STOP as a FOLL_LONGTERM pin; the pipe's
 * reference comes from vmsplice().
 */
static void ksm_leaves_a_held_page_alone(struct __test_metadata *_metadata,
					 struct state *st, long page, bool pipe_ref)
{
	struct pin_longterm_test pin = { .size = page };
	char *buf = map_touched(page, 4), scans[32];
	__u64 before[4], after[4];
	long first = -1, last = -1;
	int gup = -1, pipefd[2] = { -1, -1 };
	struct pair held;

	ASSERT_NE(NULL, buf);
	/* Page 0 (held) and 1 are twins, 2 and 3 are twins (a control). */
	memset(buf, 0x5a, 2 * page);
	memset(buf + 2 * page, 0xa5, 2 * page);
	if (pipe_ref) {
		struct iovec iov = { .iov_base = buf, .iov_len = page };

		ASSERT_EQ(0, pipe(pipefd));
		ASSERT_EQ((ssize_t)page, vmsplice(pipefd[1], &iov, 1, 0));
	} else {
		gup = open("/sys/kernel/debug/gup_test", O_RDWR);
		if (gup < 0)
			SKIP(return, "/sys/kernel/debug/gup_test (CONFIG_GUP_TEST): %s",
			     strerror(errno));
		pin.addr = (uintptr_t)buf;
		ASSERT_EQ(0, ioctl(gup, PIN_LONGTERM_TEST_START, &pin));
	}
	/* NUMA balancing would change the ALL watch (PROTECTION) meanwhile. */
	if (!access(NUMA_KNOB, F_OK))
		ASSERT_EQ(0, set_knob(_metadata, st, NUMA_KNOB, "0"));
	ASSERT_EQ(0, set_knob(_metadata, st, "/sys/kernel/mm/ksm/sleep_millisecs", "10"));
	ASSERT_EQ(0, set_knob(_metadata, st, "/sys/kernel/mm/ksm/pages_to_scan", "1000"));
	ASSERT_EQ(0, set_knob(_metadata, st, "/sys/kernel/mm/ksm/run", "1"));
	ASSERT_EQ(0, set_knob(_metadata, st, "/sys/kernel/mm/ksm/run", "1"));
	snprintf(st->old[st->knobs - 1], 64, "2");	/* unmerge first */
	watch_pair(st, buf, page, 0, &held);
	read_pagemap(page, buf, 4, before);
	ASSERT_EQ(0, madvise(buf, 4 * page, MADV_MERGEABLE));
	/* Three full passes after the control pair merged. */
	for (double t0 = now(); now() - t0 < 120; usleep(50000)) {
		read_pagemap(page, buf, 4, after);
		if (PM_PFN(after[2]) != PM_PFN(after[3]))
			continue;
		if (read_file("/sys/kernel/mm/ksm/full_scans", scans, sizeof(scans)))
			break;
		last = atol(scans);
		if (first < 0)
			first = last;
		if (last - first >= 3)
			break;
	}
	collect(st);
	ASSERT_EQ(PM_PFN(after[2]), PM_PFN(after[3]))
		TH_LOG("KSM merged nothing in 120 s");
	EXPECT_LE(3, last - first);
	EXPECT_EQ(PM_PFN(before[0]), PM_PFN(after[0]));
	EXPECT_TRUE(valid(st, &held.w[DEFAULT]))
		TH_LOG("KSM invalidated the page it cannot merge: reasons 0x%x",
		       reasons(st, &held, ALL));
	EXPECT_TRUE(valid(st, &held.w[ALL]));
	if (gup >= 0) {
		EXPECT_EQ(0, ioctl(gup, PIN_LONGTERM_TEST_STOP));
		close(gup);
	}
	if (pipefd[0] >= 0) {
		close(pipefd[0]);
		close(pipefd[1]);
	}
	ASSERT_EQ(0, madvise(buf, 4 * page, MADV_UNMERGEABLE));
	munmap(buf, 4 * page);
}

TEST_F_TIMEOUT(ev, ksm_leaves_a_pinned_page_alone, 150)
{
	ksm_leaves_a_held_page_alone(_metadata, &self->s, self->page, false);
}

TEST_F_TIMEOUT(ev, ksm_leaves_a_page_in_a_pipe_alone, 150)
{
	ksm_leaves_a_held_page_alone(_metadata, &self->s, self->page, true);
}

/*
 * The state area holds kernel pages: nothing may pin them through it (a
 * long-term pin, as io_uring's fixed buffers or an RDMA MR take, would keep
 * them past the descriptor and reach them from elsewhere). GUP refuses the
 * mapping, by the slow path (the VMA's flags) and by the fast one (its
 * special PTEs); reading it is unchanged.
 */
TEST_F(ev, state_area_cannot_be_pinned)
{
	struct pin_longterm_test pin = {
		.addr = (uintptr_t)self->hdr, .size = self->page,
	};
	int gup = open("/sys/kernel/debug/gup_test", O_RDWR);
	int ret, i;

	if (gup < 0)
		SKIP(return, "/sys/kernel/debug/gup_test (CONFIG_GUP_TEST): %s",
		     strerror(errno));
	EXPECT_EQ(MEMWATCH_ABI_VERSION, self->hdr->abi_version);	/* mapped */
	for (i = 0; i < 2; i++) {
		pin.flags = i ? PIN_LONGTERM_TEST_FLAG_USE_FAST : 0;
		ret = ioctl(gup, PIN_LONGTERM_TEST_START, &pin);
		if (!ret)
			ioctl(gup, PIN_LONGTERM_TEST_STOP);
		EXPECT_EQ(-1, ret)
			TH_LOG("the header page was pinned (%s GUP)",
			       i ? "fast" : "slow");
		EXPECT_EQ(EFAULT, errno);
	}
	close(gup);
	EXPECT_EQ(MEMWATCH_ABI_VERSION, self->hdr->abi_version);
}

/*
 * Migration to device-private memory (HMM, as GPU drivers' SVM does it)
 * moves the data to the device and, at the next CPU access, back into a new
 * page: two page changes, each MIGRATE, which the default mask reports.
 * test_hmm's dmirror device plays the GPU.
 */
TEST_F(ev, migration_to_device_private_memory_and_back)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	struct hmm_dmirror_cmd cmd = { .npages = 4 };
	char mirror[4 * 4096 * 16];	/* 4 pages of up to 64 KiB */
	struct pair to_dev, back;
	int dev;

	ASSERT_NE(NULL, buf);
	dev = open("/dev/hmm_dmirror0", O_RDWR);
	if (dev < 0)
		SKIP(return, "/dev/hmm_dmirror0 (CONFIG_TEST_HMM): %s", strerror(errno));
	/* NUMA balancing could migrate the pages meanwhile (CLEAR). */
	if (!access(NUMA_KNOB, F_OK))
		ASSERT_EQ(0, set_knob(_metadata, &self->s, NUMA_KNOB, "0"));
	watch_pair(&self->s, buf, 4 * self->page, 0, &to_dev);
	read_pagemap(self->page, buf, 4, before);
	cmd.addr = (uintptr_t)buf;
	cmd.ptr = (uintptr_t)mirror;	/* the device's copy, read back */
	ASSERT_EQ(0, ioctl(dev, HMM_DMIRROR_MIGRATE_TO_DEV, &cmd))
		TH_LOG("HMM_DMIRROR_MIGRATE_TO_DEV: %s", strerror(errno));
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	EXPECT_EQ(4, cmd.cpages);
	for (int i = 0; i < 4; i++)	/* not buf: a read brings it back */
		EXPECT_EQ(i + 1, mirror[i * self->page]);
	EXPECT_EQ(4, changed_pages(before, after, 4));
	EXPECT_FALSE(valid(&self->s, &to_dev.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_MIGRATE, reasons(&self->s, &to_dev, DEFAULT));
	EXPECT_EQ(MEMWATCH_MIGRATE, reasons(&self->s, &to_dev, ALL) & MEMWATCH_MIGRATE);

	/* The CPU's access brings each page back, into a new page. */
	watch_pair(&self->s, buf, 4 * self->page, 1, &back);
	for (int i = 0; i < 4; i++)
		EXPECT_EQ(i + 1, buf[i * self->page]);
	read_pagemap(self->page, buf, 4, before);
	collect(&self->s);
	for (int i = 0; i < 4; i++)
		EXPECT_TRUE(before[i] & PM_PRESENT);
	EXPECT_FALSE(valid(&self->s, &back.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_MIGRATE, reasons(&self->s, &back, DEFAULT));
	close(dev);
	munmap(buf, 4 * self->page);
}

#define NUMAB "/sys/kernel/debug/sched/numa_balancing/"

static bool two_nodes(void)
{
	return access("/sys/devices/system/node/node1", F_OK) == 0;
}

/* The CPUs of NUMA node @node, from sysfs ("0-1,4" style); 0 or -errno. */
static int node_cpus(int node, cpu_set_t *set)
{
	char path[64], list[256], *p;
	int fd, n, a, b;

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	n = read(fd, list, sizeof(list) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	list[n] = 0;
	CPU_ZERO(set);
	for (p = list; *p >= '0' && *p <= '9';) {
		a = strtol(p, &p, 10);
		b = *p == '-' ? strtol(p + 1, &p, 10) : a;
		while (a <= b)
			CPU_SET(a++, set);
		if (*p != ',')
			break;
		p++;
	}
	return CPU_COUNT(set) ? 0 : -ENOENT;
}

/* Node of each page (move_pages with no target only reports). */
static int page_node(void *addr)
{
	int status = -1;

	if (syscall(__NR_move_pages, 0, 1, &addr, NULL, &status, 0))
		return -errno;
	return status;
}

/* move_pages() migrates to the other node: new pages, CLEAR. */
TEST_F(ev, migration_by_move_pages)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	void *pages[4];
	int nodes[4], status[4], from;
	struct pair p;

	if (!two_nodes())
		SKIP(return, "one NUMA node: nothing to migrate to");
	ASSERT_NE(NULL, buf);
	from = page_node(buf);
	ASSERT_LE(0, from);
	for (int i = 0; i < 4; i++) {
		pages[i] = buf + i * self->page;
		nodes[i] = !from;
	}
	watch_pair(&self->s, buf, 4 * self->page, 0, &p);
	read_pagemap(self->page, buf, 4, before);
	ASSERT_EQ(0, syscall(__NR_move_pages, 0, 4, pages, nodes, status,
			     MPOL_MF_MOVE));
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	for (int i = 0; i < 4; i++)
		EXPECT_EQ(!from, status[i]);
	EXPECT_EQ(4, changed_pages(before, after, 4));
	EXPECT_FALSE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT));
	EXPECT_EQ(1, buf[0]);
	munmap(buf, 4 * self->page);
}

/* migrate_pages() moves the whole process: our pages among them. */
TEST_F(ev, migration_by_migrate_pages)
{
	__u64 before[4], after[4];
	char *buf = map_touched(self->page, 4);
	unsigned long old_nodes, new_nodes;
	struct pair p;
	int from;
	long left;

	if (!two_nodes())
		SKIP(return, "one NUMA node: nothing to migrate to");
	ASSERT_NE(NULL, buf);
	from = page_node(buf);
	ASSERT_LE(0, from);
	old_nodes = 1UL << from;
	new_nodes = 1UL << !from;
	watch_pair(&self->s, buf, 4 * self->page, 0, &p);
	read_pagemap(self->page, buf, 4, before);
	left = syscall(__NR_migrate_pages, 0, 8 * sizeof(long), &old_nodes,
		       &new_nodes);
	ASSERT_LE(0, left) TH_LOG("migrate_pages: %s", strerror(errno));
	read_pagemap(self->page, buf, 4, after);
	collect(&self->s);
	EXPECT_EQ(!from, page_node(buf));
	EXPECT_EQ(4, changed_pages(before, after, 4));
	EXPECT_FALSE(valid(&self->s, &p.w[DEFAULT]));
	EXPECT_EQ(MEMWATCH_CLEAR, reasons(&self->s, &p, DEFAULT));
	munmap(buf, 4 * self->page);
}

/* A /proc/vmstat counter, or -1. */
static long vmstat_count(const char *name)
{
	char line[128];
	size_t len = strlen(name);
	long val = -1;
	FILE *f = fopen("/proc/vmstat", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, len) && line[len] == ' ')
			val = atol(line + len + 1);
	fclose(f);
	return val;
}

/*
 * When no scan came, say what the scheduler thought: the task's NUMA lines
 * of /proc/self/sched and its CPU time (the scan is driven by CPU time).
 */
static void log_numa_state(struct __test_metadata *_metadata)
{
	char line[160];
	FILE *f = fopen("/proc/self/sched", "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "numa") || strstr(line, "sum_exec_runtime") ||
		    strstr(line, "current_node"))
			TH_LOG("sched: %.*s", (int)strcspn(line, "\n"), line);
	fclose(f);
}

/*
 * NUMA balancing marks pages PROT_NONE (PROTECTION) to sample accesses and
 * may migrate them: the default watch changes exactly when a page moved.
 */
TEST_F_TIMEOUT(ev, numa_hinting, 150)
{
	const int n = 64;
	__u64 before[64], after[64];
	long pte_updates, hint_faults;
	cpu_set_t on0, on1;
	struct pair p;
	char *buf;
	double t0;
	int moved;

	if (!two_nodes())
		SKIP(return, "one NUMA node: no NUMA balancing");
	/*
	 * The scan leaves alone the pages of a single-threaded task that are
	 * on the node it runs on (change_prot_numa): the pages are made on
	 * node 0, the task then runs on node 1, so the scan must mark them.
	 * Where the scheduler happened to put the task decided it before.
	 */
	if (node_cpus(0, &on0) || node_cpus(1, &on1))
		SKIP(return, "a NUMA node without CPUs");
	ASSERT_EQ(0, sched_setaffinity(0, sizeof(on0), &on0));
	buf = map_touched(self->page, n);
	ASSERT_NE(NULL, buf);
	ASSERT_EQ(0, page_node(buf));
	ASSERT_EQ(0, sched_setaffinity(0, sizeof(on1), &on1));
	ASSERT_EQ(0, set_knob(_metadata, &self->s, NUMAB "scan_delay_ms", "0"));
	ASSERT_EQ(0, set_knob(_metadata, &self->s, NUMAB "scan_period_min_ms", "10"));
	/* Scans that find nothing back off up to this (60 s by default). */
	ASSERT_EQ(0, set_knob(_metadata, &self->s, NUMAB "scan_period_max_ms", "100"));
	ASSERT_EQ(0, set_knob(_metadata, &self->s, "/proc/sys/kernel/numa_balancing", "1"));
	watch_pair(&self->s, buf, n * self->page, 0, &p);
	read_pagemap(self->page, buf, n, before);
	pte_updates = vmstat_count("numa_pte_updates");
	hint_faults = vmstat_count("numa_hint_faults");
	/* The scan runs from the task's own ticks: keep touching the pages. */
	for (t0 = now(); valid(&self->s, &p.w[ALL]) && now() - t0 < 120;)
		for (int i = 0; i < n; i++)
			buf[i * self->page]++;
	read_pagemap(self->page, buf, n, after);
	collect(&self->s);
	if (!(reasons(&self->s, &p, ALL) & MEMWATCH_PROTECTION)) {
		/* A scan that changed PTEs (anyone's) vs none at all. */
		TH_LOG("in 120 s: numa_pte_updates +%ld, numa_hint_faults +%ld",
		       vmstat_count("numa_pte_updates") - pte_updates,
		       vmstat_count("numa_hint_faults") - hint_faults);
		log_numa_state(_metadata);
	}
	ASSERT_NE(0U, reasons(&self->s, &p, ALL) & MEMWATCH_PROTECTION)
		TH_LOG("no NUMA hinting scan in 120 s (reasons 0x%x)",
		       reasons(&self->s, &p, ALL));
	moved = changed_pages(before, after, n);
	TH_LOG("first scan after %.1f s; %d of %d pages migrated", now() - t0,
	       moved, n);
	EXPECT_EQ(moved == 0, valid(&self->s, &p.w[DEFAULT]));
	munmap(buf, n * self->page);
}

/*
 * A cgroup v2 directory of our own below the root: the root hierarchy is
 * mounted at a private place if nothing is mounted at /sys/fs/cgroup.
 */
struct cgroup {
	char root[128];
	char dir[256];
	bool mounted;
};

static int cgroup_make(struct cgroup *cg, const char *name)
{
	char path[PATH_MAX + 32];

	snprintf(cg->root, sizeof(cg->root), "/sys/fs/cgroup");
	cg->mounted = false;
	snprintf(path, sizeof(path), "%s/cgroup.controllers", cg->root);
	if (access(path, F_OK)) {
		snprintf(cg->root, sizeof(cg->root), "/tmp/memwatch-cgroup.%d",
			 getpid());
		if (mkdir(cg->root, 0700) ||
		    mount("none", cg->root, "cgroup2", 0, NULL))
			return -1;
		cg->mounted = true;
	}
	snprintf(path, sizeof(path), "%s/cgroup.subtree_control", cg->root);
	if (write_file(path, "+memory"))
		return -1;
	snprintf(cg->dir, sizeof(cg->dir), "%s/%s", cg->root, name);
	if (mkdir(cg->dir, 0700) && errno != EEXIST)
		return -1;
	return 0;
}

static int cgroup_set(struct cgroup *cg, const char *file, const char *val)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/%s", cg->dir, file);
	return write_file(path, val);
}

static long cgroup_event(struct cgroup *cg, const char *key)
{
	char path[PATH_MAX + 32], line[128];
	long val = -1;
	FILE *f;

	snprintf(path, sizeof(path), "%s/memory.events", cg->dir);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, strlen(key)) && line[strlen(key)] == ' ')
			val = atol(line + strlen(key) + 1);
	fclose(f);
	return val;
}

static void cgroup_remove(struct cgroup *cg)
{
	rmdir(cg->dir);
	if (cg->mounted) {
		umount(cg->root);
		rmdir(cg->root);
	}
}

static int join(struct cgroup *cg)
{
	return cgroup_set(cg, "cgroup.procs", "0");
}

/* A 64 MiB zram swap device, with a version-1 swap header of our own. */
static int zram_swap_on(long page)
{
	char *hdr;
	int fd, ret;

	if (write_file("/sys/block/zram0/disksize", "64M"))
		return -1;
	hdr = calloc(1, page);
	if (!hdr)
		return -1;
	/* union swap_header: version at 1024, last_page at 1028. */
	*(uint32_t *)(hdr + 1024) = 1;
	*(uint32_t *)(hdr + 1028) = (64 << 20) / page - 1;
	memcpy(hdr + page - 10, "SWAPSPACE2", 10);
	fd = open("/dev/zram0", O_WRONLY);
	ret = fd < 0 || pwrite(fd, hdr, page, 0) != page ? -1 : 0;
	if (fd >= 0)
		close(fd);
	free(hdr);
	return ret ? ret : swapon("/dev/zram0", 0);
}

static void zram_swap_off(void)
{
	swapoff("/dev/zram0");
	write_file("/sys/block/zram0/reset", "1");
}

/*
 * Swap-out by memory cgroup reclaim unmaps the page (CLEAR): a child in a
 * 16 MiB cgroup watches 16 pages, then writes 64 MiB; its watched pages go
 * to zram. Exit status: 0 passed, else the number of the failed check.
 */
static int swap_out_child(struct cgroup *cg, long page)
{
	const int n = 16;
	__u64 after[16];
	size_t big = 64UL << 20;
	struct memwatch_add w = { 0 };
	__u64 *slots;
	int fd, swapped = 0;
	char *buf;
	void *hdr;

	if (join(cg))	/* first: the watched pages are charged to it */
		return 1;
	fd = memwatch_create(MEMWATCH_CLOEXEC);
	hdr = mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, 0);
	if (fd < 0 || hdr == MAP_FAILED)
		return 2;
	slots = (__u64 *)((char *)hdr + ((struct memwatch_header *)hdr)->slots_offset);
	buf = map_touched(page, n);
	if (!buf)
		return 3;
	w.addr = (uintptr_t)buf;
	w.len = n * page;
	if (ioctl(fd, MEMWATCH_IOC_ADD, &w))
		return 4;
	for (char *p = mmap(NULL, big, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *e = p + big;
	     p != MAP_FAILED && p < e; p += page)
		*p = 1;
	read_pagemap(page, buf, n, after);
	for (int i = 0; i < n; i++)
		swapped += !!(after[i] & PM_SWAPPED);
	printf("# %s: %d of %d watched pages swapped out, word %s\n",
	       __func__, swapped, n, slots[w.id] == w.generation ? "unchanged" : "changed");
	if (!swapped)
		return 5;	/* the test would prove nothing */
	if (__atomic_load_n(&slots[w.id], __ATOMIC_ACQUIRE) == w.generation)
		return 6;	/* a page left and the word did not change */
	if (buf[0] != 1 || buf[(n - 1) * page] != n)
		return 7;	/* swapped back in intact */
	return 0;
}

TEST_F_TIMEOUT(ev, swap_out_under_a_memory_cgroup, 150)
{
	struct cgroup cg;
	int status;
	pid_t pid;

	ASSERT_EQ(0, cgroup_make(&cg, "memwatch_swap"))
		TH_LOG("cannot set up a memory cgroup: %s", strerror(errno));
	ASSERT_EQ(0, zram_swap_on(self->page))
		TH_LOG("cannot swap on zram0: %s", strerror(errno));
	EXPECT_EQ(0, cgroup_set(&cg, "memory.max", "16M"));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(swap_out_child(&cg, self->page));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	zram_swap_off();
	cgroup_remove(&cg);
	ASSERT_TRUE(WIFEXITED(status)) TH_LOG("child: status 0x%x", status);
	EXPECT_EQ(0, WEXITSTATUS(status));
}

/*
 * Grow the stack by what the calls below will use, while outside the cgroup
 * (the stack keeps its pages when the frame is gone; the empty asm keeps the
 * compiler from dropping the stores).
 */
static void grow_stack(void)
{
	char pad[256 << 10];

	memset(pad, 1, sizeof(pad));
	asm volatile("" : : "r"(pad) : "memory");
}

/*
 * Make every private writable page of this process present and its own
 * (copy-on-write broken) before it joins a cgroup it will fill: at the
 * limit, a page fault of a process exempt from the OOM killer finds nothing
 * to reclaim and nobody to kill, and is retried for ever. (Seen once: the
 * test timed out, "Out of memory and no killable processes" for a
 * GFP_HIGHUSER_MOVABLE fault, a copy-on-write of a page still shared with
 * the parent.)
 */
static int populate_private_pages(void)
{
	unsigned long start, end;
	char perms[8], line[512];
	FILE *f;
	int ret = 0;

	grow_stack();
	f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %4s", &start, &end, perms) == 3 &&
		    !strcmp(perms, "rw-p") &&
		    madvise((void *)start, end - start, MADV_POPULATE_WRITE))
			ret = -1;
	fclose(f);
	return ret;
}

/*
 * In a memory cgroup at its limit, ADD fails with ENOMEM, and leaves nothing
 * behind: the watches already added stay usable, one removed makes room for
 * another, and every failed ADD returns its share of the per-user count.
 * The child is exempt from the OOM killer, so the charge fails instead of
 * killing it. Exit status: 0 passed, else the number of the failed check.
 */
static int memcg_add_child(struct cgroup *cg, long page, int report)
{
	const size_t len = 1UL << 30;	/* addresses only, never touched */
	struct memwatch_remove rm = { .id = 0 };
	struct memwatch_stats st;
	struct memwatch_add w;
	unsigned long n = 0;
	int fd, failures;
	char *area;

	if (populate_private_pages() ||
	    write_file("/proc/self/oom_score_adj", "-1000") || join(cg))
		return 1;
	area = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS |
		    MAP_NORESERVE, -1, 0);
	fd = memwatch_create(MEMWATCH_CLOEXEC);
	if (area == MAP_FAILED || fd < 0)
		return 2;
	for (;; n++) {
		w = (struct memwatch_add){ .addr = (uintptr_t)area + n * page,
					   .len = page, .cookie = n };
		if (ioctl(fd, MEMWATCH_IOC_ADD, &w))
			break;
		if (n == len / page - 1)
			return 3;	/* the cgroup never filled up */
	}
	if (errno != ENOMEM)
		return 4;
	/* Each further attempt fails the same way, and is not counted. */
	for (failures = 0; failures < 10; failures++)
		if (!ioctl(fd, MEMWATCH_IOC_ADD, &w) || errno != ENOMEM)
			return 5;
	if (ioctl(fd, MEMWATCH_IOC_STATS, &st)) {
		fprintf(stderr, "# STATS at the limit: %s\n", strerror(errno));
		return 6;
	}
	if (st.watches != n) {
		fprintf(stderr, "# %llu watches counted, %lu added\n",
			(unsigned long long)st.watches, n);
		return 9;
	}
	if (ioctl(fd, MEMWATCH_IOC_REMOVE, &rm) || ioctl(fd, MEMWATCH_IOC_ADD, &w))
		return 7;	/* removing one makes room for another */
	close(fd);	/* first: a pipe buffer is charged to the cgroup too */
	return write(report, &n, sizeof(n)) == sizeof(n) ? 0 : 8;
}

/*
 * Filling the cgroup takes ~28000 ADDs: seconds alone, more than the
 * harness's default 30 s beside the rest of make check under TCG.
 */
FIXTURE(memcg) {
	int unused;
};

FIXTURE_SETUP(memcg)
{
}

FIXTURE_TEARDOWN(memcg)
{
}

TEST_F_TIMEOUT(memcg, limit_during_add, 150)
{
	const char *path = "/proc/sys/user/max_memwatch_watches";
	long page = sysconf(_SC_PAGESIZE);
	char old[32] = "", limit[32];
	unsigned long n = 0, i;
	struct memwatch_add w;
	struct cgroup cg;
	int status, fd, p[2];
	char *buf;
	pid_t pid;

	if (geteuid())
		SKIP(return, "needs root: a memory cgroup and the per-user limit");
	ASSERT_EQ(0, cgroup_make(&cg, "memwatch_add"))
		TH_LOG("cannot set up a memory cgroup: %s", strerror(errno));
	ASSERT_EQ(0, cgroup_set(&cg, "memory.max", "4M"));
	ASSERT_EQ(0, pipe(p));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(memcg_add_child(&cg, page, p[1]));
	close(p[1]);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_EQ((ssize_t)sizeof(n), read(p[0], &n, sizeof(n)));
	close(p[0]);
	cgroup_remove(&cg);
	ASSERT_TRUE(WIFEXITED(status)) TH_LOG("child: status 0x%x", status);
	ASSERT_EQ(0, WEXITSTATUS(status));
	TH_LOG("%lu watches fitted in the cgroup's 4 MiB", n);

	/* The per-user count is back to zero: exactly the limit fits again. */
	ASSERT_EQ(0, read_file(path, old, sizeof(old)));
	snprintf(limit, sizeof(limit), "%d", 64);
	ASSERT_EQ(0, write_file(path, limit));
	buf = mmap(NULL, 65 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fd = memwatch_create(MEMWATCH_CLOEXEC);
	for (i = 0; i < 65; i++) {
		w = (struct memwatch_add){ .addr = (uintptr_t)buf + i * page,
					   .len = page };
		if (ioctl(fd, MEMWATCH_IOC_ADD, &w))
			break;
	}
	write_file(path, old);
	EXPECT_EQ(64UL, i);
	EXPECT_EQ(ENOSPC, errno);
	close(fd);
	munmap(buf, 65 * page);
}

/*
 * The OOM killer (and its reaper) tears down a watched mm: a process the
 * descriptor was passed to drains the records saying so, reads the
 * statistics, cannot add a watch, and closes cleanly.
 */
TEST(oom_kill_of_a_watched_mm)
{
	long page = sysconf(_SC_PAGESIZE);
	struct memwatch_event ev[16];
	struct memwatch_stats st;
	struct memwatch_add w = { .mask = MEMWATCH_ALL_REASONS, .cookie = 7 };
	struct cgroup cg;
	__u32 reasons = 0;
	int sv[2], status, fd;
	ssize_t n;
	pid_t pid;

	if (geteuid())
		SKIP(return, "needs root: a memory cgroup");
	ASSERT_EQ(0, cgroup_make(&cg, "memwatch_oom"))
		TH_LOG("cannot set up a memory cgroup: %s", strerror(errno));
	ASSERT_EQ(0, cgroup_set(&cg, "memory.max", "16M"));
	cgroup_set(&cg, "memory.swap.max", "0");
	ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		char *buf, c;

		close(sv[0]);
		fd = memwatch_create(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
		buf = map_touched(page, 16);
		if (join(&cg) || fd < 0 || !buf)
			_exit(1);
		w.addr = (uintptr_t)buf;
		w.len = 16 * page;
		if (ioctl(fd, MEMWATCH_IOC_ADD, &w) || send_fd(sv[1], fd) ||
		    write(sv[1], &w, sizeof(w)) != sizeof(w) ||
		    read(sv[1], &c, 1) != 1)
			_exit(2);
		for (;;) {	/* until the OOM killer ends us */
			char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

			if (p != MAP_FAILED)
				memset(p, 1, 1 << 20);
		}
	}
	close(sv[1]);
	fd = recv_fd(sv[0]);
	ASSERT_LE(0, fd);
	ASSERT_EQ((ssize_t)sizeof(w), read(sv[0], &w, sizeof(w)));
	/* The state area belongs to the watched mm: only records come here. */
	EXPECT_EQ(MAP_FAILED, mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, 0));
	EXPECT_EQ(EPERM, errno);
	ASSERT_EQ(1, write(sv[0], "g", 1));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFSIGNALED(status)) TH_LOG("child: status 0x%x", status);
	EXPECT_EQ(SIGKILL, WTERMSIG(status));
	EXPECT_LE(1, cgroup_event(&cg, "oom_kill"));
	cgroup_remove(&cg);

	while ((n = read(fd, ev, sizeof(ev))) > 0)
		for (size_t i = 0; i < n / sizeof(ev[0]); i++)
			if (ev[i].cookie == 7)
				reasons |= ev[i].reasons;
	TH_LOG("reasons seen: 0x%x", reasons);
	EXPECT_NE(0U, reasons & (MEMWATCH_CLEAR | MEMWATCH_RELEASE));
	/* The mm is gone: statistics may be read, nothing added. */
	EXPECT_EQ(0, ioctl(fd, MEMWATCH_IOC_STATS, &st));
	EXPECT_LE(1ULL, st.events_read);
	EXPECT_EQ(-1, ioctl(fd, MEMWATCH_IOC_ADD, &w));
	EXPECT_EQ(EPERM, errno);
	EXPECT_EQ(0, close(fd));
	close(sv[0]);
}

TEST_HARNESS_MAIN
