// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration cache (odpwatch/regcache.h) under its three policies on
// one device, through the C ABI an MPI library would use.
#include "benches.hpp"
#include "cache_workloads.hpp"
#include "memwatch.hpp"
#include "report.hpp"
#include "spawn.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <libgen.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace odpwatch::bench
{
namespace
{

// Send buffers: local access (with remote access the implicit policy would
// register each range explicitly, as the cache's rule is).
constexpr unsigned kAccess = IBV_ACCESS_LOCAL_WRITE;
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

// Our cache under one policy, as the shared workloads see it. It
// deregisters what it drops in the caller while that is cheap, else on a
// thread of its own; the peers deregister inline. @wait_dereg times it as
// they are timed: each put waits until what was dropped so far is
// deregistered (flush).
class OurCache final : public CacheUnderTest
{
public:
	OurCache(int policy, ibv_pd *pd, bool wait_dereg = false)
	    : c_(make_cache(policy)), policy_(policy), pd_(pd), wait_dereg_(wait_dereg)
	{
	}
	std::string name() const override
	{
		return std::string(odpwatch_cache_policy_name(policy_)) +
		       (wait_dereg_ ? ", dereg waited for" : "");
	}
	CacheHit get(void *addr, size_t len) override
	{
		odpwatch_cache_reg *reg = nullptr;
		if (int rc = odpwatch_cache_get(c_.get(), pd_, addr, len, kAccess, &reg))
			throw verbs::Error("odpwatch_cache_get", -rc);
		return {reg, odpwatch_cache_reg_mr(reg)->lkey};
	}
	void put(CacheHit h) override
	{
		odpwatch_cache_put(c_.get(), static_cast<odpwatch_cache_reg *>(h.handle));
		if (wait_dereg_)
			odpwatch_cache_flush(c_.get());
	}
	bool pins_pages() const override { return policy_ == ODPWATCH_CACHE_PINNED; }
	std::string how() const override
	{
		return pins_pages() ? "memwatch: the range's word changes before munmap returns"
				    : "ODP: the MR follows the mapping, nothing to invalidate";
	}
	odpwatch_cache *get_cache() const { return c_.get(); }
	std::string counters() const override
	{
		odpwatch_cache_stats st{};
		if (odpwatch_cache_query(c_.get(), &st) || !st.deregistrations)
			return {};
		return std::to_string(st.deferred) + " of " + std::to_string(st.deregistrations) +
		       " deregistrations on the cache's thread";
	}

private:
	Cache c_;
	int policy_;
	ibv_pd *pd_;
	bool wait_dereg_;
};

const char *hit_note(int policy)
{
	return policy == ODPWATCH_CACHE_PINNED	       ? "page index, no lock; + memwatch load"
	       : policy == ODPWATCH_CACHE_EXPLICIT_ODP ? "page index, no lock"
						       : "one MR per PD, per-thread index, no lock";
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
				OurCache c(p, pd); // empty: every get misses
				auto t0 = std::chrono::steady_clock::now();
				for (auto &b : bufs)
					c.put(c.get(b.data(), len));
				auto t1 = std::chrono::steady_clock::now();
				regs = stats(c.get_cache()).registrations;
				if (r)
					samples.push_back(
						std::chrono::duration<double, std::nano>(t1 - t0)
							.count() /
						double(n));
			}
			rep.add({g, w, name(p), spread_of(samples), base,
				 std::to_string(regs) + " registrations per rep" +
					 (p == ODPWATCH_CACHE_IMPLICIT_ODP
						  ? " (the PD's one implicit MR: every get after "
						    "the first is a hit, not a miss)"
						  : "")});
		}
	}
}

