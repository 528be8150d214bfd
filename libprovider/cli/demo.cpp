// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// `odpwatch demo`: the registration-cache problem, shown with real RDMA
// traffic. A cached registration of buffer A is used after A was freed and a
// new buffer B was mapped at the same address: a pinned MR still sends A's
// bytes (the stale-registration bug), an ODP MR follows the mapping and
// sends B's, and a pinned cache with memwatch learns with one load that its
// entry is stale and registers again.
#include "cli.hpp"
#include "memwatch.hpp"
#include "verbs.hpp"

#include <odpwatch/odpwatch.h>
#include <sys/utsname.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

namespace odpwatch::cli
{

namespace v = odpwatch::verbs;

namespace
{

constexpr size_t kLen = 64 * 1024;

struct Outcome {
	ibv_wc_status status;
	char received;	  // the byte the peer found at the start of its buffer
	bool invalidated; // memwatch told the cache its entry was stale
};

// Register A, free it, map B at the same address, send from the cached MR.
// With a memwatch, the cache checks its entry (one load) before using it and
// registers again when the entry is stale.
Outcome cached_registration_after_reuse(ibv_pd *pd, v::LoopbackQp &qp, unsigned access,
					Memwatch *watch)
{
	v::Mapping a(kLen);
	std::memset(a.data(), 'A', kLen);
	void *addr = a.data();
	v::Mr cached = v::reg_mr(pd, addr, kLen, access | IBV_ACCESS_LOCAL_WRITE);
	std::optional<Memwatch::Watch> w;
	if (watch)
		w = watch->add(addr, kLen, 1);

	a.unmap();		  // the application frees A...
	v::Mapping b(kLen, addr); // ...and B lands at the same address
	std::memset(b.data(), 'B', kLen);

	bool invalidated = w && !watch->valid(*w);
	if (invalidated) {
		watch->remove(w->id);
		cached = v::reg_mr(pd, addr, kLen, access | IBV_ACCESS_LOCAL_WRITE);
	}

	v::Mapping peer(kLen);
	std::memset(peer.data(), '-', kLen);
	v::Mr peer_mr =
		v::reg_mr(pd, peer.data(), kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	ibv_wc_status st = qp.rdma_write(cached.get(), addr, kLen, peer_mr.get(), peer.data());
	return {st, static_cast<char>(peer.data()[0]), invalidated};
}

std::string caps_line(uint32_t c)
{
	static const std::pair<uint32_t, const char *> names[] = {
		{IBV_ODP_SUPPORT_SEND, "send"},	    {IBV_ODP_SUPPORT_RECV, "recv"},
		{IBV_ODP_SUPPORT_WRITE, "write"},   {IBV_ODP_SUPPORT_READ, "read"},
		{IBV_ODP_SUPPORT_ATOMIC, "atomic"}, {IBV_ODP_SUPPORT_SRQ_RECV, "srq-recv"},
	};
	std::string s;
	for (auto [bit, name] : names)
		if (c & bit)
			s += (s.empty() ? "" : " ") + std::string(name);
	return s.empty() ? "none" : s;
}

const char *verdict(const Outcome &o)
{
	if (o.status != IBV_WC_SUCCESS)
		return ibv_wc_status_str(o.status);
	if (o.received == 'A')
		return "WRONG: stale registration, the freed buffer's bytes went out";
	if (o.received == 'B' && o.invalidated)
		return "correct: one load said the entry was stale; registered again";
	if (o.received == 'B')
		return "correct: the registration follows the new mapping";
	return "unexpected bytes";
}

} // namespace

std::string describe_caps(const odpwatch_odp_caps &c)
{
	if (!c.supported)
		return "ODP: not supported\n";
	return "ODP: supported; implicit ODP: " + std::string(c.implicit ? "yes" : "no") +
	       "\n  RC: " + caps_line(c.rc_caps) + "\n  UD: " + caps_line(c.ud_caps) + "\n";
}

int demo(const Options &opt)
{
	utsname u{};
	uname(&u);
	std::printf("odpwatch demo: the RDMA registration-cache problem, on kernel %s\n\n",
		    u.release);

	v::Context ctx = v::open_device(opt.device);
	v::Pd pd = v::alloc_pd(ctx.get());
	odpwatch_odp_caps caps{};
	if (int rc = odpwatch_query_odp_caps(ctx.get(), &caps))
		throw v::Error("odpwatch_query_odp_caps", -rc);
	v::LoopbackQp qp(ctx.get(), pd.get());
	std::printf("device %s, port 1, RoCE v2 GID index %d\n%s\n",
		    ibv_get_device_name(ctx->device), qp.gid_index(), describe_caps(caps).c_str());

	std::optional<Memwatch> mw;
	try {
		mw.emplace();
	} catch (const v::Error &e) {
		std::printf("(%s: the memwatch row is left out)\n\n", e.what());
	}

	std::printf("An MPI library caches registrations by address. The application:\n"
		    "  1. maps buffer A (%zu KiB, filled with 'A'); the library registers it\n"
		    "  2. frees A; a new buffer B (filled with 'B') is mapped at the same address\n"
		    "  3. sends from that address again: the cache finds A's registration\n\n",
		    kLen / 1024);

	struct Row {
		const char *policy;
		unsigned access;
		Memwatch *watch;
		bool must_be_right; // the ways odpwatch fixes the problem
	} rows[] = {{"pinned MR", 0, nullptr, false},
		    {"ODP MR", IBV_ACCESS_ON_DEMAND, nullptr, true},
		    {"pinned MR + memwatch", 0, mw ? &*mw : nullptr, true}};
	bool ok = true;
	std::printf("  %-20s | %-13s | %s\n", "policy", "peer received", "verdict");
	std::printf("  %-20s-+-%-13s-+-%s\n", "--------------------", "-------------", "-------");
	for (const Row &r : rows) {
		if (r.must_be_right && r.access == 0 && !r.watch)
			continue; // the memwatch row, on a kernel without memwatch
		Outcome o = cached_registration_after_reuse(pd.get(), qp, r.access, r.watch);
		std::printf("  %-20s | '%c'           | %s\n", r.policy, o.received, verdict(o));
		if (r.must_be_right)
			ok &= o.status == IBV_WC_SUCCESS && o.received == 'B';
	}
	std::printf(
		"\nA pinned registration keeps the old pages alive and sends them. ODP follows\n"
		"the mapping; memwatch tells a pinned cache, with one load and no malloc hook,\n"
		"that its entry went stale before munmap() returned.\n");
	return ok ? 0 : 1;
}

} // namespace odpwatch::cli
