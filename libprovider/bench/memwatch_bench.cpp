// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// memwatch against the two ways registration caches learn of unmaps today:
// a userfaultfd monitor thread (UFFD_EVENT_UNMAP/REMOVE/REMAP, as libfabric
// uses it) and an interposed munmap hook (as UCX's ucm does). Each keeps the
// same cache of ranges; the measurements are ratios within this one run.
#include "benches.hpp"
#include "memwatch.hpp"
#include "report.hpp"
#include "verbs.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace odpwatch::bench
{
namespace
{

const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));

int64_t now_ns()
{
	return std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

// Anonymous memory that is never touched: watches only need the addresses.
class Region
{
public:
	explicit Region(size_t pages) : len_(pages * page)
	{
		p_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p_ == MAP_FAILED)
			throw verbs::Error("mmap of the benchmark region", errno);
	}
	Region(const Region &) = delete;
	Region &operator=(const Region &) = delete;
	~Region() { munmap(p_, len_); }
	char *at(size_t i) const { return static_cast<char *>(p_) + i * page; }

private:
	void *p_;
	size_t len_;
};

// The registration cache a hook or a monitor thread keeps up to date: disjoint
// ranges, each with a validity flag the cache user loads.
class RangeCache
{
public:
	const std::atomic<bool> *add(const void *p, size_t len)
	{
		auto s = reinterpret_cast<uintptr_t>(p);
		std::lock_guard g(m_);
		auto &e = by_start_[s];
		e = std::make_unique<Entry>();
		e->end = s + len;
		return &e->valid;
	}
	void remove(const void *p)
	{
		std::lock_guard g(m_);
		by_start_.erase(reinterpret_cast<uintptr_t>(p));
	}
	void invalidate(uintptr_t start, uintptr_t end)
	{
		std::lock_guard g(m_);
		auto it = by_start_.upper_bound(start);
		if (it != by_start_.begin() && std::prev(it)->second->end > start)
			--it;
		for (; it != by_start_.end() && it->first < end; ++it)
			it->second->valid.store(false, std::memory_order_release);
	}

private:
	struct Entry {
		uintptr_t end = 0;
		std::atomic<bool> valid{true};
	};
	std::mutex m_;
	std::map<uintptr_t, std::unique_ptr<Entry>> by_start_;
};

// What an interposed munmap does: tell the cache, then unmap.
void hooked_munmap(RangeCache &cache, void *p, size_t len)
{
	auto s = reinterpret_cast<uintptr_t>(p);
	cache.invalidate(s, s + len);
	munmap(p, len);
}

class EventFd
{
public:
	EventFd() : fd_(eventfd(0, EFD_CLOEXEC))
	{
		if (fd_ < 0)
			throw verbs::Error("eventfd", errno);
	}
	EventFd(const EventFd &) = delete;
	EventFd &operator=(const EventFd &) = delete;
	~EventFd() { close(fd_); }
	int fd() const { return fd_; }
	void signal() const
	{
		uint64_t one = 1;
		if (write(fd_, &one, sizeof(one)) != sizeof(one))
			std::perror("eventfd write");
	}

private:
	int fd_;
};

// Waits for @fd or the stop eventfd; false once stopped.
bool wait_readable(int fd, const EventFd &stop)
{
	pollfd p[2] = {{fd, POLLIN, 0}, {stop.fd(), POLLIN, 0}};
	while (poll(p, 2, -1) < 0)
		if (errno != EINTR)
			throw verbs::Error("poll", errno);
	return !(p[1].revents & POLLIN);
}

