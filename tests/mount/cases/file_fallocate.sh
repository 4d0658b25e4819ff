#!/usr/bin/env bash
# posix_fallocate: extends a new file with zeros, leaves existing bytes
# alone, never shrinks. fallocate(2) mode 0 and KEEP_SIZE, which glibc does
# not emulate, are checked too when the filesystem supports them.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
$PY - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
fd = os.open(f"{m}/new", os.O_RDWR | os.O_CREAT, 0o644)
os.posix_fallocate(fd, 0, 8 << 20)
assert os.fstat(fd).st_size == 8 << 20, os.fstat(fd).st_size
assert os.pread(fd, 8 << 20, 0) == bytes(8 << 20), "fallocated range is not zeros"
os.close(fd)

data = os.urandom(3 << 20)
fd = os.open(f"{m}/old", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, data)
os.posix_fallocate(fd, 1 << 20, 10 << 20)
assert os.fstat(fd).st_size == 11 << 20, os.fstat(fd).st_size
got = os.pread(fd, 11 << 20, 0)
assert got[:3 << 20] == data, "posix_fallocate changed existing bytes"
assert got[3 << 20:] == bytes(8 << 20), "extension is not zeros"
os.posix_fallocate(fd, 0, 4096)
assert os.fstat(fd).st_size == 11 << 20, "posix_fallocate inside the file changed its size"
os.close(fd)
PY

: > "$MNT/native"
r=$(fsop fallocate "$MNT/native" 0 $((4 << 20)))
case $r in
  OK)
    note "fallocate(2) mode 0 supported"
    expect_eq $((4 << 20)) "$(size_of "$MNT/native")" "size after fallocate(2)"
    cmp "$MNT/native" <(head -c 4M /dev/zero) || fail "fallocate(2) range not zeros"
    r=$(fsop fallocate "$MNT/native" 0 $((8 << 20)) keep_size)
    case $r in
      OK) expect_eq $((4 << 20)) "$(size_of "$MNT/native")" "FALLOC_FL_KEEP_SIZE changed the size" ;;
      EOPNOTSUPP) note "fallocate(2) KEEP_SIZE: not supported" ;;
      *) fail "fallocate(2) KEEP_SIZE: $r" ;;
    esac ;;
  EOPNOTSUPP) note "fallocate(2) itself is not supported (posix_fallocate emulates it)" ;;
  *) fail "fallocate(2): $r" ;;
esac
check_backend
umount_fs
check_log
