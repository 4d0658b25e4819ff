#!/usr/bin/env bash
# A full memory tier does not make the mount unresponsive (issue #16 item
# 9). With the drain stuck, 16 MiB of closed files fill a 16 MiB budget,
# and 64 more writers (128 KiB each: together they fit once the first files
# drain and are evicted) wait for the drain to make room. Waiting used to hold a FUSE worker each, and with 16
# workers `stat`, `ls` and `ckptfs status` then hung; now the waiting
# writes are parked on the space waiter and everything else answers. When
# the drain resumes, every writer finishes and every file reads back right.
# serial: asserts that writers still wait after 3 s and that stat/ls answer within 5 s (timing)
# asan: 64 writers answered by the space waiter once the drain resumes
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 16M
at_exit 'rm -f "$T/pause"'
head -c 4M /dev/urandom > "$T/ref"
for i in 1 2 3 4; do dd if="$T/ref" of="$MNT/pre$i" bs=1M status=none; done
head -c 128K /dev/urandom > "$T/small"
pids=()
for i in $(seq 1 64); do
  dd if="$T/small" of="$MNT/f$i" bs=128K status=none 2> "$T/dd$i.err" &
  pids+=($!)
done
sleep 3
# Writers are waiting: the budget is full and nothing can drain.
waiting=$(alive "${pids[@]}")
[ "$waiting" -ge 60 ] || fail "only $waiting writers waiting: the test did not fill the workers"
expect_answers 5 "writers wait for space"
timeout 10 getfattr -n user.ckptfs.state "$MNT/f1" > /dev/null || fail "getfattr did not answer"
mkdir "$MNT/still-works"
"$CKPTFS" status "$MNT" --json > "$T/st.json"
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["tier"]["waits"] > 0, j["tier"]' "$T/st.json" \
  || fail "status does not count the waiting writers"
rm -f "$T/pause"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || fail "writer $((i + 1)) failed: $(cat "$T/dd$((i + 1)).err")"
done
"$CKPTFS" drain "$MNT" --timeout 120
for i in 1 32 64; do cmp "$T/small" "$MNT/f$i" || fail "f$i reads back wrong"; done
cmp "$T/ref" "$MNT/pre1" || fail "pre1 reads back wrong"
for i in $(seq 1 64); do cmp -s "$T/small" "$BACKEND/f$i" || fail "backend f$i wrong"; done
umount_fs
check_log --allow-warnings "tier: "
