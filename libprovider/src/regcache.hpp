// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration cache behind odpwatch/regcache.h.
#pragma once

#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <array>
#include <atomic>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace odpwatch
{

enum class Policy : int {
	Auto = ODPWATCH_CACHE_AUTO,
	ImplicitOdp = ODPWATCH_CACHE_IMPLICIT_ODP,
	ExplicitOdp = ODPWATCH_CACHE_EXPLICIT_ODP,
	Pinned = ODPWATCH_CACHE_PINNED,
};

class RegCache
{
public:
	struct Entry;
	// 0 takes the default, UINT64_MAX is no limit.
	struct Limits {
		uint64_t max_entries = 0;
		uint64_t max_bytes = 0;
	};
	static constexpr uint64_t default_max_entries = 1024; // as libfabric's cache
	// The ODP operations (IBV_ODP_SUPPORT_*) per transport an ODP policy
	// must serve; all 0: RC SEND, RECV, WRITE and READ.
	struct OdpNeeds {
		uint32_t rc = 0, uc = 0, ud = 0, xrc = 0;
	};

	RegCache(Policy policy, Limits limits, OdpNeeds needs);
	RegCache(const RegCache &) = delete;
	RegCache &operator=(const RegCache &) = delete;
	~RegCache();

	// A registration covering [addr, addr + len) with at least access, with
	// a reference taken for holder (see with_ref() in regcache.cpp).
	// Throws verbs::Error.
	Entry *get(ibv_pd *pd, const void *addr, size_t len, unsigned access, unsigned &holder);
	// Drops holder's reference (of e's life, unless any_life); false if it
	// holds none of this cache's e.
	static constexpr uint32_t any_life = UINT32_MAX;
	bool put(Entry *e, unsigned holder, uint32_t life);
	// Whether holder holds a reference to e in its life; e's life (for
	// handles).
	static bool holds(const Entry *e, unsigned holder, uint32_t life) noexcept;
	static uint32_t life(const Entry *e) noexcept;
	static ibv_mr *mr(const Entry *e) noexcept;

	Policy policy_of(ibv_pd *pd);
	odpwatch_cache_stats stats() const;
	bool in_use() const;
	// Waits until every dropped registration is deregistered.
	void flush();
	int event_fd() const;
	// Drops the entries memwatch reports changed; returns how many.
	size_t process_events();
	// False in a child of fork(): the registrations are the parent's.
	bool owned() const noexcept;

private:
	// Ordered by (pd, access, start): the entries of one pd and access are
	// a sorted run of ranges that never overlap.
	struct Key {
		ibv_pd *pd;
		unsigned access;
		uintptr_t start;
		uintptr_t end;
		auto operator<=>(const Key &) const = default;
		bool same_group(const Key &o) const { return pd == o.pd && access == o.access; }
	};
	// Entries to destroy once the lock is dropped, on every way out: see
	// reap(); @inline_ok false sends them all to the thread.
	class Graveyard
	{
	public:
		explicit Graveyard(RegCache &c, bool inline_ok = true) : c_(c), inline_(inline_ok)
		{
		}
		Graveyard(const Graveyard &) = delete;
		Graveyard &operator=(const Graveyard &) = delete;
		~Graveyard() { c_.reap(dead_, inline_); }
		void add(std::unique_ptr<Entry> e) { dead_.push_back(std::move(e)); }
		void reap_now() { c_.reap(dead_, inline_); }

	private:
		RegCache &c_;
		const bool inline_;
		std::vector<std::unique_ptr<Entry>> dead_;
	};

	Entry *lookup(const Key &k) const;
	Entry *containing(const Key &k) const;
	std::vector<Entry *> overlapping(const Key &k, Graveyard &dead);
	bool fresh(const Entry *e) const noexcept;
	Policy resolve(ibv_pd *pd);
	std::unique_ptr<Entry> make_entry(const Key &k, Policy policy, bool may_go_unwatched);
	std::unique_ptr<Entry> register_range(const Key &k, Policy policy, bool may_go_unwatched,
					      Graveyard &dead);
	void insert(std::unique_ptr<Entry> e, bool index = true);
	void invalidate(Entry *e, Graveyard &dead);
	bool drop_if_stale(Entry *e, Graveyard &dead);
	static bool take_ref(Entry *e, unsigned &holder);
	Entry *take(Entry *e, unsigned &holder);
	struct PageIndex;
	PageIndex *page_index(ibv_pd *pd, unsigned access, bool make);
	void index_pages(Entry *e, bool on);
	Entry *indexed(ibv_pd *pd, uintptr_t a, uintptr_t end, unsigned access, unsigned &holder);
	Entry *check_hit(Entry *e, ibv_pd *pd, uintptr_t a, uintptr_t end, unsigned access,
			 unsigned &holder);
	struct Recent;
	static Recent &recent(uintptr_t a);
	void remember(Entry *e, ibv_pd *pd, uintptr_t a, unsigned access);
	Entry *recall(ibv_pd *pd, uintptr_t a, uintptr_t end, unsigned access, unsigned &holder);
	void evict(Graveyard &dead);
	size_t process_events_locked(Graveyard &dead);
	void drain_if_due(uint64_t hits) noexcept;
	void drain_events() noexcept;
	// Deregisters e and keeps its memory as a shell for a later entry.
	void destroy(std::unique_ptr<Entry> e) noexcept;
	void shelve(std::unique_ptr<Entry> e) noexcept;
	Entry *take_shell();
	// Deregisters dead entries: here, as UCX's cache does, while that is
	// cheap (56 us for a 64 KiB MR on rxe under TCG), else on a thread, off
	// the callers' path: a large MR, or a kernel whose deregistration waits
	// for an RCU grace period (11 ms on rxe without its rcu_head fix).
	void reap(std::vector<std::unique_ptr<Entry>> &dead, bool inline_ok) noexcept;
	void reaper_loop(std::stop_token stop);

	const Policy policy_;
	const OdpNeeds needs_;
	const Limits limits_;
	const uint64_t fork_generation_;
	const uint64_t id_; // in the per-thread index
	mutable std::shared_mutex mu_;
	std::map<Key, std::unique_ptr<Entry>> entries_;
	// Every cached entry, oldest use first; a hit only sets the entry's
	// used bit, eviction gives such an entry a second chance (CLOCK).
	std::list<Entry *> lru_;
	std::unordered_map<Entry *, std::unique_ptr<Entry>> retired_; // stale, still referenced
	std::unordered_map<uint32_t, Entry *> by_watch_;
	std::map<ibv_pd *, Policy> pd_policy_;
	// The page index of each (pd, access) with ranged entries, for hits
	// without the lock: published by n_indexed_ (a group beyond these few
	// is not indexed and hits through the lock).
	struct Indexed {
		ibv_pd *pd = nullptr;
		unsigned access = 0;
		std::unique_ptr<PageIndex> pages;
	};
	std::array<Indexed, 8> indexed_;
	std::atomic<unsigned> n_indexed_{0};
	const unsigned page_shift_;
	std::unique_ptr<Memwatch> mw_;
	bool no_memwatch_ = false; // none in this kernel, or refused: exposed ODP is not kept
	std::atomic<bool> drain_pending_{false}; // a drain found the lock taken
	uint64_t bytes_ = 0;

	// What a deregistration in the caller's thread cost lately (in ns:
	// the last cheaper one, or an average of dearer ones) and the most it
	// may cost; while above, one reap in dereg_probe_every still
	// deregisters one there, to see whether it is cheap again. A call
	// deregisters for at most inline_dereg_budget_ns. Larger
	// registrations always go to the thread.
	static constexpr uint64_t inline_dereg_ns = 250'000;
	static constexpr uint64_t inline_dereg_budget_ns = 1'000'000;
	static constexpr unsigned dereg_probe_every = 64;
	static constexpr size_t inline_dereg_bytes = size_t{16} << 20;
	std::atomic<uint64_t> dereg_ns_{0};
	std::atomic<unsigned> reaps_{0};

	std::mutex reap_mu_;
	std::condition_variable_any reap_cv_;
	std::deque<std::unique_ptr<Entry>> reap_q_;
	size_t reaping_ = 0;  // being destroyed, here or taken off the queue
	std::jthread reaper_; // started with the first registration sent to it

	// Destroyed entries' memory, freed with the cache: an Entry pointer a
	// thread still holds (its hit index, a put racing an eviction) always
	// points to an Entry.
	std::mutex shells_mu_;
	Entry *shells_ = nullptr;

	std::atomic<bool> over_limit_{false};
	std::atomic<uint64_t> hits_{0}, misses_{0}, invalidations_{0}, evictions_{0};
	std::atomic<uint64_t> merged_{0}, retries_{0}, uncached_{0};
	std::atomic<uint64_t> registrations_{0}, deregistrations_{0}, deferred_{0};
};

} // namespace odpwatch
