// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// UCX's registration cache as an application reaches it, through UCP's
// public API: ucp_mem_map() of a user buffer looks it up in UCP's rcache
// (registering on a miss), ucp_mem_unmap() puts it back. Debian's UCX as
// shipped (ucm's hooks in libc tell the cache of unmaps), or the same with
// libodpwatch-ucx-preload.so in the process (memwatch tells it too).
#include "peers.hpp"

#include <ucp/api/ucp.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace odpwatch::bench
{
namespace
{

class UcpMemh final : public CacheUnderTest
{
public:
	UcpMemh(const std::string &device, bool memwatch) : memwatch_(memwatch)
	{
		// The rxe port alone, as the middleware suite runs UCX; what
		// the user set stays.
		const std::string dev = (device.empty() ? std::string("rxe0") : device) + ":1";
		setenv("UCX_NET_DEVICES", dev.c_str(), 0);
		setenv("UCX_TLS", "rc_verbs,ud_verbs", 0);
		ucp_config_t *cfg = nullptr;
		if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg))
			throw verbs::Error(std::string("ucp_config_read: ") + ucs_status_string(st),
					   EINVAL);
		ucp_params_t p{};
		p.field_mask = UCP_PARAM_FIELD_FEATURES;
		p.features = UCP_FEATURE_RMA;
		const ucs_status_t st = ucp_init(&p, cfg, &ctx_);
		ucp_config_release(cfg);
		if (st != UCS_OK)
			throw verbs::Error(std::string("ucp_init: ") + ucs_status_string(st), EIO);
	}
	~UcpMemh() override { ucp_cleanup(ctx_); }
	std::string name() const override
	{
		return memwatch_ ? "UCX UCP memh + memwatch (libodpwatch-ucx)" : "UCX UCP memh";
	}
	std::string how() const override
	{
		return memwatch_ ? "ucm hooks in libc, and memwatch's seq checked before each "
				   "UCP call (libodpwatch-ucx-preload.so)"
				 : "ucm hooks in libc queue an unmap event; the next lookup "
				   "applies it";
	}
	void keys_needed(bool on) override { keyed_ = on; }
	CacheHit get(void *addr, size_t len) override
	{
		ucp_mem_map_params_t mp{};
		mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
		mp.address = addr;
		mp.length = len;
		ucp_mem_h memh = nullptr;
		if (ucs_status_t st = ucp_mem_map(ctx_, &mp, &memh))
			throw verbs::Error(std::string("ucp_mem_map: ") + ucs_status_string(st),
					   EIO);
		return {memh, keyed_ ? key_of(memh) : 0};
	}
	void put(CacheHit h) override { ucp_mem_unmap(ctx_, static_cast<ucp_mem_h>(h.handle)); }

private:
	// The registration behind a handle, as its packed remote key says it
	// (the MR's rkey is in it): the same bytes for a cached registration,
	// others for a new one. (The handle's address may be reused.)
	uint32_t key_of(ucp_mem_h memh)
	{
		void *buf = nullptr;
		size_t size = 0;
		if (ucs_status_t st = ucp_rkey_pack(ctx_, memh, &buf, &size))
			throw verbs::Error(std::string("ucp_rkey_pack: ") + ucs_status_string(st),
					   EIO);
		uint32_t h = 2166136261u; // FNV-1a
		for (size_t i = 0; i < size; i++)
			h = (h ^ static_cast<const uint8_t *>(buf)[i]) * 16777619u;
		ucp_rkey_buffer_release(buf);
		return h;
	}

	const bool memwatch_;
	bool keyed_ = false;
	ucp_context_h ctx_ = nullptr;
};

} // namespace

std::unique_ptr<CacheUnderTest> make_ucp_memh(const std::string &device, bool memwatch)
{
	return std::make_unique<UcpMemh>(device, memwatch);
}

} // namespace odpwatch::bench