// A userfaultfd non-cooperative monitor: its thread reads UNMAP, REMOVE and
// REMAP events and invalidates the cache. munmap() waits until the event is
// read, not until the cache is updated.
class UffdMonitor
{
public:
	explicit UffdMonitor(RangeCache &cache) : cache_(cache)
	{
		fd_ = static_cast<int>(syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK));
		if (fd_ < 0)
			throw verbs::Error("userfaultfd", errno);
		uffdio_api api{};
		api.api = UFFD_API;
		api.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE |
			       UFFD_FEATURE_EVENT_REMAP;
		if (ioctl(fd_, UFFDIO_API, &api)) {
			int err = errno;
			close(fd_);
			throw verbs::Error("UFFDIO_API", err);
		}
		thread_ = std::thread([this] { run(); });
	}
	UffdMonitor(const UffdMonitor &) = delete;
	UffdMonitor &operator=(const UffdMonitor &) = delete;
	~UffdMonitor()
	{
		stop_.signal();
		thread_.join();
		close(fd_);
	}
	void watch(void *p, size_t len)
	{
		uffdio_register r{};
		r.range.start = reinterpret_cast<uintptr_t>(p);
		r.range.len = len;
		r.mode = UFFDIO_REGISTER_MODE_MISSING;
		if (ioctl(fd_, UFFDIO_REGISTER, &r))
			throw verbs::Error("UFFDIO_REGISTER", errno);
	}
	void unwatch(void *p, size_t len)
	{
		uffdio_range r{reinterpret_cast<uintptr_t>(p), len};
		if (ioctl(fd_, UFFDIO_UNREGISTER, &r))
			throw verbs::Error("UFFDIO_UNREGISTER", errno);
	}
	std::atomic<int64_t> handled_ns{0}; // when the last event was applied

private:
	void run()
	{
		uffd_msg msgs[16];
		while (wait_readable(fd_, stop_)) {
			ssize_t n = read(fd_, msgs, sizeof(msgs));
			for (ssize_t i = 0; i < n / static_cast<ssize_t>(sizeof(msgs[0])); i++) {
				const uffd_msg &m = msgs[i];
				if (m.event == UFFD_EVENT_UNMAP || m.event == UFFD_EVENT_REMOVE)
					cache_.invalidate(m.arg.remove.start, m.arg.remove.end);
				else if (m.event == UFFD_EVENT_REMAP)
					cache_.invalidate(m.arg.remap.from,
							  m.arg.remap.from + m.arg.remap.len);
				handled_ns.store(now_ns(), std::memory_order_release);
			}
		}
	}
	RangeCache &cache_;
	int fd_ = -1;
	EventFd stop_;
	std::thread thread_;
};

// A thread that waits on a memwatch descriptor the way an epoll loop would.
class MemwatchReader
{
public:
	explicit MemwatchReader(Memwatch &mw) : mw_(mw), thread_([this] { run(); }) {}
	MemwatchReader(const MemwatchReader &) = delete;
	MemwatchReader &operator=(const MemwatchReader &) = delete;
	~MemwatchReader()
	{
		stop_.signal();
		thread_.join();
	}
	std::atomic<int64_t> handled_ns{0};

private:
	void run()
	{
		while (wait_readable(mw_.fd(), stop_))
			while (mw_.next_event())
				handled_ns.store(now_ns(), std::memory_order_release);
	}
	Memwatch &mw_;
	EventFd stop_;
	std::thread thread_;
};

