// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libodpwatch-ucx-preload.so: memwatch for an unmodified UCX (see
// odpwatch/ucx_preload.h for what it does and why it leaves no window).
// It interposes the verbs calls that pin and unpin UCX's registrations and
// the UCP calls that may look a user buffer up in UCX's cache; each forwards
// to the next definition (libibverbs, libucp).
#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/ucx_preload.h>

#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace
{

using odpwatch::Memwatch;

bool env_flag(const char *name, bool fallback)
{
	const char *v = std::getenv(name);
	return v && *v ? *v != '0' : fallback;
}

// Read at first use: a registration from another library's constructor may
// come before this one's static initialisers have run.
bool enabled()
{
	static const bool on = env_flag("ODPWATCH_UCX", true);
	return on;
}

// @name as @scope (RTLD_NEXT, RTLD_DEFAULT) finds it, or, when the library
// that has it was opened into a local scope (as UCX opens its transports),
// in that library if it is loaded; null if neither has it.
void *find_symbol(void *scope, const char *name, const char *library)
{
	if (void *sym = dlsym(scope, name))
		return sym;
	void *handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
	return handle ? dlsym(handle, name) : nullptr;
}

// The definition of @name that the program would have called without us.
template <typename Fn> Fn next_symbol(const char *name, const char *library)
{
	void *sym = find_symbol(RTLD_NEXT, name, library);
	if (!sym) {
		std::fprintf(stderr, "odpwatch-ucx: %s not found in %s\n", name, library);
		std::abort();
	}
	return reinterpret_cast<Fn>(sym);
}

using vm_munmap_fn = void (*)(void *, size_t);

struct Range {
	uintptr_t start;
	size_t len;
};

// The memwatch side of one process: a watch per pinned registration, and
// the drain that tells UCX of the ranges that changed.
class Watcher
{
public:
	Watcher()
	{
		try {
			mw_.emplace();
			if (const char *q = std::getenv("ODPWATCH_UCX_QUEUE"))
				set_queue(unsigned(std::strtoul(q, nullptr, 0)));
		} catch (const odpwatch::verbs::Error &e) {
			// Still correct without memwatch: every registration
			// is handed back to UCX at the next UCP call.
			std::fprintf(stderr,
				     "odpwatch-ucx: no memwatch (%s): each registration of UCX "
				     "serves until the next UCP call\n",
				     e.what());
		}
	}

	// ADD before the pages are pinned: the watch's id, or none (the range
	// is then invalidated at the next call).
	std::optional<Memwatch::Watch> watch(const void *addr, size_t len)
	{
		if (!mw_)
			return std::nullopt;
		const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
		const uintptr_t start = uintptr_t(addr) & ~(page - 1);
		const uintptr_t end = (uintptr_t(addr) + len + page - 1) & ~(page - 1);
		try {
			return mw_->add(reinterpret_cast<void *>(start), end - start, 0);
		} catch (const odpwatch::verbs::Error &) {
			return std::nullopt;
		}
	}

	// After the registration: its watch is its own until deregistration.
	void registered(ibv_mr *mr, const void *addr, size_t len,
			const std::optional<Memwatch::Watch> &w)
	{
		if (!mr) {
			if (w)
				remove(w->id);
			return;
		}
		stats_.registrations++;
		bool moved = false;
		try {
			std::lock_guard g(table_lock_);
			if (w) {
				stats_.watched++;
				by_mr_[mr] = w->id;
				// A drain between ADD and here found no entry
				// for the watch's event and dropped it: the word
				// tells. Checked under the lock, so either this
				// sees the change or a later drain finds the
				// entry.
				moved = !mw_->valid(*w);
				by_id_[w->id] = Entry{{uintptr_t(addr), len}, *w, moved};
			} else {
				stats_.unwatched++;
				unwatched_.push_back({uintptr_t(addr), len});
				pending_.store(true);
			}
		} catch (...) {
			// No memory to file it: UCX drops the region now and
			// registers again at its next use.
			moved = true;
		}
		if (moved) {
			// Before UCX has the registration: its region is in
			// the cache already and is invalidated before use.
			stats_.invalidations++;
			tell_range({uintptr_t(addr), len});
		}
	}

	// The watch of @mr, taken out of the table before the deregistration
	// (so that a registration that reuses the pointer is not confused
	// with it); put back if the deregistration fails.
	std::optional<uint32_t> take(ibv_mr *mr)
	{
		std::lock_guard g(table_lock_);
		const auto it = by_mr_.find(mr);
		if (it == by_mr_.end())
			return std::nullopt;
		const uint32_t id = it->second;
		by_mr_.erase(it);
		return id;
	}
	void put_back(ibv_mr *mr, uint32_t id)
	{
		std::lock_guard g(table_lock_);
		by_mr_[mr] = id;
	}
	// REMOVE after the pages are unpinned.
	void remove(uint32_t id)
	{
		{
			std::lock_guard g(table_lock_);
			by_id_.erase(id);
		}
		try {
			mw_->remove(id);
		} catch (const odpwatch::verbs::Error &) {
			// The watch is gone with its registration either way.
		}
	}
	void deregistered() { stats_.deregistrations++; }

	// What every UCP call costs (memwatch's seq and two flags):
	// anything to tell UCX?
	bool quiet() const noexcept
	{
		return !pending_.load() && !draining_.load() &&
		       (!mw_ || mw_->seq() == seen_.load(std::memory_order_acquire));
	}
	bool mine() const noexcept { return !mw_ || mw_->mine(); }

	// Reads the events and passes each changed watch's range to UCX as
	// unmapped, before this thread (or any other that finds seq moved)
	// goes on to UCX's cache.
	void drain()
	{
		// Held while UCX is told, so that a thread finding seq moved
		// waits for the ranges to reach UCX; recursive, should UCX's
		// callbacks call UCP again.
		std::lock_guard d(drain_lock_);
		// Until UCX has been told, no thread may take the quiet path
		// (pending_ is cleared first, so that a refused watch during
		// the drain sets it again).
		draining_++;
		std::vector<Range> todo;
		pending_.store(false);
		const uint64_t seq = mw_ ? mw_->seq() : 0;
		try {
			std::lock_guard g(table_lock_);
			todo.swap(unwatched_);
			if (mw_)
				collect(todo);
		} catch (...) {
			// No memory for the list: UCX drops every region, which
			// is always correct.
			todo.clear();
			tell_range({0, SIZE_MAX});
		}
		stats_.drains++;
		stats_.invalidations += todo.size();
		for (const Range &r : todo)
			tell_range(r);
		seen_.store(seq, std::memory_order_release);
		draining_--;
	}

	odpwatch_ucx_stats stats() const
	{
		odpwatch_ucx_stats s{};
		s.registrations = stats_.registrations;
		s.on_demand = on_demand_.load();
		s.watched = stats_.watched;
		s.unwatched = stats_.unwatched;
		s.deregistrations = stats_.deregistrations;
		s.drains = stats_.drains;
		s.invalidations = stats_.invalidations;
		s.overflows = stats_.overflows;
		return s;
	}
	void count_on_demand() { on_demand_++; }

private:
	struct Entry {
		Range range;
		Memwatch::Watch watch;
		bool told; // its range went to UCX already
	};

	// Under table_lock_: the watches whose words moved, from the events,
	// or from every word after an overflow (cleared first, so that a
	// change during the scan sets it again).
	void collect(std::vector<Range> &todo)
	{
		auto changed = [&](Entry &e) {
			if (!e.told && !mw_->valid(e.watch)) {
				e.told = true;
				todo.push_back(e.range);
			}
		};
		try {
			// The kernel sets overflow after seq: a drain that
			// loaded the new seq may find it only once read() has
			// taken the queue's lock, so it is checked again after
			// the events until it stays clear.
			for (bool more = true; more;) {
				if (mw_->overflowed()) {
					mw_->clear_overflow();
					stats_.overflows++;
					for (auto &[id, e] : by_id_)
						changed(e);
				}
				while (const auto ev = mw_->next_event()) {
					const auto it = by_id_.find(ev->id);
					if (it != by_id_.end())
						changed(it->second);
				}
				more = mw_->overflowed();
			}
		} catch (const odpwatch::verbs::Error &) {
			// A read that failed is no news: scan every word instead.
			for (auto &[id, e] : by_id_)
				changed(e);
		}
	}

	// The event queue's size in records (ODPWATCH_UCX_QUEUE; the test of
	// the overflow path makes it tiny).
	void set_queue(unsigned records)
	{
		memwatch_queue q{};
		q.size = records;
		if (ioctl(mw_->fd(), MEMWATCH_IOC_SET_QUEUE, &q))
			std::fprintf(stderr, "odpwatch-ucx: ODPWATCH_UCX_QUEUE=%u: %s\n", records,
				     std::strerror(errno));
	}

	// UCX's cache invalidates the range before its next lookup. Without
	// ucm there is no UCX in the process, and no cache to tell (said
	// once).
	static void tell_range(const Range &r)
	{
		if (const vm_munmap_fn vm_munmap = ucm_vm_munmap()) {
			vm_munmap(reinterpret_cast<void *>(r.start), r.len);
			return;
		}
		static std::once_flag said;
		std::call_once(said, [] {
			std::fprintf(stderr, "odpwatch-ucx: no ucm_vm_munmap() in this process: no "
					     "UCX to tell of changed registrations\n");
		});
	}

	static vm_munmap_fn ucm_vm_munmap()
	{
		static std::atomic<vm_munmap_fn> fn{nullptr};
		vm_munmap_fn f = fn.load(std::memory_order_acquire);
		if (!f) {
			f = reinterpret_cast<vm_munmap_fn>(
				find_symbol(RTLD_DEFAULT, "ucm_vm_munmap", "libucm.so.0"));
			fn.store(f, std::memory_order_release);
		}
		return f;
	}

	std::optional<Memwatch> mw_;
	std::mutex table_lock_;
	std::recursive_mutex drain_lock_;
	std::unordered_map<ibv_mr *, uint32_t> by_mr_;
	std::unordered_map<uint32_t, Entry> by_id_;
	std::vector<Range> unwatched_;
	std::atomic<bool> pending_{false};
	std::atomic<int> draining_{0};
	std::atomic<uint64_t> seen_{~uint64_t{0}};
	std::atomic<uint64_t> on_demand_{0};
	struct {
		std::atomic<uint64_t> registrations{0}, watched{0}, unwatched{0},
			deregistrations{0}, drains{0}, invalidations{0}, overflows{0};
	} stats_;
};

std::atomic<Watcher *> current{nullptr};
std::mutex create_lock;

// This process's watcher, made at its first registration. A child of
// fork() makes its own (the parent's state area is not inherited); the
// parent's object is left behind, never destroyed: its destructor would
// unmap an address the child may have reused, and close a descriptor
// number the child may have reused too (exec closes it: CLOEXEC).
Watcher *watcher()
{
	Watcher *w = current.load(std::memory_order_acquire);
	if (w && w->mine())
		return w;
	std::lock_guard g(create_lock);
	w = current.load(std::memory_order_acquire);
	if (w && w->mine())
		return w;
	w = new Watcher;
	current.store(w, std::memory_order_release);
	return w;
}

// A fork() while another thread makes the watcher must not leave the
// child a held lock.
[[gnu::constructor]] void guard_create_lock_across_fork()
{
	pthread_atfork([] { create_lock.lock(); }, [] { create_lock.unlock(); },
		       [] { create_lock.unlock(); });
}

// This process's watcher if it has one already.
Watcher *existing_watcher()
{
	Watcher *w = current.load(std::memory_order_acquire);
	return w && w->mine() ? w : nullptr;
}

inline void before_ucp_call()
{
	Watcher *w = existing_watcher();
	if (w && !w->quiet())
		w->drain();
}

// Set while this thread is in a registration we interposed: libibverbs'
// ibv_reg_mr() calls ibv_reg_mr_iova2() through its PLT, which would
// otherwise watch the same registration twice.
thread_local bool registering = false;

template <typename Reg> ibv_mr *register_watched(void *addr, size_t len, unsigned access, Reg reg)
{
	if (!enabled() || !len || registering)
		return reg();
	registering = true;
	struct Done {
		~Done() { registering = false; }
	} done;
	Watcher *w = watcher();
	if (access & IBV_ACCESS_ON_DEMAND) {
		// Registrations on demand follow the address space.
		w->count_on_demand();
		return reg();
	}
	const auto watch = w->watch(addr, len);
	ibv_mr *mr = reg();
	const int saved = errno;
	w->registered(mr, addr, len, watch);
	errno = saved;
	return mr;
}

__attribute__((destructor)) void report()
{
	odpwatch_ucx_stats s{};
	if (!env_flag("ODPWATCH_UCX_DEBUG", false) || odpwatch_ucx_preload_stats(&s))
		return;
	std::fprintf(stderr,
		     "odpwatch-ucx: stats registrations=%lu watched=%lu unwatched=%lu "
		     "on_demand=%lu deregistrations=%lu drains=%lu invalidations=%lu "
		     "overflows=%lu\n",
		     (unsigned long)s.registrations, (unsigned long)s.watched,
		     (unsigned long)s.unwatched, (unsigned long)s.on_demand,
		     (unsigned long)s.deregistrations, (unsigned long)s.drains,
		     (unsigned long)s.invalidations, (unsigned long)s.overflows);
}

} // namespace

