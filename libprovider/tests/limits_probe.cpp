// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Limits, from inside the process they apply to (pyverbs-tests/test_limits.py
// sets up the cgroup and reads the verdict):
//   memlock          without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 1 MiB:
//                    pinned MRs are held to the limit (ENOMEM beyond it),
//                    ODP MRs are not, and their traffic pins nothing
//   watch-charge N   add N watches and print the process's memory cgroup's
//                    memory.current before, with and after them
//   watch-churn D N  D descriptors, each adding N watches and removing them
//                    all, kept open: memory.current of the empty descriptors
//                    and after the churn, and the bytes of words it used
//   watch-flood      add one-page watches until the kernel says no; prints
//                    the count as it goes, and the errno at the end
//   beyond-memory MIB  an ODP MR over MIB MiB in a memory cgroup that may
//                    keep only part of it resident (swap behind it): every
//                    1 MiB chunk RDMA-written, then each read back with RDMA
//                    READ and compared byte for byte; prints the swap traffic
//                    and the time of each pass. Then a pinned registration
//                    of the same buffer under RLIMIT_MEMLOCK (CAP_IPC_LOCK
//                    dropped) at the buffer's half: ENOMEM, nothing pinned.
//   pin-forever POLICY MIB  an irregular workload (phases that allocate,
//                    register, send and free buffers) under RLIMIT_MEMLOCK
//                    of MIB MiB: pinned memory and RSS per phase, for the
//                    pin-forever workaround and for odpwatch's cache policies
#include "check.hpp"
#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <linux/capability.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace odpwatch;
using odpwatch::test::vm_pin_kib;

