#!/usr/bin/python3
"""report.py — turns a `make bench` CSV (tests/bench/run.sh) into the tables
of docs/benchmarks.md and the chart docs/benchmarks.png.

    tests/bench/report.py tests/bench/out/results.csv --md docs/benchmarks.md --png docs/benchmarks.png
    tests/bench/report.py FULL.csv PHASE-RERUN.csv ...   (a phase in a later CSV replaces it)

Every ratio is taken within one repetition (ckptfs and its peer measured
minutes apart, in rotating order), then summarised as min / median / max over
the repetitions, so a machine whose speed drifts between repetitions still
gives a fair comparison. Only the part of the Markdown file between
`<!-- bench:begin -->` and `<!-- bench:end -->` is rewritten; the analysis
around it is kept. Without --md, the tables go to stdout.
"""
import argparse
import collections
import csv
import os
import platform
import re
import statistics
import subprocess
import sys

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def load(paths):
    """Reads each CSV in turn; a phase a later one measured replaces that
    phase of the earlier ones (a phase rerun alone), except `meta` (the
    machine and the whole run's figures: the first run's). Returns the data
    and [(run, phases it contributed)]."""
    data = collections.defaultdict(dict)  # (phase, metric, target) -> {rep: value}
    runs = []
    for path in paths:
        rows, run = [], ""
        with open(path) as f:
            for row in csv.DictReader(f):
                run = row["run"]
                rows.append(row)
        phases = {row["phase"] for row in rows}
        if runs:
            phases.discard("meta")
            for key in [k for k in data if k[0] in phases]:
                del data[key]
            for i, (other, had) in enumerate(runs):
                runs[i] = (other, had - phases)
        for row in rows:
            if row["phase"] not in phases:
                continue
            try:
                data[(row["phase"], row["metric"], row["target"])][int(row["rep"])] = float(row["value"])
            except ValueError:
                pass
        runs.append((run, phases))
    return data, runs


class Report:
    def __init__(self, data):
        self.d = data

    def get(self, phase, metric, target):
        return self.d.get((phase, metric, target), {})

    def ratio(self, num, den, invert=False):
        """Per-repetition num/den (den/num with invert), for reps that have both."""
        a, b = self.get(*num), self.get(*den)
        out = []
        for rep in sorted(set(a) & set(b)):
            x, y = (b[rep], a[rep]) if invert else (a[rep], b[rep])
            if y > 0:
                out.append(x / y)
        return out

    def values(self, phase, metric, target):
        v = self.get(phase, metric, target)
        return [v[k] for k in sorted(v)]


def mmm(v):
    if not v:
        return None
    return min(v), statistics.median(v), max(v)


def fmt(x, digits=2):
    if x is None:
        return "—"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}"


def fmt_mmm(v, digits=2, suffix=""):
    m = mmm(v)
    if m is None:
        return "—", "—", "—"
    return tuple(fmt(x, digits) + suffix for x in m)


def holds(v, op, goal):
    """Whether the values `v` meet the goal: by their median, or, for
    "max<=", every one of them (issue #29: no repetition above 1.2x)."""
    lo, med, hi = mmm(v)
    if op == "max<=":
        return hi <= goal
    return med <= goal if op == "<=" else med >= goal


def goal_text(op, goal):
    return {"<=": "≤", ">=": "≥", "max<=": "every ≤"}[op] + f" {goal:g}"


def verdict(v, op, goal):
    if not v:
        return "not measured"
    return "**met**" if holds(v, op, goal) else "**not met**"


# Small framework-shaped checkpoints (bench.py frameworks): metric, label, goal.
FRAMEWORK_FIGURES = (
    ("dcp_save_seconds", "DCP save, 4 ranks, 96 fsynced files + .metadata", 1.2),
    ("dcp_load_seconds", "DCP load in a new process", 1.1),
    ("hf_save_seconds", "HF Trainer checkpoint-N save, 10 files", 1.2),
    ("hf_load_seconds", "HF Trainer checkpoint-N load in a new process", 1.1),
)


