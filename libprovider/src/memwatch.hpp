// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// A memwatch descriptor and its read-only state area, owned RAII-style.
#pragma once

#include <linux/memwatch.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace odpwatch
{

// Bumped in every child of fork() (pthread_atfork, registered when the
// library loads): a memwatch descriptor, like a verbs context, made at one
// value belongs to another process's address space at any other. Inline:
// the cache checks it on every get and put.
extern std::atomic<uint64_t> fork_count;
inline uint64_t fork_generation() noexcept
{
	return fork_count.load(std::memory_order_relaxed);
}

class Memwatch
{
public:
	struct Watch {
		uint32_t id;
		uint64_t generation;
	};

	// Maps the state area for up to max_watches ids (0: all the kernel
	// allows; address space only, the kernel backs the words in use);
	// throws verbs::Error (EOPNOTSUPP when the kernel has no memwatch).
	explicit Memwatch(size_t max_watches = 0, unsigned flags = 0);
	// Whether the kernel has memwatch (it publishes
	// /proc/sys/user/max_memwatch_watches then).
	static bool supported();
	// The bare system call: a descriptor, or -1 with errno.
	static int create_fd(unsigned flags);
	Memwatch(const Memwatch &) = delete;
	Memwatch &operator=(const Memwatch &) = delete;
	~Memwatch();

	// Throws verbs::Error; ENOSPC when the id lies beyond the mapped area.
	Watch add(const void *addr, size_t len, uint64_t cookie, uint32_t mask = 0);
	void remove(uint32_t id);
	// The whole fast path: one acquire load and a compare.
	bool valid(const Watch &w) const noexcept
	{
		return __atomic_load_n(&words_[w.id], __ATOMIC_ACQUIRE) == w.generation;
	}
	// The next event, if one is queued (the descriptor is non-blocking).
	// Read in batches, and not at all while the header's seq says nothing
	// changed since the queue was last found empty: a caller that drains
	// on every miss pays no system call when there is nothing, and one
	// per batch when there is. One reader at a time.
	std::optional<memwatch_event> next_event();
	// Events were dropped (a full queue): check every watch, then clear.
	// The header's seq, bumped (after the word, before the record is
	// readable) by every change reported to any watch: a reader that finds
	// it where it was after its last drain has nothing new to read. Not in
	// a child of fork() (the state area is not inherited).
	uint64_t seq() const noexcept { return __atomic_load_n(&hdr_->seq, __ATOMIC_ACQUIRE); }
	// Whether this object belongs to the calling process (not to the
	// parent of a fork() child).
	bool mine() const noexcept { return fork_generation() == fork_generation_; }
	bool overflowed() const noexcept
	{
		return __atomic_load_n(&hdr_->overflow, __ATOMIC_ACQUIRE) != 0;
	}
	void clear_overflow();
	// Wake pollers up to @delay_us after a change instead of at once (0),
	// so that a burst of unmaps costs one wake-up; the words and events
	// still change before each unmap returns. ENOTTY from an older kernel.
	void set_wake_delay(uint32_t delay_us);
	int fd() const noexcept { return fd_; }
	// The generation word of watch @id, in the shared state area.
	const uint64_t *word(uint32_t id) const noexcept { return &words_[id]; }

private:
	int fd_ = -1;
	void *area_ = nullptr;
	size_t area_len_ = 0;
	const memwatch_header *hdr_ = nullptr;
	const uint64_t *words_ = nullptr;
	size_t slots_ = 0;
	std::array<memwatch_event, 32> batch_{};
	size_t batch_len_ = 0, batch_pos_ = 0;
	uint64_t drained_at_ = ~uint64_t{0}; // seq when the queue was last found empty
	const uint64_t fork_generation_ = fork_generation();
};

} // namespace odpwatch
