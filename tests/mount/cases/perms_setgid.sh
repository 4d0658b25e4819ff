#!/usr/bin/env bash
# A new file or dir in a setgid directory takes the directory's group (and
# a new dir keeps the setgid bit), as on ext4/xfs; a file written by a
# non-owner loses its setuid bit.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root
command -v setpriv >/dev/null || skip "no setpriv"

mount_fs
mkdir "$MNT/sg"
chown 0:4242 "$MNT/sg"
chmod 2777 "$MNT/sg"
as_nobody sh -c "echo x > '$MNT/sg/f'; mkdir '$MNT/sg/d'"
expect_eq 65534:4242 "$(stat -c %u:%g "$MNT/sg/f")" "group of a file in a setgid dir"
expect_eq 65534:4242 "$(stat -c %u:%g "$MNT/sg/d")" "group of a dir in a setgid dir"
[ -g "$MNT/sg/d" ] || fail "a dir made in a setgid dir lost the setgid bit"

echo x > "$MNT/suid"; chmod 4777 "$MNT/suid"
as_nobody sh -c "echo y >> '$MNT/suid'"
[ ! -u "$MNT/suid" ] || fail "setuid bit kept after a write by another user: $(stat -c %a "$MNT/suid")"
check_backend
umount_fs
check_log
