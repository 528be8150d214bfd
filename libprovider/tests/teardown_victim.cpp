// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// A process holding everything the kernel side tracks for it: an implicit
// ODP MR with children, an explicit ODP MR, a pinned MR, a memwatch with a
// watch on every page of a region, and RDMA traffic faulting on ODP memory
// from a second thread. Once set up it prints "ready" and ends the way MODE
// says, so pytest (test_teardown.py) can check the kernel survives each end:
//   oom        allocate and touch memory until the (memory cgroup's) OOM
//              killer kills it, traffic still faulting meanwhile
//   traffic    keep the traffic going until killed (the caller sends SIGKILL)
//   exit       _exit(0) with everything open
//   bystander MIB   another process's traffic: move MIB MiB through ODP
//              memory, checking every byte, then exit 0 (1 on a bad byte)
//   tolerant MIB    the same with prefetches, while the kernel fails
//              allocations (test_fault_injection.py): a call may fail with
//              a clean errno and a transfer with an error status (a new QP
//              then takes over), but whatever completes must be right
#include "memwatch.hpp"
#include "verbs.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace odpwatch;

namespace
{

constexpr unsigned kOdp = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ;
constexpr unsigned kPinned =
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr size_t MiB = 1 << 20;

void prefetch(ibv_pd *pd, ibv_mr *mr, void *addr, size_t len)
{
	ibv_sge sge{.addr = reinterpret_cast<uintptr_t>(addr),
		    .length = static_cast<uint32_t>(len),
		    .lkey = mr->lkey};
	if (int rc = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				   IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1))
		throw verbs::Error("ibv_advise_mr", rc);
}

// Writes @mib MiB from a pinned source into fresh, never-touched memory
// through @dst_mr (ODP: every page faults), checking what arrives; with
// @stop it runs until told to stop instead.
bool traffic(verbs::LoopbackQp &qp, ibv_pd *pd, ibv_mr *implicit, size_t mib,
	     const std::atomic<bool> *stop)
{
	verbs::Mapping src(MiB);
	verbs::Mr src_mr = verbs::reg_mr(pd, src.data(), MiB, kPinned);
	for (size_t i = 0; stop ? !stop->load() : i < mib; i++) {
		std::memset(src.data(), int('a' + i % 26), MiB);
		verbs::Mapping dst(MiB);
		// Alternate the implicit MR and a fresh explicit ODP MR.
		verbs::Mr explicit_mr;
		ibv_mr *mr = implicit;
		if (i % 2) {
			explicit_mr = verbs::reg_mr(pd, dst.data(), MiB, kOdp);
			mr = explicit_mr.get();
		}
		if (qp.rdma(IBV_WR_RDMA_WRITE, src_mr.get(), src.data(), MiB, mr, dst.data(),
			    std::chrono::minutes(5)) != IBV_WC_SUCCESS)
			throw verbs::Error("RDMA WRITE into ODP memory", EIO);
		if (std::memcmp(src.data(), dst.data(), MiB)) {
			std::fprintf(stderr, "bad bytes after %zu MiB\n", i);
			return false;
		}
	}
	return true;
}

// Errnos an allocation failure may surface as.
bool clean_errno(int err)
{
	return err == ENOMEM || err == EAGAIN || err == EFAULT || err == EBUSY;
}

