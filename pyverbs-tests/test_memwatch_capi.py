# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""libodpwatch's memwatch C ABI (odpwatch/memwatch.h) through its ctypes
binding: what a cache written in C meets, bad input included. memwatch
itself is tested by the kselftests; these check the library's wrapping."""
import ctypes
import errno
import os
import threading
import time

import pytest

from conftest import mmap_anon, munmap
from odpwatch_memwatch import MemWatch, _abi

PAGE = 4096


def err(f):
    with pytest.raises(OSError) as e:
        f()
    return e.value.errno


def test_a_buffer_is_watched_by_its_pages():
    """Any buffer: the range is the pages holding it, its events name the
    sub-range that changed."""
    buf = mmap_anon(4 * PAGE)
    try:
        with MemWatch(nonblock=True) as mw:
            r = mw.add(buf + 100, 2 * PAGE, cookie=7)
            assert (r.start, r.end) == (buf, buf + 3 * PAGE)
            assert r.is_valid() and mw.read_events() == []
            munmap(buf + 2 * PAGE, 2 * PAGE)
            assert not r.is_valid()
            ev = mw.read_events()
            assert [(e.cookie, e.start, e.end, e.reasons) for e in ev] == \
                [(7, buf + 2 * PAGE, buf + 3 * PAGE, 1)], ev
            assert mw.query()["watches"] == 1
            r.remove()
            assert mw.query()["watches"] == 0
    finally:
        munmap(buf, 2 * PAGE)


def test_overflow_is_reported_and_cleared():
    """A queue of 2 records and 3 watched changes: one is dropped, the flag
    says so until the caller has checked its ranges and clears it."""
    bufs = [mmap_anon(PAGE) for _ in range(3)]
    with MemWatch(nonblock=True, queue_size=2) as mw:
        rs = [mw.add(b, PAGE, cookie=i) for i, b in enumerate(bufs)]
        for b in bufs:
            munmap(b, PAGE)
        st = mw.query()
        assert (st["queue_size"], st["events_dropped"], st["overflow"]) == (2, 1, 1), st
        assert not any(r.is_valid() for r in rs)  # the words are never lost
        assert len(mw.read_events()) == 2
        mw.clear_overflow()
        assert mw.query()["overflow"] == 0


def test_bad_input_gets_its_errno():
    lib = _abi()
    out = ctypes.c_void_p()
    assert lib.odpwatch_memwatch_create(1 << 5, 0, ctypes.byref(out)) == -errno.EINVAL
    assert lib.odpwatch_memwatch_create(0, 0, None) == -errno.EINVAL
    assert lib.odpwatch_memwatch_create(0, (1 << 16) + 1, ctypes.byref(out)) == -errno.EINVAL
    assert lib.odpwatch_memwatch_destroy(None) == -errno.EINVAL
    assert lib.odpwatch_memwatch_fd(None) == -errno.EINVAL
    buf = mmap_anon(PAGE)
    try:
        with MemWatch(nonblock=True) as mw:
            assert err(lambda: mw.add(buf, 0)) == errno.EINVAL
            assert err(lambda: mw.add(2**64 - PAGE, 2 * PAGE)) == errno.EINVAL
            r = mw.add(buf, PAGE)
            r.remove()
            assert err(r.remove) == errno.ENOENT
            assert err(lambda: mw.read_events(0)) == errno.EINVAL
    finally:
        munmap(buf, PAGE)


def test_a_child_of_fork_gets_eperm():
    """The memwatch watches its creator's address space: a child's calls fail."""
    buf = mmap_anon(PAGE)
    with MemWatch(nonblock=True) as mw:
        pid = os.fork()
        if pid == 0:
            try:
                code = 0 if err(lambda: mw.add(buf, PAGE)) == errno.EPERM else 1
            except BaseException:
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
    munmap(buf, PAGE)


def wait_in_poll(tid, timeout=10):
    """Until thread @tid of this process sleeps in poll()."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/self/task/{tid}/wchan") as f:
            if "poll" in f.read():
                return
        time.sleep(0.01)
    raise AssertionError(f"thread {tid} never waited in poll()")


def test_a_wake_delay_holds_the_waiter_back():
    """With a wake delay of 300 ms, a reader waiting for events wakes no
    sooner than that after the munmap; the range is invalid at once."""
    buf = mmap_anon(PAGE)
    with MemWatch() as mw:
        assert err(lambda: mw.set_wake_delay(1000001)) == errno.EINVAL
        mw.set_wake_delay(300000)
        r = mw.add(buf, PAGE, cookie=5)
        got = {}

        def reader():
            got["tid"] = threading.get_native_id()
            got["events"] = mw.read_events()
            got["woke"] = time.monotonic()

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        while "tid" not in got:
            time.sleep(0.01)
        wait_in_poll(got["tid"])
        t0 = time.monotonic()
        munmap(buf, PAGE)
        assert not r.is_valid()
        t.join(10)
        assert not t.is_alive()
        assert [e.cookie for e in got["events"]] == [5]
        assert got["woke"] - t0 >= 0.29, got["woke"] - t0

