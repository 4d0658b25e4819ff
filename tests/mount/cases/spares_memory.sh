#!/usr/bin/env bash
# Spares never past the memory there is (issue #29). A spare is tmpfs pages
# nothing can reclaim, claimed ahead of a save; with the memory watch off
# (--min-free 0) one is still made only where the memory there is
# (MemAvailable, and the memory cgroup's limit) leaves twice its size.
# In a 600 MiB memory cgroup, with a process holding all of it but about
# 150 MiB, a fresh mount with --prealloc 200M makes no spare, and that
# process lives (without the check the spare took the cgroup past its
# limit and the OOM killer took a process: stop 47 saw the daemon go).
# Once the process has gone the same mount makes its spare (a refused
# first spare is asked again), and a save uses it and reads back.
# serial: a memory cgroup, sized from what the daemon takes
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

LIMIT=$((600 << 20))
make_memory_cgroup "$LIMIT"
head -c 64M /dev/urandom > "$T/ckpt"  # outside the cgroup: its page cache is not its charge
enter_memory_cgroup

spares() {
  "$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["passthrough"]["prealloc_bytes"])'
}

# What the daemon itself takes in the cgroup (no spares: --prealloc 0).
mount_fs --cache-size 2G --min-free 0 --prealloc 0
sleep 1
sync
echo 1 > /proc/sys/vm/drop_caches
base=$(cat "$CG_USAGE")
umount_fs
# A process holds the cgroup's memory but for ~150 MiB beyond the
# daemon's: less than twice the 200 MiB spare, and less than the spare.
hold=$(((LIMIT - base - (150 << 20)) >> 20))
[ "$hold" -ge 100 ] || skip "the daemon takes $((base >> 20)) MiB of the $((LIMIT >> 20)) MiB cgroup"
note "cgroup ${LIMIT} bytes, the daemon and this shell $((base >> 20)) MiB, the holder $hold MiB"

$PY "$LIB/hold_memory.py" "$hold" 0 "$T/release" > "$T/holder.out" 2>&1 &
holder=$!
at_exit 'kill "$holder" 2> /dev/null'
for _ in $(seq 300); do grep -q held "$T/holder.out" && break; sleep 0.1; done
grep -q held "$T/holder.out" || fail "the holder did not take its memory: $(cat "$T/holder.out")"

mount_fs --cache-size 2G --min-free 0 --prealloc 200M
sleep 3  # the spare thread asks every 50 ms
made=$(spares)
touch "$T/release"
rc=0
wait "$holder" || rc=$?
[ "$rc" = 0 ] || fail "the process holding the cgroup's memory died (exit $rc; spares $made bytes): $(cat "$T/holder.out")"
[ "$made" = 0 ] || fail "a $made-byte spare was made with $((((LIMIT - base) >> 20) - hold)) MiB left in the cgroup"
note "with the holder: no spare; $(tail -1 "$T/holder.out")"

# The memory is there again: the fresh mount's spare is made now.
for _ in $(seq 100); do [ "$(spares)" -gt 0 ] && break; sleep 0.1; done
made=$(spares)
[ "$made" -gt 0 ] || fail "no spare once the memory was there again"
note "without the holder: a spare of $made bytes"
$PY -c 'import sys; d = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(d)' "$T/ckpt" "$MNT/ckpt"
cmp "$T/ckpt" "$MNT/ckpt" || fail "the save does not read back"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null || fail "drain"
cmp "$T/ckpt" "$BACKEND/ckpt" || fail "the backend's copy differs"
umount_fs
check_log
echo "PASS: $CASE"
