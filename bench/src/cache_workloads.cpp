// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "cache_workloads.hpp"

#include "raw_free.hpp"
#include "verbs.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

namespace odpwatch::bench
{

const char *const kHitGroup = "hit: get + put of a cached 64 KiB buffer";
const char *const kHitManyGroup =
	"hit: get + put of 768 cached malloc'd buffers of 4-64 KiB, in random order";
const char *const kReuseGroup = "free + new buffer at the same address + get + put (64 KiB)";
const char *const kWorkloadGroup = "MPI-like: 128 buffers (4 KiB..1 MiB), 5% freed and reallocated";
const char *const kUnmapGroup = "munmap of a cached 64 KiB buffer";

void *slot(size_t i)
{
	return reinterpret_cast<void *>((uintptr_t{5} << 40) + i * (uintptr_t{1} << 22));
}

std::vector<verbs::Mapping> buffers(size_t n, size_t len)
{
	std::vector<verbs::Mapping> v;
	for (size_t i = 0; i < n; i++) {
		v.emplace_back(len, slot(i));
		std::memset(v.back().data(), 1, len);
	}
	return v;
}

namespace
{

void get_put(CacheUnderTest &c, void *addr, size_t len)
{
	c.put(c.get(addr, len));
}

double ns_since(std::chrono::steady_clock::time_point t0)
{
	return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
		.count();
}

} // namespace

void bench_hits(Report &rep, const Options &o, CacheUnderTest &c, const std::string &note)
{
	const size_t n = 64, len = 64 << 10, rounds = o.quick ? 20 : 100;
	const std::string w = std::to_string(n) + " buffers";
	auto bufs = buffers(n, len);
	auto s = measure(o.reps, double(n * rounds), [&] {
		for (size_t r = 0; r < rounds; r++)
			for (auto &b : bufs)
				get_put(c, b.data(), len);
	});
	rep.add({kHitGroup, w, c.name(), s, "explicit-odp/" + w, note});
}

namespace
{

// The row of one cache in the reuse group.
void add_reuse_row(Report &rep, const std::string &w, CacheUnderTest &c, const Spread &s,
		   uint64_t stale, uint64_t uses)
{
	const std::string counters = c.counters();
	rep.add({kReuseGroup, w, c.name(), s, "no cache/" + w,
		 (c.pins_pages() ? std::to_string(stale) + " of " + std::to_string(uses) +
					   " stale registrations handed out; " + c.how()
				 : c.how()) +
			 (counters.empty() ? "" : "; " + counters)});
}

} // namespace

void bench_hits_many(Report &rep, const Options &o, CacheUnderTest &c, const std::string &note)
{
	// More live buffers than our per-thread index has slots (127), sizes
	// and addresses as malloc() gives them (neighbours share pages), and no
	// order: what an application's hits look like, not a hash's best case.
	// Fewer than libfabric's default cache size (1024 entries), whose
	// evictions would turn hits into registrations.
	const size_t n = 768, rounds = o.quick ? 4 : 20;
	const std::string w = std::to_string(n) + " buffers";
	std::mt19937 rng(4242);
	std::vector<std::pair<char *, size_t>> bufs;
	for (size_t i = 0; i < n; i++) {
		const size_t len = 4096 + rng() % (60 << 10);
		auto *p = static_cast<char *>(std::malloc(len));
		if (!p)
			throw verbs::Error("malloc", ENOMEM);
		std::memset(p, 1, len);
		bufs.emplace_back(p, len);
	}
	std::vector<size_t> order(n * rounds);
	for (size_t &i : order)
		i = rng() % n;
	// (measure()'s untimed first run registers them all.)
	auto s = measure(o.reps, double(order.size()), [&] {
		for (size_t i : order)
			get_put(c, bufs[i].first, bufs[i].second);
	});
	for (auto &b : bufs)
		std::free(b.first);
	rep.add({kHitManyGroup, w, c.name(), s, "explicit-odp/" + w, note});
}

namespace
{

// The rows that count stale registrations compare keys: on for their
// caches while they run (CacheUnderTest::keys_needed).
class KeysNeeded
{
public:
	explicit KeysNeeded(std::vector<CacheUnderTest *> caches) : caches_(std::move(caches))
	{
		for (CacheUnderTest *c : caches_)
			c->keys_needed(true);
	}
	~KeysNeeded()
	{
		for (CacheUnderTest *c : caches_)
			c->keys_needed(false);
	}
	KeysNeeded(const KeysNeeded &) = delete;
	KeysNeeded &operator=(const KeysNeeded &) = delete;

private:
	std::vector<CacheUnderTest *> caches_;
};

} // namespace

void bench_reuse(Report &rep, const Options &o, const std::vector<CacheUnderTest *> &caches,
		 bool with_baseline)
{
	const size_t n = o.quick ? 16 : 64, len = 64 << 10;
	const std::string w = std::to_string(n) + " buffers";
	// Each body has buffers of its own, 256 MiB away from the others'
	// (the slots of 64 buffers): one cache's munmaps must not invalidate
	// another's MRs, nor fire its watches, inside the other's turn.
	struct Run {
		CacheUnderTest *c; // none: the baseline
		std::vector<verbs::Mapping> bufs;
		size_t first_slot;
		std::vector<uint32_t> keys; // of each buffer's last registration
		uint64_t stale = 0, uses = 0;
	};
	std::vector<CacheUnderTest *> who;
	if (with_baseline)
		who.push_back(nullptr);
	who.insert(who.end(), caches.begin(), caches.end());
	const KeysNeeded keys(caches);
	std::vector<Run> runs;
	for (CacheUnderTest *c : who) {
		Run r{c, {}, 64 * runs.size(), std::vector<uint32_t>(n)};
		for (size_t i = 0; i < n; i++) {
			r.bufs.emplace_back(len, slot(r.first_slot + i));
			std::memset(r.bufs.back().data(), 1, len);
			if (c) {
				CacheHit h = c->get(r.bufs[i].data(), len);
				r.keys[i] = h.key;
				c->put(h);
			}
		}
		runs.push_back(std::move(r));
	}
	// The bodies take turns (measure_interleaved()), so that none is
	// measured in a quieter minute of the machine.
	std::vector<std::function<void()>> bodies;
	for (Run &r : runs)
		bodies.push_back([&r, n, len] {
			for (size_t i = 0; i < n; i++) {
				r.bufs[i].unmap();
				r.bufs[i] = verbs::Mapping(len, slot(r.first_slot + i));
				std::memset(r.bufs[i].data(), 2, len);
				if (!r.c)
					continue;
				CacheHit h = r.c->get(r.bufs[i].data(), len);
				r.stale += r.c->pins_pages() && h.key == r.keys[i];
				r.keys[i] = h.key;
				r.uses++;
				r.c->put(h);
			}
		});
	auto spreads = measure_interleaved(o.reps, double(n), bodies);
	for (size_t k = 0; k < runs.size(); k++)
		if (runs[k].c)
			add_reuse_row(rep, w, *runs[k].c, spreads[k], runs[k].stale, runs[k].uses);
		else
			rep.add({kReuseGroup, w, "no cache", spreads[k], "no cache/" + w,
				 "munmap + mmap + memset alone"});
}

void bench_unmap(Report &rep, const Options &o, CacheUnderTest *c)
{
	const size_t n = 64, len = 64 << 10;
	const std::string w = std::to_string(n) + " buffers";
	std::vector<double> samples;
	// Four times the repetitions: a rep is short, and one in which the
	// monitor's thread happens to run beside the unmaps moves a median of
	// five by half (1.47x against 0.94-1.01x in three later runs of ten).
	for (unsigned r = 0; r <= 4 * o.reps; r++) {
		auto bufs = buffers(n, len);
		if (c)
			for (auto &b : bufs)
				get_put(*c, b.data(), len);
		auto t0 = std::chrono::steady_clock::now();
		for (auto &b : bufs)
			b.unmap();
		if (r) // the first is the warm-up
			samples.push_back(ns_since(t0) / double(n));
	}
	rep.add({kUnmapGroup, w, c ? c->name() : "no cache", spread_of(samples), "no cache/" + w,
		 c ? c->how() : "munmap alone, nothing registered"});
}

void bench_workload(Report &rep, const Options &o, CacheUnderTest &c)
{
	const size_t n = 128, ops = o.quick ? 2000 : 10000;
	const std::string w = std::to_string(ops) + " messages";
	auto len_of = [](size_t i) { return size_t{4096} << (i % 9); };
	std::vector<verbs::Mapping> bufs;
	for (size_t i = 0; i < n; i++)
		bufs.emplace_back(len_of(i), slot(i));
	std::mt19937 rng(12345);
	uint64_t frees = 0;
	auto s = measure(o.reps, double(ops), [&] {
		for (size_t k = 0; k < ops; k++) {
			size_t i = rng() % n;
			if (rng() % 100 < 5) {
				bufs[i].unmap();
				bufs[i] = verbs::Mapping(len_of(i), slot(i));
				frees++;
			}
			get_put(c, bufs[i].data(), len_of(i));
		}
	});
	rep.add({kWorkloadGroup, w, c.name(), s, "pinned+memwatch/" + w,
		 std::to_string(frees / (o.reps + 1)) + " frees per rep; " + c.how()});
}

namespace
{

// One way an application (or its runtime) lets go of a buffer and gets a
// new one at the same address. replace() returns the new buffer's address,
// and sets @kept when the kernel declined to let the pages go (it neither
// moves nor drops a pinned page): the registration is then still right.
// Mapped buffers live at fixed slots: a hole left by munmap at the top of
// the mmap area would be taken by the next anonymous mapping anyone makes
// (a hook's own allocation, say) before ours.
struct FreeMethod {
	const char *name;
	std::function<void *(size_t i, size_t len)> alloc;
	std::function<void *(void *p, size_t len, bool &kept)> replace;
	std::function<void(void *p, size_t len)> release;
};

void *map_at(void *hint, size_t len)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0);
	void *p = mmap(hint, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED)
		throw verbs::Error("mmap", errno);
	return p;
}

