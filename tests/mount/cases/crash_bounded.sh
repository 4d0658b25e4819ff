#!/usr/bin/env bash
# The bounded crash set of tests/crash/harness.py: each kind of crash once:
# each failpoint (drain.mid_transfer, drain.after_publish, meta.after_commit,
# evict.mid, load.recovery), a node reboot, a trainer restart and one random
# kill -9 of the daemon, each checked against the writer's journal (see the
# harness's comment and docs/consistency.md, "What each kind of crash
# promises"). More random kills: `make crash-soak N=200`.
# The seeds are random; each is printed, and one repeats with
#     tests/crash/harness.py --seed S --iterations 1
# CRASH_SEED=S runs the bounded set that contains seed S.
# serial: kill points and the slowed drain race the writer by the clock
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

"$PY" "$ROOT/tests/crash/test_checks.py" || fail "the harness's own checks misbehave"
rc=0
"$PY" "$ROOT/tests/crash/harness.py" --bounded --root "$T" --tier-prefix "$TIER" \
  ${CRASH_SEED:+--seed "$CRASH_SEED"} || rc=$?
case $rc in
  0) ;;
  77) skip "crash harness cannot run here" ;;
  *) fail "crash harness: some iterations failed (seeds above)" ;;
esac
