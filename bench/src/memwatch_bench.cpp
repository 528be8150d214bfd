// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// memwatch against models of the two ways registration caches learn of
// unmaps today, written here (not UCX's or libfabric's code): a userfaultfd
// monitor thread (UFFD_EVENT_UNMAP/REMOVE/REMAP, the mechanism libfabric's
// userfaultfd monitor uses) and an interposed munmap hook (the mechanism of
// UCX's ucm). Each keeps the same cache of ranges; the measurements are
// ratios within this one run.
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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
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

// A thread that waits in poll() for nothing until it is destroyed: what
// any monitor thread costs an munmap before it does any work (the process
// has two threads, the other one asleep).
class IdleThread
{
public:
	IdleThread() : thread_([this] { wait_readable(stop_.fd(), stop_); }) {}
	IdleThread(const IdleThread &) = delete;
	IdleThread &operator=(const IdleThread &) = delete;
	~IdleThread()
	{
		stop_.signal();
		thread_.join();
	}

private:
	EventFd stop_;
	std::thread thread_;
};

// Pages are mapped at fixed addresses from 1 TiB, far below where mmap() puts
// things, a page apart: no neighbour to merge with, so every mmap + munmap
// does the same work whatever else the process maps (merges moved times by
// 30%).
void *map_page(size_t slot = 0)
{
	void *spot = reinterpret_cast<void *>((uintptr_t{1} << 40) + 2 * slot * page);
	void *p = mmap(spot, page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		throw verbs::Error("mmap at 1 TiB + " + std::to_string(2 * slot) + " pages", errno);
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

// One repetition of a munmap benchmark: the mean time per operation, and how
// often the cache still said "valid" right after a munmap.
struct MunmapSample {
	double ns = 0;
	uint64_t stale = 0;
};
using MunmapRep = std::function<MunmapSample()>;

// In batches of 32 pages: all mapped and set up (watched), then each one
// unmapped, timed alone and checked at once, then all torn down. What the
// munmap costs is not mixed with the set-up calls just before it, as in a
// cache, which registers long before the buffer is freed.
template <class Setup, class Unmap, class Valid, class Teardown>
MunmapRep munmap_rep(size_t iters, Setup setup, Unmap unmap, Valid valid, Teardown teardown)
{
	return [=]() mutable {
		constexpr size_t batch = 32;
		MunmapSample s;
		double total = 0;
		size_t done = 0;
		while (done < iters) {
			const size_t n = std::min(batch, iters - done);
			std::vector<void *> p(n);
			std::vector<decltype(setup(nullptr))> h;
			for (size_t i = 0; i < n; i++) {
				p[i] = map_page(i);
				h.push_back(setup(p[i]));
			}
			for (size_t i = 0; i < n; i++) {
				int64_t t0 = now_ns();
				unmap(p[i]);
				total += double(now_ns() - t0);
				s.stale += valid(h[i]);
			}
			for (size_t i = 0; i < n; i++)
				teardown(p[i], h[i]);
			done += n;
		}
		s.ns = total / double(iters);
		return s;
	};
}

void write_all(int fd, const void *buf, size_t len)
{
	const char *p = static_cast<const char *>(buf);
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			throw verbs::Error("write to a munmap worker's pipe",
					   n < 0 ? errno : EPIPE);
		p += n;
		len -= size_t(n);
	}
}

// Two pipes (close-on-exec), a command channel and its answers: both or,
// with the first closed again, an exception.
void make_pipes(int a[2], int b[2])
{
	if (pipe2(a, O_CLOEXEC))
		throw verbs::Error("pipe", errno);
	if (pipe2(b, O_CLOEXEC)) {
		int err = errno;
		close(a[0]);
		close(a[1]);
		throw verbs::Error("pipe", err);
	}
}

bool read_all_bytes(int fd, void *buf, size_t len)
{
	char *p = static_cast<char *>(buf);
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= size_t(n);
	}
	return true;
}

