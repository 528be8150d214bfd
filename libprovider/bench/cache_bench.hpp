// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#pragma once

#include <string>

namespace odpwatch::bench
{

struct CacheBenchOptions {
	std::string device; // empty: the first RDMA device
	bool quick = false;
	unsigned reps = 5;
	std::string csv; // also write the rows here
};

// The registration cache under each policy: hit path, miss, a freed and
// remapped buffer, and an MPI-like reuse workload. Prints a markdown table.
int cache_bench(const CacheBenchOptions &o);

} // namespace odpwatch::bench
