#!/usr/bin/python3
"""The GPU path's pipeline with the host library (no GPU): what the staging,
the writer thread and the rename cost over a plain write of the same bytes.

    CKPTFS_CUDA_LIB=build/libckptfs_gpuhost.so PYTHONPATH=gpu/python \\
      tests/bench/gpu_host_bench.py --mount /mnt/ckpt --tmpfs /dev/shm/x [--size 1G] [--reps 5]

One long-lived process holds a state of NumPy arrays (64, 16, 4 and 1 MiB and
a few KiB, in turn) and, per repetition, in turn: `save` into the mount
(stall = until save returns, then the wait), `save` into tmpfs, and a plain
safetensors write into tmpfs (header, then each array's bytes with
os.write: what the host copier's memcpy + pwrite replaces). The "device"
copies are memcpy here, so these figures say nothing of PCIe: they bound
the pipeline's own overhead. GPU figures come from tests/bench/gpu_bench.cc
on a GPU machine.
"""
import argparse, json, os, statistics, struct, sys, time
import numpy as np
import ckptfs_cuda


def plain_write(path, state):
    head, at = {}, 0
    for k, a in state.items():
        head[k] = {"dtype": "U8", "shape": [a.nbytes], "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, struct.pack("<Q", len(h)) + h)
    for a in state.values():
        mv = memoryview(a).cast("B")
        while mv:
            mv = mv[os.write(fd, mv):]
    os.close(fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mount", required=True)
    p.add_argument("--tmpfs", required=True)
    p.add_argument("--size", default="1G")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    size = int(float(a.size[:-1]) * {"M": 1 << 20, "G": 1 << 30}[a.size[-1]])
    sizes = [64 << 20, 16 << 20, 4 << 20, 1 << 20, 12345]
    state, at, i = {}, 0, 0
    while at < size:
        n = min(sizes[i % len(sizes)], size - at)
        state[f"t{i}"] = np.full(n, i & 0xff, dtype=np.uint8)
        at, i = at + n, i + 1
    os.makedirs(a.tmpfs, exist_ok=True)
    ckptfs_cuda.save(f"{a.tmpfs}/warm", {"w": np.zeros(16, np.uint8)}, wait=True)  # allocate the staging
    rows = {k: [] for k in ("mount_stall", "mount_total", "tmpfs_stall", "tmpfs_total", "plain")}
    for r in range(a.reps):
        for target in (("mount", a.mount), ("tmpfs", a.tmpfs), ("plain", a.tmpfs))[r % 3:] + \
                      (("mount", a.mount), ("tmpfs", a.tmpfs), ("plain", a.tmpfs))[:r % 3]:
            name, d = target
            path = f"{d}/host_bench.safetensors"
            t0 = time.perf_counter()
            if name == "plain":
                plain_write(path, state)
                rows["plain"].append(time.perf_counter() - t0)
            else:
                h = ckptfs_cuda.save(path, state)
                t1 = time.perf_counter()
                h.wait()
                rows[f"{name}_stall"].append(t1 - t0)
                rows[f"{name}_total"].append(time.perf_counter() - t0)
            os.unlink(path)
    gb = size / 1e9
    pinned = os.environ.get("CKPTFS_CUDA_PINNED", "512M (default)")
    print(f"engine {ckptfs_cuda.engine()}, state {size / 2**30:.2f} GiB in {len(state)} arrays, "
          f"CKPTFS_CUDA_PINNED={pinned}, {a.reps} repetitions")
    print(f"{'figure':52} {'min':>8} {'median':>8} {'max':>8}")
    for k, v in rows.items():
        print(f"{k + ' (s)':52} {min(v):8.3f} {statistics.median(v):8.3f} {max(v):8.3f}")
    for k in ("mount_stall", "mount_total", "tmpfs_total"):
        r = [x / y for x, y in zip(rows[k], rows["plain"])]
        print(f"{k + ' / plain write into tmpfs':52} {min(r):8.2f} {statistics.median(r):8.2f} {max(r):8.2f}")
    print(f"plain write into tmpfs: {gb / statistics.median(rows['plain']):.2f} GB/s")


if __name__ == "__main__":
    sys.exit(main())
