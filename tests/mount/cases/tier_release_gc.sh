#!/usr/bin/env bash
# Memory that belongs to someone (issue #12): the tier names its owner;
# `ckptfs umount` gives the tier's RAM back once everything is persisted
# (df of /dev/shm drops, the directory is gone, a remount reads the files
# from the backend); --keep-cache keeps it (a remount serves from RAM);
# --no-drain keeps it; `ckptfs gc` leaves a tier a daemon holds alone,
# keeps one whose files are not all in the backend (unless --force),
# removes one whose files are, and refuses what is not a tier.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

shm_used() { df -B1 --output=used /dev/shm | tail -n 1 | tr -d ' '; }
gc() { "$CKPTFS" gc "$@"; }

mount_fs --cache-size 512M
head -c 48M /dev/urandom > "$T/a.ref"
head -c 16M /dev/urandom > "$T/b.ref"
cp "$T/a.ref" "$MNT/a"
mkdir "$MNT/d"
cp "$T/b.ref" "$MNT/d/b"

# The owner record.
[ -f "$TIER/.owner" ] || fail "no .owner in the tier"
owner_of() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$TIER/.owner" "$1"; }
expect_eq "$STATE" "$(owner_of state_dir)" ".owner state_dir"
expect_eq "$MNT" "$(owner_of mountpoint)" ".owner mountpoint"
expect_eq "$(_our_daemons | head -1)" "$(owner_of pid)" ".owner pid"

# A tier in use is never touched, even with --force.
gc --force "$TIER" > "$T/gc.out" 2>&1 || fail "gc of a tier in use failed: $(cat "$T/gc.out")"
grep -qF "kept: in use by a running daemon" "$T/gc.out" || fail "gc of a tier in use: $(cat "$T/gc.out")"
cmp "$T/a.ref" "$MNT/a" || fail "a changed after gc of its tier in use"

# Clean umount: drained, then the tier's memory is given back. (df of
# /dev/shm is only noted: other cases write there at the same time.)
in_tier=$(du -s -B1 "$TIER" | cut -f1)
[ "$in_tier" -ge $((64 << 20)) ] || fail "the tier holds $in_tier bytes before the umount, want the 64 MiB written"
before=$(shm_used)
"$CKPTFS" umount "$MNT" > "$T/umount.out" 2>&1 || fail "umount: $(cat "$T/umount.out")"
wait_daemon_exit
after=$(shm_used)
note "umount: $(cat "$T/umount.out"); tier held $in_tier bytes; /dev/shm used $before -> $after"
grep -qF "memory tier released" "$T/umount.out" || fail "umount does not say the tier was released: $(cat "$T/umount.out")"
[ ! -e "$TIER" ] || fail "the tier dir is still there after a clean umount: $(ls -la "$TIER")"
grep -qF "released: " "$STATE/ckptfs.log" || fail "no release line in the log"

# The remount reads them from the backend.
mount_fs --cache-size 512M
expect_eq remote "$(state_of "$MNT/a")" "state of a after a released umount"
cmp "$T/a.ref" "$MNT/a" || fail "a does not read back after the release"
cmp "$T/b.ref" "$MNT/d/b" || fail "d/b does not read back after the release"

# --keep-cache: the next mount serves from RAM.
"$CKPTFS" umount --keep-cache "$MNT" > "$T/umount.out" 2>&1 || fail "umount --keep-cache: $(cat "$T/umount.out")"
wait_daemon_exit
grep -qF "memory tier kept in" "$T/umount.out" || fail "umount --keep-cache: $(cat "$T/umount.out")"
[ -e "$TIER/.owner" ] || fail "--keep-cache removed the tier"
mount_fs --cache-size 512M
expect_eq persisted "$(state_of "$MNT/a")" "state of a after umount --keep-cache"

