// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration cache, and its C ABI (odpwatch/regcache.h).
//
// A hit of a range this thread got before takes no lock: a slot of the
// thread's index of recent hits, an atomic reference, for pinned entries one
// load of the memwatch word; other hits take the lock shared for a map
// lookup. A put takes no lock. Misses, invalidation and eviction take it
// exclusive; registration runs outside it, deregistration after it (in the
// caller while that is cheap, else on the cache's reaper thread). Entries' memory is never freed
// while the cache lives (see shelve()), which is what lets the lock-free paths read an entry that
// may just have left.
//
// Overlapping gets of one pd and access merge, as in UCX's ucs_rcache: the
// new registration covers their union and replaces the entries it overlaps,
// so no two cached MRs pin the same pages (each would be charged to
// RLIMIT_MEMLOCK) and a sliding window keeps one entry. libfabric purges the
// overlapped entries instead, which keeps each registration as small as its
// request but registers again for every shifted window.
#include "regcache.hpp"
#include "c_abi.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <limits>
#include <mutex>
#include <new>
#include <optional>

namespace odpwatch
{

namespace
{
constexpr uintptr_t no_end = std::numeric_limits<uintptr_t>::max();
// An entry's refs word (audit M4: a count alone cannot tell a second put
// of one get from another holder's put):
//  - bits 0-23, the count of references; no_refs: the entry is on its way
//    out of the cache, or a shell, and no new reference can be taken (see
//    RegCache::recall());
//  - bits 24-47, which handles of odpwatch_cache_get() hold one: a get sets
//    its bit and its put clears it in the same compare-exchange as the
//    count, so a handle costs the hit path nothing; more holders at once
//    hold untracked references (holder 0), counted only;
//  - bits 48-63, the life of the entry's memory, moved on when a shell is
//    reused: a handle carries it, and a put checks it in the same CAS.
constexpr uint64_t count_mask = (uint64_t{1} << 24) - 1;
constexpr uint64_t no_refs = count_mask;
constexpr unsigned holder_shift = 24, holder_bits = 24;
constexpr uint64_t holder_mask = ((uint64_t{1} << holder_bits) - 1) << holder_shift;
constexpr unsigned life_shift = 48;
constexpr uint64_t life_mask = ~uint64_t{0} << life_shift;
constexpr uint32_t any_life = RegCache::any_life;

uint64_t count_of(uint64_t r)
{
	return r & count_mask;
}

// r with one more reference; holder: the bit it holds + 1, the first free
// one from hint on, or 0 (untracked). False when r takes none (no_refs, or
// a count that would reach it).
bool with_ref(uint64_t &r, unsigned hint, unsigned &holder)
{
	if (count_of(r) >= no_refs - 1)
		return false;
	const uint64_t free = ~r & holder_mask;
	holder = 0;
	if (free) {
		const uint64_t above = free & (~uint64_t{0} << (holder_shift + hint));
		const unsigned b = unsigned(std::countr_zero(above ? above : free)) - holder_shift;
		holder = b + 1;
		r |= uint64_t{1} << (holder_shift + b);
	}
	r++;
	return true;
}

// Whether r holds a reference of holder (of life, unless any_life).
bool held(uint64_t r, unsigned holder, uint32_t life)
{
	if (!count_of(r) || count_of(r) == no_refs || holder > holder_bits)
		return false;
	if (life != any_life && (r >> life_shift) != life)
		return false;
	if (holder)
		return (r >> (holder_shift + holder - 1)) & 1;
	return count_of(r) > uint64_t(std::popcount(r & holder_mask)); // an untracked one
}

// r without the reference of holder.
uint64_t without_ref(uint64_t r, unsigned holder)
{
	if (holder)
		r &= ~(uint64_t{1} << (holder_shift + holder - 1));
	return r - 1;
}

// r's life with no reference, and with no_refs.
uint64_t unreferenced(uint64_t r)
{
	return r & life_mask;
}
uint64_t closed(uint64_t r)
{
	return (r & life_mask) | no_refs;
}

// Gives e no_refs if nobody holds it: then no new reference can be taken.
bool close_if_unreferenced(std::atomic<uint64_t> &refs)
{
	uint64_t unused = unreferenced(refs.load());
	return refs.compare_exchange_strong(unused, closed(unused));
}

// Tells caches apart in the per-thread index, also one made where a
// destroyed one was.
std::atomic<uint64_t> cache_ids{0};

RegCache::Limits resolve_limits(RegCache::Limits l)
{
	if (!l.max_entries)
		l.max_entries = RegCache::default_max_entries;
	if (!l.max_bytes)
		l.max_bytes = uint64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 4;
	return l;
}

uintptr_t page_size()
{
	static const uintptr_t page = sysconf(_SC_PAGESIZE);
	return page;
}
constexpr unsigned remote_access =
	IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// memwatch_create()'s answers that hold for the rest of the process: no
// memwatch in the kernel (EOPNOTSUPP), or refused to this process (EPERM:
// a seccomp filter, as container runtimes install, or the administrator's
// vm.unprivileged_memwatch). Anything else (out of descriptors, of memory)
// may pass: try again next time.
// EPROTO: a state area of a layout this library does not know.
bool memwatch_final(int err)
{
	return err == EOPNOTSUPP || err == EPERM || err == EPROTO;
}

// A registration asked for with remote access has its rkey handed to a
// peer: the peer must reach the pages asked for and no others, with the
// access asked for and no more, and only while they are the memory that was
// registered. So it is never a hit in a larger or more capable registration,
// never part of a union, and it is watched whatever its policy (an ODP MR
// follows the address to whatever is mapped there next).
bool exposed(unsigned access)
{
	return access & remote_access;
}

// An implicit ODP MR's rkey reaches every byte of the process: a peer given
// it could read or write anything. It serves local access only; a
// registration with remote access gets an explicit ODP MR of its own range.
Policy for_access(Policy pd_policy, unsigned access)
{
	if (pd_policy == Policy::ImplicitOdp && exposed(access))
		return Policy::ExplicitOdp;
	return pd_policy;
}

// How often a miss registers a union before it registers its own range
// alone: a neighbour that keeps changing must not keep it registering.
constexpr int max_union_passes = 3;

// How many lock-free hits may pass between two reads of memwatch's events.
constexpr uint64_t drain_every = 1024;
} // namespace

// Aligned so that a handle has the low bits for its holder bit.
struct alignas(64) RegCache::Entry {
	Entry *next_shell = nullptr;
	const RegCache *owner = nullptr; // an entry's memory serves one cache for life
	Key key;
	Policy policy;
	verbs::Mr mr;
	std::optional<Memwatch::Watch> watch;
	std::atomic<uint64_t> refs{0};	     // see count_mask
	std::atomic<uint8_t> next_holder{0}; // a hint: the bit to try first
	std::atomic<bool> used{false};	     // hit since eviction last looked
	std::atomic<bool> retired{false};    // out of the map, freed at the last put
	bool indexed = false;		     // in the page index (exclusive lock)
	std::list<Entry *>::iterator lru_pos;
	// What it pins: an implicit ODP MR covers everything and pins nothing.
	uint64_t bytes() const { return policy == Policy::ImplicitOdp ? 0 : key.end - key.start; }
};

RegCache::RegCache(Policy policy, Limits limits, OdpNeeds needs)
    : policy_(policy), needs_(needs), limits_(resolve_limits(limits)),
      fork_generation_(fork_generation()), id_(++cache_ids),
      page_shift_(unsigned(std::countr_zero(page_size())))
{
}

bool RegCache::owned() const noexcept
{
	return fork_generation_ == fork_generation();
}

RegCache::~RegCache()
{
	flush();
	reaper_ = std::jthread(); // stops and joins it
	for (auto &[k, e] : entries_)
		destroy(std::move(e));
	for (auto &[p, e] : retired_)
		destroy(std::move(e));
	while (Entry *e = shells_) {
		shells_ = e->next_shell;
		delete e;
	}
}

ibv_mr *RegCache::mr(const Entry *e) noexcept
{
	return e->mr.get();
}

bool RegCache::holds(const Entry *e, unsigned holder, uint32_t life) noexcept
{
	return held(e->refs.load(std::memory_order_relaxed), holder, life);
}

uint32_t RegCache::life(const Entry *e) noexcept
{
	return uint32_t(e->refs.load(std::memory_order_relaxed) >> life_shift);
}

bool RegCache::fresh(const Entry *e) const noexcept
{
	return !e->watch || mw_->valid(*e->watch);
}

// The entry of k's pd and access holding [k.start, k.end): the last one
// starting at or below k.start, as the group's ranges never overlap.
RegCache::Entry *RegCache::containing(const Key &k) const
{
	auto it = entries_.upper_bound(Key{k.pd, k.access, k.start, no_end});
	if (it == entries_.begin())
		return nullptr;
	--it;
	const Key &c = it->first;
	return c.same_group(k) && c.start <= k.start && c.end >= k.end ? it->second.get() : nullptr;
}

// An entry holding k's range with k's access, else with more access (one
// look per other access of the pd, a handful at most); for remote access,
// exactly k. Under mu_, either way.
RegCache::Entry *RegCache::lookup(const Key &k) const
{
	if (exposed(k.access)) {
		Entry *e = containing(k);
		return e && e->key == k ? e : nullptr;
	}
	if (Entry *e = containing(k))
		return e;
	for (auto it = entries_.lower_bound(Key{k.pd, 0, 0, 0});
	     it != entries_.end() && it->first.pd == k.pd;) {
		const unsigned a = it->first.access;
		if (a != k.access && (a & k.access) == k.access)
			if (Entry *e = containing(Key{k.pd, a, k.start, k.end}))
				return e;
		if (a == std::numeric_limits<unsigned>::max())
			break;
		it = entries_.lower_bound(Key{k.pd, a + 1, 0, 0});
	}
	return nullptr;
}

// The fresh entries of k's pd and access that overlap [k.start, k.end);
// stale ones met on the way are dropped. Exclusive lock held.
std::vector<RegCache::Entry *> RegCache::overlapping(const Key &k, Graveyard &dead)
{
	std::vector<Entry *> found;
	auto it = entries_.upper_bound(Key{k.pd, k.access, k.start, no_end});
	if (it != entries_.begin()) {
		auto prev = std::prev(it);
		if (prev->first.same_group(k) && prev->first.end > k.start)
			it = prev;
	}
	while (it != entries_.end() && it->first.same_group(k) && it->first.start < k.end) {
		Entry *e = it->second.get();
		++it; // before e may leave the map
		if (!drop_if_stale(e, dead))
			found.push_back(e);
	}
	return found;
}

Policy RegCache::resolve(ibv_pd *pd)
{
	{
		std::shared_lock lock(mu_);
		if (auto it = pd_policy_.find(pd); it != pd_policy_.end())
			return it->second;
	}
	odpwatch_odp_caps caps{};
	if (int rc = odpwatch_query_odp_caps(pd->context, &caps))
		throw verbs::Error("ibv_query_device_ex", -rc);
	OdpNeeds n = needs_;
	if (!n.rc && !n.uc && !n.ud && !n.xrc)
		n.rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
		       IBV_ODP_SUPPORT_READ;
	const bool odp = caps.supported && (caps.rc_caps & n.rc) == n.rc &&
			 (caps.uc_caps & n.uc) == n.uc && (caps.ud_caps & n.ud) == n.ud &&
			 (caps.xrc_caps & n.xrc) == n.xrc;
	Policy p = policy_;
	if (p == Policy::Auto)
		p = odp && caps.implicit ? Policy::ImplicitOdp
		    : odp		 ? Policy::ExplicitOdp
					 : Policy::Pinned;
	if ((p == Policy::ImplicitOdp && !(odp && caps.implicit)) ||
	    (p == Policy::ExplicitOdp && !odp))
		throw verbs::Error("the device's ODP capabilities for this cache policy",
				   EOPNOTSUPP);
	std::unique_lock lock(mu_);
	return pd_policy_.emplace(pd, p).first->second;
}

Policy RegCache::policy_of(ibv_pd *pd)
{
	return resolve(pd);
}

// Registers outside the lock. A watched range (pinned, or exposed with
// memwatch at hand) is watched first, so a change racing with the
// registration shows as a stale watch.
// @may_go_unwatched: a pinned registration of the range asked for may be
// made without a watch (to be used once); a union may not (get() then tries
// the range alone).
std::unique_ptr<RegCache::Entry> RegCache::make_entry(const Key &k, Policy policy,
						      bool may_go_unwatched)
{
	std::unique_ptr<Entry> e(take_shell());
	e->key = k;
	e->policy = policy;
	const size_t len = k.end - k.start;
	auto *addr = reinterpret_cast<void *>(k.start);
	try {
		switch (policy) {
		case Policy::ImplicitOdp:
			e->mr = verbs::reg_mr(k.pd, nullptr, SIZE_MAX,
					      k.access | IBV_ACCESS_ON_DEMAND);
			break;
		default:
			if (policy == Policy::Pinned && mw_) { // else uncached: see get()
				try {
					e->watch = mw_->add(addr, len,
							    reinterpret_cast<uintptr_t>(e.get()));
				} catch (const verbs::Error &err) {
					// Out of watches (ENOSPC), or the pages are
					// under vm.memwatch_max_overlap watches
					// (EMLINK): unwatched, used once.
					if (!may_go_unwatched ||
					    (err.err() != ENOSPC && err.err() != EMLINK))
						throw;
				}
			} else if (exposed(k.access) && mw_) {
				try {
					e->watch = mw_->add(addr, len,
							    reinterpret_cast<uintptr_t>(e.get()));
				} catch (const verbs::Error &) {
					// Unwatched (out of watches): used once.
				}
			}
			try {
				e->mr = verbs::reg_mr(k.pd, addr, len,
						      policy == Policy::ExplicitOdp
							      ? k.access | IBV_ACCESS_ON_DEMAND
							      : k.access);
			} catch (...) {
				if (e->watch)
					mw_->remove(e->watch->id);
				throw;
			}
			break;
		}
	} catch (...) {
		shelve(std::move(e));
		throw;
	}
	registrations_++;
	return e;
}

// make_entry(), and when the kernel refuses for memory (RLIMIT_MEMLOCK,
// ENOMEM; EAGAIN), again after making room, outside the lock. First room
// from the unused entries k overlaps (waiting for the deregistrations
// queued): a union is pinned beside the entries it replaces until it is
// in, and they would go once it is. When there are none, or that is not
// enough, every unused registration goes, as libfabric's cache does, and
// the last try. (Dropping all at once lost the cache a 41 MiB union of
// unrelated buffers each time an 87 MiB one grew: pin-forever memwatch's
// 130 MiB phase peaked at 89 MiB pinned.)
std::unique_ptr<RegCache::Entry> RegCache::register_range(const Key &k, Policy policy,
							  bool may_go_unwatched, Graveyard &dead)
{
	for (int round = 0;; round++) { // 0: what k replaces, 1: all unused, 2: give up
		try {
			return make_entry(k, policy, may_go_unwatched);
		} catch (const verbs::Error &e) {
			if ((e.err() != ENOMEM && e.err() != EAGAIN) || round == 2)
				throw;
		}
		{
			std::unique_lock lock(mu_);
			const uint64_t stale = invalidations_.load();
			std::vector<Entry *> victims;
			for (Entry *e : overlapping(k, dead)) // drops the stale ones itself
				if (round == 0 && !count_of(e->refs.load()))
					victims.push_back(e);
			// Referenced entries never go.
			if (round == 0 && victims.empty() && invalidations_.load() == stale)
				round = 1;
			if (round == 1)
				for (Entry *e : lru_)
					if (!count_of(e->refs.load()))
						victims.push_back(e);
			for (Entry *e : victims) {
				invalidate(e, dead);
				evictions_++;
			}
		}
		dead.reap_now();
		flush();
		retries_++;
	}
}

// A fresh entry into the cache, in use once (exclusive lock held); into
// the page index too if @index.
void RegCache::insert(std::unique_ptr<Entry> e, bool index)
{
	e->refs = unreferenced(e->refs.load()) | uint64_t{1} << holder_shift |
		  1; // the get's, holder 1
	e->next_holder.store(1, std::memory_order_relaxed);
	if (e->watch)
		by_watch_.emplace(e->watch->id, e.get());
	bytes_ += e->bytes();
	e->lru_pos = lru_.insert(lru_.end(), e.get());
	const Key k = e->key;
	if (index)
		index_pages(e.get(), true);
	entries_.emplace(k, std::move(e));
}

void RegCache::destroy(std::unique_ptr<Entry> e) noexcept
{
	if (!e)
		return;
	if (e->watch) {
		try {
			mw_->remove(e->watch->id);
		} catch (const verbs::Error &) {
			// Only a process that is not the memwatch's owner gets here.
		}
	}
	e->mr.reset();
	deregistrations_++;
	shelve(std::move(e));
}

// Keeps e's memory as a shell for a later entry: a pointer to it that a
// thread still holds (its index, a put racing an eviction)
// keeps pointing to an Entry, whose key and refs tell it apart (check_hit()).
void RegCache::shelve(std::unique_ptr<Entry> e) noexcept
{
	e->watch.reset();
	std::lock_guard lock(shells_mu_);
	e->next_shell = shells_;
	shells_ = e.release();
}

// An entry to fill: a shell of one destroyed before, else a new one.
RegCache::Entry *RegCache::take_shell()
{
	{
		std::lock_guard lock(shells_mu_);
		if (Entry *e = shells_) {
			shells_ = e->next_shell;
			// A new life, closed until insert(): see recall().
			e->refs = closed(e->refs.load() + (uint64_t{1} << life_shift));
			e->used = false;
			e->retired = false;
			e->indexed = false;
			return e;
		}
	}
	auto *e = new Entry;
	e->owner = this;
	return e;
}

void RegCache::reap(std::vector<std::unique_ptr<Entry>> &dead, bool inline_ok) noexcept
{
	if (dead.empty())
		return;
	// Small ones here while that has been cheap lately, up to a budget per
	// call, or one as a probe of whether it is cheap again; a large MR, an
	// implicit one (its children with it), and the rest to the thread.
	// Only a deregistration done here is timed: on the thread it shares
	// the CPU with the callers.
	if (inline_ok) {
		bool probe =
			dereg_ns_.load(std::memory_order_relaxed) >= inline_dereg_ns &&
			reaps_.fetch_add(1, std::memory_order_relaxed) % dereg_probe_every == 0;
		uint64_t spent = 0;
		size_t kept = 0;
		for (auto &e : dead) {
			const bool here = e->policy != Policy::ImplicitOdp &&
					  e->bytes() <= inline_dereg_bytes &&
					  spent < inline_dereg_budget_ns &&
					  (probe || dereg_ns_.load(std::memory_order_relaxed) <
							    inline_dereg_ns);
			if (!here) {
				dead[kept++] = std::move(e);
				continue;
			}
			probe = false;
			{
				std::lock_guard lock(reap_mu_);
				reaping_++; // flush() waits for it too
			}
			const auto t0 = std::chrono::steady_clock::now();
			destroy(std::move(e));
			const uint64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
						    std::chrono::steady_clock::now() - t0)
						    .count();
			spent += ns;
			// Down at once, up slowly: a deregistration is slow
			// for good (an RCU wait) or slowed by whatever else
			// shares the CPU. Racing threads lose a sample at worst.
			const uint64_t avg = dereg_ns_.load(std::memory_order_relaxed);
			dereg_ns_.store(!avg || ns < avg ? ns : (7 * avg + ns) / 8,
					std::memory_order_relaxed);
			{
				std::lock_guard lock(reap_mu_);
				reaping_--;
			}
			reap_cv_.notify_all();
		}
		dead.resize(kept);
		if (dead.empty())
			return;
	}
	try {
		std::lock_guard lock(reap_mu_);
		if (!reaper_.joinable())
			reaper_ = std::jthread([this](std::stop_token st) { reaper_loop(st); });
		for (auto &e : dead)
			reap_q_.push_back(std::move(e));
		deferred_ += dead.size();
	} catch (...) {
		// No thread (or no memory for the queue): deregister here.
		for (auto &e : dead)
			destroy(std::move(e));
	}
	dead.clear();
	reap_cv_.notify_all();
}

