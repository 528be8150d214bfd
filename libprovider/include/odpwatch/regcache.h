/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * odpwatch registration cache: get and put memory registrations by
 * (pd, address, length, access), reused while they stay correct.
 *
 * What keeps a cached registration correct depends on the policy:
 *  - implicit ODP: one implicit ODP MR per (pd, access) covers every address;
 *    nothing is ever stale. For local access only: a get with remote access
 *    gets an explicit ODP MR of its range (an implicit rkey would expose
 *    the whole process to the peer);
 *  - explicit ODP: an ODP MR per range; the device follows the mapping, so
 *    nothing is stale either, the cache only bounds how many MRs exist;
 *  - pinned + memwatch: a pinned MR per range, watched with memwatch; a
 *    range whose mapping changed (munmap, madvise, mremap) is found invalid
 *    with one load and registered again, never handed out.
 * ODPWATCH_CACHE_AUTO picks the first the device supports, in that order;
 * with neither ODP nor memwatch it registers each get on its own, to be
 * deregistered after its put (stats: uncached). Overlapping gets of one pd
 * and access share one registration of their union.
 *
 * Thread-safe. Functions return 0 or a negative errno value; in a child of
 * fork() -EPERM (the registrations are the parent's), but destroy, which
 * forgets the cache there. See odpwatch_cache_create(3).
 */
#ifndef ODPWATCH_REGCACHE_H
#define ODPWATCH_REGCACHE_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#include <odpwatch/odpwatch.h>

#ifdef __cplusplus
extern "C" {
#endif

enum odpwatch_cache_policy {
	ODPWATCH_CACHE_AUTO = 0,
	ODPWATCH_CACHE_IMPLICIT_ODP = 1,
	ODPWATCH_CACHE_EXPLICIT_ODP = 2,
	ODPWATCH_CACHE_PINNED = 3, /* pinned MRs, validated with memwatch */
};

struct odpwatch_cache_attr {
	uint32_t policy;      /* enum odpwatch_cache_policy */
	uint32_t flags;	      /* must be 0 */
	uint64_t max_entries; /* registrations kept; 0: 1024, UINT64_MAX: no limit */
	uint64_t max_bytes;   /* bytes they cover; 0: a quarter of the memory */
	/*
	 * What the ODP policies must serve, per transport (enum
	 * ibv_odp_transport_cap_bits: IBV_ODP_SUPPORT_SEND, _RECV, _WRITE,
	 * _READ, _ATOMIC, _SRQ_RECV, ...). An ODP policy needs all of them
	 * from the device; AUTO picks ODP only then. 0 in all four: RC SEND,
	 * RECV, WRITE and READ.
	 */
	uint32_t rc_odp_needs;
	uint32_t uc_odp_needs;
	uint32_t ud_odp_needs;
	uint32_t xrc_odp_needs;
	uint64_t reserved[2]; /* must be 0 */
};

struct odpwatch_cache_stats {
	uint64_t hits;
	uint64_t misses;
	uint64_t invalidations;	  /* entries found stale (pinned policy) */
	uint64_t evictions;	  /* unused entries dropped for the limits */
	uint64_t registrations;	  /* ibv_reg_mr calls made */
	uint64_t deregistrations; /* ibv_dereg_mr calls made */
	uint64_t entries;	  /* registrations held now */
	uint64_t bytes;		  /* bytes they cover */
	uint64_t in_use;	  /* entries with a reference */
	uint64_t max_entries;	  /* the limits in effect */
	uint64_t max_bytes;
	uint64_t merges;  /* entries replaced by one covering their union */
	uint64_t retries; /* registrations tried again after ENOMEM made room (up to 2 a get) */
	/* gets served uncached: AUTO with neither ODP nor memwatch */
	uint64_t uncached;
	/* of the deregistrations, those left to the cache's thread */
	uint64_t deferred;
	uint64_t reserved[4];
};

struct odpwatch_cache;
/*
 * One get's reference to a cached registration: each get gives a handle of
 * its own, dead after its put (a second put: -EINVAL, as the man page
 * says). Opaque: not a pointer to anything the caller may read.
 */
struct odpwatch_cache_reg;

/* attr may be NULL (auto policy, default limits). */
ODPWATCH_API int odpwatch_cache_create(const struct odpwatch_cache_attr *attr,
				       struct odpwatch_cache **cache);
/* Fails with -EBUSY while references are held. */
ODPWATCH_API int odpwatch_cache_destroy(struct odpwatch_cache *cache);

/*
 * A registration covering [addr, addr + len) of pd with at least access
 * (IBV_ACCESS_* flags), taking a reference. Use the MR's keys with the
 * buffer's own addresses.
 */
ODPWATCH_API int odpwatch_cache_get(struct odpwatch_cache *cache, struct ibv_pd *pd, void *addr,
				    size_t len, unsigned int access,
				    struct odpwatch_cache_reg **reg);
/* Drop the reference; the registration stays cached while it is correct. */
ODPWATCH_API int odpwatch_cache_put(struct odpwatch_cache *cache, struct odpwatch_cache_reg *reg);
ODPWATCH_API struct ibv_mr *odpwatch_cache_reg_mr(const struct odpwatch_cache_reg *reg);

/*
 * Registrations the cache drops (stale, evicted) are deregistered by the
 * call that drops them (a get that misses, a put, process_events; never a
 * hit) while deregistration is cheap (a small MR, well under a millisecond
 * lately), else by a thread of the cache, off the caller's path; this
 * waits until every one dropped so far is. odpwatch_cache_destroy() does
 * it too.
 */
ODPWATCH_API int odpwatch_cache_flush(struct odpwatch_cache *cache);

/* The policy in effect for pd (resolved on its first get, or now). */
ODPWATCH_API int odpwatch_cache_policy_of(struct odpwatch_cache *cache, struct ibv_pd *pd);
ODPWATCH_API int odpwatch_cache_query(struct odpwatch_cache *cache,
				      struct odpwatch_cache_stats *stats);

/*
 * The memwatch behind the pinned policy: a descriptor to poll (readable when
 * ranges changed; -ENOENT before the first pinned get), and the call that
 * drops the stale entries it reports, so pinned memory is released when the
 * application frees it rather than at the next get of that address.
 */
ODPWATCH_API int odpwatch_cache_event_fd(struct odpwatch_cache *cache);
ODPWATCH_API int odpwatch_cache_process_events(struct odpwatch_cache *cache);

ODPWATCH_API const char *odpwatch_cache_policy_name(int policy);

#ifdef __cplusplus
}
#endif

#endif /* ODPWATCH_REGCACHE_H */
