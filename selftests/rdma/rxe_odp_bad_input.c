// SPDX-License-Identifier: GPL-2.0
/*
 * The rxe ODP entry points, one invalid argument at a time: ODP MR
 * registration (explicit, implicit, with an iova) and ibv_advise_mr() on
 * both its synchronous and asynchronous paths. Each row must fail with
 * exactly the errno named; a failed prefetch must prefetch nothing.
 */
#include "../kselftest_harness.h"
#include "rxe_odp_util.h"

#define LEN	(64 * 1024UL)
#define SYNC	IBV_ADVISE_MR_FLAG_FLUSH

#define ODP_RW	(IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | \
		 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct start {
	struct ibv_context *ctx;
	struct ibv_pd *pd, *other_pd;
	char *buf;
	struct ibv_mr *odp;		/* explicit ODP over buf, read-write */
	struct ibv_mr *odp_ro;		/* explicit ODP over buf, read-only */
	struct ibv_mr *pinned;		/* over buf */
	struct ibv_mr *implicit;
	struct ibv_mr *other_pd_odp;	/* explicit ODP over buf, other PD */
	uint32_t flags;			/* the row's ibv_advise_mr() flags */
};

/* A row: one call, returning 0 or an errno. */
typedef int (*bad_fn)(struct start *s);

FIXTURE(bad)
{
	struct start s;
};

FIXTURE_VARIANT(bad)
{
	bad_fn call;
	int err;
	uint32_t advise_flags;	/* for ibv_advise_mr() rows: SYNC or 0 */
};

FIXTURE_SETUP(bad)
{
	struct start *s = &self->s;

	s->ctx = open_device(rdma_dev_name());
	/* The device is the caller's to make (rdma link add). */
	if (!s->ctx)
		SKIP(return, "no RDMA device %s", rdma_dev_name());
	s->pd = ibv_alloc_pd(s->ctx);
	s->other_pd = ibv_alloc_pd(s->ctx);
	ASSERT_NE(NULL, s->pd);
	ASSERT_NE(NULL, s->other_pd);
	s->buf = map_anon(LEN);
	ASSERT_NE(NULL, s->buf);
	s->odp = ibv_reg_mr(s->pd, s->buf, LEN, ODP_RW);
	s->odp_ro = ibv_reg_mr(s->pd, s->buf, LEN, IBV_ACCESS_ON_DEMAND |
			       IBV_ACCESS_REMOTE_READ);
	s->pinned = ibv_reg_mr(s->pd, s->buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	s->implicit = ibv_reg_mr(s->pd, NULL, SIZE_MAX, ODP_RW);
	s->other_pd_odp = ibv_reg_mr(s->other_pd, s->buf, LEN, ODP_RW);
	ASSERT_NE(NULL, s->odp);
	ASSERT_NE(NULL, s->odp_ro);
	ASSERT_NE(NULL, s->pinned);
	ASSERT_NE(NULL, s->implicit);
	ASSERT_NE(NULL, s->other_pd_odp);
}

FIXTURE_TEARDOWN(bad)
{
	struct start *s = &self->s;
	struct ibv_mr *mrs[] = {
		s->odp, s->odp_ro, s->pinned, s->implicit, s->other_pd_odp,
	};
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(mrs); i++)
		if (mrs[i])
			ibv_dereg_mr(mrs[i]);
	if (s->buf)
		munmap(s->buf, LEN);
	if (s->other_pd)
		ibv_dealloc_pd(s->other_pd);
	if (s->pd)
		ibv_dealloc_pd(s->pd);
	if (s->ctx)
		ibv_close_device(s->ctx);
}

