#!/usr/bin/python3
"""Per-call latency of a small-file checkpoint, one process, no ranks.

    tests/bench/fileops_latency.py [--files N] [--reps R] NAME=DIR...

For each DIR in turn, R times: N files of 1-2 MiB, each created
(open O_CREAT|O_TRUNC), written in one write(2), fsynced and closed, as
DCP's FileSystemWriter does per shard; then the same files reopened and
read back. Prints, per DIR and call, the median over files of each
repetition, then min / median / max of those over the repetitions, in
microseconds. What it isolates: the cost of each FUSE round trip (a create
is a LOOKUP and a CREATE; a write, a GETXATTR of security.capability; an
fsync, an FSYNC; a close, a FLUSH) without the contention of several ranks
(docs/benchmarks.md, "Requests over io_uring").
"""
import argparse
import os
import shutil
import statistics
import time


def one_round(d, files, buf):
    os.makedirs(d, exist_ok=True)
    t = {k: [] for k in ("create", "write", "fsync", "close", "open_r", "read", "close_r")}
    for i in range(files):
        p = os.path.join(d, f"__0_{i}.distcp")
        a = time.perf_counter()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        b = time.perf_counter()
        os.write(fd, buf[: (1 << 20) + i * 8192])
        c = time.perf_counter()
        os.fsync(fd)
        e = time.perf_counter()
        os.close(fd)
        g = time.perf_counter()
        for k, v in (("create", b - a), ("write", c - b), ("fsync", e - c), ("close", g - e)):
            t[k].append(v)
    for i in range(files):
        p = os.path.join(d, f"__0_{i}.distcp")
        a = time.perf_counter()
        fd = os.open(p, os.O_RDONLY)
        b = time.perf_counter()
        while os.read(fd, 1 << 20):
            pass
        c = time.perf_counter()
        os.close(fd)
        e = time.perf_counter()
        for k, v in (("open_r", b - a), ("read", c - b), ("close_r", e - c)):
            t[k].append(v)
    return {k: statistics.median(v) * 1e6 for k, v in t.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=96)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("dirs", nargs="+", metavar="NAME=DIR")
    a = ap.parse_args()
    targets = [x.split("=", 1) for x in a.dirs]
    buf = os.urandom(2 << 20)
    res = {name: [] for name, _ in targets}
    for r in range(a.reps + 1):  # round 0 warms up (first files of a mount)
        for k in range(len(targets)):
            name, d = targets[(k + r) % len(targets)]
            sub = os.path.join(d, f"fileops-{r}")
            time.sleep(1.5)  # the previous target's drain and writeback settle
            m = one_round(sub, a.files, buf)
            if r > 0:
                res[name].append(m)
            shutil.rmtree(os.path.join(d, f"fileops-{r - 1}"), ignore_errors=True)
    for name, d in targets:
        shutil.rmtree(os.path.join(d, f"fileops-{a.reps}"), ignore_errors=True)
    keys = ("create", "write", "fsync", "close", "open_r", "read", "close_r")
    print(f"{'target':<14}" + "".join(f"{k:>20}" for k in keys))
    for name, _ in targets:
        cells = []
        for k in keys:
            v = sorted(m[k] for m in res[name])
            cells.append(f"{v[0]:.0f}/{statistics.median(v):.0f}/{v[-1]:.0f}")
        print(f"{name:<14}" + "".join(f"{c:>20}" for c in cells))
    print("(µs per call, per-repetition medians over files: min/median/max over repetitions)")


if __name__ == "__main__":
    main()
