#!/usr/bin/env bash
# Hard links: link count, same inode, bytes shared both ways, survive
# unlinking the first name, EPERM for a directory. Symlinks: readlink,
# relative and absolute targets, dangling (stat ENOENT, lstat ok), lstat
# size = target length, symlink to a dir, rename of a symlink, long target.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
mkdir "$MNT/sub"
head -c 2M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/a"
ln "$MNT/a" "$MNT/sub/b"
expect_eq 2 "$(stat -c %h "$MNT/a")" "nlink after ln"
expect_eq "$(stat -c %i "$MNT/a")" "$(stat -c %i "$MNT/sub/b")" "inode of both links"
same_bytes "$T/ref" "$MNT/sub/b"
printf 'XYZ' | dd of="$MNT/sub/b" bs=1 seek=100 conv=notrunc status=none
printf 'XYZ' | dd of="$T/ref" bs=1 seek=100 conv=notrunc status=none
same_bytes "$T/ref" "$MNT/a"
chmod 600 "$MNT/a"
expect_eq 600 "$(stat -c %a "$MNT/sub/b")" "mode seen through the other link"
ln "$MNT/sub/b" "$MNT/c"
expect_eq 3 "$(stat -c %h "$MNT/sub/b")" "nlink with three names"
rm "$MNT/a"
expect_eq 2 "$(stat -c %h "$MNT/c")" "nlink after unlinking one name"
same_bytes "$T/ref" "$MNT/c"
expect_errno EPERM link "$MNT/sub" "$MNT/sublink"
expect_errno EEXIST link "$MNT/c" "$MNT/sub/b"
expect_errno ENOENT link "$MNT/nothing" "$MNT/x"

# Symlinks.
ln -s c "$MNT/rel"
ln -s "$MNT/sub/b" "$MNT/abs"
ln -s ../c "$MNT/sub/up"
ln -s sub "$MNT/dirlink"
ln -s does/not/exist "$MNT/dangling"
expect_eq c "$(readlink "$MNT/rel")" "readlink rel"
expect_eq "$MNT/sub/b" "$(readlink "$MNT/abs")" "readlink abs"
expect_eq 1 "$(stat -c %s "$MNT/rel")" "lstat size of rel"
expect_eq 14 "$(stat -c %s "$MNT/dangling")" "lstat size of dangling"
expect_eq "symbolic link" "$(stat -c %F "$MNT/rel")" "lstat type"
same_bytes "$T/ref" "$MNT/rel"
same_bytes "$T/ref" "$MNT/abs"
same_bytes "$T/ref" "$MNT/sub/up"
same_bytes "$T/ref" "$MNT/dirlink/b"
expect_errno ENOENT stat "$MNT/dangling"
expect_ok lstat "$MNT/dangling"
expect_errno EINVAL readlink "$MNT/c"
mv "$MNT/rel" "$MNT/sub/rel2"
expect_eq c "$(readlink "$MNT/sub/rel2")" "readlink after rename"
[ ! -e "$MNT/sub/rel2" ] || fail "sub/rel2 -> c should dangle from sub/"
long=$(printf 'x%.0s' $(seq 1 4000))
ln -s "$long" "$MNT/longlink"
expect_eq "$long" "$(readlink "$MNT/longlink")" "4000-byte symlink target"
rm "$MNT/dangling"
expect_errno ENOENT lstat "$MNT/dangling"
ls -l "$MNT" "$MNT/sub" > /dev/null

find "$MNT" -printf '%p %y %n %i %l\n' | sort > "$T/tree"
remount_fs
find "$MNT" -printf '%p %y %n %i %l\n' | sort | diff "$T/tree" - || fail "links differ after remount"
same_bytes "$T/ref" "$MNT/c"
# The backend holds the same files, bytes and metadata: a rewrite through
# one name of a hard-linked file reaches every name there too.
check_backend
umount_fs
check_log