# Trainer patterns (run.sh phase patterns, bench.py trainer --pattern): the
# phase's suffix and its label.
PATTERN_FIGURES = (
    ("keep", "keep-all (a new step directory each save)"),
    ("keep2", "rotation (the last 2 kept)"),
    ("pressure", "rotation while others use 2 GiB of page cache and tmpfs"),
    ("full", "keep-all, the budget near full (2.5 saves)"),
    ("ranks", "8 ranks × 256 MiB at once"),
    ("first", "the first save of a fresh mount"),
)


def build_rows(r, gb_data):
    """The goal rows: (label, values, op, goal, unit)."""
    ck, tm, rc = "ckptfs", "tmpfs", "rclone"
    rows = []
    # Issue #15: a long-lived trainer saving its warm state again and again.
    rows.append(("torch.save, long-lived trainer: ckptfs time ÷ tmpfs time",
                 r.ratio(("trainer", "save_seconds", ck), ("trainer", "save_seconds", tm)), "<=", 0.8, "×"))
    rows.append(("torch.save, long-lived trainer: ckptfs time ÷ ext4 page-cache time",
                 r.ratio(("trainer", "save_seconds", ck), ("trainer", "save_seconds", "disk")), "<=", 1.0, "×"))
    rows.append(("torch.save, 1 file: ckptfs time ÷ tmpfs time",
                 r.ratio(("torch", "save_single", ck), ("torch", "save_single", tm)), "<=", 1.0, "×"))
    rows.append(("torch.save, 64 files: ckptfs time ÷ tmpfs time",
                 r.ratio(("torch", "save_sharded", ck), ("torch", "save_sharded", tm)), "<=", 1.0, "×"))
    rows.append(("sequential write, 1 MiB blocks, a mount's next file: ckptfs ÷ tmpfs throughput",
                 r.ratio(("seq", "steady_write_throughput", ck), ("seq", "steady_write_throughput", tm)),
                 ">=", 1.5, "×"))
    rows.append(("sequential read, warm: ckptfs ÷ tmpfs throughput",
                 r.ratio(("seq", "read_warm_throughput", ck), ("seq", "read_warm_throughput", tm)), ">=", 0.9, "×"))
    for which, n in (("single", "1 file"), ("sharded", "64 files")):
        rows.append((f"torch.load after trainer restart, {n}: ckptfs time ÷ tmpfs time",
                     r.ratio(("torch", f"load_plain_{which}", ck), ("torch", f"load_plain_{which}", tm)),
                     "<=", 1.05, "×"))
    for which, n in (("single", "1 file"), ("sharded", "64 files")):
        rows.append((f"mmap load after trainer restart, {n}: ckptfs ÷ tmpfs throughput",
                     r.ratio(("torch", f"load_mmap_{which}_throughput", ck),
                             ("torch", f"load_mmap_{which}_throughput", tm)), ">=", 0.9, "×"))
    for metric, what, goal in FRAMEWORK_FIGURES:
        rows.append((f"{what}: ckptfs time ÷ tmpfs time",
                     r.ratio(("frameworks", metric, ck), ("frameworks", metric, tm)), "<=", goal, "×"))
    rows.append(("torch.save, 1 file: rclone time ÷ ckptfs time",
                 r.ratio(("torch", "save_single", rc), ("torch", "save_single", ck)), ">=", 8.0, "×"))
    rows.append(("torch.save, 64 files: rclone time ÷ ckptfs time",
                 r.ratio(("torch", "save_sharded", rc), ("torch", "save_sharded", ck)), ">=", 8.0, "×"))
    rows.append(("time to durable, torch.save 1 file: ckptfs drain ÷ cp + sync",
                 r.ratio(("torch", "durable_single", ck), ("torch", "durable_single", tm)), "<=", 1.1, "×"))
    rows.append(("time to durable, torch.save 64 files: ckptfs drain ÷ cp + sync",
                 r.ratio(("torch", "durable_sharded", ck), ("torch", "durable_sharded", tm)), "<=", 1.1, "×"))
    rows.append((f"time to durable, sequential {gb_data}: ckptfs drain ÷ cp + sync",
                 r.ratio(("seq", "durable_seconds", ck), ("seq", "durable_seconds", tm)), "<=", 1.1, "×"))
    rss = r.values("seq", "drained_RssAnon", ck) + r.values("torch", "RssAnon", ck)
    rows.append(("daemon anonymous RSS after the phase (MiB)", rss, "<=", 100 / 1.048576, "MiB"))
    for phase, what in (("seq", f"one {gb_data} file"), ("torch", "torch.save, 1 + 64 files")):
        t, dbytes = r.get(phase, "tier_bytes", ck), r.get(phase, "data_bytes", ck)
        over = [100.0 * (t[k] / dbytes[k] - 1) for k in sorted(set(t) & set(dbytes)) if dbytes[k] > 0]
        rows.append((f"tier bytes per data byte − 1, {what} (%)", over, "<=", 2.0, "%"))
    # Issue #29: every common trainer pattern, each a same-run ratio.
    every = []
    for pat, label in PATTERN_FIGURES:
        phase = f"pat-{pat}"
        if not r.get(phase, "save_seconds", ck):
            continue
        rows.append((f"torch.save, {label}: ckptfs time ÷ tmpfs time",
                     r.ratio((phase, "save_seconds", ck), (phase, "save_seconds", tm)), "<=", 0.8, "×"))
        rows.append((f"torch.save, {label}: ckptfs time ÷ ext4 page-cache time",
                     r.ratio((phase, "save_seconds", ck), (phase, "save_seconds", "disk")), "<=", 1.0, "×"))
        # Close to the physical limit: the save ÷ (torch's own CPU for it +
        # the bytes at the copy rate measured in the same repetition).
        bw, nb = r.get(phase, "copy_gbps", "membw"), r.get(phase, "save_bytes", "membw")
        st, us = r.get(phase, "save_seconds", ck), r.get(phase, "save_user_seconds", ck)
        lim = [st[k] / (us[k] + nb[k] / (bw[k] * 1e9)) for k in sorted(set(bw) & set(nb) & set(st) & set(us))
               if bw[k] > 0]
        if lim:
            rows.append((f"torch.save, {label}: ckptfs time ÷ (torch's CPU + bytes at memory-copy speed)",
                         lim, "<=", 1.15, "×"))
        if r.get(phase, "load_seconds", ck):
            rows.append((f"torch.load in a new process, {label}: ckptfs time ÷ tmpfs time",
                         r.ratio((phase, "load_seconds", ck), (phase, "load_seconds", tm)), "<=", 1.05, "×"))
        every += r.ratio((phase, "save_seconds", ck), (phase, "save_seconds", tm))
    # "No repetition above 1.2x tmpfs": a save that costs the same whatever
    # came before it, judged by its slowest repetition, not its median.
    if every:
        rows.append(("torch.save, every pattern above, every repetition: ckptfs time ÷ tmpfs time",
                     every, "max<=", 1.2, "×"))
    # Issue #29: the drain at the backend's speed, and out of the trainer's way.
    # The peers are measured right after the drain, in the same repetition.
    rows.append(("time to durable, sequential file: ckptfs drain ÷ cp + sync right after it",
                 r.ratio(("seq", "durable_seconds", ck), ("seq", "peer_cp_sync_seconds", ck)), "<=", 1.0, "×"))
    # The backend's own write: the faster of dd with fsync (through the page
    # cache) and dd with O_DIRECT, in that repetition.
    dur, dd = r.get("seq", "durable_seconds", ck), r.get("seq", "peer_dd_fsync_seconds", ck)
    ddd = r.get("seq", "peer_dd_direct_seconds", ck)
    best = {k: min(v, ddd.get(k, v)) for k, v in dd.items()}
    rows.append(("drain throughput (a sequential file, close to persisted) ÷ the backend's own write "
                 "(dd: the faster of fsync and O_DIRECT)",
                 [best[k] / dur[k] for k in sorted(set(dur) & set(best)) if dur[k] > 0], ">=", 0.9, "×"))
    rows.append(("a CPU-bound training step while a file drains ÷ the same step, drain idle",
                 r.values("interfere", "step_draining_ratio", ck), "<=", 1.05, "×"))
    # Issue #10: an fsync of a file still open for writing (--fsync memory,
    # the version it seals not yet drained) returns at once, and the copy
    # the next write needs holds up no one else.
    fsize = (r.values("meta", "fsync_size_bytes", "all") or [0])[0]
    rows.append((f"fsync of a {fsize / 2**30:.3g} GiB file open for writing, not yet drained (ms)",
                 r.values("fsync", "fsync_ms", ck), "<=", 50.0, "ms"))
    rows.append(("stat of other paths during that fsync and the next write, slowest (ms)",
                 r.values("fsync", "lookup_max_ms", ck), "<=", 10.0, "ms"))
    return rows


