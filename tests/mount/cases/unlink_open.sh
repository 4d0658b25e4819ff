#!/usr/bin/env bash
# A file unlinked while open stays usable through its fd (read, write,
# fstat with nlink 0); its name is gone at once; closing it frees its space
# in the tier (df); a new file under the same name is a different file.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
used0=$(used_bytes)
$PY - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
data = os.urandom(64 << 20)
fd = os.open(f"{m}/victim", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, data)
os.unlink(f"{m}/victim")
assert not os.path.exists(f"{m}/victim")
assert os.fstat(fd).st_nlink == 0, os.fstat(fd).st_nlink
assert os.pread(fd, len(data), 0) == data, "bytes of the unlinked file changed"
os.pwrite(fd, b"more", len(data))
assert os.fstat(fd).st_size == len(data) + 4
with open(f"{m}/victim", "wb") as f:
    f.write(b"new file")
assert os.pread(fd, 4, len(data)) == b"more"
assert open(f"{m}/victim", "rb").read() == b"new file"
assert os.fstat(fd).st_ino != os.stat(f"{m}/victim").st_ino
os.close(fd)
PY
sleep 1
used1=$(used_bytes)
[ $((used1 - used0)) -lt $((8 << 20)) ] || fail "tier still holds $((used1 - used0)) bytes after the unlinked file was closed"
expect_eq "new file" "$(cat "$MNT/victim")" "new file under the old name"
check_backend
umount_fs
check_log
