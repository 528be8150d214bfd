// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// End-to-end tests of the registration cache through its C ABI, with real
// RDMA traffic on rxe: regcache-test [CASE...] (no argument: all cases;
// --list: their names).
// Prints KTAP; exits non-zero if any case fails.
#include "check.hpp"
#include "raw_free.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace odpwatch;
using odpwatch::test::Failure;
using odpwatch::test::vm_pin_kib;

namespace
{

constexpr size_t buf_len = 64 * 1024;
constexpr size_t dst_len = 4 * buf_len; // the peer's landing buffer
constexpr unsigned local_access = IBV_ACCESS_LOCAL_WRITE;

// Fixed addresses far from anything else, so a freed buffer's successor
// lands at the same address, as malloc would put it. 0x5900'0000'0000 is
// application memory for ThreadSanitizer and AddressSanitizer too (beside
// the PIE binaries, below the heap and mmap areas), so the sanitizer builds
// of this program run the same cases.
void *slot_address(int slot)
{
	return reinterpret_cast<void *>(uintptr_t{0x5900'0000'0000} + slot * (uintptr_t{1} << 24));
}

struct Cache {
	odpwatch_cache *c = nullptr;
	explicit Cache(int policy, uint64_t max_entries = 0, uint64_t max_bytes = 0)
	{
		odpwatch_cache_attr a{};
		a.policy = policy;
		a.max_entries = max_entries;
		a.max_bytes = max_bytes;
		CHECK_RC(odpwatch_cache_create(&a, &c), 0);
	}
	~Cache()
	{
		if (c && odpwatch_cache_destroy(c))
			std::fprintf(stderr, "# cache still in use at teardown\n");
	}
	odpwatch_cache_stats stats() const
	{
		odpwatch_cache_stats s{};
		CHECK_RC(odpwatch_cache_query(c, &s), 0);
		return s;
	}
};

// A device, a PD, a loopback QP and a destination buffer for the bytes sent.
struct Peer {
	verbs::Context ctx = verbs::open_device("");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	verbs::LoopbackQp qp{ctx.get(), pd.get()};
	verbs::Mapping dst{dst_len};
	verbs::Mr dst_mr = verbs::reg_mr(pd.get(), dst.data(), dst_len,
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

	// RDMA WRITE the buffer through the cache's registration; what arrives.
	void send(odpwatch_cache *c, const verbs::Mapping &buf, int *policy = nullptr)
	{
		odpwatch_cache_reg *reg = nullptr;
		CHECK_RC(odpwatch_cache_get(c, pd.get(), buf.data(), buf_len, local_access, &reg),
			 0);
		if (policy)
			*policy = odpwatch_cache_policy_of(c, pd.get());
		std::memset(dst.data(), 0, buf_len);
		auto st = qp.rdma_write(odpwatch_cache_reg_mr(reg), buf.data(), buf_len,
					dst_mr.get(), dst.data());
		CHECK_RC(odpwatch_cache_put(c, reg), 0);
		CHECK(st == IBV_WC_SUCCESS);
	}
	// RDMA WRITE [addr, addr + len) through a get of exactly that range;
	// the bytes must arrive as they are.
	void send_range(odpwatch_cache *c, const std::byte *addr, size_t len)
	{
		odpwatch_cache_reg *reg = nullptr;
		CHECK_RC(odpwatch_cache_get(c, pd.get(), const_cast<std::byte *>(addr), len,
					    local_access, &reg),
			 0);
		std::memset(dst.data(), 0, len);
		auto st = qp.rdma_write(odpwatch_cache_reg_mr(reg), addr, len, dst_mr.get(),
					dst.data());
		CHECK_RC(odpwatch_cache_put(c, reg), 0);
		CHECK(st == IBV_WC_SUCCESS);
		CHECK(std::memcmp(dst.data(), addr, len) == 0);
	}
	bool received(char fill) const
	{
		return std::all_of(dst.data(), dst.data() + buf_len,
				   [&](std::byte b) { return b == std::byte(fill); });
	}
};

verbs::Mapping filled(void *at, char fill)
{
	verbs::Mapping m(buf_len, at);
	std::memset(m.data(), fill, buf_len);
	return m;
}

// The classic failure: A registered and cached, freed, B at A's address.
void reuse(int policy)
{
	Peer p;
	Cache c(policy);
	int effective = -1;
	auto a = filled(slot_address(0), 'A');
	p.send(c.c, a, &effective);
	CHECK(effective == policy);
	CHECK(p.received('A'));
	a.unmap();
	auto b = filled(slot_address(0), 'B');
	p.send(c.c, b);
	CHECK(p.received('B'));
	auto s = c.stats();
	if (policy == ODPWATCH_CACHE_PINNED) {
		// A's registration was found stale and replaced.
		CHECK(s.invalidations == 1 && s.registrations == 2 && s.hits == 0);
	} else {
		// An ODP registration follows the mapping: B hits A's entry.
		CHECK(s.invalidations == 0 && s.registrations == 1 && s.hits == 1);
	}
	CHECK(s.entries == 1 && s.in_use == 0);
}

// Every way a buffer can be replaced at its address, not only munmap()
// through libc (which malloc hooks see): the bytes on the wire must be the
// new buffer's each time.
void ways_to_free(int policy)
{
	Peer p;
	Cache c(policy);
	const std::pair<const char *, std::function<void(verbs::Mapping &, void *)>> ways[] = {
		{"munmap",
		 [](verbs::Mapping &m, void *at) {
			 m.unmap();
			 m = filled(at, 'B');
		 }},
		{"munmap system call",
		 [](verbs::Mapping &m, void *at) {
			 syscall(SYS_munmap, m.release(), buf_len);
			 m = filled(at, 'B');
		 }},
		{"madvise(MADV_DONTNEED)",
		 [](verbs::Mapping &m, void *) {
			 CHECK_RC(madvise(m.data(), buf_len, MADV_DONTNEED), 0);
			 std::memset(m.data(), 'B', buf_len);
		 }},
		{"mremap away",
		 [](verbs::Mapping &m, void *at) {
			 void *away =
				 mremap(m.data(), buf_len, buf_len, MREMAP_MAYMOVE | MREMAP_FIXED,
					static_cast<char *>(at) + (uintptr_t{1} << 32));
			 CHECK(away != MAP_FAILED);
			 m.release();
			 munmap(away, buf_len);
			 m = filled(at, 'B');
		 }},
	};
	int slot = 0;
	for (const auto &[name, replace] : ways) {
		void *at = slot_address(slot++);
		auto m = filled(at, 'A');
		p.send(c.c, m);
		CHECK(p.received('A'));
		replace(m, at);
		p.send(c.c, m);
		if (!p.received('B'))
			throw Failure(std::string("after ") + name +
				      ", the peer got the old bytes");
	}
}

// Ways of replacing a buffer's pages that are not munmap, each from a buffer
// set up for it: the peer must get the new bytes every time.
struct Way {
	const char *name;
	std::function<void *(void *at)> make;	// maps buf_len at at, returns it
	std::function<void(void *at)> replace;	// new pages (zeros) there
	std::function<void(void *at)> teardown; // unmaps
};

int memfd_at(void *at)
{
	int fd = memfd_create("regcache-test", 0);
	CHECK(fd >= 0);
	CHECK_RC(ftruncate(fd, buf_len), 0);
	CHECK(mmap(at, buf_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0) ==
	      at);
	return fd;
}

void more_ways_to_free(int policy)
{
	Peer p;
	Cache c(policy);
	std::map<void *, int> fds; // memfd of each slot
	auto anon = [](void *at) {
		CHECK(mmap(at, buf_len, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == at);
		return at;
	};
	auto shm = [](void *at) {
		int id = shmget(IPC_PRIVATE, buf_len, IPC_CREAT | 0600);
		CHECK(id >= 0);
		void *got = shmat(id, at, 0);
		shmctl(id, IPC_RMID, nullptr); // gone at the last detach
		CHECK(got == at);
		return at;
	};
	auto memfd = [&](void *at) {
		fds[at] = memfd_at(at);
		return at;
	};
	auto unmap = [](void *at) { munmap(at, buf_len); };
	auto unmap_memfd = [&](void *at) {
		munmap(at, buf_len);
		close(fds[at]);
	};
	const Way ways[] = {
		{"mmap(MAP_FIXED) over it", anon,
		 [](void *at) {
			 CHECK(mmap(at, buf_len, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at);
		 },
		 unmap},
		{"shmdt, another segment attached there", shm,
		 [&](void *at) {
			 CHECK_RC(shmdt(at), 0);
			 shm(at);
		 },
		 [](void *at) { shmdt(at); }},
		{"memfd ftruncate to 0 and back", memfd,
		 [&](void *at) {
			 CHECK_RC(ftruncate(fds[at], 0), 0);
			 CHECK_RC(ftruncate(fds[at], buf_len), 0);
		 },
		 unmap_memfd},
		{"memfd fallocate(PUNCH_HOLE)", memfd,
		 [&](void *at) {
			 CHECK_RC(fallocate(fds[at], FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
					    buf_len),
				  0);
		 },
		 unmap_memfd},
		{"madvise(MADV_REMOVE) on a memfd", memfd,
		 [](void *at) { CHECK_RC(madvise(at, buf_len, MADV_REMOVE), 0); }, unmap_memfd},
		// No hook on the C library sees these two (issue 39, part 4).
		{"process_madvise(MADV_DONTNEED) on itself", anon,
		 [](void *at) {
			 CHECK_RC(raw_free::process_madvise_self(at, buf_len, MADV_DONTNEED), 0);
		 },
		 unmap},
		{"io_uring IORING_OP_MADVISE(MADV_DONTNEED)", anon,
		 [](void *at) {
			 CHECK_RC(raw_free::madvise_by_io_uring(at, buf_len, MADV_DONTNEED), 0);
		 },
		 unmap},
	};
	int slot = 52;
	for (const auto &w : ways) {
		void *at = w.make(slot_address(slot++));
		std::memset(at, 'A', buf_len);
		p.send_range(c.c, static_cast<std::byte *>(at), buf_len);
		w.replace(at);
		CHECK(std::all_of(static_cast<std::byte *>(at),
				  static_cast<std::byte *>(at) + buf_len,
				  [](std::byte b) { return b == std::byte(0); }));
		std::memset(at, 'B', buf_len);
		try {
			p.send_range(c.c, static_cast<std::byte *>(at), buf_len);
		} catch (const Failure &f) {
			throw Failure(std::string("after ") + w.name + ": " + f.what());
		}
		w.teardown(at);
		std::printf("# %s: new bytes sent\n", w.name);
	}
}

// The program break: a buffer at the top of the heap, given back with
// sbrk(-len) and grown again at the same address (new, zeroed pages). In a
// child, whose malloc is told to leave the break alone (every allocation
// from mmap), so that moving the break cannot cut into its heap.
void brk_shrink_and_grow(int policy)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int rc = 1;
		try {
			CHECK(mallopt(M_MMAP_THRESHOLD, 1) == 1);
			Peer p;
			Cache c(policy);
			const uintptr_t page = sysconf(_SC_PAGESIZE);
			const uintptr_t brk0 = reinterpret_cast<uintptr_t>(sbrk(0));
			CHECK(sbrk((page - brk0 % page) % page) != reinterpret_cast<void *>(-1));
			auto *at = static_cast<std::byte *>(sbrk(buf_len));
			CHECK(at != reinterpret_cast<void *>(-1));
			std::memset(at, 'A', buf_len);
			p.send_range(c.c, at, buf_len);
			CHECK(sbrk(-intptr_t(buf_len)) != reinterpret_cast<void *>(-1));
			CHECK(sbrk(buf_len) == at);
			CHECK(std::all_of(at, at + buf_len,
					  [](std::byte b) { return b == std::byte(0); }));
			std::memset(at, 'B', buf_len);
			p.send_range(c.c, at, buf_len);
			std::printf("# brk at %p: new bytes sent, %lu registrations\n",
				    static_cast<void *>(at),
				    (unsigned long)c.stats().registrations);
			rc = 0;
		} catch (const std::exception &e) {
			std::printf("# child: %s\n", e.what());
		}
		std::fflush(stdout);
		_exit(rc);
	}
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// Huge pages: a hugetlb page replaced whole, and a THP-backed 4 MiB buffer
// whose upper 2 MiB is dropped with MADV_DONTNEED on the 2 MiB boundary.
void huge_pages(int policy)
{
	constexpr size_t huge = 2 << 20;
	Peer p;
	Cache c(policy);
	verbs::Mapping land(2 * huge);
	auto land_mr = verbs::reg_mr(p.pd.get(), land.data(), land.size(),
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	auto send = [&](std::byte *at, size_t len) {
		std::memset(land.data(), 0, len);
		odpwatch_cache_reg *r = nullptr;
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), at, len, local_access, &r), 0);
		auto st = p.qp.rdma_write(odpwatch_cache_reg_mr(r), at, len, land_mr.get(),
					  land.data());
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
		CHECK(st == IBV_WC_SUCCESS);
		CHECK(std::memcmp(land.data(), at, len) == 0);
	};

