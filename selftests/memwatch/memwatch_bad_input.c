// SPDX-License-Identifier: GPL-2.0
/*
 * Every memwatch entry point, one invalid argument at a time: each row of
 * the table makes one call that must fail with exactly the errno named, and
 * leave the descriptor as it was (the same watches, the same queue) and
 * still usable.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/memwatch.h>

#include "../kselftest_harness.h"
#include "memwatch_util.h"

/*
 * The state every row starts from: a non-blocking descriptor, its state
 * area mapped, two pages of memory and one watch on the first of them.
 */
struct start {
	int fd;

	long page;
	struct memwatch_header *hdr;
	char *buf;
	__u32 id;
	void *ro;		/* a read-only page, for out-arguments */
	void *none;		/* a page that cannot be accessed */
};

/* A row: one call returning -1 with errno set (or whatever it returned). */
typedef long (*bad_fn)(struct start *s);

FIXTURE(bad)
{
	struct start s;

};

FIXTURE_VARIANT(bad)
{
	bad_fn call;
	int err;

	__u64 watches_left;	/* the fixture's watch, unless the row removed it */
};

static struct memwatch_add add_arg(struct start *s)
{
	return (struct memwatch_add){ .addr = (uintptr_t)s->buf, .len = s->page };
}

static long add(struct start *s, struct memwatch_add a)
{
	return ioctl(s->fd, MEMWATCH_IOC_ADD, &a);
}

/* Unmap the watched page and map it again: one event is queued. */
static int queue_event(struct start *s)
{
	if (munmap(s->buf, s->page))
		return -1;
	return mmap(s->buf, s->page, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
	       MAP_FAILED ? -1 : 0;
}

FIXTURE_SETUP(bad)
{
	struct memwatch_add a;

	self->s.page = sysconf(_SC_PAGESIZE);
	self->s.fd = memwatch_create(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
	ASSERT_LE(0, self->s.fd);
	self->s.hdr = mmap(NULL, self->s.page, PROT_READ, MAP_SHARED,
			   self->s.fd, 0);
	ASSERT_NE(MAP_FAILED, self->s.hdr);
	self->s.buf = mmap(NULL, 2 * self->s.page, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->s.buf);
	self->s.ro = mmap(NULL, self->s.page, PROT_READ,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->s.ro);
	self->s.none = mmap(NULL, self->s.page, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->s.none);
	a = add_arg(&self->s);
	ASSERT_EQ(0, ioctl(self->s.fd, MEMWATCH_IOC_ADD, &a));
	self->s.id = a.id;
}

FIXTURE_TEARDOWN(bad)
{
	munmap(self->s.none, self->s.page);
	munmap(self->s.ro, self->s.page);
	munmap(self->s.buf, 2 * self->s.page);
	munmap(self->s.hdr, self->s.page);
	close(self->s.fd);
}

TEST_F(bad, call)
{
	struct memwatch_stats before, after;
	struct memwatch_add a;
	struct memwatch_remove r;
	long ret;

	ASSERT_EQ(0, ioctl(self->s.fd, MEMWATCH_IOC_STATS, &before));
	errno = 0;
	ret = variant->call(&self->s);
	EXPECT_EQ(-1, ret);
	EXPECT_EQ(variant->err, errno)
		TH_LOG("errno %d (%s), expected %d (%s)", errno,
		       strerror(errno), variant->err, strerror(variant->err));

	/* Nothing added, nothing lost, the queue as it was. */
	ASSERT_EQ(0, ioctl(self->s.fd, MEMWATCH_IOC_STATS, &after));
	EXPECT_EQ(variant->watches_left, after.watches);
	EXPECT_EQ(variant->watches_left, self->s.hdr->active_watches);
	EXPECT_EQ(before.queue_size, after.queue_size);
	/*
	 * The call failed, so it delivered no record: none counts as read. A
	 * record it took from the queue counts as lost, with overflow raised
	 * so that user space rescans its words.
	 */
	EXPECT_EQ(before.events_read, after.events_read);
	EXPECT_EQ(after.events_queued, after.events_read + after.events_lost +
					       after.queue_used);
	if (after.events_lost)
		EXPECT_EQ(1, self->s.hdr->overflow);

	/* And the descriptor still works. */
	a = add_arg(&self->s);
	a.addr += self->s.page;
	ASSERT_EQ(0, ioctl(self->s.fd, MEMWATCH_IOC_ADD, &a));
	r = (struct memwatch_remove){ .id = a.id };
	ASSERT_EQ(0, ioctl(self->s.fd, MEMWATCH_IOC_REMOVE, &r));
}

/* memwatch_create(): only MEMWATCH_CLOEXEC and MEMWATCH_NONBLOCK. */
static long try_create_flag_bit0(struct start *s)
{
	return memwatch_create(1);
}

FIXTURE_VARIANT_ADD(bad, create_flag_bit0) {
	.call = try_create_flag_bit0, .err = EINVAL, .watches_left = 1,
};

static long try_create_o_rdwr(struct start *s)
{
	return memwatch_create(O_RDWR);
}

FIXTURE_VARIANT_ADD(bad, create_o_rdwr) {
	.call = try_create_o_rdwr, .err = EINVAL, .watches_left = 1,
};

static long try_create_flag_bit31(struct start *s)
{
	return memwatch_create(1U << 31);
}

FIXTURE_VARIANT_ADD(bad, create_flag_bit31) {
	.call = try_create_flag_bit31, .err = EINVAL, .watches_left = 1,
};

/* MEMWATCH_IOC_ADD: the range, the mask, the must-be-zero fields. */
static long try_add_len_zero(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.len = 0;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_len_zero) {
	.call = try_add_len_zero, .err = EINVAL, .watches_left = 1,
};

static long try_add_addr_unaligned(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.addr += 1;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_addr_unaligned) {
	.call = try_add_addr_unaligned, .err = EINVAL, .watches_left = 1,
};

static long try_add_len_unaligned(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.len += 1;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_len_unaligned) {
	.call = try_add_len_unaligned, .err = EINVAL, .watches_left = 1,
};

static long try_add_range_wraps(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.addr = -(__u64)s->page;
	a.len = 2 * s->page;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_range_wraps) {
	.call = try_add_range_wraps, .err = EINVAL, .watches_left = 1,
};

static long try_add_len_2pow63(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.len = 1ULL << 63;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_len_2pow63) {
	.call = try_add_len_2pow63, .err = EINVAL, .watches_left = 1,
};

static long try_add_beyond_task_size(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.addr = 1ULL << 62;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_beyond_task_size) {
	.call = try_add_beyond_task_size, .err = EINVAL, .watches_left = 1,
};

static long try_add_unknown_reason(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.mask = 1U << 8;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_unknown_reason) {
	.call = try_add_unknown_reason, .err = EINVAL, .watches_left = 1,
};

static long try_add_mask_bit31(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.mask = 1U << 31;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_mask_bit31) {
	.call = try_add_mask_bit31, .err = EINVAL, .watches_left = 1,
};

static long try_add_flags(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.flags = 1;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_flags) {
	.call = try_add_flags, .err = EINVAL, .watches_left = 1,
};

static long try_add_reserved(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	a.reserved = 1;
	return add(s, a);
}

FIXTURE_VARIANT_ADD(bad, add_reserved) {
	.call = try_add_reserved, .err = EINVAL, .watches_left = 1,
};

static long try_add_arg_null(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_ADD, NULL);
}

FIXTURE_VARIANT_ADD(bad, add_arg_null) {
	.call = try_add_arg_null, .err = EFAULT, .watches_left = 1,
};

static long try_add_arg_kernel_address(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_ADD, (void *)-4096L);
}

