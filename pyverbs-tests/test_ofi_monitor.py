# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""libfabric's own MR cache (verbs provider on rxe) under each memory monitor
it can run: memhooks, userfaultfd, disabled, memwatch imported through
libfabric's public API into Debian's libfabric (libodpwatch-ofi, by a call or
by LD_PRELOAD of libodpwatch-ofi-preload.so), and memwatch built into
libfabric (FI_MR_CACHE_MONITOR=memwatch: Debian's libfabric 2.1.0 source with
the series of other-projects/libfabric/, in /out/guest/libfabric).
ofi-mr-cache-test (libprovider/tests/ofi_mr_cache_test.cpp) registers a buffer
with fi_mr_reg, replaces its pages, registers again: the first registration's
key back means the cache handed out the old pages' registration (stale).
libfabric's own fabtest of the cache, fi_mr_cache_evict, runs under each."""
import ctypes
import errno
import json
import os
import pathlib
import re
import select
import signal
import subprocess

import pytest

BINARY = "/out/guest/bin/ofi-mr-cache-test"
PRELOAD = "/out/guest/lib/libodpwatch-ofi-preload.so"
LIBFABRIC = "/out/guest/libfabric"  # ours, with the native memwatch monitor
N = 20
MONITORS = ["memhooks", "userfaultfd", "disabled", "memwatch", "memwatch-preload",
            "memwatch-native"]


def monitor_env(monitor):
    """The environment that selects @monitor (the import: see run())."""
    env = dict(os.environ, FI_PROVIDER="verbs")
    env.pop("FI_MR_CACHE_MONITOR", None)
    if monitor == "memwatch-preload":
        env["LD_PRELOAD"] = PRELOAD
    elif monitor == "memwatch-native":
        # Our libfabric in place of Debian's (same soname); its log says
        # which monitor started.
        env.update(FI_MR_CACHE_MONITOR="memwatch", LD_LIBRARY_PATH=f"{LIBFABRIC}/lib",
                   FI_LOG_LEVEL="info", FI_LOG_SUBSYS="mr")
    elif monitor == "memhooks-ours":
        env.update(FI_MR_CACHE_MONITOR="memhooks", LD_LIBRARY_PATH=f"{LIBFABRIC}/lib")
    elif monitor != "memwatch":
        env["FI_MR_CACHE_MONITOR"] = monitor
    return env


def check_native_started(monitor, stderr):
    if monitor == "memwatch-native":
        assert "memwatch memory monitor started" in stderr, stderr[-3000:]


