// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration cache (odpwatch/regcache.h) under its three policies on
// one device, through the C ABI an MPI library would use.
#include "benches.hpp"
#include "report.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace odpwatch::bench
{
namespace
{

constexpr unsigned kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
constexpr int kPolicies[] = {ODPWATCH_CACHE_PINNED, ODPWATCH_CACHE_EXPLICIT_ODP,
			     ODPWATCH_CACHE_IMPLICIT_ODP};

struct CacheDeleter {
	void operator()(odpwatch_cache *c) const noexcept { odpwatch_cache_destroy(c); }
};
using Cache = std::unique_ptr<odpwatch_cache, CacheDeleter>;

Cache make_cache(int policy)
{
	odpwatch_cache_attr a{};
	a.policy = static_cast<uint32_t>(policy);
	odpwatch_cache *c = nullptr;
	if (int rc = odpwatch_cache_create(&a, &c))
		throw verbs::Error("odpwatch_cache_create", -rc);
	return Cache(c);
}

void get_put(odpwatch_cache *c, ibv_pd *pd, void *addr, size_t len)
{
	odpwatch_cache_reg *reg = nullptr;
	if (int rc = odpwatch_cache_get(c, pd, addr, len, kAccess, &reg))
		throw verbs::Error("odpwatch_cache_get", -rc);
	odpwatch_cache_put(c, reg);
}

odpwatch_cache_stats stats(odpwatch_cache *c)
{
	odpwatch_cache_stats s{};
	odpwatch_cache_query(c, &s);
	return s;
}

std::string name(int policy)
{
	return odpwatch_cache_policy_name(policy);
}

// Slots at fixed addresses, so a freed buffer's successor lands where it was.
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

// Hit path: every buffer cached; get + put of each. The explicit ODP row is
// the same lookup without the memwatch check: the baseline for it.
void bench_hits(Report &rep, const Options &o, ibv_pd *pd)
{
	const size_t n = 64, len = 64 << 10, rounds = o.quick ? 20 : 100;
	const std::string g = "hit: get + put of a cached 64 KiB buffer",
			  w = std::to_string(n) + " buffers", base = "explicit-odp/" + w;
	auto bufs = buffers(n, len);
	for (int p : kPolicies) {
		Cache c = make_cache(p);
		auto s = measure(o.reps, double(n * rounds), [&] {
			for (size_t r = 0; r < rounds; r++)
				for (auto &b : bufs)
					get_put(c.get(), pd, b.data(), len);
		});
		const char *note = p == ODPWATCH_CACHE_PINNED	      ? "map lookup + memwatch load"
				   : p == ODPWATCH_CACHE_EXPLICIT_ODP ? "map lookup"
								      : "one MR per PD";
		rep.add({g, w, name(p), s, base, note});
	}
}

// Miss: a buffer the cache has not seen, registered on get.
void bench_misses(Report &rep, const Options &o, ibv_pd *pd)
{
	const size_t n = o.quick ? 16 : 64;
	for (size_t len : {size_t{64} << 10, size_t{1} << 20}) {
		const std::string g = "miss: get + put of a new " +
				      std::string(len == (64 << 10) ? "64 KiB" : "1 MiB") +
				      " buffer",
				  w = std::to_string(n) + " buffers", base = "pinned+memwatch/" + w;
		auto bufs = buffers(n, len);
		for (int p : kPolicies) {
			std::vector<double> samples;
			uint64_t regs = 0;
			for (unsigned r = 0; r <= o.reps; r++) {
				Cache c = make_cache(p); // empty: every get misses
				auto t0 = std::chrono::steady_clock::now();
				for (auto &b : bufs)
					get_put(c.get(), pd, b.data(), len);
				auto t1 = std::chrono::steady_clock::now();
				regs = stats(c.get()).registrations;
				if (r)
					samples.push_back(
						std::chrono::duration<double, std::nano>(t1 - t0)
							.count() /
						double(n));
			}
			rep.add({g, w, name(p), spread_of(samples), base,
				 std::to_string(regs) + " registrations per rep"});
		}
	}
}

// A cached buffer is freed and another mapped at its address, then used.
void bench_reuse(Report &rep, const Options &o, ibv_pd *pd)
{
	const size_t n = o.quick ? 16 : 64, len = 64 << 10;
	const std::string g = "free + new buffer at the same address + get + put (64 KiB)",
			  w = std::to_string(n) + " buffers", base = "no cache/" + w;
	auto bufs = buffers(n, len);
	auto remap = [&](size_t i) {
		bufs[i].unmap();
		bufs[i] = verbs::Mapping(len, slot(i));
		std::memset(bufs[i].data(), 2, len);
	};
	rep.add({g, w, "no cache",
		 measure(o.reps, double(n),
			 [&] {
				 for (size_t i = 0; i < n; i++)
					 remap(i);
			 }),
		 base, "munmap + mmap + memset alone"});
	for (int p : kPolicies) {
		Cache c = make_cache(p);
		for (auto &b : bufs)
			get_put(c.get(), pd, b.data(), len);
		auto s = measure(o.reps, double(n), [&] {
			for (size_t i = 0; i < n; i++) {
				remap(i);
				get_put(c.get(), pd, bufs[i].data(), len);
			}
		});
		auto st = stats(c.get());
		rep.add({g, w, name(p), s, base,
			 std::to_string(st.invalidations) + " stale found, " +
				 std::to_string(st.registrations) + " registrations in all"});
	}
}

// MPI-like: 128 buffers of 4 KiB .. 1 MiB used over and over; now and then
// one is freed and a new one takes its place. The same seeded sequence for
// every policy.
void bench_workload(Report &rep, const Options &o, ibv_pd *pd)
{
	const size_t n = 128, ops = o.quick ? 2000 : 10000;
	const std::string g = "MPI-like: 128 buffers (4 KiB..1 MiB), 5% freed and reallocated",
			  w = std::to_string(ops) + " messages", base = "pinned+memwatch/" + w;
	auto len_of = [](size_t i) { return size_t{4096} << (i % 9); };
	for (int p : kPolicies) {
		std::vector<verbs::Mapping> bufs;
		for (size_t i = 0; i < n; i++)
			bufs.emplace_back(len_of(i), slot(i));
		Cache c = make_cache(p);
		std::mt19937 rng(12345);
		auto s = measure(o.reps, double(ops), [&] {
			for (size_t k = 0; k < ops; k++) {
				size_t i = rng() % n;
				if (rng() % 100 < 5) {
					bufs[i].unmap();
					bufs[i] = verbs::Mapping(len_of(i), slot(i));
				}
				get_put(c.get(), pd, bufs[i].data(), len_of(i));
			}
		});
		auto st = stats(c.get());
		const double total = double(st.hits + st.misses);
		char note[128];
		std::snprintf(note, sizeof(note), "hit rate %.1f%%, %lu registrations",
			      total ? 100.0 * double(st.hits) / total : 0.0,
			      (unsigned long)st.registrations);
		rep.add({g, w, name(p), s, base, note});
	}
}

} // namespace

int cache_bench(const Options &o)
{
	verbs::Context ctx = verbs::open_device(o.device);
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Report rep("Registration cache policies on " +
		   std::string(ibv_get_device_name(ctx->device)));
	run_sections("cache", o.reps, o.quick,
		     {{"hit path", [&] { bench_hits(rep, o, pd.get()); }},
		      {"misses", [&] { bench_misses(rep, o, pd.get()); }},
		      {"freed and reused buffers", [&] { bench_reuse(rep, o, pd.get()); }},
		      {"MPI-like workload", [&] { bench_workload(rep, o, pd.get()); }}});
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
