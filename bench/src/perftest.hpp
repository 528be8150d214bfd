// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Running perftest's tools (ib_write_bw, ib_write_lat, ...) from a benchmark:
// both ends on this node, or the client against a server on another node.
#pragma once

#include <string>
#include <vector>

namespace odpwatch::bench
{

// Runs @tool with @args and returns the client's output. With @peer empty,
// a server and a client on this node (the client connects to 127.0.0.1);
// else only the client, against the server at @peer, tried again while that
// server is not listening yet (for up to two minutes). Throws verbs::Error
// when the client (or the local server) fails.
std::string perftest_run(const std::string &tool, const std::vector<std::string> &args,
			 const std::string &peer = "");

// The server alone, for one client run from another node: returns its
// output once that run is over; throws verbs::Error when it fails.
std::string perftest_serve(const std::string &tool, const std::vector<std::string> &args);

// The average bandwidth (MB/sec) of a _bw client's output; 0 when perftest's
// clock calibration failed ("Correlation coefficient"), so the run measured
// nothing. Throws verbs::Error when there is no result line.
double perftest_bw(const std::string &tool, const std::string &out);

// The average latency (microseconds) of a _lat client's output.
double perftest_lat_us(const std::string &tool, const std::string &out);

// perftest_bw(perftest_run(...)), run again (3 tries in all) while the
// clock calibration fails, as it may on a busy TCG machine; counts reruns.
double perftest_bw_calibrated(const std::string &tool, const std::vector<std::string> &args,
			      const std::string &peer, unsigned &reruns);

} // namespace odpwatch::bench
