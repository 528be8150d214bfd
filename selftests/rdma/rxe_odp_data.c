// SPDX-License-Identifier: GPL-2.0
/*
 * rxe On-Demand Paging data paths, through two connected RC QPs on $RDMA_DEV
 * (default rxe0): MRs registered with an iova other than their address,
 * implicit MRs across child boundaries, and ibv_advise_mr()'s checks.
 * The fix_* tests reproduce the bugs of upstream's rxe that the rdma fixes
 * series fixes: make check-series runs them on the vanilla base too, where
 * each must fail at an assertion that logs "REPRODUCED:" (a failure
 * anywhere else proves nothing about the bug).
 *
 * ibv_advise_mr() is issued as the raw uverbs ioctl: rdma-core 56.1's rxe
 * provider does not implement it, and the kernel's answers are what is
 * tested here.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "../kselftest_harness.h"
#include "rxe_odp_util.h"

#define LEN		(64 * 1024UL)
#define IOVA		0x5000000000ULL	/* far from any address we map */
#define CHILD_SIZE	(128UL << 20)	/* rxe's implicit ODP child */

/* The first RoCE v2 GID with an IPv4-mapped address, or -1. */
static int roce_v2_ipv4_gid(struct ibv_context *ctx, union ibv_gid *gid)
{
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	struct ibv_gid_entry e;
	int i;

	for (i = 0; i < 32; i++) {
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0))
			continue;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		    !memcmp(e.gid.raw, v4mapped, sizeof(v4mapped))) {
			*gid = e.gid;
			return i;
		}
	}
	return -1;
}

/* A requester QP, its responder, and a pinned buffer to move data with. */
struct link {
	struct ibv_cq *cq, *peer_cq;
	struct ibv_qp *qp;	/* the requester */
	struct ibv_qp *peer;	/* the responder, whose error is not ours */
	struct ibv_mr *local;	/* pinned, the other side of each transfer */
	char *local_buf;
};

FIXTURE(odp)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct link l;
};

/*
 * Connect RC QP @qp to @dest on the same port, with the RNR timer it asks
 * its peer to wait (@min_rnr_timer, as a responder) and its transport retry
 * count (as a requester).
 */
static int connect_qp_timers(struct ibv_context *ctx, struct ibv_qp *qp,
			     struct ibv_qp *dest, uint8_t min_rnr_timer,
			     uint8_t retry_cnt)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC,
	};
	union ibv_gid gid;
	int idx = roce_v2_ipv4_gid(ctx, &gid);

	if (idx < 0)
		return -ENODEV;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = idx;
	a.ah_attr.grh.hop_limit = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		return -errno;
	return 0;
}

static int connect_qp(struct ibv_context *ctx, struct ibv_qp *qp,
		      struct ibv_qp *dest)
{
	return connect_qp_timers(ctx, qp, dest, 12, 7);
}

FIXTURE_SETUP(odp)
{
	const char *name = rdma_dev_name();
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	self->ctx = open_device(name);
	/* The device is the caller's to make (rdma link add). */
	if (!self->ctx)
		SKIP(return, "no RDMA device %s", name);
	self->pd = ibv_alloc_pd(self->ctx);
	ASSERT_NE(NULL, self->pd);
	self->l.cq = ibv_create_cq(self->ctx, 8, NULL, NULL, 0);
	ASSERT_NE(NULL, self->l.cq);
	init.send_cq = self->l.cq;
	init.recv_cq = self->l.cq;
	self->l.qp = ibv_create_qp(self->pd, &init);
	ASSERT_NE(NULL, self->l.qp);
	self->l.peer_cq = ibv_create_cq(self->ctx, 8, NULL, NULL, 0);
	ASSERT_NE(NULL, self->l.peer_cq);
	init.send_cq = self->l.peer_cq;
	init.recv_cq = self->l.peer_cq;
	self->l.peer = ibv_create_qp(self->pd, &init);
	ASSERT_NE(NULL, self->l.peer);
	ASSERT_EQ(0, connect_qp(self->ctx, self->l.qp, self->l.peer));
	ASSERT_EQ(0, connect_qp(self->ctx, self->l.peer, self->l.qp));
	self->l.local_buf = malloc(LEN);
	ASSERT_NE(NULL, self->l.local_buf);
	self->l.local = ibv_reg_mr(self->pd, self->l.local_buf, LEN,
				   IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, self->l.local);
}

FIXTURE_TEARDOWN(odp)
{
	if (self->l.local)
		ibv_dereg_mr(self->l.local);
	free(self->l.local_buf);
	if (self->l.qp)
		ibv_destroy_qp(self->l.qp);
	if (self->l.peer)
		ibv_destroy_qp(self->l.peer);
	if (self->l.cq)
		ibv_destroy_cq(self->l.cq);
	if (self->l.peer_cq)
		ibv_destroy_cq(self->l.peer_cq);
	if (self->pd)
		ibv_dealloc_pd(self->pd);
	if (self->ctx)
		ibv_close_device(self->ctx);
}

/* Post @wr (signaled) and return its completion status, or -1 on timeout. */
static int post_wait(struct ibv_qp *qp, struct ibv_cq *cq,
		     struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	struct timespec t0, t;
	struct ibv_wc wc;
	int n;

	wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(qp, wr, &bad))
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n > 0)
			return wc.status;
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (n == 0 && t.tv_sec - t0.tv_sec < 60);
	return -1;
}

/* RDMA WRITE or READ of @len bytes between local_buf and @raddr of @rkey. */
static int rdma(struct link *l, enum ibv_wr_opcode op, uint64_t raddr,
		uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = {
		(uintptr_t)l->local_buf, len, l->local->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = op,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	};

	return post_wait(l->qp, l->cq, &wr);
}

static int fetch_add(struct link *l, uint64_t raddr, uint32_t rkey,
		     uint64_t add)
{
	struct ibv_sge sge = {
		(uintptr_t)l->local_buf, 8, l->local->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.wr.atomic = { .remote_addr = raddr, .compare_add = add,
			       .rkey = rkey },
	};

	return post_wait(l->qp, l->cq, &wr);
}