void RegCache::reaper_loop(std::stop_token stop)
{
	std::unique_lock lock(reap_mu_);
	for (;;) {
		reap_cv_.wait(lock, stop, [&] { return !reap_q_.empty(); });
		if (reap_q_.empty())
			return; // stop requested, nothing left
		std::deque<std::unique_ptr<Entry>> batch;
		batch.swap(reap_q_);
		reaping_ += batch.size();
		lock.unlock();
		for (auto &e : batch)
			destroy(std::move(e));
		lock.lock();
		reaping_ -= batch.size();
		reap_cv_.notify_all();
	}
}

void RegCache::flush()
{
	std::unique_lock lock(reap_mu_);
	reap_cv_.wait(lock, [&] { return reap_q_.empty() && reaping_ == 0; });
}

// Take e out of the cache (exclusive lock held): destroyed now if unused,
// at its last put otherwise.
void RegCache::invalidate(Entry *e, Graveyard &dead)
{
	auto it = entries_.find(e->key);
	auto owned = std::move(it->second);
	entries_.erase(it);
	index_pages(e, false);
	lru_.erase(e->lru_pos);
	bytes_ -= e->bytes();
	if (e->watch)
		by_watch_.erase(e->watch->id);
	// Marked before refs is read: a put() that takes refs to 0 after this
	// read sees the mark and frees the entry (put() takes no lock).
	e->retired = true;
	if (close_if_unreferenced(e->refs))
		dead.add(std::move(owned));
	else
		retired_.emplace(e, std::move(owned));
}