std::vector<FreeMethod> free_methods()
{
	// glibc serves these sizes with mmap and unmaps them in free(); a fixed
	// threshold keeps it from moving them onto the heap after the first free.
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
	auto unmap = [](void *p, size_t len) { munmap(p, len); };
	auto at_slot = [](size_t i, size_t len) { return map_at(slot(i), len); };
	return {
		{"munmap() + mmap()", at_slot,
		 [](void *p, size_t len, bool &) {
			 munmap(p, len);
			 return map_at(p, len);
		 },
		 unmap},
		{"free() + malloc() (glibc unmaps the chunk inside free)",
		 [](size_t, size_t len) {
			 void *p = std::malloc(len);
			 if (!p)
				 throw verbs::Error("malloc", ENOMEM);
			 return p;
		 },
		 [](void *p, size_t len, bool &) {
			 std::free(p);
			 void *q = std::malloc(len);
			 if (!q)
				 throw verbs::Error("malloc", ENOMEM);
			 return q;
		 },
		 [](void *p, size_t) { std::free(p); }},
		{"munmap system call made directly + mmap() (as a runtime such as Go's does)",
		 at_slot,
		 [](void *p, size_t len, bool &) {
			 syscall(SYS_munmap, p, len);
			 return map_at(p, len);
		 },
		 unmap},
		{"madvise(MADV_DONTNEED): new pages at the same address", at_slot,
		 [](void *p, size_t len, bool &) {
			 madvise(p, len, MADV_DONTNEED);
			 return p;
		 },
		 unmap},
		{"process_madvise(MADV_DONTNEED) on itself: new pages, no hook sees it", at_slot,
		 [](void *p, size_t len, bool &) {
			 if (int e = raw_free::process_madvise_self(p, len, MADV_DONTNEED))
				 throw verbs::Error("process_madvise", e);
			 return p;
		 },
		 unmap},
		{"io_uring IORING_OP_MADVISE(MADV_DONTNEED): new pages, no hook sees it", at_slot,
		 [](void *p, size_t len, bool &) {
			 if (int e = raw_free::madvise_by_io_uring(p, len, MADV_DONTNEED))
				 throw verbs::Error("IORING_OP_MADVISE", e);
			 return p;
		 },
		 unmap},
		{"UFFDIO_MOVE of its pages elsewhere (as a moving garbage collector): new pages",
		 at_slot,
		 [](void *p, size_t len, bool &kept) {
			 int e = raw_free::move_away_by_uffd(p, len);
			 if (e && e != EBUSY)
				 throw verbs::Error("UFFDIO_MOVE", e);
			 kept = e == EBUSY;
			 return p;
		 },
		 unmap},
		{"MAP_DROPPABLE buffer reclaimed (MADV_PAGEOUT by process_madvise): new pages",
		 [](size_t i, size_t len) {
			 void *p = raw_free::map_droppable(slot(i), len);
			 if (p != slot(i))
				 throw verbs::Error("mmap(MAP_DROPPABLE)",
						    p == MAP_FAILED ? errno : EEXIST);
			 return p;
		 },
		 [](void *p, size_t len, bool &kept) {
			 bool dropped = false;
			 if (int e = raw_free::drop_droppable(p, len, dropped))
				 throw verbs::Error("MADV_PAGEOUT", e);
			 kept = !dropped;
			 return p;
		 },
		 unmap},
		{"mremap() the buffer away + mmap() at its old address", at_slot,
		 [](void *p, size_t len, bool &) {
			 // Moved 4 GiB up, clear of the slots (a move to the same size
			 // would not happen without a destination), and dropped at once:
			 // only the old address matters.
			 void *away = mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
					     static_cast<char *>(p) + (uintptr_t{1} << 32));
			 if (away == MAP_FAILED)
				 throw verbs::Error("mremap", errno);
			 void *q = map_at(p, len);
			 munmap(away, len);
			 return q;
		 },
		 unmap},
	};
}