static void fill(void *p, size_t len, unsigned int seed)
{
	size_t i;

	for (i = 0; i < len; i++)
		((uint8_t *)p)[i] = (uint8_t)(i * 7 + seed);
}

#define ODP_REMOTE (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | \
		    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		    IBV_ACCESS_REMOTE_ATOMIC)

/* Remote access at iova + offset reaches address + offset, both ways. */
TEST_F(odp, iova_not_address)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *mr;
	uint64_t v;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr_iova(self->pd, buf, LEN, IOVA, ODP_REMOTE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr_iova: %s", strerror(errno));

	fill(self->l.local_buf, 20000, 1);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_WRITE,
				       IOVA + 5000, mr->rkey, 20000));
	EXPECT_EQ(0, memcmp(buf + 5000, self->l.local_buf, 20000));

	fill(buf, LEN, 3);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_READ,
				       IOVA + 100, mr->rkey, 30000));
	EXPECT_EQ(0, memcmp(self->l.local_buf, buf + 100, 30000));

	memcpy(buf + 4096, &(uint64_t){ 40 }, 8);
	ASSERT_EQ(IBV_WC_SUCCESS, fetch_add(&self->l, IOVA + 4096, mr->rkey, 2));
	memcpy(&v, self->l.local_buf, 8);
	EXPECT_EQ(40ULL, v);
	memcpy(&v, buf + 4096, 8);
	EXPECT_EQ(42ULL, v);

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/* Below the iova is outside the MR: a remote access error, nothing else. */
TEST_F(odp, iova_below_range)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr_iova(self->pd, buf, LEN, IOVA, ODP_REMOTE);
	ASSERT_NE(NULL, mr);
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, rdma(&self->l,
					      IBV_WR_RDMA_WRITE, IOVA - 4096,
					      mr->rkey, 64));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/* A copy starts at the iova's offset in its page and moves on in the buffer. */
TEST_F(odp, fix_copy_at_an_offset_in_the_page)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr(self->pd, buf, LEN, ODP_REMOTE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));

	/* Two packets of the 1 KiB path MTU, from offset 100 of the page. */
	fill(self->l.local_buf, 2048, 11);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_WRITE,
				       (uintptr_t)buf + 100, mr->rkey, 2048));
	EXPECT_EQ(0, memcmp(buf + 100, self->l.local_buf, 2048))
		TH_LOG("REPRODUCED: a WRITE at offset 100 moved other bytes");

	/* A READ response whose second packet straddles a page boundary. */
	fill(buf, LEN, 13);
	memset(self->l.local_buf, 0, 2048);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_READ,
				       (uintptr_t)buf + 3000, mr->rkey, 2048));
	EXPECT_EQ(0, memcmp(self->l.local_buf, buf + 3000, 2048))
		TH_LOG("REPRODUCED: a READ from offset 3000 moved other bytes");

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/* The iova, not the address, names an ODP MR's first byte. */
TEST_F(odp, fix_iova_above_the_address)
{
	char *buf = map_anon(LEN);
	uint64_t iova = (uintptr_t)buf + 8192;
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr_iova(self->pd, buf, LEN, iova, ODP_REMOTE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr_iova: %s", strerror(errno));

	fill(self->l.local_buf, 64, 17);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_WRITE, iova,
				       mr->rkey, 64));
	EXPECT_EQ(0, memcmp(buf, self->l.local_buf, 64))
		TH_LOG("REPRODUCED: the WRITE to the iova missed the first byte");
	EXPECT_EQ(0, buf[8192])
		TH_LOG("REPRODUCED: the WRITE landed 8 KiB into the buffer");

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/* A read-only ODP MR can be prefetched for reading, never for writing. */
TEST_F(odp, fix_prefetch_of_a_read_only_mr)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr(self->pd, buf, LEN,
			IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_READ);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	EXPECT_EQ(0, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH,
			       IBV_ADVISE_MR_FLAG_FLUSH, (uintptr_t)buf, LEN,
			       mr->lkey))
		TH_LOG("REPRODUCED: a read prefetch of a read-only MR refused");
	EXPECT_EQ(EPERM, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				   0, (uintptr_t)buf, LEN, mr->lkey))
		TH_LOG("REPRODUCED: a write prefetch of it not refused as EPERM");
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/*
 * A pinned MR is no ODP MR: prefetching it is refused. Not run on the
 * vanilla base, where its umem is read as an ODP umem past the end of its
 * allocation (a crash, or worse).
 */
TEST_F(odp, fix_prefetch_of_a_pinned_mr_is_refused)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *mr;

	ASSERT_NE(NULL, buf);
	mr = ibv_reg_mr(self->pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	EXPECT_EQ(EINVAL, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH,
				    IBV_ADVISE_MR_FLAG_FLUSH, (uintptr_t)buf,
				    LEN, mr->lkey))
		TH_LOG("REPRODUCED: a prefetch of a pinned MR not refused");
	EXPECT_EQ(EINVAL, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0,
				    (uintptr_t)buf, LEN, mr->lkey))
		TH_LOG("REPRODUCED: an async prefetch of it not refused");
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/*
 * Pages an RDMA WRITE filled through an ODP MR are dirty: MADV_FREE makes
 * them freeable while clean, MADV_PAGEOUT reclaims, the bytes must stay,
 * whether the MR still maps the pages when reclaim invalidates them or was
 * deregistered before (the umem then goes without an invalidation). A
 * control page treated alike but not written must go (else reclaim did not
 * run). One CPU, so MADV_PAGEOUT drains the LRU batches the pages sit in.
 */
