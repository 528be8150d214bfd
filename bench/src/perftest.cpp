// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "perftest.hpp"

#include "spawn.hpp"
#include "verbs.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

namespace odpwatch::bench
{
namespace
{

// A perftest run is seconds long under TCG; a pair that never met (a client
// that could not connect, a server whose client died) is stopped here.
constexpr int kPerftestSeconds = 600;

Exit run(std::vector<std::string> argv, const std::string &what)
{
	int fd = -1;
	pid_t pid = spawn(std::move(argv), &fd, true);
	return wait_for(pid, fd, what, kPerftestSeconds);
}

// The numbers of the result line, which follows the "#bytes" header.
std::vector<double> result_line(const std::string &tool, const std::string &out)
{
	size_t at = out.find("#bytes");
	if (at != std::string::npos)
		at = out.find('\n', at);
	std::vector<double> v;
	if (at != std::string::npos) {
		const char *p = out.c_str() + at;
		double x;
		int used;
		while (std::sscanf(p, "%lf%n", &x, &used) == 1) {
			v.push_back(x);
			p += used;
		}
	}
	if (v.size() < 4)
		throw verbs::Error(tool + ": no result line in its output:\n" + out, EIO);
	return v;
}

} // namespace

std::string perftest_run(const std::string &tool, const std::vector<std::string> &args,
			 const std::string &peer)
{
	std::vector<std::string> argv = {tool};
	argv.insert(argv.end(), args.begin(), args.end());
	if (peer.empty()) {
		int sfd = -1;
		pid_t server = spawn(argv, &sfd, true);
		// The server needs a moment to listen; perftest's client does not retry.
		std::this_thread::sleep_for(std::chrono::seconds(1));
		argv.push_back("127.0.0.1");
		Exit client = run(argv, tool + " client on 127.0.0.1");
		// A client that failed leaves its server waiting for a connection.
		Exit s =
			client.ok ? wait_for(server, sfd, tool + " server", 60) : stop(server, sfd);
		if (!client.ok || !s.ok)
			throw verbs::Error(tool + " failed; its output:\n" + client.out + s.out,
					   EIO);
		return client.out;
	}
	argv.push_back(peer);
	for (int tries = 0;; tries++) {
		Exit client = run(argv, tool + " client against " + peer);
		if (client.ok)
			return client.out;
		// Not listening yet: the other node is still finishing its last run.
		if (client.out.find("Couldn't connect") == std::string::npos || tries == 240)
			throw verbs::Error(tool + " against " + peer + " failed:\n" + client.out,
					   EIO);
		std::this_thread::sleep_for(std::chrono::milliseconds(500));
	}
}

std::string perftest_serve(const std::string &tool, const std::vector<std::string> &args)
{
	std::vector<std::string> argv = {tool};
	argv.insert(argv.end(), args.begin(), args.end());
	Exit server = run(argv, tool + " server (waiting for its client on the other node)");
	if (!server.ok)
		throw verbs::Error(tool + " server failed:\n" + server.out, EIO);
	return server.out;
}

double perftest_bw(const std::string &tool, const std::string &out)
{
	std::vector<double> v = result_line(tool, out);
	// bytes, iterations, peak and average MB/sec, message rate
	if (v[3] == 0 && out.find("Correlation coefficient") != std::string::npos)
		return 0;
	if (v[3] <= 0)
		throw verbs::Error(tool + ": no bandwidth in its output:\n" + out, EIO);
	return v[3];
}

double perftest_lat_us(const std::string &tool, const std::string &out)
{
	// bytes, iterations, t_min, t_max, t_typical, t_avg, ...
	std::vector<double> v = result_line(tool, out);
	if (v.size() < 6 || v[5] <= 0)
		throw verbs::Error(tool + ": no average latency in its output:\n" + out, EIO);
	return v[5];
}

double perftest_bw_calibrated(const std::string &tool, const std::vector<std::string> &args,
			      const std::string &peer, unsigned &reruns)
{
	for (unsigned tries = 1;; tries++) {
		double avg = perftest_bw(tool, perftest_run(tool, args, peer));
		if (avg > 0)
			return avg;
		if (tries == 3)
			throw verbs::Error(tool + ": clock calibration failed 3 times", EIO);
		reruns++;
	}
}

} // namespace odpwatch::bench
