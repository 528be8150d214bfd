# SPDX-License-Identifier: GPL-2.0
"""libfabric's own fabtest of changing mappings, across the two kernels.

fi_unmap_mem (fabtests, built from the libfabric source with our series
into /out/guest/libfabric) maps each send buffer afresh at the address of
the last one, sends it with data verification, then gives it back with
madvise(MADV_DONTNEED) and munmap; the receiver checks every byte. 1 MiB
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
PEER = "odpwatch-node1"
SIZE = 1 << 20
ITERATIONS = 50

# The monitors of libfabric's MR cache: its own three, memwatch built in
# (our series) and memwatch imported through fi_import_fid (libodpwatch-ofi).
MONITORS = {
    "memhooks": {"FI_MR_CACHE_MONITOR": "memhooks"},
    "userfaultfd": {"FI_MR_CACHE_MONITOR": "userfaultfd"},
    "disabled": {"FI_MR_CACHE_MONITOR": "disabled"},
    "memwatch-native": {"FI_MR_CACHE_MONITOR": "memwatch"},
    "memwatch-import": {"LD_PRELOAD": PRELOAD, "ODPWATCH_OFI_DEBUG": "1"},
}


def fabtest_env(monitor):
    return {**OFI, "LD_LIBRARY_PATH": f"{LIBFABRIC}/lib", "FI_LOG_LEVEL": "info",
            "FI_LOG_SUBSYS": "mr", **MONITORS[monitor]}


def unmap_mem(monitor):
    """Server on node 1, client on node 0: both outputs and exit statuses."""
    env = fabtest_env(monitor)
    args = [f"{LIBFABRIC}/bin/fi_unmap_mem", "-p", OFI["FI_PROVIDER"], "-E",
            "-S", str(SIZE), "-I", str(ITERATIONS)]
    remote = " ".join(["timeout", "240", "env"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
                      + [shlex.quote(a) for a in args])
    server = subprocess.Popen(["ssh", PEER, remote], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        # The server listens once ssh has started it: retry a refused client.
        for _ in range(30):
            out, rc = run(args + [PEER], env=env, timeout=240)
            if rc == 0 or "Connection refused" not in out:
                break
            time.sleep(1)
        server_out, _ = server.communicate(timeout=240)
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