static void written_pages_survive_reclaim(struct __test_metadata *_metadata,
					  struct ibv_pd *pd, struct link *l,
					  bool dereg)
{
	char *buf = map_anon(LEN), *control = map_anon(4096);
	cpu_set_t all, one;
	struct ibv_mr *mr;
	size_t i;
	int cpu;

	ASSERT_NE(NULL, buf);
	ASSERT_NE(NULL, control);
	ASSERT_EQ(0, sched_getaffinity(0, sizeof(all), &all));
	cpu = 0;
	while (!CPU_ISSET(cpu, &all))
		cpu++;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	ASSERT_EQ(0, sched_setaffinity(0, sizeof(one), &one));
	mr = ibv_reg_mr(pd, buf, LEN, ODP_REMOTE);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));

	fill(buf, LEN, 40);
	fill(control, 4096, 40);
	ASSERT_EQ(0, madvise(buf, LEN, MADV_FREE));
	ASSERT_EQ(0, madvise(control, 4096, MADV_FREE));
	fill(l->local_buf, LEN, 41);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(l, IBV_WR_RDMA_WRITE, (uintptr_t)buf,
				       mr->rkey, LEN));
	if (dereg)
		ASSERT_EQ(0, ibv_dereg_mr(mr));
	ASSERT_EQ(0, madvise(control, 4096, MADV_PAGEOUT));
	ASSERT_EQ(0, madvise(buf, LEN, MADV_PAGEOUT));
	i = 0;
	while (i < 4096 && !control[i])
		i++;
	ASSERT_EQ(4096UL, i) TH_LOG("a clean freeable page survived MADV_PAGEOUT");
	EXPECT_EQ(0, memcmp(buf, l->local_buf, LEN))
		TH_LOG("REPRODUCED: written pages were dropped as clean");

	if (!dereg)
		EXPECT_EQ(0, ibv_dereg_mr(mr));
	EXPECT_EQ(0, sched_setaffinity(0, sizeof(all), &all));
	munmap(buf, LEN);
	munmap(control, 4096);
}

TEST_F(odp, fix_pages_written_through_odp_survive_reclaim)
{
	written_pages_survive_reclaim(_metadata, self->pd, &self->l, false);
}

TEST_F(odp, fix_pages_written_through_odp_survive_dereg_and_reclaim)
{
	written_pages_survive_reclaim(_metadata, self->pd, &self->l, true);
}

/* The status of the first completion on @cq within @ms, -1 if none came. */
static int wait_cq(struct ibv_cq *cq, long ms)
{
	struct timespec t0, t;
	struct ibv_wc wc;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n > 0)
			return wc.status;
		if (n < 0)
			return -2;
		usleep(1000);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while ((t.tv_sec - t0.tv_sec) * 1000 +
		 (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
	return -1;
}

/* A status of wait_cq() or post_wait() in words. */
static const char *wc_str(int status)
{
	if (status == -1)
		return "no completion";
	return status < 0 ? "ibv_poll_cq failed" : ibv_wc_status_str(status);
}

/* A sender and a receiver RC QP, each completing to a CQ of its own. */
struct qp_pair {
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *sender, *receiver;
};

/*
 * Make @p in @pd, @wrs work requests deep, not connected; the receiver
 * takes its receives from @srq, or from a queue of its own if NULL.
 */
static int qp_pair_create(struct ibv_pd *pd, unsigned int wrs,
			  struct ibv_srq *srq, struct qp_pair *p)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = wrs, .max_recv_wr = wrs,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	*p = (struct qp_pair){ 0 };
	p->scq = ibv_create_cq(pd->context, 2 * wrs, NULL, NULL, 0);
	p->rcq = ibv_create_cq(pd->context, 2 * wrs, NULL, NULL, 0);
	if (!p->scq || !p->rcq)
		return -1;
	init.send_cq = p->scq;
	init.recv_cq = p->scq;
	p->sender = ibv_create_qp(pd, &init);
	init.send_cq = p->rcq;
	init.recv_cq = p->rcq;
	init.srq = srq;
	p->receiver = ibv_create_qp(pd, &init);
	return p->sender && p->receiver ? 0 : -1;
}

/* Destroy what @p holds; the number of objects that would not go. */
static int qp_pair_destroy(struct qp_pair *p)
{
	int failed = 0;

	if (p->sender)
		failed += !!ibv_destroy_qp(p->sender);
	if (p->receiver)
		failed += !!ibv_destroy_qp(p->receiver);
	if (p->scq)
		failed += !!ibv_destroy_cq(p->scq);
	if (p->rcq)
		failed += !!ibv_destroy_cq(p->rcq);
	return failed;
}

#define RNR_SENDS 3

/*
 * An RNR NAK answers a request, so waiting out the responder's RNR timer
 * must not cost transport retries: SENDs to a responder with no receive
 * posted for 8 s, on a requester with rnr_retry 7 (retry for ever) and a
 * transport timeout of 67 ms (14), complete once the receives are posted.
 * The responder asks for 655 ms between retries (min_rnr_timer 0), as
 * ib_cm sets it for every rdma_cm connection. Each RNR wait longer than
 * the transport timeout used to fire the retransmit timer once, and seven
 * waits (4.6 s) used up retry_cnt 6; retry_cnt 7 hid it until it counted
 * down like any other. Several SENDs back to back, as a storage initiator
 * posts them: those behind the NAKed one must not arm the timer either.
 */
