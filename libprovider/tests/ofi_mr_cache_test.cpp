// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libfabric's own MR cache (verbs provider, fi_mr_reg/fi_close), under the
// monitor libfabric runs: the one FI_MR_CACHE_MONITOR names, or memwatch
// (--import, or LD_PRELOAD=libodpwatch-ofi-preload.so).
//   ofi-mr-cache-test [--import] [--iterations N] CASE
// CASE: reuse (the same buffer again: a hit returns the cached MR, same key)
// or a way of replacing the buffer at its address between two fi_mr_reg:
// munmap (libc), syscall-munmap (raw system calls, as the Go runtime and
// some allocators do), madvise (MADV_DONTNEED). A registration returned
// with the old key after the pages changed is stale: the device would move
// the old pages' bytes.
// Prints "result CASE MONITOR stale=S hits=H iterations=N"; exits 0 when it
// could measure, whatever it measured (pytest judges the numbers).
// CASE reuse-late-records: reuse, with the monitor's event thread late: the
// process runs on one CPU under SCHED_FIFO, so that thread reads the record
// of the last iteration's munmap only when this one sleeps, between its two
// registrations, after the first has replaced the stale entry with a new one
// at the same address. A monitor that acts on a record whose region is gone
// flushes the newcomer, and the second registration misses.
// CASE fork: after a hit in the parent, a child of fork() opens its own
// domain; the memwatch monitor refuses its regions (the descriptor is the
// parent's), so the child registers uncached: "result fork ... hits=" counts
// the child's hits, "refused=" the child's refused subscribes.
// CASE fork-close: a child closes the domain it inherited (see
// fork_close_case()).
// CASE fork-inherited: a child registers, on the domain it inherited, an
// address the parent has cached (see fork_inherited_case()).
#include <odpwatch/ofi_monitor.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace
{

constexpr size_t kLen = 1 << 20;
// Far from the heap and the mmap area, so the next mapping lands there.
void *const kAt = reinterpret_cast<void *>(uintptr_t{0x5a00'0000'0000});

struct Error : std::runtime_error {
	Error(const std::string &what, int ret)
	    : std::runtime_error(what + ": " + fi_strerror(-ret))
	{
	}
};

template <class T> struct FidCloser {
	void operator()(T *p) const noexcept { fi_close(&p->fid); }
};
template <class T> using Fid = std::unique_ptr<T, FidCloser<T>>;

struct InfoFree {
	void operator()(fi_info *i) const noexcept { fi_freeinfo(i); }
};

// A verbs domain on the first RDMA device, as an MPI library opens one.
class Domain
{
public:
	Domain()
	{
		std::unique_ptr<fi_info, InfoFree> hints(fi_allocinfo());
		hints->caps = FI_MSG | FI_RMA;
		hints->ep_attr->type = FI_EP_MSG;
		hints->domain_attr->mr_mode =
			FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
		hints->fabric_attr->prov_name = strdup("verbs");
		fi_info *got = nullptr;
		if (int ret = fi_getinfo(FI_VERSION(1, 18), nullptr, nullptr, 0, hints.get(), &got))
			throw Error("fi_getinfo(verbs)", ret);
		info_.reset(got);
		fid_fabric *fab = nullptr;
		if (int ret = fi_fabric(info_->fabric_attr, &fab, nullptr))
			throw Error("fi_fabric", ret);
		fabric_.reset(fab);
		fid_domain *dom = nullptr;
		if (int ret = fi_domain(fabric_.get(), info_.get(), &dom, nullptr))
			throw Error("fi_domain", ret);
		domain_.reset(dom);
	}
	// Registers [addr, addr + kLen) through the domain's MR cache.
	Fid<fid_mr> reg(void *addr)
	{
		fid_mr *mr = nullptr;
		if (int ret = fi_mr_reg(domain_.get(), addr, kLen,
					FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ |
						FI_REMOTE_WRITE,
					0, 0, 0, &mr, nullptr))
			throw Error("fi_mr_reg", ret);
		return Fid<fid_mr>(mr);
	}
	const char *device() const { return info_->domain_attr->name; }
	// Closes the domain (its MR cache, and the monitor with the last cache).
	void close()
	{
		domain_.reset();
		fabric_.reset();
	}

private:
	std::unique_ptr<fi_info, InfoFree> info_;
	Fid<fid_fabric> fabric_;
	Fid<fid_domain> domain_;
};

void *map_at(void *at, bool raw)
{
	const int prot = PROT_READ | PROT_WRITE,
		  flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
	void *p = raw ? reinterpret_cast<void *>(syscall(SYS_mmap, at, kLen, prot, flags, -1, 0))
		      : mmap(at, kLen, prot, flags, -1, 0);
	if (p != at)
		throw std::runtime_error(std::string("mmap at the slot: ") + std::strerror(errno));
	std::memset(p, 'a', kLen);
	return p;
}

// How each case replaces the buffer (or not) between two registrations.
const std::map<std::string_view, std::function<void(void *)>> kCases = {
	{"reuse", [](void *) {}},
	{"reuse-late-records", [](void *) { usleep(200 * 1000); }},
	{"fork", [](void *) {}},
	{"fork-close", [](void *) {}},
	{"fork-inherited", [](void *) {}},
	{"munmap",
	 [](void *p) {
		 munmap(p, kLen);
		 map_at(p, false);
	 }},
	{"syscall-munmap",
	 [](void *p) {
		 syscall(SYS_munmap, p, kLen);
		 map_at(p, true);
	 }},
	{"madvise",
	 [](void *p) {
		 madvise(p, kLen, MADV_DONTNEED);
		 std::memset(p, 'b', kLen);
	 }},
};

// Registers the same buffer twice; true if the second was a cache hit.
bool hit_twice(Domain &d)
{
	void *p = map_at(kAt, false);
	auto first = d.reg(p);
	auto second = d.reg(p);
	const bool hit = fi_mr_key(second.get()) == fi_mr_key(first.get());
	second.reset();
	first.reset();
	munmap(p, kLen);
	return hit;
}

int fork_case(Domain &d)
{
	const bool parent_hit = hit_twice(d);
	std::fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		throw std::runtime_error("fork");
	if (pid == 0) {
		try {
			Domain child;
			const bool hit = hit_twice(child);
			odpwatch_ofi_stats s{};
			odpwatch_ofi_monitor_stats(&s);
			std::printf("result fork child hits=%d refused=%lu\n", hit ? 1 : 0,
				    (unsigned long)s.refused);
			std::fflush(stdout);
			_exit(0);
		} catch (const std::exception &e) {
			std::fprintf(stderr, "ofi-mr-cache-test (child): %s\n", e.what());
			_exit(1);
		}
	}
	int st = 0;
	waitpid(pid, &st, 0);
	std::printf("result fork parent hits=%d child-exit=%d\n", parent_hit ? 1 : 0,
		    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	// The parent's cache still works after the child is gone.
	std::printf("result fork parent-after hits=%d\n", hit_twice(d) ? 1 : 0);
	return 0;
}

// CASE fork-close: a child of fork() closes the domain it inherited, which
// stops the monitor in the child; it must exit (within 30 s), and the
// parent's monitor must go on reading events: an munmap of a region cached
// after the child is gone is counted ("parent-events=" > 0). The child's
// close deregisters the inherited MRs and frees the PD through the uverbs
// file it shares with the parent (verbs objects belong to the file, not to
// a process), so the parent caches the region in a domain of its own, and
// leaves without closing the one the child destroyed.
int fork_close_case(Domain &d)
{
	hit_twice(d);
	std::fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		throw std::runtime_error("fork");
	if (pid == 0) {
		alarm(30);
		d.close();
		_exit(0);
	}
	// -1 (reported as 255) unless waitpid reports the child.
	int st = -1, waited = 0;
	while (waitpid(pid, &st, WNOHANG) == 0 && waited++ < 600)
		usleep(100 * 1000);
	if (waited > 600) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	Domain mine;
	odpwatch_ofi_stats before{}, after{};
	odpwatch_ofi_monitor_stats(&before);
	void *p = map_at(kAt, false);
	mine.reg(p).reset();
	munmap(p, kLen);
	for (int i = 0; i < 50; i++) {
		usleep(100 * 1000);
		odpwatch_ofi_monitor_stats(&after);
		if (after.events > before.events)
			break;
	}
	std::printf("result fork-close child-exit=%d parent-events=%lu\n",
		    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st),
		    (unsigned long)(after.events - before.events));
	std::fflush(stdout);
	_exit(0);
}

// CASE fork-inherited: the parent registers a buffer and closes the MR, so
// its cache keeps the registration, and prints "result fork-inherited
// parent-key=K"; a child of fork() registers the same address twice on the
// inherited domain, closes both MRs and exits: with 3 if it was handed the
// parent's MR (key K), else 0. The second registration makes the cache
// flush what the first uncached. The parent prints "result fork-inherited
// child-exit=E". After each of its two lines it waits for a line on
// standard input, so that the test can look for key K among the device's
// MRs (rdma resource show mr) before and after the child: a child that
// deregistered the inherited entry destroyed the parent's MR, through the
// device file the two share.
void wait_for_a_line()
{
	char line[16];
	if (!std::fgets(line, sizeof(line), stdin))
		throw std::runtime_error("no line on standard input");
}

int fork_inherited_case(Domain &d)
{
	void *p = map_at(kAt, false);
	const uint64_t key = fi_mr_key(d.reg(p).get()); // closed: the cache keeps it
	std::printf("result fork-inherited parent-key=%#llx\n", (unsigned long long)key);
	std::fflush(stdout);
	wait_for_a_line();
	pid_t pid = fork();
	if (pid < 0)
		throw std::runtime_error("fork");
	if (pid == 0) {
		alarm(30);
		try {
			auto first = d.reg(p);
			const bool parents = fi_mr_key(first.get()) == key;
			auto second = d.reg(p);
			second.reset();
			first.reset();
			_exit(parents ? 3 : 0);
		} catch (const std::exception &e) {
			std::fprintf(stderr, "ofi-mr-cache-test (child): %s\n", e.what());
			_exit(1);
		}
	}
	int st = 0;
	waitpid(pid, &st, 0);
	std::printf("result fork-inherited child-exit=%d\n",
		    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	std::fflush(stdout);
	wait_for_a_line();
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	bool import = false;
	int iterations = 20;
	std::string_view which;
	for (int i = 1; i < argc; i++) {
		std::string_view a = argv[i];
		if (a == "--import") {
			import = true;
		} else if (a == "--iterations" && i + 1 < argc) {
			iterations = std::atoi(argv[++i]);
		} else if (which.empty() && kCases.count(a)) {
			which = a;
		} else {
			std::fprintf(stderr, "usage: ofi-mr-cache-test [--import] [--iterations N] "
					     "reuse|reuse-late-records|munmap|syscall-munmap|"
					     "madvise|fork|fork-close|fork-inherited\n");
			return 2;
		}
	}
	if (which.empty() || iterations < 1) {
		std::fprintf(stderr, "ofi-mr-cache-test: a case and iterations >= 1, please\n");
		return 2;
	}
	if (which == "reuse-late-records") {
		// Before libfabric starts the monitor's thread, which inherits both.
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(sched_getcpu(), &one);
		sched_param prio{};
		prio.sched_priority = 1;
		if (sched_setaffinity(0, sizeof(one), &one) ||
		    sched_setscheduler(0, SCHED_FIFO, &prio)) {
			std::fprintf(stderr, "ofi-mr-cache-test: one CPU, SCHED_FIFO: %s\n",
				     std::strerror(errno));
			return 1;
		}
	}
	if (import) {
		if (int rc = odpwatch_ofi_monitor_import()) {
			std::fprintf(stderr, "odpwatch_ofi_monitor_import: %s\n",
				     std::strerror(-rc));
			return 1;
		}
	}
	try {
		Domain d;
		if (which == "fork")
			return fork_case(d);
		if (which == "fork-close")
			return fork_close_case(d);
		if (which == "fork-inherited")
			return fork_inherited_case(d);
		int stale = 0, hits = 0;
		for (int i = 0; i < iterations; i++) {
			// The first registration stays open until the second is made,
			// so a new MR can never get its key: the same key is the cache
			// handing out the same registration.
			void *p = map_at(kAt, false);
			auto first = d.reg(p);
			kCases.at(which)(p);
			auto second = d.reg(p);
			if (fi_mr_key(second.get()) == fi_mr_key(first.get()))
				(which.starts_with("reuse") ? hits : stale)++;
			second.reset();
			first.reset();
			munmap(p, kLen);
		}
		odpwatch_ofi_stats s{};
		odpwatch_ofi_monitor_stats(&s);
		const char *env = std::getenv("FI_MR_CACHE_MONITOR");
		const char *monitor = s.subscribes ? "memwatch" : env ? env : "default";
		std::printf("# %s: memwatch monitor: %lu subscribes, %lu hits, %lu stale, %lu "
			    "notifies, %lu events, %lu regions\n",
			    d.device(), (unsigned long)s.subscribes, (unsigned long)s.hits,
			    (unsigned long)s.stale, (unsigned long)s.notifies,
			    (unsigned long)s.events, (unsigned long)s.regions);
		std::printf("result %.*s %s stale=%d hits=%d iterations=%d\n", int(which.size()),
			    which.data(), monitor, stale, hits, iterations);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "ofi-mr-cache-test: %s\n", e.what());
		return 1;
	}
	return 0;
}
