#!/usr/bin/env bash
# Sticky read-only (issue #16): a metadata write fails (the fault meta.write,
# common/failpoint.h, as a failing state-dir disk: RocksDB refuses every
# later write until reopened). The mount turns read-only: changes get an
# error, reads work, the status says `read_only`. The drain stops (one log
# line; it cannot record progress, so it would upload the same file again
# each round), `ckptfs umount` refuses within seconds with one line naming
# --no-drain instead of waiting for ever, `ckptfs drain` too, and `ckptfs
# umount --no-drain` unmounts. With the disk fixed, the next mount drains
# what was logged.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"  # the drain holds until the store has failed
CKPTFS_FAULT=meta.write:$T/fault CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs
head -c 3M /dev/urandom > "$T/a.ref"
cp "$T/a.ref" "$MNT/a"

touch "$T/fault"
if touch "$MNT/b" 2> "$T/err"; then fail "a create succeeded while metadata writes fail"; fi
"$CKPTFS" status "$MNT" --json > "$T/status.json" || fail "ckptfs status --json failed"
ro=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["read_only"])' "$T/status.json")
[ -n "$ro" ] || fail "status has no read_only reason after a failed metadata write"
note "read_only: $ro"
if echo x 2> /dev/null > "$MNT/c"; then fail "a create succeeded on a read-only mount"; fi
cmp "$T/a.ref" "$MNT/a" || fail "a does not read back on the read-only mount"
rm "$T/pause"
sleep 2  # the drain takes its turn: it must stand still, not retry for ever

for cmd in "umount" "drain"; do
  rc=0
  start=$(date +%s)
  timeout 10 "$CKPTFS" $cmd "$MNT" > "$T/out" 2> "$T/err.$cmd" || rc=$?
  [ "$rc" != 124 ] || fail "ckptfs $cmd of a read-only mount still waits after 10 s"
  [ "$rc" != 0 ] || fail "ckptfs $cmd of a read-only mount exited 0"
  err=$(cat "$T/err.$cmd")
  expect_eq 1 "$(wc -l < "$T/err.$cmd")" "lines on stderr of ckptfs $cmd ($err)"
  grep -qF "mount is read-only (" <<< "$err" || fail "ckptfs $cmd does not say read-only: $err"
  grep -qF "the drain cannot record progress" <<< "$err" || fail "ckptfs $cmd: $err"
  note "$cmd: rc $rc in $(($(date +%s) - start)) s: $err"
  is_mounted || fail "ckptfs $cmd unmounted"
done
grep -qF -- "use \`ckptfs umount --no-drain\`, fix the disk and mount again" "$T/err.umount" \
  || fail "the umount refusal does not name --no-drain: $(cat "$T/err.umount")"
expect_eq 1 "$(grep -c 'drain: stopped, metadata write failed' "$STATE/ckptfs.log")" "drain stopped lines in the log"
"$CKPTFS" umount "$MNT" --no-drain > "$T/out" 2>&1 || fail "umount --no-drain of a read-only mount: $(cat "$T/out")"
! is_mounted || fail "still mounted after umount --no-drain"
wait_daemon_exit

# The disk is fixed: the next mount resumes the drain.
rm "$T/fault"
mount_fs
"$CKPTFS" status "$MNT" --json > "$T/status.json" || fail "ckptfs status --json failed"
expect_eq "" "$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["read_only"])' "$T/status.json")" \
  "read_only after a remount"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "drain after the remount"
cmp "$T/a.ref" "$BACKEND/a" || fail "a did not reach the backend after the remount"
echo ok > "$MNT/d" || fail "the remounted mount is not writable"
umount_fs
check_log --allow-errors "metadata write failed|rocksdb write of|drain: stopped|drain: seq .*Input/output error" \
  --allow-warnings "fault meta.write on"
