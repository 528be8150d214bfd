// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Model-based stress of memwatch and rxe ODP: a seeded random sequence of
// operations on a few buffer slots (map, munmap, mremap, madvise, CPU
// writes, fork with a child that writes and exits, memwatch create / add /
// remove / read / close, explicit ODP, implicit ODP and pinned registration,
// prefetch, RDMA WRITE, READ and SEND on two QPs, SEND through the
// registration cache's pinned policy), each checked against a model of what
// the slots hold:
//   - a watch the kernel still reports valid after its range changed,
//   - bytes moved through an ODP MR or a cached registration that are not
//     the current mapping's, or
//   - a cached registration dropped although nothing changed its pages
// is a failure. (The last is checked on the cache's pinned entries only:
// pinned pages are not migrated, so nothing but the model's operations can
// change them; an unpinned watched page may move for NUMA balancing or
// compaction, a true change the model does not see.) The seed is printed first: the same seed
// replays the run.
//   odpwatch-stress [--seed N] [--seconds S] [--steps N]
#include "check.hpp"
#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/regcache.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

using namespace odpwatch;
using odpwatch::test::Failure;

namespace
{

constexpr size_t kSlots = 8, kLen = 64 << 10;
constexpr unsigned kOdp = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ;
constexpr unsigned kPinned =
	IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

char *slot_at(size_t i)
{
	return reinterpret_cast<char *>((uintptr_t{9} << 40) + i * (uintptr_t{1} << 24));
}

// What the model knows of one slot.
struct Slot {
	bool mapped = false;
	unsigned char fill = 0;		      // every byte of the mapping
	std::optional<Memwatch::Watch> watch; // its watch, if any
	bool changed = false;		      // the range changed since the watch was added
	verbs::Mr odp;			      // an explicit ODP MR over the slot, if any
	bool cached = false;		      // the cache holds a registration of the current pages
};

struct CacheDeleter {
	void operator()(odpwatch_cache *c) const noexcept { odpwatch_cache_destroy(c); }
};

std::unique_ptr<odpwatch_cache, CacheDeleter> pinned_cache()
{
	odpwatch_cache_attr a{};
	a.policy = ODPWATCH_CACHE_PINNED;
	odpwatch_cache *c = nullptr;
	if (int rc = odpwatch_cache_create(&a, &c))
		throw verbs::Error("odpwatch_cache_create", -rc);
	return std::unique_ptr<odpwatch_cache, CacheDeleter>(c);
}

class Stress
{
public:
	explicit Stress(uint64_t seed) : rng_(seed)
	{
		for (auto &q : qps_)
			q = std::make_unique<verbs::LoopbackQp>(ctx_.get(), pd_.get());
		local_mr_ = verbs::reg_mr(pd_.get(), local_.data(), kLen, kPinned);
		mw_ = std::make_unique<Memwatch>(1024);
	}
	~Stress()
	{
		for (size_t i = 0; i < kSlots; i++)
			if (slots_[i].mapped)
				munmap(slot_at(i), kLen);
	}

