// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// odpwatch memwatch-stats: every memwatch descriptor of every process, with
// the counters the kernel shows in /proc/PID/fdinfo/FD.
#include "cli.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

namespace odpwatch::cli
{
namespace
{

namespace fs = std::filesystem;

struct Descriptor {
	std::string pid, fd, comm;
	std::map<std::string, std::string> fields; // "watches" -> "2"
};

std::vector<Descriptor> memwatch_descriptors()
{
	std::vector<Descriptor> out;
	// Processes come and go, and others' fds need privilege: skip what
	// cannot be read. The iterators advance with an error code, never
	// throwing (a range-for's ++ throws when a process exits meanwhile).
	const fs::directory_iterator end;
	std::error_code ec;
	for (fs::directory_iterator it("/proc", ec); !ec && it != end; it.increment(ec)) {
		const fs::path proc = it->path();
		const std::string pid = proc.filename();
		if (pid.find_first_not_of("0123456789") != std::string::npos)
			continue;
		std::error_code e2;
		for (fs::directory_iterator fdit(proc / "fd", e2); !e2 && fdit != end;
		     fdit.increment(e2)) {
			const fs::path fd = fdit->path();
			std::error_code e3;
			if (fs::read_symlink(fd, e3) != "anon_inode:[memwatch]")
				continue;
			Descriptor d{pid, fd.filename(), "", {}};
			std::ifstream comm(proc / "comm");
			std::getline(comm, d.comm);
			std::ifstream info(proc / "fdinfo" / d.fd);
			for (std::string line; std::getline(info, line);) {
				const auto colon = line.find(':');
				if (line.rfind("memwatch-", 0) != 0 || colon == std::string::npos)
					continue;
				auto v = line.substr(colon + 1);
				v.erase(0, v.find_first_not_of(" \t"));
				d.fields[line.substr(9, colon - 9)] = v;
			}
			out.push_back(std::move(d));
		}
	}
	return out;
}

} // namespace

int memwatch_stats(const Options &)
{
	auto ds = memwatch_descriptors();
	std::printf("%zu memwatch descriptor%s\n", ds.size(), ds.size() == 1 ? "" : "s");
	if (ds.empty())
		return 0;
	static const char *const cols[] = {
		"watches",     "invalidations",	 "changes", "events-queued", "events-coalesced",
		"events-read", "events-dropped", "queue",   "overflow"};
	std::printf("%7s %-15s %4s", "pid", "command", "fd");
	for (const char *c : cols)
		std::printf(" %s", c);
	std::printf("\n");
	for (auto &d : ds) {
		if (d.fields.empty()) {
			std::printf(
				"%7s %-15s %4s (no counters: a kernel without memwatch fdinfo)\n",
				d.pid.c_str(), d.comm.c_str(), d.fd.c_str());
			continue;
		}
		std::printf("%7s %-15s %4s", d.pid.c_str(), d.comm.c_str(), d.fd.c_str());
		for (const char *c : cols)
			std::printf(" %*s", static_cast<int>(std::string(c).size()),
				    d.fields[c].c_str());
		std::printf("\n");
	}
	return 0;
}

} // namespace odpwatch::cli
