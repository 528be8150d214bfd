# odpwatch: build a patched kernel, boot it under QEMU, demonstrate and test.
# Everything runs from a fresh Debian 12 machine as root; see README.md.

DEBUG ?= 0
VARIANT := $(if $(filter 1 yes y,$(DEBUG)),debug,std)

.PHONY: help demo check check-std check-debug bench stress vm cluster kernel rootfs guest series check-series lint clean

help:
	@echo "make demo            build, boot the odpwatch kernel, run the narrated demonstration"
	@echo "make check           build, boot and run every test suite on both kernels"
	@echo "                     (out/check/results.json, out/check-debug/results.json)"
	@echo "make check-std       the suites on the production kernel alone"
	@echo "make check-debug     the debug kernel's suites alone (KASAN, lockdep, kmemleak)"
	@echo "make bench           run every benchmark, write out/bench/report.md with plots (QUICK=1: minutes)"
	@echo "make stress          the long model-based stress run (SECONDS=600, SEED=n; debug kernel)"
	@echo "make vm CMD='...'    run a command in the booted guest (repo at /odpwatch)"
	@echo "make cluster CMD_A='...' CMD_B='...'"
	@echo "                     two guests on a private wire, CMD_A on node 0, CMD_B on node 1"
	@echo "                     (ODPWATCH_NODE, ODPWATCH_SELF, ODPWATCH_PEER say who is where)"
	@echo "make series          export the kernel change as a patch series (out/series)"
	@echo "make check-series    apply each exported series to a fresh base, build it, and run"
	@echo "                     the rdma fixes' tests on the vanilla base and with the fixes"
	@echo "make lint            checkpatch --strict and clang-format on our code"
	@echo "Variables: DEBUG=1 (debug kernel), BASE=<tree or tarball>, TIMEOUT=<s>"

demo:
	scripts/run.sh demo $(VARIANT)

check:
	scripts/check.sh

check-std:
	scripts/run.sh check std

check-debug:
	scripts/run.sh check debug

# The long run of the model-based stress (SECONDS, default 600; SEED to
# replay one), on the debug kernel: it is there to find bugs.
stress: export ODPWATCH_CMD = /out/guest/bin/odpwatch-stress --seconds $(or $(SECONDS),600) $(if $(SEED),--seed $(SEED))
stress:
	TIMEOUT=$$(( $(or $(SECONDS),600) + 1200 )) scripts/run.sh vm debug

# QUICK=1: the everyday run (a few minutes); REPS=N overrides repetitions.
bench: export QUICK := $(QUICK)
bench: export REPS := $(REPS)
bench:
	scripts/run.sh bench $(VARIANT)

# $(value CMD): the command exactly as typed, $ and all, not expanded by make
# (make exports a command-line CMD only expanded, hence the other name).
vm: export ODPWATCH_CMD = $(value CMD)
vm:
	scripts/run.sh vm $(VARIANT)

cluster: export ODPWATCH_CMD_A = $(value CMD_A)
cluster: export ODPWATCH_CMD_B = $(value CMD_B)
cluster:
	scripts/run.sh cluster $(VARIANT)

series:
	scripts/export-series.sh

check-series:
	scripts/run.sh check-series

lint:
	scripts/lint.sh

clean:
	rm -rf out
