// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "verbs.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>

namespace odpwatch::verbs
{

Error::Error(const std::string &what, int err)
    : std::runtime_error(what + ": " + std::strerror(err)), err_(err)
{
}

Context open_device(std::string_view name)
{
	int n = 0;
	std::unique_ptr<ibv_device *[], Deleter<ibv_device *, ibv_free_device_list>> list(
		ibv_get_device_list(&n));
	if (!list)
		throw Error("ibv_get_device_list", errno);
	for (int i = 0; i < n; i++) {
		if (!name.empty() && name != ibv_get_device_name(list[i]))
			continue;
		Context ctx(ibv_open_device(list[i]));
		if (!ctx)
			throw Error("ibv_open_device(" + std::string(ibv_get_device_name(list[i])) +
					    ")",
				    errno);
		return ctx;
	}
	throw Error(name.empty() ? std::string("no RDMA device")
				 : "no RDMA device named " + std::string(name),
		    ENODEV);
}

Pd alloc_pd(ibv_context *ctx)
{
	Pd pd(ibv_alloc_pd(ctx));
	if (!pd)
		throw Error("ibv_alloc_pd", errno);
	return pd;
}

Mr reg_mr(ibv_pd *pd, void *addr, size_t len, unsigned access)
{
	Mr mr(ibv_reg_mr(pd, addr, len, static_cast<int>(access)));
	if (!mr)
		throw Error("ibv_reg_mr", errno);
	return mr;
}

Mapping::Mapping(size_t len, void *hint) : len_(len)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0);
	void *p = mmap(hint, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED)
		throw Error("mmap", errno);
	if (hint && p != hint) {
		munmap(p, len);
		throw Error("mmap at the requested address", EEXIST);
	}
	addr_ = p;
}

Mapping::Mapping(Mapping &&o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0))
{
}

Mapping &Mapping::operator=(Mapping &&o) noexcept
{
	if (this != &o) {
		unmap();
		addr_ = std::exchange(o.addr_, nullptr);
		len_ = std::exchange(o.len_, 0);
	}
	return *this;
}

Mapping::~Mapping()
{
	unmap();
}

void Mapping::unmap() noexcept
{
	if (addr_)
		munmap(addr_, len_);
	addr_ = nullptr;
}

int roce_v2_ipv4_gid_index(ibv_context *ctx)
{
	ibv_port_attr port{};
	if (ibv_query_port(ctx, 1, &port))
		return -1;
	for (int i = 0; i < port.gid_tbl_len; i++) {
		ibv_gid_entry e{};
		if (ibv_query_gid_ex(ctx, 1, static_cast<uint32_t>(i), &e, 0))
			continue;
		const uint8_t *g = e.gid.raw;
		bool v4mapped = g[10] == 0xff && g[11] == 0xff &&
				std::all_of(g, g + 10, [](uint8_t b) { return b == 0; });
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4mapped)
			return i;
	}
	return -1;
}

LoopbackQp::LoopbackQp(ibv_context *ctx, ibv_pd *pd, uint8_t min_rnr_timer)
{
	gid_index_ = roce_v2_ipv4_gid_index(ctx);
	if (gid_index_ < 0)
		throw Error("no RoCE v2 IPv4 GID on port 1 (does the netdev have an address?)",
			    ENODEV);
	cq_.reset(ibv_create_cq(ctx, 16, nullptr, nullptr, 0));
	if (!cq_)
		throw Error("ibv_create_cq", errno);
	ibv_qp_init_attr init{};
	init.send_cq = init.recv_cq = cq_.get();
	init.qp_type = IBV_QPT_RC;
	init.cap = {.max_send_wr = 8,
		    .max_recv_wr = 8,
		    .max_send_sge = 1,
		    .max_recv_sge = 1,
		    .max_inline_data = 0};
	qp_.reset(ibv_create_qp(pd, &init));
	if (!qp_)
		throw Error("ibv_create_qp", errno);
	responder_.reset(ibv_create_qp(pd, &init));
	if (!responder_)
		throw Error("ibv_create_qp", errno);
	connect(qp_.get(), responder_->qp_num, min_rnr_timer);
	connect(responder_.get(), qp_->qp_num, min_rnr_timer);
}

