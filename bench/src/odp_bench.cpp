// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// On-Demand Paging against pinned memory on one device: registration cost by
// size; RDMA WRITE/READ and SEND bandwidth into ODP memory on first touch
// (each fault brings in a 4 MiB window) and in steady state; a
// faulting QP beside a quiet one; perftest's own tools with and without --odp.
#include "benches.hpp"
#include "perftest.hpp"
#include "report.hpp"
#include "verbs.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace odpwatch::bench
{
namespace
{

constexpr unsigned kOdp = IBV_ACCESS_ON_DEMAND;
constexpr unsigned kRemote =
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

void touch(const verbs::Mapping &m)
{
	std::memset(m.data(), 0x5a, m.size());
}

// Registration alone: deregistration (which waits for the MR's references to
// drop) is done after the timed part.
Spread time_reg(const Options &o, ibv_pd *pd, void *addr, size_t len, unsigned access)
{
	std::vector<double> samples;
	for (unsigned r = 0; r <= o.reps; r++) {
		auto t0 = std::chrono::steady_clock::now();
		verbs::Mr mr = verbs::reg_mr(pd, addr, len, access);
		auto t1 = std::chrono::steady_clock::now();
		if (r) // the first is the warm-up
			samples.push_back(
				std::chrono::duration<double, std::nano>(t1 - t0).count());
	}
	return spread_of(samples);
}

void bench_registration(Report &rep, const Options &o, ibv_pd *pd)
{
	const std::string g = "registration (ibv_reg_mr)";
	std::vector<size_t> sizes = {4UL << 10, 1UL << 20, 64UL << 20};
	if (!o.quick) {
		sizes.insert(sizes.begin() + 1, 64UL << 10);
		sizes.push_back(1UL << 30);
	}
	for (size_t n : sizes) {
		verbs::Mapping m(n);
		touch(m); // registration only: no first-touch faults in the figure
		std::string w = size_name(n);
		rep.add({g, w, "pinned", time_reg(o, pd, m.data(), n, kRemote), "pinned/" + w,
			 "pins and maps every page"});
		rep.add({g, w, "explicit ODP", time_reg(o, pd, m.data(), n, kRemote | kOdp),
			 "pinned/" + w, "maps what is present, pins nothing"});
		rep.add({g, w, "implicit ODP", time_reg(o, pd, nullptr, SIZE_MAX, kRemote | kOdp),
			 "pinned/" + w, "one MR for the address space, any size"});
	}
}

// Bytes moved per rep and per message in the bandwidth rows.
struct Traffic {
	size_t total, msg;
};

// RDMA @op of traffic.total bytes, msg by msg, between @local and @remote.
void move(verbs::LoopbackQp &qp, ibv_wr_opcode op, const ibv_mr *local, const verbs::Mapping &lbuf,
	  const ibv_mr *remote, const verbs::Mapping &rbuf, Traffic t)
{
	for (size_t off = 0; off < t.total; off += t.msg) {
		ibv_wc_status st = qp.rdma(op, local, lbuf.data() + off, t.msg, remote,
					   rbuf.data() + off, std::chrono::minutes(10));
		if (st != IBV_WC_SUCCESS)
			throw verbs::Error(std::string("RDMA: ") + ibv_wc_status_str(st), EIO);
	}
}

void bench_bandwidth(Report &rep, const Options &o, ibv_context *ctx, ibv_pd *pd)
{
	const Traffic t{o.quick ? 16UL << 20 : 64UL << 20, 1UL << 20};
	const double mib = double(t.total >> 20);
	verbs::LoopbackQp qp(ctx, pd);
	verbs::Mapping lbuf(t.total);
	touch(lbuf);
	verbs::Mr local = verbs::reg_mr(pd, lbuf.data(), t.total, kRemote);

	for (auto [op, name] :
	     {std::pair{IBV_WR_RDMA_WRITE, "RDMA WRITE into the responder's memory"},
	      std::pair{IBV_WR_RDMA_READ, "RDMA READ of the responder's memory"},
	      std::pair{IBV_WR_SEND, "SEND into the responder's receive buffer"}}) {
		const std::string g = std::string(name) + ", " + size_name(t.msg) + " messages";
		const std::string w = size_name(t.total) + " per rep", base = "pinned/" + w;
		{
			// Steady state: the untimed first run maps every ODP page.
			// Interleaved, as these ratios are the ones read most closely.
			verbs::Mapping rp(t.total), re(t.total), ri(t.total);
			touch(rp);
			touch(re);
			touch(ri);
			verbs::Mr pinned = verbs::reg_mr(pd, rp.data(), t.total, kRemote);
			verbs::Mr odp = verbs::reg_mr(pd, re.data(), t.total, kRemote | kOdp);
			verbs::Mr implicit = verbs::reg_mr(pd, nullptr, SIZE_MAX, kRemote | kOdp);
			auto s = measure_interleaved(
				o.reps, mib,
				{[&] { move(qp, op, local.get(), lbuf, pinned.get(), rp, t); },
				 [&] { move(qp, op, local.get(), lbuf, odp.get(), re, t); },
				 [&] { move(qp, op, local.get(), lbuf, implicit.get(), ri, t); }});
			rep.add({g, w, "pinned", s[0], base,
				 "ns per MiB; interleaved with the next two"});
			rep.add({g, w, "ODP steady state", s[1], base, "pages present"});
			rep.add({g, w, "implicit ODP steady state", s[2], base, "pages present"});
		}
		// First touch: a fresh, never-touched mapping for every rep.
		auto first_touch = [&](verbs::LoopbackQp &q) {
			std::vector<double> samples;
			for (unsigned i = 0; i <= o.reps; i++) {
				verbs::Mapping r(t.total);
				verbs::Mr mr = verbs::reg_mr(pd, r.data(), t.total, kRemote | kOdp);
				auto t0 = std::chrono::steady_clock::now();
				move(q, op, local.get(), lbuf, mr.get(), r, t);
				auto t1 = std::chrono::steady_clock::now();
				if (i) // the first is the warm-up
					samples.push_back(
						std::chrono::duration<double, std::nano>(t1 - t0)
							.count() /
						double(t.total >> 20));
			}
			return spread_of(samples);
		};
		rep.add({g, w, "ODP first touch, fault-around 4 MiB", first_touch(qp), base,
			 "every page faulted; " + size_name(t.total) + " per rep"});
		// The same where the responder asks for rdma_cm's RNR timer
		// (655 ms: rdma_cm sets min_rnr_timer 0 unless the application
		// calls rdma_set_min_rnr_timer()): each fault answered with an
		// RNR NAK costs that much.
		if (op == IBV_WR_RDMA_WRITE) {
			verbs::LoopbackQp cm_qp(ctx, pd, 0);
			rep.add({g, w, "ODP first touch, responder RNR timer 655 ms (rdma_cm's)",
				 first_touch(cm_qp), base,
				 "min_rnr_timer 0, as rdma_cm leaves it; every page faulted"});
		}
	}
}

// A QP whose peer keeps faulting must not hold up another QP of the device:
// 4 KiB pinned writes on one QP, alone and while a second QP writes 1 MiB
// messages into never-touched ODP memory, one per fault-around window, so
// that every message faults.
void bench_isolation(Report &rep, const Options &o, ibv_context *ctx, ibv_pd *pd)
{
	const std::string g = "4 KiB pinned RDMA WRITE on one QP", w = "500 writes";
	const size_t small = 4096, n = 500;
	verbs::LoopbackQp qp(ctx, pd);
	verbs::Mapping a(small), b(small);
	touch(a);
	touch(b);
	verbs::Mr ma = verbs::reg_mr(pd, a.data(), small, kRemote);
	verbs::Mr mb = verbs::reg_mr(pd, b.data(), small, kRemote);
	auto writes = [&] {
		for (size_t i = 0; i < n; i++)
			if (qp.rdma(IBV_WR_RDMA_WRITE, ma.get(), a.data(), small, mb.get(),
				    b.data()) != IBV_WC_SUCCESS)
				throw verbs::Error("RDMA WRITE on the quiet QP", EIO);
	};
	rep.add({g, w, "alone", measure(o.reps, double(n), writes), "alone/" + w, "ns per write"});

	std::atomic<bool> stop{false};
	std::atomic<size_t> faulting_mib{0};
	std::exception_ptr noisy_error;
	std::thread noisy([&] {
		try {
			verbs::LoopbackQp qp2(ctx, pd);
			const size_t msg = 1UL << 20, window = 4UL << 20, len = 8 * window;
			verbs::Mapping src(msg);
			touch(src);
			verbs::Mr msrc = verbs::reg_mr(pd, src.data(), msg, kRemote);
			while (!stop) {
				verbs::Mapping dst(len); // never touched
				verbs::Mr mdst = verbs::reg_mr(pd, dst.data(), len, kRemote | kOdp);
				// A message per window: each one past the last fault's reach.
				for (size_t off = 0; off < len && !stop; off += window) {
					qp2.rdma(IBV_WR_RDMA_WRITE, msrc.get(), src.data(), msg,
						 mdst.get(), dst.data() + off,
						 std::chrono::minutes(10));
					faulting_mib++;
				}
			}
		} catch (...) {
			noisy_error = std::current_exception();
		}
	});
	Spread busy;
	try {
		busy = measure(o.reps, double(n), writes);
	} catch (...) {
		stop = true;
		noisy.join();
		throw;
	}
	stop = true;
	noisy.join();
	if (noisy_error)
		std::rethrow_exception(noisy_error);
	rep.add({g, w, "beside a faulting QP", busy, "alone/" + w,
		 std::to_string(faulting_mib.load()) + " MiB faulted in meanwhile"});
}

// perftest's own tools beside our bench: the same device, pinned against
// --odp, each run in two processes as users run it.
void bench_perftest(Report &rep, const Options &o, ibv_context *ctx)
{
	const int gid = verbs::roce_v2_ipv4_gid_index(ctx);
	const std::string dev = ibv_get_device_name(ctx->device), msg = "65536";
	const unsigned iters = o.quick ? 500 : 2000;
	for (const char *tool : {"ib_write_bw", "ib_read_bw", "ib_send_bw"}) {
		const std::string g = std::string("perftest ") + tool + ", 64 KiB messages",
				  w = std::to_string(iters) + " iterations", base = "pinned/" + w;
		for (bool odp : {false, true}) {
			std::vector<std::string> args = {"-d", dev, "-x", std::to_string(gid),
							 "-s", msg, "-n", std::to_string(iters),
							 "-F"};
			if (odp)
				args.push_back("--odp");
			std::vector<double> samples;
			unsigned reruns = 0;
			for (unsigned r = 0; r < o.reps; r++)
				samples.push_back(1e9 /
						  perftest_bw_calibrated(tool, args, "", reruns));
			std::string note = "ns per MB (1e9 / perftest's average MB/sec); first "
					   "touch included";
			if (reruns)
				note += "; " + std::to_string(reruns) +
					" run(s) repeated: perftest's clock calibration failed";
			rep.add({g, w, odp ? "--odp" : "pinned", spread_of(samples), base, note});
		}
	}
}

} // namespace

int odp_bench(const Options &o)
{
	verbs::Context ctx = verbs::open_device(o.device);
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Report rep("On-Demand Paging against pinned memory on " +
		   std::string(ibv_get_device_name(ctx->device)));
	run_sections("odp", o.reps, o.quick, o.only,
		     {{"registration", [&] { bench_registration(rep, o, pd.get()); }},
		      {"bandwidth", [&] { bench_bandwidth(rep, o, ctx.get(), pd.get()); }},
		      {"isolation", [&] { bench_isolation(rep, o, ctx.get(), pd.get()); }},
		      {"perftest", [&] { bench_perftest(rep, o, ctx.get()); }}});
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
