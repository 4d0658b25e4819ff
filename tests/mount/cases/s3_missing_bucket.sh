#!/usr/bin/env bash
# An S3 backend that is not there fails the mount before anything is
# mounted, with one clear line and a non-zero exit: a bucket that does not
# exist, an endpoint where nothing listens, an invalid bucket name, and
# --s3-endpoint with a directory backend. No mount, no daemon is left, and
# the same state dir then mounts the real bucket.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start

# Runs `ckptfs mount MNT ARGS`, expecting failure with a message matching
# $1 on one line of stderr.
expect_mount_fails() {
  local want=$1 rc=0
  shift
  "$CKPTFS" mount "$MNT" --state-dir "$STATE" --tier-dir "$TIER" --cache-size 64M "$@" > "$T/out" 2> "$T/err" || rc=$?
  [ "$rc" != 0 ] || fail "mount $* succeeded"
  ! is_mounted || fail "$MNT is mounted after a failed mount ($*)"
  expect_no_daemon
  expect_eq 1 "$(wc -l < "$T/err")" "lines of stderr ($(cat "$T/err"))"
  grep -Eq "$want" "$T/err" || fail "message for $* does not match '$want': $(cat "$T/err")"
  note "$(cat "$T/err")"
}
_STATE_DIRS=("$STATE")

expect_mount_fails "^ckptfs: backend s3://no-such-bucket/x: no bucket 'no-such-bucket' at $S3_ENDPOINT\$" \
  --backend s3://no-such-bucket/x --s3-endpoint "$S3_ENDPOINT"
grep -q "no such bucket at $S3_ENDPOINT (HTTP 404 NoSuchBucket)" "$STATE/ckptfs.log" || fail "log does not say NoSuchBucket"
t0=$SECONDS
expect_mount_fails "^ckptfs: backend s3://$S3_BUCKET/x: cannot use http://127.0.0.1:1: .*unreachable" \
  --backend "s3://$S3_BUCKET/x" --s3-endpoint http://127.0.0.1:1
[ $((SECONDS - t0)) -lt 30 ] || fail "an unreachable endpoint took $((SECONDS - t0)) s to fail"
expect_mount_fails "^ckptfs: backend s3://Bad\\*Bucket/x: invalid bucket name 'Bad\\*Bucket'" \
  --backend 's3://Bad*Bucket/x' --s3-endpoint "$S3_ENDPOINT"
AWS_ENDPOINT_URL=ftp://127.0.0.1:1 expect_mount_fails "endpoint 'ftp://127.0.0.1:1' must start with http" \
  --backend "s3://$S3_BUCKET/x"
expect_mount_fails "^ckptfs: --s3-endpoint is for s3:// backends" --backend "$BACKEND" --s3-endpoint "$S3_ENDPOINT"

# The bucket is there: the same state dir mounts.
mount_s3 x --cache-size 64M
echo ok > "$MNT/f"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null
s3c get x/f "$T/f" || fail "GET x/f"
expect_eq ok "$(cat "$T/f")" "object after the failed attempts"
umount_fs
check_log --allow-errors "s3 backend: |s3 config: |backend s3://"
