#!/usr/bin/env bash
# mount(8) with an S3 backend through mount-helpers/mount.ckptfs:
# `mount -t ckptfs s3://bucket/prefix DIR -o s3_endpoint=URL,...` mounts
# (credentials from the environment), files drain to the bucket; an fstab
# line with an s3:// source works the same; a wrong endpoint fails with the
# daemon's message and nothing mounted (a fresh state dir). Installs the helper as
# /sbin/mount.ckptfs for the test and restores what was there.
# serial: installs /sbin/mount.ckptfs (global), as mount_helper does
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
require_root
[ -w /sbin ] || skip "/sbin not writable"
command -v mount >/dev/null || skip "no mount(8)"
s3_start

install_mount_helper
_STATE_DIRS+=("$STATE")
OPTS="cache_size=64M,state_dir=$STATE,tier_dir=$TIER"

mount -t ckptfs "s3://$S3_BUCKET/helper" "$MNT" -o "s3_endpoint=$S3_ENDPOINT,$OPTS" || fail "mount -t ckptfs s3:// failed"
expect_eq fuse.ckptfs "$(findmnt -n -o FSTYPE -M "$MNT")" "fs type"
expect_eq "ckptfs:s3://$S3_BUCKET/helper" "$(findmnt -n -o SOURCE -M "$MNT")" "source in the mount table"
head -c 2M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/f"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null
s3c get helper/f "$T/got" || fail "GET helper/f"
cmp "$T/ref" "$T/got" || fail "helper/f differs in the bucket"
umount "$MNT" || fail "umount failed"
wait_daemon_exit

cat > "$T/fstab" <<FSTAB
s3://$S3_BUCKET/helper $MNT ckptfs noauto,_netdev,s3_endpoint=$S3_ENDPOINT,$OPTS 0 0
FSTAB
mount -T "$T/fstab" "$MNT" || fail "mount -T fstab with an s3:// source failed"
same_bytes "$T/ref" "$MNT/f"
umount "$MNT"
wait_daemon_exit

# A dead endpoint with a fresh state dir: refused, the daemon's message
# reaching the user. (The state dir above, which has history, would mount
# degraded instead: tests/mount/cases/degraded_mount.sh.)
FRESH_OPTS="cache_size=64M,state_dir=$T/state-fresh,tier_dir=$TIER-fresh"
_STATE_DIRS+=("$T/state-fresh")
_TIER_DIRS+=("$TIER-fresh")
rc=0
mount -t ckptfs "s3://$S3_BUCKET/helper" "$MNT" -o "s3_endpoint=http://127.0.0.1:1,$FRESH_OPTS" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "mount with a dead endpoint succeeded"
grep -q "cannot use http://127.0.0.1:1" "$T/err" || fail "the daemon's message did not reach the user: $(cat "$T/err")"
! is_mounted || fail "mounted after a failed mount -t ckptfs"

check_log --allow-errors "check: list s3://$S3_BUCKET/: Couldn.t connect|cannot use http://127\\.0\\.0\\.1:1"
