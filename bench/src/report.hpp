// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// Benchmark bookkeeping: repetitions, their spread, and a table of ratios.
// Absolute times under QEMU TCG mean little; every row names the baseline
// measured in the same run that its ratio is against.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace odpwatch::bench
{

// Nanoseconds per operation over the repetitions of one measurement.
struct Spread {
	double min = 0, median = 0, max = 0;
	unsigned reps = 0;
};

Spread spread_of(std::vector<double> ns_per_op);

// A size as rows name it: "4 KiB", "1 MiB", or "1536 B" (the largest unit
// that divides it).
std::string size_name(size_t bytes);

// Like measure() below, for bodies compared with each other: after one
// untimed run of each, every rep runs each body once, in an order that
// rotates from rep to rep, so a drift in the machine's speed during the run
// falls on all alike.
std::vector<Spread> measure_interleaved(unsigned reps, double ops,
					const std::vector<std::function<void()>> &bodies);

// Times body() (which performs @ops operations) @reps times, after one
// untimed run that warms caches and QEMU's translated code.
template <class Body> Spread measure(unsigned reps, double ops, Body &&body)
{
	return measure_interleaved(reps, ops, {std::function<void()>(body)})[0];
}

struct Row {
	std::string group;   // what is measured, e.g. "munmap of an unwatched page"
	std::string param;   // the size of the work, e.g. "100000 watches"
	std::string variant; // the mechanism, e.g. "memwatch"
	Spread ns;
	std::string baseline; // "variant/param" of the row the ratio is against
	std::string note;     // e.g. stale answers counted
};

class Report
{
public:
	explicit Report(std::string title) : title_(std::move(title)) {}
	void add(Row r) { rows_.push_back(std::move(r)); }
	// A sentence printed under the title, e.g. a peer that could not run.
	void remark(std::string s) { remarks_.push_back(std::move(s)); }
	// The rows as tab-separated lines, for a benchmark run in another
	// process (peers that must not share one), and reading them back.
	void write_rows(FILE *f, size_t from = 0) const;
	size_t size() const { return rows_.size(); }
	void read_rows(FILE *f);
	// Median ratio against the row named by r.baseline; 0 if not found.
	double ratio(const Row &r) const;
	void print_markdown() const;
	void write_csv(const std::string &path) const;
	// Prints the table, and writes the CSV too if csv names a file.
	void finish(const std::string &csv) const;

private:
	std::string title_;
	std::vector<Row> rows_;
	std::vector<std::string> remarks_;
};

// Runs the sections of benchmark @bench in order (only those whose name
// contains @only, if it is not empty), telling stderr which runs and how long
// it took: a long run shows its progress.
using Section = std::pair<const char *, std::function<void()>>;
void run_sections(const char *bench, unsigned reps, bool quick, const std::string &only,
		  std::initializer_list<Section> sections);

} // namespace odpwatch::bench
