#!/usr/bin/env bash
# reply_yield (fs/fuse/reply_yield.h; on by default, -o reply_yield=off): over io_uring a
# ring thread commits replies at SCHED_IDLE, so the woken caller stays on
# the CPU it slept on instead of moving to an idle one at every round trip.
# Status says so; a CPU-bound process doing 256 opens stays on its CPU for
# most of them (without it, on a 2-CPU VM: 188 moves in 192); requests and
# bytes are right, also with every CPU busy; no daemon thread is left at
# SCHED_IDLE; off with
# -o reply_yield=off and with -o io_uring=off, and status says why.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

field() { $CKPTFS status --json "$MNT" | $PY -c "import json,sys; print(json.load(sys.stdin)$1)"; }

mount_fs
wait_uring
if [ "$(field '["fuse_io_uring"]["active"]')" != True ]; then
  why=$(field '["fuse_io_uring"]["why_not"]')
  case "$why" in
    *"no FUSE over io_uring"*|*"cannot be turned on"*) skip "this kernel: $why" ;;
    *) fail "io_uring not in use on a kernel that has it: $why" ;;
  esac
fi
[ "$(field '["reply_yield"]["active"]')" = True ] || fail "reply_yield off: $(field '["reply_yield"]["why_not"]')"
$CKPTFS status "$MNT" | grep -q "^replies    yield the CPU to their caller (it wakes where it slept); [0-9]* threads put back by the watch$" ||
  fail "status: $($CKPTFS status "$MNT" | grep ^replies)"

mkdir "$MNT/d"
for i in $(seq 0 63); do head -c 8192 /dev/urandom > "$MNT/d/f$i"; done
cp -r "$MNT/d" "$T/d"

# 1. A process that has just been CPU-bound (as a trainer is) opens files
#    in a row: it stays on its CPU.
if [ "$(nproc)" -gt 1 ]; then
  cat > "$T/moves.py" <<'EOF'
import ctypes, os, sys, time
getcpu = ctypes.CDLL(None).sched_getcpu
t = time.time()
while time.time() - t < 1.0:  # CPU-bound for a second
    pass
paths = [os.path.join(sys.argv[1], f"f{i}") for i in range(64)]
moves, last = 0, None
for _ in range(4):
    for p in paths:
        os.close(os.open(p, os.O_RDONLY))
        c = getcpu()
        moves += last is not None and c != last
        last = c
print(moves)
EOF
  moves=$($PY "$T/moves.py" "$MNT/d")
  [ "$moves" -le 128 ] || fail "the caller changed CPU at $moves of 256 opens"
  echo "the caller changed CPU at $moves of 256 opens"
fi

# 2. Every CPU busy: 4 readers against 2 busy loops per CPU; every byte right.
cat > "$T/readers.py" <<'EOF'
import os, sys, multiprocessing as mp
def reader(k):
    for _ in range(20):
        for i in range(64):
            with open(f"{sys.argv[1]}/f{i}", "rb") as a, open(f"{sys.argv[2]}/f{i}", "rb") as b:
                assert a.read() == b.read(), i
ps = [mp.Process(target=reader, args=(k,)) for k in range(4)]
[p.start() for p in ps]
[p.join() for p in ps]
assert all(p.exitcode == 0 for p in ps), [p.exitcode for p in ps]
EOF
busy=()
for c in $(seq 0 $(($(nproc) - 1))); do
  for _ in 1 2; do taskset -c "$c" sh -c 'while :; do :; done' & busy+=($!); done
done
rc=0
timeout 120 $PY "$T/readers.py" "$MNT/d" "$T/d" || rc=$?
kill "${busy[@]}" 2>/dev/null || true
wait "${busy[@]}" 2>/dev/null || true
[ "$rc" = 0 ] || fail "reads with every CPU busy failed or hung (exit $rc)"
# A ring thread preempted at SCHED_IDLE by the busy loops gets its turn
# within 5 ms here (the watch's bound; unit reply_yield checks the watch).
echo "the watch put back $(field '["reply_yield"]["rescued"]') threads"

# 3. No daemon thread is left at SCHED_IDLE (policy 5) after the work.
pid=$(field '["pid"]')
sleep 0.5
idle=$({ grep -l "^policy *: *5$" /proc/"$pid"/task/*/sched 2>/dev/null || true; } | wc -l)
[ "$idle" = 0 ] || fail "$idle daemon threads still at SCHED_IDLE"
umount_fs

# 4. Off: by option, and on /dev/fuse.
mount_fs -o reply_yield=off
[ "$(field '["reply_yield"]["active"]')" = False ] || fail "replies yield with -o reply_yield=off"
$CKPTFS status "$MNT" | grep -q "^replies    at normal priority (reply_yield off (-o reply_yield=off))" ||
  fail "status: $($CKPTFS status "$MNT" | grep ^replies)"
same_bytes "$MNT/d/f7" "$T/d/f7" || fail "read without reply_yield differs"
umount_fs
mount_fs -o io_uring=off
[ "$(field '["reply_yield"]["why_not"]')" = "only over io_uring" ] || fail "why_not: $(field '["reply_yield"]["why_not"]')"
umount_fs
check_log
echo "PASS: $CASE"