	auto *h = static_cast<std::byte *>(slot_address(60));
	CHECK(mmap(h, huge, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_FIXED_NOREPLACE, -1, 0) == h);
	std::memset(h, 'h', huge);
	send(h, huge);
	CHECK_RC(madvise(h, huge, MADV_DONTNEED), 0);
	std::memset(h, 'H', huge);
	send(h, huge);
	munmap(h, huge);
	std::printf("# hugetlb 2 MiB page replaced: new bytes sent\n");

	auto *t = static_cast<std::byte *>(slot_address(62));
	CHECK(mmap(t, 2 * huge, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == t);
	CHECK_RC(madvise(t, 2 * huge, MADV_HUGEPAGE), 0);
	std::memset(t, 't', 2 * huge);
	send(t, 2 * huge);
	CHECK_RC(madvise(t + huge, huge, MADV_DONTNEED), 0);
	std::memset(t + huge, 'T', huge);
	send(t, 2 * huge);
	CHECK(land.data()[0] == std::byte('t') && land.data()[2 * huge - 1] == std::byte('T'));
	munmap(t, 2 * huge);
	std::printf("# THP: upper 2 MiB dropped: new bytes sent, lower kept\n");
}

// A registration that fails after the watch was added leaves no watch: the
// kernel's count for the cache's memwatch (fdinfo) stays at the live ones.
void failed_registration()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	auto ok = filled(slot_address(64), 'w');
	p.send(c.c, ok);
	auto watches = [&] {
		const int fd = odpwatch_cache_event_fd(c.c);
		CHECK(fd >= 0);
		std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
		std::string line;
		while (std::getline(info, line))
			if (line.rfind("memwatch-watches:", 0) == 0)
				return std::stoul(line.substr(line.find(':') + 1));
		throw Failure("no memwatch-watches in fdinfo");
	};
	CHECK(watches() == 1);
	// Read-only memory (right above the cached buffer) cannot be
	// registered for local write.
	auto *ro = ok.data() + buf_len;
	CHECK(mmap(ro, buf_len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
		   0) == ro);
	odpwatch_cache_reg *r = nullptr;
	int rc = odpwatch_cache_get(c.c, p.pd.get(), ro, buf_len, local_access, &r);
	std::printf("# get of read-only memory for local write: %d (%s)\n", rc, std::strerror(-rc));
	CHECK(rc < 0);
	CHECK(watches() == 1);
	// Nor a range overlapping the cached one and the read-only one: the
	// union fails, the range alone fails, no watch stays.
	rc = odpwatch_cache_get(c.c, p.pd.get(), ok.data() + buf_len / 2, buf_len, local_access,
				&r);
	std::printf("# get across the cached and the read-only memory: %d\n", rc);
	CHECK(rc < 0);
	CHECK(watches() == 1);
	munmap(ro, buf_len);
	auto s = c.stats();
	CHECK(s.entries == 1 && s.in_use == 0);
}

// Threads free and remap their buffers while the others look theirs up, all
// in one cache and one PD; every transfer must carry the current bytes.
void threads(int policy)
{
	constexpr int nthreads = 4, iterations = 40;
	// Declared after pd, so destroyed before it: its MRs belong to pd
	// (LeakSanitizer found the other order leaking them).
	verbs::Context ctx = verbs::open_device("");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Cache c(policy);
	std::atomic<int> failures{0};
	std::vector<std::string> why(nthreads);
	std::vector<std::thread> ts;
	for (int t = 0; t < nthreads; t++)
		ts.emplace_back([&, t] {
			try {
				verbs::LoopbackQp qp(ctx.get(), pd.get());
				verbs::Mapping dst(buf_len);
				auto dst_mr = verbs::reg_mr(pd.get(), dst.data(), buf_len,
							    IBV_ACCESS_LOCAL_WRITE |
								    IBV_ACCESS_REMOTE_WRITE);
				for (int i = 0; i < iterations; i++) {
					const char fill = static_cast<char>('a' + (t * 7 + i) % 26);
					auto buf = filled(slot_address(1 + t), fill);
					for (int use = 0; use < 2; use++) {
						odpwatch_cache_reg *reg = nullptr;
						CHECK_RC(odpwatch_cache_get(c.c, pd.get(),
									    buf.data(), buf_len,
									    local_access, &reg),
							 0);
						std::memset(dst.data(), 0, buf_len);
						auto st = qp.rdma_write(odpwatch_cache_reg_mr(reg),
									buf.data(), buf_len,
									dst_mr.get(), dst.data());
						CHECK_RC(odpwatch_cache_put(c.c, reg), 0);
						CHECK(st == IBV_WC_SUCCESS);
						CHECK(std::all_of(dst.data(), dst.data() + buf_len,
								  [&](std::byte b) {
									  return b ==
										 std::byte(fill);
								  }));
					}
				}
			} catch (const std::exception &e) {
				why[t] = e.what();
				failures++;
			}
		});
	for (auto &t : ts)
		t.join();
	for (int t = 0; t < nthreads; t++)
		if (!why[t].empty())
			std::printf("# thread %d: %s\n", t, why[t].c_str());
	CHECK(failures == 0);
	auto s = c.stats();
	std::printf("# %s: %lu hits, %lu misses, %lu invalidations, %lu registrations\n",
		    odpwatch_cache_policy_name(policy), (unsigned long)s.hits,
		    (unsigned long)s.misses, (unsigned long)s.invalidations,
		    (unsigned long)s.registrations);
	CHECK(s.in_use == 0);
	CHECK(s.hits >= nthreads * iterations); // every second use of a buffer
	if (policy == ODPWATCH_CACHE_PINNED)
		CHECK(s.invalidations >= nthreads * (iterations - 1));
}

// What the ODP policies must serve: AUTO picks ODP only where the device
// has every operation asked for, per transport; an ODP policy asked for by
// name fails where it does not (rxe: RC with atomics, no XRC).
void odp_needs()
{
	Peer p;
	auto policy_with = [&](int policy, uint32_t rc, uint32_t xrc) {
		odpwatch_cache_attr a{};
		a.policy = policy;
		a.rc_odp_needs = rc;
		a.xrc_odp_needs = xrc;
		odpwatch_cache *c = nullptr;
		CHECK_RC(odpwatch_cache_create(&a, &c), 0);
		int got = odpwatch_cache_policy_of(c, p.pd.get());
		CHECK_RC(odpwatch_cache_destroy(c), 0);
		return got;
	};
	const uint32_t rc_all = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV |
				IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
	CHECK_RC(policy_with(ODPWATCH_CACHE_AUTO, 0, 0), ODPWATCH_CACHE_IMPLICIT_ODP);
	CHECK_RC(policy_with(ODPWATCH_CACHE_AUTO, rc_all | IBV_ODP_SUPPORT_ATOMIC, 0),
		 ODPWATCH_CACHE_IMPLICIT_ODP);
	CHECK_RC(policy_with(ODPWATCH_CACHE_AUTO, 0, IBV_ODP_SUPPORT_SEND), ODPWATCH_CACHE_PINNED);
	CHECK_RC(policy_with(ODPWATCH_CACHE_EXPLICIT_ODP, 0, IBV_ODP_SUPPORT_SEND), -EOPNOTSUPP);
	odpwatch_cache_attr bad{};
	bad.reserved[0] = 1;
	odpwatch_cache *c = nullptr;
	CHECK_RC(odpwatch_cache_create(&bad, &c), -EINVAL);
}

// A get from a thread_local's destructor that runs after the thread's hit
// index was freed: the object was made before the thread's first get, so it
// is destroyed after the index. The get must work, and read no freed memory
// (the sanitizer builds run this case).
void get_at_thread_exit()
{
	verbs::Context ctx = verbs::open_device("");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Cache c(ODPWATCH_CACHE_PINNED);
	auto buf = filled(slot_address(1), 'x');
	std::atomic<int> late_rc{-1}, early_rc{-1};
	auto get_put = [&] {
		odpwatch_cache_reg *reg = nullptr;
		int rc = odpwatch_cache_get(c.c, pd.get(), buf.data(), buf_len, local_access, &reg);
		return rc ? rc : odpwatch_cache_put(c.c, reg);
	};
	struct Late {
		std::function<int()> get_put;
		std::atomic<int> *rc;
		~Late() { rc->store(get_put()); }
	};
	std::thread([&] {
		thread_local Late late{get_put, &late_rc};
		int rc = get_put();		// makes the index, after late
		early_rc = rc ? rc : get_put(); // and a hit through it
	}).join();
	CHECK_RC(early_rc.load(), 0);
	CHECK_RC(late_rc.load(), 0);
	auto s = c.stats();
	CHECK(s.in_use == 0 && s.hits >= 2);
}

// Limits: unused entries are evicted least recently used first; entries in
// use never are.
void limits()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED, 4);
	std::vector<verbs::Mapping> bufs;
	for (int i = 0; i < 8; i++)
		bufs.push_back(filled(slot_address(16 + i), 'x'));
	for (auto &b : bufs)
		p.send(c.c, b);
	auto s = c.stats();
	CHECK(s.entries == 4 && s.evictions == 4);
	// The 4 most recent are cached: using them again hits.
	for (int i = 4; i < 8; i++)
		p.send(c.c, bufs[i]);
	CHECK(c.stats().hits == 4);
	std::vector<odpwatch_cache_reg *> held;
	for (auto &b : bufs) {
		odpwatch_cache_reg *r = nullptr;
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), b.data(), buf_len, local_access, &r),
			 0);
		held.push_back(r);
	}
	s = c.stats();
	CHECK(s.entries == 8 && s.in_use == 8);
	CHECK_RC(odpwatch_cache_destroy(c.c), -EBUSY);
	for (auto *r : held)
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	s = c.stats();
	CHECK(s.entries == 4 && s.in_use == 0);
}