extern "C" {

int odpwatch_ucx_preload_stats(odpwatch_ucx_stats *stats)
{
	if (!enabled())
		return -ENOENT;
	if (!stats)
		return -EINVAL;
	const Watcher *w = existing_watcher();
	*stats = w ? w->stats() : odpwatch_ucx_stats{};
	return 0;
}

void odpwatch_ucx_preload_sync(void)
{
	if (enabled())
		before_ucp_call();
}

// The verbs calls that pin and unpin UCX's registrations (libuct_ib calls
// ibv_reg_mr_iova2; the other two for any other user of the process).
#define ODPWATCH_EXPORT __attribute__((visibility("default")))

// In parentheses: verbs.h makes ibv_reg_mr and ibv_reg_mr_iova macros.
ODPWATCH_EXPORT ibv_mr *(ibv_reg_mr)(ibv_pd *pd, void *addr, size_t length, int access)
{
	static const auto real =
		next_symbol<decltype(&ibv_reg_mr)>("ibv_reg_mr", "libibverbs.so.1");
	return register_watched(addr, length, unsigned(access),
				[&] { return real(pd, addr, length, access); });
}

ODPWATCH_EXPORT ibv_mr *(ibv_reg_mr_iova)(ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					  int access)
{
	static const auto real =
		next_symbol<decltype(&ibv_reg_mr_iova)>("ibv_reg_mr_iova", "libibverbs.so.1");
	return register_watched(addr, length, unsigned(access),
				[&] { return real(pd, addr, length, iova, access); });
}

ODPWATCH_EXPORT ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					 unsigned int access)
{
	static const auto real =
		next_symbol<decltype(&ibv_reg_mr_iova2)>("ibv_reg_mr_iova2", "libibverbs.so.1");
	return register_watched(addr, length, access,
				[&] { return real(pd, addr, length, iova, access); });
}

