#!/usr/bin/env bash
# Wrong S3 credentials fail the mount before anything is mounted: a wrong
# access key (InvalidAccessKeyId), a wrong secret (SignatureDoesNotMatch)
# and no credentials at all each give one clear line on stderr and a
# non-zero exit, leave no mount and no daemon, and the secret given appears
# in no message and no log line. Credentials from a profile in
# ~/.aws/credentials (AWS_PROFILE) then mount, and the state dir the failed
# attempts used is fine.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
URL=s3://$S3_BUCKET/creds
SECRET=sekrit-DO-NOT-LOG-4711

# Runs `ckptfs mount` (env assignments first), expecting failure with a
# message matching $1 on one line of stderr.
expect_mount_fails() {
  local want=$1 rc=0
  shift
  env "$@" "$CKPTFS" mount "$MNT" --backend "$URL" --s3-endpoint "$S3_ENDPOINT" --state-dir "$STATE" \
    --tier-dir "$TIER" --cache-size 64M > "$T/out" 2> "$T/err" || rc=$?
  _STATE_DIRS=("$STATE")
  [ "$rc" != 0 ] || fail "mount with $* succeeded"
  ! is_mounted || fail "$MNT is mounted after a failed mount ($*)"
  expect_no_daemon
  expect_eq 1 "$(wc -l < "$T/err")" "lines of stderr ($(cat "$T/err"))"
  grep -Eq "$want" "$T/err" || fail "message for $* does not match '$want': $(cat "$T/err")"
  ! grep -q "$SECRET" "$T/err" "$T/out" "$STATE/ckptfs.log" || fail "the secret leaked: $(grep -h "$SECRET" "$T/err" "$T/out" "$STATE/ckptfs.log")"
  note "$(cat "$T/err")"
}

expect_mount_fails "^ckptfs: backend $URL: access denied by $S3_ENDPOINT .*AWS_ACCESS_KEY_ID" \
  AWS_ACCESS_KEY_ID=NOSUCHKEY AWS_SECRET_ACCESS_KEY="$SECRET"
expect_mount_fails "^ckptfs: backend $URL: access denied by $S3_ENDPOINT" \
  AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY="$SECRET"
mkdir -p "$T/home/.aws"
expect_mount_fails "^ckptfs: backend $URL: no AWS credentials .*AWS_ACCESS_KEY_ID" \
  -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$T/home"
grep -q "access denied (HTTP 403 InvalidAccessKeyId)" "$STATE/ckptfs.log" || fail "log does not say why (InvalidAccessKeyId)"
grep -q "access denied (HTTP 403 SignatureDoesNotMatch)" "$STATE/ckptfs.log" || fail "log does not say why (SignatureDoesNotMatch)"

# A profile in ~/.aws/credentials, the environment's keys unset.
cat > "$T/home/.aws/credentials" <<INI
[default]
aws_access_key_id = NOSUCHKEY
aws_secret_access_key = $SECRET

[ckpt]
aws_access_key_id = S3RVER
aws_secret_access_key = S3RVER
INI
(
  unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
  export HOME=$T/home AWS_PROFILE=ckpt
  mount_fs --backend "$URL" --s3-endpoint "$S3_ENDPOINT" --cache-size 64M
)
echo "profile works" > "$MNT/f"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null
s3c get creds/f "$T/f" || fail "GET creds/f"
expect_eq "profile works" "$(cat "$T/f")" "object written through a profile's credentials"
# Neither secret reaches the status document, the mount table or the log.
"$CKPTFS" status "$MNT" --json > "$T/status.json"
! grep -q -e "$SECRET" -e S3RVER "$T/status.json" /proc/mounts "$STATE/ckptfs.log" \
  || fail "credentials in status, mount table or log"
umount_fs
check_log --allow-errors "s3 backend: s3://$S3_BUCKET: access denied|s3 config: no AWS credentials|backend $URL: (access denied|no AWS credentials)"
