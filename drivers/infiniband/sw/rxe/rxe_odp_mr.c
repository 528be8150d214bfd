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
#include <linux/memcontrol.h>
#include <linux/sched/mm.h>
#include <rdma/ib_umem_odp.h>

#include "rxe.h"
#include "rxe_odp.h"

struct workqueue_struct *rxe_odp_wq;

int rxe_odp_init(void)
{
	rxe_odp_wq = alloc_workqueue("rxe_odp", WQ_UNBOUND, 0);
	return rxe_odp_wq ? 0 : -ENOMEM;
}

void rxe_odp_exit(void)
{
	destroy_workqueue(rxe_odp_wq);
}

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
	const unsigned long writable = HMM_PFN_VALID | HMM_PFN_WRITE;
	bool dirty = umem_odp->umem.writable;
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
		/*
		 * The responder may have written the page through this entry,
		 * never through the user's PTE, which stays clean: without
		 * this, reclaim could drop the data (a MADV_FREE page) or
		 * never write it back (a shared file). The entry is one the
		 * mm still maps (rxe_odp_fault_and_lock() enters no other),
		 * and an invalidation runs before its pages are freed.
		 */
		if (dirty && (pfns[idx] & writable) == writable)
			folio_mark_dirty(page_folio(hmm_pfn_to_page(pfns[idx])));
		pfns[idx] &= ~HMM_PFN_FLAGS;
	}
}

/* Drop the whole page list of a umem about to be released. */
static void rxe_odp_unmap_all(struct ib_umem_odp *umem_odp)
{
	u64 mapped = 0;

	mutex_lock(&umem_odp->umem_mutex);
	rxe_odp_unmap(umem_odp, ib_umem_start(umem_odp), ib_umem_end(umem_odp),
		      &mapped);
	mutex_unlock(&umem_odp->umem_mutex);
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
		rxe_odp_count(mr, RXE_ODP_PAGE_INVALIDATIONS, mapped);
		if (mapped) {
			rxe_odp_count(mr, RXE_ODP_PAGE_INVALIDATIONS_HANDLED, 1);
			WRITE_ONCE(mr->odp->churn, jiffies);
		}
		/* A child whose memory is unmapped may be empty now. */
		if (range->event == MMU_NOTIFY_UNMAP)
			rxe_odp_reap_later(mr, umem_odp);
	}
	mutex_unlock(&umem_odp->umem_mutex);
	return true;
}

/*
 * @umem_odp, if a child of implicit @mr, may map no page any more: have the
 * reaper look at it.
 */