TEST_F(bad, call)
{
	uint64_t prefetched = hw_counter("odp_page_prefetch");
	int err;

	/* Unreadable, the counter would compare equal to itself below. */
	ASSERT_NE(UINT64_MAX, prefetched)
		TH_LOG("no odp_page_prefetch counter on %s", rdma_dev_name());
	self->s.flags = variant->advise_flags;
	err = variant->call(&self->s);

	EXPECT_EQ(variant->err, err)
		TH_LOG("errno %d (%s), expected %d (%s)", err, strerror(err),
		       variant->err, strerror(variant->err));
	/* Checked before anything is queued: no page was prefetched. */
	if (!variant->advise_flags)
		usleep(50 * 1000);	/* an asynchronous prefetch has run */
	EXPECT_EQ(prefetched, hw_counter("odp_page_prefetch"));
}

/* The errno of a registration that must fail; one that succeeds is undone. */
static int reg_errno(struct ibv_mr *mr)
{
	if (!mr)
		return errno;
	ibv_dereg_mr(mr);
	return 0;
}

/* Registration. */
static int try_reg_implicit_iova(struct start *s)
{
	return reg_errno(ibv_reg_mr_iova(s->pd, NULL, SIZE_MAX, 1UL << 30,
					 ODP_RW));
}

FIXTURE_VARIANT_ADD(bad, reg_implicit_iova) {
	.call = try_reg_implicit_iova, .err = EINVAL,
};

static int try_reg_len_zero(struct start *s)
{
	return reg_errno(ibv_reg_mr(s->pd, s->buf, 0, ODP_RW));
}

FIXTURE_VARIANT_ADD(bad, reg_len_zero) {
	.call = try_reg_len_zero, .err = EINVAL,
};

static int try_reg_wraps(struct start *s)
{
	return reg_errno(ibv_reg_mr(s->pd, (void *)-4096UL, 8192, ODP_RW));
}

FIXTURE_VARIANT_ADD(bad, reg_wraps) {
	.call = try_reg_wraps, .err = EOVERFLOW,
};

/*
 * Implicit is address 0 and SIZE_MAX only; anything else that long runs off
 * the end of the address space. (libibverbs itself refuses SIZE_MAX from
 * another address, so ask the kernel for a page less.)
 */
static int try_reg_almost_size_max_from_buf(struct start *s)
{
	return reg_errno(ibv_reg_mr(s->pd, s->buf, SIZE_MAX - 4095, ODP_RW));
}

FIXTURE_VARIANT_ADD(bad, reg_almost_size_max_from_buf) {
	.call = try_reg_almost_size_max_from_buf, .err = EOVERFLOW,
};

static int try_reg_remote_write_no_local(struct start *s)
{
	return reg_errno(ibv_reg_mr(s->pd, s->buf, LEN, IBV_ACCESS_ON_DEMAND |
				    IBV_ACCESS_REMOTE_WRITE));
}

FIXTURE_VARIANT_ADD(bad, reg_remote_write_no_local) {
	.call = try_reg_remote_write_no_local, .err = EINVAL,
};

static int try_reg_implicit_atomic_no_local(struct start *s)
{
	return reg_errno(ibv_reg_mr(s->pd, NULL, SIZE_MAX,
				    IBV_ACCESS_ON_DEMAND |
				    IBV_ACCESS_REMOTE_ATOMIC));
}

FIXTURE_VARIANT_ADD(bad, reg_implicit_atomic_no_local) {
	.call = try_reg_implicit_atomic_no_local, .err = EINVAL,
};

/* The iova's offset in its page must be the address's. */
static int try_reg_iova_offset_differs(struct start *s)
{
	return reg_errno(ibv_reg_mr_iova(s->pd, s->buf, LEN, 0x5000000010ULL,
					 ODP_RW));
}

FIXTURE_VARIANT_ADD(bad, reg_iova_offset_differs) {
	.call = try_reg_iova_offset_differs, .err = EINVAL,
};

/* ibv_advise_mr(), each case on the asynchronous and synchronous paths. */
static int try_unknown_key(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf, LEN, s->odp->lkey ^ 0xffff00);
}

FIXTURE_VARIANT_ADD(bad, advise_unknown_key) {
	.call = try_unknown_key, .err = ENOENT,
};