// One variant in a process of its own. An mm keeps its mmu notifier
// registration from its first watch until it exits, so a baseline measured
// in a process that ever used memwatch (as every earlier section of this
// bench does) would already pay for it. The child makes its variant with
// @make and runs one repetition whenever the parent asks, so the parent
// can interleave the variants rep by rep.
class MunmapWorker
{
public:
	MunmapWorker(std::string name, const std::function<MunmapRep()> &make)
	    : name_(std::move(name))
	{
		int cmd[2], res[2];
		make_pipes(cmd, res);
		std::fflush(nullptr);
		pid_ = fork();
		if (pid_ < 0) {
			int err = errno;
			for (int fd : {cmd[0], cmd[1], res[0], res[1]})
				close(fd);
			throw verbs::Error("fork", err);
		}
		if (pid_ == 0) {
			// The other workers' parent ends came along: without
			// them, each worker's end of file is its own parent's.
			for (int fd : parent_fds())
				close(fd);
			close(cmd[1]);
			close(res[0]);
			int rc = 0;
			try {
				MunmapRep rep = make();
				char c;
				while (read_all_bytes(cmd[0], &c, 1)) {
					MunmapSample s = rep();
					write_all(res[1], &s, sizeof(s));
				}
			} catch (const std::exception &e) {
				std::fprintf(stderr, "bench memwatch: %s: %s\n", name_.c_str(),
					     e.what());
				rc = 1;
			}
			_exit(rc);
		}
		close(cmd[0]);
		close(res[1]);
		cmd_ = cmd[1];
		res_ = res[0];
		parent_fds().insert(parent_fds().end(), {cmd_, res_});
	}
	MunmapWorker(const MunmapWorker &) = delete;
	MunmapWorker &operator=(const MunmapWorker &) = delete;
	~MunmapWorker()
	{
		std::erase_if(parent_fds(), [&](int fd) { return fd == cmd_ || fd == res_; });
		close(cmd_); // the child's read ends: it exits
		close(res_);
		waitpid(pid_, nullptr, 0);
	}
	MunmapSample run()
	{
		char c = 'r';
		MunmapSample s;
		write_all(cmd_, &c, 1);
		if (!read_all_bytes(res_, &s, sizeof(s)))
			throw verbs::Error("the munmap worker '" + name_ + "' ended (see above)",
					   EIO);
		return s;
	}

private:
	// The pipe ends every live worker's parent holds.
	static std::vector<int> &parent_fds()
	{
		static std::vector<int> fds;
		return fds;
	}
	std::string name_;
	pid_t pid_ = -1;
	int cmd_ = -1, res_ = -1;
};

struct MunmapVariant {
	std::string name, note;
	std::function<MunmapRep()> make;
};

// Runs each variant in its own process, one warm-up each, then @reps rounds
// that ask every variant for one repetition in an order rotating from round
// to round; rows against the first variant, each with the range of its
// per-round ratios (a ratio "in every run") and, if @checks, of its stale
// answers among that many checks. Returns the medians.
std::vector<double> run_munmap_variants(Report &rep, const std::string &group,
					const std::string &param,
					const std::vector<MunmapVariant> &variants, unsigned reps,
					size_t checks)
{
	std::vector<std::unique_ptr<MunmapWorker>> workers;
	for (const auto &v : variants)
		workers.push_back(std::make_unique<MunmapWorker>(v.name, v.make));
	const size_t n = workers.size();
	std::vector<std::vector<double>> ns(n);
	std::vector<uint64_t> stale(n);
	for (auto &wk : workers)
		wk->run();
	for (unsigned r = 0; r < reps; r++)
		for (size_t k = 0; k < n; k++) {
			const size_t b = (r + k) % n;
			MunmapSample s = workers[b]->run();
			ns[b].push_back(s.ns);
			stale[b] += s.stale;
		}
	std::vector<double> medians;
	for (size_t v = 0; v < n; v++) {
		std::vector<double> per_round;
		for (unsigned r = 0; r < reps; r++)
			per_round.push_back(ns[v][r] / ns[0][r]);
		Spread ratio = spread_of(per_round);
		std::string note = variants[v].note;
		if (v) {
			char buf[64];
			std::snprintf(buf, sizeof(buf), "per round %.2f-%.2fx", ratio.min,
				      ratio.max);
			note += (note.empty() ? "" : "; ") + std::string(buf);
		}
		if (checks)
			note += "; " + std::to_string(stale[v]) + " stale of " +
				std::to_string(checks) + " checks right after munmap";
		Spread s = spread_of(ns[v]);
		medians.push_back(s.median);
		rep.add({group, param, variants[v].name, s, variants[0].name + "/" + param, note});
	}
	return medians;
}

