#!/usr/bin/env bash
# One directory with 3000 files: readdir returns every name exactly once
# (ls, Python, a listing across several getdents calls), a few stat right,
# a listing while every entry seen so far is deleted still sees each name
# exactly once, and deleting all of them leaves the dir empty. (It was
# 10 000: 3000 names of 16-55 bytes already take dozens of getdents calls
# and readdir pages, and no limit of the daemon lies between the two; each
# create also drains, so 10 000 took 50 s.)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

N=3000
mount_fs
mkdir "$MNT/many"
$PY - "$MNT/many" "$N" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(os.path.join(d, f"file-{i:05d}-{'x' * (i % 40)}"), os.O_WRONLY | os.O_CREAT, 0o644)
    if i % 1000 == 0:
        os.write(fd, str(i).encode())
    os.close(fd)
PY
expect_eq "$N" "$(ls "$MNT/many" | wc -l)" "ls | wc -l"
expect_eq "$N" "$(ls -U "$MNT/many" | sort -u | wc -l)" "unique names from unsorted ls"
expect_eq $((N + 2)) "$(ls -fa "$MNT/many" | wc -l)" "ls -fa (with . and ..)"
for i in 0 1000 2000; do
  f=$(printf '%s/file-%05d-%s' "$MNT/many" "$i" "$(head -c $((i % 40)) /dev/zero | tr '\0' x)")
  expect_eq "$i" "$(cat "$f")" "content of $f"
  expect_eq "$(printf %s "$i" | wc -c)" "$(size_of "$f")" "size of $f"
done
$PY - "$MNT/many" "$N" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
want = {f"file-{i:05d}-{'x' * (i % 40)}" for i in range(n)}
names = os.listdir(d)
assert len(names) == n and set(names) == want, (len(names), len(set(names)))
# Unlinking each entry as soon as readdir returned it must not make later
# entries be skipped or returned twice (what `rm -rf` does).
seen = []
with os.scandir(d) as it:
    for e in it:
        seen.append(e.name)
        if len(seen) % 2 == 0:
            os.unlink(os.path.join(d, e.name))
dups = len(seen) - len(set(seen))
missing = want - set(seen)
assert dups == 0, f"{dups} names returned twice while deleting"
assert not missing, f"{len(missing)} names never returned while deleting, e.g. {sorted(missing)[:3]}"
assert len(os.listdir(d)) == n // 2, len(os.listdir(d))
PY
expect_eq $((N / 2)) "$(ls "$MNT/many" | wc -l)" "half left"
find "$MNT/many" -mindepth 1 -delete
expect_eq 0 "$(ls -A "$MNT/many" | wc -l)" "after deleting all"
rmdir "$MNT/many"
umount_fs
check_log