// Drop unused entries, least recently used first, until within the limits
// (exclusive lock held): the oldest entry goes unless it is referenced or
// was hit since, which sends it to the back with its used bit cleared. Each
// victim costs O(1) amortized; two rounds find none only when every entry is
// referenced, and referenced entries are never dropped: the cache may stay
// above its limits while they are in use.
void RegCache::evict(Graveyard &dead)
{
	auto over = [&] {
		return entries_.size() > limits_.max_entries || bytes_ > limits_.max_bytes;
	};
	for (size_t budget = 2 * lru_.size(); over() && budget; budget--) {
		Entry *e = lru_.front();
		if (count_of(e->refs.load()) || e->used.exchange(false)) {
			lru_.splice(lru_.end(), lru_, lru_.begin());
			continue;
		}
		invalidate(e, dead);
		evictions_++;
	}
	// Still over: the next put that frees an entry evicts again.
	over_limit_ = over();
}

// Under the exclusive lock: true if e was stale and is now out of the cache.
bool RegCache::drop_if_stale(Entry *e, Graveyard &dead)
{
	if (fresh(e))
		return false;
	invalidate(e, dead);
	invalidations_++;
	return true;
}

// A reference to e for a handle (holder: its bit + 1, or 0), unless e has
// no_refs (leaving the cache, or not in it yet).
bool RegCache::take_ref(Entry *e, unsigned &holder)
{
	const unsigned hint = e->next_holder.load(std::memory_order_relaxed);
	uint64_t refs = e->refs.load(), more;
	do {
		more = refs;
		if (!with_ref(more, hint, holder))
			return false;
	} while (!e->refs.compare_exchange_weak(refs, more));
	if (holder)
		e->next_holder.store(uint8_t(holder % holder_bits), std::memory_order_relaxed);
	return true;
}

