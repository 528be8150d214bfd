// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// ODP helpers behind the C ABI.
#include <odpwatch/odpwatch.h>

#include <cerrno>

extern "C" {

int odpwatch_query_odp_caps(struct ibv_context *ctx, struct odpwatch_odp_caps *caps)
{
	if (!ctx || !caps)
		return -EINVAL;
	ibv_device_attr_ex attr{};
	if (int rc = ibv_query_device_ex(ctx, nullptr, &attr))
		return -rc;
	const ibv_odp_caps &odp = attr.odp_caps;
	*caps = {};
	caps->supported = !!(odp.general_caps & IBV_ODP_SUPPORT);
	caps->implicit = !!(odp.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
	caps->rc_caps = odp.per_transport_caps.rc_odp_caps;
	caps->uc_caps = odp.per_transport_caps.uc_odp_caps;
	caps->ud_caps = odp.per_transport_caps.ud_odp_caps;
	caps->xrc_caps = attr.xrc_odp_caps;
	return 0;
}

const char *odpwatch_version(void)
{
	return ODPWATCH_VERSION; // the project's version, from the build
}
}