// Where the reuse row's time goes: its steps one by one, each timed on its
// own, for the two ways a pinned buffer freed and mapped again gets its new
// registration: registered every time (munmap, mmap + memset, reg, dereg),
// and what the memwatch cache does on top (the old watch's event read, a
// watch added for the new buffer, the old one removed). The same 64
// buffers of 64 KiB at fixed addresses as the reuse row, without the cache:
// what is left of its time after these is the cache's own.
void bench_reuse_steps(Report &rep, const Options &o, ibv_pd *pd)
{
	const size_t n = o.quick ? 16 : 64, len = 64 << 10;
	const std::string g = "reuse, step by step: a pinned 64 KiB buffer freed, mapped again "
			      "and registered",
			  w = std::to_string(n) + " buffers";
	for (bool watched : {false, true}) {
		const std::string way = watched ? "memwatch" : "registered every time";
		std::unique_ptr<Memwatch> mw;
		if (watched)
			mw = std::make_unique<Memwatch>();
		std::vector<verbs::Mapping> bufs;
		std::vector<verbs::Mr> mrs;
		std::vector<uint32_t> ids(n);
		for (size_t i = 0; i < n; i++) {
			bufs.emplace_back(len, slot(i));
			std::memset(bufs.back().data(), 1, len);
			if (mw)
				ids[i] = mw->add(bufs[i].data(), len, i).id;
			mrs.push_back(verbs::reg_mr(pd, bufs[i].data(), len, kAccess));
		}
		const char *steps[] = {
			"munmap",     "mmap + memset",	    "read the event",	  "watch added",
			"ibv_reg_mr", "ibv_dereg_mr (old)", "watch removed (old)"};
		constexpr size_t nsteps = std::size(steps);
		std::vector<std::vector<double>> per_step(nsteps);
		uint64_t events = 0;
		for (unsigned r = 0; r <= o.reps; r++) {
			double spent[nsteps] = {};
			auto t = std::chrono::steady_clock::now();
			auto lap = [&](size_t k) {
				const auto now = std::chrono::steady_clock::now();
				spent[k] +=
					std::chrono::duration<double, std::nano>(now - t).count();
				t = now;
			};
			for (size_t i = 0; i < n; i++) {
				t = std::chrono::steady_clock::now();
				bufs[i].unmap();
				lap(0);
				bufs[i] = verbs::Mapping(len, slot(i));
				std::memset(bufs[i].data(), 2, len);
				lap(1);
				uint32_t id = 0;
				if (mw) {
					while (mw->next_event())
						events++;
					lap(2);
					id = mw->add(bufs[i].data(), len, i).id;
					lap(3);
				}
				verbs::Mr mr = verbs::reg_mr(pd, bufs[i].data(), len, kAccess);
				lap(4);
				std::swap(mr, mrs[i]);
				mr.reset();
				lap(5);
				if (mw) {
					mw->remove(ids[i]);
					ids[i] = id;
					lap(6);
				}
			}
			if (r) // the first is the warm-up
				for (size_t k = 0; k < nsteps; k++)
					per_step[k].push_back(spent[k] / double(n));
		}
		for (size_t k = 0; k < nsteps; k++)
			if (mw || (k != 2 && k != 3 && k != 6))
				rep.add({g, way, steps[k], spread_of(per_step[k]),
					 "ibv_reg_mr/registered every time",
					 k == 2 ? std::to_string(events / (o.reps + 1)) +
							  " events read per rep"
						: ""});
	}
}