// A hit: a reference and a use, under either lock.
RegCache::Entry *RegCache::take(Entry *e, unsigned &holder)
{
	if (!take_ref(e, holder)) // never no_refs in the map: 16M references
		throw verbs::Error("odpwatch_cache_get: references of one registration", EOVERFLOW);
	if (!e->used.load(std::memory_order_relaxed)) // no store on a hot entry
		e->used.store(true, std::memory_order_relaxed);
	hits_++;
	return e;
}

size_t RegCache::process_events_locked(Graveyard &dead)
{
	if (!mw_)
		return 0;
	size_t n = 0;
	while (auto ev = mw_->next_event())
		if (auto it = by_watch_.find(ev->id); it != by_watch_.end())
			n += drop_if_stale(it->second, dead);
	if (mw_->overflowed()) {
		// Events were lost, generation words never are: check them all.
		mw_->clear_overflow();
		std::vector<Entry *> all;
		for (auto &[id, e] : by_watch_)
			all.push_back(e);
		for (Entry *e : all)
			n += drop_if_stale(e, dead);
	}
	return n;
}

size_t RegCache::process_events()
{
	Graveyard dead(*this);
	std::unique_lock lock(mu_);
	return process_events_locked(dead);
}

// Which cached entry holds a page, for one pd and access: a radix tree of
// four levels of 512 slots over the page number, as a page table (48-bit
// addresses with 4 KiB pages; pages beyond are not indexed). A slot holds a
// child node, or an entry (bit 0 set) covering all of the slot's pages, so
// that a 130 MiB union takes about 65 slots of 2 MiB and up to 1024 of a
// page, not 33000. Written under the exclusive lock, at insert() and
// invalidate(); read with acquire loads and no lock. A node an entry's
// slot replaces goes to a free list, cleared, for a later part of the
// tree: nodes are freed with the cache only (a reader may still be in
// one), and there are never more than the tree needed at its largest.
// What a reader finds may have left the cache, be another entry's, or its
// memory may serve another entry by now: check_hit() tells; a slot that
// is missing or wrong costs a locked lookup, never a wrong answer.
struct RegCache::PageIndex {
	static constexpr unsigned bits = 9, levels = 4;
	static constexpr uintptr_t fanout = uintptr_t{1} << bits;
	static constexpr uintptr_t pages = uintptr_t{1} << (bits * levels);
	struct Node {
		std::array<std::atomic<uintptr_t>, fanout> slot{};
	};
	Node root;
	std::vector<std::unique_ptr<Node>> nodes; // all but the root
	std::vector<Node *> free;		  // of those, cleared ones not in the tree