TEST_F_TIMEOUT(odp, fix_rnr_waits_leave_the_retry_count_alone, 120)
{
	static const uint8_t retry_cnts[] = { 6, 7 };
	struct qp_pair p;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_send_wr swr, *bad_swr;
	struct ibv_sge ssge, rsge;
	char *src = self->l.local_buf, *dst = self->l.local_buf + LEN / 2;
	unsigned int i, j;
	int status;

	for (i = 0; i < ARRAY_SIZE(retry_cnts); i++) {
		ASSERT_EQ(0, qp_pair_create(self->pd, RNR_SENDS, NULL, &p));
		ASSERT_EQ(0, connect_qp_timers(self->ctx, p.sender, p.receiver,
					       12, retry_cnts[i]));
		ASSERT_EQ(0, connect_qp_timers(self->ctx, p.receiver, p.sender,
					       0, 7));

		fill(src, RNR_SENDS * 64, i);
		memset(dst, 0, RNR_SENDS * 64);
		for (j = 0; j < RNR_SENDS; j++) {
			ssge = (struct ibv_sge){ (uintptr_t)src + j * 64, 64,
						 self->l.local->lkey };
			swr = (struct ibv_send_wr){
				.wr_id = j, .sg_list = &ssge, .num_sge = 1,
				.opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED };
			ASSERT_EQ(0, ibv_post_send(p.sender, &swr, &bad_swr));
		}
		status = wait_cq(p.scq, 8000);
		ASSERT_EQ(-1, status)
			TH_LOG("REPRODUCED: retry_cnt %u: a SEND completed (%s) before any receive",
			       retry_cnts[i], wc_str(status));
		for (j = 0; j < RNR_SENDS; j++) {
			rsge = (struct ibv_sge){ (uintptr_t)dst + j * 64, 64,
						 self->l.local->lkey };
			rwr = (struct ibv_recv_wr){ .sg_list = &rsge,
						    .num_sge = 1 };
			ASSERT_EQ(0, ibv_post_recv(p.receiver, &rwr, &bad_rwr));
		}
		for (j = 0; j < RNR_SENDS; j++) {
			ASSERT_EQ(IBV_WC_SUCCESS, wait_cq(p.scq, 10000))
				TH_LOG("retry_cnt %u: SEND %u", retry_cnts[i], j);
			ASSERT_EQ(IBV_WC_SUCCESS, wait_cq(p.rcq, 10000));
		}
		EXPECT_EQ(0, memcmp(dst, src, RNR_SENDS * 64));

		EXPECT_EQ(0, qp_pair_destroy(&p));
	}
}

/*
 * A request its peer never acknowledges completes with RETRY_EXC_ERR once
 * the transport retry count runs out, 7 included: only the RNR retry count
 * gives 7 the meaning "for ever" (o9-6.4.4). 7 is what perftest, UCX and
 * libfabric ask for, and a peer that went away left their requests retried
 * for ever. The responder in the error state answers nothing; with timeout
 * 14 (67 ms) the eight tries take about half a second.
 */
TEST_F_TIMEOUT(odp, fix_retry_count_7_is_seven_retries_not_forever, 90)
{
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	struct ibv_sge sge = { (uintptr_t)self->l.local_buf, 64,
			       self->l.local->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr attr;
	struct ibv_send_wr *bad;
	int status;

	ASSERT_EQ(0, ibv_query_qp(self->l.qp, &attr,
				  IBV_QP_RETRY_CNT | IBV_QP_TIMEOUT, &init));
	ASSERT_EQ(7, attr.retry_cnt);
	ASSERT_EQ(14, attr.timeout);
	ASSERT_EQ(0, ibv_modify_qp(self->l.peer, &err, IBV_QP_STATE));
	ASSERT_EQ(0, ibv_post_send(self->l.qp, &wr, &bad));
	status = wait_cq(self->l.cq, 30000);
	ASSERT_NE(-1, status)
		TH_LOG("REPRODUCED: no completion in 30 s: retry_cnt 7 retried for ever");
	EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, status)
		TH_LOG("%s", wc_str(status));
}

/* wait_cq() without a sleep: the caller races the responder. */
static int wait_cq_busy(struct ibv_cq *cq, long ms)
{
	struct timespec t0, t;
	struct ibv_wc wc;
	unsigned long spins = 0;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n)
			return n > 0 ? (int)wc.status : -2;
		if (++spins % 4096)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 +
		    (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
			return -1;
	}
}

#define REPLAY_LEN	(1024 * 1024UL)
#define REPLAY_WANTED	20	/* replays before the test may end */
#define REPLAY_SECONDS	60	/* and at most this long */

static int set_timeout(struct ibv_qp *qp, uint8_t timeout)
{
	struct ibv_qp_attr a = { .timeout = timeout };

	return ibv_modify_qp(qp, &a, IBV_QP_TIMEOUT);
}

/*
 * A READ whose responses are slow is sent again when the requester's
 * transport timer fires, and the responder replays it. Once the first
 * responses have completed the READ, its MR is the application's to
 * deregister, and the replay that then fails its rkey check must not end
 * the responder's QP. It did: the requester dropped the NAK (its WQE was
 * done) and the next SEND ran out of retries against a dead responder.
 * A transport timeout of 1 (one jiffy) makes the requester send some
 * 1 MiB READs twice (one in tens to hundreds); each SEND goes with timeout
 * 14, so that the replays duplicate_request counts are the READs'. Rounds
 * go on until REPLAY_WANTED replays or REPLAY_SECONDS: a replay ends the
 * QP only when the MR goes while it runs, not every time.
 */