// Pages are mapped at one fixed address, 1 TiB, far below where mmap() puts
// things: no neighbour to merge with, so every mmap + munmap does the same
// work whatever else the process maps (merges moved times by 30%).
void *map_page()
{
	void *spot = reinterpret_cast<void *>(uintptr_t{1} << 40);
	void *p = mmap(spot, page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		throw verbs::Error("mmap at 1 TiB", errno);
	return p;
}

void drain(Memwatch &mw)
{
	while (mw.next_event())
		;
}

std::string count_name(size_t n)
{
	return std::to_string(n) + (n == 1 ? " watch" : " watches");
}

// One acquire load and a compare, against the flag load a hook- or
// monitor-maintained cache does: the fast path of a cache hit.
void bench_check(Report &rep, const Options &o)
{
	const size_t n = 4096, passes = o.quick ? 64 : 256;
	Region r(n);
	Memwatch mw(n);
	RangeCache cache;
	std::vector<Memwatch::Watch> ws;
	std::vector<const std::atomic<bool> *> flags;
	for (size_t i = 0; i < n; i++) {
		ws.push_back(mw.add(r.at(i), page, i));
		flags.push_back(cache.add(r.at(i), page));
	}
	volatile size_t sink = 0;
	const std::string g = "validity check of a cached range", w = "4096 ranges";
	rep.add({g, w, "flag",
		 measure(o.reps, double(n * passes),
			 [&] {
				 size_t v = 0;
				 for (size_t p = 0; p < passes; p++)
					 for (size_t i = 0; i < n; i++)
						 v += flags[i]->load(std::memory_order_acquire);
				 sink = v;
			 }),
		 "flag/" + w, "hook and uffd caches: one load"});
	rep.add({g, w, "memwatch",
		 measure(o.reps, double(n * passes),
			 [&] {
				 size_t v = 0;
				 for (size_t p = 0; p < passes; p++)
					 for (size_t i = 0; i < n; i++)
						 v += mw.valid(ws[i]);
				 sink = v;
			 }),
		 "flag/" + w, "one acquire load and a compare"});
	(void)sink;
}

void bench_add_remove(Report &rep, const Options &o)
{
	const size_t n = o.quick ? 512 : 2048;
	Region r(n);
	const std::string g = "add + remove of a watch", w = std::to_string(n) + " ranges";
	{
		Memwatch mw(n);
		std::vector<uint32_t> ids(n);
		rep.add({g, w, "memwatch",
			 measure(o.reps, double(n),
				 [&] {
					 for (size_t i = 0; i < n; i++)
						 ids[i] = mw.add(r.at(i), page, i).id;
					 for (size_t i = 0; i < n; i++)
						 mw.remove(ids[i]);
				 }),
			 "memwatch/" + w, "two ioctls"});
	}
	if (o.uffd) {
		RangeCache cache;
		UffdMonitor uffd(cache);
		rep.add({g, w, "uffd",
			 measure(o.reps, double(n),
				 [&] {
					 for (size_t i = 0; i < n; i++)
						 uffd.watch(r.at(i), page);
					 for (size_t i = 0; i < n; i++)
						 uffd.unwatch(r.at(i), page);
				 }),
			 "memwatch/" + w, "UFFDIO_REGISTER/UNREGISTER: VMA split and merge"});
	}
	RangeCache cache;
	rep.add({g, w, "hook",
		 measure(o.reps, double(n),
			 [&] {
				 for (size_t i = 0; i < n; i++)
					 cache.add(r.at(i), page);
				 for (size_t i = 0; i < n; i++)
					 cache.remove(r.at(i));
			 }),
		 "memwatch/" + w, "user space only: a map insert and erase"});
}

// mmap + munmap of a page nobody watches while @n watches exist elsewhere:
// what every other unmap in the process pays for the mechanism. The ratio is
// against the same loop with no mechanism at all.
void bench_unwatched_munmap(Report &rep, const Options &o)
{
	const std::string g = "mmap + munmap of an unwatched page, watches elsewhere";
	const std::string base = "none/" + count_name(0);
	std::vector<size_t> counts = {0, 1000, 100000};
	if (!o.quick)
		counts.push_back(1000000);
	const size_t iters = o.quick ? 2000 : 5000;
	auto loop = [&] {
		for (size_t i = 0; i < iters; i++)
			if (munmap(map_page(), page))
				throw verbs::Error("munmap " + std::to_string(i), errno);
	};
	rep.add({g, count_name(0), "none", measure(o.reps, double(iters), loop), base,
		 "no mechanism"});
	for (size_t n : counts) {
		Region r(n ? n : 1);
		std::string w = count_name(n);
		{
			Memwatch mw(std::max<size_t>(n, 1));
			for (size_t i = 0; i < n; i++)
				mw.add(r.at(i), page, i);
			rep.add({g, w, "memwatch", measure(o.reps, double(iters), loop), base, ""});
		}
		if (o.uffd) {
			RangeCache cache;
			UffdMonitor uffd(cache);
			for (size_t i = 0; i < n; i++)
				uffd.watch(r.at(i), page);
			rep.add({g, w, "uffd", measure(o.reps, double(iters), loop), base, ""});
		}
		RangeCache cache;
		for (size_t i = 0; i < n; i++)
			cache.add(r.at(i), page);
		rep.add({g, w, "hook",
			 measure(o.reps, double(iters),
				 [&] {
					 for (size_t i = 0; i < iters; i++)
						 hooked_munmap(cache, map_page(), page);
				 }),
			 base, "a range-map lookup per munmap"});
	}
}

// munmap of a watched page, timed alone; then the unmapping thread asks the
// cache at once. Any "still valid" answer is a stale registration handed out.
template <class Setup, class Unmap, class Valid, class Teardown>
Row watched_munmap_row(const Options &o, size_t iters, const std::string &variant, Setup setup,
		       Unmap unmap, Valid valid, Teardown teardown)
{
	std::vector<double> samples;
	size_t stale = 0;
	for (unsigned r = 0; r < o.reps; r++) {
		double total = 0;
		for (size_t i = 0; i < iters; i++) {
			void *p = map_page();
			auto h = setup(p);
			int64_t t0 = now_ns();
			unmap(p);
			total += double(now_ns() - t0);
			stale += valid(h);
			teardown(p, h);
		}
		samples.push_back(total / double(iters));
	}
	return {"",
		"",
		variant,
		spread_of(samples),
		"",
		std::to_string(stale) + " stale of " + std::to_string(iters * o.reps) +
			" checks right after munmap"};
}

void bench_watched_munmap(Report &rep, const Options &o)
{
	const std::string g = "munmap of a watched page", w = "1 watch";
	const size_t iters = o.quick ? 300 : 1000;
	auto put = [&](Row r) {
		r.group = g;
		r.param = w;
		r.baseline = "none/" + w;
		rep.add(std::move(r));
	};
	put(watched_munmap_row(
		o, iters, "none", [](void *) { return 0; }, [](void *p) { munmap(p, page); },
		[](int) { return false; }, [](void *, int) {}));
	{
		Memwatch mw(16);
		put(watched_munmap_row(
			o, iters, "memwatch", [&](void *p) { return mw.add(p, page, 0); },
			[](void *p) { munmap(p, page); },
			[&](const Memwatch::Watch &h) { return mw.valid(h); },
			[&](void *, const Memwatch::Watch &h) {
				mw.remove(h.id);
				drain(mw);
			}));
	}
	if (o.uffd) {
		RangeCache cache;
		UffdMonitor uffd(cache);
		put(watched_munmap_row(
			o, iters, "uffd",
			[&](void *p) {
				uffd.watch(p, page);
				return cache.add(p, page);
			},
			[](void *p) { munmap(p, page); },
			[](const std::atomic<bool> *f) {
				return f->load(std::memory_order_acquire);
			},
			[&](void *p, const std::atomic<bool> *) { cache.remove(p); }));
	}
	RangeCache cache;
	put(watched_munmap_row(
		o, iters, "hook", [&](void *p) { return cache.add(p, page); },
		[&](void *p) { hooked_munmap(cache, p, page); },
		[](const std::atomic<bool> *f) { return f->load(std::memory_order_acquire); },
		[&](void *p, const std::atomic<bool> *) { cache.remove(p); }));
}

// From the munmap call to the event applied by the thread that waits for it.
template <class Setup, class Teardown>
Spread delivery(const Options &o, size_t iters, std::atomic<int64_t> &handled, Setup setup,
		Teardown teardown)
{
	std::vector<double> samples;
	for (unsigned r = 0; r < o.reps; r++) {
		double total = 0;
		for (size_t i = 0; i < iters; i++) {
			void *p = map_page();
			auto h = setup(p);
			handled.store(0);
			int64_t t0 = now_ns();
			munmap(p, page);
			int64_t t1;
			while (!(t1 = handled.load(std::memory_order_acquire)))
				std::this_thread::yield();
			total += double(t1 - t0);
			teardown(p, h);
		}
		samples.push_back(total / double(iters));
	}
	return spread_of(samples);
}

void bench_delivery(Report &rep, const Options &o)
{
	const std::string g = "event delivery: munmap to the waiting thread", w = "1 watch";
	const size_t iters = o.quick ? 100 : 400;
	{
		Memwatch mw(16);
		MemwatchReader reader(mw);
		rep.add({g, w, "memwatch",
			 delivery(
				 o, iters, reader.handled_ns,
				 [&](void *p) { return mw.add(p, page, 0).id; },
				 [&](void *, uint32_t id) { mw.remove(id); }),
			 "memwatch/" + w, "poll() + read() of the record"});
	}
	if (o.uffd) {
		RangeCache cache;
		UffdMonitor uffd(cache);
		rep.add({g, w, "uffd",
			 delivery(
				 o, iters, uffd.handled_ns,
				 [&](void *p) {
					 uffd.watch(p, page);
					 return 0;
				 },
				 [&](void *p, int) { cache.remove(p); }),
			 "memwatch/" + w, "poll() + read() of uffd_msg, cache updated"});
	}
}

} // namespace

