#!/usr/bin/env bash
# The tier on huge pages (issue #15, --tier-huge on, cache/tier_mount.h;
# off by default). As root, for a tier directory on tmpfs, the tier gets a
# tmpfs of its own
# (huge=within_size): a save into pre-allocated pages lands in 2 MiB pages
# (seen in the tier file's mapping); it survives kill -9 and a restart with
# its files; it is detached when the tier is released or collected by
# `ckptfs gc`. Off, on a tier that already holds files, not on tmpfs, or
# behind a symlink: 4 KiB pages (or a refusal), the reason in status,
# nothing mounted anywhere else.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

pages() { "$CKPTFS" status "$MNT" | grep '^pages'; }
tier_mount() { findmnt -n -o FSTYPE,OPTIONS -M "$1" 2>/dev/null || true; }
spares() { "$CKPTFS" status --json "$MNT" | $PY -c 'import json,sys; print(json.load(sys.stdin)["passthrough"]["prealloc_bytes"])'; }
# pmd_mapped FILE: kB of FILE mapped by 2 MiB page-table entries once a
# process maps and reads all of it (0: 4 KiB pages).
pmd_mapped() {
  $PY - "$1" << 'EOF'
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
s = sum(m[i] for i in range(0, len(m), 4096))
ino = os.fstat(fd).st_ino
kb, cur = 0, False
for line in open("/proc/self/smaps"):
    f = line.split()
    if len(f) >= 5 and "-" in f[0] and f[4].isdigit():
        cur = int(f[4]) == ino
    elif cur and f[0] in ("ShmemPmdMapped:", "FilePmdMapped:"):
        kb += int(f[1])
print(kb)
EOF
}

# 1. --tier-huge on: the tier's own tmpfs, with huge pages.
mount_fs --cache-size 1G --tier-huge on
pages | grep -q "2 MiB" || fail "status: $(pages)"
tier_mount "$TIER" | grep -Eq "^tmpfs .*huge=within_size" || fail "tier mount: $(tier_mount "$TIER")"
expect_eq True "$("$CKPTFS" status --json "$MNT" | $PY -c 'import json,sys; print(json.load(sys.stdin)["tier"]["huge_pages"])')" \
  "status --json tier.huge_pages"
# A trainer's next save goes into pre-allocated pages: huge ones.
head -c 64M /dev/urandom > "$T/ref"
dd if="$T/ref" of="$MNT/step1.pt" bs=1M status=none  # O_TRUNC, as torch.save
"$CKPTFS" drain "$MNT" --timeout 120 > /dev/null
for _ in $(seq 100); do [ "$(spares)" -ge $((64 << 20)) ] && break; sleep 0.1; done
[ "$(spares)" -ge $((64 << 20)) ] || fail "no pages pre-allocated after the first save ($(spares) B)"
dd if="$T/ref" of="$MNT/step2.pt" bs=1M status=none
cmp "$T/ref" "$MNT/step2.pt" || fail "step2.pt reads back wrong"
tierfile=$TIER/$(printf '%016x' "$(stat -c %i "$MNT/step2.pt")")
[ -f "$tierfile" ] || fail "no tier file $tierfile for step2.pt"
kb=$(pmd_mapped "$tierfile")
[ "$kb" -ge $((32 << 10)) ] || fail "step2.pt's tier file is mapped with ${kb} kB of 2 MiB pages (want most of 64 MiB)"
note "step2.pt: ${kb} kB of its 64 MiB in 2 MiB pages"

# 2. kill -9 and a restart (with the default, off): the same tmpfs, the
# files in it, and status says what the tier has.
crash_daemon
tier_mount "$TIER" | grep -Eq "^tmpfs .*huge=within_size" || fail "the tier's tmpfs is gone after kill -9"
mount_fs --cache-size 1G
pages | grep -q "2 MiB" || fail "status after the restart: $(pages)"
[ "$(findmnt -n -M "$TIER" | wc -l)" = 1 ] || fail "the restart mounted a second tmpfs on the tier"
cmp "$T/ref" "$MNT/step1.pt" && cmp "$T/ref" "$MNT/step2.pt" || fail "files after kill -9 and restart"
[ "$(state_of "$MNT/step2.pt")" != remote ] || fail "step2.pt was not served from the tier after the restart"

