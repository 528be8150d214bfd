// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Allocation-failure sweep: for every memwatch operation and every ODP
// operation a process can start, fail its 1st, 2nd, 3rd ... kernel allocation
// (failslab and fail_page_alloc through the task's /proc/thread-self/fail-nth)
// until one attempt runs without reaching an injected failure. Every failed
// attempt must give a clean errno and leave nothing behind (the next attempt
// starts from the same state, and the checks below look); the last must
// succeed. Leaks are kmemleak's to find: the guest scans after the run.
//
// Needs a kernel with CONFIG_FAULT_INJECTION, FAILSLAB, FAIL_PAGE_ALLOC and
// FAULT_INJECTION_DEBUG_FS (the debug kernel), and root for debugfs.
// Output is KTAP; exit status 0 when every operation passed, 4 (KTAP skip)
// when the kernel cannot inject failures.
//   failnth-sweep [--list] [OPERATION...]
#include "check.hpp"
#include "memwatch.hpp"
#include "verbs.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace odpwatch;
using odpwatch::test::Failure;

namespace
{

const size_t page = size_t(sysconf(_SC_PAGESIZE));

// A debugfs knob set for the run and restored after.
class Knob
{
public:
	Knob(std::string path, const std::string &value) : path_(std::move(path))
	{
		std::ifstream in(path_);
		if (!std::getline(in, saved_))
			throw std::runtime_error("cannot read " + path_);
		write(value);
	}
	Knob(const Knob &) = delete;
	Knob &operator=(const Knob &) = delete;
	~Knob()
	{
		try {
			write(saved_);
		} catch (...) {
		}
	}

private:
	void write(const std::string &v)
	{
		std::ofstream out(path_);
		if (!(out << v << '\n'))
			throw std::runtime_error("cannot write " + path_);
	}
	std::string path_, saved_;
};

// The calling thread's fail-nth: arm(n) fails its n-th allocation from now
// on; disarm() says whether that happened. The file stays open, so reading
// it costs no allocation of its own.
class FailNth
{
public:
	FailNth() : fd_(open("/proc/thread-self/fail-nth", O_RDWR | O_CLOEXEC)) {}
	~FailNth()
	{
		if (fd_ >= 0)
			close(fd_);
	}
	bool available() const { return fd_ >= 0; }
	void arm(unsigned n)
	{
		std::string s = std::to_string(n);
		if (pwrite(fd_, s.data(), s.size(), 0) != ssize_t(s.size()))
			throw std::runtime_error("write fail-nth: " + std::string(strerror(errno)));
	}
	// True when the armed failure was injected (the count ran down to 0).
	bool disarm()
	{
		char buf[32] = {};
		ssize_t n = pread(fd_, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			throw std::runtime_error("read fail-nth: " + std::string(strerror(errno)));
		const bool fired = std::atoi(buf) == 0;
		if (!fired && pwrite(fd_, "0", 1, 0) != 1)
			throw std::runtime_error("clear fail-nth: " + std::string(strerror(errno)));
		return fired;
	}

private:
	int fd_;
};

FailNth *nth;

size_t open_fds()
{
	size_t n = 0;
	if (DIR *d = opendir("/proc/self/fd")) {
		while (readdir(d))
			n++;
		closedir(d);
	}
	return n;
}

// One operation under the sweep. prepare() runs before each attempt, outside
// the armed window; attempt() is the operation, returning 0 or an errno;
// settle(err) checks what the attempt left and undoes it, outside the window.
// faults_pages: it faults user pages in through hmm, which reports a failed
// allocation there (a page table's, VM_FAULT_OOM) as EFAULT.
struct Operation {
	const char *name;
	std::function<void()> prepare;
	std::function<int()> attempt;
	std::function<void(int err)> settle;
	bool faults_pages = false;
};

struct Outcome {
	unsigned points = 0;   // allocations the operation makes, all failed in turn
	unsigned absorbed = 0; // failed allocations the operation got over by itself
	std::map<int, unsigned> errnos;
};

Outcome sweep(const Operation &op)
{
	Outcome o;
	const size_t fds = open_fds();
	for (unsigned n = 1; n <= 20000; n++) {
		if (op.prepare)
			op.prepare();
		nth->arm(n);
		int err = op.attempt();
		const bool fired = nth->disarm();
		op.settle(err);
		CHECK(open_fds() == fds);
		if (!fired) {
			if (err)
				throw Failure(std::string("failed with ") + strerrorname_np(err) +
					      " where no failure was injected");
			o.points = n - 1;
			return o;
		}
		if (!err) {
			o.absorbed++;
		} else if (err == ENOMEM || err == EAGAIN || (err == EFAULT && op.faults_pages)) {
			o.errnos[err]++;
		} else {
			throw Failure("allocation " + std::to_string(n) +
				      " failed: the operation gave " + strerrorname_np(err) +
				      (op.faults_pages ? ", not ENOMEM, EAGAIN or EFAULT"
						       : ", not ENOMEM or EAGAIN"));
		}
	}
	throw Failure("still reaching injected failures after 20000 allocations");
}

int result(long rc)
{
	return rc < 0 ? errno : 0;
}

// --- memwatch ---------------------------------------------------------------

// A page at a fixed address, so every attempt works on the same range.
void *const watched_at = reinterpret_cast<void *>(uintptr_t{7} << 40);

void map_watched_page()
{
	void *p = mmap(watched_at, page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != watched_at)
		throw std::runtime_error("mmap at the watched address: " +
					 std::string(strerror(errno)));
	std::memset(p, 1, page);
}

memwatch_stats stats_of(int fd)
{
	memwatch_stats s{};
	if (ioctl(fd, MEMWATCH_IOC_STATS, &s))
		throw std::runtime_error("MEMWATCH_IOC_STATS: " + std::string(strerror(errno)));
	return s;
}

std::vector<Operation> memwatch_operations(Memwatch &mw)
{
	auto created = std::make_shared<int>(-1);
	auto state = std::make_shared<void *>(nullptr);
	auto watch = std::make_shared<Memwatch::Watch>();
	std::vector<Operation> ops;

	ops.push_back({"memwatch_create", nullptr,
		       [created] {
			       *created = Memwatch::create_fd(MEMWATCH_CLOEXEC | MEMWATCH_NONBLOCK);
			       return *created < 0 ? errno : 0;
		       },
		       [created](int err) {
			       CHECK((*created >= 0) == !err);
			       if (*created >= 0)
				       close(*created);
			       *created = -1;
		       }});

	ops.push_back(
		{"mmap of the memwatch state area", nullptr,
		 [&mw, state] {
			 *state = mmap(nullptr, page, PROT_READ, MAP_SHARED, mw.fd(), 0);
			 return *state == MAP_FAILED ? errno : 0;
		 },
		 [state](int err) {
			 if (!err) {
				 CHECK(static_cast<const memwatch_header *>(*state)->abi_version ==
				       MEMWATCH_ABI_VERSION);
				 munmap(*state, page);
			 }
		 }});

	ops.push_back({"MEMWATCH_IOC_ADD", map_watched_page,
		       [&mw, watch] {
			       memwatch_add a{};
			       a.addr = reinterpret_cast<uintptr_t>(watched_at);
			       a.len = page;
			       int err = result(ioctl(mw.fd(), MEMWATCH_IOC_ADD, &a));
			       watch->id = a.id;
			       return err;
		       },
		       [&mw, watch](int err) {
			       // A failed add leaves no watch behind.
			       CHECK(stats_of(mw.fd()).watches == (err ? 0 : 1));
			       if (!err)
				       mw.remove(watch->id);
			       munmap(watched_at, page);
		       }});

	ops.push_back({"MEMWATCH_IOC_SET_QUEUE", nullptr,
		       [&mw] {
			       memwatch_queue q{.size = 2 * MEMWATCH_QUEUE_DEFAULT, .flags = 0};
			       return result(ioctl(mw.fd(), MEMWATCH_IOC_SET_QUEUE, &q));
		       },
		       [&mw](int err) {
			       // A failed resize keeps the old queue.
			       CHECK(stats_of(mw.fd()).queue_size ==
				     (err ? MEMWATCH_QUEUE_DEFAULT : 2 * MEMWATCH_QUEUE_DEFAULT));
			       memwatch_queue q{.size = MEMWATCH_QUEUE_DEFAULT, .flags = 0};
			       if (ioctl(mw.fd(), MEMWATCH_IOC_SET_QUEUE, &q))
				       throw Failure("restoring the queue size: " +
						     std::string(strerror(errno)));
		       }});

	// The invariant the registration cache stands on: when munmap has
	// returned success, the watch's word has changed. (madvise of a watched
	// page was measured to allocate nothing in the task: nothing to sweep.)
	ops.push_back({"munmap of a watched page",
		       [&mw, watch] {
			       map_watched_page();
			       *watch = mw.add(watched_at, page, 1);
		       },
		       [] { return result(munmap(watched_at, page)); },
		       [&mw, watch](int err) {
			       if (!err)
				       CHECK(!mw.valid(*watch));
			       while (mw.next_event()) {
			       }
			       mw.remove(watch->id);
			       if (err)
				       munmap(watched_at, page);
		       }});
	return ops;
}

// --- ODP --------------------------------------------------------------------

constexpr unsigned kOdp = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ;
constexpr size_t kLen = 1 << 20;

int prefetch(ibv_pd *pd, ibv_mr *mr, void *addr, size_t len)
{
	ibv_sge sge{.addr = reinterpret_cast<uintptr_t>(addr),
		    .length = static_cast<uint32_t>(len),
		    .lkey = mr->lkey};
	return ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			     &sge, 1);
}

std::vector<Operation> odp_operations(ibv_pd *pd, verbs::Mapping &buf)
{
	auto mr = std::make_shared<ibv_mr *>(nullptr);
	auto held = std::make_shared<verbs::Mr>();
	std::vector<Operation> ops;
	auto reg = [pd, mr](void *addr, size_t len) {
		*mr = ibv_reg_mr(pd, addr, len, kOdp);
		return *mr ? 0 : errno;
	};
	auto dereg_if = [mr](int err) {
		CHECK((*mr != nullptr) == !err);
		if (*mr && ibv_dereg_mr(*mr))
			throw Failure("ibv_dereg_mr after the sweep step failed");
		*mr = nullptr;
	};

	ops.push_back({"ibv_reg_mr, explicit ODP (1 MiB)", nullptr,
		       [reg, &buf] { return reg(buf.data(), kLen); }, dereg_if});
	ops.push_back({"ibv_reg_mr, implicit ODP", nullptr,
		       [reg] { return reg(nullptr, SIZE_MAX); }, dereg_if});

	// Synchronous prefetch faults the pages in from the calling task: the
	// ODP fault path under failure. The pages are dropped before each try.
	ops.push_back({"ibv_advise_mr PREFETCH_WRITE, explicit ODP (1 MiB)",
		       [pd, held, &buf] {
			       if (!*held)
				       *held = verbs::reg_mr(pd, buf.data(), kLen, kOdp);
			       madvise(buf.data(), kLen, MADV_DONTNEED);
		       },
		       [pd, held, &buf] { return prefetch(pd, held->get(), buf.data(), kLen); },
		       [](int) {}, true});

	// On an implicit MR the prefetch also creates the child MRs: a fresh
	// implicit MR for every try, so each one creates them again.
	ops.push_back({"ibv_advise_mr PREFETCH_WRITE, implicit ODP (child creation)",
		       [pd, held, &buf] {
			       *held = verbs::reg_mr(pd, nullptr, SIZE_MAX, kOdp);
			       madvise(buf.data(), kLen, MADV_DONTNEED);
		       },
		       [pd, held, &buf] { return prefetch(pd, held->get(), buf.data(), kLen); },
		       [held](int) { held->reset(); }, true});

	// (ibv_dereg_mr of an ODP MR was measured to allocate nothing in the
	// task: there is nothing to sweep there.)
	return ops;
}

} // namespace

