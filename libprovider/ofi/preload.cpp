// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ofi-preload.so: LD_PRELOAD it and memwatch becomes libfabric's
// memory monitor before the program opens its first domain. It interposes
// no symbol; its constructor only imports the monitor. ODPWATCH_OFI_MONITOR=0
// leaves libfabric's own choice (and an Open MPI that imports its patcher)
// alone; ODPWATCH_OFI_DEBUG=1 says what happened on stderr.
#include <odpwatch/ofi_monitor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace
{

__attribute__((constructor)) void import_memwatch_monitor()
{
	const char *want = std::getenv("ODPWATCH_OFI_MONITOR");
	if (want && !std::strcmp(want, "0"))
		return;
	const int rc = odpwatch_ofi_monitor_import();
	const char *debug = std::getenv("ODPWATCH_OFI_DEBUG");
	if (rc && debug && *debug && *debug != '0')
		std::fprintf(stderr, "odpwatch-ofi: memwatch monitor not imported: %s\n",
			     std::strerror(-rc));
}

} // namespace
