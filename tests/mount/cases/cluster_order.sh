#!/usr/bin/env bash
# Cross-node ordered persistence (--cluster, issue #11): three mounts a, b, c
# over one backend, node b's drain held back (CKPTFS_DRAIN_PAUSE_FILE).
#  1. Ordering: shards of global_step1 from c, a and b, a barrier, then a
#     writes `latest`: while b's shard is not in the backend, `latest` never
#     is (watched every 5 ms), yet c's and a's shards drain; a's status says
#     its drain waits for b. Once b resumes, both appear, b's shard first.
#  2. Death: step 2 the same way, then b's daemon is killed (kill -9):
#     until its heartbeat is --member-timeout old, `latest` still names
#     global_step1 (complete); then b is dead, a's `latest` (global_step2)
#     drains, and a's and c's status list b dead with its lost shard, the
#     only file of step 2 missing from the backend. b mounted again (same
#     state dir) rejoins live and drains the shard it still had in RAM.
#  3. A clean unmount (c) writes "left": the others no longer wait for it.
# serial: measures time (a member timeout, "never appears for N seconds")
# tsan: the cluster's sampler and heartbeat threads beside the drain that asks them, three daemons
source "$(dirname "$0")/../lib/common.sh"

TIMEOUT=4
PAUSE=$T/pause-b
COMMON=(--cluster job --member-timeout "$TIMEOUT")
# CLUSTER_STORE=etcd (cluster_order_etcd.sh): the same, with the records in
# a 3-member etcd (--cluster-store): b is dead when its lease expires.
if [ "${CLUSTER_STORE:-}" = etcd ]; then
  start_etcd 3
  EPS=$ETCD_EPS
  COMMON+=(--cluster-store "etcd://$EPS")
fi
mount_node a -- "${COMMON[@]}" --node a
mount_node b CKPTFS_DRAIN_PAUSE_FILE="$PAUSE" -- "${COMMON[@]}" --node b
mount_node c -- "${COMMON[@]}" --node c
A=$(node_mnt a) B=$(node_mnt b) C=$(node_mnt c)

status_json() { "$CKPTFS" status "$1" --json; }
jq_py() { $PY -c "import json,sys; j=json.load(sys.stdin); $1"; }

# Watches the backend every 5 ms until `latest` holds $1 and $2 exists;
# fails (exit 1) if `latest` ever holds $1 while $2 does not exist.
watch_order() {
  $PY - "$BACKEND" "$1" "$2" <<'EOF'
import os, sys, time
root, want, shard = sys.argv[1:]
deadline = time.time() + 120
while time.time() < deadline:
    try:
        latest = open(os.path.join(root, "latest")).read().strip()
    except OSError:
        latest = ""
    has_shard = os.path.exists(os.path.join(root, shard))
    if latest == want and not has_shard:
        print(f"latest = {want} while {shard} is not in the backend"); sys.exit(1)
    if latest == want and has_shard:
        sys.exit(0)
    time.sleep(0.005)
print("timed out"); sys.exit(2)
EOF
}

# ---- 1. ordering ----
touch "$PAUSE"
# Files closed closer together than the ordering margin (docs/consistency.md)
# may reach the backend in either order: b writes 0.2 s after a and c.
for n in c a b; do
  m=$(node_mnt $n)
  [ $n = b ] && sleep 0.2
  mkdir -p "$m/global_step1"
  head -c 300000 /dev/urandom > "$m/global_step1/shard_$n"
done
sleep 0.2  # the barrier: longer than the ordering margin (one sample, 10 ms, + the clocks' offset)
watch_order global_step1 global_step1/shard_b > "$T/watch1.out" 2>&1 &
WATCH=$!
echo global_step1 > "$A/latest"
for _ in $(seq 100); do
  [ -f "$BACKEND/global_step1/shard_a" ] && [ -f "$BACKEND/global_step1/shard_c" ] && break
  sleep 0.1
done
[ -f "$BACKEND/global_step1/shard_a" ] && [ -f "$BACKEND/global_step1/shard_c" ] \
  || fail "a's and c's shards (closed before b's) did not drain while b is held"
sleep 3
[ ! -e "$BACKEND/latest" ] || fail "latest reached the backend while b's shard is not there"
status_json "$A" | jq_py '
c = j["cluster"]
assert c["name"] == "job" and c["node"] == "a", c
assert c["waiting"] and "b" in c["waiting_for"], c
m = {x["node"]: x for x in c["members"]}
assert set(m) == {"a", "b", "c"}, m
assert m["b"]["state"] == "live" and m["b"]["unpersisted"] >= 1, m["b"]
' || fail "a's status does not say its drain waits for b"
"$CKPTFS" status "$A" | grep -q "waiting  the drain holds entry .* for b" || fail "status text: no wait line"
note "latest held for 3 s behind b's shard; a and c drained"
rm "$PAUSE"
wait "$WATCH" || fail "ordering: $(cat "$T/watch1.out")"
expect_eq global_step1 "$(cat "$BACKEND/latest")" "latest in the backend"
for n in a b c; do cmp "$(node_mnt $n)/global_step1/shard_$n" "$BACKEND/global_step1/shard_$n" || fail "shard_$n differs"; done
note "b resumed: its shard, then latest"

