# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""The short run of the model-based stress (libprovider/tests/stress_model.cpp):
a seeded random sequence of memwatch, mapping, fork, registration and RDMA
operations, each checked against a model of what the buffers hold. The long
run is `make stress`. A failure prints the seed and step that replay it."""
import os
import re
import subprocess

BINARY = "/out/guest/bin/odpwatch-stress"
SECONDS = os.environ.get("ODPWATCH_STRESS_SECONDS", "30")


def test_stress():
    r = subprocess.run([BINARY, "--seconds", SECONDS], capture_output=True, text=True,
                       timeout=float(SECONDS) + 600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^ok 1 stress # seed \d+, (\d+) steps", r.stdout, re.M)
    assert m and int(m.group(1)) > 0, r.stdout


def test_same_seed_same_run():
    """A seed replays: two runs of the same seed and step count do the same
    operations (the counts line says which)."""
    runs = [subprocess.run([BINARY, "--seed", "42", "--steps", "200"], capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
    counts = [re.search(r"^# \d+ operations:.*$", r.stdout, re.M).group(0) for r in runs]
    assert counts[0] == counts[1]
