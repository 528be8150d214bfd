// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ofi-blind.so, a test fixture: LD_PRELOAD it and libfabric's MR
// cache gets a memory monitor that accepts every region and never reports a
// change, as a monitor that misses every unmap would. A test of staleness
// (fabtests' fi_unmap_mem) must fail with it; one that passes proves nothing.
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>

#include <cstdio>
#include <cstdlib>

namespace
{

int start(fid_mem_monitor *)
{
	return 0;
}
void stop(fid_mem_monitor *) {}
int subscribe(fid_mem_monitor *, const void *, size_t)
{
	return 0;
}
void unsubscribe(fid_mem_monitor *, const void *, size_t) {}
bool valid(fid_mem_monitor *, const void *, size_t)
{
	return true;
}

fi_ops_mem_monitor ops{
	.size = sizeof(fi_ops_mem_monitor),
	.start = start,
	.stop = stop,
	.subscribe = subscribe,
	.unsubscribe = unsubscribe,
	.valid = valid,
};
fid_mem_monitor monitor{};

__attribute__((constructor)) void import_blind_monitor()
{
	monitor.fid.fclass = FI_CLASS_MEM_MONITOR;
	monitor.export_ops = &ops;
	const int ret =
		fi_import(FI_VERSION(1, 13), "mr_cache", nullptr, 0, 0, &monitor.fid, nullptr);
	std::fprintf(stderr, "odpwatch-ofi-blind: %s\n",
		     ret ? fi_strerror(-ret) : "a monitor that reports nothing is imported");
}

} // namespace
