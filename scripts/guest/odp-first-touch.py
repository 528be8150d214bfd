# Diagnostic, run in the guest: python3 /odpwatch/scripts/guest/odp-first-touch.py [MiB]
# First-touch RDMA WRITE into never-touched ODP memory through a loopback RC QP
# (timeout 14 ~ 67 ms, retry_cnt 7, rnr_retry 7): time, status, and the rxe
# counters that show retransmissions.
import ctypes, sys, time
sys.path.insert(0, "/odpwatch/pyverbs-tests")
import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.mr import MR
from conftest import LoopbackQP, mmap_anon

C = "/sys/class/infiniband/rxe0/ports/1/hw_counters/"
NAMES = ["sent_pkts", "duplicate_request", "out_of_seq_request", "rcvd_seq_err",
         "completer_retry_err", "retry_exceeded_err", "rcvd_rnr_err", "send_rnr_err"]
def counters():
    time.sleep(0.02)
    return {n: int(open(C + n).read()) for n in NAMES}

size = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 16 << 20
with Context(name="rxe0") as ctx, PD(ctx) as pd:
    qp = LoopbackQP(ctx, pd)
    src_buf, dst_buf = mmap_anon(size), mmap_anon(size)
    ctypes.memset(src_buf, 0x6B, size)
    src = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=src_buf)
    dst = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
             e.IBV_ACCESS_ON_DEMAND, address=dst_buf)
    c0, t0 = counters(), time.monotonic()
    try:
        st = qp.rdma(e.IBV_WR_RDMA_WRITE, src, src_buf, size, dst, dst_buf, timeout=900)
    except TimeoutError:
        st = "no completion in 900 s"
    dt = time.monotonic() - t0
    c1 = counters()
    ok = ctypes.string_at(dst_buf + size - 16, 16) == b"\x6b" * 16
    print(f"{size >> 20} MiB first-touch write: status {st}, {dt:.1f} s, data {'ok' if ok else 'WRONG'}")
    print("  " + " ".join(f"{n}=+{c1[n] - c0[n]}" for n in NAMES))
