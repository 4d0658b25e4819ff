#!/usr/bin/env bash
# `ckptfs mount --foreground` serves without daemonizing (the process we
# started is the daemon, logging to stderr too) and exits 0 after `ckptfs
# umount`; --log-level debug adds D lines, --log-level error leaves out
# I lines; -o passes FUSE options through.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

_STATE_DIRS+=("$STATE")
"$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" \
  --cache-size 256M --foreground --log-level debug > "$T/fg.out" 2> "$T/fg.err" &
fg=$!
for _ in $(seq 100); do is_mounted && break; kill -0 "$fg" 2>/dev/null || break; sleep 0.1; done
is_mounted || { cat "$T/fg.err" >&2; fail "--foreground never mounted"; }
kill -0 "$fg" || fail "--foreground process exited while mounted"
echo hello > "$MNT/f"
expect_eq hello "$(cat "$MNT/f")" "I/O on a foreground mount"
"$CKPTFS" umount "$MNT" > /dev/null 2>&1 || fail "ckptfs umount of a foreground mount failed"
rc=0
for _ in $(seq 100); do kill -0 "$fg" 2>/dev/null || break; sleep 0.1; done
kill -0 "$fg" 2>/dev/null && fail "--foreground process still running after umount"
wait "$fg" || rc=$?
expect_eq 0 "$rc" "exit status of the foreground daemon"
grep -Eq '^[0-9T:.-]+ D ' "$STATE/ckptfs.log" || fail "--log-level debug: no D lines in the log"
[ -s "$T/fg.err" ] || fail "--foreground wrote nothing to stderr"

: > "$STATE/ckptfs.log"
mount_fs --cache-size 256M --log-level error -o noatime
findmnt -n -o OPTIONS -M "$MNT" | grep -qw noatime || fail "-o noatime not passed: $(findmnt -n -o OPTIONS -M "$MNT")"
echo x > "$MNT/g"
umount_fs
if grep -Eq '^[0-9T:.-]+ [ID] ' "$STATE/ckptfs.log"; then fail "--log-level error still logs I/D lines: $(grep -E ' [ID] ' "$STATE/ckptfs.log" | head -3)"; fi
check_log
