#!/usr/bin/env bash
# Credentials in the backend URL (s3://KEY:SECRET@bucket/prefix, a
# percent-encoded secret, file://user:pw@/path, and a secret whose '/' was
# not encoded) are refused with one line that never echoes them, a non-zero
# exit and nothing mounted; and the secret appears nowhere: not on stdout or
# stderr, not in the state dir's log, not in /proc/mounts. Then a good
# mount shows the URL without userinfo in the mount table, the "mounted"
# line and `ckptfs status`. No S3 server is needed: the refusal comes first.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

SECRET=s3cr3t
KEYID=AKIAEXAMPLE

# refused URL: mount --backend URL must fail without echoing any secret.
refused() {
  local url=$1 rc=0
  AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y "$CKPTFS" mount "$MNT" --backend "$url" --state-dir "$STATE" \
    --tier-dir "$TIER" --cache-size 64M --s3-endpoint http://127.0.0.1:1 > "$T/out" 2> "$T/err" < /dev/null || rc=$?
  [ "$rc" != 0 ] || fail "mount --backend <url with credentials> succeeded"
  ! is_mounted || fail "$MNT is mounted after the refusal"
  [ "$(wc -l < "$T/err")" = 1 ] || fail "want one line on stderr, got: $(cat "$T/err")"
  grep -q "credentials in the backend URL are not accepted" "$T/err" || fail "message does not say why: $(cat "$T/err")"
  for f in "$T/out" "$T/err" /proc/mounts "$STATE/ckptfs.log"; do
    [ -f "$f" ] || continue
    if grep -aq -e "$SECRET" -e "$KEYID" -e "pw@" "$f"; then
      fail "the secret leaked into $f: $(grep -a -e "$SECRET" -e "$KEYID" -e "pw@" "$f" | head -n 3)"
    fi
  done
  note "ok: $(cat "$T/err")"
}

mkdir -p "$STATE"
refused "s3://$KEYID:$SECRET@bucket/prefix"
refused "s3://$KEYID:$SECRET%2Fx@bucket"
refused "s3://$KEYID:$SECRET/x@bucket/prefix"    # a '/' in the secret, not encoded
refused "s3://$KEYID@bucket/prefix"              # a key alone is userinfo too
refused "file://user:$SECRET@/$BACKEND"
refused "file://user:pw@localhost$BACKEND"
refused "http://user:$SECRET@host/x"

# A good mount: the URL shown everywhere is the one given, without userinfo.
mount_fs --backend "file://$BACKEND"
grep -q "ckptfs: mounted $MNT (backend file://$BACKEND" "$T/mount.out" || fail "mounted line: $(cat "$T/mount.out")"
grep -q "^ckptfs:file://$BACKEND $MNT fuse.ckptfs" /proc/mounts || fail "mount table: $(grep "$MNT" /proc/mounts)"
"$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; b=json.load(sys.stdin)["backend"]; assert b == sys.argv[1], b' \
  "file://$BACKEND" || fail "status backend"
echo x > "$MNT/f"
umount_fs
! grep -aq -e "$SECRET" -e "$KEYID" "$STATE/ckptfs.log" || fail "the secret is in the log"
check_log --allow-errors "credentials in the backend URL"
