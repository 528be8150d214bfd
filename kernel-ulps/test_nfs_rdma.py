# SPDX-License-Identifier: GPL-2.0
"""NFS over RDMA across the wire: nfsd with its RDMA listener on node 1
(nfs-utils, started by hand: the guest has no init system), the kernel's
client on node 0 mounting with proto=rdma; data verified by fio and by
checksums of a large file on both nodes; the same mounted over TCP for the
comparison."""
import pytest

from conftest import record, throughput, verify

MNT = "/tmp/mnt-nfs"
# node 1's /tmp/export, the root of its NFSv4 exports
EXPORT = "198.51.100.11:/"


def mounted(client):
    out, _ = client.run(f"grep ' {MNT} ' /proc/mounts", check=False)
    return out.strip()


def mount(client, proto):
    port = 20049 if proto == "rdma" else 2049
    client.run(f"mkdir -p {MNT}")
    # The server's 10 s grace period may still run: a mount retries.
    # softerr: a transport that stops answering fails the I/O (ETIMEDOUT
    # after about 150 s) instead of hanging it, and the run, for good.
    client.run(f"mount -t nfs -o vers=4.2,proto={proto},port={port},softerr,timeo=150,retrans=3 "
               f"{EXPORT} {MNT}", timeout=180)


def umount(client):
    """Unmount; a failed unmount is forced, so the guest's final sync
    cannot block on a server that is gone."""
    if mounted(client) and client.run(f"umount {MNT}", check=False, timeout=120)[1] != 0:
        client.run(f"umount -f -l {MNT}", check=False, timeout=60)
        pytest.fail(f"{client}: umount {MNT} failed (forced)")


@pytest.fixture(scope="module")
def server(nodes):
    srv = nodes[1]
    out, _ = srv.run("/odpwatch/kernel-ulps/nfs-server.sh start", timeout=120)
    assert "rdma 20049" in out, f"{srv}: nfsd has no RDMA listener:\n{out}"
    yield srv
    umount(nodes[0])
    srv.run("/odpwatch/kernel-ulps/nfs-server.sh stop", check=False)


@pytest.fixture(scope="module")
def rdma_mount(server, nodes):
    client = nodes[0]
    mount(client, "rdma")
    yield client
    umount(client)


def test_mounted_over_rdma(rdma_mount):
    line = mounted(rdma_mount)
    assert "proto=rdma" in line and "port=20049" in line and "vers=4.2" in line, line


@pytest.mark.parametrize("io", ["direct", "buffered"])
def test_random_writes_read_back_verified(rdma_mount, io):
    """fio's crc32c verification of random writes of 4 to 256 KiB: with
    O_DIRECT each write is an RPC of its own; buffered, the page cache's
    writeback sends large writes that the server pulls with RDMA READ."""
    extra = ["--direct=0", "--fsync_on_close=1"] if io == "buffered" else []
    n = verify(rdma_mount, f"{MNT}/fio-{io}", "8M", 16, bs="4k-256k", name=f"nfs-{io}", extra=extra)
    record("nfs-rdma", io, "random writes qd16", "bytes verified", n)


def test_large_copy_matches_on_both_nodes(rdma_mount, server):
    """32 MiB of random bytes copied onto the mount and read back after a
    remount (so from the server, not the client's cache): the checksums on
    the client, through the mount, and on the server's own disk agree."""
    client = rdma_mount
    client.run("head -c 32M /dev/urandom >/tmp/big")
    client.run(f"cp /tmp/big {MNT}/big && sync", timeout=300)
    client.run(f"umount {MNT}", timeout=120)
    mount(client, "rdma")
    sums = {
        "client's copy": client.run("sha256sum </tmp/big")[0].split()[0],
        "through the mount": client.run(f"sha256sum <{MNT}/big", timeout=300)[0].split()[0],
        "on the server": server.run("sha256sum </tmp/export/big", timeout=300)[0].split()[0],
    }
    assert len(set(sums.values())) == 1, sums
    client.run(f"rm -f /tmp/big {MNT}/big")


@pytest.mark.parametrize("proto", ["rdma", "tcp"])
def test_throughput_beside_tcp(server, nodes, proto):
    """Sequential O_DIRECT writes and reads of 128 KiB at queue depth 16 of
    a 16 MiB file over each transport on the same wire: recorded in the
    suite's table; each must move all its bytes."""
    client = nodes[0]
    was = mounted(client)
    if was:
        client.run(f"umount {MNT}", timeout=120)
    try:
        mount(client, proto)
        assert f"proto={proto}" in mounted(client)
        for rw in ("write", "read"):
            record("nfs", proto, f"sequential {rw} 128k qd16", "MiB/s",
                   f"{throughput(client, f'{MNT}/bw', rw):.1f}")
        client.run(f"rm -f {MNT}/bw")
    finally:
        umount(client)