int tolerant(ibv_context *ctx, size_t mib)
{
	verbs::Pd pd = verbs::alloc_pd(ctx);
	verbs::Mapping src(MiB);
	verbs::Mr src_mr = verbs::reg_mr(pd.get(), src.data(), MiB, kPinned);
	std::map<std::string, size_t> outcomes;
	std::unique_ptr<verbs::LoopbackQp> qp;
	verbs::Mr implicit;
	size_t ok = 0;
	for (size_t i = 0; i < mib; i++) {
		try {
			if (!qp)
				qp = std::make_unique<verbs::LoopbackQp>(ctx, pd.get());
			if (!implicit)
				implicit = verbs::reg_mr(pd.get(), nullptr, SIZE_MAX, kOdp);
			std::memset(src.data(), int('a' + i % 26), MiB);
			verbs::Mapping dst(MiB);
			verbs::Mr explicit_mr;
			ibv_mr *mr = implicit.get();
			if (i % 2) {
				explicit_mr = verbs::reg_mr(pd.get(), dst.data(), MiB, kOdp);
				mr = explicit_mr.get();
			}
			if (i % 3 == 0) // half the buffer prefetched, the rest faulted
				prefetch(pd.get(), mr, dst.data(), MiB / 2);
			ibv_wc_status st = qp->rdma(IBV_WR_RDMA_WRITE, src_mr.get(), src.data(),
						    MiB, mr, dst.data(), std::chrono::minutes(5));
			if (st != IBV_WC_SUCCESS) {
				outcomes[ibv_wc_status_str(st)]++;
				qp.reset(); // in the error state now
				continue;
			}
			if (std::memcmp(src.data(), dst.data(), MiB)) {
				std::fprintf(stderr, "bad bytes in MiB %zu\n", i);
				return 1;
			}
			ok++;
		} catch (const verbs::Error &e) {
			if (!clean_errno(e.err())) {
				std::fprintf(stderr, "MiB %zu: %s\n", i, e.what());
				return 1;
			}
			outcomes[std::strerror(e.err())]++;
		}
	}
	std::printf("tolerant: %zu MiB, %zu written and checked", mib, ok);
	for (const auto &[what, n] : outcomes)
		std::printf(", %zu %s", n, what.c_str());
	std::printf("\n");
	return 0;
}

int run(const std::string &mode, size_t mib)
{
	verbs::Context ctx = verbs::open_device("");
	if (mode == "tolerant")
		return tolerant(ctx.get(), mib);
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	verbs::Mr implicit = verbs::reg_mr(pd.get(), nullptr, SIZE_MAX, kOdp);
	if (mode == "bystander") {
		verbs::LoopbackQp qp(ctx.get(), pd.get());
		return traffic(qp, pd.get(), implicit.get(), mib, nullptr) ? 0 : 1;
	}

	// The implicit MR gets children for 8 MiB; an explicit ODP MR and a
	// pinned one hold pages of their own.
	verbs::Mapping kids(8 * MiB), odp(8 * MiB), pinned(MiB);
	prefetch(pd.get(), implicit.get(), kids.data(), kids.size());
	verbs::Mr odp_mr = verbs::reg_mr(pd.get(), odp.data(), odp.size(), kOdp);
	prefetch(pd.get(), odp_mr.get(), odp.data(), odp.size());
	std::memset(pinned.data(), 1, pinned.size());
	verbs::Mr pinned_mr = verbs::reg_mr(pd.get(), pinned.data(), pinned.size(), kPinned);

	// A watch on every page of a 16 MiB region.
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	Memwatch mw;
	verbs::Mapping watched(16 * MiB);
	std::memset(watched.data(), 2, watched.size());
	for (size_t off = 0; off < watched.size(); off += page)
		mw.add(watched.data() + off, page, off);

	std::atomic<bool> stop{false};
	std::thread faulting([&] {
		try {
			verbs::LoopbackQp qp(ctx.get(), pd.get());
			traffic(qp, pd.get(), implicit.get(), 0, &stop);
		} catch (const std::exception &e) {
			std::fprintf(stderr, "traffic: %s\n", e.what());
		}
	});
	std::printf("ready\n");
	std::fflush(stdout);

	if (mode == "exit")
		_exit(0); // everything still open: the kernel tears it down
	if (mode == "oom") {
		std::vector<void *> hog;
		for (;;) {
			void *p = mmap(nullptr, 16 * MiB, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED)
				break;
			std::memset(p, 3, 16 * MiB);
			hog.push_back(p);
		}
		std::fprintf(stderr, "oom: mmap failed before the OOM killer came\n");
	}
	// traffic, or an OOM that never came: wait here (to be killed).
	faulting.join();
	return 3;
}

} // namespace

int main(int argc, char **argv)
{
	const std::string mode = argc > 1 ? argv[1] : "";
	if (mode != "oom" && mode != "traffic" && mode != "exit" &&
	    !((mode == "bystander" || mode == "tolerant") && argc > 2)) {
		std::fprintf(stderr, "usage: %s oom|traffic|exit|bystander MIB|tolerant MIB\n",
			     argv[0]);
		return 2;
	}
	try {
		return run(mode, argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 0);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
		return 1;
	}
}