def trainer_ratio(r, target, den):
    """Per-repetition trainer save time of `target` ÷ `den`, both from the
    trainer group that saved to `target` (tests/bench/run.sh: the goal's
    targets in phase trainer, the other ckptfs variants in trainer-b; an
    older run has them all in trainer)."""
    for phase in ("trainer", "trainer-b"):
        if r.get(phase, "save_seconds", target):
            return r.ratio((phase, "save_seconds", target), (phase, "save_seconds", den))
    return []


def save_rows(r, target, label):
    """The save figures of `target` (ckptfs with one knob changed), which
    runs in the trainer and frameworks phases only, as ratios to tmpfs."""
    tm = "tmpfs"
    rows = [(f"{label}: torch.save, long-lived trainer: time ÷ tmpfs time",
             trainer_ratio(r, target, tm))]
    for metric, what, _ in FRAMEWORK_FIGURES:
        rows.append((f"{label}: {what}: time ÷ tmpfs time",
                     r.ratio(("frameworks", metric, target), ("frameworks", metric, tm))))
    return rows


def lever_rows(r, target, label):
    """The read and write goals of `target` (ckptfs with one lever off) as
    ratios to tmpfs, each row named `label: ...`."""
    tm = "tmpfs"
    rows = [(f"{label}: sequential write, a mount's next file ÷ tmpfs throughput",
             r.ratio(("seq", "steady_write_throughput", target), ("seq", "steady_write_throughput", tm))),
            (f"{label}: sequential read, warm ÷ tmpfs throughput",
             r.ratio(("seq", "read_warm_throughput", target), ("seq", "read_warm_throughput", tm)))]
    for which, n in (("single", "1 file"), ("sharded", "64 files")):
        rows.append((f"{label}: torch.load after trainer restart, {n}: time ÷ tmpfs time",
                     r.ratio(("torch", f"load_plain_{which}", target), ("torch", f"load_plain_{which}", tm))))
        rows.append((f"{label}: mmap load after trainer restart, {n} ÷ tmpfs throughput",
                     r.ratio(("torch", f"load_mmap_{which}_throughput", target),
                             ("torch", f"load_mmap_{which}_throughput", tm))))
    for metric, what, _ in FRAMEWORK_FIGURES:
        rows.append((f"{label}: {what}: time ÷ tmpfs time",
                     r.ratio(("frameworks", metric, target), ("frameworks", metric, tm))))
    return rows


