// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
#include "report.hpp"
#include "verbs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

namespace odpwatch::bench
{

std::string size_name(size_t n)
{
	for (auto [shift, unit] : {std::pair{30, " GiB"}, {20, " MiB"}, {10, " KiB"}})
		if (n && !(n & ((size_t(1) << shift) - 1)))
			return std::to_string(n >> shift) + unit;
	return std::to_string(n) + " B";
}

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

std::vector<Spread> measure_interleaved(unsigned reps, double ops,
					const std::vector<std::function<void()>> &bodies)
{
	const size_t n = bodies.size();
	std::vector<std::vector<double>> samples(n);
	for (const auto &body : bodies)
		body();
	for (unsigned r = 0; r < reps; r++)
		for (size_t k = 0; k < n; k++) {
			const size_t b = (r + k) % n;
			auto t0 = std::chrono::steady_clock::now();
			bodies[b]();
			auto t1 = std::chrono::steady_clock::now();
			samples[b].push_back(
				std::chrono::duration<double, std::nano>(t1 - t0).count() / ops);
		}
	std::vector<Spread> spreads;
	for (auto &s : samples)
		spreads.push_back(spread_of(std::move(s)));
	return spreads;
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
	for (const std::string &r : remarks_)
		std::printf("\n%s\n", r.c_str());
	// One table per group, in the order groups first appear: rows of one
	// group may come from several sources (our cache, then each peer).
	std::vector<std::string> groups;
	for (const Row &r : rows_)
		if (std::find(groups.begin(), groups.end(), r.group) == groups.end())
			groups.push_back(r.group);
	for (const std::string &group : groups) {
		std::printf("\n### %s\n\n", group.c_str());
		std::printf("| variant | work | ns/op median | min | max | reps | ratio | vs "
			    "| note |\n|---|---|---:|---:|---:|---:|---:|---|---|\n");
		for (const Row &r : rows_) {
			if (r.group != group)
				continue;
			double q = ratio(r);
			std::printf("| %s | %s | %.0f | %.0f | %.0f | %u | %s | %s | %s |\n",
				    r.variant.c_str(), r.param.c_str(), r.ns.median, r.ns.min,
				    r.ns.max, r.ns.reps,
				    q > 0 ? (std::to_string(q).substr(0, 5) + "x").c_str() : "",
				    r.baseline.c_str(), r.note.c_str());
		}
	}
	std::printf("\n");
	std::fflush(stdout);
}

namespace
{

// A CSV field: quoted, with quotes doubled (RFC 4180).
std::string quoted(const std::string &s)
{
	std::string q = "\"";
	for (char c : s)
		q += c == '"' ? std::string("\"\"") : std::string(1, c);
	return q + "\"";
}

} // namespace

void Report::write_csv(const std::string &path) const
{
	std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "w"), &std::fclose);
	if (!f)
		throw verbs::Error("cannot write " + path, errno);
	std::fprintf(f.get(),
		     "group,param,variant,reps,min_ns,median_ns,max_ns,ratio,baseline,note\n");
	for (const Row &r : rows_)
		std::fprintf(f.get(), "%s,%s,%s,%u,%.1f,%.1f,%.1f,%.4f,%s,%s\n",
			     quoted(r.group).c_str(), quoted(r.param).c_str(),
			     quoted(r.variant).c_str(), r.ns.reps, r.ns.min, r.ns.median, r.ns.max,
			     ratio(r), quoted(r.baseline).c_str(), quoted(r.note).c_str());
}

void Report::write_rows(FILE *f, size_t from) const
{
	for (size_t i = from; i < rows_.size(); i++) {
		const Row &r = rows_[i];
		std::fprintf(f, "%s\t%s\t%s\t%u\t%.17g\t%.17g\t%.17g\t%s\t%s\n", r.group.c_str(),
			     r.param.c_str(), r.variant.c_str(), r.ns.reps, r.ns.min, r.ns.median,
			     r.ns.max, r.baseline.c_str(), r.note.c_str());
	}
	std::fflush(f);
}

void Report::read_rows(FILE *f)
{
	char *line = nullptr;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, f)) > 0) {
		std::vector<std::string> field;
		std::string s(line, size_t(n));
		if (s.back() == '\n')
			s.pop_back();
		for (size_t at = 0;;) {
			size_t tab = s.find('\t', at);
			field.push_back(s.substr(at, tab - at));
			if (tab == std::string::npos)
				break;
			at = tab + 1;
		}
		if (field.size() != 9)
			continue; // not a row: the peer's own chatter
		Row r{field[0], field[1], field[2], {}, field[7], field[8]};
		r.ns.reps = unsigned(std::stoul(field[3]));
		r.ns.min = std::stod(field[4]);
		r.ns.median = std::stod(field[5]);
		r.ns.max = std::stod(field[6]);
		add(std::move(r));
	}
	std::free(line);
}

void Report::finish(const std::string &csv) const
{
	print_markdown();
	if (!csv.empty())
		write_csv(csv);
}

void run_sections(const char *bench, unsigned reps, bool quick, const std::string &only,
		  std::initializer_list<Section> sections)
{
	if (std::none_of(sections.begin(), sections.end(), [&](const Section &s) {
		    return std::string_view(s.first).find(only) != std::string_view::npos;
	    })) {
		std::string names;
		for (const auto &s : sections)
			names += std::string(names.empty() ? "" : "; ") + s.first;
		throw verbs::Error("--only " + only + " matches no section of bench " + bench +
					   " (" + names + ")",
				   EINVAL);
	}
	std::fprintf(stderr, "bench %s: %u repetitions per row%s\n", bench, reps,
		     quick ? " (quick)" : "");
	for (const auto &[what, run] : sections) {
		if (std::string_view(what).find(only) == std::string_view::npos)
			continue;
		auto t0 = std::chrono::steady_clock::now();
		std::fprintf(stderr, "bench %s: %s ...", bench, what);
		run();
		std::fprintf(stderr, " %.1f s\n",
			     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
				     .count());
	}
}

} // namespace odpwatch::bench
