/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * rxe On-Demand Paging: state shared by registration (rxe_odp_mr.c) and the
 * data path (rxe_odp_data.c).
 */

#ifndef RXE_ODP_H
#define RXE_ODP_H

#include <linux/rwsem.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_umem_odp.h>

/*
 * An implicit MR covers the whole address space through children created on
 * first access, each an ib_umem_odp of RXE_ODP_CHILD_SIZE naturally aligned
 * bytes. 128 MiB keeps a child's page list at 256 KiB while a large buffer
 * still needs few children (and few interval notifiers).
 */
#define RXE_ODP_CHILD_SHIFT	27
#define RXE_ODP_CHILD_SIZE	BIT_ULL(RXE_ODP_CHILD_SHIFT)

/*
 * A responder fault brings in the access and, best effort, what follows it
 * up to this window (as mlx5 prefetches after an RDMA responder fault), so
 * a large first-touch transfer takes few faults and few RNR NAKs. It is
 * also the most one fault maps: a large READ is faulted window by window.
 */
#define RXE_ODP_FAULT_AROUND	SZ_4M
/*
 * For this long after an invalidation dropped mapped pages of an MR, its
 * responder faults run in place: under mapping churn an RNR round trip
 * (at least a jiffy) costs more than the fault it avoids.
 */
#define RXE_ODP_CHURN_MS	100
/* Responder faults queued per MR at once; more are retried by the peer. */
#define RXE_ODP_MAX_FAULT_WORK	4
/*
 * Responder faults at one address that may fail for want of memory, in a
 * row, each answered RNR, before the failure is reported to the peer.
 */
#define RXE_ODP_MAX_TRANSIENT	16

/* Per-MR ODP counters, named and counted as mlx5's. */
enum rxe_odp_counter {
	RXE_ODP_PAGE_FAULTS,		/* pages mapped by faults */
	RXE_ODP_PAGE_FAULTS_HANDLED,	/* faults that succeeded */
	RXE_ODP_PAGE_INVALIDATIONS,	/* mapped pages invalidations dropped */
	RXE_ODP_PAGE_INVALIDATIONS_HANDLED, /* invalidations that dropped any */
	RXE_ODP_PAGE_PREFETCH,		/* pages mapped by ibv_advise_mr() */
	RXE_ODP_NUM_COUNTERS
};

struct rxe_odp_mr {
	struct rxe_mr *mr;
	/*
	 * Implicit MRs only. Readers (the data path, prefetch) hold the
	 * semaphore shared while they use a child; reaping a child that was
	 * unmapped entirely takes it exclusively.
	 */
	struct rw_semaphore children_sem;
	struct xarray children;		/* child index -> struct ib_umem_odp */
	struct work_struct reap_work;
	atomic64_t counters[RXE_ODP_NUM_COUNTERS];

	/*
	 * Faults running now (they may sleep for as long as a page takes,
	 * a userfaultfd's handler included), and whether deregistration
	 * began: it waits for them, and no new one starts.
	 */
	atomic_t faults;
	bool dying;

	/* Responder faults queued; their retry state is the QP's. */
	spinlock_t fault_lock;
	unsigned int faults_queued;
	unsigned long churn;		/* jiffies of the last page dropped */
};

/* Faults, prefetches and reaping run here, apart from the QPs' tasks. */
extern struct workqueue_struct *rxe_odp_wq;

/* xarray mark of a child that may have no page left: reap_work checks it. */
#define RXE_ODP_CHILD_REAP	XA_MARK_1

static inline bool rxe_odp_is_implicit(struct rxe_mr *mr)
{
	return to_ib_umem_odp(mr->umem)->is_implicit_odp;
}

/* The user virtual address behind @iova of an ODP MR. */
static inline u64 rxe_odp_va(struct rxe_mr *mr, u64 iova)
{
	return iova - mr->ibmr.iova + mr->umem->address;
}

void rxe_odp_count(struct rxe_mr *mr, enum rxe_odp_counter c, u64 pages);

/*
 * rxe_odp_mr.c: the umem that backs @va; of an implicit MR, the child,
 * created if need be when @create (else NULL if there is none).
 */
struct ib_umem_odp *rxe_odp_umem_at(struct rxe_mr *mr, u64 va, bool create);
void rxe_odp_reap_later(struct rxe_mr *mr, struct ib_umem_odp *umem_odp);
int rxe_odp_fault_and_lock(struct rxe_mr *mr, struct ib_umem_odp *umem_odp,
			   u64 va, u64 len, bool write, bool fault);

#endif /* RXE_ODP_H */