// The physical page behind @p (root reads /proc/self/pagemap's PFNs), or
// 0 when that cannot be told.
uint64_t pfn_of(const void *p)
{
	static const long page = sysconf(_SC_PAGESIZE);
	FILE *f = std::fopen("/proc/self/pagemap", "re");
	if (!f)
		return 0;
	uint64_t e = 0;
	const long off = long(reinterpret_cast<uintptr_t>(p) / page * sizeof(e));
	const bool ok = !std::fseek(f, off, SEEK_SET) && std::fread(&e, sizeof(e), 1, f) == 1;
	std::fclose(f);
	// Bit 63: present; bits 0-54: the PFN (zero without CAP_SYS_ADMIN).
	return ok && (e >> 63) ? e & ((uint64_t{1} << 55) - 1) : 0;
}

} // namespace

void bench_stale(Report &rep, const Options &o, CacheUnderTest &c,
		 const std::function<void(const std::string &group)> &starting)
{
	const size_t n = o.quick ? 8 : 32, len = 1 << 20;
	const std::string w = std::to_string(n) + " buffers of 1 MiB";
	const KeysNeeded keys({&c});
	for (const FreeMethod &m : free_methods()) {
		const std::string group = std::string("stale? ") + m.name;
		if (starting)
			starting(group);
		std::vector<double> samples;
		uint64_t stale = 0, checked = 0, moved = 0, kept = 0;
		for (unsigned r = 0; r < o.reps; r++) {
			std::vector<void *> bufs(n);
			std::vector<uint32_t> keys(n);
			for (size_t i = 0; i < n; i++) {
				bufs[i] = m.alloc(i, len);
				std::memset(bufs[i], 1, len);
				CacheHit h = c.get(bufs[i], len);
				keys[i] = h.key;
				c.put(h);
			}
			double spent = 0;
			for (size_t i = 0; i < n; i++) {
				bool declined = false;
				// Read outside the time measured: two file reads
				// would be most of a fast way's time.
				const uint64_t pfn = pfn_of(bufs[i]);
				auto t0 = std::chrono::steady_clock::now();
				void *p = m.replace(bufs[i], len, declined);
				std::memset(p, 2, len);
				CacheHit h = c.get(p, len);
				const uint32_t key = h.key;
				c.put(h);
				spent += ns_since(t0);
				// The same page at the address: the buffer was not
				// freed to the kernel (glibc can serve a 1 MiB
				// malloc() from a heap an earlier workload left
				// free), and its registration is still right.
				declined |= p == bufs[i] && pfn && pfn == pfn_of(p);
				if (p != bufs[i]) {
					moved++; // not the classic failure: nothing to judge
				} else if (declined) {
					kept++; // the same pages: the registration is right
				} else {
					checked++;
					stale += key == keys[i];
				}
				bufs[i] = p;
			}
			samples.push_back(spent / double(n));
			for (void *p : bufs)
				m.release(p, len);
		}
		std::string note = std::to_string(stale) + " of " + std::to_string(checked) +
				   " stale registrations handed out";
		if (moved)
			note += " (" + std::to_string(moved) + " new buffers landed elsewhere)";
		if (kept)
			note += " (" + std::to_string(kept) +
				" times the same pages stayed (kept by the kernel, or never "
				"freed): nothing to judge)";
		rep.add({group, w, c.name(), spread_of(samples), "pinned+memwatch/" + w, note});
	}
}

} // namespace odpwatch::bench
