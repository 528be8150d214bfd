// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// The MPI bandwidth curve as an MPI user measures it: NetPIPE's NPmpi
// (Debian's NPopenmpi, built against Open MPI), one rank on each of the two
// guests, Open MPI's pml ucx over rc_verbs on rxe, with UCX's registrations
// pinned and on demand (ODP). Every repetition runs both, one after the other, so a drift
// of the machine's speed falls on both alike.
#include "benches.hpp"
#include "report.hpp"
#include "spawn.hpp"
#include "verbs.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace odpwatch::bench
{
namespace
{

// UCX on rxe as a user must set it up (see middleware/tests/conftest.py):
// ud_verbs for rc_verbs' connections, no destination check of UD packets
// (rxe reports SL 0), and zero-copy rendezvous from 16 KiB, so large
// messages go from the user's buffer through UCX's registration cache.
std::vector<std::string> ucx_settings(const std::string &dev, bool odp)
{
	std::vector<std::string> v = {"UCX_NET_DEVICES=" + dev + ":1",
				      "UCX_TLS=rc_verbs,ud_verbs,self",
				      "UCX_UD_VERBS_ETH_DGID_CHECK=n", "UCX_RNDV_THRESH=16k",
				      "UCX_RNDV_SCHEME=get_zcopy"};
	if (odp)
		v.push_back("UCX_REG_NONBLOCK_MEM_TYPES=host");
	return v;
}

// One NPmpi run from @lower to @upper bytes; its output file's lines (size
// in bytes, Mbit/s, seconds a message took one way) as size -> seconds.
std::map<size_t, double> npmpi(const std::string &hosts, const std::string &dev, bool odp,
			       size_t lower, size_t upper, const std::string &file)
{
	std::vector<std::string> a = {"env", "OMPI_ALLOW_RUN_AS_ROOT=1",
				      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
	// One rank per node; the launcher's own traffic on the wire's interface.
	a.insert(a.end(), {"mpirun.openmpi", "--host", hosts, "-np", "2", "--map-by", "node"});
	a.insert(a.end(), {"--prtemca", "oob_tcp_if_include", "eth0", "--mca", "pml", "ucx"});
	for (const std::string &s : ucx_settings(dev, odp))
		a.insert(a.end(), {"-x", s});
	// -p 0: no sizes 3 bytes either side of each step.
	a.insert(a.end(), {"NPopenmpi", "-o", file, "-l", std::to_string(lower), "-u",
			   std::to_string(upper), "-p", "0"});
	unlink(file.c_str());
	int fd = -1;
	Exit e = wait_for(spawn(a, &fd, true), fd, "NPopenmpi over " + hosts, 1200);
	std::map<size_t, double> curve;
	std::ifstream in(file);
	size_t bytes = 0;
	double mbps = 0, secs = 0;
	while (in >> bytes >> mbps >> secs)
		curve[bytes] = secs;
	if (!e.ok || curve.empty())
		throw verbs::Error("NPopenmpi over " + hosts + (odp ? " (ODP)" : " (pinned)") +
					   " failed or wrote no " + file + ":\n" + e.out,
				   EIO);
	return curve;
}

bool power_of_two(size_t n)
{
	return n && !(n & (n - 1));
}

// The name /etc/hosts gives @addr (Open MPI's launcher wants names: given
// this node's address it takes it for another node), or @addr itself.
std::string host_name(const std::string &addr)
{
	sockaddr_in sa{};
	sa.sin_family = AF_INET;
	char name[NI_MAXHOST];
	if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1 ||
	    getnameinfo(reinterpret_cast<sockaddr *>(&sa), sizeof(sa), name, sizeof(name), nullptr,
			0, NI_NAMEREQD))
		return addr;
	return name;
}

} // namespace

int mpi_bench(const Options &o, const std::string &peer)
{
	verbs::Context ctx = verbs::open_device(o.device);
	const std::string dev = ibv_get_device_name(ctx->device);
	const char *self = std::getenv("ODPWATCH_SELF");
	if (!self || !*self)
		throw verbs::Error("bench mpi runs on node 0 of the cluster (no ODPWATCH_SELF)",
				   EINVAL);
	const std::string hosts = host_name(self) + "," + host_name(peer);
	const size_t lower = 1 << 10, upper = o.quick ? 1 << 20 : 4 << 20;
	// size -> variant (0 pinned, 1 ODP) -> ns per MB, one per repetition
	std::map<size_t, std::vector<double>> ns[2];
	// Pages node 0's ODP MRs faulted in, prefetched and had invalidated,
	// over all runs of each variant: a variant that says ODP shows ODP MRs
	// at work (a registration maps what is already resident without a
	// fault, so a buffer UCX only reads from may show invalidations alone).
	const char *const counters[] = {"odp_page_faults", "odp_page_prefetch",
					"odp_page_invalidations"};
	long odp_pages[2][3] = {};
	auto started = std::chrono::steady_clock::now();
	for (unsigned r = 0; r < o.reps; r++) {
		for (int odp = 0; odp < 2; odp++) {
			long before[3];
			for (int c = 0; c < 3; c++)
				before[c] = odp_counter(dev, counters[c]);
			for (auto [bytes, secs] :
			     npmpi(hosts, dev, odp, lower, upper, "/tmp/odpwatch-npmpi.out"))
				if (power_of_two(bytes) && secs > 0)
					ns[odp][bytes].push_back(secs * 1e15 / double(bytes));
			for (int c = 0; c < 3; c++)
				odp_pages[odp][c] += odp_counter(dev, counters[c]) - before[c];
			std::fprintf(stderr, "mpi: NPmpi %u/%u (%s), %.0f s\n", 2 * r + odp + 1,
				     2 * o.reps, odp ? "ODP" : "pinned",
				     std::chrono::duration<double>(
					     std::chrono::steady_clock::now() - started)
					     .count());
		}
	}
	Report rep("MPI between two kernels on a wire: NetPIPE's NPmpi, Open MPI pml ucx, "
		   "rc_verbs over rxe (" +
		   dev + ", peer " + peer + ")");
	rep.remark("NPmpi -l " + std::to_string(lower) + " -u " + std::to_string(upper) +
		   " -p 0 (ping-pong; NetPIPE chooses the repetitions per size), one rank per "
		   "node; UCX_RNDV_THRESH=16k, UCX_RNDV_SCHEME=get_zcopy; the rows are the "
		   "powers of two it measured, as ns per MB (10^6 bytes) of the one-way time "
		   "NPmpi reports for a message.");
	const std::string group =
		"across the wire: NPmpi bandwidth (Open MPI, pml ucx; ns per MB, 1e9 / MB/s)";
	for (int odp = 0; odp < 2; odp++)
		for (auto &[bytes, v] : ns[odp]) {
			std::ostringstream note;
			note << (odp ? "UCX registers on demand (UCX_REG_NONBLOCK_MEM_TYPES=host)"
				     : "UCX's pinned registrations");
			note << "; node 0's ODP MRs over all its runs: " << odp_pages[odp][0]
			     << " pages faulted, " << odp_pages[odp][1] << " prefetched, "
			     << odp_pages[odp][2] << " invalidated";
			rep.add({group, size_name(bytes), odp ? "ODP" : "pinned", spread_of(v),
				 "pinned/" + size_name(bytes), note.str()});
		}
	rep.finish(o.csv);
	return 0;
}

} // namespace odpwatch::bench