TEST_F_TIMEOUT(odp, fix_a_replayed_read_whose_mr_is_gone_leaves_the_qp_alone,
	       180)
{
	uint64_t dups = hw_counter("duplicate_request");
	char *src = malloc(REPLAY_LEN), *dst = malloc(REPLAY_LEN);
	char *msg = self->l.local_buf;
	struct ibv_sge sge, rsge;
	struct ibv_send_wr wr, *bad;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_mr *local, *remote;
	int status, sent, received;
	struct timespec t0, t;
	uint64_t replays = 0;
	struct qp_pair p;
	unsigned int i;

	ASSERT_NE(NULL, src);
	ASSERT_NE(NULL, dst);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ASSERT_EQ(0, qp_pair_create(self->pd, 2, NULL, &p));
	ASSERT_EQ(0, connect_qp(self->ctx, p.sender, p.receiver));
	ASSERT_EQ(0, connect_qp(self->ctx, p.receiver, p.sender));
	local = ibv_reg_mr(self->pd, dst, REPLAY_LEN, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, local);

	for (i = 0; replays < REPLAY_WANTED; i++) {
		if (i % 50 == 49) {	/* hw_counter() sleeps 20 ms */
			replays = hw_counter("duplicate_request") - dups;
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec > REPLAY_SECONDS)
				break;
		}
		fill(src, REPLAY_LEN, i);
		remote = ibv_reg_mr(self->pd, src, REPLAY_LEN,
				    IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_READ);
		ASSERT_NE(NULL, remote);
		ASSERT_EQ(0, set_timeout(p.sender, 1));
		sge = (struct ibv_sge){ (uintptr_t)dst, REPLAY_LEN,
					local->lkey };
		wr = (struct ibv_send_wr){
			.sg_list = &sge, .num_sge = 1,
			.opcode = IBV_WR_RDMA_READ,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)src,
				     .rkey = remote->rkey } };
		ASSERT_EQ(0, ibv_post_send(p.sender, &wr, &bad));
		status = wait_cq_busy(p.scq, 30000);
		/* At once: the replay may still be running. */
		ASSERT_EQ(0, ibv_dereg_mr(remote));
		ASSERT_EQ(IBV_WC_SUCCESS, status)
			TH_LOG("READ %u: %s", i, wc_str(status));
		ASSERT_EQ(0, memcmp(dst, src, REPLAY_LEN))
			TH_LOG("READ %u: wrong bytes", i);

		ASSERT_EQ(0, set_timeout(p.sender, 14));
		rsge = (struct ibv_sge){ (uintptr_t)msg + 4096, 64,
					 self->l.local->lkey };
		rwr = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &rsge,
					    .num_sge = 1 };
		ASSERT_EQ(0, ibv_post_recv(p.receiver, &rwr, &bad_rwr));
		fill(msg, 64, i);
		sge = (struct ibv_sge){ (uintptr_t)msg, 64,
					self->l.local->lkey };
		wr = (struct ibv_send_wr){ .wr_id = i, .sg_list = &sge,
					   .num_sge = 1,
					   .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED };
		ASSERT_EQ(0, ibv_post_send(p.sender, &wr, &bad));
		sent = wait_cq(p.scq, 10000);
		received = wait_cq(p.rcq, 10000);
		ASSERT_EQ(IBV_WC_SUCCESS, sent)
			TH_LOG("REPRODUCED: after READ %u, SEND: %s, receive: %s (%llu duplicates)",
			       i, wc_str(sent), wc_str(received),
			       (unsigned long long)(hw_counter("duplicate_request") - dups));
		ASSERT_EQ(IBV_WC_SUCCESS, received)
			TH_LOG("after READ %u: receive %s", i,
			       wc_str(received));
		ASSERT_EQ(0, memcmp(msg + 4096, msg, 64));
	}
	EXPECT_LT(0ULL, replays)
		TH_LOG("no READ was sent twice in %u rounds: the test did not reach the replay",
		       i);
	TH_LOG("%u rounds, %llu replays", i, (unsigned long long)replays);

	EXPECT_EQ(0, ibv_dereg_mr(local));
	EXPECT_EQ(0, qp_pair_destroy(&p));
	free(src);
	free(dst);
}

#define STALE_TRIALS	20000	/* at most, */
#define STALE_SECONDS	30	/* and for at most this long */
#define STALE_SCRATCH	4096	/* pages, freed when all are used */

/* The walker of fix_no_freed_page_behind_a_failed_fault. */
struct stale_race {
	struct ibv_pd *pd;
	char *page;		/* the page that goes, a PROT_NONE one behind */
	uint32_t lkey;
	atomic_int go;		/* the trial the walker may start; -1: exit */
	atomic_int done;	/* the last trial it finished */
	unsigned int spin;	/* its delay, to slide it across the zap */
	int err;		/* what its last prefetch returned */
};

static void *stale_walker(void *arg)
{
	struct stale_race *r = arg;
	unsigned int n;
	cpu_set_t cpu;
	int trial, go;

	CPU_ZERO(&cpu);
	CPU_SET(1, &cpu);
	sched_setaffinity(0, sizeof(cpu), &cpu);
	for (trial = 1;; trial++) {
		while ((go = atomic_load(&r->go)) >= 0 && go < trial)
			sched_yield();
		if (go < 0)
			return NULL;
		for (n = 0; n < r->spin; n++)	/* loads the compiler keeps */
			atomic_load_explicit(&r->go, memory_order_relaxed);
		/* Stores the page's entry, then fails at the PROT_NONE one. */
		r->err = advise_mr(r->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				   IBV_ADVISE_MR_FLAG_FLUSH,
				   (uintptr_t)r->page, 2 * 4096, r->lkey);
		atomic_store(&r->done, trial);
	}
}

/*
 * ib_umem_odp_map_dma_and_lock() let hmm_range_fault() store into the
 * umem's page list without umem_mutex, and rxe takes an entry marked
 * valid for a page it may copy to and from. A walk that reads a PTE after
 * an invalidation cleared its entry but before the PTE is zapped stores
 * the old page back; when the walk then fails (here at a PROT_NONE page
 * behind it), nothing clears that entry, and the next access through the
 * MR copies from a freed page. A prefetch thread on the other CPU races
 * MADV_DONTNEED of a page; a new scratch page takes the freed page (else
 * the page's next fault may get it back, and a stale entry would name the
 * right page), the page gets new bytes from user space, and an RDMA READ
 * through the MR must return them.
 */
