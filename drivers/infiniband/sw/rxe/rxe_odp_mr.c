// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * rxe On-Demand Paging: registration of explicit and implicit ODP MRs, the
 * children of implicit MRs, invalidation, and the per-MR counters.
 *
 * The page list of an ODP umem (map.pfn_list) holds one entry per PAGE_SIZE
 * page whatever the umem's page_shift, as hmm_range_fault() fills it; rxe
 * indexes it that way everywhere, so huge-page umems need nothing special
 * beyond invalidating whole huge pages.
 */

#include <linux/hmm.h>
#include <rdma/ib_umem_odp.h>

#include "rxe.h"
#include "rxe_odp.h"

static const char * const rxe_odp_counter_names[RXE_ODP_NUM_COUNTERS] = {
	[RXE_ODP_PAGE_FAULTS] = "page_faults",
	[RXE_ODP_PAGE_FAULTS_HANDLED] = "page_faults_handled",
	[RXE_ODP_PAGE_INVALIDATIONS] = "page_invalidations",
	[RXE_ODP_PAGE_INVALIDATIONS_HANDLED] = "page_invalidations_handled",
	[RXE_ODP_PAGE_PREFETCH] = "page_prefetch",
};

/* The device-wide totals, in rxe's hw counters, in the same order. */
static const enum rxe_counters rxe_odp_device_counter[RXE_ODP_NUM_COUNTERS] = {
	[RXE_ODP_PAGE_FAULTS] = RXE_CNT_ODP_PAGE_FAULTS,
	[RXE_ODP_PAGE_FAULTS_HANDLED] = RXE_CNT_ODP_PAGE_FAULTS_HANDLED,
	[RXE_ODP_PAGE_INVALIDATIONS] = RXE_CNT_ODP_PAGE_INVALIDATIONS,
	[RXE_ODP_PAGE_INVALIDATIONS_HANDLED] =
		RXE_CNT_ODP_PAGE_INVALIDATIONS_HANDLED,
	[RXE_ODP_PAGE_PREFETCH] = RXE_CNT_ODP_PAGE_PREFETCH,
};

void rxe_odp_count(struct rxe_mr *mr, enum rxe_odp_counter c, u64 pages)
{
	struct rxe_dev *rxe = to_rdev(mr->ibmr.device);

	if (!pages)
		return;
	atomic64_add(pages, &mr->odp->counters[c]);
	atomic64_add(pages, &rxe->stats_counters[rxe_odp_device_counter[c]]);
}

/* For `rdma stat show mr`: the MR's counters, by name. */
int rxe_odp_fill_stat_mr_entry(struct sk_buff *msg, struct ib_mr *ibmr)
{
	struct rxe_mr *mr = to_rmr(ibmr);
	struct nlattr *table;
	int c;

	if (!mr->odp)
		return 0;
	table = nla_nest_start(msg, RDMA_NLDEV_ATTR_STAT_HWCOUNTERS);
	if (!table)
		return -EMSGSIZE;
	for (c = 0; c < RXE_ODP_NUM_COUNTERS; c++) {
		if (rdma_nl_stat_hwcounter_entry(msg, rxe_odp_counter_names[c],
						 atomic64_read(&mr->odp->counters[c]))) {
			nla_nest_cancel(msg, table);
			return -EMSGSIZE;
		}
	}
	nla_nest_end(msg, table);
	return 0;
}

/*
 * The umem's page list loses [start, end), widened to whole pages of the
 * umem's page size: a huge page is mapped, and dropped, as one.
 */
