// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Shared by the C ABI entry points (memwatch_capi.cpp, regcache.cpp).
#pragma once

#include "verbs.hpp"

#include <cerrno>
#include <new>

namespace odpwatch
{
// Runs f, turning exceptions into a negative errno: none crosses the C ABI.
template <class F> int c_abi_guarded(F &&f)
{
	try {
		return f();
	} catch (const verbs::Error &e) {
		return -e.err();
	} catch (const std::bad_alloc &) {
		return -ENOMEM;
	} catch (...) { // a std::system_error of a lock or a thread, say
		return -EIO;
	}
}
} // namespace odpwatch
