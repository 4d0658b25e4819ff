#!/usr/bin/env bash
# A daemon stopped while requests wait for a later reply (SIGTERM, as
# systemd stops a busy mount) ends cleanly: with the drain paused, writers
# wait for tier space, and readers of remote files wait for slow fetches;
# then SIGTERM. The daemon gives them up and exits within seconds, its
# mount is gone, every waiting caller gets an answer (an error) instead of
# hanging, and the log ends with "unmounted". Over FUSE-io_uring the rings
# used to be freed at the end of the session loop, before the space waiter
# and the fetchers answered their requests into them: a use after free at
# every such stop (issue item 5), which the AddressSanitizer phase reports.
# asan: replies routed to the io_uring rings while the daemon stops (FuseUring::Stop after the repliers)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

# Files that come back remote: written, drained, the tier dropped.
mount_fs --cache-size 64M
head -c 256K /dev/urandom > "$T/ref"
for i in $(seq 1 8); do cp "$T/ref" "$MNT/r$i"; done
umount_fs
rm_tier "$TIER"

touch "$T/pause"
at_exit 'rm -f "$T/pause"'
# Fetches of 2 s each, on 4 fetchers.
CKPTFS_DRAIN_PAUSE_FILE=$T/pause CKPTFS_FETCH_DELAY_MS=2000 mount_fs --cache-size 16M
pid=$(_our_daemons | head -1)
[ -n "$pid" ] || fail "no daemon"
wait_uring
uring=$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["fuse_io_uring"]["active"])')
note "requests over io_uring: $uring"
# The tier full of dirty files the paused drain cannot free, then writers
# waiting for space.
head -c 4M /dev/urandom > "$T/big"
for i in 1 2 3 4; do dd if="$T/big" of="$MNT/pre$i" bs=1M status=none; done
head -c 128K /dev/urandom > "$T/small"
writers=()
for i in $(seq 1 32); do
  dd if="$T/small" of="$MNT/w$i" bs=128K status=none 2> "$T/dd$i.err" &
  writers+=($!)
done
for _ in $(seq 100); do
  [ "$(alive "${writers[@]}")" -ge 24 ] && break
  sleep 0.1
done
# Then readers of the remote files: each open waits for its fetch (slow,
# and then for space).
readers=()
for i in $(seq 1 8); do
  cat "$MNT/r$i" > /dev/null 2> "$T/cat$i.err" &
  readers+=($!)
done
sleep 1
nw=$(alive "${writers[@]}")
nr=$(alive "${readers[@]}")
[ "$nw" -ge 24 ] || fail "only $nw of 32 writers wait for space: the tier did not fill"
[ "$nr" -ge 6 ] || fail "only $nr of 8 readers wait for their fetch"
note "$nw writers wait for space, $nr readers for a fetch: SIGTERM"

kill -TERM "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2> /dev/null || fail "daemon $pid still running 60 s after SIGTERM"
# Every waiting caller is answered (an error: the daemon gave up).
for _ in $(seq 300); do
  [ "$(alive "${writers[@]}" "${readers[@]}")" = 0 ] && break
  sleep 0.1
done
left=$(alive "${writers[@]}" "${readers[@]}")
[ "$left" = 0 ] || fail "$left callers still wait 30 s after the daemon exited"
! _in_mount_table "$MNT" || fail "$MNT still mounted after the daemon exited"
tail -n 1 "$STATE/ckptfs.log" | grep -q "unmounted $MNT" \
  || fail "the daemon did not get to the end of its shutdown: $(tail -n 3 "$STATE/ckptfs.log")"
check_log --allow-warnings "tier: |fuse io_uring: queue [0-9]+: all" --allow-errors "fetch|give up|gave up|closed"
