#!/usr/bin/env python3
"""hugepage_writes.py — what a fresh page costs a write on this machine
(issue #15, docs/benchmarks.md): COUNT files, their pages allocated
beforehand (fallocate KEEP_SIZE, as ckptfs's spares), written WAIT seconds
later. Without MIB: files of 1-3 MiB (4 MiB allocated), one write(2) each;
with MIB: files of MIB MiB written in 1 MiB writes. Run it on /dev/shm
(4 KiB pages) and on a tmpfs mounted huge=within_size to compare:

    mkdir -p /tmp/hp && mount -t tmpfs -o huge=within_size tmpfs /tmp/hp
    for w in 0 3; do for d in /tmp/hp /dev/shm; do
      tests/bench/hugepage_writes.py $d $w; tests/bench/hugepage_writes.py $d $w 1 1024; done; done
    umount /tmp/hp
"""
import ctypes
import os
import sys
import time

FALLOC_FL_KEEP_SIZE = 1


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: hugepage_writes.py DIR WAIT_SECONDS [COUNT [MIB]]")
    d, wait = sys.argv[1], float(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    mib = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    alloc = (mib << 20) if mib else (4 << 20)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = os.urandom(4 << 20)
    paths = [os.path.join(d, f"hugepage-writes-{os.getpid()}-{i}") for i in range(count)]
    fds = []
    try:
        for p in paths:
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            fds.append(fd)
            if libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(alloc)) != 0:
                sys.exit(f"fallocate {p}: {os.strerror(ctypes.get_errno())}")
        time.sleep(wait)
        total, t0 = 0, time.perf_counter()
        for i, fd in enumerate(fds):
            if mib:
                for _ in range(mib):
                    total += os.write(fd, buf[:1 << 20])
            else:
                total += os.write(fd, buf[:(1 << 20) + (i * 37 % 2048) * 1024])
        t = time.perf_counter() - t0
        print(f"{d}: {count} files, {total / 2**20:.0f} MiB, allocated {wait:g} s before: "
              f"{t * 1000:.1f} ms, {total / t / 1e9:.2f} GB/s")
    finally:
        for fd in fds:
            os.close(fd)
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main()
