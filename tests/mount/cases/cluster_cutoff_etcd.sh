#!/usr/bin/env bash
# A node alive but cut off from etcd (issue #28): mounts a and b over one
# backend, a 1-member etcd, member timeout 2 s. b's daemon runs with
# CKPTFS_FAULT=etcd.cut:FILE: while FILE exists every request it makes to
# etcd fails and its open watches end, as in a network partition.
#  1. Step 1 on both: `latest` reaches the backend.
#  2. b cut off; each writes its shard of step 2, a writes `latest`: b's
#     writes land in RAM but it publishes nothing (its shard stays out of
#     the backend, and its status says why); b notices its lease expired
#     (log); a counts b dead and publishes `latest` (b's shard lost, as for
#     a dead node).
#  3. b reconnected: it rejoins under a new lease (log), a lists it live
#     again, and b's shard of step 2 drains.
#  5. Removals before they reach the backend (a's drain paused): a file a
#     removes, and the old name of one it renames, are gone for b's next
#     lookup, though the backend still holds them (the store's tombstones).
#  6. A name a made, then b removed with its drain paused: a's expiry of
#     its key (--shared-ttl + 1 s after a's drain) leaves b's tombstone in
#     etcd (the delete compares the key's mod_revision with a's put).
#  7. A node c mounted while cut off from etcd: the mount succeeds, c
#     publishes nothing; reconnected, it joins (a lists it live), drains,
#     and stays live past three lease TTLs (its lease is kept alive).
#  4. etcd frozen (SIGSTOP: it accepts connections and answers nothing):
#     a's mkdir answers within 2.5 s (the names' budget), the next ones at
#     once (etcd marked unreachable); thawed, the job goes on.
# serial: waits out a lease (the member timeout)
source "$(dirname "$0")/../lib/common.sh"
require_root

start_etcd 1
COMMON=(--cluster job --member-timeout 2 --cluster-store "etcd://$ETCD_EPS")
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause" -- "${COMMON[@]}" --node a
mount_node b "CKPTFS_FAULT=etcd.cut:$T/cut" "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_b" -- "${COMMON[@]}" --node b
A=$(node_mnt a) B=$(node_mnt b)
status_json() { "$CKPTFS" status "$1" --json; }
jq_py() { $PY -c "import json,sys; j=json.load(sys.stdin); $1"; }
members_of_a() { status_json "$A" | jq_py "m = {x['node']: x['state'] for x in j['cluster']['members']}; $1"; }
b_log_has() { grep -q -- "$1" "$(node_state b)/ckptfs.log"; }

wait_for 20 "a does not see b live" members_of_a 'assert m.get("b") == "live" and m.get("a") == "live", m'

# step N: a shard on each node, `latest` from a, both drained: it reaches
# the backend with both shards.
step() {
  mkdir -p "$A/global_step$1" "$B/global_step$1"
  head -c 200000 /dev/urandom > "$A/global_step$1/shard_a"
  head -c 200000 /dev/urandom > "$B/global_step$1/shard_b"
  echo "global_step$1" > "$A/latest"
  for n in a b; do "$CKPTFS" drain "$(node_mnt $n)" --timeout 60 > /dev/null || fail "step $1: drain of $n"; done
  expect_eq "global_step$1" "$(cat "$BACKEND/latest")" "latest of step $1"
  [ -f "$BACKEND/global_step$1/shard_b" ] || fail "b's shard of step $1 missing"
}

# ---- 1. a step on both ----
step 1

# ---- 2. b cut off ----
touch "$T/cut"
mkdir -p "$A/global_step2" "$B/global_step2"
head -c 200000 /dev/urandom > "$A/global_step2/shard_a"
head -c 200000 /dev/urandom > "$B/global_step2/shard_b" || fail "b's save failed while cut off"
cp "$B/global_step2/shard_b" "$T/shard_b2"
echo global_step2 > "$A/latest"
t0=$(date +%s.%N)
for _ in $(seq 300); do [ "$(cat "$BACKEND/latest")" = global_step2 ] && break; sleep 0.1; done
[ "$(cat "$BACKEND/latest")" = global_step2 ] ||
  fail "a did not publish latest after b's lease expired: $(status_json "$A" | jq_py 'print(j["cluster"])')"
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
note "b cut off: a published latest $dt s later (lease TTL 2 s)"
members_of_a 'assert m.get("b", "dead") == "dead", m' || fail "a lists b as $(members_of_a 'print(m)')"
wait_for 10 "b's log does not say its lease expired" b_log_has "lease expired (cut off from etcd"
sleep 1
[ ! -e "$BACKEND/global_step2/shard_b" ] || fail "b published its shard while cut off from etcd"
b_says_why() {
  status_json "$B" > "$T/b-status.json"
  jq_py < "$T/b-status.json" '
c = j["cluster"]
assert "lease expired" in c["last_error"] and "etcd.cut" in c["last_error"], c
assert c["waiting"] and c["publish_blocked_reason"], c
'
}
b_says_why || sleep 2
b_says_why || fail "b's status does not say why it holds: $(jq_py 'print(j["cluster"])' < "$T/b-status.json")"
note "b (cut off) held its shard, noticed its lease expired, and its status says why"

