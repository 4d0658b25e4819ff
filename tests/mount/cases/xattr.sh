#!/usr/bin/env bash
# Extended attributes: set/get/list/remove (setfattr/getfattr), ENODATA
# for a missing one, XATTR_CREATE/XATTR_REPLACE, binary and empty values,
# a 4000-byte value, on files, dirs; the size probe protocol (ERANGE); the
# ckptfs.state attribute; persistence across a remount.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
echo hi > "$MNT/f"
mkdir "$MNT/d"
setfattr -n user.one -v first "$MNT/f"
setfattr -n user.two -v 0x00ff10 "$MNT/f"
setfattr -n user.empty "$MNT/f"
setfattr -n user.dir -v on-a-dir "$MNT/d"
expect_eq first "$(getfattr --absolute-names --only-values -n user.one "$MNT/f")" "getfattr user.one"
expect_eq 0x00ff10 "$(getfattr --absolute-names -e hex -n user.two "$MNT/f" | sed -n 's/^user.two=//p')" "binary value"
expect_eq "" "$(getfattr --absolute-names --only-values -n user.empty "$MNT/f")" "empty value"
expect_eq on-a-dir "$(getfattr --absolute-names --only-values -n user.dir "$MNT/d")" "xattr on a dir"
getfattr -d -m '^user\.(one|two|empty)$' --absolute-names "$MNT/f" | grep '^user' | sort > "$T/list"
printf 'user.empty=""\nuser.one="first"\nuser.two=0sAP8Q\n' | diff - "$T/list" || fail "getfattr -d listing"
names=" $(fsop listxattr "$MNT/f" | sed 's/^OK //') "
for n in user.empty user.one user.two; do
  case $names in *" $n "*) ;; *) fail "listxattr lacks $n: $names" ;; esac
done

expect_errno ENODATA getxattr "$MNT/f" user.missing
expect_errno ENODATA removexattr "$MNT/f" user.missing
expect_errno EEXIST setxattr "$MNT/f" user.one again create
expect_errno ENODATA setxattr "$MNT/f" user.three x replace
expect_ok setxattr "$MNT/f" user.one replaced replace
expect_eq replaced "$(getfattr --absolute-names --only-values -n user.one "$MNT/f")" "after XATTR_REPLACE"
expect_ok setxattr "$MNT/f" user.three new create
setfattr -x user.three "$MNT/f"
expect_errno ENODATA getxattr "$MNT/f" user.three
expect_errno ENOENT getxattr "$MNT/nothing" user.one
big=$(head -c 3000 /dev/urandom | base64 -w0 | head -c 4000)
setfattr -n user.big -v "$big" "$MNT/f"
expect_eq "$big" "$(getfattr --absolute-names --only-values -n user.big "$MNT/f")" "4000-byte value"

# The size probe: getxattr with a zero buffer gives the size, too small a
# buffer gives ERANGE.
$PY - "$MNT/f" <<'PY'
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
p = sys.argv[1].encode()
n = libc.getxattr(p, b"user.one", None, 0)
assert n == len(b"replaced"), n
buf = ctypes.create_string_buffer(3)
assert libc.getxattr(p, b"user.one", buf, 3) == -1 and ctypes.get_errno() == errno.ERANGE, "no ERANGE"
n = libc.listxattr(p, None, 0)
assert n >= len(b"user.one\0user.two\0user.empty\0user.big\0"), n
assert libc.listxattr(p, ctypes.create_string_buffer(2), 2) == -1 and ctypes.get_errno() == errno.ERANGE
PY

# The state attribute ckptfs serves itself.
check_state "$MNT/f"

getfattr -d -e hex --absolute-names -m '^user\.(one|two|empty|big|dir)$' "$MNT/f" "$MNT/d" > "$T/all"
remount_fs
getfattr -d -e hex --absolute-names -m '^user\.(one|two|empty|big|dir)$' "$MNT/f" "$MNT/d" | diff "$T/all" - \
  || fail "xattrs differ after remount"
check_backend
umount_fs
check_log
