// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// End-to-end tests of the registration cache through its C ABI, with real
// RDMA traffic on rxe: regcache-test [CASE...] (no argument: all cases;
// --list: their names).
// Prints KTAP; exits non-zero if any case fails.
#include "check.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace odpwatch;
using odpwatch::test::Failure;

namespace
{

constexpr size_t buf_len = 64 * 1024;
constexpr unsigned local_access = IBV_ACCESS_LOCAL_WRITE;

// Fixed addresses far from anything else, so a freed buffer's successor
// lands at the same address, as malloc would put it.
void *slot_address(int slot)
{
	return reinterpret_cast<void *>((uintptr_t{3} << 40) + slot * (uintptr_t{1} << 24));
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
	verbs::Mapping dst{buf_len};
	verbs::Mr dst_mr = verbs::reg_mr(pd.get(), dst.data(), buf_len,
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

// Threads free and remap their buffers while the others look theirs up, all
// in one cache and one PD; every transfer must carry the current bytes.
void threads(int policy)
{
	constexpr int nthreads = 4, iterations = 40;
	Cache c(policy);
	verbs::Context ctx = verbs::open_device("");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
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

// A kernel without memwatch, played by a seccomp filter that answers the
// system call with ENOSYS: the pinned policy then fails with EOPNOTSUPP, as
// the man page says (not ENOSYS, and not a crash).
void no_memwatch()
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		sock_filter filter[] = {
			BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
			BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ODPWATCH_NR_MEMWATCH_CREATE, 0, 1),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
			BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		};
		sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
		    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
			_exit(10);
		Peer p;
		Cache c(ODPWATCH_CACHE_PINNED);
		auto buf = filled(slot_address(33), 'n');
		odpwatch_cache_reg *r = nullptr;
		int rc = odpwatch_cache_get(c.c, p.pd.get(), buf.data(), buf_len, local_access, &r);
		std::printf("# pinned get without memwatch: %d (%s)\n", rc, std::strerror(-rc));
		_exit(rc == -EOPNOTSUPP ? 0 : 11);
	}
	int st = 0;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

void bad_input()
{
	odpwatch_cache *c = nullptr;
	odpwatch_cache_attr a{};
	a.reserved[2] = 1;
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
	CHECK(odpwatch_cache_reg_mr(nullptr) == nullptr);
	CHECK_RC(odpwatch_cache_query(cache.c, nullptr), -EINVAL);
	CHECK(std::string(odpwatch_cache_policy_name(42)) == "unknown");
}

const std::map<std::string, std::function<void()>> cases = {
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
	{"no-memwatch", no_memwatch},
};

} // namespace

int main(int argc, char **argv)
{
	std::vector<std::string> names(argv + 1, argv + argc);
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
