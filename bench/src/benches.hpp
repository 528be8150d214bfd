// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The benchmarks of `odpwatch bench`. Each prints a markdown table of ratios
// against a baseline measured in the same run.
#pragma once

#include <string>

namespace odpwatch::bench
{

struct Options {
	std::string device; // empty: the first RDMA device
	bool quick = false;
	bool uffd = true; // memwatch: compare with a userfaultfd monitor
	unsigned reps = 5;
	std::string csv;  // also write the rows here
	std::string only; // run only the sections whose name contains this
};

// memwatch against a userfaultfd monitor and an interposed munmap hook;
// throws verbs::Error when memwatch is missing.
int memwatch_bench(const Options &o);
// ODP against pinned memory; needs root for the fault-around parameter.
int odp_bench(const Options &o);
// The registration cache's policies: hits, misses, reuse, MPI-like workload.
int cache_bench(const Options &o);
// ucx_perftest between two processes of this node: shared memory, cma and
// rc_verbs over rxe (pinned, ODP); or across the two-guest wire, node 0
// measuring against @peer, node 1 serving (@serve) the same schedule.
int ucx_bench(const Options &o, const std::string &peer = "", bool serve = false);
// Open MPI's NetPIPE (NPmpi) across the two-guest wire, from node 0 to
// @peer, pml ucx over rc_verbs, pinned against ODP registrations.
int mpi_bench(const Options &o, const std::string &peer);
// perftest across the two-guest wire: node 0 measures against @peer, node 1
// serves (@serve) the same schedule of runs.
int wire_bench(const Options &o, const std::string &peer, bool serve);

// One of the device's ODP counters (rxe's hw_counters, e.g.
// "odp_page_faults"), or -1.
long odp_counter(const std::string &dev, const char *name);

} // namespace odpwatch::bench
