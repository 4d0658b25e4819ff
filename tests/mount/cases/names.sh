#!/usr/bin/env bash
# Names: 255 bytes work for files, dirs, symlinks, renames and xattr-less
# listing; 256 bytes give ENAMETOOLONG for create, mkdir, lookup, rename,
# link and symlink. UTF-8, spaces, newlines and other odd bytes round-trip.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
n255=$(printf 'n%.0s' $(seq 1 255))
n256=${n255}x
echo ok > "$MNT/$n255"
expect_eq ok "$(cat "$MNT/$n255")" "255-byte file name"
mkdir "$MNT/d$(printf 'd%.0s' $(seq 1 254))"
ln -s target "$MNT/s$(printf 's%.0s' $(seq 1 254))"
expect_eq "$n255" "$(ls "$MNT" | grep '^n')" "ls shows the 255-byte name"
mv "$MNT/$n255" "$MNT/m$(printf 'm%.0s' $(seq 1 254))"
expect_errno ENAMETOOLONG open "$MNT/$n256" w,creat
expect_errno ENAMETOOLONG stat "$MNT/$n256"
expect_errno ENAMETOOLONG mkdir "$MNT/$n256"
expect_errno ENAMETOOLONG symlink target "$MNT/$n256"
expect_errno ENAMETOOLONG rename "$MNT/m$(printf 'm%.0s' $(seq 1 254))" "$MNT/$n256"
expect_errno ENAMETOOLONG link "$MNT/m$(printf 'm%.0s' $(seq 1 254))" "$MNT/$n256"
# A 255-character name of 2-byte UTF-8 characters is 510 bytes: too long.
expect_errno ENAMETOOLONG open "$MNT/$(printf 'é%.0s' $(seq 1 200))" w,creat

$PY - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
names = ["with space", "new\nline", "tab\there", "ünïcödé-名前", "-dash", "..dots", ".hidden",
         "back\\slash", "quote'\"", "star*?[]", "x" * 200, "\x01ctrl"]
for n in names:
    with open(os.path.join(m, n), "w") as f:
        f.write(n)
got = set(os.listdir(m))
for n in names:
    assert n in got, f"{n!r} missing from listdir"
    assert open(os.path.join(m, n)).read() == n, f"{n!r} reads wrong"
# Non-UTF-8 bytes in a name.
raw = os.path.join(os.fsencode(m), b"bad\xff\xfename")
open(raw, "wb").close()
assert b"bad\xff\xfename" in os.listdir(os.fsencode(m))
PY
ls "$MNT" > "$T/ls"
remount_fs
ls "$MNT" | diff "$T/ls" - || fail "names differ after remount"
check_backend
umount_fs
check_log
