// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// perftest across the two-guest wire (make cluster): bandwidth of 64 KiB and
// 1 MiB messages and latency, pinned against --odp, first touch against
// steady state, and the wire against one node's loopback. Node 1 runs
// `odpwatch bench wire --serve`, node 0 `odpwatch bench wire --peer ADDR`:
// both walk the same schedule, one server run for each client run.
#include "benches.hpp"
#include "perftest.hpp"
#include "report.hpp"
#include "verbs.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace odpwatch::bench
{
namespace
{

struct Run {
	std::string tool;
	unsigned size;	// bytes per message
	unsigned iters; // messages
	bool odp;
};

bool latency(const Run &r)
{
	return r.tool.ends_with("_lat");
}

// What "first touch" and "steady state" mean for a message size: a run
// short enough that ODP's faults on the buffers dominate it, and one long
// enough that they do not.
unsigned first_touch_iters(unsigned size)
{
	return size >= (1U << 20) ? 5 : 16; // perftest runs at least 5
}

unsigned steady_iters(unsigned size, bool quick)
{
	unsigned mib = quick ? 64 : 256; // data moved per steady run
	return std::max(64U, (mib << 20) / size);
}

// Every client run of the cross-node part, in order: the server walks the
// same list, so both ends meet. Pinned and --odp alternate within each
// repetition, so the machine's drift falls on both.
std::vector<Run> wire_schedule(const Options &o)
{
	std::vector<Run> runs;
	for (unsigned rep = 0; rep < o.reps; rep++) {
		for (const char *tool : {"ib_write_bw", "ib_read_bw"})
			for (unsigned size : {64U << 10, 1U << 20})
				for (unsigned iters :
				     {first_touch_iters(size), steady_iters(size, o.quick)})
					for (bool odp : {false, true})
						runs.push_back({tool, size, iters, odp});
		for (bool odp : {false, true})
			runs.push_back({"ib_write_lat", 64, o.quick ? 500U : 2000U, odp});
	}
	return runs;
}

std::vector<std::string> args_of(const Run &r, int gid, const std::string &dev)
{
	std::vector<std::string> a = {"-d",
				      dev,
				      "-x",
				      std::to_string(gid),
				      "-F",
				      "-s",
				      std::to_string(r.size),
				      "-n",
				      std::to_string(r.iters)};
	if (r.odp)
		a.push_back("--odp");
	return a;
}

std::string param_of(const Run &r)
{
	if (latency(r))
		return std::to_string(r.iters) + " iterations";
	return (r.iters == first_touch_iters(r.size) ? "first touch, " : "steady, ") +
	       std::to_string(r.iters) + " messages";
}

std::string group_of(const Run &r)
{
	if (latency(r))
		return "across the wire: perftest " + r.tool + ", " + std::to_string(r.size) +
		       "-byte messages";
	return "across the wire: perftest " + r.tool + ", " + size_name(r.size) + " messages";
}

} // namespace

int wire_bench(const Options &o, const std::string &peer, bool serve)
{
	verbs::Context ctx = verbs::open_device(o.device);
	const int gid = verbs::roce_v2_ipv4_gid_index(ctx.get());
	const std::string dev = ibv_get_device_name(ctx->device);
	const std::vector<Run> runs = wire_schedule(o);
	if (serve) {
		for (size_t i = 0; i < runs.size(); i++) {
			perftest_serve(runs[i].tool, args_of(runs[i], gid, dev));
			std::fprintf(stderr, "wire: served %zu/%zu\n", i + 1, runs.size());
		}
		return 0;
	}

	Report rep("perftest between two kernels on a wire (" + dev + ", peer " + peer + ")");
	struct Key {
		Run run;
		std::vector<double> ns; // per MB (bandwidth) or per message (latency)
	};
	std::vector<Key> keys;
	unsigned reruns = 0;
	for (size_t i = 0; i < runs.size(); i++) {
		const Run &r = runs[i];
		double ns;
		if (latency(r)) {
			ns = 1e3 *
			     perftest_lat_us(r.tool,
					     perftest_run(r.tool, args_of(r, gid, dev), peer));
		} else {
			ns = 1e9 /
			     perftest_bw_calibrated(r.tool, args_of(r, gid, dev), peer, reruns);
		}
		auto k = std::find_if(keys.begin(), keys.end(), [&](const Key &x) {
			return x.run.tool == r.tool && x.run.size == r.size &&
			       x.run.iters == r.iters && x.run.odp == r.odp;
		});
		if (k == keys.end())
			keys.push_back({r, {ns}});
		else
			k->ns.push_back(ns);
		std::fprintf(stderr, "wire: run %zu/%zu: %s %s%s\n", i + 1, runs.size(),
			     r.tool.c_str(), param_of(r).c_str(), r.odp ? " --odp" : "");
	}
	const std::string unit_bw = "ns per MB (1e9 / perftest's average MB/sec)",
			  unit_lat = "ns per message (perftest's t_avg)";
	for (const Key &k : keys)
		rep.add({group_of(k.run), param_of(k.run), k.run.odp ? "--odp" : "pinned",
			 spread_of(k.ns), "pinned/" + param_of(k.run),
			 latency(k.run) ? unit_lat : unit_bw});

	// The same steady runs within one node (rxe looping back to itself),
	// pinned, against which the wire's figure is put.
	for (unsigned size : {64U << 10, 1U << 20}) {
		const Run r{"ib_write_bw", size, steady_iters(size, o.quick), false};
		std::vector<double> loop;
		for (unsigned rep_i = 0; rep_i < o.reps; rep_i++)
			loop.push_back(1e9 / perftest_bw_calibrated(r.tool, args_of(r, gid, dev),
								    "", reruns));
		auto k = std::find_if(keys.begin(), keys.end(), [&](const Key &x) {
			return x.run.tool == r.tool && x.run.size == r.size &&
			       x.run.iters == r.iters && !x.run.odp;
		});
		const std::string g = "ib_write_bw, " + size_name(size) +
				      " messages: wire against loopback",
				  w = param_of(r);
		rep.add({g, w, "loopback (one node)", spread_of(loop), "loopback (one node)/" + w,
			 unit_bw + ": rxe to itself on node 0"});
		rep.add({g, w, "across the wire", spread_of(k->ns), "loopback (one node)/" + w,
			 unit_bw + ": node 0 to node 1"});
	}
	if (reruns)
		rep.remark(std::to_string(reruns) +
			   " run(s) repeated: perftest's clock calibration failed");
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
