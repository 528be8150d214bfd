// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// odpwatch mr-counters: the ODP counters of every MR of a device, from RDMA
// netlink (what `rdma stat show mr` prints), joined with each MR's owner,
// keys and length from the MR resource dump.
#include "cli.hpp"
#include "verbs.hpp"

#include <linux/netlink.h>
#include <rdma/rdma_netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace odpwatch::cli
{
namespace
{

// The attributes of one nesting level: type -> payload (copied: the receive
// buffer is reused).
using Attrs = std::multimap<uint16_t, std::string>;

Attrs parse(std::string_view buf)
{
	Attrs out;
	while (buf.size() >= NLA_HDRLEN) {
		nlattr a;
		std::memcpy(&a, buf.data(), sizeof(a));
		if (a.nla_len < NLA_HDRLEN || a.nla_len > buf.size())
			break;
		out.emplace(a.nla_type & NLA_TYPE_MASK,
			    std::string(buf.substr(NLA_HDRLEN, a.nla_len - NLA_HDRLEN)));
		buf.remove_prefix(std::min<size_t>(NLA_ALIGN(a.nla_len), buf.size()));
	}
	return out;
}

template <class T> T value(const Attrs &a, uint16_t type, T fallback = {})
{
	auto it = a.find(type);
	if (it == a.end() || it->second.size() < sizeof(T))
		return fallback;
	T v;
	std::memcpy(&v, it->second.data(), sizeof(v));
	return v;
}

std::string text(const Attrs &a, uint16_t type)
{
	auto it = a.find(type);
	if (it == a.end())
		return "";
	return it->second.substr(0, it->second.find('\0'));
}

class Socket
{
public:
	Socket() : fd_(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA))
	{
		if (fd_ < 0)
			throw verbs::Error("socket(NETLINK_RDMA)", errno);
	}
	Socket(const Socket &) = delete;
	Socket &operator=(const Socket &) = delete;
	~Socket() { close(fd_); }

	// A dump request with u32 attributes; the MR entries of every reply.
	std::vector<Attrs> dump_mrs(uint16_t op, std::vector<std::pair<uint16_t, uint32_t>> in)
	{
		std::vector<char> req(NLMSG_HDRLEN);
		for (auto [type, v] : in) {
			nlattr a{static_cast<uint16_t>(NLA_HDRLEN + sizeof(v)), type};
			req.insert(req.end(), reinterpret_cast<char *>(&a),
				   reinterpret_cast<char *>(&a) + sizeof(a));
			req.insert(req.end(), reinterpret_cast<char *>(&v),
				   reinterpret_cast<char *>(&v) + sizeof(v));
		}
		nlmsghdr h{};
		h.nlmsg_len = static_cast<uint32_t>(req.size());
		h.nlmsg_type = RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op);
		h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
		h.nlmsg_seq = ++seq_;
		std::memcpy(req.data(), &h, sizeof(h));
		if (send(fd_, req.data(), req.size(), 0) < 0)
			throw verbs::Error("send on NETLINK_RDMA", errno);

		std::vector<Attrs> mrs;
		std::vector<char> buf(1 << 16);
		for (;;) {
			ssize_t n = recv(fd_, buf.data(), buf.size(), 0);
			if (n < 0)
				throw verbs::Error("recv on NETLINK_RDMA", errno);
			for (auto *m = reinterpret_cast<nlmsghdr *>(buf.data()); NLMSG_OK(m, n);
			     m = NLMSG_NEXT(m, n)) {
				if (m->nlmsg_type == NLMSG_DONE)
					return mrs;
				if (m->nlmsg_type == NLMSG_ERROR) {
					auto *e = static_cast<nlmsgerr *>(NLMSG_DATA(m));
					if (e->error)
						throw verbs::Error("RDMA netlink dump", -e->error);
					continue;
				}
				std::string_view body(static_cast<char *>(NLMSG_DATA(m)),
						      m->nlmsg_len - NLMSG_HDRLEN);
				auto top = parse(body);
				auto table = top.find(RDMA_NLDEV_ATTR_RES_MR);
				if (table == top.end())
					continue;
				for (auto &[t, entry] : parse(table->second))
					if (t == RDMA_NLDEV_ATTR_RES_MR_ENTRY)
						mrs.push_back(parse(entry));
			}
		}
	}

private:
	int fd_;
	uint32_t seq_ = 0;
};

struct Mr {
	uint32_t pid = 0, lkey = 0;
	uint64_t length = 0;
	std::string comm;
	std::map<std::string, uint64_t> counters;
};

} // namespace

int mr_counters(const Options &opt)
{
	verbs::Context ctx = verbs::open_device(opt.device);
	const int index = ibv_get_device_index(ctx->device);
	if (index < 0)
		throw verbs::Error("ibv_get_device_index", ENODEV);
	Socket nl;
	const uint32_t dev = static_cast<uint32_t>(index);
	std::map<uint32_t, Mr> mrs;
	for (auto &e : nl.dump_mrs(RDMA_NLDEV_CMD_RES_MR_GET, {{RDMA_NLDEV_ATTR_DEV_INDEX, dev}})) {
		Mr &m = mrs[value<uint32_t>(e, RDMA_NLDEV_ATTR_RES_MRN)];
		m.pid = value<uint32_t>(e, RDMA_NLDEV_ATTR_RES_PID);
		m.lkey = value<uint32_t>(e, RDMA_NLDEV_ATTR_RES_LKEY);
		m.length = value<uint64_t>(e, RDMA_NLDEV_ATTR_RES_MRLEN);
		m.comm = text(e, RDMA_NLDEV_ATTR_RES_KERN_NAME);
	}
	size_t odp = 0;
	for (auto &e : nl.dump_mrs(RDMA_NLDEV_CMD_STAT_GET,
				   {{RDMA_NLDEV_ATTR_DEV_INDEX, dev},
				    {RDMA_NLDEV_ATTR_STAT_RES, RDMA_NLDEV_ATTR_RES_MR}})) {
		auto hw = e.find(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS);
		if (hw == e.end())
			continue;
		Mr &m = mrs[value<uint32_t>(e, RDMA_NLDEV_ATTR_RES_MRN)];
		for (auto &[t, c] : parse(hw->second)) {
			if (t != RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY)
				continue;
			auto ce = parse(c);
			m.counters[text(ce, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME)] =
				value<uint64_t>(ce, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE);
		}
		odp++;
	}

	static const char *const names[] = {"page_faults", "page_faults_handled",
					    "page_invalidations", "page_invalidations_handled",
					    "page_prefetch"};
	std::printf("%s: %zu MRs, %zu on demand\n", ibv_get_device_name(ctx->device), mrs.size(),
		    odp);
	if (!odp)
		return 0;
	std::printf("%6s %7s %10s %14s", "mrn", "pid", "lkey", "length");
	for (const char *n : names)
		std::printf(" %s", n);
	std::printf("\n");
	for (auto &[mrn, m] : mrs) {
		if (m.counters.empty())
			continue;
		std::printf("%6u %7u 0x%08x %14llu", mrn, m.pid, m.lkey,
			    static_cast<unsigned long long>(m.length));
		for (const char *n : names)
			std::printf(" %*llu", static_cast<int>(std::strlen(n)),
				    static_cast<unsigned long long>(m.counters[n]));
		std::printf("\n");
	}
	return 0;
}

} // namespace odpwatch::cli
