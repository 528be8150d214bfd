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
	std::error_code ec;
	for (auto &proc : fs::directory_iterator("/proc", ec)) {
		const std::string pid = proc.path().filename();
		if (pid.find_first_not_of("0123456789") != std::string::npos)
			continue;
		// Processes come and go, and others' fds need privilege: skip
		// what cannot be read.
		std::error_code e2;
		for (auto &fd : fs::directory_iterator(proc.path() / "fd", e2)) {
			std::error_code e3;
			if (fs::read_symlink(fd.path(), e3) != "anon_inode:[memwatch]")
				continue;
			Descriptor d{pid, fd.path().filename(), "", {}};
			std::ifstream comm(proc.path() / "comm");
			std::getline(comm, d.comm);
			std::ifstream info(proc.path() / "fdinfo" / d.fd);
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
