#!/usr/bin/env bash
# The errno of each failing call: ENOENT, EEXIST, ENOTEMPTY, EISDIR,
# ENOTDIR, EXDEV, EPERM, EINVAL, EBADF; and failed calls change nothing.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
mkdir -p "$MNT/dir/sub"
echo data > "$MNT/file"
echo x > "$MNT/dir/x"

# ENOENT
expect_errno ENOENT stat "$MNT/missing"
expect_errno ENOENT open "$MNT/missing" r
expect_errno ENOENT open "$MNT/missing/deeper" w,creat
expect_errno ENOENT unlink "$MNT/missing"
expect_errno ENOENT rmdir "$MNT/missing"
expect_errno ENOENT mkdir "$MNT/missing/child"
expect_errno ENOENT rename "$MNT/missing" "$MNT/other"
expect_errno ENOENT readlink "$MNT/missing"
expect_errno ENOENT truncate "$MNT/missing" 10
expect_errno ENOENT chmod "$MNT/missing" 644
expect_errno ENOENT listdir "$MNT/missing"
# EEXIST
expect_errno EEXIST mkdir "$MNT/dir"
expect_errno EEXIST mkdir "$MNT/file"
expect_errno EEXIST open "$MNT/file" w,creat,excl
expect_errno EEXIST open "$MNT/dir" w,creat,excl
expect_errno EEXIST symlink target "$MNT/file"
expect_errno EEXIST link "$MNT/file" "$MNT/dir/x"
# ENOTEMPTY
expect_errno ENOTEMPTY rmdir "$MNT/dir"
mkdir "$MNT/full"; echo y > "$MNT/full/y"
expect_errno ENOTEMPTY rename "$MNT/dir" "$MNT/full"
# EISDIR
expect_errno EISDIR open "$MNT/dir" w
expect_errno EISDIR open "$MNT/dir" rw
expect_errno EISDIR open "$MNT/dir" w,creat
expect_errno EISDIR unlink "$MNT/dir"
expect_errno EISDIR rename "$MNT/file" "$MNT/dir"
expect_errno EISDIR truncate "$MNT/dir" 0
# ENOTDIR
expect_errno ENOTDIR stat "$MNT/file/x"
expect_errno ENOTDIR mkdir "$MNT/file/x"
expect_errno ENOTDIR open "$MNT/file/x" w,creat
expect_errno ENOTDIR rmdir "$MNT/file"
expect_errno ENOTDIR open "$MNT/file" r,directory
expect_errno ENOTDIR listdir "$MNT/file"
expect_errno ENOTDIR rename "$MNT/dir/sub" "$MNT/file"
# EXDEV: rename and link out of the mount.
expect_errno EXDEV rename "$MNT/file" "$T/file"
expect_errno EXDEV link "$MNT/file" "$T/file"
# EPERM / EINVAL
expect_errno EPERM link "$MNT/dir" "$MNT/dirlink"
expect_errno EINVAL rename "$MNT/dir" "$MNT/dir/sub/inside"
expect_errno EINVAL readlink "$MNT/file"
expect_errno EINVAL truncate "$MNT/file" -1

# Nothing changed.
expect_eq data "$(cat "$MNT/file")" "file after the failures"
expect_eq "dir file full" "$(ls "$MNT" | tr '\n' ' ' | sed 's/ $//')" "root listing"
expect_eq "sub x" "$(ls "$MNT/dir" | tr '\n' ' ' | sed 's/ $//')" "dir listing"
umount_fs
check_log
