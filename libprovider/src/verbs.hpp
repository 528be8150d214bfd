// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// RAII ownership of verbs objects and memory mappings, and a loopback pair of
// RC QPs for moving bytes through an MR inside one process.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace odpwatch::verbs
{

// A failed verbs or system call; what() says which call and why.
class Error : public std::runtime_error
{
public:
	Error(const std::string &what, int err);
	int err() const noexcept { return err_; }

private:
	int err_;
};

template <class T, auto Destroy> struct Deleter {
	void operator()(T *p) const noexcept
	{
		if (p)
			Destroy(p);
	}
};
using Context = std::unique_ptr<ibv_context, Deleter<ibv_context, ibv_close_device>>;
using Pd = std::unique_ptr<ibv_pd, Deleter<ibv_pd, ibv_dealloc_pd>>;
using Cq = std::unique_ptr<ibv_cq, Deleter<ibv_cq, ibv_destroy_cq>>;
using Qp = std::unique_ptr<ibv_qp, Deleter<ibv_qp, ibv_destroy_qp>>;
using Mr = std::unique_ptr<ibv_mr, Deleter<ibv_mr, ibv_dereg_mr>>;

// Open a device by name; an empty name picks the first device.
Context open_device(std::string_view name);
Pd alloc_pd(ibv_context *ctx);
// ibv_reg_mr; throws Error with errno on failure.
Mr reg_mr(ibv_pd *pd, void *addr, size_t len, unsigned access);

// An anonymous private mapping, unmapped on destruction.
class Mapping
{
public:
	// hint != nullptr maps exactly there (MAP_FIXED_NOREPLACE).
	explicit Mapping(size_t len, void *hint = nullptr);
	Mapping(Mapping &&o) noexcept;
	Mapping &operator=(Mapping &&o) noexcept;
	Mapping(const Mapping &) = delete;
	Mapping &operator=(const Mapping &) = delete;
	~Mapping();
	std::byte *data() const noexcept { return static_cast<std::byte *>(addr_); }
	size_t size() const noexcept { return len_; }
	void unmap() noexcept;
	// Forgets the mapping without unmapping it (it was unmapped or moved
	// behind our back, as a test of exactly that does).
	void *release() noexcept { return std::exchange(addr_, nullptr); }

private:
	void *addr_ = nullptr;
	size_t len_ = 0;
};

// The first RoCE v2 GID on port 1 with an IPv4-mapped address, or -1.
int roce_v2_ipv4_gid_index(ibv_context *ctx);

// Two RC QPs on one port connected to each other, a requester and its
// responder: RDMA operations go from a local MR to another local MR through
// the full transport, as they would between two peers. (Not one QP as its
// own peer: a responder's error would move the requester's QP to the error
// state too, and its request would complete as flushed, not with the NAK's
// status.)
class LoopbackQp
{
public:
	// min_rnr_timer: the RNR NAK timer the responder asks the requester
	// for; 12 is 0.64 ms, 0 is 655 ms (rdma_cm's default).
	LoopbackQp(ibv_context *ctx, ibv_pd *pd, uint8_t min_rnr_timer = 12);
	int gid_index() const noexcept { return gid_index_; }
	// Post one signaled RDMA WRITE, RDMA READ or SEND between a local and a
	// "remote" buffer (a SEND's receive is posted on it) and wait for the
	// completions.
	ibv_wc_status rdma(ibv_wr_opcode op, const ibv_mr *local, const void *local_addr,
			   size_t len, const ibv_mr *remote, const void *remote_addr,
			   std::chrono::milliseconds timeout = std::chrono::seconds(30));
	// "requester RTS, responder RTS": the two QPs' states, for a report of
	// a completion in error (a responder in ERR drops every request).
	std::string states() const;
	ibv_wc_status rdma_write(const ibv_mr *src, const void *src_addr, size_t len,
				 const ibv_mr *dst, const void *dst_addr)
	{
		return rdma(IBV_WR_RDMA_WRITE, src, src_addr, len, dst, dst_addr);
	}

private:
	void connect(ibv_qp *qp, uint32_t dest_qpn, uint8_t min_rnr_timer);

	Cq cq_;	       // both QPs' completions
	Qp qp_;	       // the requester
	Qp responder_; // where the "remote" MRs are reached, and a SEND lands
	int gid_index_ = -1;
	uint64_t requests_ = 0; // rdma() calls, for their requests' ids
};

} // namespace odpwatch::verbs