TEST_F_TIMEOUT(odp, fix_no_freed_page_behind_a_failed_fault, 300)
{
	char *buf = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *scratch = map_anon(STALE_SCRATCH * 4096UL);
	struct stale_race r = { .pd = self->pd, .page = buf };
	unsigned int trial, seed = 1;
	cpu_set_t cpu, all;
	char want[4096];
	struct ibv_mr *mr;
	pthread_t walker;
	int status = -1, madv = 0;
	struct timespec t0, t;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		SKIP(return, "the race needs two CPUs");
	ASSERT_NE(MAP_FAILED, buf);
	ASSERT_NE(NULL, scratch);
	ASSERT_EQ(0, sched_getaffinity(0, sizeof(all), &all));
	CPU_ZERO(&cpu);
	CPU_SET(0, &cpu);
	ASSERT_EQ(0, sched_setaffinity(0, sizeof(cpu), &cpu));
	ASSERT_EQ(0, mprotect(buf + 4096, 4096, PROT_NONE));
	memset(buf, 1, 4096);
	mr = ibv_reg_mr(self->pd, buf, 2 * 4096,
			ODP_REMOTE & ~IBV_ACCESS_REMOTE_ATOMIC);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	r.lkey = mr->lkey;
	ASSERT_EQ(0, pthread_create(&walker, NULL, stale_walker, &r));

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (trial = 1; trial <= STALE_TRIALS; trial++) {
		if (trial % 1000 == 0) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec >= STALE_SECONDS)
				break;
		}
		memset(buf, 2 + trial % 200, 4096);
		r.spin = rand_r(&seed) % 4000;
		atomic_store(&r.go, (int)trial);
		madv = madvise(buf, 4096, MADV_DONTNEED) ? errno : 0;
		if (madv)
			break;
		if (trial % STALE_SCRATCH == 0)
			madvise(scratch, STALE_SCRATCH * 4096UL, MADV_DONTNEED);
		scratch[(trial % STALE_SCRATCH) * 4096UL] = 1; /* a new page */
		while (atomic_load(&r.done) < (int)trial)
			sched_yield();
		if (r.err != EFAULT)
			break;
		memset(want, 0x80 | trial, sizeof(want));
		memcpy(buf, want, sizeof(want));
		status = rdma(&self->l, IBV_WR_RDMA_READ, (uintptr_t)buf,
			      mr->rkey, 4096);
		if (status != IBV_WC_SUCCESS ||
		    memcmp(self->l.local_buf, want, sizeof(want)))
			break;
	}
	atomic_store(&r.go, -1);
	pthread_join(walker, NULL);
	EXPECT_EQ(0, sched_setaffinity(0, sizeof(all), &all));
	ASSERT_EQ(0, madv) TH_LOG("madvise: %s", strerror(madv));
	ASSERT_EQ(EFAULT, r.err)
		TH_LOG("trial %u: the prefetch did not fail at the PROT_NONE page", trial);
	ASSERT_EQ(IBV_WC_SUCCESS, status) TH_LOG("trial %u", trial);
	EXPECT_EQ(0, memcmp(self->l.local_buf, want, sizeof(want)))
		TH_LOG("REPRODUCED: trial %u: the READ read a page the MR no longer maps",
		       trial);
	TH_LOG("%u trials", trial - 1);
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, 2 * 4096);
	munmap(scratch, STALE_SCRATCH * 4096UL);
}

/*
 * The Last WQE Reached events of @qp, and in @others any other event, that
 * arrive within @ms (the context's async fd is non-blocking).
 */
static int last_wqe_events(struct ibv_context *ctx, struct ibv_qp *qp,
			   long ms, int *others)
{
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	struct timespec t0, t;
	struct ibv_async_event ev;
	long left = ms;
	int n = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {	/* one look at least */
		if (poll(&pfd, 1, left) > 0) {
			if (ibv_get_async_event(ctx, &ev)) {
				usleep(1000);
			} else {
				if (ev.event_type ==
				    IBV_EVENT_QP_LAST_WQE_REACHED &&
				    ev.element.qp == qp)
					n++;
				else
					(*others)++;
				ibv_ack_async_event(&ev);
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		left = ms - ((t.tv_sec - t0.tv_sec) * 1000 +
			     (t.tv_nsec - t0.tv_nsec) / 1000000);
	} while (left > 0);
	return n;
}

#define LAST_WQE_SENDS 4

/*
 * o11-5.2.5: a QP on an SRQ that enters the error state gets one Last WQE
 * Reached event. Packets its peer still sends (SENDs retried until the
 * peer's retry count of 2 runs out) each run the responder again, and
 * another move to the error state runs it too: none may raise the event a
 * second time (UCX asserts on a second one). After RESET and back to RTS,
 * the next entry into the error state gets its own event.
 */
TEST_F_TIMEOUT(odp, fix_last_wqe_reached_once_per_entry_into_the_error_state,
	       120)
{
	struct ibv_srq_init_attr srq_init = {
		.attr = { .max_wr = LAST_WQE_SENDS, .max_sge = 1 },
	};
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };
	struct ibv_sge sge = { (uintptr_t)self->l.local_buf, 64,
			       self->l.local->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;
	struct ibv_srq *srq;
	struct qp_pair p;
	int flags, others = 0, n, j;

	flags = fcntl(self->ctx->async_fd, F_GETFL);
	ASSERT_EQ(0, fcntl(self->ctx->async_fd, F_SETFL, flags | O_NONBLOCK));
	srq = ibv_create_srq(self->pd, &srq_init);
	ASSERT_NE(NULL, srq) TH_LOG("ibv_create_srq: %s", strerror(errno));
	ASSERT_EQ(0, qp_pair_create(self->pd, LAST_WQE_SENDS, srq, &p));
	/* Retry count 2: the error state answers nothing, let it give up. */
	ASSERT_EQ(0, connect_qp_timers(self->ctx, p.sender, p.receiver, 12, 2));
	ASSERT_EQ(0, connect_qp(self->ctx, p.receiver, p.sender));
	ASSERT_EQ(0, last_wqe_events(self->ctx, p.receiver, 0, &others));
	ASSERT_EQ(0, others);

	ASSERT_EQ(0, ibv_modify_qp(p.receiver, &attr, IBV_QP_STATE));
	EXPECT_EQ(1, last_wqe_events(self->ctx, p.receiver, 2000, &others))
		TH_LOG("entering the error state");

	for (j = 0; j < LAST_WQE_SENDS; j++) {
		wr.wr_id = j;
		ASSERT_EQ(0, ibv_post_send(p.sender, &wr, &bad));
	}
	EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, wait_cq(p.scq, 60000));
	for (j = 1; j < LAST_WQE_SENDS; j++)
		EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wait_cq(p.scq, 10000));
	n = last_wqe_events(self->ctx, p.receiver, 2000, &others);
	EXPECT_EQ(0, n)
		TH_LOG("REPRODUCED: %d more events for packets in the error state",
		       n);

	ASSERT_EQ(0, ibv_modify_qp(p.receiver, &attr, IBV_QP_STATE));
	n = last_wqe_events(self->ctx, p.receiver, 2000, &others);
	EXPECT_EQ(0, n)
		TH_LOG("REPRODUCED: %d more events for a move from error to error",
		       n);

	attr.qp_state = IBV_QPS_RESET;
	ASSERT_EQ(0, ibv_modify_qp(p.receiver, &attr, IBV_QP_STATE));
	ASSERT_EQ(0, connect_qp(self->ctx, p.receiver, p.sender));
	attr.qp_state = IBV_QPS_ERR;
	ASSERT_EQ(0, ibv_modify_qp(p.receiver, &attr, IBV_QP_STATE));
	EXPECT_EQ(1, last_wqe_events(self->ctx, p.receiver, 2000, &others))
		TH_LOG("entering the error state again after RESET");
	EXPECT_EQ(0, others) TH_LOG("%d events of another kind or QP", others);

	EXPECT_EQ(0, qp_pair_destroy(&p));
	EXPECT_EQ(0, ibv_destroy_srq(srq));
	EXPECT_EQ(0, fcntl(self->ctx->async_fd, F_SETFL, flags));
}

