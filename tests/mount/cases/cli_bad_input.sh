#!/usr/bin/env bash
# `ckptfs mount` refuses bad input with a non-zero exit, exactly one line
# on stderr naming the problem, and nothing mounted or left running:
# unknown option, missing or absent mount point, non-empty mount point,
# already-mounted mount point, unwritable state dir, bad size strings,
# nonexistent backend, bad --fsync value, a backend inside a reserved
# directory, a drain timeout that is not a number of seconds.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

_our_fuse_mounts() { awk -v t="$T/" 'index($2, t) == 1 && $3 ~ /^fuse/ { print $2 }' /proc/mounts; }

# expect_refusal PATTERN MOUNTPOINT_TO_CHECK ARGS...
expect_refusal() {
  local pat=$1 target=$2 rc=0 lines
  shift 2
  "$CKPTFS" "$@" > "$T/out" 2> "$T/err" < /dev/null || rc=$?
  [ "$rc" != 0 ] || fail "ckptfs $* succeeded"
  lines=$(wc -l < "$T/err")
  [ "$lines" = 1 ] || fail "ckptfs $*: $lines lines on stderr, want 1: $(cat "$T/err")"
  grep -Eqi -- "$pat" "$T/err" || fail "ckptfs $*: stderr does not mention /$pat/: $(cat "$T/err")"
  [ ! -s "$T/out" ] || fail "ckptfs $*: wrote to stdout: $(cat "$T/out")"
  if [ -n "$target" ] && is_mounted "$target"; then fail "ckptfs $*: $target is mounted after the failure"; fi
  [ -z "$(_our_fuse_mounts)" ] || fail "ckptfs $*: left mounts: $(_our_fuse_mounts)"
  sleep 0.2
  [ -z "$(_our_daemons)" ] || fail "ckptfs $*: left a daemon running: $(_our_daemons)"
  note "ok: ckptfs $* -> $(cat "$T/err")"
}

base=(--backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER")
expect_refusal '--bogus' "$MNT" mount "$MNT" "${base[@]}" --bogus
expect_refusal 'mount ?point' "" mount "${base[@]}"
expect_refusal "$T/absent" "$T/absent" mount "$T/absent" "${base[@]}"
mkdir "$T/full"; echo x > "$T/full/file"
expect_refusal 'not empty|non-empty' "$T/full" mount "$T/full" "${base[@]}"
expect_refusal '12XB' "$MNT" mount "$MNT" "${base[@]}" --cache-size 12XB
expect_refusal '-5G|size' "$MNT" mount "$MNT" "${base[@]}" --cache-size -5G
expect_refusal 'G4|size' "$MNT" mount "$MNT" "${base[@]}" --cache-size G4
expect_refusal '0|size' "$MNT" mount "$MNT" "${base[@]}" --cache-size 0
expect_refusal '150%|size' "$MNT" mount "$MNT" "${base[@]}" --cache-size 150%
expect_refusal "$T/no-backend" "$MNT" mount "$MNT" --backend "$T/no-backend" --state-dir "$STATE" --tier-dir "$TIER"
echo regular > "$T/regular"
expect_refusal "$T/regular|state" "$MNT" mount "$MNT" --backend "$BACKEND" --state-dir "$T/regular/state" --tier-dir "$TIER"
expect_refusal "$T/regular|backend" "$MNT" mount "$MNT" --backend "$T/regular" --state-dir "$STATE" --tier-dir "$TIER"
expect_refusal 'fsync|sometimes' "$MNT" mount "$MNT" "${base[@]}" --fsync sometimes
# A backend inside another mount's staging area: its files would be that mount's leftovers.
mkdir -p "$BACKEND/.ckptfs-tmp"
expect_refusal 'keeps for itself' "$MNT" mount "$MNT" --backend "$BACKEND/.ckptfs-tmp" --state-dir "$STATE" --tier-dir "$TIER"
rmdir "$BACKEND/.ckptfs-tmp"
# A timeout that is no number of seconds (nan passed CLI11's check: no timeout at all).
expect_refusal 'nan.*seconds' "" drain "$MNT" --timeout nan
expect_refusal 'seconds' "" drain "$MNT" --timeout -1
if [ "$(id -u)" = 0 ]; then
  # A read-only state dir (root ignores mode bits, not a read-only mount).
  mkdir -p "$T/ro/state"
  mount --bind "$T/ro" "$T/ro"
  mount -o remount,ro,bind "$T/ro"
  expect_refusal "$T/ro/state|read-only|state" "$MNT" mount "$MNT" --backend "$BACKEND" --state-dir "$T/ro/state" --tier-dir "$TIER"
  umount "$T/ro"
fi

# Already mounted: the second mount fails and the first keeps working.
mount_fs
echo alive > "$MNT/f"
"$CKPTFS" mount "$MNT" "${base[@]}" > "$T/out" 2> "$T/err" && fail "second mount on $MNT succeeded"
[ "$(wc -l < "$T/err")" = 1 ] || fail "already mounted: want one line, got: $(cat "$T/err")"
grep -qi 'mounted' "$T/err" || fail "already mounted: $(cat "$T/err")"
expect_eq 1 "$(awk -v m="$MNT" '$2 == m' /proc/mounts | wc -l)" "mount entries at $MNT"
expect_eq alive "$(cat "$MNT/f")" "first mount still serves"
# The same state dir for a second mount point is refused too (one daemon per state dir).
mkdir "$T/mnt2"
if "$CKPTFS" mount "$T/mnt2" "${base[@]}" > "$T/out" 2> "$T/err"; then
  fusermount3 -u "$T/mnt2"
  fail "a second daemon started on a state dir in use"
fi
[ "$(wc -l < "$T/err")" = 1 ] || fail "state dir in use: want one line, got: $(cat "$T/err")"
is_mounted "$T/mnt2" && fail "mnt2 mounted"
expect_eq alive "$(cat "$MNT/f")" "first mount still serves after the refused second daemon"
umount_fs

# umount of something that is not a ckptfs mount.
rc=0; "$CKPTFS" umount "$T/full" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "ckptfs umount of a plain dir succeeded"
[ "$(wc -l < "$T/err")" = 1 ] || fail "umount of a plain dir: $(cat "$T/err")"
# The refused second daemon says why in the shared log.
check_log --allow-errors "in use by another ckptfs daemon|meta/LOCK"