// The first watch of a process registers the mm's mmu notifier, which takes
// mm_take_all_locks(): every file mapping's i_mmap_rwsem and every anon_vma
// lock, under a global mutex. What that one-time cost is, against a second
// watch, in a process with @n file mappings (one page of its own memfd
// each, so no two share a lock or merge). Each repetition is a new process.
void bench_first_watch(Report &rep, const Options &o)
{
	const std::string g = "first watch of a process: registers the mm's notifier";
	for (size_t n : o.quick ? std::vector<size_t>{16, 1000, 8000}
				: std::vector<size_t>{16, 1000, 4000, 16000}) {
		std::vector<double> first, second;
		for (unsigned r = 0; r < o.reps; r++) {
			int fd[2];
			if (pipe(fd))
				throw verbs::Error("pipe", errno);
			pid_t pid = fork();
			if (pid < 0)
				throw verbs::Error("fork", errno);
			if (pid == 0) {
				close(fd[0]);
				int64_t t[2] = {-1, -1};
				for (size_t i = 0; i < n; i++) {
					int m = memfd_create("first-watch", MFD_CLOEXEC);
					if (m < 0 || ftruncate(m, page) ||
					    mmap(nullptr, page, PROT_READ, MAP_SHARED, m, 0) ==
						    MAP_FAILED)
						_exit(1);
					close(m);
				}
				try {
					Memwatch mw(16);
					void *a = map_page();
					int64_t t0 = now_ns();
					mw.add(a, page, 0);
					int64_t t1 = now_ns();
					mw.add(a, page, 1);
					t[0] = t1 - t0;
					t[1] = now_ns() - t1;
				} catch (...) {
				}
				_exit(write(fd[1], t, sizeof(t)) == sizeof(t) && t[0] >= 0 ? 0 : 2);
			}
			close(fd[1]);
			int64_t t[2] = {-1, -1};
			ssize_t got = read(fd[0], t, sizeof(t));
			close(fd[0]);
			int st = 0;
			waitpid(pid, &st, 0);
			if (got != sizeof(t) || !WIFEXITED(st) || WEXITSTATUS(st))
				throw verbs::Error("first-watch child failed", EIO);
			first.push_back(double(t[0]));
			second.push_back(double(t[1]));
		}
		const std::string w = std::to_string(n) + " file mappings";
		rep.add({g, w, "second ADD", spread_of(second), "second ADD/" + w,
			 "an interval tree insert"});
		rep.add({g, w, "first ADD", spread_of(first), "second ADD/" + w,
			 "mmu_notifier_register(): mm_take_all_locks()"});
	}
}

