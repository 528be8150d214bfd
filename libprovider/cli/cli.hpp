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

} // namespace odpwatch::cli
