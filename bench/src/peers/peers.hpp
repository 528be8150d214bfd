// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration caches ours is measured against, behind the workloads'
// interface. Each runs in a process of its own (odpwatch-cache-peers).
#pragma once

#include "cache_workloads.hpp"

#include <memory>
#include <string>

namespace odpwatch::bench
{

// UCX's ucs_rcache, told of unmaps by ucm's hooks in libc.
std::unique_ptr<CacheUnderTest> make_ucx_rcache(const std::string &device);
// UCX's cache as an application reaches it: UCP's ucp_mem_map() and
// ucp_mem_unmap() of user buffers; @memwatch: libodpwatch-ucx-preload.so is
// in the process (the peer runs itself again with it preloaded).
std::unique_ptr<CacheUnderTest> make_ucp_memh(const std::string &device, bool memwatch);
// libfabric's MR cache inside its verbs provider; @monitor is what
// FI_MR_CACHE_MONITOR names ("memhooks", "userfaultfd"), "memwatch"
// (libodpwatch-ofi imported) or "memwatch-native" (libfabric built with our
// series, loaded from kNativeLibfabricDir).
std::unique_ptr<CacheUnderTest> make_libfabric_cache(const std::string &device,
						     const std::string &monitor);
// Where other-projects/libfabric/build.sh installs that libfabric's libraries,
// relative to the directory of our programs (/out/guest/bin).
inline constexpr const char *kNativeLibfabricDir = "/libfabric/lib";
// And where libodpwatch-ucx-preload.so is, relative to the same directory.
inline constexpr const char *kUcxPreload = "/lib/libodpwatch-ucx-preload.so";

} // namespace odpwatch::bench
