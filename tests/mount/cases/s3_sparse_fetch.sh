#!/usr/bin/env bash
# Issue #16 item 13, "the same rule for fetch", on S3: a sparse file twice
# the tier's budget (a few bytes written) drains to S3 (zeros sent, as S3
# must), then, evicted (a fresh tier, as after a reboot), reads back through
# the mount byte for byte, and its fetched copy in the tier keeps the holes.
# A fetch that wrote every byte it received put 128 MiB of zeros into a
# 64 MiB budget and failed with ENOSPC: the file could not be read back.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
P=sparse
M=$((1 << 20))

mount_s3 "$P" --cache-size 64M  # --max-file-size defaults to 4 x the budget
truncate -s $((128 * M)) "$MNT/big"
printf 'head' | dd of="$MNT/big" bs=1 seek=0 conv=notrunc status=none
printf 'X' | dd of="$MNT/big" bs=1 seek=$((100 * M + 123)) conv=notrunc status=none
printf 'tail' | dd of="$MNT/big" bs=1 seek=$((128 * M - 4)) conv=notrunc status=none
truncate -s $((128 * M)) "$T/big.ref"
printf 'head' | dd of="$T/big.ref" bs=1 seek=0 conv=notrunc status=none
printf 'X' | dd of="$T/big.ref" bs=1 seek=$((100 * M + 123)) conv=notrunc status=none
printf 'tail' | dd of="$T/big.ref" bs=1 seek=$((128 * M - 4)) conv=notrunc status=none
cmp "$T/big.ref" "$MNT/big" || fail "big differs before the drain"
"$CKPTFS" drain "$MNT" --timeout 120 > /dev/null 2>&1 || fail "drain of big did not finish in 120 s"
s3c get "$P/big" "$T/got" || fail "GET big"
cmp "$T/big.ref" "$T/got" || fail "the object differs from the file"
rm -f "$T/got"
umount_fs

rm_tier "$TIER"
mount_s3 "$P" --cache-size 64M
expect_eq remote "$(state_of "$MNT/big")" "big after the tier was dropped"
expect_eq $((128 * M)) "$(size_of "$MNT/big")" "size of big"
cmp "$T/big.ref" "$MNT/big" || fail "big reads back wrong (or not at all) from S3"
expect_eq persisted "$(state_of "$MNT/big")" "big after reading"
# The file's pages only: a spare made for the next save (*.tmp, as large as
# the largest file found, under the budget) is a separate, capped cost.
tier_alloc=$(du -sB1 --exclude='*.tmp' "$TIER" | cut -f1)
[ "$tier_alloc" -lt $((16 * M)) ] || fail "the fetched copy allocates $tier_alloc bytes in the tier (fetched dense)"
umount_fs
check_log
