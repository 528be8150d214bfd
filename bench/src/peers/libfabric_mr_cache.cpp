// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
// libfabric's MR cache as its users meet it: fi_mr_reg/fi_close on a verbs
// provider domain, which caches registrations and drops them when its
// memory monitor (FI_MR_CACHE_MONITOR) reports an unmap; or with memwatch
// imported as that monitor (libodpwatch-ofi, monitor "memwatch"); or with
// memwatch built into libfabric (our series, monitor "memwatch-native": the
// peer runs with that libfabric, see main.cpp).
#include "peers.hpp"

#include <odpwatch/ofi_monitor.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <dlfcn.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace odpwatch::bench
{
namespace
{

[[noreturn]] void fail(const char *call, int ret)
{
	throw verbs::Error(std::string(call) + ": " + fi_strerror(-ret), -ret);
}

template <class Fid> void close_fid(Fid *f) noexcept
{
	if (f)
		fi_close(&f->fid);
}

struct InfoDeleter {
	void operator()(fi_info *i) const noexcept { fi_freeinfo(i); }
};
template <class Fid> struct FidDeleter {
	void operator()(Fid *f) const noexcept { close_fid(f); }
};
template <class Fid> using FidPtr = std::unique_ptr<Fid, FidDeleter<Fid>>;

class LibfabricCache final : public CacheUnderTest
{
public:
	LibfabricCache(const std::string &device, const std::string &monitor) : monitor_(monitor)
	{
		// Read once, when libfabric initialises: set before the first call.
		// memwatch is imported instead, before the domain takes a monitor.
		if (monitor == "memwatch") {
			if (int rc = odpwatch_ofi_monitor_import())
				throw verbs::Error("odpwatch_ofi_monitor_import", -rc);
		} else if (monitor == "memwatch-native") {
			// Debian's libfabric does not know the name and would run
			// its default monitor under our label.
			Dl_info where{};
			if (!dladdr(reinterpret_cast<void *>(&fi_getinfo), &where) ||
			    !std::strstr(where.dli_fname, kNativeLibfabricDir))
				throw verbs::Error(
					std::string("memwatch-native needs the libfabric "
						    "in ") +
						kNativeLibfabricDir + ", not " +
						(where.dli_fname ? where.dli_fname : "?"),
					ENOENT);
			setenv("FI_MR_CACHE_MONITOR", "memwatch", 1);
		} else {
			setenv("FI_MR_CACHE_MONITOR", monitor.c_str(), 1);
		}
		std::unique_ptr<fi_info, InfoDeleter> hints(fi_allocinfo());
		if (!hints)
			throw verbs::Error("fi_allocinfo", ENOMEM);
		hints->fabric_attr->prov_name = strdup("verbs");
		hints->ep_attr->type = FI_EP_MSG;
		hints->caps = FI_MSG | FI_RMA;
		hints->domain_attr->mr_mode =
			FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
		if (!device.empty())
			hints->domain_attr->name = strdup(device.c_str());
		fi_info *info = nullptr;
		int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr,
				     nullptr, 0, hints.get(), &info);
		if (ret)
			fail("fi_getinfo (verbs provider)", ret);
		info_.reset(info);
		fid_fabric *fabric = nullptr;
		if ((ret = fi_fabric(info_->fabric_attr, &fabric, nullptr)))
			fail("fi_fabric", ret);
		fabric_.reset(fabric);
		fid_domain *domain = nullptr;
		if ((ret = fi_domain(fabric_.get(), info_.get(), &domain, nullptr)))
			fail("fi_domain", ret);
		domain_.reset(domain);
		check_cache_is_on();
	}
	std::string name() const override { return "libfabric MR cache (" + monitor_ + ")"; }
	std::string how() const override
	{
		if (monitor_ == "memwatch")
			return "libodpwatch-ofi: valid() loads the region's memwatch word; a "
			       "thread "
			       "flushes the ranges memwatch reports";
		if (monitor_ == "memwatch-native")
			return "memwatch built into libfabric: valid() loads the region's "
			       "word; a thread flushes the ranges memwatch reports";
		if (monitor_ == "disabled")
			return "no cache: every fi_mr_reg registers, every fi_close "
			       "deregisters";
		return monitor_ == "memhooks"
			       ? "hooks on libc's memory calls flush the cache's entries"
			       : "a monitor thread reads userfaultfd unmap events";
	}
	CacheHit get(void *addr, size_t len) override
	{
		fid_mr *mr = nullptr;
		int ret = fi_mr_reg(domain_.get(), addr, len,
				    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_WRITE, 0, 0,
				    0, &mr, nullptr);
		if (ret)
			fail("fi_mr_reg", ret);
		return {mr, uint32_t(fi_mr_key(mr))};
	}
	void put(CacheHit h) override { close_fid(static_cast<fid_mr *>(h.handle)); }

private:
	// Without a working monitor the provider registers every time: then
	// there is no cache to measure, and the report must say so. With the
	// monitor "disabled" that is the point, and it is checked the other way.
	void check_cache_is_on()
	{
		void *p = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			throw verbs::Error("mmap", errno);
		std::memset(p, 1, 1 << 16);
		CacheHit a = get(p, 1 << 16);
		put(a);
		CacheHit b = get(p, 1 << 16);
		put(b);
		munmap(p, 1 << 16);
		if (monitor_ == "disabled" && a.key == b.key)
			throw verbs::Error("libfabric's MR cache is on with "
					   "FI_MR_CACHE_MONITOR=disabled",
					   EINVAL);
		if (monitor_ != "disabled" && a.key != b.key)
			throw verbs::Error(
				"libfabric's verbs provider does not cache registrations "
				"with FI_MR_CACHE_MONITOR=" +
					monitor_,
				ENOTSUP);
	}

	std::string monitor_;
	std::unique_ptr<fi_info, InfoDeleter> info_;
	FidPtr<fid_fabric> fabric_;
	FidPtr<fid_domain> domain_;
};

} // namespace

std::unique_ptr<CacheUnderTest> make_libfabric_cache(const std::string &device,
						     const std::string &monitor)
{
	return std::make_unique<LibfabricCache>(device, monitor);
}

} // namespace odpwatch::bench
