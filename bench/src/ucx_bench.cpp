// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Single copy within a node (cross memory attach: "a single copy of the
// message rather than a double copy via shared memory"): UCX's ucx_perftest
// between two processes of this node, tag-matched messages of 4 KiB to 4 MiB,
// over UCX's shared-memory transport alone (every byte copied in and out of
// a shared segment), shared memory with cma (large messages read once from
// the sender with process_vm_readv), and rc_verbs over rxe looping back to
// itself, pinned and with on-demand paging.
#include "benches.hpp"
#include "report.hpp"
#include "spawn.hpp"
#include "verbs.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace odpwatch::bench
{
namespace
{

struct Transport {
	const char *name;
	std::vector<std::string> env; // UCX_* settings, as env(1) takes them
	const char *how;
};

std::vector<Transport> transports(const std::string &dev)
{
	// rc_verbs needs ud_verbs beside it to connect (UCX's auxiliary
	// transport); the rendezvous of the zero-copy rows is a read from the
	// sender's buffer (cma: process_vm_readv; rc: RDMA READ).
	const std::vector<std::string> rc = {
		"UCX_TLS=rc_verbs,ud_verbs", "UCX_NET_DEVICES=" + dev + ":1",
		"UCX_UD_VERBS_ETH_DGID_CHECK=n", "UCX_RNDV_SCHEME=get_zcopy"};
	std::vector<std::string> rc_odp = rc;
	rc_odp.push_back("UCX_REG_NONBLOCK_MEM_TYPES=host");
	return {
		{"shared memory (posix)",
		 {"UCX_TLS=posix"},
		 "UCX's shared-memory transport alone: the sender copies into a shared "
		 "segment, the receiver copies out"},
		{"shared memory + cma",
		 {"UCX_TLS=posix,cma", "UCX_RNDV_SCHEME=get_zcopy"},
		 "rendezvous messages read from the sender's buffer with process_vm_readv: "
		 "one copy"},
		{"rc_verbs over rxe, pinned", rc,
		 "rxe looping back to itself; the receiver's RDMA READ of the sender's "
		 "pinned buffer"},
		{"rc_verbs over rxe, ODP", rc_odp,
		 "the same with UCX registering on-demand-paging MRs "
		 "(UCX_REG_NONBLOCK_MEM_TYPES=host)"},
	};
}

// A client run, started again while its server is not listening yet
// (up to @tries times, half a second apart).
Exit run_client(const std::vector<std::string> &argv, int tries)
{
	for (int i = 0;; i++) {
		std::this_thread::sleep_for(std::chrono::milliseconds(i ? 500 : 300));
		int fd = -1;
		pid_t pid = spawn(argv, &fd, true);
		Exit c = wait_for(pid, fd, "ucx_perftest client", 600);
		if (c.ok || c.out.find("connect") == std::string::npos || i == tries)
			return c;
	}
}

// One run: a server and a client on this node, meeting on a port of the
// loopback interface. Returns the client's output.
std::string perftest(const Transport &t, const std::string &test, size_t size, unsigned iters,
		     unsigned port)
{
	std::vector<std::string> base = {"env"};
	base.insert(base.end(), t.env.begin(), t.env.end());
	// The protocols UCX chose, so a row cannot silently measure another
	// transport than its name says.
	base.insert(base.end(), {"UCX_PROTO_INFO=y", "ucx_perftest", "-p", std::to_string(port)});
	int sfd = -1;
	pid_t server = spawn(base, &sfd, true);
	std::vector<std::string> client = base;
	client.insert(client.end(), {"127.0.0.1", "-t", test, "-s", std::to_string(size), "-n",
				     std::to_string(iters)});
	Exit c = run_client(client, 40);
	// A client that failed leaves its server waiting for a connection.
	Exit s = c.ok ? wait_for(server, sfd, "ucx_perftest server", 60) : stop(server, sfd);
	if (!c.ok || !s.ok)
		throw verbs::Error("ucx_perftest -t " + test + " (" + t.name +
					   ") failed; client:\n" + c.out + "\nserver:\n" + s.out,
				   EIO);
	return c.out;
}

// A size in UCX_PROTO_INFO's ranges: "8247", "256K", "inf".
size_t proto_size(const std::string &s)
{
	if (s == "inf")
		return SIZE_MAX;
	size_t used = 0;
	const unsigned long long n = std::stoull(s, &used);
	const char unit = used < s.size() ? s[used] : 0;
	return size_t(n) << (unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0);
}

// The protocol UCX_PROTO_INFO says the sender of the first tagged-message
// table uses for @size, with its transport, e.g. "rendezvous zero-copy read
// from remote (cma/memory)"; empty if the output has no such table.
std::string chosen_protocol(const std::string &out, size_t size)
{
	static const std::regex row(R"(\|\s*(\w+)\.\.(\w+)\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|)");
	std::istringstream in(out);
	std::string line;
	bool in_table = false;
	while (std::getline(in, line)) {
		if (line.find("tagged message by ucp_tag_send") != std::string::npos) {
			in_table = true;
			continue;
		}
		std::smatch m;
		if (!in_table || !std::regex_search(line, m, row))
			continue;
		try {
			if (proto_size(m[1]) <= size && size <= proto_size(m[2]))
				return m[3].str() + " (" + m[4].str() + ")";
		} catch (const std::exception &) {
			// a row of another shape
		}
	}
	return "";
}

// The "Final:" line: iterations, then overhead (µs; one way for the
// latency tests) 50th percentile, average, overall, bandwidth (MB/s)
// average, overall, message rate average, overall.
std::vector<double> final_line(const std::string &out)
{
	std::istringstream in(out);
	std::string line;
	std::vector<double> v;
	while (std::getline(in, line)) {
		size_t at = line.find("Final:");
		if (at == std::string::npos)
			continue;
		// strtod, not >>: a column may read "inf".
		const char *p = line.c_str() + at + 6;
		for (char *end;; p = end) {
			const double x = std::strtod(p, &end);
			if (end == p)
				break;
			v.push_back(x);
		}
	}
	if (v.size() < 6)
		throw verbs::Error("ucx_perftest: no Final: line in its output:\n" + out, EIO);
	return v;
}

unsigned bw_iters(size_t size, bool quick)
{
	const size_t total = size_t(quick ? 32 : 128) << 20; // bytes moved per run
	return unsigned(std::clamp<size_t>(total / size, 32, 20000));
}

unsigned lat_iters(size_t size, bool quick)
{
	const size_t total = size_t(quick ? 8 : 32) << 20; // bytes per direction
	return unsigned(std::clamp<size_t>(total / size, 20, quick ? 500 : 2000));
}

// Across the two-guest wire: UCX's one-sided put and get and its tag
// latency between node 0 and node 1, rc_verbs pinned against ODP. Node 1
// serves every run of the same schedule, one ucx_perftest server each, on
// a port of its own.
int ucx_wire_bench(const Options &o, const std::string &dev, const std::string &peer, bool serve)
{
	struct Run {
		const char *test;
		size_t size;
		bool odp;
	};
	std::vector<Run> runs;
	for (unsigned r = 0; r < o.reps; r++) {
		for (const char *test : {"ucp_put_bw", "ucp_get"})
			for (size_t size : {64U << 10, 1U << 20})
				for (bool odp : {false, true})
					runs.push_back({test, size, odp});
		for (size_t size : {4U << 10, 1U << 20})
			for (bool odp : {false, true})
				runs.push_back({"tag_lat", size, odp});
	}
	const std::vector<Transport> ts = transports(dev);
	const unsigned base_port = 13900;
	auto argv_of = [&](const Run &r, size_t i) {
		const Transport &t = ts[r.odp ? 3 : 2];
		std::vector<std::string> a = {"env"};
		a.insert(a.end(), t.env.begin(), t.env.end());
		a.insert(a.end(), {"ucx_perftest", "-p", std::to_string(base_port + i)});
		return a;
	};
	if (serve) {
		for (size_t i = 0; i < runs.size(); i++) {
			int fd = -1;
			Exit s = wait_for(spawn(argv_of(runs[i], i), &fd, true), fd,
					  "ucx_perftest server (waiting for the other node)", 900);
			if (!s.ok)
				throw verbs::Error("ucx_perftest server failed:\n" + s.out, EIO);
			std::fprintf(stderr, "ucx wire: served %zu/%zu\n", i + 1, runs.size());
		}
		return 0;
	}
	struct Cell {
		Run run;
		std::vector<double> ns;
		long faults = 0;
	};
	std::vector<Cell> cells;
	for (size_t i = 0; i < runs.size(); i++) {
		const Run &r = runs[i];
		const bool lat = std::string(r.test) == "tag_lat";
		std::vector<std::string> a = argv_of(r, i);
		a.insert(a.end(), {peer, "-t", r.test, "-s", std::to_string(r.size), "-n",
				   std::to_string(lat ? lat_iters(r.size, o.quick)
						      : bw_iters(r.size, o.quick))});
		const long f0 = odp_counter(dev, "odp_page_faults");
		// The other node may still be ending its last run: two minutes.
		Exit c = run_client(a, 240);
		if (!c.ok)
			throw verbs::Error("ucx_perftest against " + peer + " failed:\n" + c.out,
					   EIO);
		const std::vector<double> v = final_line(c.out);
		const double ns = lat ? 1e3 * v[3] : 1e9 / v[5];
		auto k = std::find_if(cells.begin(), cells.end(), [&](const Cell &x) {
			return x.run.test == r.test && x.run.size == r.size && x.run.odp == r.odp;
		});
		if (k == cells.end())
			k = cells.insert(cells.end(), Cell{r, {}, 0});
		k->ns.push_back(ns);
		k->faults += odp_counter(dev, "odp_page_faults") - f0;
		std::fprintf(stderr, "ucx wire: run %zu/%zu: %s %s%s\n", i + 1, runs.size(), r.test,
			     size_name(r.size).c_str(), r.odp ? " ODP" : "");
	}
	Report rep("UCX between two kernels on a wire: ucx_perftest, rc_verbs over rxe (" + dev +
		   ", peer " + peer + ")");
	for (const Cell &c : cells) {
		const bool lat = std::string(c.run.test) == "tag_lat";
		const std::string group =
			std::string("across the wire: ucx_perftest ") + c.run.test +
			(lat ? " (one-way latency, overall)" : " (ns per MB, 1e9 / MB/s overall)");
		// Not the loopback rows' notes: here the peer is the other kernel.
		std::string note =
			std::string("rc_verbs to the other node, UCX_RNDV_SCHEME=get_zcopy, ") +
			(c.run.odp ? "on-demand-paging MRs (UCX_REG_NONBLOCK_MEM_TYPES=host)"
				   : "pinned MRs");
		if (c.run.odp)
			note += "; this node's odp_page_faults +" + std::to_string(c.faults) +
				" over its runs";
		rep.add({group, size_name(c.run.size), c.run.odp ? "ODP" : "pinned",
			 spread_of(c.ns), "pinned/" + size_name(c.run.size), note});
	}
	rep.finish(o.csv);
	return 0;
}

} // namespace

long odp_counter(const std::string &dev, const char *name)
{
	FILE *f = std::fopen(
		("/sys/class/infiniband/" + dev + "/ports/1/hw_counters/" + name).c_str(), "r");
	long n = -1;
	if (f) {
		if (std::fscanf(f, "%ld", &n) != 1)
			n = -1;
		std::fclose(f);
	}
	return n;
}

int ucx_bench(const Options &o, const std::string &peer, bool serve)
{
	verbs::Context ctx = verbs::open_device(o.device);
	const std::string dev = ibv_get_device_name(ctx->device);
	if (serve || !peer.empty())
		return ucx_wire_bench(o, dev, peer, serve);
	const std::vector<Transport> ts = transports(dev);
	// Each run starts two UCX processes (~7 s under TCG): a quick run
	// measures the two ends of the range only.
	const std::vector<size_t> sizes =
		o.quick ? std::vector<size_t>{4U << 10, 1U << 20}
			: std::vector<size_t>{4U << 10, 64U << 10, 1U << 20, 4U << 20};
	struct Series {
		std::string test;
		size_t size;
		size_t transport;
		std::vector<double> ns;
		std::string proto_seen;
	};
	std::vector<Series> all;
	for (const char *test : {"tag_bw", "tag_lat"})
		for (size_t size : sizes)
			for (size_t t = 0; t < ts.size(); t++)
				all.push_back({test, size, t, {}, ""});

	Report rep("Single copy within a node: ucx_perftest between two processes (" + dev + ")");
	// Every repetition runs every cell once, transports side by side, so a
	// drift of the machine's speed falls on all of them.
	const unsigned total = o.reps * unsigned(all.size());
	unsigned done = 0, port = 13400;
	auto started = std::chrono::steady_clock::now();
	for (unsigned r = 0; r < o.reps; r++) {
		for (Series &s : all) {
			if (!o.only.empty() && s.test.find(o.only) == std::string::npos)
				continue;
			const bool bw = s.test == "tag_bw";
			const unsigned iters =
				bw ? bw_iters(s.size, o.quick) : lat_iters(s.size, o.quick);
			// A fresh port each run: the last server's may linger.
			const std::string out =
				perftest(ts[s.transport], s.test, s.size, iters, port++);
			const std::vector<double> v = final_line(out);
			// ns per MB of bandwidth, or the one-way latency in ns:
			// the "overall" columns (the averages of the last
			// report interval may read inf).
			s.ns.push_back(bw ? 1e9 / v[5] : 1e3 * v[3]);
			if (s.proto_seen.empty())
				s.proto_seen = chosen_protocol(out, s.size);
			done++;
			std::fprintf(stderr, "ucx: %u/%u runs, %.0f s\n", done, total,
				     std::chrono::duration<double>(
					     std::chrono::steady_clock::now() - started)
					     .count());
		}
	}
	for (const Series &s : all) {
		if (s.ns.empty())
			continue;
		const bool bw = s.test == "tag_bw";
		const std::string group =
			bw ? "one node: ucx_perftest tag_bw (ns per MB, 1e9 / MB/s overall)"
			   : "one node: ucx_perftest tag_lat (one-way latency, overall)";
		const Transport &t = ts[s.transport];
		const std::string note =
			std::string(t.how) + "; UCX chose: " +
			(s.proto_seen.empty() ? "? (no UCX_PROTO_INFO table)" : s.proto_seen);
		rep.add({group, size_name(s.size), t.name, spread_of(s.ns),
			 std::string(ts[0].name) + "/" + size_name(s.size), note});
	}
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
