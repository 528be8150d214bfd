// SPDX-License-Identifier: GPL-2.0
/*
 * rxe On-Demand Paging: what the device advertises and what a registration
 * does with it. The device is $RDMA_DEV (default rxe0); it must exist: the
 * test environment creates it (rdma link add rxe0 type rxe netdev dummy0).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

#include "../kselftest_harness.h"
#include "rxe_odp_util.h"

#define BUF_SIZE (1024 * 1024UL)

FIXTURE(rxe)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr_ex attr;
};

FIXTURE_SETUP(rxe)
{
	const char *name = rdma_dev_name();

	self->ctx = open_device(name);
	/* The device is the caller's to make (rdma link add). */
	if (!self->ctx)
		SKIP(return, "no RDMA device %s", name);
	ASSERT_EQ(0, ibv_query_device_ex(self->ctx, NULL, &self->attr));
	self->pd = ibv_alloc_pd(self->ctx);
	ASSERT_NE(NULL, self->pd);
}

FIXTURE_TEARDOWN(rxe)
{
	if (self->pd)
		ibv_dealloc_pd(self->pd);
	if (self->ctx)
		ibv_close_device(self->ctx);
}

/* rxe advertises ODP for every RC operation and for UD send/receive. */
TEST_F(rxe, odp_caps)
{
	const struct ibv_odp_caps *odp = &self->attr.odp_caps;
	const uint32_t rc_need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
		IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
		IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	const uint32_t ud_need = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV;

	ASSERT_TRUE(!!(odp->general_caps & IBV_ODP_SUPPORT));
	EXPECT_EQ(rc_need, odp->per_transport_caps.rc_odp_caps & rc_need);
	EXPECT_EQ(ud_need, odp->per_transport_caps.ud_odp_caps & ud_need);
	TH_LOG("general 0x%llx rc 0x%x ud 0x%x",
	       (unsigned long long)odp->general_caps,
	       odp->per_transport_caps.rc_odp_caps,
	       odp->per_transport_caps.ud_odp_caps);
}

/* An ODP MR over memory that was never touched: nothing is pinned or faulted. */
TEST_F(rxe, odp_mr_untouched_buffer)
{
	void *buf = map_anon(BUF_SIZE);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr(self->pd, buf, BUF_SIZE,
			IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr(ODP): %s", strerror(errno));
	EXPECT_NE(0U, mr->lkey);
	EXPECT_NE(0U, mr->rkey);
	EXPECT_EQ(buf, mr->addr);
	EXPECT_EQ(BUF_SIZE, mr->length);
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, BUF_SIZE);
}

/* Unmapping the buffer under a live ODP MR is legal; deregistration still works. */
TEST_F(rxe, odp_mr_outlives_munmap)
{
	void *buf = map_anon(BUF_SIZE);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	memset(buf, 0xa5, BUF_SIZE);
	mr = ibv_reg_mr(self->pd, buf, BUF_SIZE,
			IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, mr);
	ASSERT_EQ(0, munmap(buf, BUF_SIZE));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
}

/*
 * Implicit ODP (the whole address space, addr NULL, length SIZE_MAX) must be
 * accepted exactly when the device advertises IBV_ODP_SUPPORT_IMPLICIT.
 */
TEST_F(rxe, implicit_odp_matches_caps)
{
	bool advertised = self->attr.odp_caps.general_caps &
			  IBV_ODP_SUPPORT_IMPLICIT;
	struct ibv_mr *mr;

	mr = ibv_reg_mr(self->pd, NULL, SIZE_MAX,
			IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	TH_LOG("implicit ODP advertised: %s, registration: %s",
	       advertised ? "yes" : "no", mr ? "ok" : strerror(errno));
	EXPECT_EQ(advertised, !!mr);
	if (mr)
		EXPECT_EQ(0, ibv_dereg_mr(mr));
}

/* A pinned MR over an unmapped range fails cleanly: there is nothing to pin. */
TEST_F(rxe, pinned_mr_unmapped_range)
{
	void *buf = map_anon(BUF_SIZE);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	ASSERT_EQ(0, munmap(buf, BUF_SIZE));
	mr = ibv_reg_mr(self->pd, buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	EXPECT_EQ(NULL, mr);
	EXPECT_EQ(EFAULT, errno);
	if (mr)
		ibv_dereg_mr(mr);
}

TEST_HARNESS_MAIN