// An implicit ODP registration pins nothing: it counts 0 bytes, and a byte
// limit never evicts it (counted as 2^64 - 1 bytes, it was evicted at every
// last put and registered again at every get).
void implicit_max_bytes()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_IMPLICIT_ODP, 0, 1 << 20);
	auto a = filled(slot_address(32), 'i');
	for (int i = 0; i < 3; i++)
		p.send(c.c, a);
	CHECK(p.received('i'));
	auto s = c.stats();
	std::printf("# %lu registrations, %lu evictions, %lu hits, %lu bytes\n",
		    (unsigned long)s.registrations, (unsigned long)s.evictions,
		    (unsigned long)s.hits, (unsigned long)s.bytes);
	CHECK(s.registrations == 1 && s.evictions == 0 && s.hits == 2);
	CHECK(s.entries == 1 && s.bytes == 0);
}

// Pinned memory is released when the application frees it, through the
// memwatch descriptor, without waiting for a get of that address.
void events()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	CHECK_RC(odpwatch_cache_event_fd(c.c), -ENOENT);
	auto a = filled(slot_address(30), 'e');
	p.send(c.c, a);
	int fd = odpwatch_cache_event_fd(c.c);
	CHECK(fd >= 0);
	pollfd pfd{fd, POLLIN, 0};
	CHECK(poll(&pfd, 1, 0) == 0);
	a.unmap();
	CHECK(poll(&pfd, 1, 1000) == 1 && (pfd.revents & POLLIN));
	CHECK_RC(odpwatch_cache_process_events(c.c), 1);
	CHECK_RC(odpwatch_cache_flush(c.c), 0);
	auto s = c.stats();
	CHECK(s.entries == 0 && s.deregistrations == 1 && s.invalidations == 1);
}