def other_rows(r):
    ck, tm, dk, rc = "ckptfs", "tmpfs", "disk", "rclone"
    rows = []
    rows.append(("torch.save, long-lived trainer, passthrough=off: ckptfs time ÷ tmpfs time",
                 trainer_ratio(r, "ckptfs-nopt", tm)))
    rows.append(("torch.save, long-lived trainer: ckptfs time ÷ ckptfs passthrough=off time",
                 trainer_ratio(r, ck, "ckptfs-nopt")))
    # What each lever bought: the goals again with passthrough off, and with
    # the tier on 2 MiB pages (--tier-huge on).
    rows += lever_rows(r, "ckptfs-nopt", "passthrough=off")
    k4 = "ckptfs-huge"
    rows.append(("--tier-huge on: torch.save, long-lived trainer: time ÷ tmpfs time",
                 trainer_ratio(r, k4, tm)))
    rows.append(("--tier-huge on: torch.save, long-lived trainer: time ÷ ext4 page-cache time",
                 trainer_ratio(r, k4, dk)))
    rows += lever_rows(r, k4, "--tier-huge on")
    # The drain's yield to saves (--drain-yield 0: it never waits), and
    # requests through /dev/fuse (-o io_uring=off): what each bought.
    rows += save_rows(r, "ckptfs-noyield", "--drain-yield 0")
    rows += save_rows(r, "ckptfs-nouring", "-o io_uring=off")
    rows.append(("mmap load after trainer restart, 64 files, the loader kept on one CPU: ckptfs ÷ tmpfs throughput",
                 r.ratio(("torch", "pinned_load_mmap_sharded_throughput", ck),
                         ("torch", "pinned_load_mmap_sharded_throughput", tm))))
    rows.append(("sequential write, a mount's next file: ckptfs ÷ local disk (page cache) throughput",
                 r.ratio(("seq", "steady_write_throughput", ck), ("seq", "steady_write_throughput", dk))))
    rows.append(("sequential write, a fresh mount's first file (copying path): ckptfs ÷ tmpfs throughput",
                 r.ratio(("seq", "write_throughput", ck), ("seq", "write_throughput", tm))))
    rows.append(("sequential write, first file: ckptfs ÷ rclone throughput",
                 r.ratio(("seq", "write_throughput", ck), ("seq", "write_throughput", rc))))
    rows.append(("sequential read after drop_caches: ckptfs ÷ tmpfs throughput",
                 r.ratio(("seq", "read_cold_throughput", ck), ("seq", "read_cold_throughput", tm))))
    rows.append(("sequential read after drop_caches: ckptfs ÷ local disk throughput",
                 r.ratio(("seq", "read_cold_throughput", ck), ("seq", "read_cold_throughput", dk))))
    rows.append(("sequential read after drop_caches: ckptfs ÷ rclone throughput",
                 r.ratio(("seq", "read_cold_throughput", ck), ("seq", "read_cold_throughput", rc))))
    rows.append(("torch.save, 1 file: ckptfs time ÷ local disk time",
                 r.ratio(("torch", "save_single", ck), ("torch", "save_single", dk))))
    for mode, name in (("plain", "torch.load"), ("mmap", "mmap load")):
        for which, n in (("single", "1 file"), ("sharded", "64 files")):
            rows.append((f"{name} after daemon restart, {n}: ckptfs ÷ tmpfs throughput",
                         r.ratio(("torch", f"restart_load_{mode}_{which}_throughput", ck),
                                 ("torch", f"load_{mode}_{which}_throughput", tm))))
    for which, n in (("single", "1 file"), ("sharded", "64 files")):
        rows.append((f"time to durable via `ckptfs drain` (polls every 0.5 s), {n}: ÷ cp + sync",
                     r.ratio(("torch", f"durable_cli_{which}", ck), ("torch", f"durable_{which}", tm))))
    rows.append(("remount with the files in the tier ÷ mount of an empty ckptfs",
                 r.ratio(("remount", "mount_seconds", ck), ("remount", "mount_seconds", "ckptfs-empty"))))
    return rows


