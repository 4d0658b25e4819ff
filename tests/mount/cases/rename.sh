#!/usr/bin/env bash
# rename(2) and renameat2(2): files within and across directories (same
# inode, same bytes), directories with contents, replacing a file (its
# other hard link keeps the old bytes), renaming an open file, a no-op
# rename onto itself or another link of the same inode, RENAME_NOREPLACE,
# RENAME_EXCHANGE (file/file, file/dir), dir over empty dir (ok), dir over
# non-empty dir (ENOTEMPTY), dir into its own subdir (EINVAL), file over
# dir (EISDIR), dir over file (ENOTDIR), a fifo and a file made by mknod(2)
# over drained files (the backend follows). Everything again after a remount.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
head -c 3M /dev/urandom > "$T/a"
head -c 1M /dev/urandom > "$T/b"
cp "$T/a" "$MNT/a"
cp "$T/b" "$MNT/b"

# Within a directory and across directories; same inode, same bytes.
ino=$(stat -c %i "$MNT/a")
mv "$MNT/a" "$MNT/a2"
[ ! -e "$MNT/a" ] || fail "old name still there"
expect_eq "$ino" "$(stat -c %i "$MNT/a2")" "inode after rename"
same_bytes "$T/a" "$MNT/a2"
mkdir -p "$MNT/d1/sub" "$MNT/d2"
mv "$MNT/a2" "$MNT/d1/sub/a3"
same_bytes "$T/a" "$MNT/d1/sub/a3"
mv "$MNT/d1/sub/a3" "$MNT/d2/a"
same_bytes "$T/a" "$MNT/d2/a"
expect_eq "a" "$(ls "$MNT/d2")" "ls d2"
[ -z "$(ls "$MNT/d1/sub")" ] || fail "d1/sub not empty: $(ls "$MNT/d1/sub")"

# A directory with contents.
mkdir -p "$MNT/tree/x/y"
for i in 1 2 3; do echo "f$i" > "$MNT/tree/x/y/f$i"; done
cp "$T/b" "$MNT/tree/x/big"
mv "$MNT/tree" "$MNT/d1/moved"
[ ! -e "$MNT/tree" ] || fail "old dir still there"
for i in 1 2 3; do expect_eq "f$i" "$(cat "$MNT/d1/moved/x/y/f$i")" "moved tree f$i"; done
same_bytes "$T/b" "$MNT/d1/moved/x/big"
expect_eq "$MNT/d1/moved/x" "$(cd "$MNT/d1/moved/x/y/.." && pwd)" "parent of a moved dir"
expect_eq "big y" "$(ls "$MNT/d1/moved/x" | tr '\n' ' ' | sed 's/ $//')" "ls of moved dir"

# Replace an existing file; a hard link to the replaced file keeps its bytes.
cp "$T/b" "$MNT/target"
ln "$MNT/target" "$MNT/target.link"
cp "$T/a" "$MNT/src"
mv -f "$MNT/src" "$MNT/target"
same_bytes "$T/a" "$MNT/target"
same_bytes "$T/b" "$MNT/target.link"
expect_eq 1 "$(stat -c %h "$MNT/target.link")" "nlink of the replaced file's other link"
expect_eq 1 "$(ls "$MNT" | grep -c '^target$')" "one entry named target"

# Rename an open file, keep writing through the fd.
$PY - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
fd = os.open(f"{m}/open1", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"before ")
os.rename(f"{m}/open1", f"{m}/d2/open2")
os.write(fd, b"after")
os.close(fd)
assert open(f"{m}/d2/open2", "rb").read() == b"before after"
assert not os.path.exists(f"{m}/open1")
PY

# No-ops: onto itself, onto another link of the same inode (both stay).
expect_ok rename "$MNT/b" "$MNT/b"
same_bytes "$T/b" "$MNT/b"
ln "$MNT/b" "$MNT/b.hard"
expect_ok rename "$MNT/b" "$MNT/b.hard"
[ -e "$MNT/b" ] && [ -e "$MNT/b.hard" ] || fail "rename onto a hard link of the same inode removed a name"

# RENAME_NOREPLACE
echo one > "$MNT/n1"; echo two > "$MNT/n2"
expect_errno EEXIST rename "$MNT/n1" "$MNT/n2" noreplace
expect_eq one "$(cat "$MNT/n1")" "n1 after failed NOREPLACE"
expect_eq two "$(cat "$MNT/n2")" "n2 after failed NOREPLACE"
expect_ok rename "$MNT/n1" "$MNT/n3" noreplace
[ ! -e "$MNT/n1" ] && expect_eq one "$(cat "$MNT/n3")" "NOREPLACE to a free name"