namespace
{

constexpr size_t KiB = 1024, MiB = 1024 * KiB;
constexpr unsigned kPinned = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
constexpr unsigned kOdp = kPinned | IBV_ACCESS_ON_DEMAND;

// Without CAP_IPC_LOCK, RLIMIT_MEMLOCK binds even root.
void drop_ipc_lock()
{
	__user_cap_header_struct hdr{.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	__user_cap_data_struct data[2]{};
	CHECK(syscall(SYS_capget, &hdr, data) == 0);
	data[0].effective &= ~(1U << CAP_IPC_LOCK);
	data[0].permitted &= ~(1U << CAP_IPC_LOCK);
	data[0].inheritable &= ~(1U << CAP_IPC_LOCK);
	CHECK(syscall(SYS_capset, &hdr, data) == 0);
}

// The errno of a registration expected to fail (0 if it succeeded).
int reg_errno(ibv_pd *pd, void *addr, size_t len, unsigned access)
{
	ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	if (!mr)
		return errno;
	ibv_dereg_mr(mr);
	return 0;
}

void memlock()
{
	drop_ipc_lock();
	rlimit lim{.rlim_cur = MiB, .rlim_max = MiB};
	CHECK(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);

	auto ctx = verbs::open_device("rxe0");
	auto pd = verbs::alloc_pd(ctx.get());
	verbs::LoopbackQp qp(ctx.get(), pd.get());
	const size_t pinned_before = vm_pin_kib();

	// Pinned: half the limit fits, another whole limit does not.
	verbs::Mapping half(MiB / 2), whole(MiB);
	std::memset(half.data(), 0x5a, half.size());
	verbs::Mr half_mr = verbs::reg_mr(pd.get(), half.data(), half.size(), kPinned);
	CHECK(vm_pin_kib() == pinned_before + 512);
	CHECK_RC(reg_errno(pd.get(), whole.data(), whole.size(), kPinned), ENOMEM);
	CHECK(vm_pin_kib() == pinned_before + 512);
	std::printf("pinned: 512 KiB registered, 1 MiB more refused with ENOMEM\n");

	// ODP: 64 times the limit registers, explicit and implicit, and 8 MiB
	// of traffic into never-touched memory pins nothing.
	verbs::Mapping big(64 * MiB), fresh(4 * MiB);
	verbs::Mr odp = verbs::reg_mr(pd.get(), big.data(), big.size(), kOdp);
	verbs::Mr implicit = verbs::reg_mr(pd.get(), nullptr, SIZE_MAX, kOdp);
	for (size_t off = 0; off < 4 * MiB; off += half.size()) {
		CHECK(qp.rdma_write(half_mr.get(), half.data(), half.size(), odp.get(),
				    big.data() + off) == IBV_WC_SUCCESS);
		CHECK(qp.rdma_write(half_mr.get(), half.data(), half.size(), implicit.get(),
				    fresh.data() + off) == IBV_WC_SUCCESS);
	}
	CHECK(std::to_integer<int>(big.data()[4 * MiB - 1]) == 0x5a);
	CHECK(std::to_integer<int>(fresh.data()[4 * MiB - 1]) == 0x5a);
	CHECK(vm_pin_kib() == pinned_before + 512);
	std::printf("odp: 64 MiB explicit and implicit MRs, 8 MiB written, VmPin still "
		    "512 KiB\n");

	// What deregistration gives back can be pinned again, up to the limit.
	half_mr.reset();
	CHECK(vm_pin_kib() == pinned_before);
	CHECK_RC(reg_errno(pd.get(), whole.data(), whole.size(), kPinned), 0);
	std::printf("pinned: after deregistration, 1 MiB (the limit) registers\n");
}

// This process's memory cgroup's memory.current.
size_t memcg_current()
{
	std::ifstream self("/proc/self/cgroup");
	std::string line;
	std::getline(self, line);
	CHECK(line.rfind("0::", 0) == 0); // cgroup v2
	std::ifstream current("/sys/fs/cgroup" + line.substr(3) + "/memory.current");
	size_t bytes = 0;
	CHECK(current >> bytes);
	return bytes;
}

// An address range with nothing behind it: watches need no memory mapped.
void *reserve(size_t len)
{
	void *p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(p != MAP_FAILED);
	return p;
}

void watch_charge(size_t n)
{
	const size_t page = sysconf(_SC_PAGESIZE);
	auto *base = static_cast<std::byte *>(reserve(n * page));
	const size_t before = memcg_current();
	size_t with = 0;
	{
		Memwatch mw(n);
		const size_t empty = memcg_current();
		for (size_t i = 0; i < n; i++)
			mw.add(base + i * page, page, i);
		with = memcg_current();
		std::printf("memwatch: %zu bytes; each watch: %.1f bytes\n", empty - before,
			    double(with - empty) / double(n));
	}
	// Freed objects are uncharged at once; RCU-freed ones after a grace period.
	std::this_thread::sleep_for(std::chrono::seconds(1));
	std::printf("memory.current before %zu with %zu after %zu\n", before, with,
		    memcg_current());
	munmap(base, n * page);
}

void watch_churn(size_t descriptors, size_t n)
{
	const size_t page = sysconf(_SC_PAGESIZE);
	auto *base = static_cast<std::byte *>(reserve(n * page));
	std::vector<std::unique_ptr<Memwatch>> mws;
	for (size_t d = 0; d < descriptors; d++)
		mws.push_back(std::make_unique<Memwatch>(n));
	const size_t empty = memcg_current();
	std::vector<uint32_t> ids(n);
	for (auto &mw : mws) {
		for (size_t i = 0; i < n; i++)
			ids[i] = mw->add(base + i * page, page, i).id;
		for (const uint32_t id : ids)
			mw->remove(id);
	}
	std::this_thread::sleep_for(std::chrono::seconds(1)); // RCU-freed objects
	std::printf("memory.current empty %zu churned %zu; words used %zu bytes\n", empty,
		    memcg_current(), descriptors * n * sizeof(uint64_t));
	munmap(base, n * page);
}

void watch_flood()
{
	const size_t page = sysconf(_SC_PAGESIZE);
	const size_t max = 1 << 20; // MEMWATCH_MAX_SLOTS: the per-descriptor limit
	auto *base = static_cast<std::byte *>(reserve(max * page));
	Memwatch mw(max);
	for (size_t i = 0; i < max; i++) {
		try {
			mw.add(base + i * page, page, i);
		} catch (const verbs::Error &e) {
			std::printf("stopped after %zu watches: errno %d (%s)\n", i, e.err(),
				    std::strerror(e.err()));
			return;
		}
		if (i % 10000 == 0) {
			std::printf("%zu watches\n", i);
			std::fflush(stdout); // the OOM killer may be next
		}
	}
	std::printf("stopped after %zu watches: the descriptor's limit\n", max);
}

// A counter of /proc/vmstat.
size_t vmstat(const std::string &name)
{
	std::ifstream f("/proc/vmstat");
	std::string key;
	size_t value = 0;
	while (f >> key >> value)
		if (key == name)
			return value;
	throw test::Failure("no " + name + " in /proc/vmstat");
}

// The bytes of chunk @n: not one repeated byte, which zram would keep as a
// fill value instead of swapping the page's data.
std::byte pattern(size_t n, size_t off)
{
	return std::byte((off * 131 + n * 7 + (off >> 12)) & 0xff);
}

void beyond_memory(size_t mib)
{
	auto ctx = verbs::open_device("rxe0");
	auto pd = verbs::alloc_pd(ctx.get());
	verbs::LoopbackQp qp(ctx.get(), pd.get());
	const size_t len = mib * MiB, chunk = MiB;
	verbs::Mapping buf(len), stage(chunk);
	verbs::Mr odp = verbs::reg_mr(pd.get(), buf.data(), len, kOdp | IBV_ACCESS_REMOTE_READ);
	verbs::Mr stage_mr = verbs::reg_mr(pd.get(), stage.data(), chunk, kPinned);
	const size_t out0 = vmstat("pswpout"), in0 = vmstat("pswpin");
	using clock = std::chrono::steady_clock;

	auto t0 = clock::now();
	for (size_t n = 0; n < len / chunk; n++) {
		for (size_t off = 0; off < chunk; off++)
			stage.data()[off] = pattern(n, off);
		CHECK(qp.rdma_write(stage_mr.get(), stage.data(), chunk, odp.get(),
				    buf.data() + n * chunk) == IBV_WC_SUCCESS);
	}
	auto t1 = clock::now();
	const size_t out1 = vmstat("pswpout");
	size_t bad_chunks = 0;
	for (size_t n = 0; n < len / chunk; n++) {
		std::memset(stage.data(), 0, chunk);
		CHECK(qp.rdma(IBV_WR_RDMA_READ, stage_mr.get(), stage.data(), chunk, odp.get(),
			      buf.data() + n * chunk) == IBV_WC_SUCCESS);
		for (size_t off = 0; off < chunk; off++)
			if (stage.data()[off] != pattern(n, off)) {
				std::printf("chunk %zu: first wrong byte at %zu\n", n, off);
				bad_chunks++;
				break;
			}
	}
	auto t2 = clock::now();
	auto ms = [](auto d) {
		return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
	};
	std::printf("odp: %zu MiB written in %lld ms, read back in %lld ms; pages swapped out "
		    "%zu during the writes, %zu in all; swapped in %zu; %zu chunks wrong\n",
		    mib, (long long)ms(t1 - t0), (long long)ms(t2 - t1), out1 - out0,
		    vmstat("pswpout") - out0, vmstat("pswpin") - in0, bad_chunks);

	drop_ipc_lock();
	rlimit lim{.rlim_cur = len / 2, .rlim_max = len / 2};
	CHECK(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);
	const size_t pinned = vm_pin_kib();
	const int err = reg_errno(pd.get(), buf.data(), len, kPinned);
	std::printf("pinned: registration of the %zu MiB: errno %d (%s), VmPin %zu KiB -> %zu "
		    "KiB\n",
		    mib, err, std::strerror(err), pinned, vm_pin_kib());
}

// RSS and pinned memory of this process, in KiB.
struct Memory {
	size_t rss_kib, pin_kib;
};

Memory memory_now()
{
	std::ifstream status("/proc/self/status");
	Memory m{0, 0};
	for (std::string line; std::getline(status, line);)
		if (line.rfind("VmRSS:", 0) == 0)
			m.rss_kib = std::stoul(line.substr(6));
		else if (line.rfind("VmPin:", 0) == 0)
			m.pin_kib = std::stoul(line.substr(6));
	return m;
}

// Registrations as MPI libraries made them before they could learn of
// unmaps: malloc never gives memory back (so no registered page can go
// stale), every registration is kept for ever, a buffer inside one is a hit.
class PinForeverCache
{
public:
	explicit PinForeverCache(ibv_pd *pd) : pd_(pd)
	{
		CHECK(mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1);
		CHECK(mallopt(M_MMAP_MAX, 0) == 1);
	}
	ibv_mr *get(void *addr, size_t len)
	{
		auto a = reinterpret_cast<uintptr_t>(addr);
		for (const auto &mr : mrs_) {
			auto s = reinterpret_cast<uintptr_t>(mr->addr);
			if (s <= a && a + len <= s + mr->length)
				return mr.get();
		}
		mrs_.push_back(verbs::reg_mr(pd_, addr, len, kPinned));
		return mrs_.back().get();
	}
	size_t registrations() const { return mrs_.size(); }

private:
	ibv_pd *pd_;
	std::vector<verbs::Mr> mrs_;
};

// pin-forever POLICY MIB: an irregular workload under RLIMIT_MEMLOCK of MIB
// MiB, CAP_IPC_LOCK dropped. Phases of different sizes, each allocating
// buffers of 64 KiB to 4 MiB with malloc, registering each through the
// policy's cache, sending it (RDMA WRITE over a loopback QP), then freeing
// them all. One line per phase, at its peak and after the free, with RSS,
// pinned memory and registrations so far; a registration that fails ends
// the run with the phase and errno, exit status 3.
int pin_forever(const std::string &policy, size_t memlock_mib)
{
	static const std::map<std::string, int> policies = {
		{"pin-forever", -1},
		{"memwatch", ODPWATCH_CACHE_PINNED},
		{"explicit-odp", ODPWATCH_CACHE_EXPLICIT_ODP},
		{"implicit-odp", ODPWATCH_CACHE_IMPLICIT_ODP}};
	auto p = policies.find(policy);
	if (p == policies.end()) {
		std::fprintf(stderr,
			     "pin-forever: policy pin-forever, memwatch, explicit-odp or "
			     "implicit-odp, not '%s'\n",
			     policy.c_str());
		return 2;
	}
	drop_ipc_lock();
	rlimit lim{.rlim_cur = memlock_mib * MiB, .rlim_max = memlock_mib * MiB};
	CHECK(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);
	auto ctx = verbs::open_device("rxe0");
	auto pd = verbs::alloc_pd(ctx.get());
	verbs::LoopbackQp qp(ctx.get(), pd.get());
	// The receiving side: ODP, so it pins nothing and is the same for all.
	verbs::Mapping sink(64 * KiB);
	verbs::Mr sink_mr = verbs::reg_mr(pd.get(), sink.data(), sink.size(), kOdp);

	std::unique_ptr<PinForeverCache> forever;
	std::unique_ptr<odpwatch_cache, decltype(&odpwatch_cache_destroy)> owned(
		nullptr, odpwatch_cache_destroy);
	odpwatch_cache *cache = nullptr;
	if (p->second < 0) {
		forever = std::make_unique<PinForeverCache>(pd.get());
	} else {
		odpwatch_cache_attr attr{};
		attr.policy = uint32_t(p->second);
		CHECK_RC(-odpwatch_cache_create(&attr, &cache), 0);
		owned.reset(cache);
	}
	// After the counts the tests read, the cache's own: why it holds less
	// than a phase registered (found stale, evicted, retried after ENOMEM).
	auto sample = [&](size_t phase, const char *when, size_t mib) {
		const Memory m = memory_now();
		odpwatch_cache_stats st{};
		if (cache)
			CHECK_RC(-odpwatch_cache_query(cache, &st), 0);
		std::printf("phase %zu %s: %zu MiB in buffers, rss %zu KiB, pinned %zu KiB, "
			    "registrations %zu",
			    phase, when, mib, m.rss_kib, m.pin_kib,
			    forever ? forever->registrations() : size_t(st.registrations));
		if (cache)
			std::printf("; cache: %" PRIu64 " entries of %" PRIu64 " KiB, %" PRIu64
				    " stale, %" PRIu64 " evicted, %" PRIu64 " merges, %" PRIu64
				    " retries, %" PRIu64 " deregistrations",
				    st.entries, st.bytes >> 10, st.invalidations, st.evictions,
				    st.merges, st.retries, st.deregistrations);
		std::printf("\n");
		std::fflush(stdout);
	};

	// MiB allocated in each phase: an irregular demand, peaking twice.
	const size_t phases[] = {8, 48, 4, 96, 16, 2, 64, 8, 128, 4, 32, 8};
	std::mt19937 rng(7);
	std::uniform_int_distribution<size_t> size_kib(64, 4096);
	int rc = 0;
	for (size_t ph = 0; ph < std::size(phases) && !rc; ph++) {
		std::vector<std::pair<void *, size_t>> bufs;
		size_t total = 0;
		while (total < phases[ph] * MiB) {
			const size_t len = size_kib(rng) * KiB;
			void *b = std::malloc(len);
			CHECK(b != nullptr);
			std::memset(b, int(ph), len);
			bufs.emplace_back(b, len);
			total += len;
		}
		for (auto [b, len] : bufs) {
			ibv_mr *mr = nullptr;
			odpwatch_cache_reg *reg = nullptr;
			int err = 0;
			if (forever) {
				try {
					mr = forever->get(b, len);
				} catch (const verbs::Error &e) {
					err = e.err();
				}
			} else {
				err = -odpwatch_cache_get(cache, pd.get(), b, len,
							  IBV_ACCESS_LOCAL_WRITE, &reg);
				if (!err)
					mr = odpwatch_cache_reg_mr(reg);
			}
			if (err) {
				sample(ph, "failed", total / MiB);
				std::printf("phase %zu: registration of %zu KiB failed: errno %d "
					    "(%s)\n",
					    ph, len / KiB, err, std::strerror(err));
				rc = 3;
				break;
			}
			// Send from it: its first 64 KiB written into the receiver.
			CHECK(qp.rdma_write(mr, b, std::min(len, 64 * KiB), sink_mr.get(),
					    sink.data()) == IBV_WC_SUCCESS);
			if (reg)
				CHECK_RC(-odpwatch_cache_put(cache, reg), 0);
		}
		if (!rc)
			sample(ph, "peak", total / MiB);
		for (auto [b, len] : bufs)
			std::free(b);
		if (cache) {
			// An application's progress loop: drop what was freed.
			CHECK(odpwatch_cache_process_events(cache) >= 0);
			CHECK_RC(-odpwatch_cache_flush(cache), 0);
		}
		if (!rc)
			sample(ph, "freed", 0);
	}
	if (cache)
		CHECK_RC(-odpwatch_cache_destroy(owned.release()), 0);
	return rc;
}

} // namespace

int main(int argc, char **argv)
{
	const std::string mode = argc > 1 ? argv[1] : "";
	try {
		if (mode == "memlock")
			memlock();
		else if (mode == "watch-charge" && argc > 2)
			watch_charge(std::stoul(argv[2]));
		else if (mode == "watch-churn" && argc > 3)
			watch_churn(std::stoul(argv[2]), std::stoul(argv[3]));
		else if (mode == "watch-flood")
			watch_flood();
		else if (mode == "beyond-memory" && argc > 2)
			beyond_memory(std::stoul(argv[2]));
		else if (mode == "pin-forever" && argc > 3)
			return pin_forever(argv[2], std::stoul(argv[3]));
		else {
			std::fprintf(stderr,
				     "usage: %s memlock | watch-charge N | watch-churn D N | "
				     "watch-flood | "
				     "beyond-memory MIB | pin-forever POLICY MIB\n",
				     argv[0]);
			return 2;
		}
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s: %s\n", mode.c_str(), e.what());
		return 1;
	}
	return 0;
}
