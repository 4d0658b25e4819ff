#!/usr/bin/env bash
# Directory link counts follow the Unix rule (2 + subdirectories), files
# count their hard links, and `.`/`..` show up in readdir, as find(1) and
# other tree walkers expect.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
mkdir -p "$MNT/p/a" "$MNT/p/b" "$MNT/p/c"
touch "$MNT/p/f"
expect_eq 2 "$(stat -c %h "$MNT/p/a")" "nlink of an empty dir"
expect_eq 5 "$(stat -c %h "$MNT/p")" "nlink of a dir with 3 subdirs"
rmdir "$MNT/p/c"
expect_eq 4 "$(stat -c %h "$MNT/p")" "nlink after rmdir"
mv "$MNT/p/b" "$MNT/b"
expect_eq 3 "$(stat -c %h "$MNT/p")" "nlink of the old parent after moving a subdir out"
expect_eq 4 "$(stat -c %h "$MNT")" "nlink of the root (p, b + 2)"
ls -af "$MNT/p" | sort > "$T/ls"
printf '.\n..\na\nf\n' | diff - "$T/ls" || fail "readdir of p"
expect_eq "$(stat -c %i "$MNT")" "$(stat -c %i "$MNT/p/..")" "inode of p/.."
check_backend
umount_fs
check_log
