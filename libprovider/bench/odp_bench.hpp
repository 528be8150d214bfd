// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#pragma once

#include <string>

namespace odpwatch::bench
{

struct OdpBenchOptions {
	std::string device; // empty: the first RDMA device
	bool quick = false;
	unsigned reps = 5;
	std::string csv; // also write the rows here
};

// Prints a markdown table; needs root for the fault-around module parameter.
int odp_bench(const OdpBenchOptions &o);

} // namespace odpwatch::bench