int main(int argc, char **argv)
{
	std::setvbuf(stdout, nullptr, _IOLBF, 0);
	FailNth fail_nth;
	nth = &fail_nth;
	try {
		Memwatch mw(64);
		verbs::Context ctx = verbs::open_device("");
		verbs::Pd pd = verbs::alloc_pd(ctx.get());
		verbs::Mapping buf(kLen);
		std::vector<Operation> ops = memwatch_operations(mw);
		for (Operation &op : odp_operations(pd.get(), buf))
			ops.push_back(std::move(op));

		if (argc > 1 && !std::strcmp(argv[1], "--list")) {
			for (const Operation &op : ops)
				std::printf("%s\n", op.name);
			return 0;
		}
		if (argc > 1) { // only the operations named
			std::vector<Operation> named;
			for (int a = 1; a < argc; a++) {
				size_t before = named.size();
				for (const Operation &op : ops)
					if (op.name == std::string(argv[a]))
						named.push_back(op);
				if (named.size() == before) {
					std::fprintf(stderr, "%s: no operation '%s' (--list)\n",
						     argv[0], argv[a]);
					return 2;
				}
			}
			ops = std::move(named);
		}
		std::printf("TAP version 13\n");
		if (!fail_nth.available()) {
			std::printf("1..0 # SKIP no /proc/thread-self/fail-nth: the kernel has no "
				    "CONFIG_FAULT_INJECTION\n");
			return 4;
		}
		// Every allocation may fail, sleeping ones too, page allocations of
		// any order except user pages (ignore-gfp-highmem stays set); quietly.
		const std::string fs = "/sys/kernel/debug/failslab/",
				  fp = "/sys/kernel/debug/fail_page_alloc/";
		Knob k1(fs + "ignore-gfp-wait", "N"), k2(fs + "verbose", "0"),
			k3(fp + "ignore-gfp-wait", "N"), k4(fp + "min-order", "0"),
			k5(fp + "verbose", "0");

		std::printf("1..%zu\n", ops.size());
		unsigned failed = 0, points = 0, i = 0;
		for (const Operation &op : ops) {
			i++;
			try {
				Outcome o = sweep(op);
				points += o.points;
				std::string errs;
				for (auto [e, n] : o.errnos)
					errs += std::string(errs.empty() ? "" : ", ") +
						strerrorname_np(e) + " " + std::to_string(n);
				std::printf("ok %u %s # %u allocations failed in turn: %s; %u got "
					    "over\n",
					    i, op.name, o.points,
					    errs.empty() ? "no errors" : errs.c_str(), o.absorbed);
			} catch (const std::exception &e) {
				failed++;
				std::printf("not ok %u %s # %s\n", i, op.name, e.what());
			}
		}
		std::printf("# %u allocation points swept over %zu operations, %u failed\n", points,
			    ops.size(), failed);
		return failed ? 1 : 0;
	} catch (const std::exception &e) {
		std::printf("Bail out! %s\n", e.what());
		return 1;
	}
}
