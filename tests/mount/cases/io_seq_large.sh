#!/usr/bin/env bash
# A 256 MiB sequential write (dd bs=1M) reads back byte for byte: from the
# page cache, after dropping the kernel caches (so from the daemon), after
# a remount (from the re-attached tier), and at random offsets. (It was
# 1 GiB: no size in the daemon lies between the two, the largest chunk being
# 4 MiB, and offsets past 2^32 are file_sparse's.)
# serial: the largest file of the suite: a throughput and memory measurement
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 2G
head -c 256M /dev/urandom > "$T/ref"
dd if="$T/ref" of="$MNT/big" bs=1M 2> "$T/dd.err" || { cat "$T/dd.err"; fail "dd to the mount failed"; }
note "write: $(tail -n 1 "$T/dd.err")"
expect_eq $((256 << 20)) "$(size_of "$MNT/big")" "size after write"
same_bytes "$T/ref" "$MNT/big"
check_state "$MNT/big"
drop_caches
dd if="$MNT/big" of=/dev/null bs=1M 2> "$T/dd.err"
note "read after drop_caches: $(tail -n 1 "$T/dd.err")"
same_bytes "$T/ref" "$MNT/big"

# Random-offset reads of various sizes against the reference.
$PY - "$T/ref" "$MNT/big" <<'PY'
import os, random, sys
rng = random.Random(1234)
ref = os.open(sys.argv[1], os.O_RDONLY)
fd = os.open(sys.argv[2], os.O_RDONLY)
size = os.fstat(ref).st_size
for i in range(3000):
    n = rng.choice([1, 7, 4096, 4097, 65536, 131072 + 3, 1 << 20, 3 << 20])
    off = rng.randrange(0, size + 4096)
    a, b = os.pread(ref, n, off), os.pread(fd, n, off)
    if a != b:
        sys.exit(f"read of {n} at {off}: {len(b)} bytes differ from reference ({len(a)})")
PY

remount_fs
expect_eq $((256 << 20)) "$(size_of "$MNT/big")" "size after remount"
same_bytes "$T/ref" "$MNT/big"
umount_fs
check_log
