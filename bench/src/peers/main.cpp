// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// odpwatch-cache-peers PEER [--reps N] [--quick] [--device NAME]
// Runs the cache workloads on one peer cache and writes the rows, tab
// separated, on stdout for `odpwatch bench cache` to merge; progress goes
// to stderr.
#include "peers.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

using namespace odpwatch::bench;

namespace
{

// A cache whose monitor leaves the application blocked (a page fault its
// handler thread never answers) would stall the whole run. The watchdog
// records where the stuck thread waits as the step's result and ends the
// process.
class Watchdog
{
public:
	Watchdog(Report &rep, std::string variant, std::function<void()> flush)
	    : rep_(rep), variant_(std::move(variant)), flush_(std::move(flush)),
	      main_tid_(gettid()), thread_([this](std::stop_token st) { watch(st); })
	{
	}
	void starting(std::string step, int limit_s)
	{
		std::lock_guard lock(mu_);
		step_ = std::move(step);
		deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
		limit_s_ = limit_s;
	}

private:
	void watch(std::stop_token st)
	{
		while (!st.stop_requested()) {
			std::this_thread::sleep_for(std::chrono::milliseconds(500));
			std::lock_guard lock(mu_);
			if (step_.empty() || std::chrono::steady_clock::now() < deadline_)
				continue;
			std::string wchan = "?";
			std::ifstream f("/proc/self/task/" + std::to_string(main_tid_) + "/wchan");
			std::getline(f, wchan);
			rep_.add({step_,
				  "",
				  variant_,
				  {},
				  "",
				  "HUNG: the application thread waited " +
					  std::to_string(limit_s_) + " s in the kernel's " + wchan +
					  "; the peer was stopped there"});
			flush_();
			std::fprintf(stderr, " HUNG in %s (%s)]\n", step_.c_str(), wchan.c_str());
			_exit(3);
		}
	}

	Report &rep_;
	std::string variant_;
	std::function<void()> flush_;
	pid_t main_tid_;
	std::mutex mu_;
	std::string step_;
	std::chrono::steady_clock::time_point deadline_;
	int limit_s_ = 0;
	std::jthread thread_; // last: starts once the rest is ready
};

} // namespace

int main(int argc, char **argv)
{
	if (argc < 2) {
		std::fprintf(
			stderr,
			"usage: %s "
			"ucx|ucp|ucp-memwatch|libfabric-memhooks|libfabric-uffd|libfabric-memwatch|"
			"libfabric-memwatch-native|libfabric-disabled [--reps N] [--quick] "
			"[--device NAME] [--only SECTION]\n",
			argv[0]);
		return 2;
	}
	const std::string peer = argv[1];
	// The native monitor is in our libfabric, not Debian's (same soname):
	// run again with it first in the library path; memwatch for UCX is a
	// preload: run again with it preloaded.
	const bool native = peer == "libfabric-memwatch-native",
		   ucx_preload = peer == "ucp-memwatch";
	if ((native || ucx_preload) && !getenv("ODPWATCH_PEER_AGAIN")) {
		char self[4096];
		ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n <= 0) {
			std::perror("readlink /proc/self/exe");
			return 1;
		}
		self[n] = 0;
		// Our programs' directory's parent: /out/guest.
		std::string top(self);
		top = top.substr(0, top.rfind('/'));
		top = top.substr(0, top.rfind('/'));
		if (native)
			setenv("LD_LIBRARY_PATH", (top + kNativeLibfabricDir).c_str(), 1);
		else
			setenv("LD_PRELOAD", (top + kUcxPreload).c_str(), 1);
		setenv("ODPWATCH_PEER_AGAIN", "1", 1);
		execv(self, argv);
		std::perror("execv");
		return 1;
	}
	Options o;
	for (int i = 2; i < argc; i++) {
		if (!std::strcmp(argv[i], "--quick"))
			o.quick = true;
		else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
			o.reps = unsigned(std::stoul(argv[++i]));
		else if (!std::strcmp(argv[i], "--device") && i + 1 < argc)
			o.device = argv[++i];
		else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
			o.only = argv[++i];
		else {
			std::fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], argv[i]);
			return 2;
		}
	}
	try {
		std::unique_ptr<CacheUnderTest> c;
		if (peer == "ucx")
			c = make_ucx_rcache(o.device);
		else if (peer == "ucp" || peer == "ucp-memwatch")
			c = make_ucp_memh(o.device, peer == "ucp-memwatch");
		else if (peer == "libfabric-memhooks")
			c = make_libfabric_cache(o.device, "memhooks");
		else if (peer == "libfabric-uffd")
			c = make_libfabric_cache(o.device, "userfaultfd");
		else if (peer == "libfabric-memwatch")
			c = make_libfabric_cache(o.device, "memwatch");
		else if (peer == "libfabric-memwatch-native")
			c = make_libfabric_cache(o.device, "memwatch-native");
		else if (peer == "libfabric-disabled")
			c = make_libfabric_cache(o.device, "disabled");
		else {
			std::fprintf(stderr, "%s: unknown peer '%s'\n", argv[0], peer.c_str());
			return 2;
		}
		Report rep(peer);
		size_t written = 0;
		// Rows go out as soon as they are measured: a peer stopped later
		// still leaves them.
		auto flush = [&] {
			rep.write_rows(stdout, written);
			written = rep.size();
		};
		Watchdog dog(rep, c->name(), flush);
		auto section = [&](const char *what, auto &&run) {
			if (!o.only.empty() && o.only != what)
				return;
			dog.starting(what, o.quick ? 300 : 900);
			run();
			flush();
			std::fprintf(stderr, " %s", what);
		};
		std::fprintf(stderr, " [%s:", peer.c_str());
		section("hits", [&] { bench_hits(rep, o, *c, c->how()); });
		section("reuse", [&] { bench_reuse(rep, o, {c.get()}, false); });
		section("unmap", [&] { bench_unmap(rep, o, c.get()); });
		section("workload", [&] { bench_workload(rep, o, *c); });
		// Without a cache nothing can be stale.
		if (peer != "libfabric-disabled")
			section("stale", [&] {
				bench_stale(rep, o, *c, [&](const std::string &group) {
					flush();
					dog.starting(group, o.quick ? 60 : 120);
				});
			});
		// Last: the cache then holds what these buffers left (freed,
		// not unmapped), which would weigh on the sections above.
		section("hits-many", [&] { bench_hits_many(rep, o, *c, c->how()); });
		std::fprintf(stderr, "]");
	} catch (const std::exception &e) {
		std::fprintf(stderr, "\n%s: %s: %s\n", argv[0], peer.c_str(), e.what());
		return 1;
	}
	return 0;
}
