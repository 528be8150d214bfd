# SPDX-License-Identifier: GPL-2.0
"""libfabric's own fabtest of changing mappings, across the two kernels.

fi_unmap_mem (fabtests, built from the libfabric source with our series
into /out/guest/libfabric) maps each send buffer afresh at the address of
the last one, fills it with a pattern of its iteration and sender (our
series' fabtests patch: fabtests' own fill is the same in every message,
so the old pages carried the right bytes), sends it, then gives it back
with madvise(MADV_DONTNEED) and munmap; the receiver checks every byte. 1 MiB
messages are far above ofi_rxm's eager and segmented limits, so they go
by rendezvous from a registration libfabric's MR cache hands out: a
monitor that missed the unmap would hand out the old pages' registration
and the data check would fail. Node 1 runs the server (over ssh), node 0
the client; the two exchange addresses over a socket on the wire (-E)."""
import re
import shlex
import subprocess
import time

import pytest

from conftest import OFI, run

LIBFABRIC = "/out/guest/libfabric"
PRELOAD = "/out/guest/lib/libodpwatch-ofi-preload.so"
SECCOMP_DENY = "/out/guest/bin/odpwatch-seccomp-deny"
PEER = "odpwatch-node1"
SIZE = 1 << 20
ITERATIONS = 50

# The monitors of libfabric's MR cache: its own three, memwatch built in
# (our series) and memwatch imported through fi_import_fid (libodpwatch-ofi);
# "blind" (a test fixture) accepts every region and reports nothing.
BLIND = {"blind": {"LD_PRELOAD": "/out/guest/lib/libodpwatch-ofi-blind.so"}}
MONITORS = {
    "memhooks": {"FI_MR_CACHE_MONITOR": "memhooks"},
    "userfaultfd": {"FI_MR_CACHE_MONITOR": "userfaultfd"},
    "disabled": {"FI_MR_CACHE_MONITOR": "disabled"},
    "memwatch-native": {"FI_MR_CACHE_MONITOR": "memwatch"},
    "memwatch-import": {"LD_PRELOAD": PRELOAD, "ODPWATCH_OFI_DEBUG": "1"},
}


def fabtest_env(monitor):
    return {**OFI, "LD_LIBRARY_PATH": f"{LIBFABRIC}/lib", "FI_LOG_LEVEL": "info",
            "FI_LOG_SUBSYS": "mr", **{**MONITORS, **BLIND}[monitor]}


def unmap_mem(monitor, limit=240, deny=None):
    """Server on node 1, client on node 0, each ended after @limit seconds
    (and each under a seccomp filter answering the system call @deny with
    EPERM, if given): both outputs and exit statuses."""
    env = fabtest_env(monitor)
    args = [f"{LIBFABRIC}/bin/fi_unmap_mem", "-p", OFI["FI_PROVIDER"], "-E",
            "-S", str(SIZE), "-I", str(ITERATIONS)]
    if deny:
        args = [SECCOMP_DENY, "EPERM", deny] + args
    remote = " ".join(["timeout", str(limit), "env"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
                      + [shlex.quote(a) for a in args])
    server = subprocess.Popen(["ssh", PEER, remote], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        # The server listens once ssh has started it: retry a refused client.
        for _ in range(30):
            # The environment through env(1): LD_PRELOAD must reach the
            # fabtest only, not timeout(1), whose exit would print a
            # preloaded monitor's lines for it.
            out, rc = run(["timeout", str(limit), "env"] + [f"{k}={v}" for k, v in env.items()]
                          + args + [PEER], timeout=limit + 30)
            if rc == 0 or "Connection refused" not in out:
                break
            time.sleep(1)
        server_out, _ = server.communicate(timeout=limit + 30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    return out, rc, server_out, server.returncode


def cache_stats(out):
    """libfabric's MR cache counters (logged at cleanup), summed."""
    rows = re.findall(r"MR cache stats: searches (\d+), deletes (\d+), hits (\d+)", out)
    return [sum(int(r[i]) for r in rows) for i in range(3)] if rows else None


@pytest.mark.parametrize("monitor", MONITORS)
def test_fi_unmap_mem_across_the_kernels(monitor):
    out, rc, server_out, server_rc = unmap_mem(monitor)
    both = f"client (node 0):\n{out[-3000:]}\nserver (node 1):\n{server_out[-3000:]}"
    print(both)
    assert (rc, server_rc) == (0, 0), both
    for side in (out, server_out):
        if monitor == "memwatch-native":
            assert "memwatch memory monitor started" in side, both
        if monitor == "memwatch-import":
            assert "odpwatch-ofi: stats subscribes=" in side, both
        stats = cache_stats(side)
        if monitor == "disabled":
            assert stats is None, both
        else:
            # The cache was on and used: each message's buffer searched.
            assert stats and stats[0] >= ITERATIONS, both


def test_fi_unmap_mem_fails_with_a_blind_monitor():
    """The test above can fail for the reason it exists. With a monitor that
    never reports an unmap, the cache hands out the first buffer's
    registration for the next, and its pinned old pages carry the last
    iteration's pattern: the receiver's check must name the byte (the
    fabtest gives every message a pattern of its own, our libfabric
    series' last patch; with fabtests' own fill, the same every time, this
    passed)."""
    out, rc, server_out, server_rc = unmap_mem("blind", limit=90)
    both = f"client (node 0):\n{out[-3000:]}\nserver (node 1):\n{server_out[-3000:]}"
    print(both)
    for side in (out, server_out):
        assert "a monitor that reports nothing is imported" in side, both
    assert (rc, server_rc) != (0, 0), both
    assert re.search(r"iteration \d+: byte \d+ of \d+ is", out + server_out), both


@pytest.mark.parametrize("monitor,call", [("memwatch-native", "memwatch_create"),
                                          ("memwatch-import", "memwatch_create"),
                                          ("userfaultfd", "userfaultfd")])
def test_fi_unmap_mem_with_its_monitor_refused_by_seccomp(monitor, call):
    """In a container whose seccomp profile answers the monitor's system
    call with EPERM, libfabric says once why the monitor did not start and
    runs with its MR cache off: every byte still right, nothing cached,
    nothing crashed."""
    out, rc, server_out, server_rc = unmap_mem(monitor, deny=call)
    both = f"client (node 0):\n{out[-3000:]}\nserver (node 1):\n{server_out[-3000:]}"
    print(both)
    assert (rc, server_rc) == (0, 0), both
    for side in (out, server_out):
        # Once, and why (the monitor's own warning may name the errno).
        assert len(re.findall(r"Failed to start \S+ memory monitor", side)) == 1, both
        assert "Operation not permitted" in side, both
        assert "MR caching disabled" in side, both
        assert cache_stats(side) is None, both