FIXTURE_VARIANT_ADD(bad, add_arg_kernel_address) {
	.call = try_add_arg_kernel_address, .err = EFAULT, .watches_left = 1,
};

/* The id cannot be written back: no watch may stay behind. */
static long try_add_arg_read_only(struct start *s)
{
	struct memwatch_add a = add_arg(s);
	char *p = mmap(NULL, s->page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	long ret;

	if (p == MAP_FAILED)
		return 0;
	memcpy(p, &a, sizeof(a));
	mprotect(p, s->page, PROT_READ);
	ret = ioctl(s->fd, MEMWATCH_IOC_ADD, p);
	munmap(p, s->page);
	return ret;
}

FIXTURE_VARIANT_ADD(bad, add_arg_read_only) {
	.call = try_add_arg_read_only, .err = EFAULT, .watches_left = 1,
};

/* Another process (here a child) may not use the descriptor. */
static long try_add_from_another_mm(struct start *s)
{
	pid_t pid = fork();
	int status;

	if (!pid) {
		struct memwatch_add a = add_arg(s);

		_exit(ioctl(s->fd, MEMWATCH_IOC_ADD, &a) ? errno : 0);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return 0;
	errno = WEXITSTATUS(status);
	return errno ? -1 : 0;
}

FIXTURE_VARIANT_ADD(bad, add_from_another_mm) {
	.call = try_add_from_another_mm, .err = EPERM, .watches_left = 1,
};

/* MEMWATCH_IOC_REMOVE: ids that name no watch, flags. */
static long try_remove_unknown_id(struct start *s)
{
	struct memwatch_remove r = { .id = s->id + 1 };

	return ioctl(s->fd, MEMWATCH_IOC_REMOVE, &r);
}

FIXTURE_VARIANT_ADD(bad, remove_unknown_id) {
	.call = try_remove_unknown_id, .err = ENOENT, .watches_left = 1,
};

static long try_remove_id_u32_max(struct start *s)
{
	struct memwatch_remove r = { .id = UINT32_MAX };

	return ioctl(s->fd, MEMWATCH_IOC_REMOVE, &r);
}

FIXTURE_VARIANT_ADD(bad, remove_id_u32_max) {
	.call = try_remove_id_u32_max, .err = ENOENT, .watches_left = 1,
};

static long try_remove_flags(struct start *s)
{
	struct memwatch_remove r = { .id = s->id, .flags = 1 };

	return ioctl(s->fd, MEMWATCH_IOC_REMOVE, &r);
}

FIXTURE_VARIANT_ADD(bad, remove_flags) {
	.call = try_remove_flags, .err = EINVAL, .watches_left = 1,
};

static long try_remove_arg_null(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_REMOVE, NULL);
}

FIXTURE_VARIANT_ADD(bad, remove_arg_null) {
	.call = try_remove_arg_null, .err = EFAULT, .watches_left = 1,
};

static long try_remove_twice(struct start *s)
{
	struct memwatch_remove r = { .id = s->id };

	if (ioctl(s->fd, MEMWATCH_IOC_REMOVE, &r))
		return 0;
	return ioctl(s->fd, MEMWATCH_IOC_REMOVE, &r);
}

FIXTURE_VARIANT_ADD(bad, remove_twice) {
	.call = try_remove_twice, .err = ENOENT, .watches_left = 0,
};

/* MEMWATCH_IOC_STATS: where the answer goes. */
static long try_stats_arg_null(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_STATS, NULL);
}

