#!/usr/bin/env bash
# Issue #16 item 12: a daemon running as root gives backend copies the
# owner, group and mode they have on the mount, so a user can read their
# own 0600 checkpoint in the backend (NFS) directly; a chown on the mount
# reaches the backend; directories and symlinks get their owner too.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

mount_fs
mkdir "$MNT/u"
chown 65534:65534 "$MNT/u"
as_nobody sh -c "umask 077; head -c 3M /dev/urandom > '$MNT/u/ckpt.pt'"
as_nobody mkdir -m 0750 "$MNT/u/step_1"
as_nobody sh -c "umask 077; echo shard > '$MNT/u/step_1/shard0'"
as_nobody ln -s ckpt.pt "$MNT/u/latest"
echo "root's" > "$MNT/rootfile"
chmod 0640 "$MNT/rootfile"
"$CKPTFS" drain "$MNT" --timeout 60

owner() { stat -c '%u:%g %a' "$1"; }
expect_eq "65534:65534 600" "$(owner "$BACKEND/u/ckpt.pt")" "owner of u/ckpt.pt"
expect_eq "65534:65534 755" "$(owner "$BACKEND/u")" "owner of u (chown replayed)"
expect_eq "65534:65534 750" "$(owner "$BACKEND/u/step_1")" "owner of u/step_1 (mkdir)"
expect_eq "65534:65534 600" "$(owner "$BACKEND/u/step_1/shard0")" "owner of the shard"
expect_eq "65534:65534" "$(stat -c '%u:%g' "$BACKEND/u/latest")" "owner of the symlink itself"
expect_eq "0:0 640" "$(owner "$BACKEND/rootfile")" "root's file"
as_nobody cat "$BACKEND/u/ckpt.pt" | cmp - "$MNT/u/ckpt.pt" || fail "the user cannot read their own 0600 file in the backend"
as_nobody cat "$BACKEND/u/step_1/shard0" > /dev/null || fail "the user cannot read their shard"

# chown/chgrp on the mount reach the backend.
chown 1234:4321 "$MNT/u/ckpt.pt"
chgrp 777 "$MNT/u/step_1"
"$CKPTFS" drain "$MNT" --timeout 60
expect_eq "1234:4321 600" "$(owner "$BACKEND/u/ckpt.pt")" "owner after chown"
expect_eq "65534:777 750" "$(stat -c '%u:%g %a' "$BACKEND/u/step_1")" "group after chgrp"

# A rewrite keeps the owner (the staged copy is chowned before its rename).
as_nobody true
echo "rewritten" >> "$MNT/u/ckpt.pt"
"$CKPTFS" drain "$MNT" --timeout 60
expect_eq "1234:4321 600" "$(owner "$BACKEND/u/ckpt.pt")" "owner after a rewrite"
cmp "$MNT/u/ckpt.pt" "$BACKEND/u/ckpt.pt" || fail "rewritten bytes differ"

umount_fs
check_log
