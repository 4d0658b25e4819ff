#!/usr/bin/env bash
# The drain yields to a save (--drain-yield, fs/core/save_activity.h): a file
# closed while another is open for writing (opened just now) does not start
# to drain until the hold is over, and then does; `ckptfs status` says the
# drain waits. The hold never delays what someone waits for: an fsync with
# --fsync backend returns at once beside the open writer. A writer opened
# long ago (a log kept open) holds nothing; -o drain_yield=0 turns it off;
# bad values are refused in one line.
# serial: asserts a file is not in the backend 1.5 s into an 8 s hold, and is 2 s after a hold of 0 (timing)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

# in_backend_within SECONDS FILE: the file reaches the backend in time.
in_backend_within() {
  local i
  for i in $(seq $(($1 * 20))); do
    [ -f "$BACKEND/$2" ] && return 0
    sleep 0.05
  done
  return 1
}

# A writer that opens FILE, writes, and keeps it open until $T/stop exists.
hold_open() {
  rm -f "$T/stop"
  $PY -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"x" * 4096)
open(sys.argv[2] + ".opened", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
os.close(fd)' "$1" "$T/stop" &
  HOLDER=$!
  for _ in $(seq 200); do [ -f "$T/stop.opened" ] && break; sleep 0.02; done
  rm -f "$T/stop.opened"
}
release_holder() { touch "$T/stop"; wait "$HOLDER"; }

mount_fs --drain-yield 8000 --fsync backend
# 1. A file closed beside a writer opened just now waits for the hold.
head -c 1M /dev/urandom > "$T/a"
hold_open "$MNT/optim.pt"
cp "$T/a" "$MNT/model.pt"
sleep 1.5
[ -f "$BACKEND/model.pt" ] && fail "model.pt drained 1.5 s into an 8 s hold, beside an open writer"
$CKPTFS status "$MNT" | grep -q "^yield .*waiting for a save now" || fail "status does not say the drain waits: $($CKPTFS status "$MNT")"
[ "$($CKPTFS status --json "$MNT" | $PY -c 'import json,sys; print(json.load(sys.stdin)["drain"]["yielding"])')" = True ] ||
  fail "status --json: drain.yielding is not true"
# 2. ... but an fsync with --fsync backend is waited for: no hold.
t0=$(date +%s.%N)
$PY -c '
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"latest step")
os.fsync(fd)
os.close(fd)' "$MNT/latest"
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
awk -v d="$dt" 'BEGIN { exit !(d < 2.5) }' || fail "fsync (--fsync backend) took $dt s: it waited for the hold"
[ "$(cat "$BACKEND/latest")" = "latest step" ] || fail "latest not in the backend when its fsync returned"
same_bytes "$T/a" "$BACKEND/model.pt" || fail "model.pt (before latest) not in the backend after latest's fsync"
# 3. A writer opened long ago holds nothing: the hold is over.
sleep 7
cp "$T/a" "$MNT/second.pt"
in_backend_within 3 second.pt || fail "second.pt not drained 3 s after its close (the open writer is 8.5 s old)"
release_holder
$CKPTFS drain "$MNT" > /dev/null 2>&1 || fail "ckptfs drain failed"
$CKPTFS status "$MNT" | grep -q "^yield .*not waiting; [1-9][0-9]* transfers waited" ||
  fail "status does not count the transfers that waited: $($CKPTFS status "$MNT")"
umount_fs

# 4. -o drain_yield=0: no hold beside the open writer.
mount_fs -o drain_yield=0
hold_open "$MNT/optim2.pt"
cp "$T/a" "$MNT/model2.pt"
in_backend_within 2 model2.pt || fail "model2.pt not drained within 2 s with -o drain_yield=0"
release_holder
$CKPTFS status "$MNT" | grep -q "^yield" && fail "status shows a yield line with the drain never waiting"
umount_fs

# 5. Bad values: one line, exit 2, nothing mounted.
for bad in "--drain-yield x" "--drain-yield -1" "--drain-yield 60001" "-o drain_yield=1.5"; do
  # shellcheck disable=SC2086
  if "$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" $bad > "$T/bad.out" 2>&1; then
    fail "mount with $bad succeeded"
  fi
  [ "$(wc -l < "$T/bad.out")" = 1 ] || fail "$bad: not one line: $(cat "$T/bad.out")"
  grep -q "want milliseconds from 0 to 60000" "$T/bad.out" || fail "$bad: $(cat "$T/bad.out")"
  is_mounted && fail "$bad left a mount"
done
check_log
