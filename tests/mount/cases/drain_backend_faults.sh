#!/usr/bin/env bash
# The backend turns read-only, then disappears, mid-drain; when it comes
# back the drain resumes and nothing is lost. The error is logged once per
# episode and shown by `ckptfs status`.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

mount_fs --cache-size 1G
mkdir "$MNT/a"
for i in 1 2 3; do head -c 20M /dev/urandom > "$T/ref$i"; cp "$T/ref$i" "$MNT/a/f$i"; done
"$CKPTFS" drain "$MNT" --timeout 120

# Read-only: a bind mount of the backend remounted ro gives EROFS.
mount --bind "$BACKEND" "$BACKEND"
mount -o remount,ro,bind "$BACKEND"
head -c 30M /dev/urandom > "$T/ref4"
cp "$T/ref4" "$MNT/a/f4"
echo step_x > "$MNT/latest"
# The drain tries within moments; poll (30 s at most) rather than guess.
in_error() { "$CKPTFS" status "$MNT" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["drain"]["in_error"])'; }
for _ in $(seq 300); do [ "$(in_error)" = True ] && break; sleep 0.1; done
"$CKPTFS" status "$MNT" --json > "$T/st.json"
/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["drain"]["in_error"], s["drain"]
assert "Read-only" in s["drain"]["last_error"], s["drain"]
assert s["drain"]["queue"] >= 2, s["drain"]
' "$T/st.json"
if "$CKPTFS" drain "$MNT" --timeout 2 2> "$T/drain.err"; then fail "drain succeeded against a read-only backend"; fi
grep -q "timed out" "$T/drain.err" || fail "drain did not say it timed out: $(cat "$T/drain.err")"
[ ! -e "$BACKEND/latest" ] || fail "latest reached a read-only backend?"
umount "$BACKEND"
# Writable again: the error clears, so that the next one is a new episode.
for _ in $(seq 600); do [ "$(in_error)" = False ] && break; sleep 0.1; done
[ "$(in_error)" = False ] || fail "the drain did not recover once the backend was writable again"

# Gone: the backend directory is moved away, then back.
mv "$BACKEND" "$BACKEND.away"
head -c 10M /dev/urandom > "$T/ref5"
cp "$T/ref5" "$MNT/a/f5"
for _ in $(seq 300); do [ "$(in_error)" = True ] && break; sleep 0.1; done
[ "$(in_error)" = True ] || fail "status does not show the missing backend"
mv "$BACKEND.away" "$BACKEND"
"$CKPTFS" drain "$MNT" --timeout 120 || fail "drain did not resume"
for i in 1 2 3 4 5; do cmp "$T/ref$i" "$BACKEND/a/f$i" || fail "f$i differs in backend"; done
[ "$(cat "$BACKEND/latest")" = step_x ] || fail "latest missing"
[ "$(grep -c 'retrying with backoff' "$STATE/ckptfs.log")" -le 4 ] || fail "errors logged more than once per episode"
grep -q "healthy again" "$STATE/ckptfs.log" || fail "recovery not logged"
umount_fs
check_log --allow-errors "drain: seq"