	void step(uint64_t n)
	{
		step_ = n;
		const size_t i = rng_() % kSlots;
		switch (rng_() % 16) {
		case 0:
			op("map", [&] { map(i); });
			break;
		case 1:
			op("munmap", [&] { unmap(i); });
			break;
		case 2:
			op("mremap", [&] { move(i, rng_() % kSlots); });
			break;
		case 3:
			op("madvise(DONTNEED)", [&] { dontneed(i); });
			break;
		case 4:
			op("cpu write", [&] { cpu_write(i); });
			break;
		case 5:
			op("fork", [&] { fork_child(i); });
			break;
		case 6:
			op("watch add", [&] { watch(i); });
			break;
		case 7:
			op("watch remove", [&] { unwatch(i); });
			break;
		case 8:
			op("memwatch read", [&] { drain(); });
			break;
		case 9:
			op("memwatch close+create", [&] { recreate(); });
			break;
		case 10:
			op("ODP reg/dereg", [&] { reg_toggle(i); });
			break;
		case 11:
			op("advise_mr", [&] { advise(i); });
			break;
		case 12:
			op("RDMA READ", [&] { rdma_read(i); });
			break;
		case 13:
			op("RDMA WRITE", [&] { rdma_write(i); });
			break;
		case 14:
			op("SEND (pinned)", [&] { send_pinned(i); });
			break;
		default:
			op("SEND (cache)", [&] { send_cached(i); });
			break;
		}
		check_watches();
	}
	void report() const
	{
		uint64_t total = 0;
		for (auto &[name, n] : counts_)
			total += n;
		std::printf("# %lu operations:", (unsigned long)total);
		for (auto &[name, n] : counts_)
			std::printf(" %s %lu,", name.c_str(), (unsigned long)n);
		std::printf(" %lu checks\n", (unsigned long)checks_);
	}

private:
	template <class F> void op(const char *name, F &&f)
	{
		name_ = name;
		pair_ = -1;
		f();
		counts_[name]++;
		done_[n_done_++ % done_.size()] = {step_, name, pair_};
	}
	// For a completion in error: the QP pair's states, rxe's counters
	// that tell a dead responder (in ERR, it drops every request unseen)
	// from a slow one, and the steps before with the pair each used.
	std::string qp_report()
	{
		if (pair_ < 0)
			return "";
		std::string r =
			"; QP pair " + std::to_string(pair_) + ": " + qps_[size_t(pair_)]->states();
		const std::string dir = std::string("/sys/class/infiniband/") +
					ibv_get_device_name(ctx_->device) + "/ports/1/hw_counters/";
		for (const char *c : {"duplicate_request", "completer_retry_err",
				      "retry_exceeded_err", "ack_deferred", "rdma_recvs"}) {
			std::ifstream f(dir + c);
			unsigned long v = 0;
			if (f >> v)
				r += std::string(", ") + c + " " + std::to_string(v);
		}
		r += "; the steps before:";
		for (size_t k = n_done_ - std::min(n_done_, done_.size()); k < n_done_; k++) {
			const Done &d = done_[k % done_.size()];
			r += " " + std::to_string(d.step) + " " + d.name +
			     (d.pair >= 0 ? " (pair " + std::to_string(d.pair) + ")" : "") + ",";
		}
		return r;
	}
	[[noreturn]] void fail(const std::string &what)
	{
		throw Failure("step " + std::to_string(step_) + " (" + name_ + "): " + what);
	}
	void changed(size_t i)
	{
		if (slots_[i].watch)
			slots_[i].changed = true;
		slots_[i].cached = false;
	}
	void map(size_t i)
	{
		Slot &s = slots_[i];
		if (s.mapped)
			return;
		void *p = mmap(slot_at(i), kLen, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != slot_at(i))
			fail("mmap: " + std::string(strerror(errno)));
		s.fill = static_cast<unsigned char>(rng_());
		std::memset(p, s.fill, kLen);
		s.mapped = true;
	}
	void unmap(size_t i)
	{
		Slot &s = slots_[i];
		if (!s.mapped)
			return;
		munmap(slot_at(i), kLen);
		s.mapped = false;
		changed(i);
	}
	void move(size_t from, size_t to)
	{
		if (!slots_[from].mapped || from == to)
			return;
		unmap(to);
		if (mremap(slot_at(from), kLen, kLen, MREMAP_MAYMOVE | MREMAP_FIXED, slot_at(to)) ==
		    MAP_FAILED)
			fail("mremap: " + std::string(strerror(errno)));
		slots_[to].mapped = true;
		slots_[to].fill = slots_[from].fill;
		slots_[to].cached = false; // pages that were registered at another address
		slots_[from].mapped = false;
		// Only the source changed: a mapping arriving where nothing was
		// mapped invalidates nothing (a mapped destination was unmapped,
		// and counted, just above).
		changed(from);
	}
	void dontneed(size_t i)
	{
		Slot &s = slots_[i];
		if (!s.mapped)
			return;
		madvise(slot_at(i), kLen, MADV_DONTNEED);
		s.fill = 0; // private anonymous memory comes back zeroed
		changed(i);
	}
	void cpu_write(size_t i)
	{
		Slot &s = slots_[i];
		if (!s.mapped)
			return;
		s.fill = static_cast<unsigned char>(rng_());
		std::memset(slot_at(i), s.fill, kLen);
	}
	// The child writes its copy of the slot and exits; the parent then
	// writes its own (breaking COW): the parent's ODP MR must see the
	// parent's bytes, never the child's.
	void fork_child(size_t i)
	{
		if (!slots_[i].mapped)
			return;
		pid_t pid = fork();
		if (pid < 0)
			fail("fork: " + std::string(strerror(errno)));
		if (pid == 0) {
			std::memset(slot_at(i), 0xee, kLen);
			_exit(0);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			fail("the child did not exit cleanly");
		cpu_write(i);
		rdma_read(i);
	}
	void watch(size_t i)
	{
		Slot &s = slots_[i];
		if (s.watch || !mw_)
			return;
		s.watch = mw_->add(slot_at(i), kLen, i);
		s.changed = false;
	}
	void unwatch(size_t i)
	{
		Slot &s = slots_[i];
		if (!s.watch)
			return;
		mw_->remove(s.watch->id);
		s.watch.reset();
	}
	void drain()
	{
		if (!mw_)
			return;
		while (auto ev = mw_->next_event())
			if (ev->cookie >= kSlots)
				fail("an event with cookie " + std::to_string(ev->cookie));
		if (mw_->overflowed())
			mw_->clear_overflow();
	}
	void recreate()
	{
		for (Slot &s : slots_)
			s.watch.reset();
		mw_.reset();
		if (rng_() % 4)
			mw_ = std::make_unique<Memwatch>(1024);
	}
	void reg_toggle(size_t i)
	{
		Slot &s = slots_[i];
		if (s.odp)
			s.odp.reset();
		else
			s.odp = verbs::reg_mr(pd_.get(), slot_at(i), kLen, kOdp);
	}
	// Posts one operation; a completion in error fails the step with its
	// status and the remote MR it went through.
	void transfer(ibv_wr_opcode op, const char *what, ibv_mr *local, void *laddr,
		      ibv_mr *remote, void *raddr)
	{
		ibv_wc_status st =
			qp().rdma(op, local, laddr, kLen, remote, raddr, std::chrono::minutes(5));
		if (st != IBV_WC_SUCCESS)
			fail(std::string(what) + " completed with '" + ibv_wc_status_str(st) +
			     "' (remote MR: " + mr_kind(remote) + ")" + qp_report());
	}
	// What the "remote" MR of a transfer is: a SEND's lands in local_.
	const char *mr_kind(const ibv_mr *mr) const
	{
		if (mr == implicit_.get())
			return "implicit ODP";
		return mr == local_mr_.get() ? "pinned, the receive buffer" : "explicit ODP";
	}
	// The slot's explicit ODP MR, or else the implicit one.
	ibv_mr *odp_mr(size_t i) { return slots_[i].odp ? slots_[i].odp.get() : implicit_.get(); }
	verbs::LoopbackQp &qp()
	{
		pair_ = int(rng_() % qps_.size());
		return *qps_[size_t(pair_)];
	}
	void advise(size_t i)
	{
		if (!slots_[i].mapped)
			return;
		ibv_sge sge{.addr = reinterpret_cast<uintptr_t>(slot_at(i)),
			    .length = static_cast<uint32_t>(kLen),
			    .lkey = odp_mr(i)->lkey};
		if (int rc = ibv_advise_mr(pd_.get(), IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
					   IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1))
			fail("ibv_advise_mr: " + std::string(strerror(rc)));
	}
	void expect_bytes(const char *where, const std::byte *p, unsigned char fill)
	{
		checks_++;
		for (size_t k = 0; k < kLen; k++)
			if (p[k] != std::byte(fill)) {
				char msg[160];
				std::snprintf(msg, sizeof(msg),
					      "%s: byte %zu is 0x%02x, the current mapping holds "
					      "0x%02x",
					      where, k, unsigned(p[k]), fill);
				fail(msg);
			}
	}
	void rdma_read(size_t i)
	{
		if (!slots_[i].mapped)
			return;
		std::memset(local_.data(), 0x5a, kLen);
		transfer(IBV_WR_RDMA_READ, "RDMA READ of the slot", local_mr_.get(), local_.data(),
			 odp_mr(i), slot_at(i));
		expect_bytes("RDMA READ of the slot", local_.data(), slots_[i].fill);
	}
	void rdma_write(size_t i)
	{
		if (!slots_[i].mapped)
			return;
		const auto fill = static_cast<unsigned char>(rng_());
		std::memset(local_.data(), fill, kLen);
		transfer(IBV_WR_RDMA_WRITE, "RDMA WRITE into the slot", local_mr_.get(),
			 local_.data(), odp_mr(i), slot_at(i));
		slots_[i].fill = fill;
		expect_bytes("the slot after an RDMA WRITE",
			     reinterpret_cast<std::byte *>(slot_at(i)), fill);
	}
	// A pinned registration made now is current: SEND from it.
	void send_pinned(size_t i)
	{
		if (!slots_[i].mapped)
			return;
		verbs::Mr mr = verbs::reg_mr(pd_.get(), slot_at(i), kLen, kPinned);
		std::memset(local_.data(), 0x5a, kLen);
		transfer(IBV_WR_SEND, "SEND from the slot", mr.get(), slot_at(i), local_mr_.get(),
			 local_.data());
		expect_bytes("SEND from a pinned MR of the slot", local_.data(), slots_[i].fill);
	}
	// Through the cache: the bytes are the current mapping's (safety), and a
	// registration of pages nothing changed since is still cached (a hit).
	void send_cached(size_t i)
	{
		Slot &s = slots_[i];
		if (!s.mapped)
			return;
		odpwatch_cache_stats before{}, after{};
		odpwatch_cache_query(cache_.get(), &before);
		odpwatch_cache_reg *reg = nullptr;
		if (int rc = odpwatch_cache_get(cache_.get(), pd_.get(), slot_at(i), kLen, kPinned,
						&reg))
			fail("odpwatch_cache_get: " + std::string(strerror(-rc)));
		odpwatch_cache_query(cache_.get(), &after);
		std::memset(local_.data(), 0x5a, kLen);
		ibv_wc_status st =
			qp().rdma(IBV_WR_SEND, odpwatch_cache_reg_mr(reg), slot_at(i), kLen,
				  local_mr_.get(), local_.data(), std::chrono::minutes(5));
		odpwatch_cache_put(cache_.get(), reg);
		if (st != IBV_WC_SUCCESS)
			fail(std::string("SEND through the cache completed with '") +
			     ibv_wc_status_str(st) + "'" + qp_report());
		expect_bytes("SEND through the cache", local_.data(), s.fill);
		checks_++;
		if (s.cached && after.hits == before.hits)
			fail("slot " + std::to_string(i) +
			     ": the cache registered it again, though nothing changed its pages");
		s.cached = true;
	}
	// The safety half of memwatch: a range that changed is never valid.
	void check_watches()
	{
		for (size_t i = 0; i < kSlots; i++) {
			const Slot &s = slots_[i];
			if (!s.watch)
				continue;
			checks_++;
			if (s.changed && mw_->valid(*s.watch))
				fail("slot " + std::to_string(i) +
				     " changed, but its watch still reads valid");
		}
	}

	std::mt19937_64 rng_;
	verbs::Context ctx_ = verbs::open_device("");
	verbs::Pd pd_ = verbs::alloc_pd(ctx_.get());
	verbs::Mr implicit_ = verbs::reg_mr(pd_.get(), nullptr, SIZE_MAX, kOdp);
	std::array<std::unique_ptr<verbs::LoopbackQp>, 2> qps_;
	int pair_ = -1; // the QP pair the current step used, if any
	struct Done {
		uint64_t step;
		const char *name;
		int pair;
	};
	std::array<Done, 16> done_{};
	size_t n_done_ = 0;
	verbs::Mapping local_{kLen};
	verbs::Mr local_mr_;
	std::unique_ptr<Memwatch> mw_;
	// After pd_: destroyed before it, as its registrations belong to it.
	std::unique_ptr<odpwatch_cache, CacheDeleter> cache_ = pinned_cache();
	std::array<Slot, kSlots> slots_;
	std::map<std::string, uint64_t> counts_;
	uint64_t step_ = 0, checks_ = 0;
	std::string name_;
};

} // namespace

int main(int argc, char **argv)
{
	std::setvbuf(stdout, nullptr, _IOLBF, 0);
	uint64_t seed = std::random_device{}();
	double seconds = 20;
	uint64_t max_steps = UINT64_MAX;
	for (int a = 1; a < argc; a++) {
		std::string arg = argv[a];
		if (arg == "--seed" && a + 1 < argc)
			seed = std::stoull(argv[++a]);
		else if (arg == "--seconds" && a + 1 < argc)
			seconds = std::stod(argv[++a]);
		else if (arg == "--steps" && a + 1 < argc)
			max_steps = std::stoull(argv[++a]);
		else {
			std::fprintf(stderr, "usage: %s [--seed N] [--seconds S] [--steps N]\n",
				     argv[0]);
			return 2;
		}
	}
	std::printf("# seed %lu (replay: %s --seed %lu --steps N)\n", (unsigned long)seed, argv[0],
		    (unsigned long)seed);
	const auto start = std::chrono::steady_clock::now();
	const auto end = start + std::chrono::duration<double>(seconds);
	uint64_t n = 0;
	try {
		Stress s(seed);
		while (n < max_steps && std::chrono::steady_clock::now() < end)
			s.step(++n);
		s.report();
	} catch (const std::exception &e) {
		std::printf("not ok 1 stress # seed %lu, %s\n", (unsigned long)seed, e.what());
		return 1;
	}
	std::printf(
		"ok 1 stress # seed %lu, %lu steps in %.0f s\n", (unsigned long)seed,
		(unsigned long)n,
		std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
	return 0;
}
