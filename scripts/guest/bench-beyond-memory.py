#!/usr/bin/env python3
"""Demand paging beyond memory, as a rate (make bench; issue 24 item 2):
`odpwatch-limits beyond-memory 64` (an ODP MR over 64 MiB, every 1 MiB
chunk RDMA-written, then read back and compared) in a memory cgroup that
may keep all of it, half or a quarter resident, a zram swap device behind
it. One line per run on stdout; the host's report turns them into a table
and a plot.

    bench-beyond-memory.py REPS
"""
import re
import sys

sys.path.insert(0, "/odpwatch/pyverbs-tests")
from conftest import memory_cgroup  # noqa: E402
from test_limits import PROBE, run_in, zram_swap  # noqa: E402

MIB = 64
RESULT = re.compile(r"odp: \d+ MiB written in (\d+) ms, read back in (\d+) ms; pages swapped out "
                    r"(\d+) during the writes, (\d+) in all; swapped in (\d+); (\d+) chunks wrong")


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rc = 0
    with zram_swap(4 * MIB << 20):
        for rep in range(reps):
            for fraction in (1, 2, 4):
                limit = None if fraction == 1 else (MIB << 20) // fraction
                with memory_cgroup("odpwatch-bench-beyond", limit) as cg:
                    p = run_in(cg, "beyond-memory", str(MIB))
                m = RESULT.search(p.stdout)
                if p.returncode or not m:
                    print(f"resident 1/{fraction} rep {rep}: failed (exit {p.returncode}): "
                          f"{(p.stdout + p.stderr).strip()[-300:]}", flush=True)
                    rc = 1
                    continue
                w, r, out_w, out_all, swin, wrong = map(int, m.groups())
                print(f"resident 1/{fraction} rep {rep}: {MIB} MiB written in {w} ms, read in "
                      f"{r} ms; swapped out {out_all} pages, in {swin}; {wrong} chunks wrong",
                      flush=True)
                rc |= wrong != 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
