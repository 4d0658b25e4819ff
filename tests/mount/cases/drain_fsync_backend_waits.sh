#!/usr/bin/env bash
# --fsync backend: fsync returns once the file (and everything closed
# before it) is in the backend, and a waiting fsync holds no FUSE worker
# (issue #10): with the drain stuck, 64 fsyncs wait (more than the 16
# workers) while stat, ls and `ckptfs status` answer at once; when the
# drain resumes every fsync returns, and each file was in the backend when
# its fsync returned.
# serial: asserts that fsyncs still wait after 3 s and that stat/ls/status answer within 2 s (timing)
# tsan: fsync=backend replies from the drain thread (WhenApplied), 64 of them pending at once
# asan: 64 fsyncs answered later by the drain thread, through the rings
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 256M --fsync backend
at_exit 'rm -f "$T/pause"'
cat > "$T/fsyncer.py" <<'PY'
import os, sys
path, backend = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, (os.path.basename(path) * 1000).encode())
os.fsync(fd)
# fsync returned: the bytes must be in the backend now.
with open(backend, "rb") as f:
    assert f.read() == (os.path.basename(path) * 1000).encode(), "not in the backend when fsync returned"
os.close(fd)
PY
pids=()
for i in $(seq 1 64); do
  $PY "$T/fsyncer.py" "$MNT/f$i" "$BACKEND/f$i" 2> "$T/f$i.err" &
  pids+=($!)
done
sleep 3
waiting=$(alive "${pids[@]}")
[ "$waiting" -ge 60 ] || fail "only $waiting fsyncs waiting"
expect_answers 2 "fsyncs wait for the backend"
rm -f "$T/pause"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || fail "fsync $((i + 1)): $(cat "$T/f$((i + 1)).err")"
done
umount_fs
check_log