// /proc/self/pagemap, for the page frame behind each address.
class Pagemap
{
public:
	Pagemap() : fd_(open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC))
	{
		if (fd_ < 0)
			throw verbs::Error("open /proc/self/pagemap", errno);
	}
	Pagemap(const Pagemap &) = delete;
	Pagemap &operator=(const Pagemap &) = delete;
	~Pagemap() { close(fd_); }
	// The frame number of each page, 0 for a page not present.
	std::vector<uint64_t> frames(const void *p, size_t pages) const
	{
		std::vector<uint64_t> e(pages);
		off_t off = off_t(reinterpret_cast<uintptr_t>(p) / page * sizeof(uint64_t));
		if (pread(fd_, e.data(), pages * sizeof(uint64_t), off) < 0)
			throw verbs::Error("read /proc/self/pagemap", errno);
		for (auto &x : e)
			x = x >> 63 ? x & ((uint64_t{1} << 55) - 1) : 0;
		return e;
	}

private:
	int fd_;
};

// What the watches on one thread's live allocations saw.
struct LiveWatchCount {
	uint64_t allocations = 0, watched = 0, changed = 0, moved = 0;
};

// One thread of a malloc-heavy program: sizes from 64 B to 1 MiB, each
// allocation's whole pages watched while it lives (a registration cache
// holding it), 128 alive at a time, the oldest freed at random. A live
// buffer's pages never change (nothing here madvises or moves them), so a
// word that changed while its pages stayed put is a false positive.
LiveWatchCount malloc_workload(unsigned seed, size_t allocations)
{
	struct Live {
		void *p = nullptr;
		const char *start = nullptr;
		size_t pages = 0;
		Memwatch::Watch w{};
		std::vector<uint64_t> frames;
	};
	Memwatch mw(4096);
	Pagemap pm;
	std::mt19937 rng(seed);
	std::vector<Live> live;
	LiveWatchCount c;
	auto release = [&](Live &l) {
		if (l.pages) {
			if (!mw.valid(l.w)) {
				c.changed++;
				c.moved += pm.frames(l.start, l.pages) != l.frames;
			}
			mw.remove(l.w.id);
		}
		free(l.p);
	};
	for (size_t i = 0; i < allocations; i++) {
		size_t size = size_t{1} << std::uniform_int_distribution<int>(6, 19)(rng);
		size += rng() % size;
		Live l;
		l.p = malloc(size);
		if (!l.p)
			throw verbs::Error("malloc", ENOMEM);
		for (size_t off = 0; off < size; off += page)
			static_cast<char *>(l.p)[off] = char(i);
		uintptr_t s = (reinterpret_cast<uintptr_t>(l.p) + page - 1) & ~(page - 1);
		uintptr_t e = (reinterpret_cast<uintptr_t>(l.p) + size) & ~(page - 1);
		if (e > s) {
			l.start = reinterpret_cast<const char *>(s);
			l.pages = (e - s) / page;
			l.w = mw.add(l.start, e - s, i);
			l.frames = pm.frames(l.start, l.pages);
			c.watched++;
		}
		c.allocations++;
		if (live.size() < 128) {
			live.push_back(std::move(l));
		} else {
			Live &old = live[rng() % live.size()];
			release(old);
			old = std::move(l);
		}
	}
	for (auto &l : live)
		release(l);
	return c;
}

