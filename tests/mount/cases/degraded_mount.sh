#!/usr/bin/env bash
# A degraded mount (issue #12): after a daemon crash while the backend is
# unreachable, remounting the same state dir mounts anyway — one warning
# line, everything in the tier served, new writes kept, `ckptfs status`
# saying `backend unreachable since ...` — and when the backend comes back
# the drain completes with no remount. A fresh state dir with an unreachable
# backend is still refused (a typo must not look like an empty backend).
# POSIX: the backend directory moved away and back. S3: s3rver killed and
# restarted on the same port.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

# Mounts (args: the backend options) expecting a degraded mount.
mount_degraded() {
  "$CKPTFS" mount "$MNT" --state-dir "$STATE" --tier-dir "$TIER" --cache-size 256M "$@" > "$T/out" 2> "$T/err" \
    || fail "degraded mount refused: $(cat "$T/err")"
  expect_eq 1 "$(wc -l < "$T/err")" "lines of stderr of a degraded mount ($(cat "$T/err"))"
  grep -qF "warning: backend unreachable (" "$T/err" || fail "no degraded warning: $(cat "$T/err")"
  note "$(cat "$T/err")"
}

expect_unreachable() {
  "$CKPTFS" status "$MNT" > "$T/status" || fail "status of a degraded mount"
  grep -q "^backend    unreachable since 20" "$T/status" || fail "status does not say the backend is unreachable: $(cat "$T/status")"
}

# ---- POSIX ----
mount_fs --cache-size 256M
head -c 4M /dev/urandom > "$T/a"
head -c 3M /dev/urandom > "$T/c"
head -c 2M /dev/urandom > "$T/d"
cp "$T/a" "$MNT/a"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "first drain"
cp "$T/c" "$MNT/c"
crash_daemon  # c may or may not have reached the backend: it is in the tier either way
mv "$BACKEND" "$BACKEND.away"

# A fresh state dir is refused, and left fresh.
rc=0
"$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$T/fresh-state" --tier-dir "$TIER.fresh" \
  > "$T/out" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "a fresh state dir mounted with its backend missing"
! is_mounted || fail "mounted after the refusal"
grep -qF "does not exist" "$T/err" || fail "refusal does not say why: $(cat "$T/err")"
rm_tier "$TIER.fresh"

mount_degraded --backend "$BACKEND"
expect_unreachable
cmp "$T/a" "$MNT/a" || fail "a (persisted) does not read back from RAM while the backend is away"
cmp "$T/c" "$MNT/c" || fail "c (written before the crash) does not read back"
cp "$T/d" "$MNT/d" || fail "a write on a degraded mount"
mkdir "$MNT/sub" && echo hi > "$MNT/sub/e"
rc=0
"$CKPTFS" drain "$MNT" --timeout 2 > /dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "drain succeeded while the backend is away"
[ ! -e "$BACKEND" ] || fail "something created the backend directory: $(ls -la "$BACKEND")"

mv "$BACKEND.away" "$BACKEND"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "drain after the backend came back"
for f in a c d; do cmp "$T/$f" "$BACKEND/$f" || fail "$f did not reach the backend"; done
expect_eq hi "$(cat "$BACKEND/sub/e")" "sub/e in the backend"
"$CKPTFS" status "$MNT" > "$T/status"
! grep -q "^backend    unreachable" "$T/status" || fail "status still says unreachable: $(cat "$T/status")"
grep -qF "is back" "$STATE/ckptfs.log" || fail "no 'is back' line in the log"
umount_fs

# An empty mount with nothing to drain: the probe still notices the return.
mv "$BACKEND" "$BACKEND.away"
mount_degraded --backend "$BACKEND"
mv "$BACKEND.away" "$BACKEND"
for _ in $(seq 150); do
  "$CKPTFS" status "$MNT" > "$T/status"
  grep -q "^backend    unreachable" "$T/status" || break
  sleep 0.1
done
! grep -q "^backend    unreachable" "$T/status" || fail "with nothing to drain, the backend's return went unnoticed"
umount_fs
check_log --allow-errors "drain: seq .*(No such file|Input/output error)" \
  --allow-warnings "backend unreachable|not usable|cannot open backend|created but never closed"

# ---- S3 ----
source "$LIB/s3.sh"
s3_start
STATE=$T/state-s3
TIER=$TIER-s3
mount_s3 degraded --cache-size 256M
cp "$T/a" "$MNT/a"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "s3: first drain"
cp "$T/c" "$MNT/c"
crash_daemon
s3_kill
mount_degraded --backend "s3://$S3_BUCKET/degraded" --s3-endpoint "$S3_ENDPOINT"
expect_unreachable
cmp "$T/a" "$MNT/a" || fail "s3: a does not read back from RAM while the endpoint is down"
cmp "$T/c" "$MNT/c" || fail "s3: c does not read back"
cp "$T/d" "$MNT/d"
s3_restart
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "s3: drain after the endpoint came back"
for f in a c d; do
  s3c get "degraded/$f" "$T/got" || fail "s3: get $f"
  cmp "$T/$f" "$T/got" || fail "s3: $f in the bucket differs"
done
umount_fs
