# SPDX-License-Identifier: GPL-2.0
"""The registration-cache problem in Debian's own MPI stack, and its end.

Rank 0 of stale_send (middleware/mpi/stale_send.cpp) sends a 1 MiB buffer
from one fixed address, frees it one way or another and maps the next one
there; rank 1 counts the messages that did not carry their own data. UCX
keeps registrations in a cache that learns of frees through hooks on the C
library (its ucm module): a free the hooks cannot see leaves a registration
of the old pages in the cache, and the next message sends them."""
import pytest

import conftest
from conftest import MEMWATCH_OFI, ODP, ODP_OFI, OFI, UCX, ofi_monitor_stats, run, stale_send

MiB = 1 << 20
WAYS = ("munmap", "syscall", "madvise", "mremap")


def test_ucx_sees_rxe_with_on_demand_registration():
    out, rc = run(["ucx_info", "-d"])
    assert rc == 0, out
    rxe = out.split("# Memory domain: rxe0", 1)
    assert len(rxe) == 2, "UCX sees no rxe0 memory domain"
    md = rxe[1].split("# Memory domain:", 1)[0]
    assert "reg_nonblock" in md, md
    for tl in ("rc_verbs", "ud_verbs"):
        assert f"Transport: {tl}" in md and "Device: rxe0:1" in md, md


@pytest.mark.parametrize("way", WAYS)
def test_openmpi_ucx_pinned(way):
    """Pinned registrations: the hooks catch every free through the C
    library; the raw system calls (as Go's runtime makes them) go unseen,
    and nearly every message after the first carries the first buffer."""
    corrupt = stale_send("openmpi", way, MiB, 100, UCX)
    if way == "syscall":
        assert corrupt >= 90, f"{corrupt} of 100 corrupt: the stale registration did not show"
    else:
        assert corrupt == 0


@pytest.mark.parametrize("way", WAYS)
def test_openmpi_ucx_on_demand(way, odp_sampler):
    """On-demand registrations follow the address space: 0 corrupt in
    every way of freeing, with the sender's buffer registered on demand."""
    with odp_sampler:
        corrupt = stale_send("openmpi", way, MiB, 200, {**UCX, **ODP})
    assert corrupt == 0
    assert odp_sampler.most >= 1, f"no MR on demand in {odp_sampler.samples} samples"


def test_openmpi_ucx_eager_messages_are_copied():
    """Below the rendezvous threshold UCX copies into its own buffers: no
    registration of the user's, nothing stale."""
    assert stale_send("openmpi", "syscall", 4096, 100, UCX) == 0


def test_openmpi_tcp_has_no_registrations():
    """The same program over TCP (pml ob1, btl tcp): the control."""
    assert stale_send("openmpi", "syscall", MiB, 50, {}, pml="ob1") == 0


def test_mpich_ucx_pinned_raw_free_is_stale():
    assert stale_send("mpich", "syscall", MiB, 100, UCX) >= 90


def test_mpich_ucx_on_demand(odp_sampler):
    with odp_sampler:
        assert stale_send("mpich", "syscall", MiB, 200, {**UCX, **ODP}) == 0
    assert odp_sampler.most >= 1


def test_openmpi_ofi_pinned_raw_free_is_stale():
    """Open MPI over libfabric (verbs;ofi_rxm), libfabric's MR cache with the
    monitor Open MPI imports (its patcher): the raw system calls go unseen
    there too."""
    corrupt = stale_send("openmpi", "syscall", MiB, 100, OFI, pml="cm")
    assert corrupt >= 90, f"{corrupt} of 100 corrupt: the stale registration did not show"


@pytest.mark.parametrize("way", WAYS)
def test_openmpi_ofi_memwatch_monitor(way):
    """The same with memwatch as libfabric's monitor (LD_PRELOAD of
    libodpwatch-ofi-preload.so, imported before Open MPI's patcher): 0
    corrupt in every way of freeing, and the cache still caches: the ranks'
    monitors confirmed hits."""
    assert stale_send("openmpi", way, MiB, 200, {**OFI, **MEMWATCH_OFI}, pml="cm") == 0
    stats = ofi_monitor_stats(conftest.last_output)
    assert stats["ranks"] == 2 and stats["subscribes"] >= 1, conftest.last_output[-2000:]
    assert stats["hits"] >= 100, stats


@pytest.mark.parametrize("way", WAYS)
def test_openmpi_ofi_on_demand(way, odp_sampler):
    """libfabric's verbs provider registering on demand (FI_VERBS_USE_ODP=1):
    0 corrupt in every way of freeing, with the sender's MRs on demand."""
    with odp_sampler:
        assert stale_send("openmpi", way, MiB, 200, {**OFI, **ODP_OFI}, pml="cm") == 0
    assert odp_sampler.most >= 1, f"no MR on demand in {odp_sampler.samples} samples"