static void rxe_odp_unmap(struct ib_umem_odp *umem_odp, u64 start, u64 end,
			  u64 *mapped)
{
	unsigned long *pfns = umem_odp->map.pfn_list;
	u64 page_size = BIT_ULL(umem_odp->page_shift);
	u64 va, idx;

	lockdep_assert_held(&umem_odp->umem_mutex);
	start = ALIGN_DOWN(max(start, ib_umem_start(umem_odp)), page_size);
	end = min(ALIGN(end, page_size), ib_umem_end(umem_odp));
	for (va = start; va < end; va += PAGE_SIZE) {
		idx = (va - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
		if (pfns[idx] & HMM_PFN_VALID)
			(*mapped)++;
		pfns[idx] &= ~HMM_PFN_FLAGS;
	}
}

static bool rxe_odp_invalidate(struct mmu_interval_notifier *mni,
			       const struct mmu_notifier_range *range,
			       unsigned long cur_seq)
{
	struct ib_umem_odp *umem_odp =
		container_of(mni, struct ib_umem_odp, notifier);
	u64 start = max(range->start, ib_umem_start(umem_odp));
	u64 end = min(range->end, ib_umem_end(umem_odp));
	struct rxe_mr *mr;
	u64 mapped = 0;

	/* umem_mutex may be held across a page fault: this may sleep. */
	if (!mmu_notifier_range_blockable(range))
		return false;

	mutex_lock(&umem_odp->umem_mutex);
	mmu_interval_set_seq(mni, cur_seq);
	rxe_odp_unmap(umem_odp, start, end, &mapped);
	/* NULL before registration completes and once cleanup began. */
	mr = umem_odp->private;
	if (mr) {
		rxe_odp_count(mr, RXE_ODP_PAGE_INVALIDATIONS,
			      (end - start) >> PAGE_SHIFT);
		rxe_odp_count(mr, RXE_ODP_PAGE_INVALIDATIONS_HANDLED, mapped);
		if (mapped)
			WRITE_ONCE(mr->odp->churn, jiffies);
		/* A child whose memory is unmapped may be empty now. */
		if (umem_odp != to_ib_umem_odp(mr->umem) &&
		    range->event == MMU_NOTIFY_UNMAP) {
			xa_set_mark(&mr->odp->children,
				    ib_umem_start(umem_odp) >> RXE_ODP_CHILD_SHIFT,
				    RXE_ODP_CHILD_REAP);
			queue_work(rxe_wq, &mr->odp->reap_work);
		}
	}
	mutex_unlock(&umem_odp->umem_mutex);
	return true;
}

/* Let invalidations of @umem_odp account to @mr (NULL: to nobody). */
static void rxe_odp_set_owner(struct ib_umem_odp *umem_odp, struct rxe_mr *mr)
{
	mutex_lock(&umem_odp->umem_mutex);
	umem_odp->private = mr;
	mutex_unlock(&umem_odp->umem_mutex);
}

/* Declared by rxe_loc.h for every ODP umem rxe creates. */
const struct mmu_interval_notifier_ops rxe_mn_ops = {
	.invalidate = rxe_odp_invalidate,
};

static bool rxe_odp_umem_empty(struct ib_umem_odp *umem_odp)
{
	size_t i, n = (ib_umem_end(umem_odp) - ib_umem_start(umem_odp)) >>
		      PAGE_SHIFT;
	bool empty = true;

	mutex_lock(&umem_odp->umem_mutex);
	for (i = 0; i < n && empty; i++)
		empty = !(umem_odp->map.pfn_list[i] & HMM_PFN_VALID);
	mutex_unlock(&umem_odp->umem_mutex);
	return empty;
}

/*
 * Free the children of an implicit MR that map no page any more. Releasing
 * one waits for the mm's running invalidations, which never take
 * children_sem, so it may be done with the semaphore held.
 */
static void rxe_odp_reap_children(struct work_struct *work)
{
	struct rxe_odp_mr *odp = container_of(work, struct rxe_odp_mr,
					      reap_work);
	struct ib_umem_odp *child;
	unsigned long idx;

	down_write(&odp->children_sem);
	xa_for_each_marked(&odp->children, idx, child, RXE_ODP_CHILD_REAP) {
		xa_clear_mark(&odp->children, idx, RXE_ODP_CHILD_REAP);
		if (!rxe_odp_umem_empty(child))
			continue;
		xa_erase(&odp->children, idx);
		ib_umem_odp_release(child);
	}
	up_write(&odp->children_sem);
}

struct ib_umem_odp *rxe_odp_umem_at(struct rxe_mr *mr, u64 va)
{
	struct ib_umem_odp *root = to_ib_umem_odp(mr->umem);
	struct rxe_odp_mr *odp = mr->odp;
	unsigned long idx = va >> RXE_ODP_CHILD_SHIFT;
	struct ib_umem_odp *child, *old;

	if (!root->is_implicit_odp) {
		if (va < ib_umem_start(root) || va >= ib_umem_end(root))
			return ERR_PTR(-EFAULT);
		return root;
	}
	lockdep_assert_held(&odp->children_sem);
	if (va >= TASK_SIZE)
		return ERR_PTR(-EFAULT);
	child = xa_load(&odp->children, idx);
	if (child)
		return child;

	child = ib_umem_odp_alloc_child(root, idx << RXE_ODP_CHILD_SHIFT,
					RXE_ODP_CHILD_SIZE, &rxe_mn_ops);
	if (IS_ERR(child))
		return child;
	rxe_odp_set_owner(child, mr);
	old = xa_cmpxchg(&odp->children, idx, NULL, child, GFP_KERNEL);
	if (old) {
		/* Another thread created it first, or no memory. */
		ib_umem_odp_release(child);
		return xa_is_err(old) ? ERR_PTR(xa_err(old)) : old;
	}
	return child;
}

/* Map what is already present, without faulting: the first access is cheap. */
static void rxe_odp_snapshot(struct ib_umem_odp *umem_odp)
{
	int np;

	np = ib_umem_odp_map_dma_and_lock(umem_odp, ib_umem_start(umem_odp),
					  ib_umem_end(umem_odp) -
					  ib_umem_start(umem_odp), 0, false);
	if (np >= 0)
		mutex_unlock(&umem_odp->umem_mutex);
}

int rxe_odp_mr_init_user(struct rxe_dev *rxe, u64 start, u64 length,
			 u64 iova, int access_flags, struct rxe_mr *mr)
{
	bool implicit = !start && length == U64_MAX;
	struct ib_umem_odp *umem_odp;
	struct rxe_odp_mr *odp;

	rxe_mr_init(access_flags, mr);
	/* An implicit MR is the address space itself: iova is the address. */
	if (implicit && iova)
		return -EINVAL;

	odp = kzalloc_obj(*odp);
	if (!odp)
		return -ENOMEM;
	odp->mr = mr;
	init_rwsem(&odp->children_sem);
	xa_init(&odp->children);
	INIT_WORK(&odp->reap_work, rxe_odp_reap_children);
	spin_lock_init(&odp->fault_lock);
	odp->rnr_va = U64_MAX;
	odp->transient_va = U64_MAX;
	odp->churn = jiffies - msecs_to_jiffies(RXE_ODP_CHURN_MS);

	/*
	 * The page list is per PAGE_SIZE page whatever the memory, so huge
	 * pages need no page size of their own: IB_ACCESS_HUGETLB is
	 * accepted, and the umem is made without it. (With it, the core
	 * refuses a fault on small pages after having filled them in.)
	 */
	if (implicit)
		umem_odp = ib_umem_odp_alloc_implicit(&rxe->ib_dev,
						      access_flags &
						      ~IB_ACCESS_HUGETLB);
	else
		umem_odp = ib_umem_odp_get(&rxe->ib_dev, start, length,
					   access_flags & ~IB_ACCESS_HUGETLB,
					   &rxe_mn_ops);
	if (IS_ERR(umem_odp)) {
		kfree(odp);
		rxe_dbg_mr(mr, "no ODP umem: %pe\n", umem_odp);
		return PTR_ERR(umem_odp);
	}
	mr->odp = odp;
	mr->umem = &umem_odp->umem;
	rxe_odp_set_owner(umem_odp, mr);
	mr->access = access_flags;
	mr->ibmr.length = length;
	mr->ibmr.iova = iova;
	mr->ibmr.type = IB_MR_TYPE_USER;
	if (!implicit)
		rxe_odp_snapshot(umem_odp);
	mr->state = RXE_MR_STATE_VALID;
	return 0;
}

/*
 * Called when the MR's last reference is gone, before its umem is released:
 * no data path or prefetch can use it any more.
 */
void rxe_odp_mr_cleanup(struct rxe_mr *mr)
{
	struct rxe_odp_mr *odp = mr->odp;
	struct ib_umem_odp *child;
	unsigned long idx;

	if (!odp)
		return;
	rxe_odp_set_owner(to_ib_umem_odp(mr->umem), NULL);
	down_write(&odp->children_sem);
	xa_for_each(&odp->children, idx, child) {
		xa_erase(&odp->children, idx);
		ib_umem_odp_release(child);
	}
	up_write(&odp->children_sem);
	/* Queued by an invalidation that ran before the last child went. */
	cancel_work_sync(&odp->reap_work);
	xa_destroy(&odp->children);
	mr->odp = NULL;
	kfree(odp);
}
