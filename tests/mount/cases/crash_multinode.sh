#!/usr/bin/env bash
# The multi-node mode of tests/crash/harness.py (issue #11), one iteration:
# three mounts with --cluster on one backend, one writer per rank (shards,
# a barrier, rank 0's latest and rotation), kill -9 of a random node's
# daemon, its remount (it rejoins), and P1 on every node, P2 and the
# cross-node P3 on the backend (latest never names a step missing a shard
# of any rank), watched while the writers run and through the drain.
# The seed is random and printed; one repeats with
#     tests/crash/harness.py --nodes 3 --seed S --iterations 1
# CRASH_SEED=S runs that seed.
# serial: kill points and the slowed drain race the writers by the clock
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

"$PY" "$ROOT/tests/crash/test_checks.py" || fail "the harness's own checks misbehave"
STORE_ARGS=()
if [ "${CLUSTER_STORE:-}" = etcd ]; then  # crash_multinode_etcd.sh
  start_etcd 3
  EPS=$ETCD_EPS
  STORE_ARGS=(--cluster-store "etcd://$EPS")
fi
rc=0
"$PY" "$ROOT/tests/crash/harness.py" --nodes 3 --root "$T" --tier-prefix "$TIER" "${STORE_ARGS[@]}" \
  ${CRASH_SEED:+--seed "$CRASH_SEED"} --iterations 1 || rc=$?
case $rc in
  0) ;;
  77) skip "crash harness cannot run here" ;;
  *) fail "multi-node crash harness: the iteration failed (seed above)" ;;
esac
echo "PASS: $CASE"
