// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "report.hpp"
#include "verbs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>

namespace odpwatch::bench
{

Spread spread_of(std::vector<double> v)
{
	Spread s;
	if (v.empty())
		return s;
	std::sort(v.begin(), v.end());
	s.min = v.front();
	s.max = v.back();
	s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
	s.reps = static_cast<unsigned>(v.size());
	return s;
}

double Report::ratio(const Row &r) const
{
	for (const Row &b : rows_)
		if (b.group == r.group && b.variant + "/" + b.param == r.baseline)
			return b.ns.median > 0 ? r.ns.median / b.ns.median : 0;
	return 0;
}

void Report::print_markdown() const
{
	std::printf("## %s\n", title_.c_str());
	std::string group;
	for (const Row &r : rows_) {
		if (r.group != group) {
			group = r.group;
			std::printf("\n### %s\n\n", group.c_str());
			std::printf(
				"| variant | work | ns/op median | min | max | reps | ratio | vs "
				"| note |\n|---|---|---:|---:|---:|---:|---:|---|---|\n");
		}
		double q = ratio(r);
		std::printf("| %s | %s | %.0f | %.0f | %.0f | %u | %s | %s | %s |\n",
			    r.variant.c_str(), r.param.c_str(), r.ns.median, r.ns.min, r.ns.max,
			    r.ns.reps, q > 0 ? (std::to_string(q).substr(0, 5) + "x").c_str() : "",
			    r.baseline.c_str(), r.note.c_str());
	}
	std::printf("\n");
	std::fflush(stdout);
}

void Report::write_csv(const std::string &path) const
{
	std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "w"), &std::fclose);
	if (!f)
		throw verbs::Error("cannot write " + path, errno);
	std::fprintf(f.get(),
		     "group,param,variant,reps,min_ns,median_ns,max_ns,ratio,baseline,note\n");
	for (const Row &r : rows_)
		std::fprintf(f.get(), "\"%s\",\"%s\",%s,%u,%.1f,%.1f,%.1f,%.4f,%s,\"%s\"\n",
			     r.group.c_str(), r.param.c_str(), r.variant.c_str(), r.ns.reps,
			     r.ns.min, r.ns.median, r.ns.max, ratio(r), r.baseline.c_str(),
			     r.note.c_str());
}

void Report::finish(const std::string &csv) const
{
	print_markdown();
	if (!csv.empty())
		write_csv(csv);
}

void run_sections(const char *bench, unsigned reps, bool quick,
		  std::initializer_list<Section> sections)
{
	std::fprintf(stderr, "bench %s: %u repetitions per row%s\n", bench, reps,
		     quick ? " (quick)" : "");
	for (const auto &[what, run] : sections) {
		auto t0 = std::chrono::steady_clock::now();
		std::fprintf(stderr, "bench %s: %s ...", bench, what);
		run();
		std::fprintf(stderr, " %.1f s\n",
			     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
				     .count());
	}
}

} // namespace odpwatch::bench
