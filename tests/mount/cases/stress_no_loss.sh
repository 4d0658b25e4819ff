#!/usr/bin/env bash
# Nothing is reported lost with nothing crashed (issue #27: xfstests'
# fsstress on a fresh mount left `persist 'p0/f1' v2: lost` and 2 lost files
# with no daemon dead). Two causes, each reproduced exactly first, then a
# random stress (tests/mount/lib/fsstress.py: 4 processes of random writes,
# truncates, renames, links, unlinks, fsyncs, ... with fixed seeds) after
# which the drain must report everything persisted, nothing lost, and the
# backend must equal the mount.
#  1. An O_TRUNC open beside another writer truncated the live file while
#     the version that writer's flush had sealed was still to drain.
#  2. An O_RDWR passthrough writer's flush and close each count as a change
#     (stores through a mapping are invisible); the version its flush sealed
#     in place was left pending without bytes by the seal at its close.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

no_loss() {  # WHAT: the drain says all is persisted, and nothing is lost
  "$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || { cat "$T/drain.out" >&2; fail "$1: drain"; }
  expect_eq "" "$("$CKPTFS" lost "$MNT")" "$1: lost files"
  if grep -q "lost, its bytes" "$STATE/ckptfs.log"; then fail "$1: $(grep "lost, its bytes" "$STATE/ckptfs.log")"; fi
}

export CKPTFS_DRAIN_PAUSE_FILE=$T/pause
touch "$T/pause"
mount_fs --cache-size 1G
$PY - "$MNT" <<'EOF'
import os, sys
m = sys.argv[1]
# 1. O_TRUNC beside a writer whose flush sealed the version.
open(m + "/a", "wb").write(b"v1" * 1000)
a = os.open(m + "/a", os.O_RDWR)
os.pwrite(a, b"A" * 100, 0)              # v1 copied aside
d = os.dup(a); os.close(d)               # FLUSH by the last writer: seals v2 (live bytes)
os.mkdir(m + "/between1")                # logged after v2 (else v2 is dropped as superseded)
b = os.open(m + "/a", os.O_WRONLY | os.O_TRUNC)
os.mkdir(m + "/between2")
os.close(a)
os.write(b, b"B" * 500)
os.close(b)
# 2. An O_RDWR passthrough writer: its flush seals in place, its close
# seals again (a passthrough writer to follow an O_TRUNC one).
w = os.open(m + "/b", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(w, b"x" * 4096)
c = os.open(m + "/b", os.O_RDWR)
os.close(w)
os.pwrite(c, b"y" * 100, 0)
d = os.dup(c); os.close(d)               # FLUSH: sealed
os.mkdir(m + "/between3")
os.close(c)                              # sealed again at close
open(m + "/other", "w").write("x")
os.unlink(m + "/a")
os.unlink(m + "/b")
EOF
rm "$T/pause"
no_loss "exact cases"
umount_fs
unset CKPTFS_DRAIN_PAUSE_FILE

# The random stress, two seeds, each on a fresh mount with a 4 GiB budget.
for seed in 1 2; do
  rm -rf "$BACKEND" "$STATE"
  mkdir -p "$BACKEND"
  mount_fs --cache-size 4G
  $PY "$LIB/fsstress.py" "$MNT/s$seed" --procs 4 --ops 2500 --seed "$seed" || fail "fsstress seed $seed: unexpected errors"
  no_loss "fsstress seed $seed"
  check_backend
  umount_fs
done
check_log
echo "stress_no_loss: ok"
