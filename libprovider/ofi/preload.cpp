// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ofi-preload.so: LD_PRELOAD it and memwatch becomes libfabric's
// memory monitor before the program opens its first domain. It interposes
// no symbol; its constructor only imports the monitor. ODPWATCH_OFI_MONITOR=0
// leaves libfabric's own choice (and an Open MPI that imports its patcher)
// alone; ODPWATCH_OFI_DEBUG=1 says what happened on stderr, and at exit
// the monitor's counters (hits: cache hits it confirmed).
#include <odpwatch/ofi_monitor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace
{

bool debug()
{
	const char *v = std::getenv("ODPWATCH_OFI_DEBUG");
	return v && *v && *v != '0';
}

__attribute__((constructor)) void import_memwatch_monitor()
{
	const char *want = std::getenv("ODPWATCH_OFI_MONITOR");
	if (want && !std::strcmp(want, "0"))
		return;
	const int rc = odpwatch_ofi_monitor_import();
	if (rc && debug())
		std::fprintf(stderr, "odpwatch-ofi: memwatch monitor not imported: %s\n",
			     std::strerror(-rc));
}

__attribute__((destructor)) void report_memwatch_monitor()
{
	odpwatch_ofi_stats s{};
	if (!debug() || odpwatch_ofi_monitor_stats(&s))
		return;
	std::fprintf(stderr,
		     "odpwatch-ofi: stats subscribes=%lu hits=%lu stale=%lu notifies=%lu "
		     "refused=%lu\n",
		     (unsigned long)s.subscribes, (unsigned long)s.hits, (unsigned long)s.stale,
		     (unsigned long)s.notifies, (unsigned long)s.refused);
}

} // namespace
