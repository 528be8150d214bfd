// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The checks of our C++ test programs: a failed one throws Failure, which
// the program reports as its test's "not ok" line.
#pragma once

#include <cstddef>
#include <fstream>
#include <stdexcept>
#include <string>

namespace odpwatch::test
{

struct Failure : std::runtime_error {
	using std::runtime_error::runtime_error;
};

// Pages this process has pinned (mm->pinned_vm), from /proc/self/status.
inline size_t vm_pin_kib()
{
	std::ifstream status("/proc/self/status");
	for (std::string line; std::getline(status, line);)
		if (line.rfind("VmPin:", 0) == 0)
			return std::stoul(line.substr(6));
	throw Failure("no VmPin in /proc/self/status");
}

} // namespace odpwatch::test

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			throw odpwatch::test::Failure(std::string(__func__) + ":" +                \
						      std::to_string(__LINE__) + ": " #cond);      \
	} while (0)

#define CHECK_RC(expr, want)                                                                       \
	do {                                                                                       \
		int rc_ = (expr);                                                                  \
		if (rc_ != (want))                                                                 \
			throw odpwatch::test::Failure(std::string(#expr) + " = " +                 \
						      std::to_string(rc_) + ", want " #want);      \
	} while (0)
