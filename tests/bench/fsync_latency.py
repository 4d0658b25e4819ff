#!/usr/bin/python3
"""fsync_latency.py — what an fsync of a large file still open for writing
costs the writer and everyone else (issue #10, problem a). tests/bench/run.sh
runs it as the `fsync` phase (ckptfs with --fsync memory and its drain
paused, so the sealed version stays pending; tmpfs as the reference); it also
runs alone against any directory:

  tests/bench/fsync_latency.py DIR BYTES

1. Writes DIR/big.bin (BYTES, 1 MiB blocks, opened O_WRONLY|O_CREAT|O_TRUNC
   like torch.save) and keeps it open.
2. Starts a prober thread that stats a path unrelated to the file about
   every millisecond and records each call's latency. The path is a new
   name in DIR/other/ each time, which does not exist: the kernel caches
   neither attributes nor, for FUSE, negative entries here, so every probe
   is a LOOKUP answered by the filesystem itself (a stat of an existing
   file would be answered from the kernel's attribute cache).
3. fsync(fd), timed; then a 1 MiB write at the end of the file, timed: on
   ckptfs it changes bytes of the version the fsync sealed, which the drain
   has not published, so that version must be kept aside (copy-on-write)
   before the write lands.
4. Stops the prober, closes the file (timed).

Prints `metric value unit` lines: the write throughput, fsync_ms,
write_after_fsync_ms, close_ms; the latencies of the probes that overlapped
the fsync, the write, or the first 100 ms from the fsync on
(lookup_min/median/p99/max_ms, lookup_count); the slowest probe in flight
during the fsync (lookup_fsync_max_ms), the slowest that started during the
write (lookup_write_max_ms), and the median before the fsync
(lookup_idle_median_ms). Bar from the issue: fsync < 50 ms, and stats of
other paths < 10 ms while the write's copy runs.
"""
import argparse
import os
import statistics
import threading
import time

BS = 1 << 20


def out(metric, value, unit):
    print(f"{metric} {value:.6f} {unit}", flush=True)


class Prober(threading.Thread):
    def __init__(self, d, interval):
        super().__init__(daemon=True)
        self.dir, self.interval = d, interval
        self.samples = []  # (start, end) in perf_counter seconds
        self.stop = threading.Event()
        self.error = None

    def run(self):
        i = 0
        while not self.stop.is_set():
            p = os.path.join(self.dir, f"missing-{i}")
            i += 1
            t0 = time.perf_counter()
            try:
                os.stat(p)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.error = e
                return
            self.samples.append((t0, time.perf_counter()))
            time.sleep(self.interval)

    def during(self, a, b):
        """Latencies (s) of the probes that overlapped [a, b]."""
        return [e - s for s, e in self.samples if s < b and e > a]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("bytes", type=int)
    ap.add_argument("--interval", type=float, default=0.001, help="seconds between probes")
    ap.add_argument("--settle", type=float, default=0.3, help="seconds of probes before the fsync and after")
    a = ap.parse_args()

    other = os.path.join(a.dir, "other")
    os.makedirs(other, exist_ok=True)
    path = os.path.join(a.dir, "big.bin")
    buf = os.urandom(BS)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    left = a.bytes
    while left > 0:
        n = os.write(fd, buf[: min(BS, left)])
        left -= n
    out("write_throughput", a.bytes / (time.perf_counter() - t0) / 1e9, "GB/s")

    prober = Prober(other, a.interval)
    prober.start()
    time.sleep(a.settle)
    f0 = time.perf_counter()
    os.fsync(fd)
    f1 = time.perf_counter()
    n = os.write(fd, buf)
    w1 = time.perf_counter()
    if n != BS:
        raise SystemExit(f"short write after the fsync: {n}")
    time.sleep(a.settle)
    prober.stop.set()
    prober.join()
    c0 = time.perf_counter()
    os.close(fd)
    c1 = time.perf_counter()
    if prober.error:
        raise SystemExit(f"probe failed: {prober.error}")

    out("fsync_ms", (f1 - f0) * 1e3, "ms")
    out("write_after_fsync_ms", (w1 - f1) * 1e3, "ms")
    out("close_ms", (c1 - c0) * 1e3, "ms")
    # At least 100 ms from the fsync on: where both take microseconds
    # (tmpfs), that still gives the figures probes to go on.
    lat = prober.during(f0, max(w1, f0 + 0.1))
    if not lat:
        raise SystemExit("no probe ran during the fsync and the write")
    out("lookup_count", len(lat), "probes")
    out("lookup_min_ms", min(lat) * 1e3, "ms")
    out("lookup_median_ms", statistics.median(lat) * 1e3, "ms")
    out("lookup_p99_ms", pct(lat, 0.99) * 1e3, "ms")
    out("lookup_max_ms", max(lat) * 1e3, "ms")
    # Each probe once: to the fsync if it was in flight then, else to the
    # write if it started during the write.
    in_fsync = prober.during(f0, f1)
    in_write = [e - s for s, e in prober.samples if f1 <= s < w1]
    out("lookup_fsync_max_ms", max(in_fsync or [0]) * 1e3, "ms")
    out("lookup_write_max_ms", max(in_write or [0]) * 1e3, "ms")
    idle = [e - s for s, e in prober.samples if e < f0]
    if idle:
        out("lookup_idle_median_ms", statistics.median(idle) * 1e3, "ms")


if __name__ == "__main__":
    main()
