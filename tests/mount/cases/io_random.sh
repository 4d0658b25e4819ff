#!/usr/bin/env bash
# Random writes (random sizes at random offsets, some unaligned, some past
# the end) into a file on the mount and into a reference file, with reads
# at random offsets in between through the writing fd and a second fd; the
# two files match at the end, after a reopen, after dropping caches and
# after a remount.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
$PY - "$T/ref" "$MNT/rand" <<'PY'
import os, random, sys
seed = int.from_bytes(os.urandom(4), "little")
print(f"seed {seed}")
rng = random.Random(seed)
ref = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
rd = os.open(sys.argv[2], os.O_RDONLY)
span = 96 << 20
blob = os.urandom(4 << 20)
for i in range(2500):
    n = rng.choice([1, 3, 511, 4096, 4095, 65536, 100_000, 1 << 20, 3 << 20])
    off = rng.randrange(0, span)
    if rng.random() < 0.1:
        off -= off % 4096
    s = rng.randrange(0, len(blob) - n + 1)
    data = blob[s:s + n]
    if os.pwrite(fd, data, off) != n:
        sys.exit(f"short write of {n} at {off}")
    os.pwrite(ref, data, off)
    if i % 5 == 0:
        size = os.fstat(ref).st_size
        if os.fstat(fd).st_size != size:
            sys.exit(f"after write {i}: size {os.fstat(fd).st_size}, want {size}")
        for f in (fd, rd):
            rn = rng.choice([1, 4096, 70_000, 2 << 20])
            ro = rng.randrange(0, size + 10)
            a, b = os.pread(ref, rn, ro), os.pread(f, rn, ro)
            if a != b:
                sys.exit(f"after write {i}: read {rn} at {ro} differs ({len(a)} vs {len(b)} bytes)")
os.close(fd); os.close(rd); os.close(ref)
PY
same_bytes "$T/ref" "$MNT/rand"
drop_caches
same_bytes "$T/ref" "$MNT/rand"

# Overwrite in place through a second open of the now-closed file.
$PY - "$T/ref" "$MNT/rand" <<'PY'
import os, random, sys
rng = random.Random(7)
for p in sys.argv[1:]:
    fd = os.open(p, os.O_WRONLY)
    r = random.Random(7)
    for i in range(200):
        off = r.randrange(0, 90 << 20)
        os.pwrite(fd, bytes([i % 251]) * r.randrange(1, 70_000), off)
    os.close(fd)
PY
same_bytes "$T/ref" "$MNT/rand"
remount_fs
same_bytes "$T/ref" "$MNT/rand"
check_backend
umount_fs
check_log
