// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ofi: memwatch as libfabric's memory monitor, imported with
// fi_import_fid() (odpwatch/ofi_monitor.h).
//
// libfabric calls subscribe, unsubscribe and valid with its own mm_lock held
// and takes that lock in notify; start and stop come without it. So the
// event thread never calls notify while holding mu_ (subscribe holds mm_lock
// and then takes mu_), and stop may join the thread. Lock order:
// notify_mu_, then libfabric's locks, then mu_.
//
// fork() waits until the event thread is out of notify (and so out of
// libfabric's locks) and holds mu_: a child never inherits either lock
// taken by a thread that does not exist in it.
#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/ofi_monitor.h>

#include <poll.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_ext.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace
{

using odpwatch::Memwatch;

bool debug()
{
	static const bool on = [] {
		const char *v = std::getenv("ODPWATCH_OFI_DEBUG");
		return v && *v && *v != '0';
	}();
	return on;
}

class MemwatchMonitor
{
public:
	static MemwatchMonitor &instance()
	{
		// Never destroyed: libfabric may call in until the process ends.
		static MemwatchMonitor *m = new MemwatchMonitor;
		return *m;
	}

	int import()
	{
		std::lock_guard lock(import_mu_);
		if (imported_)
			return -EALREADY;
		if (!Memwatch::supported())
			return -EOPNOTSUPP;
		fid_ = {};
		fid_.fid.fclass = FI_CLASS_MEM_MONITOR;
		fid_.export_ops = &ops_;
		int ret =
			fi_import(FI_VERSION(1, 13), "mr_cache", nullptr, 0, 0, &fid_.fid, nullptr);
		if (ret) {
			if (debug())
				std::fprintf(stderr, "odpwatch-ofi: fi_import: %s\n",
					     fi_strerror(-ret));
			return ret;
		}
		imported_ = true;
		if (debug())
			std::fprintf(stderr, "odpwatch-ofi: memwatch is libfabric's monitor\n");
		return 0;
	}

	int close()
	{
		std::lock_guard lock(import_mu_);
		if (!imported_)
			return -EINVAL;
		if (running_)
			return -EBUSY;
		int ret = fi_close(&fid_.fid);
		if (!ret)
			imported_ = false;
		return ret;
	}

	odpwatch_ofi_stats stats()
	{
		odpwatch_ofi_stats s{};
		{
			std::lock_guard lock(mu_);
			s.regions = regions_.size();
			s.hits = hits_;
			s.stale = stale_;
		}
		s.subscribes = subscribes_;
		s.unsubscribes = unsubscribes_;
		s.notifies = notifies_;
		s.events = events_;
		s.rescans = rescans_;
		s.refused = refused_;
		return s;
	}

private:
	// A watched region; libfabric may cache the same range more than once
	// (a cache per domain). A region whose word changed stays stale until
	// every subscriber is gone: valid() cannot tell the entries apart.
	struct Region {
		Memwatch::Watch watch;
		uint32_t subscribers;
	};
	using Key = std::pair<uintptr_t, size_t>;
	struct KeyHash {
		size_t operator()(const Key &k) const noexcept
		{
			return std::hash<uintptr_t>()(k.first ^ (k.second << 17));
		}
	};

	MemwatchMonitor()
	{
		pthread_atfork(
			[] {
				instance().notify_mu_.lock();
				instance().mu_.lock();
			},
			[] {
				instance().mu_.unlock();
				instance().notify_mu_.unlock();
			},
			[] {
				instance().mu_.unlock();
				instance().notify_mu_.unlock();
			});
	}

	static MemwatchMonitor &of(fid_mem_monitor *) { return instance(); }
	// In a child of fork() the memwatch descriptor is the parent's (EPERM
	// there), so the child caches nothing.
	bool foreign() const { return fork_generation_ != odpwatch::fork_generation(); }

	static int start(fid_mem_monitor *f)
	{
		MemwatchMonitor &m = of(f);
		if (m.foreign())
			return -FI_EPERM;
		try {
			m.mw_ = std::make_unique<Memwatch>();
			m.wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
			if (m.wake_fd_ < 0)
				throw odpwatch::verbs::Error("eventfd", errno);
			m.thread_ = std::make_unique<std::thread>([&m] { m.event_loop(); });
		} catch (const odpwatch::verbs::Error &e) {
			m.mw_.reset();
			// libfabric then runs without its MR cache, and says so
			// only at FI_LOG_LEVEL=warn: whoever preloaded memwatch
			// hears why, once per process.
			static std::once_flag said;
			std::call_once(said, [&e] {
				std::fprintf(
					stderr,
					"odpwatch-ofi: the memwatch monitor did not start (%s): "
					"libfabric's MR cache is off\n",
					e.what());
			});
			return -e.err();
		} catch (...) {
			m.mw_.reset();
			return -FI_ENOMEM;
		}
		m.running_ = true;
		return 0;
	}

	static void stop(fid_mem_monitor *f)
	{
		MemwatchMonitor &m = of(f);
		if (!m.running_)
			return;
		if (m.foreign()) {
			m.forget_parent();
			return;
		}
		const uint64_t one = 1;
		m.stopping_ = true; // seen even if poll() keeps failing
		if (write(m.wake_fd_, &one, sizeof(one)) < 0)
			std::perror("odpwatch-ofi: waking the event thread");
		m.thread_->join();
		m.thread_.reset();
		::close(m.wake_fd_);
		m.wake_fd_ = -1;
		m.stopping_ = false;
		m.errors_ = 0;
		std::lock_guard lock(m.mu_);
		m.regions_.clear();
		m.by_id_.clear();
		m.mw_.reset();
		m.running_ = false;
	}

	// stop() in a child of fork() that closed what it inherited: the event
	// thread and the other end of the wake-up eventfd are the parent's (a
	// wake-up would end the parent's thread). Drop the child's copies and
	// take the child as the owner: a cache it opens later starts a monitor
	// of its own. The thread object is let go, neither joined nor detached:
	// its thread does not exist here, and pthread_join or pthread_detach on
	// it is undefined (glibc may have given its descriptor to a new thread).
	void forget_parent()
	{
		(void)thread_.release();
		::close(wake_fd_);
		wake_fd_ = -1;
		std::lock_guard lock(mu_);
		regions_.clear();
		by_id_.clear();
		mw_.reset();
		running_ = false;
		fork_generation_ = odpwatch::fork_generation();
	}

	// The page-aligned range memwatch watches for [addr, addr + len).
	static std::pair<void *, size_t> pages(const void *addr, size_t len)
	{
		static const uintptr_t page = sysconf(_SC_PAGESIZE);
		const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
		const uintptr_t start = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
		return {reinterpret_cast<void *>(start), end - start};
	}

	static int subscribe(fid_mem_monitor *f, const void *addr, size_t len)
	{
		MemwatchMonitor &m = of(f);
		if (m.foreign() || !len) {
			m.refused_++;
			return -FI_EPERM; // libfabric keeps the MR, uncached
		}
		std::lock_guard lock(m.mu_);
		m.subscribes_++;
		const Key k{reinterpret_cast<uintptr_t>(addr), len};
		if (auto it = m.regions_.find(k); it != m.regions_.end()) {
			it->second.subscribers++;
			return 0;
		}
		try {
			auto [start, plen] = pages(addr, len);
			Memwatch::Watch w = m.mw_->add(start, plen, k.first);
			m.by_id_[w.id] = k;
			m.regions_.emplace(k, Region{w, 1});
		} catch (const odpwatch::verbs::Error &e) {
			m.refused_++;
			return -e.err();
		} catch (...) {
			m.refused_++;
			return -FI_ENOMEM;
		}
		return 0;
	}

	static void unsubscribe(fid_mem_monitor *f, const void *addr, size_t len)
	{
		MemwatchMonitor &m = of(f);
		std::lock_guard lock(m.mu_);
		auto it = m.regions_.find(Key{reinterpret_cast<uintptr_t>(addr), len});
		if (it == m.regions_.end())
			return;
		m.unsubscribes_++;
		if (--it->second.subscribers)
			return;
		if (!m.foreign()) {
			try {
				m.mw_->remove(it->second.watch.id);
			} catch (const odpwatch::verbs::Error &) {
				// The range is gone with its watch already.
			}
		}
		m.by_id_.erase(it->second.watch.id);
		m.regions_.erase(it);
	}

	// On every cache hit: one map lookup and one load of the region's word.
	static bool valid(fid_mem_monitor *f, const void *addr, size_t len)
	{
		MemwatchMonitor &m = of(f);
		if (m.foreign())
			return false;
		std::lock_guard lock(m.mu_);
		auto it = m.regions_.find(Key{reinterpret_cast<uintptr_t>(addr), len});
		const bool ok = it != m.regions_.end() && m.mw_->valid(it->second.watch);
		// Counted under the lock already held: no atomic on the hit path.
		(ok ? m.hits_ : m.stale_)++;
		return ok;
	}

	void notify(uintptr_t start, uintptr_t end)
	{
		std::lock_guard lock(notify_mu_);
		notifies_++;
		fid_.import_ops->notify(&fid_, reinterpret_cast<void *>(start), end - start);
	}

	// Whether an event is news for a region libfabric still caches: its
	// watch is live and its word changed. A record can outlive its watch:
	// the entry was uncached (valid() said stale) and its id given to the
	// watch of a new entry at the same address before this thread read the
	// record; flushing by the record's range would drop that new entry,
	// unchanged. Checking the word costs a miss at worst, never a stale hit.
	bool changed(uint32_t id)
	{
		std::lock_guard lock(mu_);
		auto it = by_id_.find(id);
		if (it == by_id_.end())
			return false;
		auto r = regions_.find(it->second);
		return r != regions_.end() && !mw_->valid(r->second.watch);
	}

	// Events name the changed sub-range: libfabric flushes the entries
	// overlapping it. Lost events (a full queue) lose no change, the words
	// keep it: then every region is checked.
	void event_loop()
	{
		pollfd fds[2] = {{mw_->fd(), POLLIN, 0}, {wake_fd_, POLLIN, 0}};
		for (;;) {
			if (poll(fds, 2, -1) < 0) {
				if (errno != EINTR) {
					if (!errors_++)
						std::perror("odpwatch-ofi: poll");
					if (stopping_)
						return;
					std::this_thread::sleep_for(kRetry);
				}
				continue;
			}
			if (fds[1].revents)
				return;
			try {
				while (auto ev = mw_->next_event()) {
					events_++;
					if (changed(ev->id))
						notify(ev->start, ev->end);
				}
				if (mw_->overflowed()) {
					mw_->clear_overflow();
					rescans_++;
					std::vector<Key> changed;
					{
						std::lock_guard lock(mu_);
						for (auto &[k, r] : regions_)
							if (!mw_->valid(r.watch))
								changed.push_back(k);
					}
					for (auto &[a, l] : changed)
						notify(a, a + l);
				}
			} catch (const odpwatch::verbs::Error &e) {
				// Not the end of the thread: without it a stale
				// region shared by two caches is flushed only when
				// each looks it up, and a cache that never does
				// makes the other register anew on every message.
				if (!errors_++)
					std::fprintf(stderr, "odpwatch-ofi: %s\n", e.what());
				std::this_thread::sleep_for(kRetry);
			}
			// Let a burst of unmaps gather: while this thread is not
			// waiting, memwatch queues their events without waking it,
			// and the thread calling munmap() pays no wake-up each.
			// valid() keeps the cache right in the meantime.
			std::this_thread::sleep_for(kCoalesce);
		}
	}

	static constexpr std::chrono::milliseconds kCoalesce{1};
	static constexpr std::chrono::milliseconds kRetry{10}; // after a failed poll or read

	// The process the monitor belongs to; a fork child takes it over in
	// forget_parent() (start and stop come from libfabric one at a time).
	std::atomic<uint64_t> fork_generation_{odpwatch::fork_generation()};
	std::mutex import_mu_;
	bool imported_ = false;
	fid_mem_monitor fid_{};
	fi_ops_mem_monitor ops_{
		.size = sizeof(fi_ops_mem_monitor),
		.start = start,
		.stop = stop,
		.subscribe = subscribe,
		.unsubscribe = unsubscribe,
		.valid = valid,
	};

	std::mutex notify_mu_; // held across notify: fork waits for it
	std::mutex mu_;	       // regions_, by_id_
	std::unordered_map<Key, Region, KeyHash> regions_;
	std::unordered_map<uint32_t, Key> by_id_; // the region of each live watch
	std::unique_ptr<Memwatch> mw_;
	std::unique_ptr<std::thread> thread_;
	int wake_fd_ = -1;
	std::atomic<bool> running_{false};
	uint64_t hits_ = 0, stale_ = 0; // under mu_
	std::atomic<uint64_t> subscribes_{0}, unsubscribes_{0};
	std::atomic<uint64_t> notifies_{0}, events_{0}, rescans_{0}, refused_{0};
	uint64_t errors_ = 0; // the event thread's failed polls and reads, told once
	std::atomic<bool> stopping_{false};
};

} // namespace

extern "C" {

int odpwatch_ofi_monitor_import(void)
{
	try {
		return MemwatchMonitor::instance().import();
	} catch (...) {
		return -ENOMEM;
	}
}

int odpwatch_ofi_monitor_close(void)
{
	try {
		return MemwatchMonitor::instance().close();
	} catch (...) {
		return -EIO;
	}
}

int odpwatch_ofi_monitor_stats(struct odpwatch_ofi_stats *stats)
{
	if (!stats)
		return -EINVAL;
	try {
		*stats = MemwatchMonitor::instance().stats();
		return 0;
	} catch (...) {
		return -EIO;
	}
}
}
