#!/usr/bin/env bash
# mount(8) integration through mount-helpers/mount.ckptfs: `mount -t
# ckptfs BACKEND DIR -o cache_size=,state_dir=,tier_dir=` mounts (df shows
# the budget) and `umount DIR` unmounts and ends the daemon; an fstab line
# (mount -T FILE DIR) works the same; a bad option fails with nothing
# mounted; FUSE options pass through. Installs the helper as
# /sbin/mount.ckptfs for the test and restores what was there.
# serial: installs /sbin/mount.ckptfs (global), as s3_mount_helper does
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root
[ -w /sbin ] || skip "/sbin not writable"
command -v mount >/dev/null || skip "no mount(8)"

install_mount_helper
_STATE_DIRS+=("$STATE")

mount -t ckptfs "$BACKEND" "$MNT" -o "cache_size=256M,state_dir=$STATE,tier_dir=$TIER" \
  || fail "mount -t ckptfs failed"
expect_eq fuse.ckptfs "$(findmnt -n -o FSTYPE -M "$MNT")" "fs type"
expect_eq $((256 << 20)) "$(df_size_bytes)" "df size from cache_size=256M"
head -c 5M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/f"
same_bytes "$T/ref" "$MNT/f"
umount "$MNT" || fail "umount $MNT failed"
! is_mounted || fail "still mounted after umount"
wait_daemon_exit

# fstab, with the FUSE option `ro` passed through and noauto dropped.
cat > "$T/fstab" <<FSTAB
# test fstab
$BACKEND $MNT ckptfs noauto,cache_size=128M,state_dir=$STATE,tier_dir=$TIER,log_level=info 0 0
FSTAB
mount -T "$T/fstab" "$MNT" || fail "mount -T fstab failed"
expect_eq fuse.ckptfs "$(findmnt -n -o FSTYPE -M "$MNT")" "fs type (fstab)"
expect_eq $((128 << 20)) "$(df_size_bytes)" "df size from fstab"
same_bytes "$T/ref" "$MNT/f"
umount "$MNT" || fail "umount after fstab mount failed"
wait_daemon_exit

mount -t ckptfs "$BACKEND" "$MNT" -o "ro,cache_size=64M,state_dir=$STATE,tier_dir=$TIER" || fail "mount -o ro failed"
findmnt -n -o OPTIONS -M "$MNT" | grep -qw ro || fail "ro not passed to FUSE: $(findmnt -n -o OPTIONS -M "$MNT")"
same_bytes "$T/ref" "$MNT/f"
expect_errno EROFS open "$MNT/g" w,creat
umount "$MNT"
wait_daemon_exit

rc=0
mount -t ckptfs "$BACKEND" "$MNT" -o "cache_size=12XB,state_dir=$STATE,tier_dir=$TIER" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "mount -t ckptfs with a bad size succeeded"
grep -q 12XB "$T/err" || fail "bad size not reported: $(cat "$T/err")"
! is_mounted || fail "mounted after a failed mount -t ckptfs"
check_log
