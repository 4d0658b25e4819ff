#!/usr/bin/env bash
# Evicted files come back from the backend verified: a backend copy
# corrupted on disk gives EIO and a log line, never wrong bytes.
# Also: fsync=backend returns only once the file is in the backend, and a
# new state dir over a backend that already holds files shows them as
# `remote`, readable.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 64M --fsync backend
/usr/bin/python3 - "$MNT/synced" "$BACKEND/synced" <<'PY'
import os, sys
data = os.urandom(5 << 20)
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, data)
os.fsync(fd)
# fsync=backend: the bytes are already in the backend, before close.
with open(sys.argv[2], "rb") as f:
    assert f.read() == data, "backend copy differs right after fsync"
os.close(fd)
PY
head -c 40M /dev/urandom > "$T/a"
cp "$T/a" "$MNT/a"
"$CKPTFS" drain "$MNT" --timeout 60
# Push `a` out of the 64M tier with other files.
for i in 1 2; do head -c 40M /dev/urandom > "$MNT/push$i"; done
"$CKPTFS" drain "$MNT" --timeout 60
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/a")" = remote ] || fail "a was not evicted"
cmp "$T/a" "$MNT/a" || fail "fetched copy differs"
for i in 1 2; do head -c 40M /dev/urandom > "$MNT/push$i"; done
"$CKPTFS" drain "$MNT" --timeout 60
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/a")" = remote ] || fail "a was not evicted again"
printf 'X' | dd of="$BACKEND/a" bs=1 seek=1000000 conv=notrunc 2>/dev/null
if cat "$MNT/a" > /dev/null 2> "$T/cat.err"; then fail "corrupted file read without error"; fi
grep -q "Input/output error" "$T/cat.err" || fail "expected EIO, got: $(cat "$T/cat.err")"
grep -q "checksum mismatch" "$STATE/ckptfs.log" || fail "no log line for the mismatch"
umount_fs

# A fresh state dir over this backend: the files are there, as remote.
STATE2=$T/state2
TIER2=$TIER-2
mount_fs --state-dir "$STATE2" --tier-dir "$TIER2" --cache-size 256M
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/synced")" = remote ] || fail "synced not remote"
cmp "$BACKEND/synced" "$MNT/synced" || fail "imported file reads wrong"
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/synced")" = persisted ] || fail "fetched file not persisted"
umount_fs
rm_tier "$TIER2"
check_log --allow-errors "checksum mismatch|fetch from backend" --allow-warnings "tier: full"