# 3. A clean unmount with everything persisted gives the tier back: its
# tmpfs is detached and the directory removed.
umount_fs
[ -z "$(tier_mount "$TIER")" ] || fail "the tier's tmpfs is still mounted after the release: $(tier_mount "$TIER")"
[ ! -e "$TIER" ] || fail "$TIER is still there after the release"

# 4. --tier-huge off (the default; also -o tier_huge=off): the directory
# stays a plain one on /dev/shm.
mount_fs --cache-size 1G --tier-huge off
[ -z "$(tier_mount "$TIER")" ] || fail "--tier-huge off mounted a tmpfs"
pages | grep -q "4 KiB (huge pages off (--tier-huge off))" || fail "status: $(pages)"
cmp "$T/ref" "$MNT/step2.pt" || fail "step2.pt from the backend"
umount_fs
mount_fs --cache-size 1G -o tier_huge=off
[ -z "$(tier_mount "$TIER")" ] || fail "-o tier_huge=off mounted a tmpfs"
# 5. A tier that holds files from a mount on 4 KiB pages keeps them: no
# tmpfs over them, the reason in status.
cp "$T/ref" "$MNT/step3.pt"
umount_fs --keep-cache
mount_fs --cache-size 1G --tier-huge on
[ -z "$(tier_mount "$TIER")" ] || fail "a tmpfs was mounted over a tier holding files"
pages | grep -q "already holds files" || fail "status: $(pages)"
cmp "$T/ref" "$MNT/step3.pt" || fail "step3.pt after the remount"
umount_fs

# 6. Not on tmpfs: 4 KiB pages, said so. A symlink in the tier's place:
# refused, nothing mounted where it points.
if [ "$(stat -f -c %T "$T")" != tmpfs ]; then
  mount_fs --cache-size 1G --tier-dir "$T/disk-tier" --tier-huge on
  pages | grep -q "not on tmpfs" || fail "status with a tier on $(stat -f -c %T "$T"): $(pages)"
  [ -z "$(tier_mount "$T/disk-tier")" ] || fail "a tmpfs was mounted on a tier directory on disk"
  umount_fs
fi
mkdir "$TIER-target"
ln -s "$TIER-target" "$TIER-link"
expect_mount_refused "tier directory .*not a directory" "$MNT" --backend "$BACKEND" --state-dir "$STATE" \
  --tier-dir "$TIER-link" --cache-size 1G --tier-huge on
[ -z "$(tier_mount "$TIER-target")" ] || fail "a tmpfs was mounted through the symlink"
rm "$TIER-link"

# 7. A tier left by a dead daemon is collected with its tmpfs.
mount_fs --cache-size 1G --tier-dir "$TIER-gc" --tier-huge on
cp "$T/ref" "$MNT/gc.pt"
"$CKPTFS" drain "$MNT" --timeout 120 > /dev/null
crash_daemon
tier_mount "$TIER-gc" | grep -q "^tmpfs" || fail "the dead daemon's tier has no tmpfs"
"$CKPTFS" gc "$TIER-gc" > "$T/gc.out" 2>&1 || fail "ckptfs gc: $(cat "$T/gc.out")"
[ -z "$(tier_mount "$TIER-gc")" ] || fail "ckptfs gc left the tier's tmpfs mounted: $(cat "$T/gc.out")"
[ ! -e "$TIER-gc" ] || fail "ckptfs gc left $TIER-gc: $(cat "$T/gc.out")"

# 8. Bad values: one line, nothing mounted.
rc=0
"$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-huge maybe > "$T/bad.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q -- "--tier-huge" "$T/bad.out" || fail "--tier-huge maybe: rc $rc, $(cat "$T/bad.out")"
expect_mount_refused "tier_huge=on or tier_huge=off" "$MNT" --backend "$BACKEND" --state-dir "$STATE" -o tier_huge=2
! is_mounted || fail "a bad value left $MNT mounted"
check_log --allow-errors "tier directory|tier_huge"
