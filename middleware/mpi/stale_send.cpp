// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The registration-cache problem in an MPI program: rank 0 sends a buffer at
// one fixed address, frees it, maps the next one at the same address and
// sends again; rank 1 checks every byte of every message. A cache that
// missed the free reuses the registration of the old pages, and the message
// carries the old data. Ways of freeing:
//   munmap    libc munmap()                     (hooks can see it)
//   syscall   syscall(SYS_munmap) and SYS_mmap, as Go's runtime does
//             (no hook sees either)
//   madvise   madvise(MADV_DONTNEED), pages zeroed and refaulted
//   mremap    mremap() away, then munmap() there
//   process_madvise  MADV_DONTNEED through process_madvise() on itself
//   io_uring  MADV_DONTNEED as an io_uring request (IORING_OP_MADVISE)
//   uffd_move the pages moved away by userfaultfd's UFFDIO_MOVE
//   droppable a MAP_DROPPABLE buffer whose pages are reclaimed
//   free      free() and malloc() again (the C library, or a sanitizer's
//             allocator in an instrumented build, unmaps the chunk)
// (process_madvise to droppable by system calls no hook sees, raw_free.hpp;
// the kernel declines uffd_move and droppable on pinned pages)
// WAY may be a comma-separated list: the ways run one after the other in
// one job (an mpirun costs seconds of launch), each at a fixed address of
// its own, so that a registration one way left stale cannot meet the next.
// Prints for each way, on rank 1: "stale_send: way=W size=S messages=N
// corrupt=C" (C messages had a word other than their iteration number);
// on rank 0: "stale_send: sender way=W not_freed=F elsewhere=E" (F times
// the kernel kept the pages: a move refused, pages not dropped; E times
// malloc() put the next buffer at another address, where no stale
// registration can be). With libodpwatch-ofi preloaded, each rank also
// prints "stale_send: rank R way=W monitor_hits=H": the hits of memwatch's
// libfabric monitor during that way. With libodpwatch-ucx-preload.so, each
// rank prints "stale_send: rank R way=W registrations=G": the pinned
// registrations UCX made during that way (its cache hits are the messages
// that needed none).
#include "raw_free.hpp"

#include <odpwatch/ofi_monitor.h>
#include <odpwatch/ucx_preload.h>