// mmap + munmap of a page nobody watches while @n watches exist elsewhere:
// what every other unmap in the process pays for the mechanism. The ratio is
// against the same loop with no mechanism, in a process of its own that
// never used one.
void bench_unwatched_munmap(Report &rep, const Options &o)
{
	const std::string g = "mmap + munmap of an unwatched page, watches elsewhere";
	std::vector<size_t> counts = {1, 1000, 100000};
	if (!o.quick)
		counts.push_back(1000000);
	const size_t iters = o.quick ? 2000 : 5000;
	auto loop = [iters](auto unmap) {
		return [=]() mutable {
			int64_t t0 = now_ns();
			for (size_t i = 0; i < iters; i++)
				unmap(map_page());
			return MunmapSample{double(now_ns() - t0) / double(iters), 0};
		};
	};
	auto plain = [](void *p) {
		if (munmap(p, page))
			throw verbs::Error("munmap", errno);
	};
	for (size_t n : counts) {
		std::vector<MunmapVariant> variants = {
			{"none", "no mechanism ever used in the process",
			 [=] { return loop(plain); }},
			{"memwatch", "", [=]() -> MunmapRep {
				 auto r = std::make_shared<Region>(n);
				 auto mw = std::make_shared<Memwatch>(n);
				 for (size_t i = 0; i < n; i++)
					 mw->add(r->at(i), page, i);
				 // The watches live as long as the loop does.
				 return loop([plain, keep = std::make_pair(mw, r)](void *p) {
					 plain(p);
				 });
			 }}};
		if (o.uffd)
			variants.push_back(
				{"uffd", "", [=]() -> MunmapRep {
					 auto r = std::make_shared<Region>(n);
					 auto cache = std::make_shared<RangeCache>();
					 auto uffd = std::make_shared<UffdMonitor>(*cache);
					 for (size_t i = 0; i < n; i++)
						 uffd->watch(r->at(i), page);
					 return loop([plain, keep = std::make_pair(uffd, r)](
							     void *p) { plain(p); });
				 }});
		variants.push_back(
			{"hook", "a range-map lookup per munmap", [=]() -> MunmapRep {
				 auto r = std::make_shared<Region>(n);
				 auto cache = std::make_shared<RangeCache>();
				 for (size_t i = 0; i < n; i++)
					 cache->add(r->at(i), page);
				 return loop([=](void *p) { hooked_munmap(*cache, p, page); });
			 }});
		run_munmap_variants(rep, g, count_name(n), variants, o.reps, 0);
	}
}

