#!/usr/bin/env bash
# A file written only at a 1 GiB offset: its size is right, the hole reads
# as zeros (whole-file compare with a sparse reference, and across the
# data edges), and it does not take 1 GiB of space (du, df).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 2G
used0=$(used_bytes)
head -c 1M /dev/urandom > "$T/data"
for f in "$T/ref" "$MNT/sparse"; do
  dd if="$T/data" of="$f" bs=1M seek=1024 conv=notrunc status=none
done
expect_eq $(((1 << 30) + (1 << 20))) "$(size_of "$MNT/sparse")" "size of the sparse file"
$PY - "$MNT/sparse" "$T/data" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
data = open(sys.argv[2], "rb").read()
G = 1 << 30
for off, n in [(0, 4096), (12345, 100), (G // 2, 1 << 20), (G - 4096, 4096)]:
    if os.pread(fd, n, off) != bytes(n):
        sys.exit(f"hole at {off}+{n} does not read as zeros")
if os.pread(fd, 8192, G - 4096) != bytes(4096) + data[:4096]:
    sys.exit("bytes across the hole/data edge are wrong")
if os.pread(fd, 2 << 20, G) != data:
    sys.exit("data after the hole is wrong")
if os.pread(fd, 10, G + (1 << 20)) != b"":
    sys.exit("read past EOF returned bytes")
PY
same_bytes "$T/ref" "$MNT/sparse"

# A hole in the middle of a file, made by writing past EOF.
printf 'head' > "$MNT/mid"
printf 'tail' | dd of="$MNT/mid" bs=1 seek=$((5 << 20)) conv=notrunc status=none
expect_eq $(((5 << 20) + 4)) "$(size_of "$MNT/mid")" "size of mid"
{ printf 'head'; head -c $(((5 << 20) - 4)) /dev/zero; printf 'tail'; } > "$T/mid"
same_bytes "$T/mid" "$MNT/mid"

du_k=$(du -k "$MNT/sparse" | cut -f1)
[ "$du_k" -lt $((16 << 10)) ] || fail "du says the sparse file takes ${du_k} KiB (st_blocks $(stat -c %b "$MNT/sparse"))"
used1=$(used_bytes)
[ $((used1 - used0)) -lt $((64 << 20)) ] || fail "df used grew by $((used1 - used0)) bytes for 1 MiB of data"
check_backend
umount_fs
check_log