void rxe_odp_reap_later(struct rxe_mr *mr, struct ib_umem_odp *umem_odp)
{
	if (umem_odp == to_ib_umem_odp(mr->umem))
		return;
	xa_set_mark(&mr->odp->children,
		    ib_umem_start(umem_odp) >> RXE_ODP_CHILD_SHIFT,
		    RXE_ODP_CHILD_REAP);
	queue_work(rxe_odp_wq, &mr->odp->reap_work);
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

/* Free the children of an implicit MR that map no page any more. */
static void rxe_odp_reap_children(struct work_struct *work)
{
	struct rxe_odp_mr *odp = container_of(work, struct rxe_odp_mr,
					      reap_work);
	struct ib_umem_odp *child, *empty;
	unsigned long idx;

	do {
		empty = NULL;
		down_write(&odp->children_sem);
		xa_for_each_marked(&odp->children, idx, child,
				   RXE_ODP_CHILD_REAP) {
			xa_clear_mark(&odp->children, idx, RXE_ODP_CHILD_REAP);
			if (rxe_odp_umem_empty(child)) {
				xa_erase(&odp->children, idx);
				empty = child;
				break;
			}
		}
		up_write(&odp->children_sem);
		/*
		 * Out of the tree, no reader can hold it. Releasing it waits
		 * for the mm's running invalidations: not with the semaphore
		 * held, which would stall every access to the MR meanwhile.
		 */
		if (empty)
			ib_umem_odp_release(empty);
	} while (empty);
}

struct ib_umem_odp *rxe_odp_umem_at(struct rxe_mr *mr, u64 va, bool create)
{
	struct ib_umem_odp *root = to_ib_umem_odp(mr->umem);
	struct rxe_odp_mr *odp = mr->odp;
	unsigned long idx = va >> RXE_ODP_CHILD_SHIFT;
	struct ib_umem_odp *child, *old;
	struct mem_cgroup *memcg, *prev;

	if (!root->is_implicit_odp) {
		if (va < ib_umem_start(root) || va >= ib_umem_end(root))
			return ERR_PTR(-EFAULT);
		return root;
	}
	lockdep_assert_held(&odp->children_sem);
	/* The owner's own limit: a 32-bit process's is below TASK_SIZE. */
	if (va >= READ_ONCE(root->umem.owning_mm->task_size))
		return ERR_PTR(-EFAULT);
	child = xa_load(&odp->children, idx);
	if (child || !create)
		return child;

	/*
	 * A child is made for the owner, by whoever accessed it (a QP's task,
	 * a fault's work): its page list, 256 KiB, is charged to the owner's
	 * memory cgroup, so a peer touching a sparse address space cannot
	 * grow kernel memory past the owner's limit.
	 */
	memcg = get_mem_cgroup_from_mm(root->umem.owning_mm);
	prev = set_active_memcg(memcg);
	child = ib_umem_odp_alloc_child(root, idx << RXE_ODP_CHILD_SHIFT,
					RXE_ODP_CHILD_SIZE, &rxe_mn_ops);
	set_active_memcg(prev);
	mem_cgroup_put(memcg);
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

/*
 * Walks of the page tables fill a buffer of at most this many entries, and
 * the page list takes them a batch at a time.
 */
#define RXE_ODP_WALK_PAGES	512

/* Walks a fault retries after collisions before its deadline can end it. */
#define RXE_ODP_FAULT_MIN_TRIES	16

/*
 * Walk @npages pages from @start, faulting if @fault, and enter the pages
 * found in the page list; returns with umem_mutex held (not on error).
 */
static int rxe_odp_fault_batch(struct ib_umem_odp *umem_odp,
			       unsigned long *pfns, u64 start, u64 npages,
			       bool write, bool fault, unsigned long deadline)
{
	struct hmm_range range = {
		.notifier = &umem_odp->notifier,
		.start = start,
		.end = start + (npages << PAGE_SHIFT),
		.hmm_pfns = pfns,
	};
	u64 first = (start - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
	unsigned int tries;
	u64 i;
	int err;

	if (fault)
		range.default_flags = HMM_PFN_REQ_FAULT |
				      (write ? HMM_PFN_REQ_WRITE : 0);
	for (tries = 1;; tries++) {
		/* hmm keeps the in/out flags of what it is given. */
		memset(pfns, 0, npages * sizeof(*pfns));
		err = hmm_range_fault_unlocked_timeout(&range,
						       msecs_to_jiffies(HMM_RANGE_DEFAULT_TIMEOUT));
		if (!err) {
			mutex_lock(&umem_odp->umem_mutex);
			if (!mmu_interval_read_retry(&umem_odp->notifier,
						     range.notifier_seq))
				break;
			mutex_unlock(&umem_odp->umem_mutex);
			err = -EBUSY;
		}
		/*
		 * Invalidated while walking, again and again: let it settle.
		 * Time alone does not end it: a walk slow by itself (a busy
		 * CPU, the mmap_lock held long by its owner) may pass the
		 * deadline, and its first collision must not fail the access.
		 */
		if (err != -EBUSY ||
		    (tries >= RXE_ODP_FAULT_MIN_TRIES &&
		     time_after(jiffies, deadline)))
			return err;
		cond_resched();
	}
	for (i = 0; i < npages; i++)
		if (pfns[i] & HMM_PFN_VALID)
			umem_odp->map.pfn_list[first + i] = pfns[i];
	return 0;
}

/* Count a fault of @mr (NULL: one at registration), unless it is dying. */
static bool rxe_odp_fault_begin(struct rxe_mr *mr)
{
	if (!mr)
		return true;
	atomic_inc(&mr->odp->faults);
	/* Pairs with rxe_odp_mr_quiesce(): it sees us, or we see dying. */
	smp_mb__after_atomic();
	if (!READ_ONCE(mr->odp->dying))
		return true;
	if (atomic_dec_and_test(&mr->odp->faults))
		wake_up_var(&mr->odp->faults);
	return false;
}

static void rxe_odp_fault_end(struct rxe_mr *mr)
{
	if (mr && atomic_dec_and_test(&mr->odp->faults))
		wake_up_var(&mr->odp->faults);
}

/*
 * Deregistration: no fault of @mr starts any more, and those running are
 * waited for, however long they take. A fault holds the MR, and the core's
 * wait for an MR's references gives up after 50 s and frees it anyway: a
 * fault blocked that long (on a userfaultfd range) would then use freed
 * memory. Faults that start after this fail, and their accesses with them.
 */
void rxe_odp_mr_quiesce(struct rxe_mr *mr)
{
	struct rxe_odp_mr *odp = mr->odp;

	if (!odp)
		return;
	WRITE_ONCE(odp->dying, true);
	/* Pairs with rxe_odp_fault_begin(): we see its count, or it dying. */
	smp_mb();
	wait_var_event(&odp->faults, !atomic_read(&odp->faults));
}

/*
 * Make [va, va + len) of @umem_odp present, writable if @write, faulting
 * what is absent if @fault (else only entering what the mm maps already),
 * and return with umem_mutex held; on error it is not held. Only the last
 * batch of a range longer than RXE_ODP_WALK_PAGES is sure to be present
 * then: a caller that needs all of it checks under the lock.
 *
 * Not ib_umem_odp_map_dma_and_lock(): there hmm_range_fault() writes the
 * page list itself, without umem_mutex. An invalidation that runs between
 * the walk's reading a PTE and its storing the entry, or a walk that fails
 * part way, leaves an entry marked valid for a page the mm has freed. A
 * device with DMA mappings uses those, made under the lock; rxe reads the
 * page list itself, so only entries checked under umem_mutex against the
 * notifier's sequence may enter it.
 */
int rxe_odp_fault_and_lock(struct rxe_mr *mr, struct ib_umem_odp *umem_odp,
			   u64 va, u64 len, bool write, bool fault)
{
	struct mm_struct *mm = umem_odp->umem.owning_mm;
	u64 start = ALIGN_DOWN(va, PAGE_SIZE);
	u64 end = ALIGN(va + len, PAGE_SIZE);
	unsigned long deadline = jiffies +
				 msecs_to_jiffies(HMM_RANGE_DEFAULT_TIMEOUT);
	unsigned long *pfns;
	u64 n;
	int err = 0;

	if (!len || va < ib_umem_start(umem_odp) ||
	    va + len > ib_umem_end(umem_odp))
		return -EFAULT;
	if (!rxe_odp_fault_begin(mr))
		return -EFAULT;
	pfns = kmalloc_array(min_t(u64, (end - start) >> PAGE_SHIFT,
				   RXE_ODP_WALK_PAGES),
			     sizeof(*pfns), GFP_KERNEL);
	if (!pfns) {
		rxe_odp_fault_end(mr);
		return -ENOMEM;
	}
	/* The owner exited: nothing left to map. */
	if (!mmget_not_zero(mm)) {
		kfree(pfns);
		rxe_odp_fault_end(mr);
		return -EINVAL;
	}
	while (start < end) {
		n = min_t(u64, (end - start) >> PAGE_SHIFT, RXE_ODP_WALK_PAGES);
		err = rxe_odp_fault_batch(umem_odp, pfns, start, n, write,
					  fault, deadline);
		if (err)
			break;
		start += n << PAGE_SHIFT;
		if (start < end)
			mutex_unlock(&umem_odp->umem_mutex);
	}
	/* The last reference may go here: this may run in the QP's task. */
	mmput_async(mm);
	kfree(pfns);
	rxe_odp_fault_end(mr);
	return err;
}

/* Map what is already present, without faulting: the first access is cheap. */
static void rxe_odp_snapshot(struct ib_umem_odp *umem_odp)
{
	if (!rxe_odp_fault_and_lock(NULL, umem_odp, ib_umem_start(umem_odp),
				    ib_umem_end(umem_odp) -
				    ib_umem_start(umem_odp), false, false))
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
	/* A FLUSH of the whole MR would name the whole address space. */
	if (implicit && (access_flags & (IB_ACCESS_FLUSH_GLOBAL |
					 IB_ACCESS_FLUSH_PERSISTENT)))
		return -EINVAL;

	odp = kzalloc_obj(*odp);
	if (!odp)
		return -ENOMEM;
	odp->mr = mr;
	init_rwsem(&odp->children_sem);
	xa_init(&odp->children);
	INIT_WORK(&odp->reap_work, rxe_odp_reap_children);
	spin_lock_init(&odp->fault_lock);
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
	if (!rxe_odp_is_implicit(mr))
		rxe_odp_unmap_all(to_ib_umem_odp(mr->umem));
	down_write(&odp->children_sem);
	xa_for_each(&odp->children, idx, child) {
		xa_erase(&odp->children, idx);
		rxe_odp_unmap_all(child);
		ib_umem_odp_release(child);
	}
	up_write(&odp->children_sem);
	/* Queued by an invalidation that ran before the last child went. */
	cancel_work_sync(&odp->reap_work);
	xa_destroy(&odp->children);
	mr->odp = NULL;
	kfree(odp);
}