def absolute_rows(r, files):
    ck = "ckptfs"
    gb = mmm(r.values("seq", "data_bytes", ck))
    gbytes = gb[1] / 1e9 if gb else None

    def per_gb(metric_a, metric_b):
        a, b = r.get("seq", metric_a, ck), r.get("seq", metric_b, ck)
        if not gbytes:
            return []
        return [(b[k] - a[k]) / gbytes for k in sorted(set(a) & set(b))]

    rows = [
        ("daemon CPU seconds per GB written, a fresh mount's first file (copying path)",
         per_gb("before_cpu_seconds", "written_cpu_seconds"), "s/GB"),
        ("daemon CPU seconds per GB written, the next file (passthrough)",
         per_gb("steady_before_cpu_seconds", "steady_written_cpu_seconds"), "s/GB"),
        ("daemon CPU seconds per GB read, warm (passthrough)", per_gb("read_before_cpu_seconds", "read_after_cpu_seconds"),
         "s/GB"),
        ("daemon CPU seconds per GB written (write + drain)", per_gb("before_cpu_seconds", "drained_cpu_seconds"),
         "s/GB"),
        ("daemon CPU seconds per GiB drained (a sequential file, beside a training step)",
         r.values("interfere", "drain_cpu_seconds_per_gib", ck), "s/GiB"),
        ("daemon peak RSS, VmHWM",
         r.values("seq", "drained_VmHWM", ck) + r.values("torch", "VmHWM", ck), "MiB"),
        (f"remount with {files} files in the tier", r.values("remount", "mount_seconds", ck), "s"),
        ("mount of an empty ckptfs", r.values("remount", "mount_seconds", "ckptfs-empty"), "s"),
        (f"umount with {files} files (already drained)", r.values("remount", "umount_seconds", ck), "s"),
        (f"create {files} files through ckptfs", r.values("remount", "creates_per_second", ck), "files/s"),
        (f"drain {files} small files to the backend", r.values("remount", "drain_seconds", ck), "s"),
    ]
    return rows