// The MPI-like workload with its data moved: every message is RDMA-written
// (loopback) from its buffer through the registration the cache gave, and a
// reallocated buffer is filled by the application first, so ODP's costs (its
// faults on first use of new pages) land in the timed loop where they fall
// in an MPI library. Our policies only: the peers register in contexts of
// their own, which no QP here can use.
void bench_workload_data(Report &rep, const Options &o, ibv_context *ctx, ibv_pd *pd)
{
	const size_t n = 128, ops = o.quick ? 200 : 1000, max_len = 1 << 20;
	const std::string g = "MPI-like, data moved: 128 buffers (4 KiB..1 MiB), 5% freed and "
			      "reallocated, each message RDMA-written through its registration",
			  w = std::to_string(ops) + " messages";
	auto len_of = [](size_t i) { return size_t{4096} << (i % 9); };
	verbs::LoopbackQp qp(ctx, pd);
	verbs::Mapping dst(max_len);
	verbs::Mr dst_mr = verbs::reg_mr(pd, dst.data(), max_len,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	for (int p : kPolicies) {
		OurCache c(p, pd);
		std::vector<verbs::Mapping> bufs;
		for (size_t i = 0; i < n; i++) {
			bufs.emplace_back(len_of(i), slot(i));
			std::memset(bufs[i].data(), 1, len_of(i));
		}
		std::mt19937 rng(12345);
		uint64_t frees = 0, wrong = 0;
		auto s = measure(o.reps, double(ops), [&] {
			for (size_t k = 0; k < ops; k++) {
				const size_t i = rng() % n, len = len_of(i);
				const auto fill = static_cast<std::byte>(k);
				if (rng() % 100 < 5) {
					bufs[i].unmap();
					bufs[i] = verbs::Mapping(len, slot(i));
					std::memset(bufs[i].data(), 2,
						    len); // filled by the application
					frees++;
				}
				// This message's bytes: one in each page and the
				// last, so a stale registration of any page shows.
				std::byte *b = bufs[i].data();
				for (size_t at = 0; at < len; at += 4096)
					b[at] = fill;
				b[len - 1] = fill;
				CacheHit h = c.get(b, len);
				const ibv_wc_status st = qp.rdma_write(
					odpwatch_cache_reg_mr(
						static_cast<odpwatch_cache_reg *>(h.handle)),
					b, len, dst_mr.get(), dst.data());
				c.put(h);
				if (st != IBV_WC_SUCCESS)
					throw verbs::Error(std::string("RDMA WRITE: ") +
								   ibv_wc_status_str(st),
							   EIO);
				const std::byte *d = dst.data();
				bool ok = d[len - 1] == fill;
				for (size_t at = 0; ok && at < len; at += 4096)
					ok = d[at] == fill;
				wrong += !ok;
			}
		});
		rep.add({g, w, name(p), s, "pinned+memwatch/" + w,
			 std::to_string(frees / (o.reps + 1)) + " frees per rep; " +
				 std::to_string(wrong) +
				 " messages arrived wrong (a byte of each page checked); "
				 "under TCG rxe's copy and ICRC dominate each message, "
				 "which a NIC does in hardware"});
	}
}

// The peers run in their own processes (odpwatch-cache-peers, installed in
// libexec/odpwatch): UCX's and libfabric's hooks patch the same libc
// functions and must not meet in one process, nor meet ours.
void run_peer(Report &rep, const Options &o, const char *peer)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		throw verbs::Error("readlink /proc/self/exe", errno);
	self[n] = 0;
	std::string exe =
		std::string(dirname(self)) + "/" ODPWATCH_PEERS_FROM_BIN "/odpwatch-cache-peers";
	if (access(exe.c_str(), X_OK)) {
		rep.remark("Peer " + std::string(peer) + " not measured: " + exe +
			   " is not installed (built only where UCX and libfabric are).");
		return;
	}
	// Bounded like every program a bench waits for: a hung peer is killed
	// (timeout exits 124) and named in the report, the bench goes on.
	constexpr int kPeerSeconds = 3600;
	std::vector<std::string> args = {"timeout", "-k", "10", std::to_string(kPeerSeconds), exe};
	args.insert(args.end(), {peer, "--reps", std::to_string(o.reps)});
	if (o.quick)
		args.push_back("--quick");
	if (!o.device.empty())
		args.insert(args.end(), {"--device", o.device});
	// The peer's stderr stays ours: its progress shows as it runs.
	int out = -1;
	pid_t pid = spawn(args, &out, false);
	FILE *rows = fdopen(out, "r");
	rep.read_rows(rows);
	std::fclose(rows);
	int status = 0;
	waitpid(pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		rep.remark("Peer " + std::string(peer) + " did not finish (" +
			   (WIFSIGNALED(status)
				    ? std::string("killed by ") + strsignal(WTERMSIG(status))
			    : WEXITSTATUS(status) == 124
				    ? "still running after " + std::to_string(kPeerSeconds) +
					      " s: killed"
				    : "exit status " + std::to_string(WEXITSTATUS(status))) +
			   "); its rows, if any, are what it measured before.");
}

} // namespace

