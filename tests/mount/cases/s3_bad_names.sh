#!/usr/bin/env bash
# Names an S3 bucket cannot hold are refused when made, not found at drain
# time (issue #16 item 4): a key is at most 1024 bytes of UTF-8, prefix
# included. A non-UTF-8 name used to wedge the drain for good (S3 400,
# retried for ever); now the create fails with EILSEQ, a path past the key
# limit with ENAMETOOLONG, and the rest drains.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
P=team/ckpts

mount_s3 "$P" --cache-size 64M
expect_errno EILSEQ open "$MNT/caf"$'\xe9'".pt" w,creat
expect_errno EILSEQ mkdir "$MNT/bad"$'\xff\xfe'
expect_ok open "$MNT/café.pt" w,creat
long=$(printf 'x%.0s' $(seq 250))
mkdir -p "$MNT/$long/$long/$long/$long"
# 4 x 251 bytes of directories + the prefix "team/ckpts/" leave room for 8 more.
expect_errno ENAMETOOLONG open "$MNT/$long/$long/$long/$long/$(printf 'n%.0s' $(seq 30)).pt" w,creat
expect_ok open "$MNT/$long/$long/$long/$long/s.pt" w,creat
echo data > "$MNT/model.pt"
"$CKPTFS" drain "$MNT" --timeout 60 || fail "drain"
s3c get "$P/model.pt" "$T/got" || fail "GET model.pt"
[ "$(cat "$T/got")" = data ] || fail "model.pt not in the bucket"
umount_fs
check_log