// Splitting a VMA at an address that is not 2 MiB aligned (glibc does it
// all the time: a thread arena grows its heap with mprotect, a freed mmap()ed
// chunk leaves a hole in a merged mapping) can make the core mm invalidate
// the whole 2 MiB block around it, changing the words of live buffers there.
// How often, in a malloc-heavy program of two threads.
void bench_malloc_false_positives(Report &rep, const Options &o)
{
	const size_t per_thread = o.quick ? 5000 : 20000;
	std::vector<double> ns;
	LiveWatchCount total;
	for (unsigned r = 0; r < o.reps; r++) {
		LiveWatchCount c[2];
		std::exception_ptr err[2];
		auto run = [&](int t) {
			try {
				c[t] = malloc_workload(2 * r + 1 + t, per_thread);
			} catch (...) {
				err[t] = std::current_exception();
			}
		};
		int64_t t0 = now_ns();
		{
			std::jthread a(run, 0), b(run, 1);
		}
		for (auto &e : err)
			if (e)
				std::rethrow_exception(e);
		ns.push_back(double(now_ns() - t0) / double(2 * per_thread));
		for (const auto &x : c) {
			total.allocations += x.allocations;
			total.watched += x.watched;
			total.changed += x.changed;
			total.moved += x.moved;
		}
	}
	uint64_t fp = total.changed - total.moved;
	char note[200];
	std::snprintf(note, sizeof(note),
		      "%llu watched of %llu; words changed while live: %llu, of which "
		      "pages moved %llu, false positives %llu (%.2f per 1000 allocations)",
		      (unsigned long long)total.watched, (unsigned long long)total.allocations,
		      (unsigned long long)total.changed, (unsigned long long)total.moved,
		      (unsigned long long)fp, 1000.0 * double(fp) / double(total.allocations));
	rep.add({"malloc-heavy program, every live buffer watched (2 threads, 128 live each)",
		 std::to_string(2 * per_thread) + " allocations", "memwatch", spread_of(ns),
		 "memwatch/" + std::to_string(2 * per_thread) + " allocations", note});
	rep.remark(std::string("malloc-heavy program: ") + note);
}

int memwatch_bench(const Options &o)
{
	Report rep("memwatch against a userfaultfd monitor and an interposed hook");
	run_sections(
		"memwatch", o.reps, o.quick, o.only,
		{{"validity check", [&] { bench_check(rep, o); }},
		 {"add + remove", [&] { bench_add_remove(rep, o); }},
		 {"munmap elsewhere", [&] { bench_unwatched_munmap(rep, o); }},
		 {"munmap of a watched page", [&] { bench_watched_munmap(rep, o); }},
		 {"event delivery", [&] { bench_delivery(rep, o); }},
		 {"first watch", [&] { bench_first_watch(rep, o); }},
		 {"false positives under malloc", [&] { bench_malloc_false_positives(rep, o); }}});
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