def raw_table(r):
    metrics = [
        ("trainer", "save_seconds", "torch.save, long-lived trainer", "s"),
        ("trainer", "save_user_seconds", "its user CPU (pickling, CRC32)", "s"),
        ("trainer", "save_sys_seconds", "its system CPU (copying into pages, faulting them in)", "s"),
        ("trainer-b", "save_seconds", "torch.save, long-lived trainer, second group", "s"),
        ("frameworks", "dcp_save_seconds", "DCP save", "s"),
        ("frameworks", "dcp_load_seconds", "DCP load", "s"),
        ("frameworks", "hf_save_seconds", "HF checkpoint save", "s"),
        ("frameworks", "hf_load_seconds", "HF checkpoint load", "s"),
        ("seq", "write_throughput", "sequential write, a fresh mount's first file", "GB/s"),
        ("seq", "steady_write_throughput", "sequential write, the next file", "GB/s"),
        ("seq", "read_warm_throughput", "sequential read, warm", "GB/s"),
        ("seq", "read_cold_throughput", "sequential read after drop_caches", "GB/s"),
        ("seq", "durable_seconds", "seq: time to durable (drain / cp+sync / sync)", "s"),
        ("torch", "save_single", "torch.save, 1 file", "s"),
        ("torch", "save_sharded", "torch.save, 64 files", "s"),
        ("torch", "durable_single", "time to durable, 1 file (drain / cp+sync / sync)", "s"),
        ("torch", "durable_sharded", "time to durable, 64 files", "s"),
        ("torch", "load_plain_single_throughput", "torch.load, 1 file", "GB/s"),
        ("torch", "load_plain_sharded_throughput", "torch.load, 64 files", "GB/s"),
        ("torch", "load_mmap_single_throughput", "mmap load, 1 file", "GB/s"),
        ("torch", "load_mmap_sharded_throughput", "mmap load, 64 files", "GB/s"),
        ("torch", "pinned_load_mmap_sharded_throughput", "mmap load, 64 files, loader on one CPU", "GB/s"),
        ("torch", "restart_load_plain_single_throughput", "torch.load after daemon restart, 1 file", "GB/s"),
        ("torch", "restart_load_mmap_single_throughput", "mmap load after daemon restart, 1 file", "GB/s"),
        ("fsync", "fsync_ms", "fsync of a file open for writing (ckptfs: drain paused)", "ms"),
        ("fsync", "write_after_fsync_ms", "1 MiB write after that fsync", "ms"),
        ("fsync", "lookup_p99_ms", "stat of other paths meanwhile, p99", "ms"),
        ("fsync", "lookup_max_ms", "stat of other paths meanwhile, slowest", "ms"),
    ]
    targets = ["ckptfs", "ckptfs-nopt", "ckptfs-noyield", "ckptfs-nouring", "ckptfs-huge", "tmpfs", "disk", "rclone"]
    lines = ["| figure (median of repetitions) | " + " | ".join(targets) + " |",
             "|---|" + "---:|" * len(targets)]
    for phase, metric, label, unit in metrics:
        cells = []
        for t in targets:
            m = mmm(r.values(phase, metric, t))
            cells.append(fmt(m[1]) if m else "—")
        if all(c == "—" for c in cells):
            continue
        lines.append(f"| {label} ({unit}) | " + " | ".join(cells) + " |")
    return lines


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


