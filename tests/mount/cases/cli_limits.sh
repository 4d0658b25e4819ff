#!/usr/bin/env bash
# Size limits on the command line. `--cache-size ""`, 8000000T and other
# bad sizes are refused with one line; --max-file-size is checked (at least
# 1M) and defaults to 4 x the budget (status "max_file_size"; the mount
# helper maps -o max_file_size=); `truncate -s 100T` through the mount
# fails with EFBIG (File too large). A budget
# larger than the tier's filesystem (1G on a 64M tmpfs) is capped at that
# filesystem's size less a margin, with a one-line warning on stderr and in
# the log; then 200M written in 10 files through the capped budget all
# succeed (clean files are evicted once drained) and reach the backend.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

refused() {  # PATTERN ARGS...
  local pat=$1 rc=0
  shift
  "$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" "$@" \
    > "$T/out" 2> "$T/err" < /dev/null || rc=$?
  [ "$rc" != 0 ] || fail "mount $* succeeded"
  [ "$(wc -l < "$T/err")" = 1 ] || fail "mount $*: want one line on stderr: $(cat "$T/err")"
  grep -Eq -- "$pat" "$T/err" || fail "mount $*: stderr does not name /$pat/: $(cat "$T/err")"
  ! is_mounted || fail "mount $*: left $MNT mounted"
  note "ok: $(cat "$T/err")"
}

refused "size" --cache-size ""
refused "8000000T" --cache-size 8000000T
refused "99999999999999999999" --cache-size 99999999999999999999
refused "1GG" --cache-size 1GG
refused "0%" --cache-size 0%
refused "101%" --cache-size 101%
refused "max file size|512K" --cache-size 64M --max-file-size 512K
refused "size" --cache-size 64M --max-file-size ""
refused "max-file-size|size" --cache-size 64M --max-file-size 10%

# The default max file size: 4 x the budget.
mount_fs --cache-size 64M
expect_eq $((256 << 20)) "$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["max_file_size"])')" \
  "default max_file_size"
# Past it, through the mount: EFBIG, which truncate(1) prints as "File too large".
touch "$MNT/big"
expect_errno EFBIG truncate "$MNT/big" $((100 << 40))
if truncate -s 100T "$MNT/big" 2> "$T/err"; then fail "truncate -s 100T through the mount succeeded"; fi
grep -q "File too large" "$T/err" || fail "truncate -s 100T: want File too large, got: $(cat "$T/err")"
expect_eq 0 "$(size_of "$MNT/big")" "size of big after the refused truncates"
umount_fs
# Through the mount helper (mount -t ckptfs -o max_file_size=3G).
CKPTFS_BIN=$CKPTFS sh "$ROOT/mount-helpers/mount.ckptfs" "$BACKEND" "$MNT" \
  -o "max_file_size=3G,cache_size=64M,state_dir=$STATE,tier_dir=$TIER" > "$T/out" 2>&1 \
  || fail "mount.ckptfs -o max_file_size=3G: $(cat "$T/out")"
expect_eq $((3 << 30)) "$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["max_file_size"])')" \
  "max_file_size"
umount_fs

# A budget larger than the tier filesystem.
mkdir "$T/smalltier"
mount -t tmpfs -o size=64M tmpfs "$T/smalltier"
at_exit 'umount -l "$T/smalltier" 2>/dev/null'
"$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$T/smalltier/t" --cache-size 1G \
  > "$T/out" 2> "$T/err" || fail "mount with a capped budget: $(cat "$T/out" "$T/err")"
expect_eq 1 "$(wc -l < "$T/err")" "warning lines ($(cat "$T/err"))"
grep -q "cache size 1G is larger than the tier filesystem (64.0 MiB); using 60.0 MiB" "$T/err" \
  || fail "warning: $(cat "$T/err")"
grep -q "W .*cache size 1G is larger than the tier filesystem" "$STATE/ckptfs.log" || fail "no warning in the log"
budget=$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["tier"]["budget"])')
[ "$budget" -le $((64 << 20)) ] || fail "budget $budget is larger than the 64M tier filesystem"
expect_eq "$budget" "$(df_size_bytes)" "df size"
for i in $(seq 10); do
  head -c 20M /dev/urandom > "$T/ref"
  timeout 300 cp "$T/ref" "$MNT/f$i" || fail "writing f$i through the capped budget failed"
  cmp -s "$T/ref" "$MNT/f$i" || fail "f$i reads back wrong"
done
check_backend 300
umount_fs
check_log --allow-warnings "larger than the tier filesystem|tier: full"
