#!/usr/bin/env python3
"""Turn one `make bench` run into out/bench/report.md with PNG plots.

    bench-report.py DIR

DIR holds what scripts/guest/run-bench.sh left: NAME.csv (the rows of
`odpwatch bench NAME --csv`), NAME.log, kernel and args. Every figure is a
ratio against a baseline row measured in the same run; every table row says
its repetitions and spread. The CSVs are kept beside the report.
"""
import csv
import datetime
import math
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BENCHES = OrderedDict(
    [
        ("memwatch", "memwatch against a userfaultfd monitor and an interposed munmap hook"),
        ("odp", "On-Demand Paging against pinned memory (rxe), and perftest"),
        ("cache", "The registration cache, beside UCX's ucs_rcache and libfabric's MR cache"),
        ("ucx", "Single copy within a node: UCX's shared memory, cma and rc_verbs over rxe"),
        ("wire", "perftest between two kernels on a wire (two guests, rxe on each)"),
        ("ucx-wire", "UCX between two kernels on a wire: put, get and tag latency, pinned against ODP"),
        ("mpi", "MPI between two kernels on a wire: NetPIPE's NPmpi over Open MPI and UCX, pinned "
                "against ODP"),
    ]
)
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("min_ns", "median_ns", "max_ns", "ratio"):
            r[k] = float(r[k])
        r["reps"] = int(r["reps"])
    return rows


def amount(param):
    """The size of the work as a number ("64 MiB", "1000 watches"), or None."""
    m = re.match(r"^(\d+)\s*(KiB|MiB|GiB)?\b", param)
    if not m:
        return None
    return int(m.group(1)) * UNITS.get(m.group(2), 1)


def groups_of(rows):
    g = OrderedDict()
    for r in rows:
        g.setdefault(r["group"], []).append(r)
    return g


def baseline_of(rows, r):
    for b in rows:
        if b["group"] == r["group"] and f'{b["variant"]}/{b["param"]}' == r["baseline"]:
            return b
    return None


def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:60]


