// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#pragma once

#include <odpwatch/odpwatch.h>

#include <string>

namespace odpwatch::cli
{

struct Options {
	std::string device; // empty: the first RDMA device
};

std::string describe_caps(const odpwatch_odp_caps &c);
int demo(const Options &opt);
// The ODP counters of the device's MRs, from RDMA netlink.
int mr_counters(const Options &opt);
// Every memwatch descriptor of every process, with its counters (fdinfo).
int memwatch_stats(const Options &opt);

} // namespace odpwatch::cli
