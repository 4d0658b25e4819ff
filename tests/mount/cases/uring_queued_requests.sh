#!/usr/bin/env bash
# Requests the kernel queued while every entry of a CPU's io_uring queue
# was taken are answered even when every request the daemon holds is one
# answered later (here: writes waiting for tier space). The kernel hands a
# queued request only to an entry that is committed, never to one the
# daemon adds; with one thread per queue and every writer on CPU 0, a
# burst of writes queues a CREATE (which holds the directory's lock) behind
# writes that wait for the drain, and `ls` of the directory then waited
# for as long as the drain did.
# serial: asserts that ls answers within 5 s while writers wait (timing)
# asan: requests queued behind writes waiting for space, answered through one ring thread per queue
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

[ "$(nproc)" -ge 2 ] || skip "needs 2 CPUs"
touch "$T/pause"
CKPTFS_URING_THREADS=1 CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 8M
at_exit 'rm -f "$T/pause"'
wait_uring
"$CKPTFS" status "$MNT" --json > "$T/st0.json"
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["fuse_io_uring"]["active"] else 77)' "$T/st0.json" \
  || skip "requests do not come over io_uring here"
head -c 8M /dev/urandom > "$T/fill"
cp "$T/fill" "$MNT/fill"
# 48 x 128 KiB: together they fit once the fill drains and is evicted (more
# than the budget could be held by writers between their write and close: ENOSPC).
head -c 128K /dev/urandom > "$T/small"
pids=()
for i in $(seq 1 48); do
  taskset -c 0 dd if="$T/small" of="$MNT/f$i" bs=128K status=none 2> "$T/dd$i.err" &
  pids+=($!)
done
sleep 3
waiting=$(alive "${pids[@]}")
[ "$waiting" -ge 40 ] || fail "only $waiting writers waiting: the tier did not fill"
expect_answers 5 "writers wait for space" taskset -c 0
rm -f "$T/pause"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || fail "writer $((i + 1)) failed: $(cat "$T/dd$((i + 1)).err")"
done
"$CKPTFS" drain "$MNT" --timeout 120
for i in $(seq 1 48); do cmp -s "$T/small" "$BACKEND/f$i" || fail "backend f$i wrong"; done
umount_fs
check_log --allow-warnings "tier: "