	static constexpr uintptr_t span(unsigned level)
	{
		return uintptr_t{1} << (bits * (levels - 1 - level));
	}
	static uintptr_t leaf(Entry *e) { return reinterpret_cast<uintptr_t>(e) | 1; }
	static bool is_node(uintptr_t v) { return v && !(v & 1); }

	Entry *find(uintptr_t page) const noexcept
	{
		if (page >= pages)
			return nullptr;
		const Node *n = &root;
		for (unsigned l = 0;; l++) {
			const uintptr_t v =
				n->slot[(page / span(l)) % fanout].load(std::memory_order_acquire);
			if (v & 1)
				return reinterpret_cast<Entry *>(v & ~uintptr_t{1});
			if (!v || l == levels - 1)
				return nullptr;
			n = reinterpret_cast<const Node *>(v);
		}
	}

	Node *new_node()
	{
		if (free.empty()) {
			nodes.push_back(std::make_unique<Node>());
			free.push_back(nodes.back().get());
		}
		Node *n = free.back();
		free.pop_back();
		return n;
	}
	// Node n (of level l) and the nodes under it, cleared, to the free list.
	void drop(Node *n, unsigned l)
	{
		free.reserve(nodes.size()); // no allocation half-way
		for (std::atomic<uintptr_t> &slot : n->slot) {
			const uintptr_t v = slot.load(std::memory_order_relaxed);
			if (is_node(v) && l + 1 < levels)
				drop(reinterpret_cast<Node *>(v), l + 1);
			slot.store(0, std::memory_order_relaxed);
		}
		free.push_back(n);
	}

	// Pages [lo, hi) under node n (level l, first page base) to e, or
	// (on false) those that are e's to nothing.
	void mark(Node &n, unsigned l, uintptr_t base, uintptr_t lo, uintptr_t hi, Entry *e,
		  bool on)
	{
		const uintptr_t s = span(l);
		const uintptr_t first = (std::max(lo, base) - base) / s;
		const uintptr_t last = (std::min(hi, base + s * fanout) - base + s - 1) / s;
		for (uintptr_t i = first; i < last; i++) {
			const uintptr_t b = base + i * s;
			std::atomic<uintptr_t> &slot = n.slot[i];
			uintptr_t v = slot.load(std::memory_order_relaxed);
			if (lo <= b && b + s <= hi) { // all its pages
				if (on) {
					slot.store(leaf(e), std::memory_order_release);
					if (is_node(v)) // nothing else lives there
						drop(reinterpret_cast<Node *>(v), l + 1);
				} else if (v == leaf(e)) {
					slot.store(0, std::memory_order_relaxed);
				} else if (is_node(v)) {
					mark(*reinterpret_cast<Node *>(v), l + 1, b, lo, hi, e, on);
				}
				continue;
			}
			if (!is_node(v)) {
				// Part of its pages: a node under it. (Another
				// entry's pages there would overlap e's, which a
				// group's entries never do; forgetting them only
				// costs a lookup.)
				if (!on)
					continue;
				v = reinterpret_cast<uintptr_t>(new_node());
				slot.store(v, std::memory_order_release);
			}
			mark(*reinterpret_cast<Node *>(v), l + 1, b, lo, hi, e, on);
		}
	}
	void mark(uintptr_t lo, uintptr_t hi, Entry *e, bool on)
	{
		if (lo < pages)
			mark(root, 0, 0, lo, std::min(hi, pages), e, on);
	}
};

// The page index of pd and access; made (exclusive lock held) if @make
// and there is room for it. nullptr if none.
RegCache::PageIndex *RegCache::page_index(ibv_pd *pd, unsigned access, bool make)
{
	const unsigned n = n_indexed_.load(std::memory_order_acquire);
	for (unsigned i = 0; i < n; i++)
		if (indexed_[i].pd == pd && indexed_[i].access == access)
			return indexed_[i].pages.get();
	if (!make || n == indexed_.size())
		return nullptr;
	indexed_[n] = Indexed{pd, access, std::make_unique<PageIndex>()};
	n_indexed_.store(n + 1, std::memory_order_release);
	return indexed_[n].pages.get();
}

// Entry e's pages into its group's index, or out of it (exclusive lock
// held). An implicit ODP entry (all of the address space) is not indexed:
// the per-thread index serves it. Out of memory, e stays partly indexed or
// not at all: a page not indexed costs its hits the lock, no more (and its
// removal walks all of e's range, clearing only what is e's).
void RegCache::index_pages(Entry *e, bool on)
{
	if (e->policy == Policy::ImplicitOdp || e->indexed == on)
		return;
	e->indexed = on;
	try {
		if (PageIndex *pi = page_index(e->key.pd, e->key.access, on))
			pi->mark(e->key.start >> page_shift_, ((e->key.end - 1) >> page_shift_) + 1,
				 e, on);
	} catch (const std::bad_alloc &) {
	}
}

// A hit from the page index, with a reference taken; nullptr to look
// further. No lock: see PageIndex.
RegCache::Entry *RegCache::indexed(ibv_pd *pd, uintptr_t a, uintptr_t end, unsigned access,
				   unsigned &holder)
{
	const PageIndex *pi = page_index(pd, access, false);
	Entry *e = pi ? pi->find(a >> page_shift_) : nullptr;
	return e ? check_hit(e, pd, a, end, access, holder) : nullptr;
}

