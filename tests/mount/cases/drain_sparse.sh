#!/usr/bin/env bash
# Issue #16 item 13: sparse files drain sparse. `truncate -s 100G` plus one
# byte must not put 100 GB of zeros into the shared backend; the backend
# copy has the same size and bytes, and an evicted sparse file comes back
# from the backend right (and sparse in the tier).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

G=$((1 << 30))
mount_fs --max-file-size 1T  # the 100G sparse file is past 4 x the 2G budget
truncate -s 100G "$MNT/big"
printf 'X' | dd of="$MNT/big" bs=1 seek=$((50 * G)) conv=notrunc status=none
printf 'tail' | dd of="$MNT/big" bs=1 seek=$((100 * G - 4)) conv=notrunc status=none
"$CKPTFS" drain "$MNT" --timeout 120 || fail "drain of a 100G sparse file did not finish in 120 s"
expect_eq $((100 * G)) "$(stat -c %s "$BACKEND/big")" "backend size"
alloc=$(( $(stat -c %b "$BACKEND/big") * $(stat -c %B "$BACKEND/big") ))
# Two bytes written: on the tier's 2 MiB pages (--tier-huge) each byte
# inside the file's size takes a whole huge page, which the drain copies
# as data (2 x 2 MiB); on 4 KiB pages, 8 KiB.
[ "$alloc" -le $((4 << 20)) ] || fail "backend copy allocates $alloc bytes (drained dense?)"
range() { dd if="$1" bs=4096 skip="$2" count="$3" status=none | sha256sum; }
for blk in 0 $((50 * G / 4096 - 1)) $((50 * G / 4096)) $((100 * G / 4096 - 2)) $((100 * G / 4096 - 1)); do
  expect_eq "$(range "$MNT/big" "$blk" 2)" "$(range "$BACKEND/big" "$blk" 2)" "bytes at block $blk"
done
expect_eq X "$(dd if="$BACKEND/big" bs=1 skip=$((50 * G)) count=1 status=none)" "the byte at 50G"

# A sparse file that fits the tier: evicted (a fresh tier, as after a
# reboot), then read back through the mount from the backend.
truncate -s 1G "$MNT/mid"
head -c 3M /dev/urandom > "$T/chunk"
dd if="$T/chunk" of="$MNT/mid" bs=1M seek=100 conv=notrunc status=none
dd if="$T/chunk" of="$MNT/mid" bs=1M seek=1021 conv=notrunc status=none
cp --sparse=always "$MNT/mid" "$T/mid.ref"
"$CKPTFS" drain "$MNT" --timeout 60
alloc=$(( $(stat -c %b "$BACKEND/mid") * $(stat -c %B "$BACKEND/mid") ))
[ "$alloc" -lt $((16 << 20)) ] || fail "mid allocates $alloc bytes in the backend"
umount_fs
rm_tier "$TIER"
# The 2G budget is far below big's apparent size: a fetch of a file larger
# than the budget is charged by the data it brings (cache/tier.cc Fill).
mount_fs --max-file-size 1T
expect_eq remote "$(state_of "$MNT/mid")" "mid after the tier was dropped"
cmp "$T/mid.ref" "$MNT/mid" || fail "mid reads back wrong after eviction"
tier_alloc=$(du -sB1 "$TIER" | cut -f1)
[ "$tier_alloc" -lt $((64 << 20)) ] || fail "the fetched copy allocates $tier_alloc bytes in the tier (fetched dense?)"
expect_eq remote "$(state_of "$MNT/big")" "big after the tier was dropped"
expect_eq $((100 * G)) "$(size_of "$MNT/big")" "size of big after remount"
for blk in 0 $((50 * G / 4096)) $((100 * G / 4096 - 1)); do
  expect_eq "$(range "$BACKEND/big" "$blk" 1)" "$(range "$MNT/big" "$blk" 1)" "big after remount, block $blk"
done
umount_fs
check_log --allow-warnings "older .*checksum"
