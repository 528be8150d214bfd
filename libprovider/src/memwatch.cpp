// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "memwatch.hpp"
#include "verbs.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

// The number comes from the odpwatch kernel's installed uAPI headers (read
// by CMake: the C library's own kernel headers come first and may predate
// it), never from a literal here; -1 when built without them.
#if defined(__NR_memwatch_create) && ODPWATCH_NR_MEMWATCH_CREATE >= 0
static_assert(__NR_memwatch_create == ODPWATCH_NR_MEMWATCH_CREATE,
	      "the C library and the odpwatch kernel headers disagree");
#elif defined(__NR_memwatch_create) // the C library knows it: take its number
#undef ODPWATCH_NR_MEMWATCH_CREATE
#define ODPWATCH_NR_MEMWATCH_CREATE __NR_memwatch_create
#endif

namespace odpwatch
{

std::atomic<uint64_t> fork_count{0};

// At load, before any cache or monitor reads the count.
[[gnu::constructor]] static void count_forks()
{
	pthread_atfork(nullptr, nullptr, [] { fork_count++; });
}

bool Memwatch::supported()
{
	if (ODPWATCH_NR_MEMWATCH_CREATE < 0)
		return false;
	// The kernel publishes this limit exactly when it has memwatch. Without
	// /proc/sys (a container) the system call has to tell.
	if (access("/proc/sys/user", F_OK) == 0)
		return access("/proc/sys/user/max_memwatch_watches", F_OK) == 0;
	int fd = create_fd(MEMWATCH_CLOEXEC);
	if (fd < 0)
		return errno != ENOSYS; // refused (EPERM): the constructor says so
	// The number is ours, not upstream's: on a kernel that gave it to
	// another system call, what came back is no memwatch descriptor, and
	// maybe no descriptor of ours at all (it is not closed then).
	memwatch_stats st{};
	if (ioctl(fd, MEMWATCH_IOC_STATS, &st))
		return false;
	close(fd);
	return true;
}

int Memwatch::create_fd(unsigned flags)
{
	if (ODPWATCH_NR_MEMWATCH_CREATE < 0) { // built without the number
		errno = ENOSYS;
		return -1;
	}
	return static_cast<int>(syscall(ODPWATCH_NR_MEMWATCH_CREATE, flags));
}

Memwatch::Memwatch(size_t max_watches, unsigned flags)
{
	if (!supported())
		throw verbs::Error("memwatch: this kernel has none", EOPNOTSUPP);
	fd_ = create_fd(flags | MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
	if (fd_ < 0) // ENOSYS: a number the kernel does not know (seccomp)
		throw verbs::Error("memwatch_create", errno == ENOSYS ? EOPNOTSUPP : errno);
	const size_t page = sysconf(_SC_PAGESIZE);
	// The header says where the words start and how many there can be.
	void *first = mmap(nullptr, page, PROT_READ, MAP_SHARED, fd_, 0);
	if (first == MAP_FAILED) {
		int err = errno;
		close(fd_);
		throw verbs::Error("mmap of the memwatch state area", err);
	}
	const memwatch_header hdr = *static_cast<const memwatch_header *>(first);
	munmap(first, page);
	// Features are tested by bit; a layout this library does not know is
	// refused, not guessed at.
	if (hdr.abi_version != MEMWATCH_ABI_VERSION || hdr.header_size < sizeof(memwatch_header)) {
		close(fd_);
		throw verbs::Error("memwatch: state area of an unknown layout", EPROTO);
	}
	slots_ = max_watches ? std::min<size_t>(max_watches, hdr.max_slots) : hdr.max_slots;
	area_len_ = (hdr.slots_offset + slots_ * sizeof(uint64_t) + page - 1) / page * page;
	area_ = mmap(nullptr, area_len_, PROT_READ, MAP_SHARED, fd_, 0);
	if (area_ == MAP_FAILED) {
		int err = errno;
		close(fd_);
		throw verbs::Error("mmap of the memwatch state area", err);
	}
	hdr_ = static_cast<const memwatch_header *>(area_);
	words_ = reinterpret_cast<const uint64_t *>(static_cast<const char *>(area_) +
						    hdr.slots_offset);
}

void Memwatch::clear_overflow()
{
	if (ioctl(fd_, MEMWATCH_IOC_CLEAR_OVERFLOW))
		throw verbs::Error("MEMWATCH_IOC_CLEAR_OVERFLOW", errno);
}

void Memwatch::set_wake_delay(uint32_t delay_us)
{
	if (!(hdr_->features & MEMWATCH_FEATURE_SET_WAKE))
		throw verbs::Error("MEMWATCH_IOC_SET_WAKE", EOPNOTSUPP);
	memwatch_wake w{};
	w.delay_us = delay_us;
	if (ioctl(fd_, MEMWATCH_IOC_SET_WAKE, &w))
		throw verbs::Error("MEMWATCH_IOC_SET_WAKE", errno);
}

Memwatch::~Memwatch()
{
	munmap(area_, area_len_);
	close(fd_);
}

Memwatch::Watch Memwatch::add(const void *addr, size_t len, uint64_t cookie, uint32_t mask)
{
	memwatch_add a{};
	a.addr = reinterpret_cast<uintptr_t>(addr);
	a.len = len;
	a.cookie = cookie;
	a.mask = mask;
	if (ioctl(fd_, MEMWATCH_IOC_ADD, &a))
		throw verbs::Error("MEMWATCH_IOC_ADD", errno);
	if (a.id >= slots_) {
		remove(a.id);
		throw verbs::Error("MEMWATCH_IOC_ADD (id beyond the mapped words)", ENOSPC);
	}
	return {a.id, a.generation};
}

void Memwatch::remove(uint32_t id)
{
	memwatch_remove r{};
	r.id = id;
	if (ioctl(fd_, MEMWATCH_IOC_REMOVE, &r))
		throw verbs::Error("MEMWATCH_IOC_REMOVE", errno);
}

std::optional<memwatch_event> Memwatch::next_event()
{
	// In a child of fork() the state area is not mapped (not inherited)
	// and what is buffered is the parent's: read(), which fails with EPERM.
	const bool mine = fork_generation() == fork_generation_;
	if (!mine)
		batch_len_ = batch_pos_ = 0;
	if (batch_pos_ < batch_len_)
		return batch_[batch_pos_++];
	// Loaded before the read: a change after it moves seq past it, so a
	// queue found empty (or read short) at @seq has no record older.
	const uint64_t seq = mine ? __atomic_load_n(&hdr_->seq, __ATOMIC_ACQUIRE) : ~uint64_t{0};
	if (mine && seq == drained_at_)
		return std::nullopt;
	ssize_t n = read(fd_, batch_.data(), sizeof(batch_));
	if (n < 0 && errno != EAGAIN)
		throw verbs::Error("read of memwatch events", errno);
	batch_len_ = n > 0 ? size_t(n) / sizeof(memwatch_event) : 0;
	batch_pos_ = 0;
	if (batch_len_ < batch_.size() && mine)
		drained_at_ = seq;
	if (!batch_len_)
		return std::nullopt;
	return batch_[batch_pos_++];
}

} // namespace odpwatch