#define FLUSH_MR_LEN	(2UL << 30)
#define FLUSH_ACCESS	(IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT)

/*
 * An ODP MR of 2 GiB (unpopulated: its pages fault in as the zero page) can
 * be registered, and a persistent FLUSH of all of it succeeds. The length
 * went down to the ODP helpers as an int and turned negative: the
 * registration's snapshot of the range failed with EINVAL, and a FLUSH was
 * answered as an rkey violation.
 */
TEST_F_TIMEOUT(odp, fix_flush_of_a_2_gib_odp_mr, 300)
{
	struct ibv_qp_init_attr_ex init = {
		.qp_type = IBV_QPT_RC,
		.send_cq = self->l.cq, .recv_cq = self->l.cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD |
			IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = self->pd,
		.send_ops_flags = IBV_QP_EX_WITH_FLUSH,
	};
	struct ibv_qp_attr attr = {
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			FLUSH_ACCESS,
	};
	struct ibv_qp *qp, *resp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	char *buf;
	int st;

	buf = mmap(NULL, FLUSH_MR_LEN, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ASSERT_NE(MAP_FAILED, buf);
	/* The control: one page less, which an int still counts, registers. */
	mr = ibv_reg_mr(self->pd, buf, FLUSH_MR_LEN - 4096,
			ODP_REMOTE | FLUSH_ACCESS);
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr of 2 GiB - 4 KiB: %s",
				   strerror(errno));
	ASSERT_EQ(0, ibv_dereg_mr(mr));
	mr = ibv_reg_mr(self->pd, buf, FLUSH_MR_LEN, ODP_REMOTE | FLUSH_ACCESS);
	if (!mr && errno == EINVAL)
		TH_LOG("REPRODUCED: 2 GiB refused, 2 GiB - 4 KiB registered");
	ASSERT_NE(NULL, mr) TH_LOG("ibv_reg_mr: %s", strerror(errno));
	qp = ibv_create_qp_ex(self->ctx, &init);
	ASSERT_NE(NULL, qp) TH_LOG("a QP that posts FLUSH: %s", strerror(errno));
	init.send_cq = self->l.peer_cq;
	init.recv_cq = self->l.peer_cq;
	init.comp_mask = IBV_QP_INIT_ATTR_PD;
	resp = ibv_create_qp_ex(self->ctx, &init);
	ASSERT_NE(NULL, resp);
	ASSERT_EQ(0, connect_qp(self->ctx, qp, resp));
	ASSERT_EQ(0, connect_qp(self->ctx, resp, qp));
	ASSERT_EQ(0, ibv_modify_qp(resp, &attr, IBV_QP_ACCESS_FLAGS));

	/* IBV_FLUSH_MR: the responder flushes the MR's length, not this one. */
	qpx = ibv_qp_to_qp_ex(qp);
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_flush(qpx, mr->rkey, (uintptr_t)buf, 4096,
		     IBV_FLUSH_PERSISTENT, IBV_FLUSH_MR);
	ASSERT_EQ(0, ibv_wr_complete(qpx));
	st = wait_cq(self->l.cq, 240000);
	EXPECT_NE(IBV_WC_REM_ACCESS_ERR, st)
		TH_LOG("REPRODUCED: the FLUSH of 2 GiB was refused as an rkey violation");
	EXPECT_EQ(IBV_WC_SUCCESS, st) TH_LOG("FLUSH status %d", st);

	EXPECT_EQ(0, ibv_destroy_qp(qp));
	EXPECT_EQ(0, ibv_destroy_qp(resp));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, FLUSH_MR_LEN);
}

/* Writes, reads and atomics through an implicit MR's rkey, across children. */
TEST_F(odp, implicit_across_children)
{
	char *area = mmap(NULL, 2 * CHILD_SIZE, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	struct ibv_mr *mr;
	uintptr_t edge;
	char *p;
	uint64_t v;

	ASSERT_NE(MAP_FAILED, area);
	edge = ((uintptr_t)area + CHILD_SIZE) & ~(CHILD_SIZE - 1);
	p = (char *)edge - 10000;	/* 10000 bytes in one child, the rest in the next */
	mr = ibv_reg_mr(self->pd, NULL, SIZE_MAX, ODP_REMOTE);
	ASSERT_NE(NULL, mr) TH_LOG("implicit ODP: %s", strerror(errno));

	fill(self->l.local_buf, 30000, 5);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_WRITE,
				       (uintptr_t)p, mr->rkey, 30000));
	EXPECT_EQ(0, memcmp(p, self->l.local_buf, 30000));

	fill(p, 30000, 9);
	memset(self->l.local_buf, 0, 30000);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_READ,
				       (uintptr_t)p, mr->rkey, 30000));
	EXPECT_EQ(0, memcmp(self->l.local_buf, p, 30000));

	memcpy((char *)edge, &(uint64_t){ 7 }, 8);
	ASSERT_EQ(IBV_WC_SUCCESS, fetch_add(&self->l, edge, mr->rkey, 5));
	memcpy(&v, (char *)edge, 8);
	EXPECT_EQ(12ULL, v);

	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(area, 2 * CHILD_SIZE);
}