FIXTURE_VARIANT_ADD(bad, stats_arg_null) {
	.call = try_stats_arg_null, .err = EFAULT, .watches_left = 1,
};

static long try_stats_arg_read_only(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_STATS, s->ro);
}

FIXTURE_VARIANT_ADD(bad, stats_arg_read_only) {
	.call = try_stats_arg_read_only, .err = EFAULT, .watches_left = 1,
};

/* MEMWATCH_IOC_SET_QUEUE: size bounds, flags, and only when empty. */
static long try_queue_size_zero(struct start *s)
{
	struct memwatch_queue q = { .size = 0 };

	return ioctl(s->fd, MEMWATCH_IOC_SET_QUEUE, &q);
}

FIXTURE_VARIANT_ADD(bad, queue_size_zero) {
	.call = try_queue_size_zero, .err = EINVAL, .watches_left = 1,
};

static long try_queue_size_above_max(struct start *s)
{
	struct memwatch_queue q = { .size = MEMWATCH_QUEUE_MAX + 1 };

	return ioctl(s->fd, MEMWATCH_IOC_SET_QUEUE, &q);
}

FIXTURE_VARIANT_ADD(bad, queue_size_above_max) {
	.call = try_queue_size_above_max, .err = EINVAL, .watches_left = 1,
};

static long try_queue_flags(struct start *s)
{
	struct memwatch_queue q = { .size = 8, .flags = 1 };

	return ioctl(s->fd, MEMWATCH_IOC_SET_QUEUE, &q);
}

FIXTURE_VARIANT_ADD(bad, queue_flags) {
	.call = try_queue_flags, .err = EINVAL, .watches_left = 1,
};

static long try_queue_arg_null(struct start *s)
{
	return ioctl(s->fd, MEMWATCH_IOC_SET_QUEUE, NULL);
}

FIXTURE_VARIANT_ADD(bad, queue_arg_null) {
	.call = try_queue_arg_null, .err = EFAULT, .watches_left = 1,
};

static long try_queue_not_empty(struct start *s)
{
	struct memwatch_queue q = { .size = 8 };

	if (queue_event(s))
		return 0;
	return ioctl(s->fd, MEMWATCH_IOC_SET_QUEUE, &q);
}

FIXTURE_VARIANT_ADD(bad, queue_not_empty) {
	.call = try_queue_not_empty, .err = EBUSY, .watches_left = 1,
};

/* ioctl numbers: unknown, another magic, a known number with another size. */
static long try_ioctl_unknown_nr(struct start *s)
{
	return ioctl(s->fd, _IO(MEMWATCH_IOC_MAGIC, 99));
}

FIXTURE_VARIANT_ADD(bad, ioctl_unknown_nr) {
	.call = try_ioctl_unknown_nr, .err = ENOTTY, .watches_left = 1,
};

static long try_ioctl_other_magic(struct start *s)
{
	return ioctl(s->fd, _IO(MEMWATCH_IOC_MAGIC + 1, 0));
}

FIXTURE_VARIANT_ADD(bad, ioctl_other_magic) {
	.call = try_ioctl_other_magic, .err = ENOTTY, .watches_left = 1,
};

