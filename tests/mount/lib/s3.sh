# shellcheck shell=bash
# s3.sh — sourced after common.sh by the S3 cases (tests/mount/cases/s3_*.sh):
# a private s3rver (tests/s3/s3rver.sh, strict SigV4) in $T/s3, stopped at
# exit, and a client of the test's own (lib/s3c.py, curl --aws-sigv4) to
# look at the bucket without ckptfs.
#
#   s3_start            start s3rver (skip, 77, when it is not installed);
#                       sets S3_PORT, S3_ENDPOINT, S3_BUCKET, S3_DATA and the
#                       AWS_* credentials the daemon and s3c.py use
#   s3_kill             SIGKILL the server (a crash: nothing flushed)
#   s3_restart          start it again on the same port and data directory
#   s3c ARGS...         lib/s3c.py (list, get, put, head, uploads, delete)
#   mount_s3 PREFIX [ARGS]   mount_fs --backend s3://$S3_BUCKET/PREFIX
#                            --s3-endpoint $S3_ENDPOINT ARGS
#   s3_uploads_on_disk  multipart uploads s3rver holds (its uploads dir)

S3_BUCKET=ckptfs-test
S3_DIR=$T/s3
S3_DATA=$S3_DIR/data
S3C="$PY $LIB/s3c.py"

# Nothing from the caller's AWS setup may leak in: only these credentials.
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION \
  AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE CKPTFS_S3_PART_SIZE CKPTFS_S3_PARALLEL \
  CKPTFS_S3_LIST_MAX_KEYS CKPTFS_S3_MAX_ATTEMPTS CKPTFS_S3_ADDRESSING
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 S3_BUCKET

s3_start() {
  local rc=0
  command -v curl >/dev/null || skip "no curl"
  S3_PORT=$("$ROOT/tests/s3/s3rver.sh" start "$S3_DIR" 0 "$S3_BUCKET" 2> "$T/s3rver.err") || rc=$?
  [ "$rc" = 77 ] && skip "s3rver not installed: $(cat "$T/s3rver.err")"
  [ "$rc" = 0 ] || fail "s3rver did not start: $(cat "$T/s3rver.err")"
  at_exit '"$ROOT/tests/s3/s3rver.sh" stop "$S3_DIR"'
  S3_ENDPOINT=http://127.0.0.1:$S3_PORT
  export S3_ENDPOINT S3_PORT
}

s3_kill() {
  kill -9 "$(cat "$S3_DIR/s3rver.pid")" 2>/dev/null || true
  rm -f "$S3_DIR/s3rver.pid"
}

s3_restart() {
  local p i
  for i in $(seq 50); do
    if p=$("$ROOT/tests/s3/s3rver.sh" start "$S3_DIR" "$S3_PORT" "$S3_BUCKET" 2> "$T/s3rver.err"); then
      [ "$p" = "$S3_PORT" ] || fail "s3rver restarted on port $p, not $S3_PORT"
      return 0
    fi
    sleep 0.1  # the port may take a moment to be free again
  done
  fail "s3rver did not restart on port $S3_PORT: $(cat "$T/s3rver.err")"
}

s3c() { $S3C "$@"; }

mount_s3() {
  local prefix=$1
  shift
  mount_fs --backend "s3://$S3_BUCKET/$prefix" --s3-endpoint "$S3_ENDPOINT" "$@"
}

s3_uploads_on_disk() {
  local d=$S3_DATA/$S3_BUCKET/._S3rver_uploads
  [ -d "$d" ] && ls -A "$d"
  return 0
}

# Fails unless no daemon serves $MNT within 5 s. One grep over
# /proc/*/cmdline: cheaper than common.sh's _our_daemons under load.
expect_no_daemon() {
  local _i
  for _i in $(seq 50); do
    # -q: a match counts even when another process vanished under grep
    # (exit 2 otherwise, which read as "no daemon").
    grep -qasP "mount\\x00\\Q$MNT\\E\\x00" /proc/[0-9]*/cmdline 2> /dev/null || return 0
    sleep 0.1
  done
  fail "a daemon still serves $MNT: $(grep -lasP "mount\\x00\\Q$MNT\\E\\x00" /proc/[0-9]*/cmdline)"
}