def machine(r, repo):
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    mem = sh("awk '/^MemTotal/ { printf \"%.1f GiB\", $2 / 2^20 }' /proc/meminfo")
    disk = sh(f"findmnt -n -o SOURCE,FSTYPE -T {repo}/tests/bench")
    shm = sh("findmnt -n -o SIZE,OPTIONS -T /dev/shm | head -n 1")
    fuse = sh("dpkg-query -W -f='${Version}' libfuse3-3")
    rclone = sh("rclone version 2>/dev/null | head -n1").replace("rclone ", "")
    torch = sh("/usr/bin/python3 -c 'import torch; print(torch.__version__)'")
    lines = [
        f"- kernel: Linux {platform.release()} ({platform.machine()}), Debian {sh('cat /etc/debian_version')}",
        f"- CPU: {os.cpu_count()} × {cpu or 'unknown'}; memory {mem}",
        f"- local disk directory: {disk or 'unknown'}; /dev/shm: tmpfs {shm}",
        f"- libfuse {fuse}, rclone {rclone}, torch {torch}, Python {platform.python_version()}",
    ]
    la0 = r.values("meta", "loadavg_start", "all")
    la1 = r.values("meta", "loadavg_end", "all")
    b0, b1 = r.values("meta", "cpu_busy_start", "all"), r.values("meta", "cpu_busy_end", "all")
    wall = r.values("meta", "wall_seconds", "all")
    busy = ""
    if b0 and b1 and wall:
        frac = (b1[0] - b0[0]) / os.sysconf("SC_CLK_TCK") / (wall[0] * os.cpu_count())
        busy = f"; CPUs busy {100 * frac:.0f} % of the run (all processes, the benchmark included)"
    if la0 and la1:
        took = f"; the run took {wall[0] / 60:.1f} min" if wall else ""
        lines.append(f"- load average at start {la0[0]:.2f}, at end {la1[0]:.2f}{busy}{took}")
    return lines


def config_line(r):
    g = lambda m: (r.values("meta", m, "all") or [0])[0]
    return (f"Sizes: sequential file {g('size_bytes') / 2**30:.3g} GiB in 1 MiB blocks; model + Adam state "
            f"{g('torch_gib'):.3g} GiB, also split into {g('shards'):.0f} files; {g('files'):.0f} files of "
            f"{g('file_bytes') / 1024:.0f} KiB for the remount; {g('reps'):.0f} repetitions; ckptfs "
            f"--cache-size {g('cache_size') / 2**30:.1f} GiB, tier on /dev/shm, backend on the local disk.")


def s3_lines(r, s3_out):
    keys = sorted(k for k in r.d if k[0] == "s3_drain")
    lines = []
    if s3_out and os.path.exists(s3_out):
        text = open(s3_out).read().splitlines()
        ratios = []
        for line in text:
            m = re.match(r"run \d+: ckptfs drain ([\d.]+) MiB/s.*aws s3 cp ([\d.]+) MiB/s", line)
            if m and float(m.group(2)) > 0:
                ratios.append(float(m.group(1)) / float(m.group(2)))
        summary = [x for x in text if re.match(r"(s3_drain:|ckptfs drain:|aws s3 cp:|ratio)", x)]
        if summary:
            lines += ["", "### S3 drain (tests/bench/s3_drain.sh, as it printed it)", "", "```"] + summary + ["```"]
        if ratios:
            a, m, b = fmt_mmm(ratios)
            lines += ["", "| figure | min | median | max |", "|---|---:|---:|---:|",
                      f"| S3 drain throughput: ckptfs drain ÷ aws s3 cp, same run | {a} | {m} | {b} |"]
    if keys:
        lines += ["", "S3 drain (tests/bench/s3_drain.sh, rows it appended to the CSV):", "",
                  "| metric | target | min | median | max |", "|---|---|---:|---:|---:|"]
        for k in keys:
            a, m, b = fmt_mmm(r.values(*k))
            lines.append(f"| {k[1]} | {k[2]} | {a} | {m} | {b} |")
    return lines


