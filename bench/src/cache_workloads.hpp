// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration-cache workloads, written once against a small interface
// so that our cache's policies and the peers (UCX's ucs_rcache, libfabric's
// MR cache) run exactly the same sequence of operations.
#pragma once

#include "benches.hpp"
#include "report.hpp"
#include "verbs.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace odpwatch::bench
{

// What a cache hands out: an opaque handle for put(), and the key of the
// MR behind it. A new registration always has a new key on rxe (it
// allocates MR indices cyclically), so the key tells a fresh registration
// from a cached one.
struct CacheHit {
	void *handle = nullptr;
	uint32_t key = 0;
};

class CacheUnderTest
{
public:
	virtual ~CacheUnderTest() = default;
	// The variant name in the report, e.g. "pinned+memwatch".
	virtual std::string name() const = 0;
	// Registers @addr..+len or finds it registered; throws on failure.
	virtual CacheHit get(void *addr, size_t len) = 0;
	virtual void put(CacheHit h) = 0;
	// False for ODP policies: their registration follows the mapping, so a
	// reused key is correct, not stale.
	virtual bool pins_pages() const { return true; }
	// One line on how the cache learns of unmaps, for the report's notes.
	virtual std::string how() const = 0;
	// A cache whose key costs a call of its own to learn (UCP's, from its
	// packed remote key) gives CacheHit::key only while this is on: in
	// the rows that count stale registrations (reuse, stale), not in
	// the hit rows.
	virtual void keys_needed(bool) {}
	// What the cache counted that explains a row (ours: deregistrations
	// left to its thread); empty if nothing.
	virtual std::string counters() const { return {}; }
};

// Slot i: a fixed address, so a freed buffer's successor can land where it
// was; n buffers of len bytes at slots 0..n-1, touched.
void *slot(size_t i);
std::vector<verbs::Mapping> buffers(size_t n, size_t len);

// The row groups, shared so every cache's rows land in the same table.
extern const char *const kHitGroup;
extern const char *const kHitManyGroup;
extern const char *const kReuseGroup;
extern const char *const kWorkloadGroup;
extern const char *const kUnmapGroup;

// get + put of 64 cached 64 KiB buffers, many rounds.
void bench_hits(Report &rep, const Options &o, CacheUnderTest &c, const std::string &note);
// get + put of 768 malloc'd buffers of random sizes, in random order.
void bench_hits_many(Report &rep, const Options &o, CacheUnderTest &c, const std::string &note);
// A cached buffer is freed and another mapped at its address, then used:
// by each cache in turn, and with_baseline by none (munmap, mmap, memset).
void bench_reuse(Report &rep, const Options &o, const std::vector<CacheUnderTest *> &caches,
		 bool with_baseline);
// munmap() alone of 64 cached 64 KiB buffers: what the cache's way of
// learning of unmaps adds to the application's own munmap. No cache
// (@c null): munmap of buffers that were never registered, the baseline.
void bench_unmap(Report &rep, const Options &o, CacheUnderTest *c);
// 128 buffers of 4 KiB .. 1 MiB; 5% of the messages free and reallocate one.
void bench_workload(Report &rep, const Options &o, CacheUnderTest &c);
// The classic failure, one row per way of freeing a buffer: how many of the
// new buffers at a freed buffer's address got the freed one's registration.
// @starting, if set, is told the group of each way before it runs (a
// watchdog uses it to name a way that hangs).
void bench_stale(Report &rep, const Options &o, CacheUnderTest &c,
		 const std::function<void(const std::string &group)> &starting = {});

} // namespace odpwatch::bench