# ---- 2. death ----
touch "$PAUSE"
for n in c a b; do
  m=$(node_mnt $n)
  [ $n = b ] && sleep 0.2
  mkdir -p "$m/global_step2"
  head -c 200000 /dev/urandom > "$m/global_step2/shard_$n"
done
sleep 0.2
echo global_step2 > "$A/latest"
sleep 2
expect_eq global_step1 "$(cat "$BACKEND/latest")" "latest while b holds a shard of step 2"
cp "$B/global_step2/shard_b" "$T/shard_b2"
t0=$(date +%s.%N)
kill_node b
for _ in $(seq 300); do
  # One read per turn: read twice, the drain could publish between the two
  # (at b's member timeout) and the second read fail a correct run.
  now=$(cat "$BACKEND/latest")
  [ "$now" = global_step2 ] && break
  expect_eq global_step1 "$now" "latest before b is declared dead"
  sleep 0.1
done
expect_eq global_step2 "$(cat "$BACKEND/latest")" "latest after b's member timeout"
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
note "b killed; latest = global_step2 reached the backend $dt s later (member timeout $TIMEOUT s)"
[ ! -e "$BACKEND/global_step2/shard_b" ] || fail "b's shard of step 2 is in the backend though b was killed"
for n in a c; do
  [ -f "$BACKEND/global_step2/shard_$n" ] || fail "shard_$n of step 2 missing"
  # Each node sees b dead at its own next read of the records, and its drain
  # stops waiting at its next poll (50 ms): a status asked the moment a's
  # `latest` went through may predate both on c (CI, under TSan).
  ok=0
  for _ in $(seq 50); do
    status_json "$(node_mnt $n)" | jq_py '
c = j["cluster"]
m = {x["node"]: x for x in c["members"]}
assert m["b"]["state"] == "dead", m["b"]
assert c["lost_count"] == 1, c
assert c["lost"] == [{"node": "b", "path": "global_step2/shard_b"}], c["lost"]
assert not c["waiting"], c
' 2> "$T/status-$n.err" && { ok=1; break; }
    sleep 0.1
  done
  [ "$ok" = 1 ] || { cat "$T/status-$n.err"; fail "node $n's status does not list b dead with its lost shard"; }
  "$CKPTFS" status "$(node_mnt $n)" | grep -q "lost: b: global_step2/shard_b" || fail "status text of $n: no lost line"
done
note "a and c list b dead, global_step2/shard_b lost"

# b comes back with the same state dir: live again, its shard (still in
# its memory tier) drains.
mount_node b -- "${COMMON[@]}" --node b
"$CKPTFS" drain "$B" --timeout 60 > /dev/null || fail "b: drain after the restart"
cmp "$T/shard_b2" "$BACKEND/global_step2/shard_b" || fail "b's recovered shard differs in the backend"
sleep 1.5
status_json "$A" | jq_py '
m = {x["node"]: x for x in j["cluster"]["members"]}
assert m["b"]["state"] == "live", m["b"]
assert j["cluster"]["lost_count"] == 0, j["cluster"]
' || fail "b did not rejoin in a's status"
note "b rejoined live and drained its shard"

# ---- 3. a clean unmount does not hold the others ----
umount_node c
sleep 1
# (with etcd, c's record goes with its revoked lease)
status_json "$A" | jq_py '
m = {x["node"]: x for x in j["cluster"]["members"]}
assert ("c" not in m) if j["cluster"]["store"].startswith("etcd") else m["c"]["state"] == "left", m
' || fail "c did not leave"
mkdir -p "$A/global_step3" "$B/global_step3"
echo 3 > "$B/global_step3/shard_b"
echo 3 > "$A/global_step3/shard_a"
sleep 0.2
echo global_step3 > "$A/latest"
"$CKPTFS" drain "$A" --timeout 20 > /dev/null || fail "a's drain waited for c, which left"
expect_eq global_step3 "$(cat "$BACKEND/latest")" "latest of step 3"
[ -f "$BACKEND/global_step3/shard_b" ] || fail "b's shard of step 3 missing before latest"
note "c left; a and b go on without it"

# Nothing of the records' area is visible through a mount.
[ ! -e "$A/.ckptfs-cluster" ] || fail ".ckptfs-cluster visible through the mount"
expect_errno EPERM mkdir "$A/.ckptfs-cluster"
umount_node a
umount_node b
check_log --allow-warnings "member b is dead"