// INIT, RTR and RTS, to @dest_qpn on the same port.
void LoopbackQp::connect(ibv_qp *qp, uint32_t dest_qpn, uint8_t min_rnr_timer)
{
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags =
		IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	if (int rc = ibv_modify_qp(
		    qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		throw Error("ibv_modify_qp(INIT)", rc);

	ibv_gid gid{};
	if (ibv_query_gid(qp->context, 1, gid_index_, &gid))
		throw Error("ibv_query_gid", errno);
	a = {};
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr_timer;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (int rc = ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					   IBV_QP_MIN_RNR_TIMER))
		throw Error("ibv_modify_qp(RTR)", rc);

	a = {};
	a.qp_state = IBV_QPS_RTS;
	// ACK timeout 4.096 us << 17 = 0.5 s, 7 retries: the debug kernel under
	// TCG can keep a faulting responder silent past 67 ms (timeout 14) seven
	// times over; odpwatch-stress once ended on such a completion error.
	a.timeout = 17;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (int rc = ibv_modify_qp(qp, &a,
				   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					   IBV_QP_MAX_QP_RD_ATOMIC))
		throw Error("ibv_modify_qp(RTS)", rc);
}

std::string LoopbackQp::states() const
{
	auto state = [](ibv_qp *qp) -> std::string {
		static const char *const names[] = {"RESET", "INIT", "RTR", "RTS",
						    "SQD",   "SQE",  "ERR"};
		ibv_qp_attr a{};
		ibv_qp_init_attr init{};
		if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init))
			return std::string("unknown (") + std::strerror(errno) + ")";
		return a.qp_state < std::size(names) ? names[a.qp_state] : "?";
	};
	return "requester " + state(qp_.get()) + ", responder " + state(responder_.get());
}

ibv_wc_status LoopbackQp::rdma(ibv_wr_opcode op, const ibv_mr *local, const void *local_addr,
			       size_t len, const ibv_mr *remote, const void *remote_addr,
			       std::chrono::milliseconds timeout)
{
	ibv_sge sge{.addr = reinterpret_cast<uintptr_t>(local_addr),
		    .length = static_cast<uint32_t>(len),
		    .lkey = local->lkey};
	// Ids of this call's requests: a completion left from an earlier
	// call (one that timed out) is told apart.
	const uint64_t send_id = ++requests_ * 2, recv_id = send_id + 1;
	ibv_send_wr wr{};
	wr.wr_id = send_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote_addr);
	wr.wr.rdma.rkey = remote->rkey;
	// A SEND lands in a receive posted on the "remote" buffer, on the
	// responder; both QPs complete to the one CQ.
	bool waiting_send = true, waiting_recv = false;
	if (op == IBV_WR_SEND) {
		ibv_sge rsge{.addr = reinterpret_cast<uintptr_t>(remote_addr),
			     .length = static_cast<uint32_t>(len),
			     .lkey = remote->lkey};
		ibv_recv_wr rwr{};
		rwr.wr_id = recv_id;
		rwr.sg_list = &rsge;
		rwr.num_sge = 1;
		ibv_recv_wr *rbad = nullptr;
		if (int rc = ibv_post_recv(responder_.get(), &rwr, &rbad))
			throw Error("ibv_post_recv", rc);
		waiting_recv = true;
	}
	ibv_send_wr *bad = nullptr;
	if (int rc = ibv_post_send(qp_.get(), &wr, &bad))
		throw Error("ibv_post_send", rc);

	auto deadline = std::chrono::steady_clock::now() + timeout;
	ibv_wc_status send_status = IBV_WC_SUCCESS, recv_status = IBV_WC_SUCCESS;
	while (waiting_send || waiting_recv) {
		ibv_wc wc{};
		int n = ibv_poll_cq(cq_.get(), 1, &wc);
		if (n < 0)
			throw Error("ibv_poll_cq", EIO);
		if (n == 1) {
			// Left over from an earlier call that failed or timed
			// out (a receive flushed, a send's late status).
			if (wc.wr_id < send_id)
				continue;
			if (!(wc.wr_id == send_id && waiting_send) &&
			    !(wc.wr_id == recv_id && waiting_recv))
				throw Error("a completion of no request in flight", EIO);
			if (wc.wr_id == send_id) {
				waiting_send = false;
				send_status = wc.status;
			} else {
				waiting_recv = false;
				recv_status = wc.status;
			}
			// A failed send leaves its receive posted, or flushed
			// later: nothing more to wait for. A failed receive
			// is followed by the send's own status (the NAK's),
			// which says more: wait for that.
			if (send_status != IBV_WC_SUCCESS)
				return send_status;
			continue;
		}
		if (std::chrono::steady_clock::now() > deadline)
			throw Error("RDMA completion", ETIMEDOUT);
		// Polled, not slept between polls (a 50 us sleep was part of
		// every time measured); the yield leaves rxe's work the CPU.
		std::this_thread::yield();
	}
	return recv_status;
}

} // namespace odpwatch::verbs