// A kernel without memwatch (a seccomp filter answering the system call
// with ENOSYS), or one that refuses it to this process (EPERM: a container
// runtime's seccomp profile, or vm.unprivileged_memwatch): the pinned
// policy then fails with EOPNOTSUPP, as the man page says (not ENOSYS, not
// the EPERM of a cache used across fork(), and not a crash), the cache
// asks the kernel once and never again, and a cache on demand keeps
// working, its remotely accessible registrations used once, unwatched.
// The filter traps the call, so that the handler can count it.
std::atomic<int> memwatch_calls;
int memwatch_refusal;
void refuse_memwatch(int, siginfo_t *, void *context)
{
	auto *uc = static_cast<ucontext_t *>(context);
	uc->uc_mcontext.gregs[REG_RAX] = -memwatch_refusal;
	memwatch_calls++;
}

void no_memwatch(int refusal)
{
	std::fflush(stdout); // else the child prints the parent's buffer again
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		memwatch_refusal = refusal;
		struct sigaction sa {
		};
		sa.sa_sigaction = refuse_memwatch;
		sa.sa_flags = SA_SIGINFO;
		sock_filter filter[] = {
			BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
			BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ODPWATCH_NR_MEMWATCH_CREATE, 0, 1),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		};
		sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
		if (sigaction(SIGSYS, &sa, nullptr) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
		    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
			_exit(10);
		Peer p;
		auto buf = filled(slot_address(33), 'n');
		{
			Cache c(ODPWATCH_CACHE_PINNED);
			odpwatch_cache_reg *r = nullptr;
			for (int i = 0; i < 2; i++) {
				int rc = odpwatch_cache_get(c.c, p.pd.get(), buf.data(), buf_len,
							    local_access, &r);
				std::printf("# pinned get without memwatch: %d (%s)\n", rc,
					    std::strerror(-rc));
				std::fflush(stdout); // _exit() below flushes nothing
				if (rc != -EOPNOTSUPP)
					_exit(11);
			}
		}
		Cache odp(ODPWATCH_CACHE_EXPLICIT_ODP);
		for (int i = 0; i < 2; i++) {
			odpwatch_cache_reg *r = nullptr;
			if (odpwatch_cache_get(odp.c, p.pd.get(), buf.data(), buf_len,
					       local_access | IBV_ACCESS_REMOTE_WRITE, &r) ||
			    odpwatch_cache_put(odp.c, r))
				_exit(12);
		}
		// Nothing kept: each remote-access registration was used once.
		if (odp.stats().registrations != 2 || odp.stats().entries != 0)
			_exit(13);
		// AUTO on a device without the ODP asked for (rxe has no XRC)
		// and without memwatch: every get registers its own, used once,
		// and a new buffer at the old address sends its own bytes.
		odpwatch_cache_attr a{};
		a.xrc_odp_needs = IBV_ODP_SUPPORT_SEND;
		odpwatch_cache *uncached = nullptr;
		if (odpwatch_cache_create(&a, &uncached))
			_exit(15);
		try {
			p.send(uncached, buf);
			p.send(uncached, buf);
			if (!p.received('n'))
				_exit(16);
			buf.unmap();
			auto again = filled(slot_address(33), 'm');
			p.send(uncached, again);
			if (!p.received('m'))
				_exit(17);
		} catch (const std::exception &e) {
			std::printf("# AUTO without ODP or memwatch: %s\n", e.what());
			std::fflush(stdout);
			_exit(18);
		}
		odpwatch_cache_stats st{};
		odpwatch_cache_query(uncached, &st);
		std::printf(
			"# AUTO without ODP or memwatch: policy %s, %lu registrations, "
			"%lu kept, %lu gets uncached\n",
			odpwatch_cache_policy_name(odpwatch_cache_policy_of(uncached, p.pd.get())),
			(unsigned long)st.registrations, (unsigned long)st.entries,
			(unsigned long)st.uncached);
		if (st.registrations != 3 || st.entries != 0 || st.uncached != 3 ||
		    odpwatch_cache_destroy(uncached))
			_exit(19);
		std::printf("# memwatch_create called %d times\n", memwatch_calls.load());
		std::fflush(stdout);
		// (each Cache asks once: the answer is the process's for good)
		_exit(memwatch_calls == 3 ? 0 : 14);
	}
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// Overlapping and shifted gets of one pd and access: the cache holds one
// registration of their union (ucs_rcache's merge), never two MRs pinning
// the same pages; gets inside it hit; adjacent ranges stay apart.
void overlap(int policy)
{
	constexpr size_t K = 1024;
	Peer p;
	Cache c(policy);
	verbs::Mapping m(4 * buf_len, slot_address(34));
	for (size_t i = 0; i < m.size(); i++)
		m.data()[i] = std::byte(i % 251);
	auto at = [&](size_t off) { return m.data() + off; };
	auto show = [&](const char *what) {
		auto s = c.stats();
		std::printf("# %s: %lu entries, %lu bytes, %lu registrations, %lu hits\n", what,
			    (unsigned long)s.entries, (unsigned long)s.bytes,
			    (unsigned long)s.registrations, (unsigned long)s.hits);
		return s;
	};

	p.send_range(c.c, at(0), 64 * K);
	p.send_range(c.c, at(32 * K), 64 * K);
	auto s = show("[0,64K) then [32K,96K)");
	CHECK(s.entries == 1 && s.bytes == 96 * K && s.registrations == 2 && s.hits == 0);
	p.send_range(c.c, at(16 * K), 64 * K);
	p.send_range(c.c, at(0), 96 * K);
	s = show("[16K,80K) and [0,96K)");
	CHECK(s.hits == 2 && s.registrations == 2);

	p.send_range(c.c, at(96 * K), 32 * K);
	s = show("adjacent [96K,128K)");
	CHECK(s.entries == 2 && s.bytes == 128 * K);

	for (size_t i = 0; i < 8; i++)
		p.send_range(c.c, at(128 * K + i * 8 * K), 64 * K);
	s = show("8 windows shifted by 8K from 128K");
	CHECK(s.entries == 3 && s.bytes == 248 * K);

	// A referenced registration overlapped by a new get: the union takes its
	// place in the cache; the held one stays usable until its put.
	odpwatch_cache_reg *held = nullptr;
	CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), at(96 * K), 32 * K, local_access, &held), 0);
	p.send_range(c.c, at(64 * K), 96 * K);
	s = show("held [96K,128K), then [64K,160K)");
	CHECK(s.entries == 1 && s.bytes == 248 * K && s.in_use == 1);
	std::memset(p.dst.data(), 0, 32 * K);
	CHECK(p.qp.rdma_write(odpwatch_cache_reg_mr(held), at(96 * K), 32 * K, p.dst_mr.get(),
			      p.dst.data()) == IBV_WC_SUCCESS);
	CHECK(std::memcmp(p.dst.data(), at(96 * K), 32 * K) == 0);
	CHECK_RC(odpwatch_cache_put(c.c, held), 0);
	s = show("after its put");
	CHECK(s.entries == 1 && s.in_use == 0);
	p.send_range(c.c, at(8 * K), 240 * K);
	CHECK(c.stats().hits == s.hits + 1);
}