ODPWATCH_EXPORT int ibv_dereg_mr(ibv_mr *mr)
{
	static const auto real =
		next_symbol<decltype(&ibv_dereg_mr)>("ibv_dereg_mr", "libibverbs.so.1");
	Watcher *w = enabled() ? existing_watcher() : nullptr;
	const auto id = w ? w->take(mr) : std::nullopt;
	const int rc = real(mr);
	if (w && rc == 0) {
		w->deregistered();
		if (id)
			w->remove(*id);
	} else if (id) {
		w->put_back(mr, *id);
	}
	return rc;
}

// The UCP calls that may look a user buffer up in UCX's cache: each first
// tells UCX of what changed, then calls UCP's own.
#define ODPWATCH_BEFORE_UCP(ret, name, params, args)                                               \
	ODPWATCH_EXPORT ret name params                                                            \
	{                                                                                          \
		before_ucp_call();                                                                 \
		static const auto real = next_symbol<decltype(&name)>(#name, "libucp.so.0");       \
		return real args;                                                                  \
	}

ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_send_nbx,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
		     const ucp_request_param_t *param),
		    (ep, buffer, count, tag, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_send_sync_nbx,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_tag_t tag,
		     const ucp_request_param_t *param),
		    (ep, buffer, count, tag, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_recv_nbx,
		    (ucp_worker_h worker, void *buffer, size_t count, ucp_tag_t tag,
		     ucp_tag_t tag_mask, const ucp_request_param_t *param),
		    (worker, buffer, count, tag, tag_mask, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_msg_recv_nbx,
		    (ucp_worker_h worker, void *buffer, size_t count, ucp_tag_message_h message,
		     const ucp_request_param_t *param),
		    (worker, buffer, count, message, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_put_nbx,
		    (ucp_ep_h ep, const void *buffer, size_t count, uint64_t remote_addr,
		     ucp_rkey_h rkey, const ucp_request_param_t *param),
		    (ep, buffer, count, remote_addr, rkey, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_get_nbx,
		    (ucp_ep_h ep, void *buffer, size_t count, uint64_t remote_addr, ucp_rkey_h rkey,
		     const ucp_request_param_t *param),
		    (ep, buffer, count, remote_addr, rkey, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_am_send_nbx,
		    (ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
		     const void *buffer, size_t count, const ucp_request_param_t *param),
		    (ep, id, header, header_length, buffer, count, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_am_recv_data_nbx,
		    (ucp_worker_h worker, void *data_desc, void *buffer, size_t count,
		     const ucp_request_param_t *param),
		    (worker, data_desc, buffer, count, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_stream_send_nbx,
		    (ucp_ep_h ep, const void *buffer, size_t count,
		     const ucp_request_param_t *param),
		    (ep, buffer, count, param))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_stream_recv_nbx,
		    (ucp_ep_h ep, void *buffer, size_t count, size_t *length,
		     const ucp_request_param_t *param),
		    (ep, buffer, count, length, param))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_mem_map,
		    (ucp_context_h context, const ucp_mem_map_params_t *params, ucp_mem_h *memh_p),
		    (context, params, memh_p))
// The older calls UCP still exports (ucp_put() and ucp_get() block).
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_put,
		    (ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey),
		    (ep, buffer, length, remote_addr, rkey))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_get,
		    (ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey),
		    (ep, buffer, length, remote_addr, rkey))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_send_nb,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_t tag, ucp_send_callback_t cb),
		    (ep, buffer, count, datatype, tag, cb))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_tag_send_nbr,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_t tag, void *req),
		    (ep, buffer, count, datatype, tag, req))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_send_sync_nb,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_t tag, ucp_send_callback_t cb),
		    (ep, buffer, count, datatype, tag, cb))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_recv_nb,
		    (ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_t tag, ucp_tag_t tag_mask, ucp_tag_recv_callback_t cb),
		    (worker, buffer, count, datatype, tag, tag_mask, cb))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_tag_recv_nbr,
		    (ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_t tag, ucp_tag_t tag_mask, void *req),
		    (worker, buffer, count, datatype, tag, tag_mask, req))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_tag_msg_recv_nb,
		    (ucp_worker_h worker, void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_tag_message_h message, ucp_tag_recv_callback_t cb),
		    (worker, buffer, count, datatype, message, cb))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_put_nb,
		    (ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey, ucp_send_callback_t cb),
		    (ep, buffer, length, remote_addr, rkey, cb))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_put_nbi,
		    (ucp_ep_h ep, const void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey),
		    (ep, buffer, length, remote_addr, rkey))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_get_nb,
		    (ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey, ucp_send_callback_t cb),
		    (ep, buffer, length, remote_addr, rkey, cb))
ODPWATCH_BEFORE_UCP(ucs_status_t, ucp_get_nbi,
		    (ucp_ep_h ep, void *buffer, size_t length, uint64_t remote_addr,
		     ucp_rkey_h rkey),
		    (ep, buffer, length, remote_addr, rkey))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_am_send_nb,
		    (ucp_ep_h ep, uint16_t id, const void *buffer, size_t count,
		     ucp_datatype_t datatype, ucp_send_callback_t cb, unsigned flags),
		    (ep, id, buffer, count, datatype, cb, flags))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_stream_send_nb,
		    (ucp_ep_h ep, const void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_send_callback_t cb, unsigned flags),
		    (ep, buffer, count, datatype, cb, flags))
ODPWATCH_BEFORE_UCP(ucs_status_ptr_t, ucp_stream_recv_nb,
		    (ucp_ep_h ep, void *buffer, size_t count, ucp_datatype_t datatype,
		     ucp_stream_recv_callback_t cb, size_t *length, unsigned flags),
		    (ep, buffer, count, datatype, cb, length, flags))

} // extern "C"
