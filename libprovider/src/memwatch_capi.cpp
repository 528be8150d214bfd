// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// odpwatch/memwatch.h: the memwatch client as a C ABI, for caches written in
// C (an MPI library, libfabric). Memwatch does the work; this file turns its
// exceptions into negative errno values.
#include "c_abi.hpp"
#include "memwatch.hpp"

#include <odpwatch/memwatch.h>

#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

static_assert(ODPWATCH_MEMWATCH_UNMAP == MEMWATCH_UNMAP &&
	      ODPWATCH_MEMWATCH_CLEAR == MEMWATCH_CLEAR &&
	      ODPWATCH_MEMWATCH_PROTECTION == MEMWATCH_PROTECTION &&
	      ODPWATCH_MEMWATCH_PROTECTION_PAGE == MEMWATCH_PROTECTION_PAGE &&
	      ODPWATCH_MEMWATCH_SOFT_DIRTY == MEMWATCH_SOFT_DIRTY &&
	      ODPWATCH_MEMWATCH_RELEASE == MEMWATCH_RELEASE &&
	      ODPWATCH_MEMWATCH_MIGRATE == MEMWATCH_MIGRATE &&
	      ODPWATCH_MEMWATCH_EXCLUSIVE == MEMWATCH_EXCLUSIVE &&
	      ODPWATCH_MEMWATCH_DEFAULT_REASONS == MEMWATCH_DEFAULT_MASK &&
	      ODPWATCH_MEMWATCH_EVENT_COALESCED == MEMWATCH_EVENT_COALESCED);
// Events are read straight into the caller's array.
static_assert(sizeof(odpwatch_memwatch_event) == sizeof(memwatch_event) &&
	      offsetof(odpwatch_memwatch_event, cookie) == offsetof(memwatch_event, cookie) &&
	      offsetof(odpwatch_memwatch_event, start) == offsetof(memwatch_event, start) &&
	      offsetof(odpwatch_memwatch_event, end) == offsetof(memwatch_event, end) &&
	      offsetof(odpwatch_memwatch_event, id) == offsetof(memwatch_event, id) &&
	      offsetof(odpwatch_memwatch_event, reasons) == offsetof(memwatch_event, reasons) &&
	      offsetof(odpwatch_memwatch_event, flags) == offsetof(memwatch_event, flags));

struct odpwatch_memwatch {
	odpwatch::Memwatch mw;
	bool nonblock;
};

namespace
{
uintptr_t page_size()
{
	static const uintptr_t page = sysconf(_SC_PAGESIZE);
	return page;
}
} // namespace

extern "C" {

int odpwatch_memwatch_create(uint32_t flags, uint32_t queue_size, struct odpwatch_memwatch **mw)
{
	if (!mw || (flags & ~ODPWATCH_MEMWATCH_NONBLOCK))
		return -EINVAL;
	return odpwatch::c_abi_guarded([&] {
		auto *m = new odpwatch_memwatch{odpwatch::Memwatch(),
						bool(flags & ODPWATCH_MEMWATCH_NONBLOCK)};
		if (queue_size) {
			memwatch_queue q{};
			q.size = queue_size;
			if (ioctl(m->mw.fd(), MEMWATCH_IOC_SET_QUEUE, &q)) {
				const int err = errno;
				delete m;
				return -err;
			}
		}
		*mw = m;
		return 0;
	});
}

int odpwatch_memwatch_destroy(struct odpwatch_memwatch *mw)
{
	if (!mw)
		return -EINVAL;
	delete mw;
	return 0;
}

int odpwatch_memwatch_fd(const struct odpwatch_memwatch *mw)
{
	return mw ? mw->mw.fd() : -EINVAL;
}

int odpwatch_memwatch_add(struct odpwatch_memwatch *mw, const void *addr, size_t length,
			  uint64_t cookie, uint32_t reasons, struct odpwatch_memwatch_range *range)
{
	const uintptr_t a = reinterpret_cast<uintptr_t>(addr), page = page_size();
	if (!mw || !range || !length || a + length < a)
		return -EINVAL;
	// The pages holding the buffer: a cache passes its MR's range as it is.
	const uintptr_t start = a & ~(page - 1), end = (a + length + page - 1) & ~(page - 1);
	return odpwatch::c_abi_guarded([&] {
		auto w = mw->mw.add(reinterpret_cast<const void *>(start), end - start, cookie,
				    reasons);
		*range = odpwatch_memwatch_range{
			mw->mw.word(w.id), w.generation, w.id, 0, start, end};
		return 0;
	});
}

int odpwatch_memwatch_remove(struct odpwatch_memwatch *mw,
			     const struct odpwatch_memwatch_range *range)
{
	if (!mw || !range)
		return -EINVAL;
	return odpwatch::c_abi_guarded([&] {
		mw->mw.remove(range->id);
		return 0;
	});
}

ssize_t odpwatch_memwatch_read_events(struct odpwatch_memwatch *mw,
				      struct odpwatch_memwatch_event *events, size_t max_events)
{
	if (!mw || !events || !max_events)
		return -EINVAL;
	for (;;) {
		const ssize_t n = read(mw->mw.fd(), events, max_events * sizeof(*events));
		if (n >= 0)
			return n / ssize_t(sizeof(*events));
		if (errno != EAGAIN)
			return -errno;
		if (mw->nonblock)
			return 0;
		pollfd p{mw->mw.fd(), POLLIN, 0};
		if (poll(&p, 1, -1) < 0)
			return -errno;
	}
}

int odpwatch_memwatch_query(struct odpwatch_memwatch *mw, struct odpwatch_memwatch_stats *stats)
{
	if (!mw || !stats)
		return -EINVAL;
	memwatch_stats st{};
	if (ioctl(mw->mw.fd(), MEMWATCH_IOC_STATS, &st))
		return -errno;
	*stats = odpwatch_memwatch_stats{st.watches,
					 st.invalidations,
					 st.changes,
					 st.events_queued,
					 st.events_coalesced,
					 st.events_read,
					 st.events_dropped,
					 st.queue_size,
					 st.queue_used,
					 mw->mw.overflowed(),
					 0};
	return 0;
}

int odpwatch_memwatch_clear_overflow(struct odpwatch_memwatch *mw)
{
	if (!mw)
		return -EINVAL;
	return odpwatch::c_abi_guarded([&] {
		mw->mw.clear_overflow();
		return 0;
	});
}

int odpwatch_memwatch_set_wake_delay(struct odpwatch_memwatch *mw, uint32_t delay_us)
{
	if (!mw)
		return -EINVAL;
	const int rc = odpwatch::c_abi_guarded([&] {
		mw->mw.set_wake_delay(delay_us);
		return 0;
	});
	return rc == -ENOTTY ? -EOPNOTSUPP : rc; // a kernel before the ioctl
}

} // extern "C"