// A union whose neighbour changes while it registers is not registered
// again with the neighbour's range (userspace audit M1). Cached: N = [32K,
// 96K). A get of [0, 64K) registers the union [0, 96K); its first page is
// missing under userfaultfd, and the handler, while the registration waits
// on it, discards N's upper half (an allocator's purge) before it supplies
// the page. N is then stale and the union too: the next attempt must
// register [0, 64K) alone, never pin [64K, 96K) again for nobody.
void union_loses_a_changed_neighbour()
{
	constexpr size_t K = 1024;
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	verbs::Mapping m(96 * K, slot_address(44));
	std::byte *a = m.data();
	std::memset(a + 32 * K, 0x4e, 64 * K); // [0, 32K) stays untouched
	p.send_range(c.c, a + 32 * K, 64 * K);
	CHECK(c.stats().entries == 1 && c.stats().bytes == 64 * K);

	const int uffd = int(syscall(SYS_userfaultfd, O_CLOEXEC));
	CHECK(uffd >= 0);
	uffdio_api api{.api = UFFD_API, .features = 0, .ioctls = 0};
	CHECK(ioctl(uffd, UFFDIO_API, &api) == 0);
	uffdio_register reg{};
	reg.range = {reinterpret_cast<uintptr_t>(a), 32 * K};
	reg.mode = UFFDIO_REGISTER_MODE_MISSING;
	CHECK(ioctl(uffd, UFFDIO_REGISTER, &reg) == 0);
	std::atomic<int> purged{0};
	// The handler owns the descriptor: closing it, on every way out, lets
	// a fault it did not serve go on without it (no hang).
	std::thread handler([&] {
		pollfd pfd{.fd = uffd, .events = POLLIN, .revents = 0};
		uffd_msg msg{};
		if (poll(&pfd, 1, 30000) == 1 && read(uffd, &msg, sizeof(msg)) == sizeof(msg) &&
		    msg.event == UFFD_EVENT_PAGEFAULT) {
			purged = madvise(a + 64 * K, 32 * K, MADV_DONTNEED) == 0 ? 1 : -1;
			uffdio_zeropage zp{};
			zp.range = {reinterpret_cast<uintptr_t>(a), 32 * K};
			ioctl(uffd, UFFDIO_ZEROPAGE, &zp);
		}
		close(uffd);
	});
	odpwatch_cache_reg *r = nullptr;
	const int rc = odpwatch_cache_get(c.c, p.pd.get(), a, 64 * K, local_access, &r);
	handler.join();
	CHECK_RC(rc, 0);
	CHECK(purged == 1);
	auto s = c.stats();
	std::printf("# after the purge: %lu entries, %lu bytes, %lu registrations, "
		    "%lu invalidations\n",
		    (unsigned long)s.entries, (unsigned long)s.bytes,
		    (unsigned long)s.registrations, (unsigned long)s.invalidations);
	CHECK(s.entries == 1 && s.bytes == 64 * K);
	CHECK(odpwatch_cache_reg_mr(r)->length == 64 * K);
	CHECK_RC(odpwatch_cache_put(c.c, r), 0);
}

// Memory freed during a phase of hits is not kept pinned until the next
// miss (userspace audit M2): a 64 MiB buffer registered, put and unmapped,
// then only hits on another buffer, as an application's steady state. Its
// pages must be unpinned within those hits, not at the next miss.
void hits_release_freed_memory()
{
	constexpr size_t big = 64 << 20;
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	verbs::Mapping small = filled(slot_address(45), 0x11);
	p.send(c.c, small); // the buffer the hits go to, registered first
	const size_t before = vm_pin_kib();
	verbs::Mapping m(big, slot_address(46));
	std::memset(m.data(), 0x22, big);
	odpwatch_cache_reg *r = nullptr;
	CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), m.data(), big, local_access, &r), 0);
	CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	CHECK(vm_pin_kib() == before + big / 1024);
	m.unmap();
	for (int i = 0; i < 100000; i++) {
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), small.data(), buf_len, local_access,
					    &r),
			 0);
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	}
	// The reaper deregisters what the hits dropped: give it a moment.
	size_t pinned = vm_pin_kib();
	for (int i = 0; i < 50 && pinned != before; i++) {
		std::this_thread::sleep_for(std::chrono::milliseconds(100));
		pinned = vm_pin_kib();
	}
	auto s = c.stats();
	std::printf("# after 100000 hits: VmPin %zu KiB (%zu before the 64 MiB buffer), "
		    "%lu entries, %lu misses\n",
		    pinned, before, (unsigned long)s.entries, (unsigned long)s.misses);
	CHECK(pinned == before);
	CHECK(s.entries == 1 && s.misses == 2);
	// A hit does not deregister, and 64 MiB is more than the callers'
	// share: the cache's thread did, and says so.
	CHECK(s.deregistrations == 1 && s.deferred == 1);
}

