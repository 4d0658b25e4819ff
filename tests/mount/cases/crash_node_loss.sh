#!/usr/bin/env bash
# A lost node is not a lost checkpoint (issue #30): the crash harness's kind
# mn-lost, one iteration. Three mounts with --replicas 1 over a private etcd,
# one writer per rank (shards, a barrier, rank 0's latest and rotation);
# kill -9 of a random node's daemon, its tier and state dir deleted; a fresh
# node (same or new --node id) mounts in its place once every live node
# drained. P1': every file of the lost node seen replicated or persisted
# before the kill reads back from the backend and the fresh node; P2; P3
# across nodes (latest never names a step missing a shard that was not lost
# with the node), watched while the writers run and through the takeover.
# The seed is random and printed; one repeats with
#     tests/crash/harness.py --nodes 3 --kind mn-lost --cluster-store etcd://HOST:PORT --seed S
# CRASH_SEED=S runs that seed.
# serial: kill points, leases and the slowed drain race the writers by the clock
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

"$PY" "$ROOT/tests/crash/test_checks.py" || fail "the harness's own checks misbehave"
start_etcd 1
rc=0
"$PY" "$ROOT/tests/crash/harness.py" --nodes 3 --kind mn-lost --cluster-store "etcd://$ETCD_EPS" --root "$T" \
  --tier-prefix "$TIER" ${CRASH_SEED:+--seed "$CRASH_SEED"} --iterations 1 || rc=$?
case $rc in
  0) ;;
  77) skip "crash harness cannot run here" ;;
  *) fail "node-loss crash harness: the iteration failed (seed above)" ;;
esac
echo "PASS: $CASE"