def chart(rows, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio_rows = [x for x in rows if x[4] == "×" and x[1]]
    if not ratio_rows:
        return
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(ratio_rows) + 1.6))
    for i, (label, v, op, goal, unit) in enumerate(ratio_rows):
        lo, med, hi = mmm(v)
        ok = holds(v, op, goal)
        ax.barh(i, med, color="#4c9a2a" if ok else "#c0392b", alpha=0.8)
        ax.errorbar(med, i, xerr=[[med - lo], [hi - med]], fmt="none", ecolor="black", capsize=3)
        ax.plot([goal, goal], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(hi * 1.05, i, f"{med:.2f}× (goal {goal_text(op, goal)})", va="center", fontsize=8)
    ax.set_yticks(range(len(ratio_rows)))
    ax.set_yticklabels([x[0] for x in ratio_rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ratio within a repetition: bar = median, whiskers = min..max, black tick = goal (log scale)")
    ax.set_title("ckptfs against peers measured in the same run (green: goal met)")
    lo = min(min(x[1]) for x in ratio_rows + [("", [1], "", 1, "")])
    hi = max(max(x[1]) for x in ratio_rows + [("", [1], "", 1, "")])
    ax.set_xlim(min(lo, 0.1) * 0.8, max(hi, 10) * 3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def render(r, runs, repo, note, s3_out=None):
    gb_data = mmm(r.values("seq", "data_bytes", "ckptfs"))
    gb_label = f"{gb_data[1] / 2**30:.3g} GiB" if gb_data else "file"
    files = int((r.values("meta", "files", "all") or [0])[0])
    rows = build_rows(r, gb_label)
    if len(runs) == 1:
        md = [BEGIN, "", f"Run `{runs[0][0]}`, produced by `make bench` (tests/bench/run.sh → report.py); "
              "the CSV is tests/bench/out/results.csv.", ""]
    else:
        later = set().union(*(ph for _, ph in runs[1:]))
        parts = [f"`{runs[0][0]}` (every phase but {', '.join(sorted(later))})"]
        parts += [f"`{run}` ({', '.join(sorted(ph))})" for run, ph in runs[1:]]
        md = [BEGIN, "", "Runs " + " and ".join(parts) + ": `make bench`, then the phases named rerun alone "
              "(`PHASES=... REPORT=0 tests/bench/run.sh`); report.py takes each phase from the last CSV "
              "that has it. The machine lines are the first run's.", ""]
    md += machine(r, repo)
    if note:
        md.append(f"- note: {note}")
    md += ["", config_line(r), "",
           "### Goals (ratio within each repetition; min / median / max over repetitions)", "",
           "| figure | goal | min | median | max | verdict |", "|---|---|---:|---:|---:|---|"]
    for label, v, op, goal, unit in rows:
        a, m, b = fmt_mmm(v)
        g = goal_text(op, float(f"{goal:.3g}")) + ("" if unit == "×" else " " + unit)
        if unit == "MiB":
            g = "< 100 MB"
        md.append(f"| {label} | {g} | {a} | {m} | {b} | {verdict(v, op, goal)} |")
    md += ["", "![ratios against same-run peers](benchmarks.png)", "",
           "### Other ratios (no goal)", "", "| figure | min | median | max |", "|---|---:|---:|---:|"]
    for label, v in other_rows(r):
        a, m, b = fmt_mmm(v)
        md.append(f"| {label} | {a} | {m} | {b} |")
    md += ["", "### Daemon and metadata figures", "", "| figure | unit | min | median | max |",
           "|---|---|---:|---:|---:|"]
    for label, v, unit in absolute_rows(r, files):
        a, m, b = fmt_mmm(v)
        md.append(f"| {label} | {unit} | {a} | {m} | {b} |")
    md += ["", "### Raw medians per target (absolute figures drift with the machine; compare ratios)", ""]
    md += raw_table(r)
    md += s3_lines(r, s3_out)
    md += ["", END]
    return rows, "\n".join(md)


SKELETON = """# Benchmarks

`make bench` measures ckptfs against tmpfs, a local disk directory and rclone
(`--vfs-cache-mode full`). The section between the markers below is rewritten
by every run (tests/bench/report.py); the analysis after it is not.

{block}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="results CSVs; a phase in a later one replaces it")
    ap.add_argument("--md")
    ap.add_argument("--png")
    ap.add_argument("--note", default="")
    ap.add_argument("--s3-out", help="what tests/bench/s3_drain.sh printed")
    a = ap.parse_args()
    data, runs = load(a.csv)
    r = Report(data)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows, block = render(r, runs, repo, a.note, a.s3_out)
    if a.png:
        chart(rows, a.png)
    if not a.md:
        print(block)
        return 0
    if os.path.exists(a.md):
        text = open(a.md).read()
        if BEGIN in text and END in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = SKELETON.format(block=block)
    with open(a.md, "w") as f:
        f.write(text)
    print(f"report: wrote {a.md}" + (f" and {a.png}" if a.png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