// Runs body() in a child without CAP_IPC_LOCK whose RLIMIT_MEMLOCK is
// @limit bytes; the child's exit status is body's result (0: passed), 20 or
// 21 if the capability or the limit could not be set, 10 if body threw.
void in_memlock_child(size_t limit, const std::function<int()> &body)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int rc = 10;
		try {
			__user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
			__user_cap_data_struct d[2]{};
			if (syscall(SYS_capget, &h, d))
				_exit(20);
			d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
			rlimit lim{limit, limit};
			if (syscall(SYS_capset, &h, d) || setrlimit(RLIMIT_MEMLOCK, &lim))
				_exit(21);
			rc = body();
		} catch (const std::exception &e) {
			std::printf("# child: %s\n", e.what());
		}
		std::fflush(stdout);
		_exit(rc);
	}
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	std::printf("# child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// Registration refused for RLIMIT_MEMLOCK (ENOMEM): the cache drops its
// unused registrations and tries once more, as libfabric's cache does. In a
// child without CAP_IPC_LOCK whose limit holds the peer's buffer and three
// cached ones: the fourth get must succeed by evicting them.
void memlock_retry()
{
	in_memlock_child(dst_len + 3 * buf_len, [] {
		Peer p;
		Cache c(ODPWATCH_CACHE_PINNED);
		std::vector<verbs::Mapping> bufs;
		for (int i = 0; i < 4; i++)
			bufs.push_back(filled(slot_address(36 + i), char('m' + i)));
		for (int i = 0; i < 4; i++) {
			p.send(c.c, bufs[i]);
			if (!p.received(char('m' + i)))
				return 22;
		}
		auto s = c.stats();
		std::printf("# 4 buffers under a limit for 3: %lu entries, %lu evictions\n",
			    (unsigned long)s.entries, (unsigned long)s.evictions);
		return s.entries >= 1 && s.evictions >= 1 ? 0 : 23;
	});
}

// Refused for RLIMIT_MEMLOCK while growing a union, the cache drops what
// the union replaces, not its other registrations: a union is pinned beside
// the entries it covers until it is in, so a union of 192 KiB over one of
// 128 KiB does not fit under a limit that holds the peer's buffer, a 64 KiB
// buffer elsewhere and 256 KiB more. The unrelated buffer must stay cached
// (a hit after). Before, every unused registration went (it too), and
// pin-forever memwatch's largest phase peaked at 89 MiB pinned of 130.
void memlock_union_keeps_others()
{
	in_memlock_child(dst_len + 5 * buf_len, [] {
		constexpr size_t K = 1024;
		Peer p;
		Cache c(ODPWATCH_CACHE_PINNED);
		auto other = filled(slot_address(80), 'o');
		p.send(c.c, other);
		verbs::Mapping m(192 * K, slot_address(81));
		std::byte *a = m.data();
		std::memset(a, 0x55, 192 * K);
		// Each get shares a page with the one before: unions of 128 KiB,
		// then 192 KiB.
		p.send_range(c.c, a, 64 * K);
		p.send_range(c.c, a + 60 * K, 68 * K);
		p.send_range(c.c, a + 124 * K, 68 * K);
		auto s = c.stats();
		std::printf("# after the unions: %lu entries, %lu KiB, %lu merges, %lu "
			    "retries, %lu evictions\n",
			    (unsigned long)s.entries, (unsigned long)(s.bytes / K),
			    (unsigned long)s.merges, (unsigned long)s.retries,
			    (unsigned long)s.evictions);
		const uint64_t misses = s.misses;
		p.send(c.c, other);
		s = c.stats();
		std::printf("# the other buffer again: %s\n",
			    s.misses == misses ? "a hit" : "a miss");
		return s.retries == 1 && s.evictions == 1 && s.entries == 2 &&
				       s.bytes == (192 + 64) * K && s.misses == misses &&
				       p.received('o')
			       ? 0
			       : 23;
	});
}

// Hits through the page index, across its levels: entries that cover a
// whole 2 MiB slot and part of the next, a neighbour, a union that takes
// both their places, a page of it unmapped and mapped again. Every hit must
// come from the entry that holds the range now (its key, no registration),
// and the first get after the change from a new registration.
void page_index()
{
	constexpr size_t K = 1024, M = K * K;
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	verbs::Mapping m(6 * M, slot_address(84)); // 2 MiB aligned
	for (size_t i = 0; i < m.size(); i += 4 * K)
		std::memset(m.data() + i, int(i / (4 * K) % 251), 4 * K);
	auto key = [&](size_t off, size_t len) {
		odpwatch_cache_reg *r = nullptr;
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), m.data() + off, len, local_access, &r),
			 0);
		const uint32_t k = odpwatch_cache_reg_mr(r)->lkey;
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
		return k;
	};
	auto regs = [&] { return c.stats().registrations; };

	const uint32_t a = key(0, 3 * M); // a 2 MiB slot, and half the next
	const uint64_t r = regs();
	for (size_t off : {size_t{0}, 4 * K, 2 * M - 4 * K, 2 * M, 3 * M - 4 * K})
		CHECK(key(off, 4 * K) == a);
	CHECK(regs() == r);
	const uint32_t b = key(3 * M + 4 * K, M - 4 * K);
	CHECK(b != a && key(4 * M - 4 * K, 4 * K) == b && key(3 * M - 4 * K, 4 * K) == a);
	CHECK(regs() == r + 1);

	// Overlapping both: one registration of [0, 4 MiB) in their place.
	const uint32_t u = key(3 * M - 4 * K, 12 * K);
	auto s = c.stats();
	std::printf("# union: %lu entries, %lu KiB, %lu registrations\n", (unsigned long)s.entries,
		    (unsigned long)(s.bytes / K), (unsigned long)s.registrations);
	CHECK(s.entries == 1 && s.bytes == 4 * M && s.registrations == r + 2);
	for (size_t off : {size_t{0}, 2 * M, 3 * M, 4 * M - 4 * K})
		CHECK(key(off, 4 * K) == u);
	CHECK(regs() == r + 2);
	p.send_range(c.c, m.data() + 2 * M - 8 * K, 64 * K);

	// A page of it replaced: the union is stale, from the next get on.
	void *page = m.data() + 2 * M + 8 * K;
	CHECK(mmap(page, 4 * K, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
		   0) == page);
	std::memset(page, 0x7e, 4 * K);
	const uint32_t n = key(0, 4 * K);
	CHECK(n != u && regs() == r + 3);
	CHECK(key(0, 4 * K) == n && regs() == r + 3);
	p.send_range(c.c, m.data() + 2 * M, 64 * K);
	CHECK(regs() == r + 4);
}

// A child of fork() inherits the cache, but its registrations belong to the
// parent's verbs context (one device file shared by both): the child's
// calls fail with EPERM, its destroy forgets the cache without deregistering
// anything, and the parent's cached registration still works afterwards.
void fork_child()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED);
	auto a = filled(slot_address(40), 'f');
	p.send(c.c, a);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		odpwatch_cache_reg *r = nullptr;
		odpwatch_cache_stats s{};
		int got[] = {
			odpwatch_cache_get(c.c, p.pd.get(), a.data(), buf_len, local_access, &r),
			odpwatch_cache_query(c.c, &s),
			odpwatch_cache_flush(c.c),
			odpwatch_cache_process_events(c.c),
			odpwatch_cache_event_fd(c.c),
			odpwatch_cache_policy_of(c.c, p.pd.get()),
		};
		int destroyed = odpwatch_cache_destroy(c.c);
		int bad = 0;
		for (int rc : got)
			bad += rc != -EPERM;
		std::printf("# child: get %d, query %d, flush %d, events %d, fd %d, policy %d, "
			    "destroy %d\n",
			    got[0], got[1], got[2], got[3], got[4], got[5], destroyed);
		std::fflush(stdout);
		_exit(bad || destroyed != 0 ? 1 : 0);
	}
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	std::printf("# child: %s %d\n", WIFEXITED(st) ? "exit" : "signal",
		    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	p.send(c.c, a);
	CHECK(p.received('f'));
	auto s = c.stats();
	CHECK(s.hits == 1 && s.deregistrations == 0);
}

// Limits: 0 takes the finite defaults (1024 registrations, a quarter of the
// memory), UINT64_MAX none; stats say which are in effect.
void default_limits()
{
	const uint64_t quarter = uint64_t(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 4;
	Cache d(ODPWATCH_CACHE_PINNED);
	auto s = d.stats();
	std::printf("# defaults: %lu entries, %lu bytes\n", (unsigned long)s.max_entries,
		    (unsigned long)s.max_bytes);
	CHECK(s.max_entries == 1024 && s.max_bytes == quarter);
	Cache u(ODPWATCH_CACHE_PINNED, UINT64_MAX, UINT64_MAX);
	s = u.stats();
	CHECK(s.max_entries == UINT64_MAX && s.max_bytes == UINT64_MAX);
	Cache l(ODPWATCH_CACHE_PINNED, 7, 1 << 20);
	s = l.stats();
	CHECK(s.max_entries == 7 && s.max_bytes == 1 << 20);
}

// Least recently used goes first: a hit keeps an entry.
void eviction_order()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED, 4);
	std::vector<verbs::Mapping> bufs;
	for (int i = 0; i < 6; i++)
		bufs.push_back(filled(slot_address(42 + i), char('0' + i)));
	for (int i = 0; i < 4; i++)
		p.send(c.c, bufs[i]);
	p.send(c.c, bufs[0]); // a hit: 1 is now the least recently used
	p.send(c.c, bufs[4]); // evicts 1
	p.send(c.c, bufs[5]); // evicts 2
	auto s = c.stats();
	CHECK(s.hits == 1 && s.evictions == 2 && s.entries == 4);
	p.send(c.c, bufs[0]);
	p.send(c.c, bufs[3]);
	CHECK(c.stats().hits == 3);
	p.send(c.c, bufs[1]);
	CHECK(c.stats().hits == 3 && c.stats().misses == 7);
}