# RENAME_EXCHANGE: two files, a file and a directory, a missing target.
ia=$(stat -c %i "$MNT/n2"); ib=$(stat -c %i "$MNT/n3")
expect_ok rename "$MNT/n2" "$MNT/n3" exchange
expect_eq one "$(cat "$MNT/n2")" "n2 after exchange"
expect_eq two "$(cat "$MNT/n3")" "n3 after exchange"
expect_eq "$ib $ia" "$(stat -c %i "$MNT/n2") $(stat -c %i "$MNT/n3")" "inodes after exchange"
mkdir "$MNT/xd"; echo inside > "$MNT/xd/f"
expect_ok rename "$MNT/n2" "$MNT/xd" exchange
[ -f "$MNT/xd" ] && [ -d "$MNT/n2" ] || fail "file/dir exchange did not swap types"
expect_eq inside "$(cat "$MNT/n2/f")" "dir content after exchange"
expect_eq one "$(cat "$MNT/xd")" "file content after exchange"
mkdir "$MNT/d2/xsub"
expect_ok rename "$MNT/n2" "$MNT/d2/xsub" exchange   # across directories
expect_eq inside "$(cat "$MNT/d2/xsub/f")" "cross-dir exchange"
[ -d "$MNT/n2" ] && [ -z "$(ls "$MNT/n2")" ] || fail "cross-dir exchange: n2 should be the empty dir"
expect_errno ENOENT rename "$MNT/n3" "$MNT/missing" exchange
if mv --help 2>/dev/null | grep -q -- '--exchange'; then
  echo left > "$MNT/m1"; echo right > "$MNT/m2"
  mv --exchange "$MNT/m1" "$MNT/m2"
  expect_eq "right left" "$(cat "$MNT/m1") $(cat "$MNT/m2")" "mv --exchange"
  rm "$MNT/m1" "$MNT/m2"
fi

# Directories over directories, into themselves; files over dirs and back.
mkdir -p "$MNT/e1/c" "$MNT/empty" "$MNT/full"
echo x > "$MNT/full/x"
expect_ok rename "$MNT/e1" "$MNT/empty"
[ -d "$MNT/empty/c" ] && [ ! -e "$MNT/e1" ] || fail "dir over empty dir did not replace it"
expect_errno ENOTEMPTY rename "$MNT/empty" "$MNT/full"
[ -d "$MNT/empty/c" ] && [ -f "$MNT/full/x" ] || fail "failed rename changed something"
expect_errno EINVAL rename "$MNT/empty" "$MNT/empty/c/inside"
expect_errno EISDIR rename "$MNT/n3" "$MNT/full"
expect_errno ENOTDIR rename "$MNT/full" "$MNT/n3"
expect_errno ENOENT rename "$MNT/nothing" "$MNT/n4"

# A fifo renamed over a drained file: the backend, which never holds a
# fifo, loses the file's name too. A regular file made by mknod(2), never
# opened, drains empty and replaces what it is renamed over.
cp "$T/b" "$MNT/ft"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null || fail "drain"
mkfifo "$MNT/p"
mv -f "$MNT/p" "$MNT/ft"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null || fail "drain"
[ ! -e "$BACKEND/ft" ] || fail "stale file under a fifo"
rm "$MNT/ft"
cp "$T/b" "$MNT/fm"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null || fail "drain"
$PY -c 'import os, stat, sys; os.mknod(sys.argv[1], 0o644 | stat.S_IFREG)' "$MNT/made"
mv -f "$MNT/made" "$MNT/fm"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null || fail "drain"
[ -f "$BACKEND/fm" ] && [ ! -s "$BACKEND/fm" ] || fail "the file mknod made did not replace fm in the backend"

check_backend
find "$MNT" | sort > "$T/before"
for f in "$MNT"/*/* "$MNT"/*; do [ -f "$f" ] && md5sum "$f"; done | sort > "$T/sums"
remount_fs
find "$MNT" | sort > "$T/after"
diff "$T/before" "$T/after" || fail "namespace differs after remount"
for f in "$MNT"/*/* "$MNT"/*; do [ -f "$f" ] && md5sum "$f"; done | sort | diff "$T/sums" - || fail "contents differ after remount"
umount_fs
check_log
