// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// odpwatch: one command-line tool, with subcommands.
#include "benches.hpp"
#include "cli.hpp"
#include "verbs.hpp"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string_view>

namespace
{

using namespace odpwatch;

void usage(FILE *f)
{
	std::fprintf(
		f,
		"usage: odpwatch [-d DEVICE] COMMAND\n"
		"commands:\n"
		"  caps   the device's On-Demand Paging capabilities\n"
		"  memwatch-stats\n"
		"         every process's memwatch descriptors and their counters\n"
		"  mr-counters\n"
		"         ODP counters of the device's MRs (page faults, invalidations)\n"
		"  demo   the registration-cache problem, shown with RDMA traffic\n"
		"  bench memwatch [--quick] [--reps N] [--csv FILE] [--only SECTION] [--no-uffd]\n"
		"         memwatch against a userfaultfd monitor and a munmap hook\n"
		"  bench odp [--quick] [--reps N] [--csv FILE] [--only SECTION]\n"
		"         ODP against pinned memory: registration, bandwidth\n"
		"  bench cache [--quick] [--reps N] [--csv FILE] [--only SECTION]\n"
		"         the registration cache's policies: hits, misses, reuse\n"
		"  bench ucx [--peer ADDR | --serve] [--quick] [--reps N] [--csv FILE] [--only "
		"SECTION]\n"
		"         ucx_perftest within this node (shared memory, cma, rxe), or\n"
		"         across the cluster's wire (node 0: --peer, node 1: --serve)\n"
		"  bench wire --peer ADDR | --serve [--quick] [--reps N] [--csv FILE]\n"
		"         perftest across the cluster's wire (node 0: --peer, node 1: --serve)\n"
		"  bench mpi --peer ADDR [--quick] [--reps N] [--csv FILE]\n"
		"         NetPIPE's NPmpi from node 0 to ADDR: Open MPI over UCX, pinned and "
		"ODP\n");
}

int caps(const cli::Options &opt)
{
	verbs::Context ctx = verbs::open_device(opt.device);
	odpwatch_odp_caps c{};
	if (int rc = odpwatch_query_odp_caps(ctx.get(), &c))
		throw verbs::Error("odpwatch_query_odp_caps", -rc);
	std::printf("%s: %s", ibv_get_device_name(ctx->device), cli::describe_caps(c).c_str());
	return 0;
}

// A repetition count: digits only, 1 to 10000.
bool parse_reps(std::string_view s, unsigned &reps)
{
	unsigned v = 0;
	auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
	if (ec != std::errc() || end != s.data() + s.size() || v < 1 || v > 10000)
		return false;
	reps = v;
	return true;
}

// The CSV file must be writable before minutes of measuring, not after.
bool csv_writable(const std::string &path)
{
	FILE *f = std::fopen(path.c_str(), "a");
	if (!f) {
		std::fprintf(stderr, "odpwatch bench: cannot write --csv %s: %s\n", path.c_str(),
			     std::strerror(errno));
		return false;
	}
	std::fclose(f);
	return true;
}

// odpwatch bench memwatch|odp|cache|ucx|wire|mpi [--quick] [--reps N] [--csv FILE]
//	[--only SECTION] [--no-uffd] [--peer ADDR | --serve] (wire, ucx; mpi: --peer)
int run_bench(const cli::Options &opt, int argc, char **argv)
{
	std::string_view what = argc >= 1 ? argv[0] : "";
	if (what != "memwatch" && what != "odp" && what != "cache" && what != "ucx" &&
	    what != "wire" && what != "mpi") {
		std::fprintf(stderr, "odpwatch bench: say what to measure: memwatch, odp, cache, "
				     "ucx, wire or mpi\n");
		return 2;
	}
	bool quick = false, uffd = true, serve = false;
	unsigned reps = 0;
	std::string csv, peer, only;
	for (int i = 1; i < argc; i++) {
		std::string_view a = argv[i];
		if (a == "--quick") {
			quick = true;
		} else if (a == "--no-uffd" && what == "memwatch") {
			uffd = false;
		} else if (a == "--serve" && (what == "wire" || what == "ucx")) {
			serve = true;
		} else if (a == "--peer" && (what == "wire" || what == "ucx" || what == "mpi") &&
			   i + 1 < argc) {
			peer = argv[++i];
		} else if (a == "--reps" && i + 1 < argc) {
			if (!parse_reps(argv[++i], reps)) {
				std::fprintf(stderr,
					     "odpwatch bench %s: --reps wants a number from 1 to "
					     "10000, not '%s'\n",
					     argv[0], argv[i]);
				return 2;
			}
		} else if (a == "--csv" && i + 1 < argc) {
			csv = argv[++i];
		} else if (a == "--only" && what != "wire" && i + 1 < argc) {
			only = argv[++i];
		} else {
			const bool wants_value = i + 1 == argc && (a == "--reps" || a == "--csv" ||
								   a == "--only" || a == "--peer");
			std::fprintf(stderr, "odpwatch bench %s: %s %s\n", argv[0],
				     wants_value ? "missing value for" : "bad argument", argv[i]);
			return 2;
		}
	}
	if (!csv.empty() && !csv_writable(csv))
		return 2;
	if (!reps)
		reps = quick ? 3 : 5;
	const bench::Options o{opt.device, quick, uffd, reps, csv, only};
	if (what == "wire") {
		if (serve == !peer.empty()) {
			std::fprintf(stderr, "odpwatch bench wire: give --peer ADDR (node 0) or "
					     "--serve (node 1)\n");
			return 2;
		}
		return bench::wire_bench(o, peer, serve);
	}
	if (what == "mpi") {
		if (peer.empty()) {
			std::fprintf(stderr, "odpwatch bench mpi: give --peer ADDR (node 0 of the "
					     "cluster)\n");
			return 2;
		}
		return bench::mpi_bench(o, peer);
	}
	if (what == "odp")
		return bench::odp_bench(o);
	if (what == "cache")
		return bench::cache_bench(o);
	if (what == "ucx") {
		if (serve && !peer.empty()) {
			std::fprintf(stderr, "odpwatch bench ucx: --peer ADDR (node 0) or --serve "
					     "(node 1), not both\n");
			return 2;
		}
		return bench::ucx_bench(o, peer, serve);
	}
	return bench::memwatch_bench(o);
}

} // namespace

