#!/usr/bin/env bash
# A damaged metadata log is refused, not "recovered" (issue #16 item 3).
# Four bytes overwritten in the middle of meta/*.log used to bring the mount
# up with half the closed checkpoints gone and their tier bytes deleted as
# "unknown ino". Now the mount is refused with one line naming the damage,
# and nothing in the tier is deleted. A torn tail (what a power loss
# leaves) is still tolerated. Tier files of no known inode (metadata
# replaced by hand) go to TIER/orphans/, counted by status, never deleted.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"  # nothing drains: the tier holds the only copy
# --prealloc 0: no spare file appears between the listing below and the kill.
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 256M --prealloc 0
for i in 1 2 3 4 5 6; do
  mkdir "$MNT/step_$i"
  head -c 64K /dev/urandom > "$MNT/step_$i/model.pt"
  echo "step_$i" > "$MNT/latest"
done
tier_before=$(cd "$TIER" && find . -type f ! -name '.*' | sort | xargs md5sum)
pid=$(_our_daemons | head -1)
kill -9 "$pid"
wait_daemon_exit "$pid" 2>/dev/null || sleep 1
fusermount3 -uz "$MNT" 2>/dev/null || true
log=$(ls -S "$STATE"/meta/*.log | head -1)
size=$(stat -c %s "$log")
[ "$size" -gt 4096 ] || fail "the WAL holds only $size bytes; the case needs records in the middle"
printf 'XXXX' | dd of="$log" bs=1 seek=$((size / 2)) conv=notrunc status=none
rc=0
"$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" --cache-size 256M \
  > "$T/out" 2> "$T/err" < /dev/null || rc=$?
[ "$rc" != 0 ] || fail "mount over a damaged WAL succeeded"
[ "$(wc -l < "$T/err")" = 1 ] || fail "want one line: $(cat "$T/err")"
grep -q "metadata in .* is damaged" "$T/err" || fail "stderr: $(cat "$T/err")"
grep -qF "$(basename "$log")" "$T/err" || fail "the refusal does not name the damaged $(basename "$log"): $(cat "$T/err")"
note "refused: $(cat "$T/err")"
! is_mounted "$MNT" || fail "left mounted"
[ "$(cd "$TIER" && find . -type f ! -name '.*' | sort | xargs md5sum)" = "$tier_before" ] \
  || fail "the refused mount changed the tier"

# A fresh state dir over the same tier: every tier file is of an unknown
# inode, the copies of `latest`'s older versions kept for the drain
# included. All go to orphans/, bytes intact, and status counts them.
files=$(cd "$TIER" && find . -type f ! -name '.*' | wc -l)
[ "$files" -gt 6 ] || fail "want snapshots of latest in the tier too; found $files files"
mount_fs --state-dir "$T/state-new" --cache-size 256M
n=$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["tier"]["orphans"])')
[ "$n" = "$files" ] || fail "status counts $n orphans, want all $files tier files"
"$CKPTFS" status "$MNT" | grep -q "^orphans .*$files tier files .*$TIER/orphans/" \
  || fail "the text status does not say where the orphans are: $("$CKPTFS" status "$MNT" | grep orphans)"
[ "$(cd "$TIER/orphans" && find . -type f | wc -l)" = "$files" ] || fail "orphans/ does not hold every file"
[ "$(cd "$TIER/orphans" && find . -type f -print0 | xargs -0 md5sum | awk '{print $1}' | sort)" = \
  "$(echo "$tier_before" | awk '{print $1}' | sort)" ] || fail "orphans/ bytes differ from the tier's before"
umount_fs
rm -f "$T/pause"
check_log --allow-errors "metadata|damaged|Corruption|cannot open" --allow-warnings "orphans|unknown ino|open for writing|daemon stopped"