// e (from an index, without the lock) with a reference taken, if it is a
// cached, fresh entry of pd and access holding [a, end) (for remote
// access, exactly its pages); else nullptr, and no reference. A reference
// can only be taken while refs is not no_refs, which an entry gets before
// it leaves the cache unreferenced and keeps until insert() sets 1 in its
// next life; while it is held, the entry's key and watch stay.
RegCache::Entry *RegCache::check_hit(Entry *e, ibv_pd *pd, uintptr_t a, uintptr_t end,
				     unsigned access, unsigned &holder)
{
	if (!take_ref(e, holder))
		return nullptr;
	const Key &k = e->key;
	// With local access only, an entry with more access will do, as in
	// lookup() (the per-thread index keeps those too).
	const bool access_ok = exposed(access) ? k.access == access : (k.access & access) == access;
	bool ok = !e->retired.load() && k.pd == pd && access_ok && k.start <= a && end <= k.end;
	if (ok && exposed(access)) { // only the pages asked for
		const uintptr_t page = uintptr_t{1} << page_shift_;
		ok = (a & ~(page - 1)) == k.start && ((end + page - 1) & ~(page - 1)) == k.end;
	}
	if (!ok || !fresh(e)) {
		put(e, holder, any_life);
		return nullptr;
	}
	if (!e->used.load(std::memory_order_relaxed))
		e->used.store(true, std::memory_order_relaxed);
	drain_if_due(++hits_);
	return e;
}

// This thread's index of its recent hits: the entry that served a get of
// (pd, access) at an address, by a hash of the address's page. It saves the
// lock and the map walk of a hit; every use checks the entry still holds
// the range, cached and fresh, after it took its reference (check_hit()), so
// a stale index slot costs a slow lookup, never a wrong answer.
struct RegCache::Recent {
	uint64_t cache = 0; // id_ of the cache; 0: empty
	ibv_pd *pd = nullptr;
	unsigned access = 0;
	uintptr_t start = 0, end = 0; // the entry's range
	Entry *e = nullptr;
};

RegCache::Recent &RegCache::recent(uintptr_t a)
{
	// Page number modulo a prime: buffers a power of two apart, as
	// allocators place them, never share a slot (a multiplicative hash
	// put 64 buffers 4 MiB apart in 29 slots).
	// A pointer in thread-local storage (the default model: the library
	// may be dlopen()ed, as MPI components are, where initial-exec TLS
	// can fail to load), to slots made at a thread's first get and freed
	// at its exit. A get from a destructor that runs after that (another
	// thread_local's, a pthread key's) uses one slot that lives as long as
	// the thread: no index, but no freed memory either.
	struct Slots {
		std::array<Recent, 127> slot;
	};
	struct State {
		Slots *slots;
		bool gone;
	};
	// Trivially destructible: usable until the thread's end.
	static thread_local State state{nullptr, false};
	static thread_local Recent last_resort;
	struct Reaper {
		~Reaper()
		{
			delete state.slots;
			state = {nullptr, true};
		}
	};
	if (!state.slots) [[unlikely]] {
		if (state.gone)
			return last_resort;
		state.slots = new Slots;
		// Made here, so registered for the thread's exit after every
		// thread_local made before its first get: it runs first.
		static thread_local Reaper reaper;
		static_cast<void>(reaper);
	}
	return state.slots->slot[(a >> 12) % state.slots->slot.size()];
}

void RegCache::remember(Entry *e, ibv_pd *pd, uintptr_t a, unsigned access)
{
	recent(a) = Recent{id_, pd, access, e->key.start, e->key.end, e};
}

// A hit from this thread's index, with a reference taken; nullptr to look
// it up. Lock-free, as indexed().
RegCache::Entry *RegCache::recall(ibv_pd *pd, uintptr_t a, uintptr_t end, unsigned access,
				  unsigned &holder)
{
	Recent &r = recent(a);
	if (r.cache != id_ || r.pd != pd || r.access != access || a < r.start || end > r.end)
		return nullptr;
	Entry *e = check_hit(r.e, pd, a, end, access, holder);
	if (!e)
		r.cache = 0;
	return e;
}

// Only a miss reads memwatch's events: in a phase of lock-free hits, memory
// the application freed would stay pinned (and charged to RLIMIT_MEMLOCK)
// until the next miss. So every drain_every-th hit drops what was freed
// meanwhile, unless another thread holds the lock (it may be doing so).
// Called after a hit, with the hit count it reached.
void RegCache::drain_if_due(uint64_t hits) noexcept
{
	if (hits % drain_every == 0 || drain_pending_.load(std::memory_order_relaxed))
		drain_events();
}

void RegCache::drain_events() noexcept
{
	try {
		// Destroys after the lock is gone, on the thread: a hit does
		// not deregister.
		Graveyard dead(*this, false);
		std::unique_lock lock(mu_, std::try_to_lock);
		// Busy: the next hit tries again.
		drain_pending_.store(!lock.owns_lock(), std::memory_order_relaxed);
		if (lock.owns_lock())
			process_events_locked(dead);
	} catch (...) {
		// The next miss reads them, and reports what failed.
	}
}

