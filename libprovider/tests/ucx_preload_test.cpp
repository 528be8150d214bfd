// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ucx-preload.so's own paths, without UCX: this program stands in
// for UCX's ucm (it defines ucm_vm_munmap(), which the preload finds first,
// and records the ranges it is handed), registers buffers on rxe0 with
// ibv_reg_mr() (which the preload interposes), changes them with raw system
// calls and calls odpwatch_ucx_preload_sync(), what the preload does before
// each UCP call.
//   LD_PRELOAD=libodpwatch-ucx-preload.so ucx-preload-test CASE
// CASE: unmap (the changed buffer's range, once, and nothing else), overflow
// (run with ODPWATCH_UCX_QUEUE=1: every changed range after the queue
// overflowed), unwatched (run under vm.memwatch_max_overlap=1: the second
// registration of a range is handed over at the next sync though nothing
// changed), on-demand (no watch, nothing handed over), dereg (a deregistered
// buffer's unmap is no news), fork (a child registers and is told on its
// own descriptor; the parent's still works).
// Prints "ucx-preload-test: CASE ok" and exits 0, or says what went wrong
// and exits 1.
#include "verbs.hpp"

#include <odpwatch/ucx_preload.h>

#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace
{

namespace verbs = odpwatch::verbs;

constexpr size_t len = 64 << 10;

std::mutex told_lock;
std::vector<std::pair<uintptr_t, size_t>> told; // what the preload handed "UCX"

[[noreturn]] void fail(const std::string &what)
{
	std::fprintf(stderr, "ucx-preload-test: %s\n", what.c_str());
	std::exit(1);
}

void expect(bool ok, const std::string &what)
{
	if (!ok)
		fail(what);
}

// The preload's own calls, found at run time: it is preloaded, not linked.
template <typename Fn> Fn preload_symbol(const char *name)
{
	void *sym = dlsym(RTLD_DEFAULT, name);
	if (!sym)
		fail(std::string(name) + " not found: is libodpwatch-ucx-preload.so preloaded?");
	return reinterpret_cast<Fn>(sym);
}

std::vector<std::pair<uintptr_t, size_t>> sync_and_take()
{
	static const auto sync =
		preload_symbol<decltype(&odpwatch_ucx_preload_sync)>("odpwatch_ucx_preload_sync");
	sync();
	std::lock_guard g(told_lock);
	return std::exchange(told, {});
}

odpwatch_ucx_stats stats()
{
	static const auto get =
		preload_symbol<decltype(&odpwatch_ucx_preload_stats)>("odpwatch_ucx_preload_stats");
	odpwatch_ucx_stats s{};
	expect(get(&s) == 0, "odpwatch_ucx_preload_stats failed");
	return s;
}

std::string ranges(const std::vector<std::pair<uintptr_t, size_t>> &v)
{
	std::string s;
	for (const auto &[a, l] : v)
		s += " " + std::to_string(a) + "+" + std::to_string(l);
	return s.empty() ? " none" : s;
}

// Anonymous memory nobody else uses, touched so the registration pins it.
void *map_buffer()
{
	void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	expect(p != MAP_FAILED, "mmap failed");
	std::memset(p, 1, len);
	return p;
}

void raw_munmap(void *p)
{
	expect(syscall(SYS_munmap, p, len) == 0, "munmap failed");
}

struct Device {
	verbs::Context ctx = verbs::open_device("rxe0");
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	// Not verbs::reg_mr: the test deregisters by hand, when a case says.
	ibv_mr *reg(void *p, unsigned access = IBV_ACCESS_LOCAL_WRITE)
	{
		ibv_mr *mr = ibv_reg_mr(pd.get(), p, len, access);
		expect(mr, std::string("ibv_reg_mr failed: ") + std::strerror(errno));
		return mr;
	}
};

bool told_exactly(const std::vector<std::pair<uintptr_t, size_t>> &got,
		  std::initializer_list<void *> bufs)
{
	if (got.size() != bufs.size())
		return false;
	for (void *b : bufs) {
		bool found = false;
		for (const auto &[a, l] : got)
			found |= a == uintptr_t(b) && l == len;
		if (!found)
			return false;
	}
	return true;
}

void unmap_case(Device &dev)
{
	void *a = map_buffer(), *b = map_buffer(), *c = map_buffer();
	ibv_mr *ma = dev.reg(a), *mb = dev.reg(b), *mc = dev.reg(c);
	expect(sync_and_take().empty(), "a range handed over before any change");
	raw_munmap(b);
	auto got = sync_and_take();
	expect(told_exactly(got, {b}), "after b's unmap, handed over:" + ranges(got));
	got = sync_and_take();
	expect(got.empty(), "handed over again:" + ranges(got));
	expect(stats().watched == 3, "not 3 watches");
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	ibv_dereg_mr(mc);
	raw_munmap(a);
	raw_munmap(c);
}

void overflow_case(Device &dev)
{
	void *bufs[3] = {map_buffer(), map_buffer(), map_buffer()};
	ibv_mr *mrs[3];
	for (int i = 0; i < 3; i++)
		mrs[i] = dev.reg(bufs[i]);
	for (void *b : bufs)
		raw_munmap(b);
	const auto got = sync_and_take();
	expect(told_exactly(got, {bufs[0], bufs[1], bufs[2]}),
	       "after 3 unmaps with a queue of 1, handed over:" + ranges(got));
	expect(stats().overflows >= 1, "no overflow counted");
	for (ibv_mr *mr : mrs)
		ibv_dereg_mr(mr);
}

void unwatched_case(Device &dev)
{
	void *a = map_buffer();
	ibv_mr *first = dev.reg(a), *second = dev.reg(a);
	const auto s = stats();
	expect(s.watched == 1 && s.unwatched == 1,
	       "watched " + std::to_string(s.watched) + " unwatched " +
		       std::to_string(s.unwatched) + ", not 1 and 1");
	auto got = sync_and_take();
	expect(told_exactly(got, {a}), "the unwatched registration, handed over:" + ranges(got));
	got = sync_and_take();
	expect(got.empty(), "handed over again:" + ranges(got));
	ibv_dereg_mr(second);
	ibv_dereg_mr(first);
	raw_munmap(a);
}

void on_demand_case(Device &dev)
{
	void *a = map_buffer();
	ibv_mr *mr = dev.reg(a, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	const auto s = stats();
	expect(s.on_demand == 1 && s.watched == 0, "an on-demand registration was watched");
	raw_munmap(a);
	const auto got = sync_and_take();
	expect(got.empty(), "on demand, handed over:" + ranges(got));
	ibv_dereg_mr(mr);
}

void dereg_case(Device &dev)
{
	void *a = map_buffer();
	ibv_dereg_mr(dev.reg(a));
	raw_munmap(a);
	const auto got = sync_and_take();
	expect(got.empty(), "a deregistered buffer's unmap, handed over:" + ranges(got));
	expect(stats().deregistrations == 1, "no deregistration counted");
}

void fork_case(Device &dev)
{
	void *a = map_buffer();
	ibv_mr *ma = dev.reg(a);
	const pid_t pid = fork();
	expect(pid >= 0, "fork failed");
	if (pid == 0) {
		// The child's own device and descriptor: the parent's state
		// area is not inherited.
		Device child;
		void *c = map_buffer();
		ibv_mr *mc = child.reg(c);
		raw_munmap(c);
		const auto got = sync_and_take();
		expect(told_exactly(got, {c}), "in the child, handed over:" + ranges(got));
		ibv_dereg_mr(mc);
		std::exit(0);
	}
	int status = 0;
	expect(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status),
	       "the child failed");
	raw_munmap(a);
	const auto got = sync_and_take();
	expect(told_exactly(got, {a}), "in the parent after the child, handed over:" + ranges(got));
	ibv_dereg_mr(ma);
}

} // namespace

// UCX's call for an unmap it did not see, here only recorded.
extern "C" __attribute__((visibility("default"))) void ucm_vm_munmap(void *addr, size_t length)
{
	std::lock_guard g(told_lock);
	told.emplace_back(uintptr_t(addr), length);
}

int main(int argc, char **argv)
{
	const std::string_view c = argc == 2 ? argv[1] : "";
	void (*const run)(Device &) = c == "unmap"	 ? unmap_case
				      : c == "overflow"	 ? overflow_case
				      : c == "unwatched" ? unwatched_case
				      : c == "on-demand" ? on_demand_case
				      : c == "dereg"	 ? dereg_case
				      : c == "fork"	 ? fork_case
							 : nullptr;
	if (!run) {
		std::fprintf(stderr, "usage: ucx-preload-test "
				     "unmap|overflow|unwatched|on-demand|dereg|fork\n");
		return 2;
	}
	try {
		Device dev;
		run(dev);
	} catch (const verbs::Error &e) {
		fail(e.what());
	}
	std::printf("ucx-preload-test: %.*s ok\n", int(c.size()), c.data());
	return 0;
}
