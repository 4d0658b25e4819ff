#!/usr/bin/env bash
# Opening an evicted (remote) file fetches it from the backend on a fetcher
# thread, never on a FUSE worker (issue #10): with a slow backend (0.4 s per
# fetch), 64 readers open remote files at once — more than the 16 workers —
# while stat, ls and `ckptfs status` answer at once; every reader then gets
# the right bytes.
# serial: asserts that stat/ls/status answer within 1.5 s while fetches wait (timing)
# tsan: opens fetched on the fetcher threads while FUSE workers serve stat, ls and status
# asan: opens answered by the fetcher threads through the rings
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 256M
head -c 256K /dev/urandom > "$T/ref"
for i in $(seq 1 64); do cp "$T/ref" "$MNT/f$i"; done
umount_fs
rm_tier "$TIER"  # a node reboot: the files come back remote
CKPTFS_FETCH_DELAY_MS=400 mount_fs --cache-size 256M  # 64 fetches on 4 fetchers: 6.4 s
[ "$(state_of "$MNT/f1")" = remote ] || fail "f1 should be remote, is $(state_of "$MNT/f1")"
pids=()
for i in $(seq 1 64); do
  cmp "$T/ref" "$MNT/f$i" 2> "$T/r$i.err" &
  pids+=($!)
done
sleep 1
expect_answers 1.5 "opens wait for fetches"
waiting=0
for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && waiting=$((waiting + 1)); done
# More readers waiting than there are FUSE workers (16), or the check
# proved nothing.
[ "$waiting" -gt 16 ] || fail "only $waiting readers still waited after stat, ls and status answered"
note "$waiting readers still waiting for their fetch"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || fail "reader $((i + 1)): $(cat "$T/r$((i + 1)).err")"
done
[ "$(state_of "$MNT/f64")" = persisted ] || fail "f64 should be back in memory"
umount_fs
check_log