int cache_bench(const Options &o)
{
	verbs::Context ctx = verbs::open_device(o.device);
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Report rep("Registration cache policies on " +
		   std::string(ibv_get_device_name(ctx->device)) +
		   ", beside UCX's ucs_rcache and libfabric's MR cache");
	auto each_policy = [&](auto &&body) {
		for (int p : kPolicies) {
			OurCache c(p, pd.get());
			body(c, p);
		}
	};
	// The stale rows first: a 1 MiB malloc() must come from mmap(), not
	// from a heap the hit rows' 768 malloc'd buffers left free (bench_stale
	// also checks the page frames, and says when nothing could be judged).
	run_sections("cache", o.reps, o.quick, o.only,
		     {{"stale registrations, nine ways to free",
		       [&] {
			       each_policy([&](OurCache &c, int) {
				       if (c.pins_pages())
					       bench_stale(rep, o, c);
			       });
		       }},
		      {"hit path",
		       [&] {
			       each_policy([&](OurCache &c, int p) {
				       bench_hits(rep, o, c, hit_note(p));
			       });
			       each_policy([&](OurCache &c, int p) {
				       bench_hits_many(rep, o, c, hit_note(p));
			       });
		       }},
		      {"misses", [&] { bench_misses(rep, o, pd.get()); }},
		      {"reuse, step by step", [&] { bench_reuse_steps(rep, o, pd.get()); }},
		      {"freed and reused buffers",
		       [&] {
			       std::vector<std::unique_ptr<OurCache>> caches;
			       std::vector<CacheUnderTest *> under_test;
			       for (int p : kPolicies)
				       caches.push_back(std::make_unique<OurCache>(p, pd.get()));
			       caches.push_back(std::make_unique<OurCache>(ODPWATCH_CACHE_PINNED,
									   pd.get(), true));
			       for (auto &c : caches)
				       under_test.push_back(c.get());
			       bench_reuse(rep, o, under_test, true);
		       }},
		      {"munmap of a cached buffer",
		       [&] {
			       bench_unmap(rep, o, nullptr);
			       each_policy([&](OurCache &c, int) { bench_unmap(rep, o, &c); });
		       }},
		      {"MPI-like workload",
		       [&] {
			       each_policy([&](OurCache &c, int) { bench_workload(rep, o, c); });
			       OurCache inline_dereg(ODPWATCH_CACHE_PINNED, pd.get(), true);
			       bench_workload(rep, o, inline_dereg);
		       }},
		      {"MPI-like workload, data moved",
		       [&] { bench_workload_data(rep, o, ctx.get(), pd.get()); }},
		      {"peers: UCX ucs_rcache + ucm hooks", [&] { run_peer(rep, o, "ucx"); }},
		      {"peers: UCX UCP memh (ucp_mem_map) + ucm hooks",
		       [&] { run_peer(rep, o, "ucp"); }},
		      {"peers: UCX UCP memh (ucp_mem_map) + memwatch (libodpwatch-ucx)",
		       [&] { run_peer(rep, o, "ucp-memwatch"); }},
		      {"peers: libfabric MR cache, memhooks",
		       [&] { run_peer(rep, o, "libfabric-memhooks"); }},
		      {"peers: libfabric MR cache, userfaultfd",
		       [&] { run_peer(rep, o, "libfabric-uffd"); }},
		      {"peers: libfabric MR cache, memwatch (libodpwatch-ofi)",
		       [&] { run_peer(rep, o, "libfabric-memwatch"); }},
		      {"peers: libfabric MR cache, memwatch built in",
		       [&] { run_peer(rep, o, "libfabric-memwatch-native"); }},
		      {"peers: libfabric MR cache, disabled",
		       [&] { run_peer(rep, o, "libfabric-disabled"); }}});
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