# ---- 3. b reconnected ----
rm -f "$T/cut"
wait_for 30 "b did not rejoin under a new lease" b_log_has "rejoins under a new lease"
wait_for 30 "a does not list b live again" members_of_a 'assert m["b"] == "live", m'
"$CKPTFS" drain "$B" --timeout 60 > /dev/null || fail "b: drain after reconnecting"
cmp "$T/shard_b2" "$BACKEND/global_step2/shard_b" || fail "b's shard of step 2 differs in the backend"
expect_eq global_step2 "$(cat "$BACKEND/latest")" "latest after b rejoined"
note "b reconnected: rejoined under a new lease, live on a, its shard drained"

# ---- 4. etcd frozen ----
ETCD_PID=$(cat "$T/etcd/m0.pid")
kill -STOP "$ETCD_PID"
at_exit "kill -CONT $ETCD_PID 2> /dev/null || true"
ms() { date +%s%3N; }
t0=$(ms); mkdir "$A/frozen1"; t1=$(ms)
[ $((t1 - t0)) -lt 2500 ] || fail "a's first mkdir with etcd frozen took $((t1 - t0)) ms"
t2=$(ms); mkdir "$A/frozen2"; mv "$A/frozen2" "$A/frozen3"; t3=$(ms)
[ $((t3 - t2)) -lt 500 ] || fail "a's next mkdir and rename with etcd frozen took $((t3 - t2)) ms"
note "etcd frozen: a's first mkdir $((t1 - t0)) ms, the next mkdir and rename $((t3 - t2)) ms"
kill -CONT "$ETCD_PID"
step 3

# ---- 5. removals seen by b before a's drain reaches the backend ----
mkdir -p "$A/keep"
echo one > "$A/keep/rm.txt"
echo two > "$A/keep/old.txt"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "drain of a before the removals"
touch "$T/pause"
rm "$A/keep/rm.txt"
mv "$A/keep/old.txt" "$A/keep/new.txt"
[ -f "$BACKEND/keep/rm.txt" ] && [ -f "$BACKEND/keep/old.txt" ] || fail "the backend lost the names with a's drain paused"
expect_errno ENOENT stat "$B/keep/rm.txt"
expect_errno ENOENT stat "$B/keep/old.txt"
rm -f "$T/pause"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "drain of a after the removals"
[ ! -e "$BACKEND/keep/rm.txt" ] && [ -f "$BACKEND/keep/new.txt" ] || fail "a's removals did not reach the backend"
expect_eq two "$(cat "$B/keep/new.txt")" "b reads the renamed file once persisted"
note "a's unlink and rename were seen by b's lookups before a's drain reached the backend"

# ---- 6. a's expiry leaves a key b wrote since ----
mkdir "$A/made_by_a"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "drain of a's mkdir"
touch "$T/pause_b"
rmdir "$B/made_by_a"
key=/ckptfs/job/ns/made_by_a
etcd_get() { ETCDCTL_API=3 etcdctl --endpoints="$ETCD_EPS" get --print-value-only "$key"; }
etcd_get | grep -q '"b"' || fail "b's tombstone not in etcd: $(etcd_get)"
sleep 4  # a's key held --shared-ttl (1 s) + 1 s after its drain, swept every few hundred ms
etcd_get | grep -q '"b"' || fail "a's expiry deleted the tombstone b wrote since: '$(etcd_get)'"
[ -d "$BACKEND/made_by_a" ] || fail "b's rmdir reached the backend with its drain paused"
rm -f "$T/pause_b"
"$CKPTFS" drain "$B" --timeout 60 > /dev/null || fail "drain of b's rmdir"
[ ! -e "$BACKEND/made_by_a" ] || fail "b's rmdir did not reach the backend"
note "a's expiry of its key left the tombstone b wrote over it"

# ---- 7. a node mounted while etcd is out of its reach ----
touch "$T/cut_c"
mount_node c "CKPTFS_FAULT=etcd.cut:$T/cut_c" -- "${COMMON[@]}" --node c
C=$(node_mnt c)
head -c 100000 /dev/urandom > "$C/shard_c"
cp "$C/shard_c" "$T/shard_c"
sleep 1
[ ! -e "$BACKEND/shard_c" ] || fail "c published a file before it ever reached etcd"
rm -f "$T/cut_c"
wait_for 30 "a does not list c live once etcd answers it" members_of_a 'assert m.get("c") == "live", m'
"$CKPTFS" drain "$C" --timeout 60 > /dev/null || fail "c: drain once etcd answers"
cmp "$T/shard_c" "$BACKEND/shard_c" || fail "c's file differs in the backend"
# Three lease TTLs later c is still live: its lease is kept alive.
for _ in 1 2 3 4 5 6; do
  sleep 1
  members_of_a 'assert m.get("c") == "live", m' || fail "c's lease was not kept alive: a lists c $(members_of_a 'print(m)')"
done
grep -q "lease expired" "$(node_state c)/ckptfs.log" && fail "c's lease expired after it joined"
note "c, mounted while cut off from etcd, joined once it answered, drained, and stayed live"

for n in a b c; do umount_node $n; done
check_log --allow-errors "lease expired|etcd.cut" --allow-warnings "etcd|is dead|rejoins|lost|unreachable|lease|drain holds"
echo "PASS: $CASE"
