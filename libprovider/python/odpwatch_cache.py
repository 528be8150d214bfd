# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Python (ctypes) binding of the odpwatch registration cache, for use
beside pyverbs: the cache registers into the kernel PD of a pyverbs PD (by
importing it), so its MRs' keys serve that PD's QPs.

    with RegCache(ctx, pd, policy="pinned") as cache:
        with cache.get(addr, length, e.IBV_ACCESS_LOCAL_WRITE) as reg:
            ... SGE(addr, length, reg.lkey) ...

See odpwatch_cache_create(3).
"""
import ctypes
import errno
import os

POLICIES = {"auto": 0, "implicit-odp": 1, "explicit-odp": 2, "pinned": 3}


class CacheAttr(ctypes.Structure):
    _fields_ = [("policy", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint64), ("max_bytes", ctypes.c_uint64),
                ("rc_odp_needs", ctypes.c_uint32), ("uc_odp_needs", ctypes.c_uint32),
                ("ud_odp_needs", ctypes.c_uint32), ("xrc_odp_needs", ctypes.c_uint32),
                ("reserved", ctypes.c_uint64 * 2)]


class CacheStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "hits", "misses", "invalidations", "evictions", "registrations",
        "deregistrations", "entries", "bytes", "in_use", "max_entries", "max_bytes",
        "merges", "retries", "uncached")] + [("reserved", ctypes.c_uint64 * 5)]


class IbvMr(ctypes.Structure):
    """The head of struct ibv_mr (verbs.h), as far as the keys."""
    _fields_ = [("context", ctypes.c_void_p), ("pd", ctypes.c_void_p),
                ("addr", ctypes.c_void_p), ("length", ctypes.c_size_t),
                ("handle", ctypes.c_uint32), ("lkey", ctypes.c_uint32),
                ("rkey", ctypes.c_uint32)]


def _load():
    lib = ctypes.CDLL(os.environ.get("ODPWATCH_LIB", "libodpwatch.so.0"), use_errno=True)
    verbs = ctypes.CDLL("libibverbs.so.1", use_errno=True)
    P, I = ctypes.c_void_p, ctypes.c_int
    for name, res, args in (
            ("odpwatch_cache_create", I, [ctypes.POINTER(CacheAttr), ctypes.POINTER(P)]),
            ("odpwatch_cache_destroy", I, [P]),
            ("odpwatch_cache_get", I, [P, P, P, ctypes.c_size_t, ctypes.c_uint, ctypes.POINTER(P)]),
            ("odpwatch_cache_put", I, [P, P]),
            ("odpwatch_cache_reg_mr", ctypes.POINTER(IbvMr), [P]),
            ("odpwatch_cache_policy_of", I, [P, P]),
            ("odpwatch_cache_query", I, [P, ctypes.POINTER(CacheStats)]),
            ("odpwatch_cache_process_events", I, [P]),
            ("odpwatch_cache_event_fd", I, [P]),
            ("odpwatch_cache_policy_name", ctypes.c_char_p, [I])):
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    for name, res, args in (("ibv_import_device", P, [I]), ("ibv_close_device", I, [P]),
                            ("ibv_import_pd", P, [P, ctypes.c_uint32]),
                            ("ibv_unimport_pd", None, [P])):
        f = getattr(verbs, name)
        f.restype, f.argtypes = res, args
    return lib, verbs


_lib, _verbs = _load()


def _check(rc, what):
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


class Registration:
    """A reference to a cached registration; put() (or leaving a with) drops it."""

    def __init__(self, cache, handle):
        self._cache, self._handle = cache, handle
        mr = _lib.odpwatch_cache_reg_mr(handle).contents
        self.lkey, self.rkey = mr.lkey, mr.rkey
        self.addr, self.length = mr.addr or 0, mr.length

    def put(self):
        if self._handle:
            _check(_lib.odpwatch_cache_put(self._cache._cache, self._handle),
                   "odpwatch_cache_put")
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.put()


class RegCache:
    """A registration cache on the kernel PD of a pyverbs Context and PD."""

    def __init__(self, ctx, pd, policy="auto", max_entries=0, max_bytes=0):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
        self._cache = self._ctx = self._pd = None
        fd = os.dup(ctx.cmd_fd)  # the imported context owns its descriptor
        self._ctx = _verbs.ibv_import_device(fd)
        if not self._ctx:
            err = ctypes.get_errno() or errno.EINVAL
            try:  # a provider that failed late has closed it already
                os.close(fd)
            except OSError:
                pass
            raise OSError(err, f"ibv_import_device: {os.strerror(err)}")
        self._pd = _verbs.ibv_import_pd(self._ctx, pd.handle)
        if not self._pd:
            err = ctypes.get_errno() or errno.EINVAL
            self.close()
            raise OSError(err, "ibv_import_pd")
        attr = CacheAttr(policy=POLICIES[policy], max_entries=max_entries, max_bytes=max_bytes)
        cache = ctypes.c_void_p()
        try:
            _check(_lib.odpwatch_cache_create(ctypes.byref(attr), ctypes.byref(cache)),
                   "odpwatch_cache_create")
        except OSError:
            self.close()
            raise
        self._cache = cache

    def get(self, addr, length, access):
        reg = ctypes.c_void_p()
        _check(_lib.odpwatch_cache_get(self._cache, self._pd, addr, length, access,
                                       ctypes.byref(reg)), "odpwatch_cache_get")
        return Registration(self, reg)

    @property
    def policy(self):
        p = _check(_lib.odpwatch_cache_policy_of(self._cache, self._pd), "odpwatch_cache_policy_of")
        return _lib.odpwatch_cache_policy_name(p).decode()

    def stats(self):
        s = CacheStats()
        _check(_lib.odpwatch_cache_query(self._cache, ctypes.byref(s)), "odpwatch_cache_query")
        return {n: getattr(s, n) for n, _ in CacheStats._fields_ if n != "reserved"}

    def process_events(self):
        return _check(_lib.odpwatch_cache_process_events(self._cache),
                      "odpwatch_cache_process_events")

    def close(self):
        if self._cache:
            _check(_lib.odpwatch_cache_destroy(self._cache), "odpwatch_cache_destroy")
            self._cache = None
        if self._pd:
            _verbs.ibv_unimport_pd(self._pd)
            self._pd = None
        if self._ctx:
            _verbs.ibv_close_device(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