// munmap of a watched page, timed alone; then the unmapping thread asks the
// cache at once. Any "still valid" answer is a stale registration handed out.
// Each variant runs in its own process, all interleaved rep by rep; the
// memwatch rows break the cost down: the mm's notifier with this page not
// watched, a watch whose callback runs but whose mask leaves the word alone,
// the default watch (word, seq, record), and the same with a reader thread
// waiting in poll(), woken at once or (MEMWATCH_IOC_SET_WAKE) 1 ms later.
void bench_watched_munmap(Report &rep, const Options &o)
{
	const std::string g = "munmap of a watched page", w = "1 watch";
	const size_t iters = o.quick ? 300 : 1000;
	auto none = [](void *) { return 0; };
	auto no_valid = [](int) { return false; };
	auto no_teardown = [](void *, int) {};
	auto plain_munmap = [](void *p) { munmap(p, page); };
	// A memwatch variant: @watch_it adds (or not) a watch of the page.
	auto memwatch_variant = [&](uint32_t mask, bool watch_it, bool reader,
				    uint32_t wake_delay_us = 0) {
		return [=]() -> MunmapRep {
			auto mw = std::make_shared<Memwatch>(64);
			if (wake_delay_us)
				mw->set_wake_delay(wake_delay_us);
			// Keeps the mm's notifier registered, away from the page.
			auto elsewhere = std::make_shared<Region>(2);
			mw->add(elsewhere->at(0), page, 0);
			std::shared_ptr<MemwatchReader> rd;
			if (reader)
				rd = std::make_shared<MemwatchReader>(*mw);
			// Unwatched: the same calls for another page.
			return munmap_rep(
				iters,
				[=](void *p) {
					return mw->add(watch_it ? p : elsewhere->at(1), page, 0,
						       mask);
				},
				plain_munmap,
				[=](const Memwatch::Watch &h) {
					// A masked-out reason leaves the word: not stale.
					return watch_it && mask == 0 && mw->valid(h);
				},
				[=, keep = elsewhere](void *, const Memwatch::Watch &h) {
					mw->remove(h.id);
					if (!rd)
						drain(*mw);
				});
		};
	};
	std::vector<MunmapVariant> variants = {
		{"none", "no mechanism ever used in the process",
		 [&] { return munmap_rep(iters, none, plain_munmap, no_valid, no_teardown); }},
		{"none, a thread in poll()",
		 "no mechanism; a second thread sleeps in poll() (as any monitor's does)",
		 [&] {
			 auto idle = std::make_shared<IdleThread>();
			 return munmap_rep(iters, none, plain_munmap, no_valid,
					   [idle](void *, int) {});
		 }},
		{"memwatch, another page watched",
		 "the same calls, for another page: the mm's notifier finds no watch",
		 memwatch_variant(0, false, false)},
		{"memwatch, reason masked out",
		 "the watch's callback runs; its mask leaves the word alone",
		 memwatch_variant(MEMWATCH_PROTECTION, true, false)},
		{"memwatch", "word, seq and a queued record; nobody waiting",
		 memwatch_variant(0, true, false)},
		{"memwatch, reader in poll()", "the same, and a thread waiting in poll() is woken",
		 memwatch_variant(0, true, true)},
		{"memwatch, reader in poll(), 1 ms wake delay",
		 "the same, the reader woken once for the changes of 1 ms (MEMWATCH_IOC_SET_WAKE)",
		 memwatch_variant(0, true, true, 1000)},
	};
	if (o.uffd)
		variants.push_back(
			{"uffd", "munmap waits until the monitor thread reads the event", [&] {
				 auto cache = std::make_shared<RangeCache>();
				 auto uffd = std::make_shared<UffdMonitor>(*cache);
				 return munmap_rep(
					 iters,
					 [=](void *p) {
						 uffd->watch(p, page);
						 return cache->add(p, page);
					 },
					 plain_munmap,
					 [](const std::atomic<bool> *f) {
						 return f->load(std::memory_order_acquire);
					 },
					 [=](void *p, const std::atomic<bool> *) {
						 cache->remove(p);
					 });
			 }});
	variants.push_back(
		{"hook", "a range-map lookup, then munmap", [&] {
			 auto cache = std::make_shared<RangeCache>();
			 return munmap_rep(
				 iters, [=](void *p) { return cache->add(p, page); },
				 [=](void *p) { hooked_munmap(*cache, p, page); },
				 [](const std::atomic<bool> *f) {
					 return f->load(std::memory_order_acquire);
				 },
				 [=](void *p, const std::atomic<bool> *) { cache->remove(p); });
		 }});

	std::vector<double> median =
		run_munmap_variants(rep, g, w, variants, o.reps, iters * o.reps);
	char remark[600];
	std::snprintf(remark, sizeof(remark),
		      "munmap of a watched page, where memwatch's %.0f ns over none go (medians, "
		      "each variant in its own process, interleaved): the mm's notifier "
		      "%.0f ns, the watch's callback %.0f ns, word + seq + record %.0f ns; a "
		      "reader in poll() adds %.0f ns, %.0f ns when it is woken 1 ms late; a "
		      "thread asleep in poll() on nothing, no memwatch, costs %.0f ns",
		      median[4] - median[0], median[2] - median[0], median[3] - median[2],
		      median[4] - median[3], median[5] - median[4], median[6] - median[4],
		      median[1] - median[0]);
	rep.remark(remark);
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

// A knob under /sys or /proc/sys, set for the life of this object and put
// back after.
class SysKnob
{
public:
	SysKnob(std::string path, const std::string &value) : path_(std::move(path))
	{
		old_ = read_knob(path_);
		write_knob(path_, value);
	}
	SysKnob(const SysKnob &) = delete;
	SysKnob &operator=(const SysKnob &) = delete;
	~SysKnob()
	{
		try {
			write_knob(path_, old_);
		} catch (const std::exception &e) {
			std::fprintf(stderr, "bench memwatch: %s\n", e.what());
		}
	}
	static std::string read_knob(const std::string &path)
	{
		FILE *f = std::fopen(path.c_str(), "r");
		if (!f)
			throw verbs::Error("open " + path, errno);
		char buf[64] = "";
		bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
		std::fclose(f);
		if (!ok)
			throw verbs::Error("read " + path, EIO);
		std::string s(buf);
		while (!s.empty() && s.back() == '\n')
			s.pop_back();
		return s;
	}
	static void write_knob(const std::string &path, const std::string &value)
	{
		FILE *f = std::fopen(path.c_str(), "w");
		if (!f)
			throw verbs::Error("open " + path, errno);
		bool ok = std::fputs(value.c_str(), f) >= 0;
		ok = std::fclose(f) == 0 && ok;
		if (!ok)
			throw verbs::Error("write " + value + " to " + path, errno);
	}

private:
	std::string path_, old_;
};

// KSM against a pinned-registration cache. ksm's write_protect_page()
// invalidates a page (CLEAR) before it compares the page's references with
// its mappings and gives up on a pinned one: every KSM pass that finds a
// pinned page with a twin changes its watch though the page stays. The
// cache re-registers, and the next pass does it again. 64 buffers of
// 4 pages, each with its MR and its watch, MADV_MERGEABLE; a cache that
// checks every buffer each 10 ms and re-registers (dereg, reg, watch) the
// ones that changed. Pages moved: frames that differ from the start.
void bench_ksm(Report &rep, const Options &o)
{
	const std::string ksm = "/sys/kernel/mm/ksm/";
	if (access((ksm + "run").c_str(), W_OK)) {
		rep.remark("KSM: not measured (" + ksm +
			   "run not writable: no CONFIG_KSM, or not root)");
		return;
	}
	const std::string g = "KSM passes over a pinned-registration cache's buffers";
	const size_t buffers = 64, pages = 4, len = pages * page;
	const double seconds = o.quick ? 3 : 10;
	verbs::Context ctx = verbs::open_device(o.device);
	verbs::Pd pd = verbs::alloc_pd(ctx.get());
	Pagemap pm;
	struct Variant {
		const char *name, *note;
		bool pinned, twins;
	};
	const Variant variants[] = {
		{"pinned, every page different", "no twins: KSM has nothing to try", true, false},
		{"pinned, every page equal", "each pass finds the pin and leaves the page alone",
		 true, true},
		{"not pinned, every page equal", "watched only: KSM merges each page once", false,
		 true},
	};
	// Stopped (and every page unmerged: 2) while the buffers are set up;
	// put back last, after the scan settings.
	SysKnob run(ksm + "run", "2");
	SysKnob sleep_ms(ksm + "sleep_millisecs", "10");
	SysKnob scan(ksm + "pages_to_scan", "1000");
	std::string summary;
	for (const Variant &v : variants) {
		Region r(buffers * pages);
		for (size_t i = 0; i < buffers * pages; i++) {
			// Equal pages, or each page marked with its number.
			std::memset(r.at(i), 0x5a, page);
			if (!v.twins)
				std::memcpy(r.at(i), &i, sizeof(i));
		}
		Memwatch mw(2 * buffers);
		std::vector<verbs::Mr> mrs(buffers);
		std::vector<Memwatch::Watch> w(buffers);
		auto reg = [&](size_t b) {
			if (v.pinned)
				mrs[b] = verbs::reg_mr(pd.get(), r.at(b * pages), len,
						       IBV_ACCESS_LOCAL_WRITE);
			w[b] = mw.add(r.at(b * pages), len, b);
		};
		for (size_t b = 0; b < buffers; b++)
			reg(b);
		const std::vector<uint64_t> before = pm.frames(r.at(0), buffers * pages);
		if (madvise(r.at(0), buffers * len, MADV_MERGEABLE))
			throw verbs::Error("madvise(MADV_MERGEABLE)", errno);
		SysKnob::write_knob(ksm + "run", "1");
		uint64_t again = 0;
		double reg_ns = 0;
		const int64_t t0 = now_ns();
		while (double(now_ns() - t0) < seconds * 1e9) {
			for (size_t b = 0; b < buffers; b++) {
				if (mw.valid(w[b]))
					continue;
				const int64_t r0 = now_ns();
				mw.remove(w[b].id);
				mrs[b].reset();
				reg(b);
				reg_ns += double(now_ns() - r0);
				again++;
			}
			drain(mw);
			std::this_thread::sleep_for(std::chrono::milliseconds(10));
		}
		SysKnob::write_knob(ksm + "run", "2"); // unmerge all, stop
		const std::vector<uint64_t> after = pm.frames(r.at(0), buffers * pages);
		size_t moved = 0;
		for (size_t i = 0; i < before.size(); i++)
			moved += before[i] != after[i];
		for (size_t b = 0; b < buffers; b++)
			mw.remove(w[b].id);
		mrs.clear();
		if (madvise(r.at(0), buffers * len, MADV_UNMERGEABLE))
			throw verbs::Error("madvise(MADV_UNMERGEABLE)", errno);
		const double per_s = double(again) / seconds;
		char note[256];
		std::snprintf(
			note, sizeof(note),
			"%s; %llu re-registrations in %.0f s (%.1f per s), %zu of %zu pages moved",
			v.note, (unsigned long long)again, seconds, per_s, moved, buffers * pages);
		rep.add({g,
			 std::to_string(buffers) + " buffers of " + std::to_string(len >> 10) +
				 " KiB",
			 v.name, spread_of({again ? reg_ns / double(again) : 0}),
			 std::string(v.name) + "/" + std::to_string(buffers) + " buffers of " +
				 std::to_string(len >> 10) + " KiB",
			 note});
		char s[160];
		std::snprintf(s, sizeof(s), "%s%s: %.1f re-registrations per s, %zu pages moved",
			      summary.empty() ? "" : "; ", v.name, per_s, moved);
		summary += s;
	}
	rep.remark("KSM (ns/op: one re-registration, dereg + reg + watch): " + summary);
}

// What a process's watches cost whoever invalidates its memory (issue 42,
// item 2): munmap of a region, reclaim of it (MADV_PAGEOUT, the work
// kswapd does page by page) and the process's exit. Variants: no memwatch
// ever, memwatch used but nothing watched here, 1k watches tiling the
// region, a watch per page, 1M page watches over 16 times the region (not
// QUICK, not at exit: a process adds them in ~30 s under TCG), and 16, 32
// and 256 watches each over all of it: 32 is the most the default
// vm.memwatch_max_overlap lets a process pile up, 256 was the default before
// (the section raises the sysctl for it). Each variant in a process of its
// own, interleaved.
struct Layout {
	std::string name, note;
	size_t count;  // watches
	size_t span;   // bytes each covers
	size_t stride; // bytes between their starts
};

constexpr uintptr_t region_at = uintptr_t{3} << 40; // clear of map_page()'s

void *map_region(size_t len, int fd)
{
	void *p = mmap(reinterpret_cast<void *>(region_at), len,
		       fd < 0 ? PROT_READ | PROT_WRITE : PROT_READ,
		       MAP_PRIVATE | MAP_FIXED_NOREPLACE | (fd < 0 ? MAP_ANONYMOUS : 0), fd, 0);
	if (p == MAP_FAILED)
		throw verbs::Error("mmap of the region at 3 TiB", errno);
	return p;
}

// Every page faulted in: written if anonymous, read if a file's.
void populate(void *p, size_t len, bool write)
{
	volatile char *c = static_cast<char *>(p);
	for (size_t off = 0; off < len; off += page)
		if (write)
			c[off] = 1;
		else
			(void)c[off];
}

size_t resident_pages(void *p, size_t len)
{
	std::vector<unsigned char> v(len / page);
	if (mincore(p, len, v.data()))
		throw verbs::Error("mincore", errno);
	return size_t(std::count_if(v.begin(), v.end(), [](unsigned char b) { return b & 1; }));
}

// A memwatch with @l's watches (and one elsewhere, so the mm's notifier is
// registered even with none here); none for no layout.
std::shared_ptr<Memwatch> watches_of(const Layout *l)
{
	if (!l)
		return nullptr;
	auto mw = std::make_shared<Memwatch>(l->count + 1);
	mw->add(map_page(), page, 0);
	for (size_t i = 0; i < l->count; i++)
		mw->add(reinterpret_cast<void *>(region_at + i * l->stride), l->span, i + 1);
	return mw;
}

MunmapSample timed(const std::function<void()> &f)
{
	int64_t t0 = now_ns();
	f();
	return MunmapSample{double(now_ns() - t0), 0};
}

void bench_others_pay(Report &rep, const Options &o)
{
	const std::string g = "invalidations others pay for: a region's munmap, reclaim and exit";
	const size_t len = size_t(o.quick ? 64 : 256) << 20, pages = len / page;
	std::vector<Layout> layouts = {
		{"memwatch, no watch here", "the mm's notifier; one watch elsewhere", 0, 0, 0},
		{"1k watches", "each over 1/1024 of the region", 1024, len / 1024, len / 1024},
		{"a watch per page", std::to_string(pages) + " watches", pages, page, page},
		{"16 watches over it all", "each over the whole region", 16, len, 0},
		{"32 watches over it all", "each over the whole region: the default overlap bound",
		 32, len, 0},
		{"256 watches over it all",
		 "each over the whole region: the bound before it was 32", 256, len, 0},
	};
	if (!o.quick)
		layouts.push_back({"1M page watches", "over 16 times the region", size_t{1} << 20,
				   page, page});
	// A file, not anonymous memory: the guest has no swap, and only clean
	// file pages are reclaimed without one. Beside the CSV (9p in the
	// guest: not tmpfs, whose pages need swap too); sparse, so no disk.
	const auto slash = o.csv.rfind('/');
	const std::string file =
		(slash == std::string::npos ? std::string("/out") : o.csv.substr(0, slash)) +
		"/.memwatch-reclaim";
	auto fd_guard = std::shared_ptr<int>(
		new int(open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)),
		[](int *f) {
			if (*f >= 0)
				close(*f);
			delete f;
		});
	const int fd = *fd_guard;
	if (fd < 0 || ftruncate(fd, off_t(len)))
		throw verbs::Error("the reclaim file " + file, errno);
	unlink(file.c_str());
	// Every layout's worker holds its watches at once, 1M and more
	// together: above the per-user default, raised for this section.
	size_t total = 0;
	for (const Layout &l : layouts)
		total += l.count + 1;
	const std::string limit_path = "/proc/sys/user/max_memwatch_watches";
	SysKnob limit(limit_path,
		      std::to_string(std::max<unsigned long long>(
			      std::stoull(SysKnob::read_knob(limit_path)), total + 1024)));
	SysKnob overlap("/proc/sys/vm/memwatch_max_overlap", "256");

	// Each layout in a worker of its own, "none" first. @exit_op: the
	// watches are made by the process that exits, each round (1M are
	// left out there: a process takes ~30 s to add them under TCG).
	auto variants = [&](const std::function<MunmapRep(const Layout *)> &op, bool exit_op) {
		std::vector<MunmapVariant> v = {
			{"none", "no memwatch ever in the process", [=] { return op(nullptr); }}};
		for (const Layout &l : layouts)
			if (!exit_op || l.count <= pages)
				v.push_back({l.name, l.note, [=] { return op(&l); }});
		return v;
	};

	auto munmap_op = [=](const Layout *l) -> MunmapRep {
		auto mw = watches_of(l);
		return [=] {
			void *p = map_region(len, -1);
			populate(p, len, true);
			if (mw)
				drain(*mw);
			return timed([=] { munmap(p, len); });
		};
	};
	run_munmap_variants(rep, g, "munmap", variants(munmap_op, false), o.reps, 0);

	auto reclaim_op = [=](const Layout *l) -> MunmapRep {
		auto mw = watches_of(l);
		return [=] {
			void *p = map_region(len, fd);
			populate(p, len, false);
			if (mw)
				drain(*mw);
			MunmapSample s = timed([=] { madvise(p, len, MADV_PAGEOUT); });
			// Reclaim must have happened, or nothing was measured.
			size_t left = resident_pages(p, len);
			munmap(p, len);
			if (left > pages / 10)
				throw verbs::Error("MADV_PAGEOUT left " + std::to_string(left) +
							   " of " + std::to_string(pages) +
							   " pages resident",
						   EAGAIN);
			return s;
		};
	};
	run_munmap_variants(rep, g, "reclaim (MADV_PAGEOUT)", variants(reclaim_op, false), o.reps,
			    0);

	// A child maps, populates and watches the region and exits when told:
	// timed from the word to waitpid()'s return.
	auto exit_op = [=](const Layout *l) -> MunmapRep {
		std::optional<Layout> layout;
		if (l)
			layout = *l;
		return [=] {
			int go[2], ready[2];
			make_pipes(go, ready);
			pid_t pid = fork();
			if (pid == 0) {
				char c = 0;
				try {
					auto mw = watches_of(layout ? &*layout : nullptr);
					populate(map_region(len, -1), len, true);
					if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
						_exit(2);
					_exit(0); // the watches still held: they go with the mm
				} catch (...) {
					_exit(1);
				}
			}
			close(go[0]);
			close(ready[1]);
			char c = 0;
			int status = 0;
			bool ok = pid > 0 && read(ready[0], &c, 1) == 1;
			MunmapSample s = timed([&] {
				ok = ok && write(go[1], &c, 1) == 1;
				if (pid > 0)
					waitpid(pid, &status, 0);
			});
			close(go[1]);
			close(ready[0]);
			if (!ok || !WIFEXITED(status) || WEXITSTATUS(status))
				throw verbs::Error("the exiting child failed", EIO);
			return s;
		};
	};
	run_munmap_variants(rep, g, "exit", variants(exit_op, true), o.reps, 0);
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
		 {"false positives under malloc", [&] { bench_malloc_false_positives(rep, o); }},
		 {"KSM over pinned registrations", [&] { bench_ksm(rep, o); }},
		 {"invalidations others pay for", [&] { bench_others_pay(rep, o); }}});
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