def run_group(args, env, timeout=300):
    """subprocess.run, but a timeout kills the children too: a hung child of
    fork() would keep the pipes open and the wait for them would never end."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(f"{args} still running after {timeout} s\n{out}{err[-3000:]}")
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def run(case, monitor, iterations=N):
    args = [BINARY, "--iterations", str(iterations)]
    if monitor == "memwatch":
        args.append("--import")
    r = run_group(args + [case], monitor_env(monitor))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    check_native_started(monitor, r.stderr)
    return r.stdout


def result(out):
    m = re.search(r"^result (\S+) (\S+) stale=(\d+) hits=(\d+) iterations=(\d+)$", out, re.M)
    assert m, out
    return {"monitor": m[2], "stale": int(m[3]), "hits": int(m[4])}


def memwatch_stats(out):
    m = re.search(r"memwatch monitor: (\d+) subscribes, (\d+) hits, (\d+) stale", out)
    return {"subscribes": int(m[1]), "hits": int(m[2]), "stale": int(m[3])}


@pytest.mark.parametrize("monitor", MONITORS)
def test_the_same_buffer_again_is_a_hit(monitor):
    """The cache is on: a buffer registered twice, unchanged, gets the same
    registration back (memwatch: its valid() said so, counted)."""
    out = run("reuse", monitor)
    r = result(out)
    assert r["hits"] == (0 if monitor == "disabled" else N), out
    if monitor.startswith("memwatch"):
        assert r["monitor"] == "memwatch", out
        if monitor == "memwatch":
            assert memwatch_stats(out)["hits"] >= N, out


@pytest.mark.parametrize("monitor", [m for m in MONITORS if m.startswith("memwatch")])
def test_a_late_record_does_not_flush_the_new_region(monitor):
    """The record of an unmapped region, read after that region was
    uncached and a new one registered at its address (the event thread made
    late: one CPU, SCHED_FIFO, see ofi_mr_cache_test.cpp), must not flush the
    newcomer, which nobody changed: every second registration is a hit. At
    5fb8815 every memwatch monitor flushed by the record's range: 1 hit of
    20 (only the first iteration, which follows no munmap)."""
    out = run("reuse-late-records", monitor)
    r = result(out)
    assert r["monitor"] == "memwatch", out
    assert r["hits"] == N, out


# Stale registrations per way of replacing the buffer, as measured: memhooks
# patches libc's munmap and madvise, so raw system calls pass it by every time.
STALE = {("syscall-munmap", "memhooks"): N}


# userfaultfd with madvise may hang: test_userfaultfd_monitor_and_madvise.
CELLS = [(c, m) for c in ("munmap", "syscall-munmap", "madvise") for m in MONITORS
         if (c, m) != ("madvise", "userfaultfd")]


@pytest.mark.parametrize("case,monitor", CELLS)
def test_replaced_buffer(case, monitor):
    out = run(case, monitor)
    r = result(out)
    assert r["stale"] == STALE.get((case, monitor), 0), out
    if monitor.startswith("memwatch"):
        assert r["monitor"] == "memwatch", out


def test_userfaultfd_monitor_and_madvise():
    """libfabric's userfaultfd monitor registers each cached buffer with
    UFFDIO_REGISTER_MODE_MISSING. MADV_DONTNEED on it and a write: the REMOVE
    event's handler unregisters the range while the write's page fault is
    already queued; the handler's UFFDIO_ZEROPAGE then fails ('Unable to handle
    event UFFD_EVENT_PAGEFAULT') and the writing thread sleeps in
    handle_userfault() for ever. Seen in 2 of 2 runs of 20 iterations (none in
    one of 2). Documented either way: it completes with 0 stale, or the main
    thread is stuck in handle_userfault."""
    env = dict(os.environ, FI_PROVIDER="verbs", FI_MR_CACHE_MONITOR="userfaultfd")
    p = subprocess.Popen([BINARY, "--iterations", str(N), "madvise"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=40)
        assert p.returncode == 0 and result(out)["stale"] == 0, out + err
        print("userfaultfd + madvise: completed, 0 stale")
    except subprocess.TimeoutExpired:
        wchan = pathlib.Path(f"/proc/{p.pid}/wchan").read_text()
        p.kill()
        out, err = p.communicate()
        assert wchan == "handle_userfault", (wchan, err)
        print("userfaultfd + madvise: hung in handle_userfault, killed after 40 s")


def test_fork_child_caches_nothing_parent_keeps_caching():
    """A child of fork() cannot use the parent's memwatch descriptor: its
    subscribes are refused and libfabric registers uncached (no hit), without
    a hang (fork waits until the event thread is out of libfabric's locks);
    the parent's cache still hits after the child is gone."""
    out = run("fork", "memwatch")
    child = re.search(r"^result fork child hits=(\d+) refused=(\d+)$", out, re.M)
    parent = re.search(r"^result fork parent hits=(\d+) child-exit=(\d+)$", out, re.M)
    after = re.search(r"^result fork parent-after hits=(\d+)$", out, re.M)
    assert child and parent and after, out
    assert (int(child[1]), int(child[2]) > 0) == (0, True), out
    assert (int(parent[1]), int(parent[2]), int(after[1])) == (1, 0, 1), out


@pytest.mark.parametrize("monitor", ["memwatch", "memwatch-native"])
def test_a_fork_child_closing_the_inherited_domain(monitor):
    """A child of fork() that closes the domain it inherited stops the
    monitor in the child: it must exit, not wait for the parent's event
    thread; and the parent's event thread must live on: an munmap of a region
    cached after the child is gone is read (counted by the imported monitor;
    the built-in one has no counters we can read). At 5fb8815 the imported
    monitor's stop() in the child woke the parent's thread through the
    eventfd they share, and that ended it: child-exit=0, parent-events=0
    (the built-in monitor passed)."""
    out = run("fork-close", monitor)
    m = re.search(r"^result fork-close child-exit=(\d+) parent-events=(\d+)$", out, re.M)
    assert m, out
    assert int(m[1]) == 0, out
    if monitor == "memwatch":
        assert int(m[2]) > 0, out


def test_native_monitor_fork_child_caches_nothing_parent_keeps_caching():
    """The same for memwatch built into libfabric: the child's subscribes
    fail (EPERM, the descriptor is the parent's), its registrations go
    uncached; the parent's cache hits before and after."""
    out = run("fork", "memwatch-native")
    child = re.search(r"^result fork child hits=(\d+) refused=\d+$", out, re.M)
    parent = re.search(r"^result fork parent hits=(\d+) child-exit=(\d+)$", out, re.M)
    after = re.search(r"^result fork parent-after hits=(\d+)$", out, re.M)
    assert child and parent and after, out
    assert (int(child[1]), int(parent[1]), int(parent[2]), int(after[1])) == (0, 1, 0, 1), out


def mr_keys_of(pid):
    """The keys of the MRs process @pid holds, as the kernel lists them
    (iproute2 prints them as strings of bare hex)."""
    out = subprocess.run(["rdma", "-j", "resource", "show", "mr"], capture_output=True,
                         text=True, check=True).stdout
    keys = set()
    for mr in json.loads(out or "[]"):
        if mr.get("pid") == pid:
            keys |= {int(v, 16) if isinstance(v, str) else int(v)
                     for k, v in mr.items() if k in ("lkey", "rkey")}
    return keys


def fork_inherited(monitor):
    """ofi-mr-cache-test fork-inherited under @monitor: (the child's exit
    status, whether the parent's MR outlived the child, the log). The
    parent's MR is checked to be listed before the fork, so that "gone
    after" means the child destroyed it."""
    lines = []

    def result_line(p, timeout=60):
        ready = select.select([p.stdout], [], [], timeout)[0]
        line = p.stdout.readline() if ready else ""
        lines.append(line)
        m = re.match(r"result fork-inherited (\S+)=(\S+)$", line.strip())
        assert m, f"no result line within {timeout} s: {lines}"
        return m[2]

    p = subprocess.Popen([BINARY, "fork-inherited"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=monitor_env(monitor), start_new_session=True)
    try:
        key = int(result_line(p), 16)
        assert key in mr_keys_of(p.pid), f"the parent's MR {key:#x} is not listed before the fork"
        p.stdin.write("fork\n")
        p.stdin.flush()
        child_exit = int(result_line(p))
        keys = mr_keys_of(p.pid)
        out, err = p.communicate("done\n", timeout=60)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        print("".join(lines) + out + err[-3000:])
        raise
    log = f"{''.join(lines)}{out}{err[-3000:]}the parent's MRs: {sorted(map(hex, keys))}"
    assert p.returncode == 0, log
    check_native_started(monitor, err)
    return child_exit, key in keys, log


@pytest.mark.parametrize("monitor", ["memwatch-native", "memhooks-ours"])
def test_a_fork_child_leaves_the_parents_cached_mr(monitor):
    """A child of fork() registers, on the domain it inherited, an address
    the parent has cached (audit L7). It must get a registration of its own,
    not the parent's MR (exit 3), and must not deregister the parent's MR
    through the device file the two share: after the child is gone the
    parent's key is still among its MRs. Our libfabric (patches 0005 and
    0006 of other-projects/libfabric/) with a monitor that finds the
    inherited entry invalid (memwatch) and one that finds it valid
    (memhooks)."""
    child_exit, kept, log = fork_inherited(monitor)
    assert child_exit == 0, f"3: the child was handed the parent's MR\n{log}"
    assert kept, f"the child destroyed the parent's MR\n{log}"


@pytest.mark.parametrize("monitor", ["memwatch-preload", "memhooks"])
def test_without_the_fix_a_fork_child_takes_or_destroys_the_parents_mr(monitor):
    """The same with Debian's libfabric, which lacks 0005 and 0006: the
    defect the test above guards against, shown on every run. memhooks
    still finds the inherited entry valid and hands the child the parent's
    MR; memwatch finds it invalid, and its flush deregisters the parent's
    MR. Should Debian's libfabric ever change this, this test says so."""
    child_exit, kept, log = fork_inherited(monitor)
    if monitor == "memhooks":
        assert child_exit == 3, log
    else:
        assert child_exit == 0 and not kept, log


# fabtests' fi_mr_cache_evict: a buffer freed (munmap, brk, sbrk) and
# allocated again at its address must be registered anew. It decides from
# registration times: a hit must take under 20% of a new registration, else
# it says the cache is off and skips the case; a registration of the new
# pages that fast is a stale hit, FAIL. With its default 16 KiB buffers
# that verdict was noise under QEMU (the disabled cache passed the mmap
# case, memwatch skipped all three). 16 MiB buffers were not enough either on
# a loaded host: the .ci/run of c66c9fb skipped the mmap case 3 times out of
# 3 under memwatch-preload, and 25 runs in a guest beside two busy host
# loops skipped it twice, each time with the hit confirmed (stale=0): a
# descheduled vCPU made the hit slow, not a stale watch. 64 MiB buffers
# (16384 pages to pin) passed 25 runs of 25 under the same load. A skip is
# no verdict: a case that skipped runs again (3 runs at most), a FAIL fails
# at once; the log has the monitor's counters of each run. Not
# run with the cache off: the first registration also faults the fresh
# pages in, the second does not, and the off cache "passed" two cases.
EVICT_TESTS = ["mr_cache_mmap_test", "mr_cache_brk_test", "mr_cache_sbrk_test"]
EVICT_MONITORS = ["memhooks", "userfaultfd", "memwatch-preload", "memwatch-native"]


@pytest.mark.parametrize("monitor", EVICT_MONITORS)
def test_fabtests_mr_cache_evict(monitor):
    # Lazy symbol binding on the first hit is no part of a hit's cost.
    env = dict(monitor_env(monitor), LD_LIBRARY_PATH=f"{LIBFABRIC}/lib", LD_BIND_NOW="1",
               ODPWATCH_OFI_DEBUG="1")
    passed, log = set(), ""
    for attempt in range(3):
        r = run_group([f"{LIBFABRIC}/bin/fi_mr_cache_evict", "-p", "verbs", "-s",
                       str(64 << 20)], env)
        stats = "".join(re.findall(r"^odpwatch-ofi: stats .*\n", r.stderr, re.M))
        log += f"run {attempt + 1}:\n{r.stdout}{stats}"
        check_native_started(monitor, r.stderr)
        assert r.returncode == 0, log + r.stderr[-3000:]
        got = dict(re.findall(r"^Running (\w+) \[.*?\]\.\.\.(PASS|FAIL|skipped|requires)",
                              r.stdout, re.M))
        assert not [t for t in EVICT_TESTS if got.get(t) == "FAIL"], log + r.stderr[-3000:]
        passed |= {t for t in EVICT_TESTS if got.get(t) == "PASS"}
        if passed == set(EVICT_TESTS):
            break
    print(log)
    assert passed == set(EVICT_TESTS), log


def test_import_twice_and_close():
    """A second import says EALREADY; close gives the import back once, then
    EINVAL (nothing imported)."""
    lib = ctypes.CDLL("/out/guest/lib/libodpwatch-ofi.so.0")
    rc = lib.odpwatch_ofi_monitor_import()
    assert rc in (0, -errno.EALREADY)
    assert lib.odpwatch_ofi_monitor_import() == -errno.EALREADY
    assert lib.odpwatch_ofi_monitor_close() == 0
    assert lib.odpwatch_ofi_monitor_close() == -errno.EINVAL
