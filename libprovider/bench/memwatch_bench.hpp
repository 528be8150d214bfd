// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#pragma once

#include <string>

namespace odpwatch::bench
{

struct MemwatchBenchOptions {
	bool quick = false;
	bool uffd = true; // compare with a userfaultfd monitor
	unsigned reps = 5;
	std::string csv; // also write the rows here
};

// Prints a markdown table; throws verbs::Error when memwatch is missing.
int memwatch_bench(const MemwatchBenchOptions &o);

} // namespace odpwatch::bench
