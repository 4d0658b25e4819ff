#!/usr/bin/env bash
# A write that must first copy a sealed version aside (the drain has not
# published it yet) copies on a thread of its own, not on the request
# thread that received it: the kernel may already have handed that thread
# other requests (fs/fuse/fuse_uring.h), which would wait for the whole copy.
# Measured before: a lookup of an unrelated path waited 0.8–6 s behind the
# copy of a 2 GiB version (tests/bench/fsync_latency.py), with replies
# yielding the CPU (the default) nearly every time.
#
# With the drain paused and --fsync memory, a 512 MiB file is written and
# fsynced, and a prober thread stats missing names in another directory
# (each a LOOKUP) while one more 1 MiB write lands at the end: lookups must
# go on while that write waits for its copy. Then the bytes are right, in
# the mount and, once the drain resumes, in the backend.
# tsan: writes queued to the copier threads and replied from there, lookups on the ring threads meanwhile
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

SIZE=$((512 << 20))
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 1600M --fsync memory
at_exit 'rm -f "$T/pause"'
mkdir "$MNT/other"

cat > "$T/copy.py" <<'PY'
import os, sys, threading, time
path, other, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
block = bytes(range(256)) * 4096  # 1 MiB
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(size // len(block)):
    os.write(fd, block)
samples, stop = [], threading.Event()
def probe():
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            os.stat(f"{other}/missing-{i}")
        except FileNotFoundError:
            pass
        samples.append((t0, time.perf_counter()))
        i += 1
        time.sleep(0.001)
t = threading.Thread(target=probe, daemon=True)
t.start()
time.sleep(0.05)
os.fsync(fd)  # seals this version; the paused drain keeps it pending
w0 = time.perf_counter()
os.pwrite(fd, b"\xee" * len(block), size)  # first change since the seal: copies it aside
w1 = time.perf_counter()
time.sleep(0.02)
stop.set()
t.join()
os.close(fd)
inside = [b - a for a, b in samples if a >= w0 and b <= w1]
slowest = max((b - a for a, b in samples if a < w1 and b > w0), default=0)
print(f"write {1000 * (w1 - w0):.1f} ms, {len(inside)} lookups inside it, slowest overlapping {1000 * slowest:.1f} ms")
# A copy of 512 MiB takes 0.2-1.5 s here; lookups every ~1 ms.
if w1 - w0 > 0.1 and (len(inside) < 5 or slowest > (w1 - w0) / 2):
    sys.exit(f"lookups stopped while the write copied: {len(inside)} in {1000 * (w1 - w0):.0f} ms")
PY
timeout -k 5 300 $PY "$T/copy.py" "$MNT/model.pt" "$MNT/other" "$SIZE" || fail "lookups were held by the copy"

# The bytes: the 512 MiB pattern, then the 1 MiB written after the fsync.
$PY - "$MNT/model.pt" "$SIZE" <<'PY' || fail "the file's bytes are wrong"
import sys
path, size = sys.argv[1], int(sys.argv[2])
block = bytes(range(256)) * 4096
with open(path, "rb") as f:
    for i in range(size // len(block)):
        assert f.read(len(block)) == block, f"block {i}"
    assert f.read() == b"\xee" * len(block), "the write after the fsync"
PY
rm -f "$T/pause"
check_backend
same_bytes "$MNT/model.pt" "$BACKEND/model.pt"
umount_fs
check_log
echo "PASS: $CASE"
