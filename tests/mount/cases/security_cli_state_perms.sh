#!/usr/bin/env bash
# The state dir is private to the daemon's user: after a mount that wrote
# files and set xattrs, the state dir is 0700, every directory under it 0700
# and every file 0600, so uid 65534 cannot grep file names or xattr values
# out of meta/*.log. An existing state dir we own with a loose mode is
# tightened. A planted ckptfs.log symlink is refused (the file it points to
# is unchanged); a state dir owned by another user is refused, and so is a
# state dir that is a symlink owned by another user.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

refused() {  # PATTERN ARGS...: ckptfs mount ARGS must fail with one line naming PATTERN
  local pat=$1 rc=0
  shift
  "$CKPTFS" mount "$MNT" --backend "$BACKEND" --tier-dir "$TIER" --cache-size 64M "$@" \
    > "$T/out" 2> "$T/err" < /dev/null || rc=$?
  [ "$rc" != 0 ] || fail "mount $* succeeded"
  [ "$(wc -l < "$T/err")" = 1 ] || fail "mount $*: want one line on stderr: $(cat "$T/err")"
  grep -Eq -- "$pat" "$T/err" || fail "mount $*: stderr does not name /$pat/: $(cat "$T/err")"
  [ ! -s "$T/out" ] || fail "mount $*: wrote to stdout: $(cat "$T/out")"
  ! is_mounted "$MNT" || fail "mount $*: left $MNT mounted"
  note "ok: $(cat "$T/err")"
}

# An existing state dir with a loose mode (as earlier versions made it).
mkdir -m 0755 "$STATE"
mount_fs
mkdir "$MNT/secret-dir"
echo data > "$MNT/secret-dir/secret-file-name"
setfattr -n user.note -v secret-xattr-value "$MNT/secret-dir/secret-file-name"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1
expect_eq 700 "$(stat -c %a "$STATE")" "mode of the state dir (mounted)"
umount_fs
expect_eq 700 "$(stat -c %a "$STATE")" "mode of the state dir"
bad=$(find "$STATE" -mindepth 1 \( -type d ! -perm 0700 \) -o \( -type f ! -perm 0600 \) -printf '%m %p\n')
[ -z "$bad" ] || fail "loose modes under the state dir:
$bad"
grep -rqa secret-xattr-value "$STATE" || fail "the test is void: the xattr value is not in the state dir"
if as_nobody grep -rqa -e secret-xattr-value -e secret-file-name "$STATE" 2> /dev/null; then
  fail "uid 65534 can read the metadata"
fi
if as_nobody ls "$STATE" > /dev/null 2>&1; then fail "uid 65534 can list the state dir"; fi

# What an earlier version left loose is tightened at the next mount.
chmod 0755 "$STATE" "$STATE/meta"
chmod 0644 "$STATE/ckptfs.log" "$STATE"/meta/CURRENT
mount_fs
umount_fs
bad=$(find "$STATE" \( -type d ! -perm 0700 \) -o \( -type f ! -perm 0600 \) -printf '%m %p\n')
[ -z "$bad" ] || fail "loose modes left after a remount:
$bad"

# A fresh default-style state dir is created 0700.
mount_fs --state-dir "$T/fresh/state" --tier-dir "$TIER-fresh"
expect_eq 700 "$(stat -c %a "$T/fresh/state")" "mode of a new state dir"
umount_fs

# A planted log symlink: refused, the victim unchanged.
echo "victim content" > "$T/victim"
cp "$T/victim" "$T/victim.ref"
rm -f "$STATE/ckptfs.log"
ln -s "$T/victim" "$STATE/ckptfs.log"
refused "ckptfs.log.*symbolic link|symbolic link.*ckptfs.log" --state-dir "$STATE"
cmp -s "$T/victim" "$T/victim.ref" || fail "the symlink's target was written: $(cat "$T/victim")"
rm "$STATE/ckptfs.log"
mount_fs   # with the link gone, the state dir mounts again (a new log, 0600)
expect_eq 600 "$(stat -c %a "$STATE/ckptfs.log")" "mode of a new log"
umount_fs

# A state dir owned by another user.
mkdir -p "$T/foreign"
chown 65534:65534 "$T/foreign"
chmod 700 "$T/foreign"
refused "state dir .*owned by uid 65534" --state-dir "$T/foreign"
expect_eq 65534 "$(stat -c %u "$T/foreign")" "the foreign state dir keeps its owner"
expect_eq 700 "$(stat -c %a "$T/foreign")" "the foreign state dir keeps its mode"

# A state dir that is a symlink owned by another user (to a dir we own).
mkdir -m 0755 "$T/target"
mkdir -m 1777 "$T/sticky"
as_nobody ln -s "$T/target" "$T/sticky/state"
refused "state dir .*symbolic link owned by uid 65534" --state-dir "$T/sticky/state"
expect_eq 755 "$(stat -c %a "$T/target")" "the symlink's target keeps its mode"

check_log --allow-errors "symbolic link|owned by uid"