#include <dlfcn.h>
#include <malloc.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace
{

// Where rank 0's buffer lives for the way at @index of the list, far from
// anything malloc maps, and where mremap moves it: 16 GiB apart per way.
struct place {
	void *at;
	void *moved;
	explicit place(size_t index)
	    : at(reinterpret_cast<void *>((uintptr_t{1} << 40) + (index << 34))),
	      moved(reinterpret_cast<void *>((uintptr_t{3} << 40) + (index << 34)))
	{
	}
};

[[noreturn]] void die(const char *what)
{
	std::fprintf(stderr, "stale_send: %s: %s\n", what, std::strerror(errno));
	MPI_Abort(MPI_COMM_WORLD, 2);
	std::exit(2);
}

// @raw: by system call, past any hook on the C library's mmap().
uint64_t *map_at(void *where, size_t size, bool raw = false)
{
	const int prot = PROT_READ | PROT_WRITE;
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
	void *p = raw ? reinterpret_cast<void *>(syscall(SYS_mmap, where, size, prot, flags, -1, 0))
		      : mmap(where, size, prot, flags, -1, 0);
	if (p == MAP_FAILED || p != where)
		die("mmap at the fixed address");
	return static_cast<uint64_t *>(p);
}

// Frees rank 0's buffer one way; returns the buffer for the next message.
// Counts in @not_freed a free the kernel declined.
uint64_t *free_and_remap(std::string_view way, const place &where, uint64_t *buf, size_t size,
			 int &not_freed)
{
	if (way == "munmap") {
		if (munmap(buf, size))
			die("munmap");
	} else if (way == "syscall") {
		if (syscall(SYS_munmap, buf, size))
			die("syscall(SYS_munmap)");
		return map_at(where.at, size, true);
	} else if (way == "madvise") {
		if (madvise(buf, size, MADV_DONTNEED))
			die("madvise");
		return buf; // still mapped: new pages on the next write
	} else if (way == "process_madvise" || way == "io_uring") {
		errno = way == "io_uring"
				? raw_free::madvise_by_io_uring(buf, size, MADV_DONTNEED)
				: raw_free::process_madvise_self(buf, size, MADV_DONTNEED);
		if (errno)
			die(way == "io_uring" ? "IORING_OP_MADVISE" : "process_madvise");
		return buf;
	} else if (way == "uffd_move") {
		errno = raw_free::move_away_by_uffd(buf, size);
		if (errno == EBUSY)
			not_freed++;
		else if (errno)
			die("UFFDIO_MOVE");
		return buf;
	} else if (way == "droppable") {
		bool dropped = false;
		if ((errno = raw_free::drop_droppable(buf, size, dropped)))
			die("MADV_PAGEOUT of the droppable buffer");
		not_freed += !dropped;
		return buf;
	} else if (way == "free") {
		std::free(buf);
		auto *p = static_cast<uint64_t *>(std::malloc(size));
		if (!p)
			die("malloc");
		return p;
	} else if (way == "mremap") {
		void *p = mremap(buf, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, where.moved);
		if (p == MAP_FAILED || munmap(p, size))
			die("mremap away");
	}
	return map_at(where.at, size);
}

// The ways free_and_remap() knows, for the check of the arguments and the usage.
constexpr std::string_view ways[] = {"munmap",	  "syscall",	     "madvise",
				     "mremap",	  "process_madvise", "io_uring",
				     "uffd_move", "droppable",	     "free"};

int usage()
{
	std::fprintf(stderr, "usage: stale_send WAY[,WAY...] SIZE COUNT\nways: ");
	for (std::string_view w : ways)
		std::fprintf(stderr, "%s%.*s", w == ways[0] ? "" : " ", int(w.size()), w.data());
	std::fprintf(stderr, "\n");
	return 2;
}

// The ways of a comma-separated list; empty if one is unknown.
std::vector<std::string_view> parse_ways(std::string_view list)
{
	std::vector<std::string_view> out;
	for (size_t at = 0; at <= list.size();) {
		size_t end = std::min(list.find(',', at), list.size());
		std::string_view w = list.substr(at, end - at);
		if (std::find(std::begin(ways), std::end(ways), w) == std::end(ways))
			return {};
		out.push_back(w);
		at = end + 1;
	}
	return out;
}

// Rank 0: @count messages from the buffer at @where, freed @way after each.
void send_all(std::string_view way, const place &where, size_t size, int count)
{
	const size_t words = size / sizeof(uint64_t);
	uint64_t *buf = nullptr;
	if (way == "free") {
		buf = static_cast<uint64_t *>(std::malloc(size));
		if (!buf)
			die("malloc");
	} else {
		buf = way == "droppable"
			      ? static_cast<uint64_t *>(raw_free::map_droppable(where.at, size))
			      : map_at(where.at, size);
		if (buf != where.at)
			die("mmap at the fixed address");
	}
	int not_freed = 0, elsewhere = 0;
	for (int i = 0; i < count; i++) {
		for (size_t w = 0; w < words; w++)
			buf[w] = uint64_t(i);
		MPI_Send(buf, int(size), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
		uint64_t *was = buf;
		buf = free_and_remap(way, where, buf, size, not_freed);
		elsewhere += buf != was;
	}
	if (way == "free")
		std::free(buf);
	else
		munmap(buf, size);
	std::printf("stale_send: sender way=%.*s not_freed=%d elsewhere=%d\n", int(way.size()),
		    way.data(), not_freed, elsewhere);
	std::fflush(stdout);
}

// Rank 1: checks every word of @count messages.
void receive_all(std::string_view way, size_t size, int count)
{
	std::vector<uint64_t> got(size / sizeof(uint64_t));
	uint64_t first_bad = 0;
	int corrupt = 0;
	for (int i = 0; i < count; i++) {
		MPI_Recv(got.data(), int(size), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (uint64_t v : got)
			if (v != uint64_t(i)) {
				if (!corrupt)
					first_bad = v;
				corrupt++;
				break;
			}
	}
	std::printf("stale_send: way=%.*s size=%zu messages=%d corrupt=%d", int(way.size()),
		    way.data(), size, count, corrupt);
	if (corrupt)
		std::printf(" first_corrupt_word=%llu", (unsigned long long)first_bad);
	std::printf("\n");
	std::fflush(stdout);
}

// The counters of a library of ours, if it is preloaded: @function fills
// a Stats and returns 0.
template <class Stats> std::optional<Stats> preloaded_stats(const char *function)
{
	using stats_fn = int (*)(Stats *);
	const auto fn = reinterpret_cast<stats_fn>(dlsym(RTLD_DEFAULT, function));
	Stats s{};
	if (!fn || fn(&s))
		return std::nullopt;
	return s;
}

// The hits of libodpwatch-ofi's monitor so far.
std::optional<uint64_t> monitor_hits()
{
	const auto s = preloaded_stats<odpwatch_ofi_stats>("odpwatch_ofi_monitor_stats");
	return s ? std::optional<uint64_t>(s->hits) : std::nullopt;
}

// The pinned registrations UCX made so far (libodpwatch-ucx).
std::optional<uint64_t> ucx_registrations()
{
	const auto s = preloaded_stats<odpwatch_ucx_stats>("odpwatch_ucx_preload_stats");
	return s ? std::optional<uint64_t>(s->registrations) : std::nullopt;
}

} // namespace

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank = 0, ranks = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &ranks);
	const std::vector<std::string_view> list = parse_ways(argc == 4 ? argv[1] : "");
	const size_t size = argc == 4 ? std::strtoull(argv[2], nullptr, 0) : 0;
	const int count = argc == 4 ? std::atoi(argv[3]) : 0;
	if (ranks != 2 || size < sizeof(uint64_t) || size % sizeof(uint64_t) || count < 1 ||
	    list.empty()) {
		if (rank == 0)
			usage();
		MPI_Finalize();
		return 2;
	}
	// Every chunk this size from mmap, given back by munmap (glibc would
	// raise the threshold after the first free).
	if (rank == 0 && std::find(list.begin(), list.end(), "free") != list.end())
		mallopt(M_MMAP_THRESHOLD, 128 << 10);
	for (size_t k = 0; k < list.size(); k++) {
		const auto hits0 = monitor_hits();
		const auto regs0 = ucx_registrations();
		if (rank == 0)
			send_all(list[k], place(k), size, count);
		else
			receive_all(list[k], size, count);
		if (const auto regs = ucx_registrations(); regs && regs0) {
			std::printf("stale_send: rank %d way=%.*s registrations=%llu\n", rank,
				    int(list[k].size()), list[k].data(),
				    (unsigned long long)(*regs - *regs0));
			std::fflush(stdout);
		}
		if (const auto hits = monitor_hits(); hits && hits0) {
			std::printf("stale_send: rank %d way=%.*s monitor_hits=%llu\n", rank,
				    int(list[k].size()), list[k].data(),
				    (unsigned long long)(*hits - *hits0));
			std::fflush(stdout);
		}
	}
	MPI_Finalize();
	return 0;
}