RegCache::Entry *RegCache::get(ibv_pd *pd, const void *addr, size_t len, unsigned access,
			       unsigned &holder)
{
	const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
	if (!pd || !len || a + len < a)
		throw verbs::Error("odpwatch_cache_get", EINVAL);
	// The hit path: the page index, then this thread's index of its
	// recent hits (implicit ODP), without a lock; else one shared section
	// for the PD's policy and the entry.
	if (Entry *e = indexed(pd, a, a + len, access, holder))
		return e;
	if (Entry *e = recall(pd, a, a + len, access, holder))
		return e;
	const uintptr_t page = page_size();
	auto key_for = [&](Policy p) {
		if (p == Policy::ImplicitOdp)
			return Key{pd, access, 0, no_end};
		return Key{pd, access, a & ~(page - 1), (a + len + page - 1) & ~(page - 1)};
	};

	Entry *hit = nullptr;
	{
		std::shared_lock lock(mu_);
		if (auto it = pd_policy_.find(pd); it != pd_policy_.end())
			if (Entry *e = lookup(key_for(for_access(it->second, access)));
			    e && fresh(e)) {
				remember(e, pd, a, access);
				hit = take(e, holder);
			}
	}
	if (hit) {
		drain_if_due(hits_.load(std::memory_order_relaxed));
		return hit;
	}
	const Policy policy = for_access(resolve(pd), access);
	const Key k = key_for(policy);

	// A miss registers the union of k and the entries it overlaps (outside
	// the lock), then checks again: an entry holding k may have appeared,
	// or new overlapping ones, or the mapping may have changed meanwhile.
	Graveyard dead(*this); // declared first: destroys after the lock is gone
	std::unique_ptr<Entry> fresh_entry;
	Key want = k;
	// Cleared when the union cannot be registered (a neighbour's pages went
	// away meanwhile) or was registered max_union_passes times: then k alone
	// replaces what it overlaps (a purge). Never set for remote access.
	bool merge = !exposed(access);
	int passes = 0;
	uint64_t stale_seen = invalidations_.load();
	try {
		for (;;) {
			{
				std::unique_lock lock(mu_);
				process_events_locked(dead);
				Entry *e = lookup(k);
				if (e && drop_if_stale(e, dead))
					e = nullptr;
				if (e) {
					if (fresh_entry)
						dead.add(std::move(fresh_entry));
					// Another thread registered it meanwhile.
					return take(e, holder);
				}
				// The union so far and what overlaps it now. An
				// entry found stale since (by these lookups, the
				// events just read, or another thread) may have
				// been part of it: then from k again, so that its
				// range is not registered anew.
				Key u = want;
				auto over = overlapping(u, dead);
				if (invalidations_.load() != stale_seen) {
					u = k;
					over = overlapping(k, dead);
				}
				stale_seen = invalidations_.load();
				if (merge)
					for (Entry *o : over) {
						u.start = std::min(u.start, o->key.start);
						u.end = std::max(u.end, o->key.end);
					}
				// A fresh registration holding u will do: its
				// memory did not change while it registered, even
				// where a neighbour was dropped meanwhile (evicted
				// for RLIMIT_MEMLOCK, as register_range() does).
				if (fresh_entry && fresh_entry->key.start <= u.start &&
				    fresh_entry->key.end >= u.end && fresh(fresh_entry.get())) {
					Entry *result = fresh_entry.get();
					// Unwatched, it is used once: it replaces
					// no cached entry and takes no room.
					const bool once =
						(exposed(access) || policy == Policy::Pinned) &&
						!result->watch;
					if (!once) // the new entry covers these
						for (Entry *o : overlapping(result->key, dead)) {
							invalidate(o, dead);
							merged_++;
						}
					// (Not in the page index: nobody else may
					// take it.)
					insert(std::move(fresh_entry), !once);
					holder = 1;
					misses_++;
					if (once) {
						if (policy == Policy::Pinned && !mw_)
							uncached_++; // AUTO, no memwatch
						invalidate(result, dead);
					} else {
						evict(dead);
						remember(result, pd, a, access);
					}
					return result;
				}
				if (!mw_ && policy == Policy::Pinned) {
					if (!no_memwatch_) {
						try {
							mw_ = std::make_unique<Memwatch>();
						} catch (const verbs::Error &e) {
							no_memwatch_ = memwatch_final(e.err());
							if (!no_memwatch_)
								throw verbs::Error("memwatch",
										   e.err());
						}
					}
					// Without memwatch a pinned registration cannot
					// be kept. Asked for by name, the pinned policy
					// fails; AUTO (no ODP either) registers each get
					// on its own, deregistered at its put: uncached,
					// but correct.
					if (!mw_ && policy_ != Policy::Auto)
						throw verbs::Error("memwatch", EOPNOTSUPP);
					if (!mw_) {
						merge = false;
						u = k;
					}
				}
				if (!mw_ && !no_memwatch_ && exposed(access)) {
					try {
						mw_ = std::make_unique<Memwatch>();
					} catch (const verbs::Error &e) {
						no_memwatch_ = memwatch_final(e.err());
					}
				}
				// A union registered max_union_passes times and
				// stale each time: k alone from now on.
				if (u != k && ++passes > max_union_passes) {
					merge = false;
					u = k;
				}
				want = u;
			}
			if (fresh_entry)
				dead.add(std::move(fresh_entry));
			try {
				fresh_entry = register_range(want, policy, want == k, dead);
			} catch (const verbs::Error &) {
				if (want == k)
					throw;
				merge = false;
				want = k;
			}
		}
	} catch (...) {
		// A registration not cached yet goes as any other: its memory stays
		// a shell (see shelve()).
		if (fresh_entry)
			dead.add(std::move(fresh_entry));
		throw;
	}
}

// No lock: e's memory stays an Entry while the cache lives (destroyed
// entries become shells for later ones), so its flags can be read even if it
// was evicted right after the decrement; at worst a recycled entry's flags
// send this put to the exclusive section for nothing. That section is taken
// only when the last reference goes from a stale entry, or while the cache
// is over its limits.
bool RegCache::put(Entry *e, unsigned holder, uint32_t life)
{
	if (e->owner != this) // another cache's registration
		return false;
	uint64_t refs = e->refs.load();
	do {
		if (!held(refs, holder, life))
			return false;
	} while (!e->refs.compare_exchange_weak(refs, without_ref(refs, holder)));
	// A bit just put is taken last.
	if (holder && e->next_holder.load(std::memory_order_relaxed) == holder - 1)
		e->next_holder.store(uint8_t(holder % holder_bits), std::memory_order_relaxed);
	if (count_of(refs) != 1 || !(e->retired.load() || over_limit_.load()))
		return true;

	Graveyard dead(*this);
	std::unique_lock lock(mu_);
	if (auto it = retired_.find(e); it != retired_.end()) {
		if (close_if_unreferenced(e->refs)) {
			dead.add(std::move(it->second));
			retired_.erase(it);
		}
	} else {
		evict(dead);
	}
	return true;
}

odpwatch_cache_stats RegCache::stats() const
{
	odpwatch_cache_stats s{};
	s.hits = hits_;
	s.misses = misses_;
	s.invalidations = invalidations_;
	s.evictions = evictions_;
	s.registrations = registrations_;
	s.deregistrations = deregistrations_;
	s.retries = retries_;
	s.uncached = uncached_;
	s.deferred = deferred_;
	std::shared_lock lock(mu_);
	s.entries = entries_.size();
	s.bytes = bytes_;
	s.max_entries = limits_.max_entries;
	s.max_bytes = limits_.max_bytes;
	s.merges = merged_;
	for (auto &[k, e] : entries_)
		s.in_use += count_of(e->refs.load()) != 0;
	s.in_use += retired_.size();
	return s;
}

bool RegCache::in_use() const
{
	return stats().in_use != 0;
}