def fmt_ns(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def table(rows, allrows):
    out = [
        "| variant | work | median | min | max | reps | ratio (min–max) | against | note |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        b = baseline_of(allrows, r)
        if r["reps"] == 0:
            q = "—"
        elif b and b["median_ns"] > 0:
            q = (
                f'**{r["median_ns"] / b["median_ns"]:.3g}×** '
                f'({r["min_ns"] / b["median_ns"]:.3g}–{r["max_ns"] / b["median_ns"]:.3g})'
            )
        else:
            q = ""
        med = fmt_ns(r["median_ns"]) if r["reps"] else "—"
        lo = fmt_ns(r["min_ns"]) if r["reps"] else "—"
        hi = fmt_ns(r["max_ns"]) if r["reps"] else "—"
        out.append(
            f'| {r["variant"]} | {r["param"]} | {med} | {lo} | {hi} | {r["reps"]} | {q} '
            f'| {r["baseline"]} | {r["note"]} |'
        )
    return "\n".join(out)


def plot_group(name, rows, allrows, plots, tag):
    """A ratio plot: lines over the work size when the group varies it,
    bars otherwise. Returns the PNG's path relative to the report."""
    # A baseline that took no time (a count of 0 events, say) has no ratios.
    measured = [r for r in rows
                if r["reps"] and baseline_of(allrows, r) and baseline_of(allrows, r)["median_ns"] > 0]
    if not measured:
        return None
    params = OrderedDict((r["param"], amount(r["param"])) for r in measured)
    numeric = len(params) > 1 and all(v is not None for v in params.values())
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.32 * max(4, len(measured)) if not numeric else 4))
    if numeric:
        for v in OrderedDict((r["variant"], 1) for r in measured):
            pts = sorted(
                (amount(r["param"]), r, baseline_of(allrows, r)["median_ns"])
                for r in measured
                if r["variant"] == v
            )
            xs = [max(p[0], 1) for p in pts]
            ax.plot(xs, [p[1]["median_ns"] / p[2] for p in pts], marker="o", label=v)
            ax.fill_between(
                xs,
                [p[1]["min_ns"] / p[2] for p in pts],
                [p[1]["max_ns"] / p[2] for p in pts],
                alpha=0.15,
            )
        ax.set_xscale("log")
        ys = [r["median_ns"] / baseline_of(allrows, r)["median_ns"] for r in measured]
        if max(ys) / max(min(ys), 1e-9) > 10:
            ax.set_yscale("log")
        ax.set_xlabel("work (" + ", ".join(params) + ")")
        ax.legend(fontsize=7)
    else:
        labels, med, err_lo, err_hi = [], [], [], []
        for r in measured:
            bm = baseline_of(allrows, r)["median_ns"]
            labels.append(r["variant"] + ("" if len(params) == 1 else f' ({r["param"]})'))
            med.append(r["median_ns"] / bm)
            err_lo.append(max(0.0, (r["median_ns"] - r["min_ns"]) / bm))
            err_hi.append(max(0.0, (r["max_ns"] - r["median_ns"]) / bm))
        y = list(range(len(labels)))
        ax.barh(y, med, xerr=[err_lo, err_hi], color="#4c72b0", ecolor="#333", capsize=2)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        if max(med) / max(min(med), 1e-9) > 50:
            ax.set_xscale("log")
        for i, m in enumerate(med):
            ax.annotate(f"{m:.3g}×", (m + err_hi[i], i), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7)
    ax.axvline(1, color="#999", lw=0.8) if not numeric else ax.axhline(1, color="#999", lw=0.8)
    (ax.set_ylabel if numeric else ax.set_xlabel)("× the baseline's median (range: min–max)")
    ax.set_title(name, fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    path = plots / f"{tag}-{slug(name)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bandwidth_plot(name, rows, plots, tag):
    """For a group of bandwidth rows (ns per MB) over three or more sizes:
    the curve itself, MB/s against the message size, one line per variant
    (the medians; the band is min to max). Returns the PNG's path or None."""
    if "ns per MB" not in name:
        return None
    pts = [(amount(r["param"]), r) for r in rows if r["reps"] and r["median_ns"] > 0]
    if len({x for x, _ in pts}) < 3 or any(x is None for x, _ in pts):
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for v in OrderedDict((r["variant"], 1) for _, r in pts):
        line = sorted((x, r) for x, r in pts if r["variant"] == v)
        xs = [x for x, _ in line]
        ax.plot(xs, [1e9 / r["median_ns"] for _, r in line], marker="o", label=v)
        ax.fill_between(xs, [1e9 / r["max_ns"] for _, r in line],
                        [1e9 / r["min_ns"] for _, r in line], alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("MB/s (median; band: min–max)")
    ax.set_ylim(bottom=0)
    ax.set_title(name, fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = plots / f"{tag}-{slug(name)}-bandwidth.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def growth(name, rows):
    """How each variant's time per operation grows with the work: the log-log
    slope from the smallest to the largest work (1 = linear, 0 = constant)."""
    out = []
    for v in OrderedDict((r["variant"], 1) for r in rows):
        pts = sorted(
            (amount(r["param"]), r["median_ns"])
            for r in rows
            if r["variant"] == v and r["reps"] and amount(r["param"])
        )
        if len(pts) >= 2 and pts[0][1] > 0:
            (x0, y0), (x1, y1) = pts[0], pts[-1]
            slope = math.log(y1 / y0) / math.log(x1 / x0)
            out.append((v, len(pts), x0, x1, y0, y1, slope))
    return out


def stale_matrix(rows):
    """Scenario × cache: stale registrations handed out (or a hang)."""
    stale = [r for r in rows if r["group"].startswith("stale? ")]
    if not stale:
        return ""
    caches = list(OrderedDict((r["variant"], 1) for r in stale))
    scen = list(OrderedDict((r["group"], 1) for r in stale))
    cell = {(r["group"], r["variant"]): r["note"] for r in stale}
    out = ["| how the buffer was freed | " + " | ".join(caches) + " |",
           "|---|" + "---|" * len(caches)]
    for s in scen:
        cells = []
        for c in caches:
            n = cell.get((s, c))
            if n is None:
                cells.append("not run")
            elif n.startswith("HUNG"):
                cells.append("**hung**")
            else:
                m = re.match(r"(\d+) of (\d+)", n)
                k = int(m.group(1)) if m else -1
                cell_text = ("**%s stale**" if k else "%s stale") % (m.group(0) if m else n)
                # A move or reclaim the kernel declined on pinned pages.
                kept = re.search(r"(\d+) times the kernel kept", n)
                if kept:
                    cell_text += f"; {kept.group(1)} kept (pinned)"
                cells.append(cell_text)
        out.append(f"| {s[len('stale? '):]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


PIN_POLICIES = ["pin-forever", "memwatch", "explicit-odp", "implicit-odp"]
PIN_PHASE = re.compile(r"phase (\d+) (peak|freed|failed): (\d+) MiB in buffers, rss (\d+) KiB, "
                       r"pinned (\d+) KiB, registrations (\d+)")


def pin_forever(d, plots):
    """The pin-forever workload (run-bench.sh: pin-forever-POLICY.txt, the
    output of `odpwatch-limits pin-forever POLICY 160`): memory over its
    phases for each policy, a plot and a table; [] if it did not run."""
    runs = OrderedDict()
    for pol in PIN_POLICIES:
        f = d / f"pin-forever-{pol}.txt"
        if f.exists():
            text = f.read_text()
            runs[pol] = ([(int(m[1]), m[2], int(m[4]) / 1024, int(m[5]) / 1024, int(m[6]))
                          for m in PIN_PHASE.finditer(text)],
                         re.search(r"registration of \d+ KiB failed: errno \d+ \(([^)]*)\)", text))
    if not runs:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for pol, (rows, _) in runs.items():
        x = [r[0] + (0.5 if r[1] != "peak" else 0) for r in rows]
        for ax, k in zip(axes, (2, 3)):
            ax.plot(x, [r[k] for r in rows], marker=".", label=pol)
    for ax, what in zip(axes, ("resident (RSS)", "pinned (VmPin)")):
        ax.set_title(f"{what}, MiB")
        ax.set_xlabel("phase (at its peak, then after its free)")
        ax.grid(alpha=0.3)
    axes[1].axhline(160, color="grey", linestyle=":", label="RLIMIT_MEMLOCK")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "pin-forever.png", dpi=90)
    plt.close(fig)
    md = ["## Pin-forever: an irregular workload under RLIMIT_MEMLOCK", "",
          "`odpwatch-limits pin-forever POLICY 160`: 12 phases that malloc 2 to 128 MiB of buffers "
          "(64 KiB to 4 MiB each), register each, send from it (RDMA WRITE of its first 64 KiB) and "
          "free them all; RLIMIT_MEMLOCK 160 MiB, CAP_IPC_LOCK dropped. *pin-forever* is the "
          "workaround MPI libraries used: malloc never gives memory back, registrations are kept "
          "for ever. The others go through odpwatch's cache.", "",
          "![pin-forever](plots/pin-forever.png)", "",
          "| policy | phases done | peak RSS | RSS at the end | peak pinned | pinned at the end | "
          "registrations | ended |",
          "|---|---:|---:|---:|---:|---:|---:|---|"]
    for pol, (rows, failed) in runs.items():
        if not rows:
            md.append(f"| {pol} | 0 | | | | | | no output |")
            continue
        done = len({r[0] for r in rows if r[1] == "freed"})
        md.append(f"| {pol} | {done} | {max(r[2] for r in rows):.0f} MiB | {rows[-1][2]:.0f} MiB | "
                  f"{max(r[3] for r in rows):.0f} MiB | {rows[-1][3]:.0f} MiB | {rows[-1][4]} | "
                  + (f"registration failed: {failed[1]}" if failed else "all phases") + " |")
    return md + [""]


BEYOND = re.compile(r"resident 1/(\d+) rep \d+: (\d+) MiB written in (\d+) ms, read in (\d+) ms; "
                    r"swapped out (\d+) pages, in (\d+); (\d+) chunks wrong")


def beyond_memory(d, plots):
    """Demand paging beyond memory (run-bench.sh: beyond-memory.txt): the
    RDMA WRITE and READ rates of an ODP MR over 64 MiB against the fraction
    of it its memory cgroup may keep resident; [] if it did not run."""
    f = d / "beyond-memory.txt"
    if not f.exists():
        return []
    runs = OrderedDict()
    for m in BEYOND.finditer(f.read_text()):
        frac, mib, w, r, out, swin, wrong = map(int, m.groups())
        runs.setdefault(frac, []).append((mib * 1000 / w, mib * 1000 / r, out, swin, wrong))
    if not runs:
        return ["## Demand paging beyond memory", "", "Not measured: no result lines in "
                "beyond-memory.txt.", ""]

    def median(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    fr = sorted(runs)
    med = {k: [median([x[i] for x in runs[k]]) for i in range(4)] for k in fr}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, what in ((0, "RDMA WRITE"), (1, "RDMA READ")):
        ax.plot([1 / k for k in fr], [med[k][i] for k in fr], marker="o", label=what)
    ax.set_xlabel("fraction of the 64 MiB the cgroup may keep resident")
    ax.set_ylabel("MiB/s (median)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "beyond-memory.png", dpi=90)
    plt.close(fig)
    base = med[fr[0]]
    md = ["## Demand paging beyond memory: the rate as the resident fraction shrinks", "",
          "`odpwatch-limits beyond-memory 64` in a memory cgroup whose `memory.max` lets all of "
          "the ODP MR's 64 MiB, half or a quarter stay resident, a zram swap device behind it "
          "(`scripts/guest/bench-beyond-memory.py`): every 1 MiB chunk RDMA-written, then read "
          "back and compared. Medians over the runs; ratios against all resident.", "",
          "![beyond memory](plots/beyond-memory.png)", "",
          "| resident | runs | WRITE MiB/s | ratio | READ MiB/s | ratio | pages swapped out | "
          "swapped in | wrong chunks |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in fr:
        m = med[k]
        md.append(f"| 1/{k} | {len(runs[k])} | {m[0]:.1f} | {m[0] / base[0]:.2f} | {m[1]:.1f} | "
                  f"{m[1] / base[1]:.2f} | {m[2]:.0f} | {m[3]:.0f} | "
                  f"{sum(x[4] for x in runs[k])} |")
    return md + [""]


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def measured_commit(d):
    """(hash, dirty, subject) of the commit the run measured: as run.sh
    recorded it when the run began, or else HEAD now (a report made again
    from an older directory)."""
    f = d / "commit"
    if f.exists():
        h, state, subject = (f.read_text().splitlines() + ["?"] * 3)[:3]
        return h, state == "dirty", subject
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return git("rev-parse", "--short=12", "HEAD"), dirty, git("log", "-1", "--format=%s")


def main():
    d = Path(sys.argv[1])
    plots = d / "plots"
    plots.mkdir(exist_ok=True)
    for old in plots.glob("*.png"):
        old.unlink()
    commit, dirty, subject = measured_commit(d)
    dirty = " (with uncommitted changes)" if dirty else ""
    args = (d / "args").read_text().strip() if (d / "args").exists() else "?"
    kernel = (d / "kernel").read_text().strip() if (d / "kernel").exists() else "?"
    md = [
        "# odpwatch benchmark report",
        "",
        f"Measured on commit `{commit}`{dirty} ({subject}), "
        f"{datetime.date.today().isoformat()}, kernel `{kernel}` in QEMU (TCG, 2 vCPUs), "
        f"one guest boot (`wire`: two more, one vCPU each, joined by a private wire); every "
        f"benchmark ran with `{args}`.",
        "",
        "## How to read this report",
        "",
        "- Every row times one operation (or one MiB for bandwidth rows). Its **median**, "
        "**min** and **max** are over the repetitions the row names; a warm-up run is not counted.",
        "- The **ratio** divides the row's median by the median of its baseline row, measured in the "
        "same run (the *against* column). Below 1 is faster than the baseline. The range next to it "
        "is the row's own min and max over the same baseline median.",
        "- Absolute times are those of a TCG-emulated machine: compare ratios, not times.",
        "- The ODP steady-state bandwidth rows and their pinned baseline run interleaved, one of "
        "each per repetition: the machine's drift during the run cannot favour one of them.",
        "- Each figure plots the ratios of one table. Lines over a growing work size show how the "
        "figure scales (see also *Cost growth*).",
        "- The raw rows are the CSV files next to this report.",
        "",
    ]
    allrows = {}
    for b in BENCHES:
        p = d / f"{b}.csv"
        if p.exists():
            allrows[b] = load(p)
    if "cache" in allrows:
        mat = stale_matrix(allrows["cache"])
        if mat:
            md += ["## Stale registrations: the classic failure, nine ways", "",
                   "A buffer is registered through the cache, freed, and a new buffer appears at "
                   "the same address; the cache is asked again. Handing out the old registration "
                   "(the same key: rxe allocates MR indices cyclically, so a new registration always "
                   "has a new key) means the NIC would move the freed buffer's pages. ODP policies are "
                   "correct by construction and not listed.", "", mat, ""]
    growth_rows = []
    for b, title in BENCHES.items():
        md += [f"## {b}: {title}", ""]
        if b not in allrows:
            log = d / f"{b}.log"
            md += [f"Not measured: no {b}.csv." + (
                f" Last lines of its log:\n\n```\n{''.join(log.read_text().splitlines(True)[-8:])}```"
                if log.exists() else ""), ""]
            continue
        rows = allrows[b]
        mdfile = d / f"{b}.md"
        if mdfile.exists():
            remarks = [l for l in mdfile.read_text().splitlines()[1:6]
                       if l and not l.startswith("#") and not l.startswith("|")]
            md += remarks + ([""] if remarks else [])
        for name, g in groups_of(rows).items():
            md += [f"### {name}", ""]
            png = plot_group(name, g, rows, plots, b)
            if png:
                md += [f"![{name}](plots/{png.name})", ""]
            bw = bandwidth_plot(name, g, plots, b)
            if bw:
                md += [f"![{name}: bandwidth](plots/{bw.name})", ""]
            md += [table(g, rows), ""]
            gr = growth(name, g)
            if len(OrderedDict((r["param"], 1) for r in g)) >= 3:
                growth_rows += [(b, name, *x) for x in gr]
    if growth_rows:
        md += ["## Cost growth", "",
               "How each figure grows with the work, from the smallest to the largest size "
               "measured: the exponent k in time ∝ work^k (0: flat, 1: linear).", "",
               "| benchmark | figure | variant | points | from | to | time from | time to | k |",
               "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for b, name, v, n, x0, x1, y0, y1, k in growth_rows:
            md.append(f"| {b} | {name} | {v} | {n} | {x0:,} | {x1:,} | {fmt_ns(y0)} | "
                      f"{fmt_ns(y1)} | {k:.2f} |")
        md.append("")
    md += pin_forever(d, plots)
    md += beyond_memory(d, plots)
    # The two workloads' own output (run-bench.sh) is their raw data.
    texts = sorted(d.glob("pin-forever-*.txt")) + sorted(d.glob("beyond-memory.txt"))
    md += ["## Raw data", ""] + [f"- [{b}.csv]({b}.csv)" for b in allrows] + [
        f"- [{t.name}]({t.name})" for t in texts] + [""]
    (d / "report.md").write_text("\n".join(md))
    print(f"report: {d / 'report.md'}: {sum(len(r) for r in allrows.values())} rows, "
          f"{len(list(plots.glob('*.png')))} plots")
    return 0 if len(allrows) == len(BENCHES) else 1


if __name__ == "__main__":
    sys.exit(main())
