#!/usr/bin/env bash
# A backend that does not answer cannot keep the daemon from exiting
# (issue: item 9c). An open of an evicted file waits in a fetch that does
# not return (CKPTFS_FETCH_DELAY_MS: as a call into a hard-mounted NFS
# server gone); the daemon is told to stop (SIGTERM). Its shutdown waits
# for the backend at most 30 s (docs/operations.md, "Stopping"), logs why,
# unmounts and exits; the next mount serves the file again.
# serial: waits for the 30 s bound of the shutdown and checks it (timing)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 64M
head -c 1M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/f"
umount_fs  # drained, and the tier given back: f is remote at the next mount
CKPTFS_FETCH_DELAY_MS=600000 mount_fs --cache-size 64M
expect_eq remote "$(state_of "$MNT/f")" "f after the remount"
cat "$MNT/f" > /dev/null 2> "$T/cat.err" &
cpid=$!
at_exit 'kill "$cpid" 2>/dev/null'
sleep 1
pid=$(_our_daemons | head -1)
[ -n "$pid" ] || fail "no daemon"
kill -TERM "$pid"
start=$(date +%s)
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
took=$(($(date +%s) - start))
kill -0 "$pid" 2>/dev/null && fail "the daemon still runs $took s after SIGTERM, a fetch stuck in the backend"
[ "$took" -le 45 ] || fail "the daemon took $took s to exit"
grep -q "shutdown: still waiting on the backend" "$STATE/ckptfs.log" || fail "no log line said why it exited"
wait "$cpid" 2>/dev/null || true
! is_mounted || fail "$MNT still mounted after the daemon exited"
mount_fs --cache-size 64M
same_bytes "$T/ref" "$MNT/f"
umount_fs
check_log --allow-errors "shutdown: still waiting on the backend"