int RegCache::event_fd() const
{
	std::shared_lock lock(mu_);
	return mw_ ? mw_->fd() : -1;
}

} // namespace odpwatch

using odpwatch::Policy;
using odpwatch::RegCache;

struct odpwatch_cache {
	RegCache cache;
};

namespace
{
// A child of fork() shares the parent's device file: deregistering there
// would remove the parent's MRs, and the cache's locks and thread may be in
// any state. Every call but destroy fails there.
bool foreign(const odpwatch_cache *cache)
{
	return !cache->cache.owned();
}

// The attr's size and layout are ABI: fields come out of the reserved ones.
static_assert(sizeof(odpwatch_cache_attr) == 56 &&
	      offsetof(odpwatch_cache_attr, rc_odp_needs) == 24);

// What odpwatch_cache_get() hands out (audit M4): the entry's address, the
// holder bit of its refs word the get holds + 1 in the low bits (entries
// are aligned to 64) and, on a 64-bit system, the entry memory's life in
// the top 16 bits (user addresses have 47): a put checks both in one
// compare-exchange, so a handle of an entry destroyed since, whose memory
// now serves another, is refused too.
constexpr uintptr_t holder_of_handle = 63;
constexpr unsigned handle_life_shift = sizeof(uintptr_t) == 8 ? 48 : 0;
constexpr uintptr_t address_mask =
	(handle_life_shift ? (uintptr_t{1} << handle_life_shift) - 1 : ~uintptr_t{0}) &
	~holder_of_handle;
static_assert(alignof(RegCache::Entry) > 24 + 1); // holder bits + 1

odpwatch_cache_reg *handle_of(RegCache::Entry *e, unsigned holder) noexcept
{
	uintptr_t h = reinterpret_cast<uintptr_t>(e) | holder;
	if constexpr (handle_life_shift != 0)
		h |= uintptr_t{RegCache::life(e)} << handle_life_shift;
	return reinterpret_cast<odpwatch_cache_reg *>(h);
}

// The entry a handle names, its holder and life (any on a 32-bit system).
RegCache::Entry *entry_of(const odpwatch_cache_reg *reg, unsigned &holder, uint32_t &life) noexcept
{
	const auto h = reinterpret_cast<uintptr_t>(reg);
	holder = unsigned(h & holder_of_handle);
	life = RegCache::any_life;
	if constexpr (handle_life_shift != 0)
		life = uint32_t(h >> handle_life_shift);
	return reinterpret_cast<RegCache::Entry *>(h & address_mask);
}

bool attr_valid(const odpwatch_cache_attr *attr)
{
	if (!attr)
		return true;
	for (uint64_t r : attr->reserved)
		if (r)
			return false;
	return !attr->flags && attr->policy <= ODPWATCH_CACHE_PINNED;
}
} // namespace

extern "C" {

int odpwatch_cache_create(const struct odpwatch_cache_attr *attr, struct odpwatch_cache **cache)
{
	if (!cache || !attr_valid(attr))
		return -EINVAL;
	return odpwatch::c_abi_guarded([&] {
		const Policy p = attr ? static_cast<Policy>(attr->policy) : Policy::Auto;
		const RegCache::Limits l{attr ? attr->max_entries : 0, attr ? attr->max_bytes : 0};
		RegCache::OdpNeeds n;
		if (attr)
			n = {attr->rc_odp_needs, attr->uc_odp_needs, attr->ud_odp_needs,
			     attr->xrc_odp_needs};
		*cache = new odpwatch_cache{RegCache(p, l, n)};
		return 0;
	});
}

int odpwatch_cache_destroy(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	if (foreign(cache))
		return 0; // forgotten: the memory is this process's copy, the MRs the parent's
	return odpwatch::c_abi_guarded([&] {
		if (cache->cache.in_use())
			return -EBUSY;
		delete cache;
		return 0;
	});
}

int odpwatch_cache_get(struct odpwatch_cache *cache, struct ibv_pd *pd, void *addr, size_t len,
		       unsigned int access, struct odpwatch_cache_reg **reg)
{
	if (!cache || !reg)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded([&] {
		unsigned holder = 0;
		RegCache::Entry *e = cache->cache.get(pd, addr, len, access, holder);
		*reg = handle_of(e, holder);
		return 0;
	});
}

int odpwatch_cache_put(struct odpwatch_cache *cache, struct odpwatch_cache_reg *reg)
{
	if (!cache)
		return -EINVAL;
	unsigned holder = 0;
	uint32_t life = 0;
	RegCache::Entry *e = entry_of(reg, holder, life);
	if (!e)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded(
		[&] { return cache->cache.put(e, holder, life) ? 0 : -EINVAL; });
}

struct ibv_mr *odpwatch_cache_reg_mr(const struct odpwatch_cache_reg *reg)
{
	unsigned holder = 0;
	uint32_t life = 0;
	const RegCache::Entry *e = entry_of(reg, holder, life);
	return e && RegCache::holds(e, holder, life) ? RegCache::mr(e) : nullptr;
}

int odpwatch_cache_policy_of(struct odpwatch_cache *cache, struct ibv_pd *pd)
{
	if (!cache || !pd)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded(
		[&] { return static_cast<int>(cache->cache.policy_of(pd)); });
}

int odpwatch_cache_query(struct odpwatch_cache *cache, struct odpwatch_cache_stats *stats)
{
	if (!cache || !stats)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded([&] {
		*stats = cache->cache.stats();
		return 0;
	});
}

int odpwatch_cache_flush(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded([&] {
		cache->cache.flush();
		return 0;
	});
}

int odpwatch_cache_event_fd(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded([&] {
		int fd = cache->cache.event_fd();
		return fd < 0 ? -ENOENT : fd;
	});
}

int odpwatch_cache_process_events(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	if (foreign(cache))
		return -EPERM;
	return odpwatch::c_abi_guarded(
		[&] { return static_cast<int>(cache->cache.process_events()); });
}

const char *odpwatch_cache_policy_name(int policy)
{
	switch (policy) {
	case ODPWATCH_CACHE_AUTO:
		return "auto";
	case ODPWATCH_CACHE_IMPLICIT_ODP:
		return "implicit-odp";
	case ODPWATCH_CACHE_EXPLICIT_ODP:
		return "explicit-odp";
	case ODPWATCH_CACHE_PINNED:
		return "pinned+memwatch";
	}
	return "unknown";
}
}
