// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration cache, and its C ABI (odpwatch/regcache.h).
//
// Hits take the lock shared: a map lookup, for pinned entries one load of
// the memwatch word, an atomic reference. Misses, invalidation and eviction
// take it exclusive; registration runs outside it, deregistration on the
// cache's reaper thread.
#include "regcache.hpp"

#include <unistd.h>

#include <cerrno>
#include <limits>
#include <mutex>
#include <new>
#include <optional>

namespace odpwatch
{

namespace
{
constexpr uint32_t entry_magic = 0x6f647063; // "odpc"
// How many entries below a range's start a lookup checks for one holding it.
constexpr int containing_window = 8;

uintptr_t page_size()
{
	static const uintptr_t page = sysconf(_SC_PAGESIZE);
	return page;
}
constexpr unsigned remote_access =
	IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

// An implicit ODP MR's rkey reaches every byte of the process: a peer given
// it could read or write anything. It serves local access only; a
// registration with remote access gets an explicit ODP MR of its own range.
Policy for_access(Policy pd_policy, unsigned access)
{
	if (pd_policy == Policy::ImplicitOdp && (access & remote_access))
		return Policy::ExplicitOdp;
	return pd_policy;
}
} // namespace

struct RegCache::Entry {
	uint32_t magic = entry_magic;
	Key key;
	Policy policy;
	verbs::Mr mr;
	std::optional<Memwatch::Watch> watch;
	std::atomic<uint32_t> refs{0};
	std::atomic<uint64_t> last_use{0};
	std::atomic<bool> retired{false}; // out of the map, freed at the last put
	// What it pins: an implicit ODP MR covers everything and pins nothing.
	uint64_t bytes() const { return policy == Policy::ImplicitOdp ? 0 : key.end - key.start; }
};

RegCache::RegCache(Policy policy, Limits limits) : policy_(policy), limits_(limits) {}

RegCache::~RegCache()
{
	flush();
	reaper_ = std::jthread(); // stops and joins it
	for (auto &[k, e] : entries_)
		destroy(std::move(e));
	for (auto &[p, e] : retired_)
		destroy(std::move(e));
}

ibv_mr *RegCache::mr(const Entry *e) noexcept
{
	return e->mr.get();
}

bool RegCache::is_entry(const Entry *e) noexcept
{
	return e && e->magic == entry_magic;
}

bool RegCache::fresh(const Entry *e) const noexcept
{
	return !e->watch || mw_->valid(*e->watch);
}

// The entry for exactly this key, else one nearby that holds the range with
// at least its access. Under mu_, either way.
RegCache::Entry *RegCache::lookup(const Key &k) const
{
	if (auto it = entries_.find(k); it != entries_.end())
		return it->second.get();
	auto it = entries_.upper_bound(
		Key{k.pd, k.start, std::numeric_limits<uintptr_t>::max(), ~0u});
	for (int i = 0; i < containing_window && it != entries_.begin(); i++) {
		--it;
		const Key &c = it->first;
		if (c.pd != k.pd)
			break;
		if (c.start <= k.start && c.end >= k.end && (c.access & k.access) == k.access)
			return it->second.get();
	}
	return nullptr;
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
	const uint32_t rc_needed = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
				   IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
	const bool odp = caps.supported && (caps.rc_caps & rc_needed) == rc_needed;
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

// Registers outside the lock. For the pinned policy the watch comes first,
// so a change racing with the registration shows as a stale watch.
std::unique_ptr<RegCache::Entry> RegCache::make_entry(const Key &k, Policy policy)
{
	auto e = std::make_unique<Entry>();
	e->key = k;
	e->policy = policy;
	const size_t len = k.end - k.start;
	auto *addr = reinterpret_cast<void *>(k.start);
	switch (policy) {
	case Policy::ImplicitOdp:
		e->mr = verbs::reg_mr(k.pd, nullptr, SIZE_MAX, k.access | IBV_ACCESS_ON_DEMAND);
		break;
	case Policy::ExplicitOdp:
		e->mr = verbs::reg_mr(k.pd, addr, len, k.access | IBV_ACCESS_ON_DEMAND);
		break;
	default:
		e->watch = mw_->add(addr, len, reinterpret_cast<uintptr_t>(e.get()));
		try {
			e->mr = verbs::reg_mr(k.pd, addr, len, k.access);
		} catch (...) {
			mw_->remove(e->watch->id);
			throw;
		}
		break;
	}
	registrations_++;
	return e;
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
	e->magic = 0;
	e->mr.reset();
	deregistrations_++;
}

void RegCache::reap(std::vector<std::unique_ptr<Entry>> &dead) noexcept
{
	if (dead.empty())
		return;
	try {
		std::lock_guard lock(reap_mu_);
		if (!reaper_.joinable())
			reaper_ = std::jthread([this](std::stop_token st) { reaper_loop(st); });
		for (auto &e : dead)
			reap_q_.push_back(std::move(e));
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
		reaping_ = batch.size();
		lock.unlock();
		for (auto &e : batch)
			destroy(std::move(e));
		lock.lock();
		reaping_ = 0;
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
	bytes_ -= e->bytes();
	if (e->watch)
		by_watch_.erase(e->watch->id);
	if (e->refs.load() == 0) {
		dead.add(std::move(owned));
	} else {
		e->retired = true;
		retired_.emplace(e, std::move(owned));
	}
}

// Drop least recently used unused entries until within the limits
// (exclusive lock held). Referenced entries are never dropped: the cache
// may stay above its limits while they are in use.
void RegCache::evict(Graveyard &dead)
{
	auto over = [&] {
		return (limits_.max_entries && entries_.size() > limits_.max_entries) ||
		       (limits_.max_bytes && bytes_ > limits_.max_bytes);
	};
	while (over()) {
		Entry *victim = nullptr;
		for (auto &[k, e] : entries_)
			if (e->refs.load() == 0 &&
			    (!victim || e->last_use.load() < victim->last_use.load()))
				victim = e.get();
		if (!victim)
			break;
		invalidate(victim, dead);
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

// A hit: a reference and a use, under either lock.
RegCache::Entry *RegCache::take(Entry *e)
{
	e->refs++;
	e->last_use = ++clock_;
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

RegCache::Entry *RegCache::get(ibv_pd *pd, const void *addr, size_t len, unsigned access)
{
	const uintptr_t a = reinterpret_cast<uintptr_t>(addr), page = page_size();
	if (!pd || !len || a + len < a)
		throw verbs::Error("odpwatch_cache_get", EINVAL);
	auto key_for = [&](Policy p) {
		if (p == Policy::ImplicitOdp)
			return Key{pd, 0, std::numeric_limits<uintptr_t>::max(), access};
		return Key{pd, a & ~(page - 1), (a + len + page - 1) & ~(page - 1), access};
	};

	// The hit path: one shared section for the PD's policy and the entry.
	{
		std::shared_lock lock(mu_);
		if (auto it = pd_policy_.find(pd); it != pd_policy_.end())
			if (Entry *e = lookup(key_for(for_access(it->second, access)));
			    e && fresh(e))
				return take(e);
	}
	const Policy policy = for_access(resolve(pd), access);
	const Key k = key_for(policy);

	Graveyard dead(*this); // declared first: destroys after the lock is gone
	std::unique_ptr<Entry> fresh_entry;
	Entry *result = nullptr;
	for (;;) {
		{
			std::unique_lock lock(mu_);
			process_events_locked(dead);
			Entry *e = lookup(k);
			if (e && drop_if_stale(e, dead))
				e = nullptr;
			if (e) {
				result = take(e); // another thread registered it meanwhile
			} else if (fresh_entry && fresh(fresh_entry.get())) {
				result = fresh_entry.get();
				result->refs = 1;
				result->last_use = ++clock_;
				if (result->watch)
					by_watch_.emplace(result->watch->id, result);
				bytes_ += result->bytes();
				entries_.emplace(k, std::move(fresh_entry));
				misses_++;
				evict(dead);
			} else if (policy == Policy::Pinned && !mw_) {
				mw_ = std::make_unique<Memwatch>();
			}
		}
		if (result)
			break;
		// The mapping changed while it was being registered: again.
		if (fresh_entry)
			dead.add(std::move(fresh_entry));
		fresh_entry = make_entry(k, policy);
	}
	if (fresh_entry)
		dead.add(std::move(fresh_entry));
	return result;
}

// The shared lock keeps e alive while its flags are read: only exclusive
// sections destroy entries. The exclusive lock is taken only when the last
// reference goes from a stale entry, or while the cache is over its limits.
bool RegCache::put(Entry *e)
{
	{
		std::shared_lock lock(mu_);
		uint32_t refs = e->refs.load();
		do {
			if (refs == 0)
				return false;
		} while (!e->refs.compare_exchange_weak(refs, refs - 1));
		if (refs != 1 || !(e->retired.load() || over_limit_.load()))
			return true;
	}

	Graveyard dead(*this);
	std::unique_lock lock(mu_);
	if (auto it = retired_.find(e); it != retired_.end()) {
		if (e->refs.load() == 0) {
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
	std::shared_lock lock(mu_);
	s.entries = entries_.size();
	s.bytes = bytes_;
	for (auto &[k, e] : entries_)
		s.in_use += e->refs.load() != 0;
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
// Runs f, turning exceptions into a negative errno: none crosses the C ABI.
template <class F> int guarded(F &&f)
{
	try {
		return f();
	} catch (const odpwatch::verbs::Error &e) {
		return -e.err();
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (...) { // a std::system_error of a lock or a thread, say
		return -EIO;
	}
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
	return guarded([&] {
		const Policy p = attr ? static_cast<Policy>(attr->policy) : Policy::Auto;
		const RegCache::Limits l{attr ? attr->max_entries : 0, attr ? attr->max_bytes : 0};
		*cache = new odpwatch_cache{RegCache(p, l)};
		return 0;
	});
}

int odpwatch_cache_destroy(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	return guarded([&] {
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
	return guarded([&] {
		*reg = reinterpret_cast<odpwatch_cache_reg *>(
			cache->cache.get(pd, addr, len, access));
		return 0;
	});
}

int odpwatch_cache_put(struct odpwatch_cache *cache, struct odpwatch_cache_reg *reg)
{
	auto *e = reinterpret_cast<RegCache::Entry *>(reg);
	if (!cache || !RegCache::is_entry(e))
		return -EINVAL;
	return guarded([&] { return cache->cache.put(e) ? 0 : -EINVAL; });
}

struct ibv_mr *odpwatch_cache_reg_mr(const struct odpwatch_cache_reg *reg)
{
	auto *e = reinterpret_cast<const RegCache::Entry *>(reg);
	try {
		return RegCache::is_entry(e) ? RegCache::mr(e) : nullptr;
	} catch (...) {
		return nullptr;
	}
}

int odpwatch_cache_policy_of(struct odpwatch_cache *cache, struct ibv_pd *pd)
{
	if (!cache || !pd)
		return -EINVAL;
	return guarded([&] { return static_cast<int>(cache->cache.policy_of(pd)); });
}

int odpwatch_cache_query(struct odpwatch_cache *cache, struct odpwatch_cache_stats *stats)
{
	if (!cache || !stats)
		return -EINVAL;
	return guarded([&] {
		*stats = cache->cache.stats();
		return 0;
	});
}

int odpwatch_cache_flush(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	return guarded([&] {
		cache->cache.flush();
		return 0;
	});
}

int odpwatch_cache_event_fd(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	return guarded([&] {
		int fd = cache->cache.event_fd();
		return fd < 0 ? -ENOENT : fd;
	});
}

int odpwatch_cache_process_events(struct odpwatch_cache *cache)
{
	if (!cache)
		return -EINVAL;
	return guarded([&] { return static_cast<int>(cache->cache.process_events()); });
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
