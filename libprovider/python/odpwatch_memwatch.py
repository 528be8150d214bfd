# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Python (ctypes) binding of libodpwatch's memwatch C ABI
(odpwatch/memwatch.h), as a registration cache written in C uses it:

    with MemWatch(nonblock=True) as mw:
        r = mw.add(addr, length, cookie=1)
        ... r.is_valid() ... mw.read_events() ...

See odpwatch_memwatch_create(3).
"""
import ctypes
import os

NONBLOCK = 1


class _Range(ctypes.Structure):
    _fields_ = [("gen_word", ctypes.c_void_p), ("generation", ctypes.c_uint64),
                ("id", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("start", ctypes.c_uint64), ("end", ctypes.c_uint64)]


class _Event(ctypes.Structure):
    _fields_ = [("cookie", ctypes.c_uint64), ("start", ctypes.c_uint64),
                ("end", ctypes.c_uint64), ("id", ctypes.c_uint32),
                ("reasons", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "watches", "invalidations", "changes", "events_queued", "events_coalesced",
        "events_read", "events_dropped")] + [
        (n, ctypes.c_uint32) for n in ("queue_size", "queue_used", "overflow", "reserved")]


_lib = None


def _abi():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(os.environ.get("ODPWATCH_LIB", "libodpwatch.so.0"))
        lib.odpwatch_memwatch_create.argtypes = [ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.POINTER(ctypes.c_void_p)]
        lib.odpwatch_memwatch_destroy.argtypes = [ctypes.c_void_p]
        lib.odpwatch_memwatch_fd.argtypes = [ctypes.c_void_p]
        lib.odpwatch_memwatch_add.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_uint64, ctypes.c_uint32,
                                              ctypes.POINTER(_Range)]
        lib.odpwatch_memwatch_remove.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Range)]
        lib.odpwatch_memwatch_read_events.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Event),
                                                      ctypes.c_size_t]
        lib.odpwatch_memwatch_read_events.restype = ctypes.c_ssize_t
        lib.odpwatch_memwatch_query.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
        lib.odpwatch_memwatch_clear_overflow.argtypes = [ctypes.c_void_p]
        lib.odpwatch_memwatch_set_wake_delay.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        _lib = lib
    return _lib


def _check(rc, what):
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


class MemWatchEvent:
    def __init__(self, ev):
        self.cookie, self.start, self.end = ev.cookie, ev.start, ev.end
        self.id, self.reasons, self.flags = ev.id, ev.reasons, ev.flags

    def __repr__(self):
        return (f"MemWatchEvent(id={self.id}, cookie={self.cookie:#x}, start={self.start:#x}, "
                f"end={self.end:#x}, reasons={self.reasons:#x}, flags={self.flags:#x})")


class MemWatchRange:
    """A watched range; made by MemWatch.add()."""

    def __init__(self, owner, rng):
        self._owner, self._rng = owner, rng

    def is_valid(self):
        """True while nothing changed the range's mapping (one load)."""
        self._owner._check_open()
        return ctypes.c_uint64.from_address(self._rng.gen_word).value == self._rng.generation

    def remove(self):
        self._owner._check_open()
        _check(_abi().odpwatch_memwatch_remove(self._owner._mw, ctypes.byref(self._rng)),
               "odpwatch_memwatch_remove")

    @property
    def id(self):
        return self._rng.id

    @property
    def start(self):
        return self._rng.start

    @property
    def end(self):
        return self._rng.end


class MemWatch:
    """A memwatch of this process's address space.
    nonblock: read_events() returns [] instead of waiting;
    queue_size: events the kernel queue holds (None: its default)."""

    def __init__(self, nonblock=False, queue_size=None):
        mw = ctypes.c_void_p()
        _check(_abi().odpwatch_memwatch_create(NONBLOCK if nonblock else 0, queue_size or 0,
                                               ctypes.byref(mw)), "odpwatch_memwatch_create")
        self._mw = mw

    def _check_open(self):
        if self._mw is None:
            raise ValueError("the memwatch is closed")

    def close(self):
        if self._mw is not None:
            _abi().odpwatch_memwatch_destroy(self._mw)
            self._mw = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @property
    def fd(self):
        self._check_open()
        return _abi().odpwatch_memwatch_fd(self._mw)

    def add(self, addr, length, cookie=0, reasons=0):
        """Watch the pages holding [addr, addr + length)."""
        self._check_open()
        rng = _Range()
        _check(_abi().odpwatch_memwatch_add(self._mw, addr, length, cookie, reasons,
                                            ctypes.byref(rng)), "odpwatch_memwatch_add")
        return MemWatchRange(self, rng)

    def read_events(self, max_events=64):
        self._check_open()
        evs = (_Event * max_events)()
        n = _check(_abi().odpwatch_memwatch_read_events(self._mw, evs, max_events),
                   "odpwatch_memwatch_read_events")
        return [MemWatchEvent(evs[i]) for i in range(n)]

    def query(self):
        self._check_open()
        st = _Stats()
        _check(_abi().odpwatch_memwatch_query(self._mw, ctypes.byref(st)),
               "odpwatch_memwatch_query")
        return {name: getattr(st, name) for name, _ in _Stats._fields_ if name != "reserved"}

    def clear_overflow(self):
        self._check_open()
        _check(_abi().odpwatch_memwatch_clear_overflow(self._mw),
               "odpwatch_memwatch_clear_overflow")

    def set_wake_delay(self, delay_us):
        self._check_open()
        if not 0 <= delay_us < 2**32:
            raise ValueError(f"delay_us {delay_us} out of range")
        _check(_abi().odpwatch_memwatch_set_wake_delay(self._mw, delay_us),
               "odpwatch_memwatch_set_wake_delay")
