// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * rxe On-Demand Paging: the data path (copies, atomics, flush) and prefetch.
 *
 * Every access walks the MR's iova range chunk by chunk: the umem backing
 * the chunk (the MR's own, or an implicit MR's child) is made present,
 * faulting what is missing, and is used with its umem_mutex held, which
 * holds off invalidation until the access is done.
 */

#include <linux/hmm.h>
#include <linux/libnvdimm.h>
#include <rdma/ib_umem_odp.h>

#include "rxe.h"
#include "rxe_odp.h"

/* PAGE_SIZE pages that [va, va + len) touches. */
static u64 rxe_odp_npages(u64 va, u64 len)
{
	return (ALIGN(va + len, PAGE_SIZE) - ALIGN_DOWN(va, PAGE_SIZE)) >>
	       PAGE_SHIFT;
}

/*
 * Pages of [va, va + len) in @umem_odp not mapped (writable if @write).
 * Exact under umem_mutex; without it, a hint that an invalidation or a
 * fault may change at once (the page list itself lives as long as the umem).
 */
static u64 rxe_odp_absent(struct ib_umem_odp *umem_odp, u64 va, u64 len,
			  bool write)
{
	unsigned long need = HMM_PFN_VALID | (write ? HMM_PFN_WRITE : 0);
	u64 idx = (va - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
	u64 last = (va + len - 1 - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
	u64 absent = 0;

	for (; idx <= last; idx++)
		if ((READ_ONCE(umem_odp->map.pfn_list[idx]) & need) != need)
			absent++;
	return absent;
}

/*
 * Make [va, va + len) of @umem_odp present and return with its umem_mutex
 * held; on error it is not held.
 */
static int rxe_odp_map_and_lock(struct rxe_mr *mr, struct ib_umem_odp *umem_odp,
				u64 va, u64 len, bool write)
{
	u64 absent;
	int err;

	if (write && !umem_odp->umem.writable)
		return -EFAULT;
	mutex_lock(&umem_odp->umem_mutex);
	absent = rxe_odp_absent(umem_odp, va, len, write);
	if (!absent)
		return 0;
	mutex_unlock(&umem_odp->umem_mutex);

	err = rxe_odp_fault_and_lock(mr, umem_odp, va, len, write, true);
	if (err)
		return err;
	/* A long range may have lost an earlier batch again: retry later. */
	if (rxe_odp_absent(umem_odp, va, len, write)) {
		mutex_unlock(&umem_odp->umem_mutex);
		return -EAGAIN;
	}
	rxe_odp_count(mr, RXE_ODP_PAGE_FAULTS, absent);
	rxe_odp_count(mr, RXE_ODP_PAGE_FAULTS_HANDLED, 1);
	return 0;
}

/* Called for each piece of the range that lies in one PAGE_SIZE page. */
typedef int (*rxe_odp_page_fn)(struct page *page, unsigned int offset,
			       unsigned int len, void *arg);

static int rxe_odp_each_page(struct ib_umem_odp *umem_odp, u64 va, u64 len,
			     rxe_odp_page_fn fn, void *arg)
{
	while (len) {
		u64 idx = (va - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
		unsigned int offset = offset_in_page(va);
		unsigned int bytes = min_t(u64, len, PAGE_SIZE - offset);
		int err;

		err = fn(hmm_pfn_to_page(umem_odp->map.pfn_list[idx]), offset,
			 bytes, arg);
		if (err)
			return err;
		va += bytes;
		len -= bytes;
	}
	return 0;
}

/* A stretch of an access that lies in one umem. */
struct rxe_odp_chunk {
	struct ib_umem_odp *umem_odp;
	u64 va;
	u64 len;
};

typedef int (*rxe_odp_chunk_fn)(struct rxe_mr *mr,
				const struct rxe_odp_chunk *c, void *arg);

/*
 * Split [iova, iova + len) of @mr where its umems end (the children of an
 * implicit MR, created as needed if @create, else skipped where there is
 * none) and apply @fn to each piece, with the children held. A child that
 * @fn fails on is left to the reaper: a fault of unmapped memory must not
 * leave an empty child behind for each 128 MiB it addressed.
 */
static int rxe_odp_by_chunk(struct rxe_mr *mr, u64 iova, u64 len,
			    bool create, rxe_odp_chunk_fn fn, void *arg)
{
	bool implicit = rxe_odp_is_implicit(mr);
	struct rxe_odp_chunk c = { .va = rxe_odp_va(mr, iova) };
	int err = 0;

	if (implicit)
		down_read(&mr->odp->children_sem);
	while (len) {
		c.umem_odp = rxe_odp_umem_at(mr, c.va, create);
		if (IS_ERR(c.umem_odp)) {
			err = PTR_ERR(c.umem_odp);
			break;
		}
		if (c.umem_odp) {
			c.len = min(len, ib_umem_end(c.umem_odp) - c.va);
			err = fn(mr, &c, arg);
		} else {
			c.len = min(len, RXE_ODP_CHILD_SIZE -
				    (c.va & (RXE_ODP_CHILD_SIZE - 1)));
		}
		if (err) {
			if (implicit)
				rxe_odp_reap_later(mr, c.umem_odp);
			break;
		}
		c.va += c.len;
		len -= c.len;
	}
	if (implicit)
		up_read(&mr->odp->children_sem);
	return err;
}

struct rxe_odp_walk {
	bool write;
	rxe_odp_page_fn fn;
	void *arg;
};

static int rxe_odp_walk_chunk(struct rxe_mr *mr, const struct rxe_odp_chunk *c,
			      void *arg)
{
	struct rxe_odp_walk *w = arg;
	int err;

	err = rxe_odp_map_and_lock(mr, c->umem_odp, c->va, c->len, w->write);
	if (err)
		return err;
	if (w->fn)
		err = rxe_odp_each_page(c->umem_odp, c->va, c->len, w->fn,
					w->arg);
	mutex_unlock(&c->umem_odp->umem_mutex);
	return err;
}

/*
 * Apply @fn to [iova, iova + len) of @mr, with every page present; a NULL
 * @fn only faults in what is absent.
 */
static int rxe_odp_walk(struct rxe_mr *mr, u64 iova, u64 len, bool write,
			rxe_odp_page_fn fn, void *arg)
{
	struct rxe_odp_walk w = { .write = write, .fn = fn, .arg = arg };

	return rxe_odp_by_chunk(mr, iova, len, true, rxe_odp_walk_chunk, &w);
}

struct rxe_odp_copy {
	u8 *addr;
	enum rxe_mr_copy_dir dir;
};

static int rxe_odp_copy_page(struct page *page, unsigned int offset,
			     unsigned int len, void *arg)
{
	struct rxe_odp_copy *c = arg;
	u8 *va = kmap_local_page(page);

	if (c->dir == RXE_TO_MR_OBJ)
		memcpy(va + offset, c->addr, len);
	else
		memcpy(c->addr, va + offset, len);
	kunmap_local(va);
	c->addr += len;
	return 0;
}

int rxe_odp_mr_copy(struct rxe_mr *mr, u64 iova, void *addr, int length,
		    enum rxe_mr_copy_dir dir)
{
	struct rxe_odp_copy c = { .addr = addr, .dir = dir };

	if (length <= 0)
		return length ? -EINVAL : 0;
	if (dir != RXE_TO_MR_OBJ && dir != RXE_FROM_MR_OBJ)
		return -EINVAL;
	return rxe_odp_walk(mr, iova, length, dir == RXE_TO_MR_OBJ,
			    rxe_odp_copy_page, &c);
}

struct rxe_odp_atomic {
	int opcode;
	u64 compare;
	u64 swap_add;
	u64 orig;
};

static int rxe_odp_atomic_page(struct page *page, unsigned int offset,
			       unsigned int len, void *arg)
{
	struct rxe_odp_atomic *a = arg;
	u64 *va = kmap_local_page(page) + offset;

	spin_lock_bh(&atomic_ops_lock);
	a->orig = *va;
	if (a->opcode == IB_OPCODE_RC_COMPARE_SWAP) {
		if (a->orig == a->compare)
			*va = a->swap_add;
	} else {
		*va = a->orig + a->swap_add;
	}
	spin_unlock_bh(&atomic_ops_lock);
	kunmap_local(va);
	return 0;
}

/* Range, state and alignment of an 8-byte atomic target. */
static enum resp_states rxe_odp_check_atomic(struct rxe_mr *mr, u64 iova)
{
	if (unlikely(mr->state != RXE_MR_STATE_VALID))
		return RESPST_ERR_RKEY_VIOLATION;
	if (mr_check_range(mr, iova, sizeof(u64)))
		return RESPST_ERR_RKEY_VIOLATION;
	/* The memory's address must be aligned, whatever the iova. */
	if (rxe_odp_va(mr, iova) & (sizeof(u64) - 1))
		return RESPST_ERR_MISALIGNED_ATOMIC;
	return RESPST_NONE;
}

enum resp_states rxe_odp_atomic_op(struct rxe_mr *mr, u64 iova, int opcode,
				   u64 compare, u64 swap_add, u64 *orig_val)
{
	struct rxe_odp_atomic a = {
		.opcode = opcode, .compare = compare, .swap_add = swap_add,
	};
	enum resp_states st = rxe_odp_check_atomic(mr, iova);

	if (st != RESPST_NONE)
		return st;
	if (rxe_odp_walk(mr, iova, sizeof(u64), true, rxe_odp_atomic_page, &a))
		return RESPST_ERR_RKEY_VIOLATION;
	*orig_val = a.orig;
	return RESPST_NONE;
}

static int rxe_odp_atomic_write_page(struct page *page, unsigned int offset,
				     unsigned int len, void *arg)
{
	u64 *va = kmap_local_page(page) + offset;

	/* Visible only after everything the responder wrote before it. */
	smp_store_release(va, *(u64 *)arg);
	kunmap_local(va);
	return 0;
}

enum resp_states rxe_odp_do_atomic_write(struct rxe_mr *mr, u64 iova, u64 value)
{
	enum resp_states st = rxe_odp_check_atomic(mr, iova);

	if (st != RESPST_NONE)
		return st;
	if (rxe_odp_walk(mr, iova, sizeof(u64), true,
			 rxe_odp_atomic_write_page, &value))
		return RESPST_ERR_RKEY_VIOLATION;
	return RESPST_NONE;
}

/*
 * A FLUSH makes what was written through the MR durable. Pages written
 * through it are in its page list (an invalidation has them written back
 * and dirtied before it drops them), so only those are flushed: faulting in
 * the rest would map a sparse MR whole, page tables and all, for nothing.
 */
static int rxe_odp_flush_chunk(struct rxe_mr *mr, const struct rxe_odp_chunk *c,
			       void *arg)
{
	struct ib_umem_odp *umem_odp = c->umem_odp;
	u64 va = c->va, end = c->va + c->len;

	mutex_lock(&umem_odp->umem_mutex);
	while (va < end) {
		u64 idx = (va - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
		unsigned long pfn = umem_odp->map.pfn_list[idx];
		unsigned int offset = offset_in_page(va);
		unsigned int bytes = min_t(u64, end - va, PAGE_SIZE - offset);
		u8 *kva;

		if (pfn & HMM_PFN_VALID) {
			kva = kmap_local_page(hmm_pfn_to_page(pfn));
			arch_wb_cache_pmem(kva + offset, bytes);
			kunmap_local(kva);
		}
		va += bytes;
		if (need_resched()) {
			mutex_unlock(&umem_odp->umem_mutex);
			cond_resched();
			mutex_lock(&umem_odp->umem_mutex);
		}
	}
	mutex_unlock(&umem_odp->umem_mutex);
	return 0;
}

int rxe_odp_flush_pmem_iova(struct rxe_mr *mr, u64 iova, u64 length)
{
	if (mr_check_range(mr, iova, length))
		return -EFAULT;
	/* No child is made: an implicit MR has no FLUSH access anyway. */
	return rxe_odp_by_chunk(mr, iova, length, false, rxe_odp_flush_chunk,
				NULL);
}

struct rxe_odp_map {
	bool write;
	bool fault;
	enum rxe_odp_counter counter;
};

static int rxe_odp_map_chunk(struct rxe_mr *mr, const struct rxe_odp_chunk *c,
			     void *arg)
{
	struct rxe_odp_map *m = arg;
	int err;

	err = rxe_odp_fault_and_lock(mr, c->umem_odp, c->va, c->len, m->write,
				     m->fault);
	if (err)
		return err;
	mutex_unlock(&c->umem_odp->umem_mutex);
	rxe_odp_count(mr, m->counter, rxe_odp_npages(c->va, c->len));
	return 0;
}

/*
 * Map [iova, iova + len) of @mr, for a prefetch or a queued responder fault;
 * @fault: bring absent pages in (else map only what is there). The pages
 * mapped are counted in @counter.
 */
static int rxe_odp_map_range(struct rxe_mr *mr, u64 iova, u64 len, bool write,
			     bool fault, enum rxe_odp_counter counter)
{
	struct rxe_odp_map m = {
		.write = write, .fault = fault, .counter = counter,
	};

	/*
	 * PREFETCH_NO_FAULT makes no child: it is advice, and a child made
	 * for it over a hole would only hold memory until deregistration.
	 */
	return rxe_odp_by_chunk(mr, iova, len, fault, rxe_odp_map_chunk, &m);
}

/*
 * The MR an advise_mr SGE names, with a reference, after the checks both
 * the synchronous and the asynchronous paths need.
 */
static struct rxe_mr *rxe_odp_prefetch_mr(struct rxe_pd *pd,
					  enum ib_uverbs_advise_mr_advice advice,
					  const struct ib_sge *sge)
{
	bool write = advice == IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	struct rxe_mr *mr;

	/* Read-only MRs may be prefetched; only PREFETCH_WRITE needs more. */
	mr = lookup_mr(pd, write ? IB_ACCESS_LOCAL_WRITE : 0, sge->lkey,
		       RXE_LOOKUP_LOCAL);
	if (!mr) {
		mr = lookup_mr(pd, 0, sge->lkey, RXE_LOOKUP_LOCAL);
		if (!mr)
			return ERR_PTR(-ENOENT);
		rxe_put(mr);
		return ERR_PTR(-EPERM);
	}
	if (!is_odp_mr(mr)) {
		rxe_put(mr);
		return ERR_PTR(-EINVAL);
	}
	if (write && !mr->umem->writable) {
		rxe_put(mr);
		return ERR_PTR(-EPERM);
	}
	if (mr_check_range(mr, sge->addr, sge->length)) {
		rxe_put(mr);
		return ERR_PTR(-EINVAL);
	}
	return mr;
}

struct rxe_odp_prefetch_work {
	struct work_struct work;
	bool write;
	bool fault;
	u32 num_sge;
	struct {
		struct rxe_mr *mr;
		u64 iova;
		u32 length;
	} sge[] __counted_by(num_sge);
};

/*
 * Map each SGE of @work, drop the references and free it. The synchronous
 * path (@sync) stops at the first SGE that cannot be mapped and returns its
 * error; the asynchronous one is advice, and skips it.
 */
static int rxe_odp_prefetch(struct rxe_odp_prefetch_work *work, bool sync)
{
	int err = 0, ret;
	u32 i;

	for (i = 0; i < work->num_sge; i++) {
		if (!err) {
			ret = rxe_odp_map_range(work->sge[i].mr,
						work->sge[i].iova,
						work->sge[i].length,
						work->write, work->fault,
						RXE_ODP_PAGE_PREFETCH);
			if (sync)
				err = ret;
		}
		rxe_put(work->sge[i].mr);
	}
	kvfree(work);
	return err;
}

static void rxe_odp_prefetch_work(struct work_struct *w)
{
	rxe_odp_prefetch(container_of(w, struct rxe_odp_prefetch_work, work),
			 false);
}

int rxe_ib_advise_mr(struct ib_pd *ibpd, enum ib_uverbs_advise_mr_advice advice,
		     u32 flags, struct ib_sge *sg_list, u32 num_sge,
		     struct uverbs_attr_bundle *attrs)
{
	struct rxe_pd *pd = to_rpd(ibpd);
	struct rxe_odp_prefetch_work *work;
	struct rxe_mr *mr;
	u32 i;

	if (advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH &&
	    advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
	    advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
		return -EOPNOTSUPP;
	if (flags & ~IB_UVERBS_ADVISE_MR_FLAG_FLUSH)
		return -EOPNOTSUPP;

	/* Every SGE is checked, and its MR held, before any is mapped. */
	work = kvzalloc_flex(*work, sge, num_sge);
	if (!work)
		return -ENOMEM;
	work->num_sge = num_sge;
	work->write = advice == IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	work->fault = advice != IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT;
	for (i = 0; i < num_sge; i++) {
		mr = rxe_odp_prefetch_mr(pd, advice, &sg_list[i]);
		if (IS_ERR(mr)) {
			while (i--)
				rxe_put(work->sge[i].mr);
			kvfree(work);
			return PTR_ERR(mr);
		}
		work->sge[i].mr = mr;
		work->sge[i].iova = sg_list[i].addr;
		work->sge[i].length = sg_list[i].length;
	}
	if (flags & IB_UVERBS_ADVISE_MR_FLAG_FLUSH)
		return rxe_odp_prefetch(work, true);
	INIT_WORK(&work->work, rxe_odp_prefetch_work);
	queue_work(rxe_odp_wq, &work->work);
	return 0;
}

/*
 * Whether every page of [va, va + len) of @mr is mapped; a missing child
 * counts as absent. Read without umem_mutex: the access itself checks
 * again under it, and faults in place what an invalidation took since.
 */
static bool rxe_odp_all_present(struct rxe_mr *mr, u64 va, u64 len, bool write)
{
	struct ib_umem_odp *root = to_ib_umem_odp(mr->umem);
	bool present = true;

	if (!root->is_implicit_odp) {
		if (va < ib_umem_start(root) || va + len > ib_umem_end(root))
			return true;	/* out of range: let the access fail */
		return !rxe_odp_absent(root, va, len, write);
	}
	down_read(&mr->odp->children_sem);
	while (len && present) {
		struct ib_umem_odp *child =
			xa_load(&mr->odp->children, va >> RXE_ODP_CHILD_SHIFT);
		u64 chunk;

		if (!child) {
			present = false;
			break;
		}
		chunk = min(len, ib_umem_end(child) - va);
		present = !rxe_odp_absent(child, va, chunk, write);
		va += chunk;
		len -= chunk;
	}
	up_read(&mr->odp->children_sem);
	return present;
}

/*
 * Bytes after @last up to the end of the VMA that holds it (0 if none): an
 * access that ends where its VMA ends has nothing to fault around, even if
 * another mapping follows.
 */
static u64 rxe_odp_vma_bytes_after(struct rxe_mr *mr, u64 last)
{
	struct mm_struct *mm = mr->umem->owning_mm;
	struct vm_area_struct *vma;
	u64 bytes = 0;

	if (!mmget_not_zero(mm))
		return 0;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, last);
	if (vma)
		bytes = vma->vm_end - last - 1;
	mmap_read_unlock(mm);
	mmput(mm);
	return bytes;
}

/*
 * Whether every page of [va, va + len) lies in a mapping that allows the
 * access, one a fault can fill (not I/O or raw PFNs).
 */
static bool rxe_odp_vma_allows(struct rxe_mr *mr, u64 va, u64 len, bool write)
{
	struct mm_struct *mm = mr->umem->owning_mm;
	vm_flags_t need = write ? VM_WRITE : VM_READ;
	struct vm_area_struct *vma;
	u64 end = va + len;
	bool ok = true;

	if (!mmget_not_zero(mm))
		return false;
	mmap_read_lock(mm);
	while (ok && va < end) {
		vma = vma_lookup(mm, va);
		ok = vma && (vma->vm_flags & need) &&
		     !(vma->vm_flags & (VM_IO | VM_PFNMAP));
		if (ok)
			va = vma->vm_end;
	}
	mmap_read_unlock(mm);
	mmput(mm);
	return ok;
}

/*
 * @qp's responder fault state, about @mr: reset when the QP's accesses
 * move to another MR. Under qp->state_lock.
 */
static struct rxe_odp_resp *rxe_odp_resp_state(struct rxe_qp *qp,
					       struct rxe_mr *mr)
{
	struct rxe_odp_resp *st = &qp->resp.odp;

	if (st->mr_index != mr->elem.index) {
		*st = (struct rxe_odp_resp) {
			.mr_index = mr->elem.index,
			.rnr_va = U64_MAX,
			.transient_va = U64_MAX,
		};
	}
	return st;
}

/*
 * A responder fault at @va failed with @err. It is transient, and worth
 * another RNR round, if a new try may succeed: the address is still mapped
 * for the access and the fault ran out of memory (hmm_range_fault() says
 * -EFAULT for a page or page table it could not allocate) or raced with a
 * change of the mapping. At most RXE_ODP_MAX_TRANSIENT times in a row for
 * one address, so a mapping that never faults in (a file's hole past its
 * end) still ends in the remote access error that an unmapped address gets
 * at once.
 */
static bool rxe_odp_fault_transient(struct rxe_qp *qp, struct rxe_mr *mr,
				    u64 va, u64 len, bool write, int err)
{
	struct rxe_odp_resp *st;
	unsigned long flags;
	bool transient;

	if (err != -ENOMEM && err != -EFAULT && err != -EBUSY && err != -EAGAIN)
		return false;
	if (!rxe_odp_vma_allows(mr, va, len, write))
		return false;
	spin_lock_irqsave(&qp->state_lock, flags);
	st = rxe_odp_resp_state(qp, mr);
	if (st->transient_va != va) {
		st->transient_va = va;
		st->transient_tries = 0;
	}
	transient = ++st->transient_tries <= RXE_ODP_MAX_TRANSIENT;
	spin_unlock_irqrestore(&qp->state_lock, flags);
	return transient;
}

/* A responder fault at @va succeeded: its run of transient failures ends. */
static void rxe_odp_fault_done(struct rxe_qp *qp, struct rxe_mr *mr, u64 va)
{
	struct rxe_odp_resp *st;
	unsigned long flags;

	spin_lock_irqsave(&qp->state_lock, flags);
	st = rxe_odp_resp_state(qp, mr);
	if (st->transient_va == va)
		st->transient_va = U64_MAX;
	spin_unlock_irqrestore(&qp->state_lock, flags);
}

struct rxe_odp_fault_work {
	struct work_struct work;
	struct rxe_mr *mr;
	u32 qp_index;		/* the QP answered RNR, looked up when done */
	u64 iova;
	u32 len;
	bool write;
};

/*
 * A responder fault, off the QP's task: the access itself, then best effort
 * the fault-around window. A permanent failure is remembered, in the QP
 * that asked, so that its retried access faults in place and reports it
 * (remote access error) rather than being answered RNR forever; after a
 * transient one the retry faults in place and may be answered RNR again.
 * The work holds the MR, not the QP: a QP destroyed meanwhile is not found
 * and there is nothing to tell it.
 */
static void rxe_odp_fault_work(struct work_struct *w)
{
	struct rxe_odp_fault_work *work =
		container_of(w, struct rxe_odp_fault_work, work);
	struct rxe_mr *mr = work->mr;
	struct rxe_odp_mr *odp = mr->odp;
	u64 around = RXE_ODP_FAULT_AROUND - work->len;
	u64 va = rxe_odp_va(mr, work->iova);
	struct rxe_odp_resp *st;
	struct rxe_qp *qp;
	unsigned long flags;
	int err;

	err = rxe_odp_map_range(mr, work->iova, work->len, work->write, true,
				RXE_ODP_PAGE_FAULTS);
	qp = rxe_pool_get_index(&to_rdev(mr->ibmr.device)->qp_pool,
				work->qp_index);
	if (!err) {
		if (qp)
			rxe_odp_fault_done(qp, mr, va);
		/* Within the MR and the mapping: a hole would fail it all. */
		around = min(around,
			     rxe_odp_vma_bytes_after(mr, va + work->len - 1));
		if (!rxe_odp_is_implicit(mr))
			around = min(around, mr->ibmr.iova + mr->ibmr.length -
				     (work->iova + work->len));
		rxe_odp_map_range(mr, work->iova + work->len, around,
				  work->write, true, RXE_ODP_PAGE_FAULTS);
		rxe_odp_count(mr, RXE_ODP_PAGE_FAULTS_HANDLED, 1);
	} else if (qp && !rxe_odp_fault_transient(qp, mr, va, work->len,
						  work->write, err)) {
		spin_lock_irqsave(&qp->state_lock, flags);
		st = rxe_odp_resp_state(qp, mr);
		st->failed_start = va;
		st->failed_end = va + work->len;
		spin_unlock_irqrestore(&qp->state_lock, flags);
	}
	if (qp)
		rxe_put(qp);
	spin_lock(&odp->fault_lock);
	odp->faults_queued--;
	spin_unlock(&odp->fault_lock);
	rxe_put(mr);
	kfree(work);
}

/*
 * Answer RNR. The packets the requester sent behind this one arrive out of
 * sequence: drop them quietly, as after a sequence-error NAK, instead of
 * NAKing them too (each such NAK would cost the requester a retry from
 * retry_cnt, besides the RNR retry). The retried packet clears this.
 */
static enum resp_states rxe_odp_rnr(struct rxe_qp *qp)
{
	qp->resp.sent_psn_nak = 1;
	return RESPST_ERR_RNR;
}

/*
 * Fault in, in the QP's task, what the access's first packet touches (a
 * READ's later packets fault as their responses are built): a transient
 * failure is answered RNR, a permanent one is the remote access error.
 */
static enum resp_states rxe_odp_fault_in_place(struct rxe_qp *qp,
					       struct rxe_mr *mr, u64 iova,
					       u32 len, bool write)
{
	u64 va = rxe_odp_va(mr, iova);
	int err;

	len = min_t(u32, len, qp->mtu);
	err = rxe_odp_walk(mr, iova, len, write, NULL, NULL);
	if (!err) {
		rxe_odp_fault_done(qp, mr, va);
		return RESPST_NONE;
	}
	if (rxe_odp_fault_transient(qp, mr, va, len, write, err))
		return rxe_odp_rnr(qp);
	return RESPST_ERR_RKEY_VIOLATION;
}

/*
 * The responder's check before it touches an ODP MR through an rkey. If a
 * page of [iova, iova + len) is absent, the fault is queued and the request
 * answered with an RNR NAK: the QP's task never sleeps on a page fault of a
 * remote access, and the requester retries after its RNR timer. Returns
 * RESPST_ERR_RNR for that, RESPST_NONE to go on with the access, or
 * RESPST_ERR_RKEY_VIOLATION when the pages cannot be brought in.
 */
enum resp_states rxe_odp_resp_check(struct rxe_qp *qp, struct rxe_mr *mr,
				    u64 iova, u32 len, bool write)
{
	struct rxe_odp_mr *odp = mr->odp;
	u64 va = rxe_odp_va(mr, iova);
	struct rxe_odp_fault_work *work;
	bool sync = false, queue = false;
	struct rxe_odp_resp *st;
	unsigned long flags;

	/*
	 * A READ names up to 2 GiB: only its first window is checked (and
	 * queued); its responses fault the rest a window at a time, in
	 * rxe_odp_resp_read_step(). One fault never maps more than a window.
	 */
	len = min_t(u32, len, RXE_ODP_FAULT_AROUND);
	if (!len || rxe_odp_all_present(mr, va, len, write))
		return RESPST_NONE;
	/*
	 * Pages of this MR were dropped by an invalidation a moment ago: the
	 * application is changing its mappings, the fault is a cheap one and
	 * a retry would wait at least a jiffy. Fault in place.
	 */
	if (time_before(jiffies, READ_ONCE(odp->churn) +
			msecs_to_jiffies(RXE_ODP_CHURN_MS)))
		return rxe_odp_fault_in_place(qp, mr, iova, len, write);

	/* This QP's own state: other QPs faulting on the MR leave it alone. */
	spin_lock_irqsave(&qp->state_lock, flags);
	st = rxe_odp_resp_state(qp, mr);
	if (va < st->failed_end && va + len > st->failed_start) {
		/* The fault failed: fault here, and report what it says. */
		st->failed_start = 0;
		st->failed_end = 0;
		sync = true;
	} else if (va == st->rnr_va) {
		/*
		 * Answered RNR once already and still absent: the fault is
		 * slow, failed for want of memory, or the pages were
		 * invalidated again. Fault in place, under the umem lock, so
		 * the access surely makes progress.
		 */
		st->rnr_va = U64_MAX;
		sync = true;
	} else {
		st->rnr_va = va;
	}
	spin_unlock_irqrestore(&qp->state_lock, flags);
	if (!sync) {
		/* With enough in flight, the retry may find it done. */
		spin_lock(&odp->fault_lock);
		queue = odp->faults_queued < RXE_ODP_MAX_FAULT_WORK;
		if (queue)
			odp->faults_queued++;
		spin_unlock(&odp->fault_lock);
	}
	if (sync)
		return rxe_odp_fault_in_place(qp, mr, iova, len, write);
	if (!queue)
		return rxe_odp_rnr(qp);

	work = kzalloc_obj(*work, GFP_NOWAIT);
	if (!work) {
		spin_lock(&odp->fault_lock);
		odp->faults_queued--;
		spin_unlock(&odp->fault_lock);
		return rxe_odp_fault_in_place(qp, mr, iova, len, write);
	}
	INIT_WORK(&work->work, rxe_odp_fault_work);
	rxe_get(mr);
	work->mr = mr;
	work->qp_index = qp->elem.index;
	work->iova = iova;
	work->len = len;
	work->write = write;
	queue_work(rxe_odp_wq, &work->work);
	return rxe_odp_rnr(qp);
}

/*
 * An access that rxe_odp_resp_check() let through failed with @err as it
 * copied: an invalidation took its pages since, and faulting them in place
 * failed. A transient failure (as rxe_odp_fault_transient() judges it) must
 * not fail the QP: a WRITE packet is answered RNR and the requester sends
 * it again (writing the same bytes twice is harmless); a READ response is
 * built again when the responder next runs. Returns RESPST_ERR_RNR,
 * RESPST_DONE or RESPST_ERR_RKEY_VIOLATION.
 */
enum resp_states rxe_odp_resp_copy_failed(struct rxe_qp *qp, struct rxe_mr *mr,
					  u64 iova, u32 len, bool write, int err)
{
	if (qp_type(qp) != IB_QPT_RC ||
	    !rxe_odp_fault_transient(qp, mr, rxe_odp_va(mr, iova), len, write,
				     err))
		return RESPST_ERR_RKEY_VIOLATION;
	return write ? rxe_odp_rnr(qp) : RESPST_DONE;
}

/*
 * Before a READ response of @len bytes is built from @iova of @mr, @resid
 * bytes of the READ left: if the response's pages are absent, fault them in
 * place together with what follows, up to the fault-around window, so a
 * large READ of untouched memory takes one fault per window. A READ cannot
 * be answered RNR once its responses have begun: this runs in the QP's task.
 */
enum resp_states rxe_odp_resp_read_step(struct rxe_qp *qp, struct rxe_mr *mr,
					u64 iova, u32 len, u32 resid)
{
	u32 step = min_t(u32, resid, RXE_ODP_FAULT_AROUND);
	u64 va = rxe_odp_va(mr, iova);
	int err;

	if (rxe_odp_all_present(mr, va, len, false))
		return RESPST_NONE;
	err = rxe_odp_walk(mr, iova, step, false, NULL, NULL);
	/* A hole further on is the later response's to report. */
	if (err && step > len)
		err = rxe_odp_walk(mr, iova, len, false, NULL, NULL);
	if (!err) {
		rxe_odp_fault_done(qp, mr, va);
		return RESPST_NONE;
	}
	return rxe_odp_resp_copy_failed(qp, mr, iova, len, false, err);
}
