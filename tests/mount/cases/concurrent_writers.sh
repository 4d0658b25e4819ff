#!/usr/bin/env bash
# Two processes write different 256 MiB files at once (and a third reads a
# file meanwhile); both files compare equal to their references; then two
# writers append-free write disjoint halves of one file at once.
# tsan: writes to two files and one shared file on many FUSE workers at once, a read beside them
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
head -c 256M /dev/urandom > "$T/r1"
head -c 256M /dev/urandom > "$T/r2"
head -c 32M /dev/urandom > "$T/r3"
cp "$T/r3" "$MNT/reader"
dd if="$T/r1" of="$MNT/w1" bs=1M status=none & p1=$!
dd if="$T/r2" of="$MNT/w2" bs=4M status=none & p2=$!
for _ in 1 2 3; do cmp "$T/r3" "$MNT/reader" || { kill $p1 $p2 2>/dev/null; fail "reader saw wrong bytes during writes"; }; done
wait $p1 || fail "writer 1 failed"
wait $p2 || fail "writer 2 failed"
same_bytes "$T/r1" "$MNT/w1"
same_bytes "$T/r2" "$MNT/w2"

# One file, two writers on disjoint halves at the same time.
$PY - "$MNT/shared" "$T/r1" <<'PY'
import os, sys
src = open(sys.argv[2], "rb").read()[: 128 << 20]
half = len(src) // 2
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.ftruncate(fd, len(src))
os.close(fd)
pids = []
for part in range(2):
    pid = os.fork()
    if pid == 0:
        fd = os.open(sys.argv[1], os.O_WRONLY)
        for off in range(part * half, (part + 1) * half, 1 << 20):
            os.pwrite(fd, src[off:off + (1 << 20)], off)
        os.close(fd)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    _, st = os.waitpid(pid, 0)
    assert st == 0, st
assert open(sys.argv[1], "rb").read() == src, "two writers on one file: bytes differ"
PY
drop_caches
same_bytes "$T/r1" "$MNT/w1"
same_bytes "$T/r2" "$MNT/w2"
umount_fs
check_log