int main(int argc, char **argv)
{
	cli::Options opt;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		std::string_view a = argv[i];
		if ((a == "-d" || a == "--device") && i + 1 < argc) {
			opt.device = argv[++i];
		} else if (a == "-d" || a == "--device") {
			std::fprintf(stderr, "odpwatch: %s wants a device name\n", argv[i]);
			return 2;
		} else if (a == "-h" || a == "--help") {
			usage(stdout);
			return 0;
		} else {
			std::fprintf(stderr, "odpwatch: unknown option %s\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	std::string_view cmd = argv[i];
	if (cmd != "bench" && i + 1 < argc) {
		std::fprintf(stderr, "odpwatch %s: takes no arguments (got %s)\n", argv[i],
			     argv[i + 1]);
		return 2;
	}
	try {
		if (cmd == "caps")
			return caps(opt);
		if (cmd == "demo")
			return cli::demo(opt);
		if (cmd == "mr-counters")
			return cli::mr_counters(opt);
		if (cmd == "memwatch-stats")
			return cli::memwatch_stats(opt);
		if (cmd == "bench")
			return run_bench(opt, argc - i - 1, argv + i + 1);
	} catch (const verbs::Error &e) {
		std::fprintf(stderr, "odpwatch %s: %s\n", argv[i], e.what());
		if (e.err() == EOPNOTSUPP && std::strstr(e.what(), "memwatch"))
			std::fprintf(stderr, "hint: this kernel has no memwatch system call "
					     "(CONFIG_MEMWATCH)\n");
		else if (e.err() == ENOSYS)
			std::fprintf(stderr, "hint: this kernel has no RDMA user verbs "
					     "(CONFIG_INFINIBAND_USER_ACCESS)\n");
		else if (e.err() == ENODEV)
			std::fprintf(stderr, "hint: create a soft-RoCE device: "
					     "rdma link add rxe0 type rxe netdev <netdev>\n");
		else if (e.err() == EPERM || e.err() == EACCES)
			std::fprintf(stderr,
				     "hint: raise RLIMIT_MEMLOCK or run with CAP_IPC_LOCK\n");
		return 1;
	} catch (const std::exception &e) {
		// Anything else (a file system or allocation error) is reported,
		// never std::terminate().
		std::fprintf(stderr, "odpwatch %s: %s\n", argv[i], e.what());
		return 1;
	}
	std::fprintf(stderr, "odpwatch: unknown command %s\n", argv[i]);
	usage(stderr);
	return 2;
}