FIXTURE_VARIANT_ADD(bad, advise_unknown_key_sync) {
	.call = try_unknown_key, .err = ENOENT, .advise_flags = SYNC,
};

static int try_other_pd_key(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf, LEN, s->other_pd_odp->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_other_pd_key) {
	.call = try_other_pd_key, .err = ENOENT,
};

FIXTURE_VARIANT_ADD(bad, advise_other_pd_key_sync) {
	.call = try_other_pd_key, .err = ENOENT, .advise_flags = SYNC,
};

static int try_pinned_mr(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf, LEN, s->pinned->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_pinned_mr) {
	.call = try_pinned_mr, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_pinned_mr_sync) {
	.call = try_pinned_mr, .err = EINVAL, .advise_flags = SYNC,
};

static int try_past_the_end(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf + 4096, LEN, s->odp->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_past_the_end) {
	.call = try_past_the_end, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_past_the_end_sync) {
	.call = try_past_the_end, .err = EINVAL, .advise_flags = SYNC,
};

static int try_before_the_start(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf - 4096, 4096, s->odp->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_before_the_start) {
	.call = try_before_the_start, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_before_the_start_sync) {
	.call = try_before_the_start, .err = EINVAL, .advise_flags = SYNC,
};

static int try_length_wraps(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			 (uintptr_t)s->buf + LEN - 1, UINT32_MAX,
			 s->odp->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_length_wraps) {
	.call = try_length_wraps, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_length_wraps_sync) {
	.call = try_length_wraps, .err = EINVAL, .advise_flags = SYNC,
};

static int try_write_read_only(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, s->flags,
			 (uintptr_t)s->buf, LEN, s->odp_ro->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_write_read_only) {
	.call = try_write_read_only, .err = EPERM,
};

FIXTURE_VARIANT_ADD(bad, advise_write_read_only_sync) {
	.call = try_write_read_only, .err = EPERM, .advise_flags = SYNC,
};

/* All or nothing: a bad second SGE, and the good first is not prefetched. */
static int try_second_sge_bad(struct start *s)
{
	struct ibv_sge sge[2] = {
		{ (uintptr_t)s->buf, LEN, s->odp->lkey },
		{ (uintptr_t)s->buf, LEN, s->pinned->lkey },
	};

	return advise_mr_sges(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
			      s->flags, sge, 2);
}

FIXTURE_VARIANT_ADD(bad, advise_second_sge_bad) {
	.call = try_second_sge_bad, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_second_sge_bad_sync) {
	.call = try_second_sge_bad, .err = EINVAL, .advise_flags = SYNC,
};

static int try_implicit_unknown_advice(struct start *s)
{
	return advise_mr(s->pd, 77, s->flags, (uintptr_t)s->buf, LEN,
			 s->implicit->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_unknown_advice) {
	.call = try_implicit_unknown_advice, .err = EOPNOTSUPP,
};

FIXTURE_VARIANT_ADD(bad, advise_unknown_advice_sync) {
	.call = try_implicit_unknown_advice, .err = EOPNOTSUPP,
	.advise_flags = SYNC,
};

/* The uverbs core checks the flags attribute against the flags it knows. */
static int try_unknown_flag(struct start *s)
{
	return advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags | 1U << 1,
			 (uintptr_t)s->buf, LEN, s->implicit->lkey);
}

FIXTURE_VARIANT_ADD(bad, advise_unknown_flag) {
	.call = try_unknown_flag, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_unknown_flag_sync) {
	.call = try_unknown_flag, .err = EINVAL, .advise_flags = SYNC,
};

static int try_no_sge(struct start *s)
{
	return advise_mr_sges(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH, s->flags,
			      NULL, 0);
}

FIXTURE_VARIANT_ADD(bad, advise_no_sge) {
	.call = try_no_sge, .err = EINVAL,
};

FIXTURE_VARIANT_ADD(bad, advise_no_sge_sync) {
	.call = try_no_sge, .err = EINVAL, .advise_flags = SYNC,
};

TEST_HARNESS_MAIN
