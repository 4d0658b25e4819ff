#!/usr/bin/env bash
# Issue #11, the shared namespace over S3 (s3rver): two mounts (nodes A and
# B, two state dirs, two tier dirs) of one bucket prefix, both mounted
# before anything is written. A writes global_step1/shard_A and latest and
# drains; B sees latest (cat) and global_step1 (ls), read from S3. B
# rotates global_step1 away; after B's drain no object is left under it,
# and after the TTL A no longer shows it. A rewrites latest (same size):
# B reads the new bytes (the checksum metadata tells). An object another
# tool put there shows on A and, read once, stays in A's tier.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
PREFIX=jobs/shared

MNT_A=$T/a MNT_B=$T/b
mkdir -p "$MNT_A" "$MNT_B"
MNT=$MNT_A
mount_s3 "$PREFIX" --state-dir "$T/state-a" --tier-dir "$TIER-a" --shared-ttl 1
MNT=$MNT_B
mount_s3 "$PREFIX" --state-dir "$T/state-b" --tier-dir "$TIER-b" --shared-ttl 1
ttl_wait() { sleep 2.2; }

mkdir "$MNT_A/global_step1"
head -c 200000 /dev/urandom > "$T/shard_A"
cp "$T/shard_A" "$MNT_A/global_step1/shard_A"
echo global_step1 > "$MNT_A/latest"
"$CKPTFS" drain "$MNT_A" --timeout 60 > /dev/null || fail "drain of A"
s3c head "$PREFIX/latest" > /dev/null || fail "latest not in the bucket after A's drain"
ttl_wait
expect_eq global_step1 "$(cat "$MNT_B/latest")" "B reads A's latest"
expect_eq shard_A "$(ls "$MNT_B/global_step1")" "B lists A's step"
same_bytes "$T/shard_A" "$MNT_B/global_step1/shard_A"

rm -r "$MNT_B/global_step1"
ls "$MNT_B" > /dev/null
[ ! -e "$MNT_B/global_step1" ] || fail "global_step1 came back on B: $(s3c list "$PREFIX/"; ls -la "$MNT_B"; ls -la "$MNT_B/global_step1")"
"$CKPTFS" drain "$MNT_B" --timeout 60 > /dev/null || fail "drain of B"
left=$(s3c list "$PREFIX/global_step1/")
[ -z "$left" ] || fail "objects left under global_step1 after B's drain: $left"
ttl_wait
expect_eq latest "$(ls "$MNT_A")" "A's root after B's rotation"

echo global_step2 > "$MNT_A/latest"
"$CKPTFS" drain "$MNT_A" --timeout 60 > /dev/null || fail "drain of A (rewrite)"
ttl_wait
expect_eq global_step2 "$(cat "$MNT_B/latest")" "B reads A's same-size rewrite"

# An object another tool wrote (no ckptfs metadata: its mtime is S3's own)
# is not "changed" when compared again after the TTL: read once, it stays
# in A's tier (persisted), not fetched again.
echo "from another tool" > "$T/foreign"
s3c put "$PREFIX/foreign" "$T/foreign"
within=0
# Found by a listing (its mtime from ListObjectsV2), compared later by a
# HEAD (Last-Modified): the two must agree.
for _ in $(seq 40); do ls "$MNT_A" | grep -qx foreign && within=1 && break; sleep 0.1; done
[ "$within" = 1 ] || fail "A does not show the foreign object"
same_bytes "$T/foreign" "$MNT_A/foreign"
expect_eq persisted "$(state_of "$MNT_A/foreign")" "the foreign object after a read"
ttl_wait
stat "$MNT_A/foreign" > /dev/null  # looked up again: compared with a HEAD
expect_eq persisted "$(state_of "$MNT_A/foreign")" "the foreign object after the TTL (compared again)"
same_bytes "$T/foreign" "$MNT_A/foreign"

"$CKPTFS" umount "$MNT_B" > /dev/null || fail "umount of B"
MNT=$MNT_A
umount_fs
check_log
