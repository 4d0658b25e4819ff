#!/usr/bin/env bash
# A write that finds the space waiter's queue full (issue: items 7 and 9b).
# The queue is bounded (256 MiB of copied writes; 1 byte here, through the
# test knob CKPTFS_WRITE_QUEUE_BYTES, so that one queued write fills it).
# With the drain stuck, 16 MiB of closed files fill a 16 MiB budget.
#
# 1. Two writers of 1 MiB each (new files, the copying path): the first is
#    queued, the second finds the queue full. Once the drain resumes, both
#    report 1 MiB written and both files hold their bytes. The request's
#    buffer used to be consumed by the copy into the refused job, and the
#    fallback then wrote 0 bytes (reported as a success) or failed EIO.
# 2. The same with the drain left stuck: the second writer gets ENOSPC
#    after a bounded wait (5 s, docs/operations.md) with a line in the log,
#    instead of holding a FUSE worker for the tier's 10-minute wait; the
#    first stays queued (off the FUSE workers) and finishes once the drain
#    resumes.
# serial: asserts that a parked write answers within 15 s (timing)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"
CKPTFS_WRITE_QUEUE_BYTES=1 CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 16M
at_exit 'rm -f "$T/pause"'

# fill N: closed files fill the budget; nothing can drain (paused).
fill() {
  head -c 4M /dev/urandom > "$T/pre"
  for i in 1 2 3 4; do dd if="$T/pre" of="$MNT/pre$1_$i" bs=1M status=none; done
}

# writer PATH BYTE: one write(2) of 1 MiB of BYTE into a new file (no
# O_TRUNC: the copying path, never passthrough). Prints "wrote N" or the
# errno's name, and how long the write took.
cat > "$T/writer.py" <<'PY'
import errno, os, sys, time
path, byte = sys.argv[1], sys.argv[2].encode()
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
t = time.monotonic()
try:
    n = os.write(fd, byte * (1 << 20))
    print(f"wrote {n} in {time.monotonic() - t:.1f}")
except OSError as e:
    print(f"{errno.errorcode[e.errno]} in {time.monotonic() - t:.1f}")
os.close(fd)
PY
writer() { timeout -k 5 180 $PY "$T/writer.py" "$1" "$2" > "$T/$(basename "$1").out" 2>&1; }
result() { cut -d' ' -f1-2 "$T/$1.out"; }

# 1. Queued, and refused by the full queue: both written once the drain resumes.
fill 1
writer "$MNT/a" a &
pa=$!
sleep 1
writer "$MNT/b" b &
pb=$!
sleep 2
rm -f "$T/pause"
wait "$pa" || fail "writer a: $(cat "$T/a.out")"
wait "$pb" || fail "writer b: $(cat "$T/b.out")"
expect_eq "wrote 1048576" "$(result a)" "the queued write"
expect_eq "wrote 1048576" "$(result b)" "the write that found the queue full"
head -c 1M /dev/zero | tr '\0' a > "$T/ref_a"
head -c 1M /dev/zero | tr '\0' b > "$T/ref_b"
same_bytes "$T/ref_a" "$MNT/a"
same_bytes "$T/ref_b" "$MNT/b"
"$CKPTFS" drain "$MNT" --timeout 120

# 2. The drain stays stuck: the write that finds the queue full gives up
# after a bounded wait, with a line in the log; the queued one waits on.
touch "$T/pause"
fill 2
writer "$MNT/c" c &
pc=$!
sleep 1
start=$(date +%s)
writer "$MNT/d" d &
pd=$!
for _ in $(seq 150); do kill -0 "$pd" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pd" 2>/dev/null; then
  fail "a write that found the queue full still waits after $(($(date +%s) - start)) s: it holds a FUSE worker"
fi
wait "$pd" || true
expect_eq "ENOSPC in" "$(result d)" "the write that found the queue full, with the drain stuck"
grep -q "queue of writes waiting for space is full" "$STATE/ckptfs.log" || fail "no log line said why the write failed"
kill -0 "$pc" 2>/dev/null || fail "the queued write did not wait: $(cat "$T/c.out")"
rm -f "$T/pause"
wait "$pc" || fail "writer c: $(cat "$T/c.out")"
expect_eq "wrote 1048576" "$(result c)" "the queued write, once the drain resumed"
head -c 1M /dev/zero | tr '\0' c > "$T/ref_c"
same_bytes "$T/ref_c" "$MNT/c"
"$CKPTFS" drain "$MNT" --timeout 120
same_bytes "$T/ref_a" "$BACKEND/a"
same_bytes "$T/ref_b" "$BACKEND/b"
same_bytes "$T/ref_c" "$BACKEND/c"
umount_fs
check_log --allow-warnings "tier: |queue of writes waiting for space is full"
