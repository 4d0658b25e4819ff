#!/usr/bin/env bash
# mkdir (modes, deep paths), rmdir (ENOTEMPTY, then ok), unlink, `rm -rf`
# of a tree of ~2000 entries, and readdir listings that match what was
# made; the backend ends up with the same tree.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
mkdir "$MNT/d"
expect_eq 755 "$(stat -c %a "$MNT/d")" "mode of mkdir under umask 022"
mkdir -m 0700 "$MNT/private"
expect_eq 700 "$(stat -c %a "$MNT/private")" "mkdir -m 0700"
expect_eq directory "$(stat -c %F "$MNT/d")" "type"
deep=$MNT/deep$(printf '/level%02d' $(seq 1 30))
mkdir -p "$deep"
echo bottom > "$deep/file"
expect_eq bottom "$(cat "$deep/file")" "file 30 levels deep"

echo x > "$MNT/d/f"
expect_errno ENOTEMPTY rmdir "$MNT/d"
rm "$MNT/d/f"
[ ! -e "$MNT/d/f" ] || fail "unlinked file still there"
expect_errno ENOENT stat "$MNT/d/f"
expect_eq "" "$(ls -A "$MNT/d")" "ls of emptied dir"
rmdir "$MNT/d"
expect_errno ENOENT stat "$MNT/d"

# A tree: 10 dirs x 10 subdirs x 20 files, some with data.
$PY - "$MNT/tree" <<'PY'
import os, sys
root = sys.argv[1]
for i in range(10):
    for j in range(10):
        d = os.path.join(root, f"d{i}", f"s{j}")
        os.makedirs(d)
        for k in range(20):
            with open(os.path.join(d, f"f{k}"), "wb") as f:
                if k % 5 == 0:
                    f.write(os.urandom(10_000 + k))
PY
expect_eq 2000 "$(find "$MNT/tree" -type f | wc -l)" "files in the tree"
expect_eq 111 "$(find "$MNT/tree" -type d | wc -l)" "dirs in the tree"
find "$MNT/tree" -type f -exec md5sum {} + | sed "s#$MNT/##" | sort > "$T/tree.sums"
check_backend
(cd "$BACKEND" && find tree -type f -exec md5sum {} + | sort) | diff "$T/tree.sums" - || fail "backend tree bytes differ"
drop_caches
find "$MNT/tree" -type f -exec md5sum {} + | sed "s#$MNT/##" | sort | diff "$T/tree.sums" - \
  || fail "tree bytes differ after dropping caches"
rm -rf "$MNT/tree"
[ ! -e "$MNT/tree" ] || fail "rm -rf left the tree"
rm -rf "$MNT/deep"
expect_eq "private" "$(ls -A "$MNT")" "root after rm -rf"
check_backend
[ ! -e "$BACKEND/tree" ] || fail "deleted tree still in the backend"
umount_fs
check_log
