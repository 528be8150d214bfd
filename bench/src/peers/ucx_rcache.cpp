// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// UCX's registration cache (ucs/memory/rcache.h) as UCX's own IB transport
// uses it: regions registered with ibv_reg_mr in our mem_reg callback,
// invalidated by ucm's VM_UNMAPPED events from its hooks in libc.
#include "peers.hpp"

// rcache.h does not declare its functions extern "C" itself.
extern "C" {
#include <ucm/api/ucm.h>
#include <ucs/memory/rcache.h>
}

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

namespace odpwatch::bench
{
namespace
{

constexpr unsigned kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

struct Region {
	ucs_rcache_region_t super; // first: the rcache allocates Region for us
	ibv_mr *mr;
};

class UcxRcache final : public CacheUnderTest
{
public:
	explicit UcxRcache(const std::string &device)
	    : ctx_(verbs::open_device(device)), pd_(verbs::alloc_pd(ctx_.get()))
	{
		static const ucs_rcache_ops_t ops = {
			.mem_reg = mem_reg,
			.mem_dereg = mem_dereg,
			.merge = merge,
			.dump_region = dump_region,
		};
		ucs_rcache_params_t p;
		ucs_rcache_set_default_params(&p);
		p.region_struct_size = sizeof(Region);
		p.ucm_events = UCM_EVENT_VM_UNMAPPED | UCM_EVENT_MEM_TYPE_FREE;
		p.ops = &ops;
		p.context = this;
		if (ucs_status_t st = ucs_rcache_create(&p, "odpwatch-bench", nullptr, &rc_))
			throw verbs::Error(
				std::string("ucs_rcache_create: ") + ucs_status_string(st), EINVAL);
	}
	~UcxRcache() override { ucs_rcache_destroy(rc_); }
	std::string name() const override { return "UCX ucs_rcache"; }
	std::string how() const override
	{
		return "ucm hooks in libc queue an unmap event; the next get applies it";
	}
	CacheHit get(void *addr, size_t len) override
	{
		ucs_rcache_region_t *r = nullptr;
		ucs_status_t st = ucs_rcache_get(rc_, addr, len, size_t(sysconf(_SC_PAGESIZE)),
						 PROT_READ | PROT_WRITE, nullptr, &r);
		if (st != UCS_OK)
			throw verbs::Error(std::string("ucs_rcache_get: ") + ucs_status_string(st),
					   EIO);
		return {r, reinterpret_cast<Region *>(r)->mr->lkey};
	}
	void put(CacheHit h) override
	{
		ucs_rcache_region_put(rc_, static_cast<ucs_rcache_region_t *>(h.handle));
	}

private:
	static ucs_status_t mem_reg(void *context, ucs_rcache_t *, void *, ucs_rcache_region_t *r,
				    uint16_t)
	{
		auto *self = static_cast<UcxRcache *>(context);
		auto *region = reinterpret_cast<Region *>(r);
		region->mr = ibv_reg_mr(self->pd_.get(), reinterpret_cast<void *>(r->super.start),
					r->super.end - r->super.start, kAccess);
		return region->mr ? UCS_OK : UCS_ERR_IO_ERROR;
	}
	// Called, unconditionally, for each cached region a new one absorbs
	// (a get that overlaps cached regions, as malloc()'d neighbours do):
	// nothing of ours to carry over. (Null, it crashed the first such get.)
	static void merge(void *, ucs_rcache_t *, void *, ucs_rcache_region_t *) {}
	static void mem_dereg(void *, ucs_rcache_t *, ucs_rcache_region_t *r)
	{
		ibv_dereg_mr(reinterpret_cast<Region *>(r)->mr);
	}
	static void dump_region(void *, ucs_rcache_t *, ucs_rcache_region_t *, char *buf,
				size_t max)
	{
		if (max)
			buf[0] = '\0';
	}

	verbs::Context ctx_;
	verbs::Pd pd_;
	ucs_rcache_t *rc_ = nullptr;
};

} // namespace

std::unique_ptr<CacheUnderTest> make_ucx_rcache(const std::string &device)
{
	return std::make_unique<UcxRcache>(device);
}

} // namespace odpwatch::bench