static long try_ioctl_add_wrong_size(struct start *s)
{
	struct memwatch_add a = add_arg(s);

	return ioctl(s->fd, _IOWR(MEMWATCH_IOC_MAGIC, 0, __u64), &a);
}

FIXTURE_VARIANT_ADD(bad, ioctl_add_wrong_size) {
	.call = try_ioctl_add_wrong_size, .err = ENOTTY, .watches_left = 1,
};

static long try_ioctl_fionread(struct start *s)
{
	int n;

	return ioctl(s->fd, FIONREAD, &n);
}

FIXTURE_VARIANT_ADD(bad, ioctl_fionread) {
	.call = try_ioctl_fionread, .err = ENOTTY, .watches_left = 1,
};

/* read(): room for a whole record, a valid buffer; non-blocking when empty. */
static long try_read_zero(struct start *s)
{
	struct memwatch_event e;

	return read(s->fd, &e, 0);
}

FIXTURE_VARIANT_ADD(bad, read_zero) {
	.call = try_read_zero, .err = EINVAL, .watches_left = 1,
};

static long try_read_short(struct start *s)
{
	struct memwatch_event e;

	return read(s->fd, &e, sizeof(e) - 1);
}

FIXTURE_VARIANT_ADD(bad, read_short) {
	.call = try_read_short, .err = EINVAL, .watches_left = 1,
};

static long try_read_empty_nonblocking(struct start *s)
{
	struct memwatch_event e;

	return read(s->fd, &e, sizeof(e));
}

FIXTURE_VARIANT_ADD(bad, read_empty_nonblocking) {
	.call = try_read_empty_nonblocking, .err = EAGAIN, .watches_left = 1,
};

static long try_read_buffer_unmapped(struct start *s)
{
	if (queue_event(s))
		return 0;
	return read(s->fd, s->none, sizeof(struct memwatch_event));
}

FIXTURE_VARIANT_ADD(bad, read_buffer_unmapped) {
	.call = try_read_buffer_unmapped, .err = EFAULT, .watches_left = 1,
};

static long try_read_buffer_read_only(struct start *s)
{
	if (queue_event(s))
		return 0;
	return read(s->fd, s->ro, sizeof(struct memwatch_event));
}

FIXTURE_VARIANT_ADD(bad, read_buffer_read_only) {
	.call = try_read_buffer_read_only, .err = EFAULT, .watches_left = 1,
};

/* The descriptor is read-only. */
static long try_write(struct start *s)
{
	char c = 0;

	return write(s->fd, &c, 1);
}

FIXTURE_VARIANT_ADD(bad, write) {
	.call = try_write, .err = EBADF, .watches_left = 1,
};

/* mmap(): read-only, from offset 0, no larger than the slot area. */
static long try_mmap_shared_writable(struct start *s)
{
	return (long)mmap(NULL, s->page, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
}

FIXTURE_VARIANT_ADD(bad, mmap_shared_writable) {
	.call = try_mmap_shared_writable, .err = EACCES, .watches_left = 1,
};

static long try_mmap_private_writable(struct start *s)
{
	return (long)mmap(NULL, s->page, PROT_READ | PROT_WRITE, MAP_PRIVATE, s->fd, 0);
}

FIXTURE_VARIANT_ADD(bad, mmap_private_writable) {
	.call = try_mmap_private_writable, .err = EACCES, .watches_left = 1,
};

static long try_mmap_offset(struct start *s)
{
	return (long)mmap(NULL, s->page, PROT_READ, MAP_SHARED, s->fd, s->page);
}

FIXTURE_VARIANT_ADD(bad, mmap_offset) {
	.call = try_mmap_offset, .err = EINVAL, .watches_left = 1,
};

static long try_mmap_too_large(struct start *s)
{
	/* The header page and the slot pages, plus one. */
	size_t len = (1 + s->hdr->max_slots / (s->page / 8) + 1) * s->page;

	return (long)mmap(NULL, len, PROT_READ, MAP_SHARED, s->fd, 0);
}

FIXTURE_VARIANT_ADD(bad, mmap_too_large) {
	.call = try_mmap_too_large, .err = EINVAL, .watches_left = 1,
};

static long try_mprotect_writable(struct start *s)
{
	return mprotect(s->hdr, s->page, PROT_READ | PROT_WRITE);
}

FIXTURE_VARIANT_ADD(bad, mprotect_writable) {
	.call = try_mprotect_writable, .err = EACCES, .watches_left = 1,
};

static long try_mremap_grow(struct start *s)
{
	return (long)mremap(s->hdr, s->page, 2 * s->page, MREMAP_MAYMOVE);
}

FIXTURE_VARIANT_ADD(bad, mremap_grow) {
	.call = try_mremap_grow, .err = EFAULT, .watches_left = 1,
};

TEST_HARNESS_MAIN