/* An implicit MR follows the mapping: unmap, map again, see the new page. */
TEST_F(odp, implicit_follows_remap)
{
	struct ibv_mr *mr = ibv_reg_mr(self->pd, NULL, SIZE_MAX, ODP_REMOTE);
	char *buf = map_anon(LEN), *again;

	ASSERT_NE(NULL, mr);
	ASSERT_NE(NULL, buf);
	memset(buf, 'A', LEN);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_READ,
				       (uintptr_t)buf, mr->rkey, LEN));
	EXPECT_EQ('A', self->l.local_buf[LEN - 1]);
	ASSERT_EQ(0, munmap(buf, LEN));
	again = mmap(buf, LEN, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	ASSERT_EQ(buf, again);
	memset(buf, 'B', LEN);
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_READ,
				       (uintptr_t)buf, mr->rkey, LEN));
	EXPECT_EQ('B', self->l.local_buf[0]);
	EXPECT_EQ('B', self->l.local_buf[LEN - 1]);
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(buf, LEN);
}

/* An implicit MR reaches no address that is not mapped. */
TEST_F(odp, implicit_unmapped_address)
{
	struct ibv_mr *mr = ibv_reg_mr(self->pd, NULL, SIZE_MAX, ODP_REMOTE);
	char *buf = map_anon(LEN);

	ASSERT_NE(NULL, mr);
	ASSERT_NE(NULL, buf);
	ASSERT_EQ(0, munmap(buf, LEN));
	EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, rdma(&self->l,
					      IBV_WR_RDMA_WRITE,
					      (uintptr_t)buf, mr->rkey, 64));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
}

#define SYNC IBV_ADVISE_MR_FLAG_FLUSH

/* Each bad prefetch gets its own errno, on the synchronous and async paths. */
TEST_F(odp, advise_mr_checks)
{
	char *buf = map_anon(LEN);
	struct ibv_mr *odp_rw, *odp_ro, *pinned;
	uint32_t flags;

	ASSERT_NE(NULL, buf);
	odp_rw = ibv_reg_mr(self->pd, buf, LEN, ODP_REMOTE);
	odp_ro = ibv_reg_mr(self->pd, buf, LEN,
			    IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_READ);
	pinned = ibv_reg_mr(self->pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	ASSERT_NE(NULL, odp_rw);
	ASSERT_NE(NULL, odp_ro);
	ASSERT_NE(NULL, pinned);

	for (flags = 0; flags <= SYNC; flags += SYNC) {
		TH_LOG("%s path", flags ? "synchronous" : "asynchronous");
		EXPECT_EQ(0, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				       flags, (uintptr_t)buf, LEN, odp_rw->lkey));
		/* A read-only ODP MR can be prefetched for reading... */
		EXPECT_EQ(0, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH,
				       flags, (uintptr_t)buf, LEN, odp_ro->lkey));
		EXPECT_EQ(0, advise_mr(self->pd,
				       IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
				       flags, (uintptr_t)buf, LEN, odp_ro->lkey));
		/* ...not for writing. */
		EXPECT_EQ(EPERM, advise_mr(self->pd,
					   IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
					   flags, (uintptr_t)buf, LEN,
					   odp_ro->lkey));
		EXPECT_EQ(EINVAL, advise_mr(self->pd,
					    IBV_ADVISE_MR_ADVICE_PREFETCH,
					    flags, (uintptr_t)buf, LEN,
					    pinned->lkey));
		EXPECT_EQ(ENOENT, advise_mr(self->pd,
					    IBV_ADVISE_MR_ADVICE_PREFETCH,
					    flags, (uintptr_t)buf, LEN,
					    odp_rw->lkey ^ 0xffff00));
		EXPECT_EQ(EINVAL, advise_mr(self->pd,
					    IBV_ADVISE_MR_ADVICE_PREFETCH,
					    flags, (uintptr_t)buf + 4096, LEN,
					    odp_rw->lkey));
	}
	EXPECT_EQ(EOPNOTSUPP, advise_mr(self->pd, 77, SYNC, (uintptr_t)buf,
					LEN, odp_rw->lkey));
	EXPECT_EQ(0, ibv_dereg_mr(pinned));
	EXPECT_EQ(0, ibv_dereg_mr(odp_ro));
	EXPECT_EQ(0, ibv_dereg_mr(odp_rw));
	munmap(buf, LEN);
}

/* Prefetch, faults and invalidations show in the device's ODP counters. */
TEST_F(odp, counters)
{
	uint64_t pf0 = hw_counter("odp_page_prefetch");
	uint64_t f0 = hw_counter("odp_page_faults");
	uint64_t h0 = hw_counter("odp_page_faults_handled");
	uint64_t inv0 = hw_counter("odp_page_invalidations");
	struct ibv_mr *mr = ibv_reg_mr(self->pd, NULL, SIZE_MAX, ODP_REMOTE);
	char *a = map_anon(LEN), *b = map_anon(LEN);

	ASSERT_NE(UINT64_MAX, pf0) TH_LOG("no odp_* hw counters");
	ASSERT_NE(NULL, mr);
	ASSERT_NE(NULL, a);
	ASSERT_NE(NULL, b);
	EXPECT_EQ(0, advise_mr(self->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			       SYNC, (uintptr_t)a, LEN, mr->lkey));
	EXPECT_EQ(pf0 + LEN / 4096, hw_counter("odp_page_prefetch"));
	/* b was never touched: the write faults each page in. */
	ASSERT_EQ(IBV_WC_SUCCESS, rdma(&self->l, IBV_WR_RDMA_WRITE,
				       (uintptr_t)b, mr->rkey, LEN));
	/* Every page mapped by a fault; at least one fault. */
	EXPECT_LE(f0 + LEN / 4096, hw_counter("odp_page_faults"));
	EXPECT_LT(h0, hw_counter("odp_page_faults_handled"));
	ASSERT_EQ(0, munmap(a, LEN));
	EXPECT_LE(inv0 + LEN / 4096, hw_counter("odp_page_invalidations"));
	EXPECT_EQ(0, ibv_dereg_mr(mr));
	munmap(b, LEN);
}

TEST_HARNESS_MAIN
