#!/usr/bin/env bash
# Memory pressure gives way to the trainer (issue #12). Everything runs in a
# memory cgroup of 700 MiB (v1 or v2; SKIP where none can be made): the
# daemon, the tier pages it and the writers charge, and a hungry process
# that grows to 320 MiB in 10 MiB steps. With 420 MiB of persisted files in
# the tier:
# - control, --min-free 0 (the watch off): the kernel OOM-kills the hungry
#   process (so the case can fail);
# - --min-free 128M: the daemon evicts persisted files as the headroom
#   falls, the hungry process lives, the log and status say so, and the
#   files read back (from the backend);
# - dirty data is never dropped: with the drain held and the tier full of
#   dirty files, a new write waits (status: new writes wait) instead of the
#   daemon dropping anything, and goes on once the drain makes room.
# serial: a memory cgroup, and an OOM kill on purpose
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

make_memory_cgroup $((700 << 20))
# References made outside the cgroup (their page cache is not its charge).
for i in 1 2 3 4 5 6 7; do head -c 60M /dev/urandom > "$T/f$i"; done
head -c 16M /dev/urandom > "$T/late"
enter_memory_cgroup

hungry() { $PY "$LIB/hold_memory.py" "$1" 0.04; }  # grows at about 250 MB/s

fill_persisted() {
  for i in 1 2 3 4 5 6 7; do cp "$T/f$i" "$MNT/f$i"; done
  "$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || fail "drain: $(tail -5 "$T/drain.out")"
}

# Control: the watch off, the same load: the hungry process is killed.
mount_fs --cache-size 2G --min-free 0
fill_persisted
rc=0
hungry 320 > "$T/hungry.out" 2>&1 || rc=$?
note "control (--min-free 0): hungry exit $rc: $(cat "$T/hungry.out")"
[ "$rc" = 137 ] || fail "control: the hungry process was not OOM-killed (exit $rc): the case cannot tell anything"
umount_fs

# The watch on: persisted files make way.
mount_fs --cache-size 2G --min-free 128M
fill_persisted
grep -q "memory watch: --min-free 134217728" "$STATE/ckptfs.log" || fail "no memory watch started"
rc=0
hungry 320 > "$T/hungry.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "the hungry process died (exit $rc) although $((7 * 60)) MiB of the tier were in the backend: $(cat "$T/hungry.out")"
note "with --min-free 128M: $(cat "$T/hungry.out")"
grep -q "memory: .* under --min-free 134217728: evicted [1-9]" "$STATE/ckptfs.log" \
  || fail "no eviction line: $(grep 'memory' "$STATE/ckptfs.log")"
"$CKPTFS" status "$MNT" --json > "$T/status.json"
read -r episodes evicted <<< "$($PY -c 'import json,sys; m=json.load(open(sys.argv[1]))["memory"]; print(m["episodes"], m["evicted_files"])' "$T/status.json")"
[ "$episodes" -ge 1 ] && [ "$evicted" -ge 1 ] || fail "status memory: episodes $episodes, evicted files $evicted"
for i in 1 4 7; do cmp "$T/f$i" "$MNT/f$i" || fail "f$i does not read back after eviction"; done
umount_fs

# Dirty data is never dropped: writers wait instead.
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 2G --min-free 200M -o passthrough=off
# 9 x 60 MiB of dirty data in a 700 MiB cgroup: the headroom falls under
# 200M during the last copies, which may themselves wait (in the background).
(for i in 1 2 3 4 5 6 7 8 9; do cp "$T/f$((i % 7 + 1))" "$MNT/d$i" || exit 1; done) &
filler=$!
at_exit 'kill "$filler" 2> /dev/null'
waiting() {
  "$CKPTFS" status "$MNT" --json > "$T/status.json"
  $PY -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["memory"]["writers_wait"] else 1)' "$T/status.json"
}
for _ in $(seq 300); do waiting && break; sleep 0.1; done
waiting || fail "with the tier full of dirty data under --min-free, new writes do not wait: $(cat "$T/status.json")"
"$CKPTFS" status "$MNT" | grep -q "^PRESSURE .*new writes wait for the drain" || fail "text status: $("$CKPTFS" status "$MNT")"
cp "$T/late" "$MNT/late" &
writer=$!
sleep 2
kill -0 "$writer" 2> /dev/null || fail "a write went through under memory pressure with nothing evictable"
rm "$T/pause"
wait "$writer" || fail "the waiting write failed once the drain made room"
wait "$filler" || fail "a copy failed under memory pressure"
cmp "$T/late" "$MNT/late" || fail "late differs"
"$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || fail "drain after the pressure: $(tail -5 "$T/drain.out")"
for i in $(ls "$MNT" | grep '^d'); do
  n=${i#d}
  cmp "$T/f$((n % 7 + 1))" "$BACKEND/$i" || fail "$i lost or changed under memory pressure"
done
umount_fs
check_log --allow-warnings "memory: |tier: memory pressure" --allow-errors "^$"
