// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Ways to drop a buffer's pages that no hook on the C library can see: the
// kernel's other doors to madvise(), as programs use them. Shared by
// stale_send (the middleware matrix), regcache_test and odpwatch bench
// cache's stale rows.
//   process_madvise(): madvise() through a pidfd, here on the process itself
//   io_uring's IORING_OP_MADVISE: madvise() as an asynchronous request
//   UFFDIO_MOVE: the pages moved to another range by userfaultfd, as a
//     compacting garbage collector moves them (the kernel refuses to move a
//     pinned page: EBUSY)
//   MAP_DROPPABLE: pages the kernel may drop under memory pressure; here
//     MADV_PAGEOUT stands for the pressure (a pinned page is never dropped)
// Each returns 0 or an errno; none needs more than the kernel's headers.
#pragma once

#include <fcntl.h>
#include <linux/io_uring.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <vector>

#ifndef MAP_DROPPABLE
#define MAP_DROPPABLE 0x08 // linux/mman.h, since 6.11; older C libraries lack it
#endif

namespace raw_free
{

// An fd, closed when it goes.
struct Fd {
	int fd;
	explicit Fd(int f) : fd(f) {}
	Fd(const Fd &) = delete;
	Fd &operator=(const Fd &) = delete;
	~Fd()
	{
		if (fd >= 0)
			close(fd);
	}
};

// A mapping, unmapped when it goes.
struct Mapping {
	void *p;
	size_t len;
	Mapping(int fd, size_t l, off_t off) : len(l)
	{
		p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, off);
	}
	Mapping(const Mapping &) = delete;
	Mapping &operator=(const Mapping &) = delete;
	~Mapping()
	{
		if (p != MAP_FAILED)
			munmap(p, len);
	}
	template <typename T> T *at(uint32_t offset) const
	{
		return reinterpret_cast<T *>(static_cast<char *>(p) + offset);
	}
};

inline int process_madvise_self(void *p, size_t len, int advice)
{
	Fd pidfd(int(syscall(SYS_pidfd_open, getpid(), 0)));
	if (pidfd.fd < 0)
		return errno;
	iovec iov{p, len};
	long done = syscall(SYS_process_madvise, pidfd.fd, &iov, 1, advice, 0);
	if (done < 0)
		return errno;
	return size_t(done) == len ? 0 : EAGAIN;
}

// One IORING_OP_MADVISE on a ring of its own, waited for (io_uring hands
// it to a worker thread: the wait goes on through signals until it is done).
inline int madvise_by_io_uring(void *p, size_t len, int advice)
{
	if (len > UINT32_MAX)
		return EINVAL; // the request's length field is 32 bits
	io_uring_params params{};
	Fd ring(int(syscall(SYS_io_uring_setup, 1, &params)));
	if (ring.fd < 0)
		return errno;
	Mapping sq(ring.fd, params.sq_off.array + params.sq_entries * sizeof(uint32_t),
		   IORING_OFF_SQ_RING);
	Mapping cq(ring.fd, params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe),
		   IORING_OFF_CQ_RING);
	Mapping sqes(ring.fd, params.sq_entries * sizeof(io_uring_sqe), IORING_OFF_SQES);
	if (sq.p == MAP_FAILED || cq.p == MAP_FAILED || sqes.p == MAP_FAILED)
		return errno;
	io_uring_sqe *sqe = sqes.at<io_uring_sqe>(0);
	*sqe = io_uring_sqe{};
	sqe->opcode = IORING_OP_MADVISE;
	sqe->addr = reinterpret_cast<uintptr_t>(p);
	sqe->len = uint32_t(len);
	sqe->fadvise_advice = uint32_t(advice);
	uint32_t *sq_tail = sq.at<uint32_t>(params.sq_off.tail);
	uint32_t tail = *sq_tail;
	sq.at<uint32_t>(params.sq_off.array)[tail & *sq.at<uint32_t>(params.sq_off.ring_mask)] = 0;
	std::atomic_ref<uint32_t>(*sq_tail).store(tail + 1, std::memory_order_release);
	uint32_t *cq_head = cq.at<uint32_t>(params.cq_off.head);
	const uint32_t head = *cq_head;
	auto done = [&] {
		return head != std::atomic_ref<uint32_t>(*cq.at<uint32_t>(params.cq_off.tail))
				       .load(std::memory_order_acquire);
	};
	for (unsigned submit = 1; !done(); submit = 0)
		if (syscall(SYS_io_uring_enter, ring.fd, submit, 1, IORING_ENTER_GETEVENTS, nullptr,
			    0) < 0 &&
		    errno != EINTR)
			return errno; // (nothing submitted: a failed submit leaves no work)
	const io_uring_cqe &cqe = cq.at<io_uring_cqe>(
		params.cq_off.cqes)[head & *cq.at<uint32_t>(params.cq_off.ring_mask)];
	int res = cqe.res;
	std::atomic_ref<uint32_t>(*cq_head).store(head + 1, std::memory_order_release);
	return res < 0 ? -res : 0;
}

// Moves @len bytes of pages at @p to a scratch range, then drops that
// range: @p is left without pages, new ones on the next touch. EBUSY when
// the kernel moved nothing because the first page is pinned (by an RDMA
// registration, for one) or otherwise not movable (a large folio, a page
// shared with another process); a move that stopped part-way counts as
// done (some pages are new). EOPNOTSUPP on a kernel without UFFDIO_MOVE.
inline int move_away_by_uffd(void *p, size_t len)
{
	Fd uffd(int(syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY)));
	if (uffd.fd < 0)
		return errno;
	uffdio_api api{UFFD_API, UFFD_FEATURE_MOVE, 0};
	if (ioctl(uffd.fd, UFFDIO_API, &api))
		return errno == EINVAL ? EOPNOTSUPP : errno; // an unknown feature
	if (!(api.features & UFFD_FEATURE_MOVE))
		return EOPNOTSUPP;
	void *dst = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dst == MAP_FAILED)
		return errno;
	uffdio_register reg{{uintptr_t(dst), len}, UFFDIO_REGISTER_MODE_MISSING, 0};
	uffdio_move move{uintptr_t(dst), uintptr_t(p), len, UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES, 0};
	int err = 0;
	if (ioctl(uffd.fd, UFFDIO_REGISTER, &reg))
		err = errno;
	else if (ioctl(uffd.fd, UFFDIO_MOVE, &move))
		err = errno == EBUSY && move.move > 0 ? 0 : errno;
	munmap(dst, len);
	return err;
}

// An anonymous mapping at @where whose pages the kernel may drop.
inline void *map_droppable(void *where, size_t len)
{
	return mmap(where, len, PROT_READ | PROT_WRITE,
		    MAP_DROPPABLE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
}

// Reclaims @len bytes at @p of a droppable mapping (process_madvise with
// MADV_PAGEOUT: no hook on madvise() sees it either): the pages not pinned
// are dropped. Sets @dropped to whether any page went (reclaim is best
// effort: a page on another CPU's LRU batch may stay; a pinned buffer loses
// none), asking twice before it says none.
inline int drop_droppable(void *p, size_t len, bool &dropped)
{
	const size_t page = size_t(sysconf(_SC_PAGESIZE)), pages = (len + page - 1) / page;
	std::vector<unsigned char> resident(pages);
	dropped = false;
	for (int attempt = 0; attempt < 2 && !dropped; attempt++) {
		if (int e = process_madvise_self(p, len, MADV_PAGEOUT))
			return e;
		if (mincore(p, len, resident.data()))
			return errno;
		for (unsigned char r : resident)
			dropped |= !(r & 1);
	}
	return 0;
}

} // namespace raw_free