// Threads on one buffer while another replaces its pages (mmap MAP_FIXED
// over it, madvise) and a third drains the memwatch events: every get and
// put succeeds, nothing stays referenced, and the next transfer carries
// the newest bytes. Built with ThreadSanitizer, this is the race test of
// the hit path against invalidation, eviction and the reaper.
void churn()
{
	constexpr int workers = 3, replacements = 40;
	verbs::Context ctx = verbs::open_device("");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Cache c(ODPWATCH_CACHE_PINNED, 2);
	auto buf = filled(slot_address(50), 'a');
	void *const at = buf.data();
	std::atomic<bool> stop{false};
	std::atomic<int> failures{0};
	std::atomic<uint64_t> transfers{0};
	std::vector<std::string> why(workers + 2);
	auto guard = [&](int i, auto &&f) {
		return [&, i, f] {
			try {
				f();
			} catch (const std::exception &e) {
				why[i] = e.what();
				failures++;
				stop = true;
			}
		};
	};
	std::vector<std::thread> ts;
	for (int t = 0; t < workers; t++)
		ts.emplace_back(guard(t, [&, t] {
			verbs::LoopbackQp qp(ctx.get(), pd.get());
			verbs::Mapping dst(buf_len);
			auto dst_mr =
				verbs::reg_mr(pd.get(), dst.data(), buf_len,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			// Also a second, shifted range: merges and evictions race too.
			const size_t off = t * 4096;
			while (!stop) {
				odpwatch_cache_reg *r = nullptr;
				CHECK_RC(odpwatch_cache_get(c.c, pd.get(),
							    static_cast<std::byte *>(at) + off,
							    buf_len - off, local_access, &r),
					 0);
				auto st = qp.rdma_write(odpwatch_cache_reg_mr(r),
							static_cast<std::byte *>(at) + off,
							buf_len - off, dst_mr.get(), dst.data());
				CHECK_RC(odpwatch_cache_put(c.c, r), 0);
				CHECK(st == IBV_WC_SUCCESS);
				transfers++;
			}
		}));
	ts.emplace_back(guard(workers, [&] {
		for (int i = 0; i < replacements && !stop; i++) {
			if (i % 2) {
				CHECK(mmap(at, buf_len, PROT_READ | PROT_WRITE,
					   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == at);
			} else {
				CHECK_RC(madvise(at, buf_len, MADV_DONTNEED), 0);
			}
			std::memset(at, 'b' + i % 20, buf_len);
			std::this_thread::sleep_for(std::chrono::milliseconds(2));
		}
		stop = true;
	}));
	ts.emplace_back(guard(workers + 1, [&] {
		while (!stop) {
			int fd = odpwatch_cache_event_fd(c.c);
			if (fd < 0) {
				std::this_thread::sleep_for(std::chrono::milliseconds(1));
				continue;
			}
			pollfd pfd{fd, POLLIN, 0};
			if (poll(&pfd, 1, 5) == 1)
				CHECK(odpwatch_cache_process_events(c.c) >= 0);
		}
	}));
	for (auto &t : ts)
		t.join();
	for (size_t i = 0; i < why.size(); i++)
		if (!why[i].empty())
			std::printf("# thread %zu: %s\n", i, why[i].c_str());
	CHECK(failures == 0);
	auto s = c.stats();
	std::printf("# %lu transfers, %lu hits, %lu misses, %lu invalidations, %lu evictions\n",
		    (unsigned long)transfers.load(), (unsigned long)s.hits, (unsigned long)s.misses,
		    (unsigned long)s.invalidations, (unsigned long)s.evictions);
	CHECK(s.in_use == 0 && s.invalidations > 0);
	verbs::LoopbackQp qp(ctx.get(), pd.get());
	verbs::Mapping dst(buf_len);
	auto dst_mr = verbs::reg_mr(pd.get(), dst.data(), buf_len,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	std::memset(at, 'z', buf_len);
	odpwatch_cache_reg *r = nullptr;
	CHECK_RC(odpwatch_cache_get(c.c, pd.get(), at, buf_len, local_access, &r), 0);
	auto st = qp.rdma_write(odpwatch_cache_reg_mr(r), at, buf_len, dst_mr.get(), dst.data());
	CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	CHECK(st == IBV_WC_SUCCESS);
	CHECK(std::all_of(dst.data(), dst.data() + buf_len,
			  [](std::byte b) { return b == std::byte('z'); }));
}

// Each thread keeps an index of its recent hits, which outlives the caches
// it names: a cache made after another was destroyed (often at the same
// address, as the allocator hands it out again) must not take the old one's
// entries from it. Each cache registers the buffer once, then hits.
void new_cache_at_the_same_address()
{
	Peer p;
	auto buf = filled(slot_address(60), 'q');
	const odpwatch_cache *first = nullptr;
	int same = 0;
	for (int round = 0; round < 3; round++) {
		Cache c(ODPWATCH_CACHE_PINNED);
		if (!round)
			first = c.c;
		same += c.c == first;
		p.send(c.c, buf);
		p.send(c.c, buf);
		auto s = c.stats();
		CHECK(s.misses == 1 && s.hits == 1 && s.registrations == 1);
		CHECK(p.received('q'));
	}
	std::printf("# %d of 3 caches at the first one's address\n", same);
}

void bad_input()
{
	odpwatch_cache *c = nullptr;
	odpwatch_cache_attr a{};
	a.reserved[1] = 1;
	CHECK_RC(odpwatch_cache_create(&a, &c), -EINVAL);
	a = {};
	a.flags = 1;
	CHECK_RC(odpwatch_cache_create(&a, &c), -EINVAL);
	a = {};
	a.policy = 9;
	CHECK_RC(odpwatch_cache_create(&a, &c), -EINVAL);
	CHECK_RC(odpwatch_cache_create(nullptr, nullptr), -EINVAL);

	Peer p;
	Cache cache(ODPWATCH_CACHE_PINNED);
	auto buf = filled(slot_address(31), 'z');
	odpwatch_cache_reg *r = nullptr;
	CHECK_RC(odpwatch_cache_get(cache.c, p.pd.get(), buf.data(), 0, local_access, &r), -EINVAL);
	CHECK_RC(odpwatch_cache_get(cache.c, nullptr, buf.data(), 8, local_access, &r), -EINVAL);
	CHECK_RC(odpwatch_cache_get(cache.c, p.pd.get(),
				    reinterpret_cast<void *>(~uintptr_t{0} - 8), 64, local_access,
				    &r),
		 -EINVAL);
	// Memory that is not mapped cannot be registered.
	CHECK_RC(odpwatch_cache_get(cache.c, p.pd.get(), slot_address(40), 4096, local_access, &r),
		 -EFAULT);
	CHECK_RC(odpwatch_cache_get(cache.c, p.pd.get(), buf.data(), 8, local_access, &r), 0);
	CHECK_RC(odpwatch_cache_put(cache.c, r), 0);
	CHECK_RC(odpwatch_cache_put(cache.c, r), -EINVAL); // a second put
	CHECK_RC(odpwatch_cache_put(cache.c, nullptr), -EINVAL);
	// Put to another cache (audit M4): refused, the owner's reference kept.
	Cache other(ODPWATCH_CACHE_PINNED);
	CHECK_RC(odpwatch_cache_get(cache.c, p.pd.get(), buf.data(), 8, local_access, &r), 0);
	CHECK_RC(odpwatch_cache_put(other.c, r), -EINVAL);
	CHECK(cache.stats().in_use == 1);
	CHECK_RC(odpwatch_cache_put(cache.c, r), 0);
	CHECK(cache.stats().in_use == 0);
	CHECK(odpwatch_cache_reg_mr(nullptr) == nullptr);
	CHECK_RC(odpwatch_cache_query(cache.c, nullptr), -EINVAL);
	CHECK(std::string(odpwatch_cache_policy_name(42)) == "unknown");
}

// Audit M4: one get put twice while another get of the same registration
// is held. One reference count for every holder cannot tell that second put
// from the other holder's: it dropped their reference, and the next miss
// over the limit deregistered the MR they were still posting with.
void double_put()
{
	Peer p;
	Cache c(ODPWATCH_CACHE_PINNED, 1); // a miss evicts every unreferenced entry
	auto buf = filled(slot_address(33), 'd');
	auto other = filled(slot_address(34), 'o');
	odpwatch_cache_reg *mine = nullptr, *theirs = nullptr;
	CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), buf.data(), buf_len, local_access, &mine), 0);
	CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), buf.data(), buf_len, local_access, &theirs),
		 0);
	CHECK(odpwatch_cache_reg_mr(mine) == odpwatch_cache_reg_mr(theirs));
	CHECK_RC(odpwatch_cache_put(c.c, mine), 0);
	CHECK_RC(odpwatch_cache_put(c.c, mine), -EINVAL);
	CHECK(odpwatch_cache_reg_mr(mine) == nullptr); // a put handle gives no MR
	CHECK(c.stats().in_use == 1);
	// Gets and puts since, on this thread and on others, do not make the
	// handle valid again, though they reuse its slot.
	for (int i = 0; i < 4; i++)
		p.send(c.c, other);
	for (int i = 0; i < 2000; i++) {
		odpwatch_cache_reg *r = nullptr;
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), other.data(), buf_len, local_access,
					    &r),
			 0);
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	}
	CHECK_RC(odpwatch_cache_put(c.c, mine), -EINVAL);
	// Deregistrations that were slow lately go to the cache's thread, which
	// shelves their memory when it gets to them: wait for it, so that the
	// shells are in a known order (moved's on top after its put).
	CHECK_RC(odpwatch_cache_flush(c.c), 0);
	odpwatch_cache_reg *moved = nullptr;
	CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), other.data(), buf_len, local_access, &moved),
		 0);
	std::atomic<int> rc{1};
	std::thread([&] { rc = odpwatch_cache_put(c.c, moved); }).join();
	CHECK_RC(rc.load(), 0);
	CHECK_RC(odpwatch_cache_flush(c.c), 0);
	CHECK_RC(odpwatch_cache_put(c.c, moved), -EINVAL);
	CHECK_RC(odpwatch_cache_put(c.c, mine), -EINVAL);
	// More holders at once than an entry tracks (24): the rest hold
	// untracked references, which still count, and all go back. The first
	// get is a miss whose entry takes the memory and the holder bit of
	// moved's, evicted at its put (1-entry limit): moved is of another life.
	std::vector<odpwatch_cache_reg *> many(40);
	for (auto &r : many) {
		CHECK_RC(odpwatch_cache_get(c.c, p.pd.get(), other.data(), buf_len, local_access,
					    &r),
			 0);
		if (&r == &many.front()) {
			CHECK((reinterpret_cast<uintptr_t>(r) & 0xffff'ffff'ffff) ==
			      (reinterpret_cast<uintptr_t>(moved) & 0xffff'ffff'ffff));
			CHECK_RC(odpwatch_cache_put(c.c, moved), -EINVAL);
			CHECK(odpwatch_cache_reg_mr(moved) == nullptr);
			CHECK(odpwatch_cache_reg_mr(r) != nullptr);
		}
	}
	for (auto *r : many)
		CHECK_RC(odpwatch_cache_put(c.c, r), 0);
	CHECK_RC(odpwatch_cache_put(c.c, many.front()), -EINVAL);
	CHECK_RC(odpwatch_cache_put(c.c, many.back()), -EINVAL);
	CHECK(c.stats().in_use == 1); // theirs
	CHECK_RC(odpwatch_cache_flush(c.c), 0);
	// Theirs is still registered: its bytes go out through it.
	std::memset(p.dst.data(), 0, buf_len);
	CHECK(p.qp.rdma_write(odpwatch_cache_reg_mr(theirs), buf.data(), buf_len, p.dst_mr.get(),
			      p.dst.data()) == IBV_WC_SUCCESS);
	CHECK(p.received('d'));
	CHECK_RC(odpwatch_cache_put(c.c, theirs), 0);
	CHECK(c.stats().in_use == 0);
}

