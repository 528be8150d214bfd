/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * odpwatch: the C ABI of the odpwatch userspace library. Includable from C
 * and C++; no C++ types cross this boundary. Functions return 0 or a
 * negative errno value.
 */
#ifndef ODPWATCH_H
#define ODPWATCH_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ODPWATCH_API __attribute__((visibility("default")))

/* What a device offers for On-Demand Paging, decoded from ibv_query_device_ex. */
struct odpwatch_odp_caps {
	uint32_t supported; /* IBV_ODP_SUPPORT */
	uint32_t implicit;  /* IBV_ODP_SUPPORT_IMPLICIT */
	uint32_t rc_caps;   /* enum ibv_odp_transport_cap_bits */
	uint32_t uc_caps;
	uint32_t ud_caps;
	uint32_t xrc_caps;
	uint64_t reserved[2];
};

/* Fill *caps for an open device. */
ODPWATCH_API int odpwatch_query_odp_caps(struct ibv_context *ctx, struct odpwatch_odp_caps *caps);

/* The library's version, "major.minor.patch". */
ODPWATCH_API const char *odpwatch_version(void);

#ifdef __cplusplus
}
#endif

#endif /* ODPWATCH_H */
