#!/usr/bin/env bash
# truncate(2) and ftruncate(2) down and up: a cut keeps the prefix, growing
# again reads zeros (never the old bytes), writes after a cut land right;
# truncate to 0; truncate of a file another fd is reading.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
head -c 10M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/f"
cut=$(((5 << 20) + 123))
truncate -s "$cut" "$MNT/f"
expect_eq "$cut" "$(size_of "$MNT/f")" "size after truncate down"
cmp -n "$cut" "$T/ref" "$MNT/f" || fail "prefix changed by truncate down"
truncate -s 20M "$MNT/f"
expect_eq $((20 << 20)) "$(size_of "$MNT/f")" "size after truncate up"
cmp -n "$cut" "$T/ref" "$MNT/f" || fail "prefix changed by truncate up"
cmp <(tail -c +$((cut + 1)) "$MNT/f") <(head -c $(((20 << 20) - cut)) /dev/zero) \
  || fail "bytes past the old cut are not zeros after growing (old data came back?)"
drop_caches
cmp <(tail -c +$((cut + 1)) "$MNT/f") <(head -c $(((20 << 20) - cut)) /dev/zero) \
  || fail "after drop_caches: bytes past the cut are not zeros"

$PY - "$MNT/g" <<'PY'
import os, sys
p = sys.argv[1]
ref = bytearray()
def write(fd, data, off):
    global ref
    os.pwrite(fd, data, off)
    if len(ref) < off:
        ref += bytes(off - len(ref))
    ref[off:off + len(data)] = data
def trunc(fd, n):
    global ref
    os.ftruncate(fd, n)
    ref = ref[:n] + bytes(max(0, n - len(ref)))
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
rd = os.open(p, os.O_RDONLY)
write(fd, os.urandom(3 << 20), 0)
for n in [1 << 20, 1, 0, 4096, 2 << 20, 100, (1 << 20) + 1]:
    trunc(fd, n)
    write(fd, os.urandom(5000), n // 2)
    for f in (fd, rd):
        if os.fstat(f).st_size != len(ref):
            sys.exit(f"after ftruncate({n}): size {os.fstat(f).st_size}, want {len(ref)}")
        got = os.pread(f, len(ref) + 10, 0)
        if got != bytes(ref):
            sys.exit(f"after ftruncate({n}) and a write: contents differ")
trunc(fd, 0)
if os.fstat(rd).st_size != 0 or os.pread(rd, 10, 0) != b"":
    sys.exit("truncate to 0 left bytes")
os.close(fd); os.close(rd)
PY
truncate -s 0 "$MNT/f"
expect_eq 0 "$(size_of "$MNT/f")" "truncate -s 0"
[ ! -s "$MNT/f" ] || fail "f not empty"
remount_fs
expect_eq 0 "$(size_of "$MNT/f")" "size of f after remount"
check_backend
umount_fs
check_log
