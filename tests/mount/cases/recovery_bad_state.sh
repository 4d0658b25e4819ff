#!/usr/bin/env bash
# Start-up with state that does not fit: each is refused with one clear line
# and a non-zero exit, leaving nothing mounted — never a daemon serving
# wrong bytes. A state dir made for another backend; a corrupted RocksDB; a
# tier directory owned by another user. And a backend changed behind the
# mount's back: the changed file reads as EIO (checksum), not wrong bytes.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

mount_fs
head -c 3M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/model.pt"
"$CKPTFS" drain "$MNT" --timeout 60
umount_fs

# 1. The same state dir over another backend.
mkdir "$T/other"
expect_mount_refused "belongs to backend $BACKEND" "$MNT" --backend "$T/other" --state-dir "$STATE" --tier-dir "$TIER"

# 2. A tier directory owned by someone else.
mkdir -p "$T/foreign-tier" && chown 65534:65534 "$T/foreign-tier" && chmod 700 "$T/foreign-tier"
expect_mount_refused "tier directory .*owned by uid 65534" "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$T/foreign-tier"

# 3. A backend file changed behind the mount's back: EIO, and a log line.
rm_tier "$TIER"  # a node reboot: model.pt is persisted, so it comes back remote
mount_fs
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/model.pt")" = remote ] ||
  fail "model.pt should be remote after the tier was lost"
printf 'XXXX' | dd of="$BACKEND/model.pt" bs=1 seek=1000 conv=notrunc status=none
if cat "$MNT/model.pt" > /dev/null 2> "$T/cat.err"; then fail "read of a corrupted backend file succeeded"; fi
grep -q "Input/output error" "$T/cat.err" || fail "want EIO, got: $(cat "$T/cat.err")"
umount_fs
check_log --allow-errors "checksum mismatch|fetch|belongs to backend|tier directory"

# 4. A corrupted RocksDB (every SST and the manifest overwritten).
for f in "$STATE"/meta/MANIFEST-* "$STATE"/meta/*.sst "$STATE"/meta/*.log; do
  [ -f "$f" ] && head -c 4096 /dev/urandom > "$f"
done
expect_mount_refused "metadata" "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER"