const std::map<std::string, std::function<void()>> cases = {
	{"double-put", double_put},
	{"reuse-pinned", [] { reuse(ODPWATCH_CACHE_PINNED); }},
	{"reuse-explicit-odp", [] { reuse(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"reuse-implicit-odp", [] { reuse(ODPWATCH_CACHE_IMPLICIT_ODP); }},
	{"ways-to-free-pinned", [] { ways_to_free(ODPWATCH_CACHE_PINNED); }},
	{"ways-to-free-explicit-odp", [] { ways_to_free(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"ways-to-free-implicit-odp", [] { ways_to_free(ODPWATCH_CACHE_IMPLICIT_ODP); }},
	{"threads-pinned", [] { threads(ODPWATCH_CACHE_PINNED); }},
	{"threads-explicit-odp", [] { threads(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"threads-implicit-odp", [] { threads(ODPWATCH_CACHE_IMPLICIT_ODP); }},
	{"limits", limits},
	{"implicit-max-bytes", implicit_max_bytes},
	{"events", events},
	{"bad-input", bad_input},
	{"no-memwatch", [] { no_memwatch(ENOSYS); }},
	{"memwatch-refused", [] { no_memwatch(EPERM); }},
	{"overlap-pinned", [] { overlap(ODPWATCH_CACHE_PINNED); }},
	{"overlap-explicit-odp", [] { overlap(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"memlock-retry", memlock_retry},
	{"memlock-union-keeps-others", memlock_union_keeps_others},
	{"page-index", page_index},
	{"union-loses-a-changed-neighbour", union_loses_a_changed_neighbour},
	{"hits-release-freed-memory", hits_release_freed_memory},
	{"fork-child", fork_child},
	{"default-limits", default_limits},
	{"eviction-order", eviction_order},
	{"churn", churn},
	{"new-cache-at-the-same-address", new_cache_at_the_same_address},
	{"more-ways-to-free-pinned", [] { more_ways_to_free(ODPWATCH_CACHE_PINNED); }},
	{"more-ways-to-free-explicit-odp", [] { more_ways_to_free(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"more-ways-to-free-implicit-odp", [] { more_ways_to_free(ODPWATCH_CACHE_IMPLICIT_ODP); }},
	{"huge-pages-pinned", [] { huge_pages(ODPWATCH_CACHE_PINNED); }},
	{"huge-pages-explicit-odp", [] { huge_pages(ODPWATCH_CACHE_EXPLICIT_ODP); }},
	{"failed-registration", failed_registration},
	{"get-at-thread-exit", get_at_thread_exit},
	{"odp-needs", odp_needs},
	{"brk-pinned", [] { brk_shrink_and_grow(ODPWATCH_CACHE_PINNED); }},
	{"brk-explicit-odp", [] { brk_shrink_and_grow(ODPWATCH_CACHE_EXPLICIT_ODP); }},
};

} // namespace

// A race and a use after free the sanitizer builds must report (pytest
// checks they do, so a clean sanitizer run means something).
int canary()
{
	int shared = 0;
	std::thread a([&] { shared++; }), b([&] { shared++; });
	a.join();
	b.join();
	static int *volatile stash;
	stash = new int(shared);
	delete stash;
	return *stash == 42;
}

int main(int argc, char **argv)
{
	std::vector<std::string> names(argv + 1, argv + argc);
	if (names.size() == 1 && names[0] == "--canary")
		return canary();
	if (names.size() == 1 && names[0] == "--list") {
		for (auto &[n, f] : cases)
			std::printf("%s\n", n.c_str());
		return 0;
	}
	if (names.empty())
		for (auto &[n, f] : cases)
			names.push_back(n);
	std::printf("TAP version 13\n1..%zu\n", names.size());
	int failed = 0, i = 0;
	for (auto &n : names) {
		i++;
		auto it = cases.find(n);
		if (it == cases.end()) {
			std::printf("not ok %d %s # no such case\n", i, n.c_str());
			failed++;
			continue;
		}
		try {
			it->second();
			std::printf("ok %d %s\n", i, n.c_str());
		} catch (const std::exception &e) {
			std::printf("# %s\nnot ok %d %s\n", e.what(), i, n.c_str());
			failed++;
		}
		std::fflush(stdout);
	}
	return failed ? 1 : 0;
}
