"""hold_memory.py MIB [PACE_S] [UNTIL]: grows to MIB MiB of touched memory
(resident, charged to its memory cgroup) in 10 MiB steps, PACE_S seconds
apart (default 0); prints "held"; then waits until the file UNTIL exists
(at most 60 s), or 1 s without one; prints "survived N MiB". Its
oom_score_adj is 1000: the OOM killer's first choice, never a daemon's."""
import os
import sys
import time

with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")
step, total = 10 << 20, int(sys.argv[1]) << 20
pace = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
until = sys.argv[3] if len(sys.argv) > 3 else None
held = []
while sum(len(b) for b in held) < total:
    b = bytearray(step)
    for i in range(0, step, 4096):
        b[i] = 1
    held.append(b)
    time.sleep(pace)
print("held", flush=True)
end = time.monotonic() + (60 if until else 1)
while time.monotonic() < end and not (until and os.path.exists(until)):
    time.sleep(0.05)
print("survived", sum(len(b) for b in held) >> 20, "MiB", flush=True)