# Not drained (drain paused) and unmounted with --no-drain: kept, and gc
# keeps it too (its file is not in the backend) unless --force.
umount_fs  # released
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M
head -c 8M /dev/urandom > "$T/c.ref"
cp "$T/c.ref" "$MNT/c"
"$CKPTFS" umount --no-drain "$MNT" > "$T/umount.out" 2>&1 || fail "umount --no-drain: $(cat "$T/umount.out")"
wait_daemon_exit
[ -e "$TIER" ] || fail "umount --no-drain removed the tier"
gc -n "$TIER" > "$T/gc.out" 2>&1 || fail "gc -n: $(cat "$T/gc.out")"
grep -qF "kept: 1 files, 1 changes not in the backend" "$T/gc.out" || fail "gc -n of an undrained tier: $(cat "$T/gc.out")"
gc "$TIER" > "$T/gc.out" 2>&1 || fail "gc: $(cat "$T/gc.out")"
grep -qF "kept: " "$T/gc.out" || fail "gc removed a tier holding a file not in the backend: $(cat "$T/gc.out")"
gc --json "$TIER" > "$T/gc.json"
expect_eq "False 8388608" "$($PY -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print(r["all_persisted"], r["bytes"])' "$T/gc.json")" "gc --json"
# The next mount drains it; the umount after gives the memory back.
rm "$T/pause"
mount_fs --cache-size 512M
cmp "$T/c.ref" "$MNT/c" || fail "c does not read back"
"$CKPTFS" umount --keep-cache "$MNT" > /dev/null 2>&1 || fail "umount --keep-cache"
wait_daemon_exit
cmp "$T/c.ref" "$BACKEND/c" || fail "c did not reach the backend"
# Now every file is in the backend: gc -n names it, gc removes it.
gc -n "$TIER" > "$T/gc.out" 2>&1
grep -qF "would be removed: every file is in the backend" "$T/gc.out" || fail "gc -n: $(cat "$T/gc.out")"
[ -e "$TIER" ] || fail "gc -n removed the tier"
gc "$TIER" > "$T/gc.out" 2>&1 || fail "gc: $(cat "$T/gc.out")"
grep -qF "removed: every file is in the backend" "$T/gc.out" || fail "gc: $(cat "$T/gc.out")"
[ ! -e "$TIER" ] || fail "gc left the tier"
mount_fs --cache-size 512M
for f in a d/b c; do cmp "$T/$(basename $f).ref" "$MNT/$f" || fail "$f after gc and a remount"; done
umount_fs

# A tier of unknown owner (made before owners were recorded): kept unless
# --force. Something that is not a tier: refused, untouched.
old="$T/old-tier"
mkdir -m 700 "$old"
head -c 1M /dev/urandom > "$old/0000000000000002"
gc "$old" > "$T/gc.out" 2>&1 || fail "gc of an ownerless tier: $(cat "$T/gc.out")"
grep -qF "kept: owner unknown" "$T/gc.out" || fail "gc of an ownerless tier: $(cat "$T/gc.out")"
gc --force "$old" > "$T/gc.out" 2>&1 || fail "gc --force: $(cat "$T/gc.out")"
[ ! -e "$old" ] || fail "gc --force left an ownerless tier"
empty="$T/empty-tier"
mkdir -m 700 "$empty"
touch "$empty/.lock"
gc "$empty" > "$T/gc.out" 2>&1 || fail "gc of an empty tier: $(cat "$T/gc.out")"
grep -qF "removed: empty" "$T/gc.out" || fail "gc of an empty ownerless tier: $(cat "$T/gc.out")"
[ ! -e "$empty" ] || fail "gc left an empty tier"
foreign="$T/foreign"
mkdir -m 700 "$foreign"
echo precious > "$foreign/notes.txt"
rc=0
gc --force "$foreign" > "$T/gc.out" 2>&1 || rc=$?
expect_eq 1 "$rc" "gc exit status for a directory that is not a tier"
grep -qF "not a ckptfs tier" "$T/gc.out" || fail "gc of a foreign dir: $(cat "$T/gc.out")"
expect_eq precious "$(cat "$foreign/notes.txt")" "the foreign file"
check_log
