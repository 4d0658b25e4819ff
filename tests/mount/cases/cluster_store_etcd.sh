#!/usr/bin/env bash
# The cluster store in etcd (--cluster-store etcd://, issue #28): four
# mounts a..d over one backend, a 3-member etcd on 127.0.0.1.
#  1. Rank 0 makes the step directory on a, then (0 ms after, no sleep)
#     ranks 1..3 write their shards into it on b, c, d: every write
#     succeeds, five steps in a row (with --shared-ttl 30, so that nothing
#     but the store can make it work), and each step's `latest` reaches the
#     backend after every shard.
#  2. Close-to-open for a persisted file: b reads `latest`, a rewrites it and
#     drains; b's next open reads the new bytes (not 30 s stale).
#  3. One etcd member killed: nothing changes (a checkpoint goes through).
#  4. etcd stopped: saves keep landing in memory, `latest` is held (not in
#     the backend) and status says why; etcd back: it is published.
#  5. Hostile keys: a member record without a lease and one with a lease
#     but times ten years ahead are no members (the drain is not held).
#  6. Bad --cluster-store input: one line, exit 2, nothing mounted.
# serial: four daemons and a 3-member etcd; stops etcd under a running job
source "$(dirname "$0")/../lib/common.sh"

ETCD=$ROOT/tests/etcd/etcd.sh
start_etcd 3
EPS=$ETCD_EPS
STORE="etcd://$EPS"
note "etcd at $EPS"

# ---- 6. bad input first (nothing mounted yet) ----
for bad in "http://127.0.0.1:2379" "etcd://" "etcd://host" "etcd://h:99999" "etcd://a b:1"; do
  mkdir -p "$T/badmnt"
  out=$("$CKPTFS" mount "$T/badmnt" --backend "$BACKEND" --state-dir "$T/badstate" --tier-dir "$TIER-bad" \
        --cluster job --cluster-store "$bad" 2>&1) && fail "--cluster-store '$bad' was accepted"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "--cluster-store '$bad': not one line: $out"
  printf '%s' "$out" | grep -q -- "--cluster-store" || fail "--cluster-store '$bad': message does not say which option: $out"
  ! findmnt -M "$T/badmnt" > /dev/null || fail "mounted with a bad --cluster-store"
done
out=$("$CKPTFS" mount "$T/badmnt" --backend "$BACKEND" --state-dir "$T/badstate" --cluster-store "$STORE" 2>&1) \
  && fail "--cluster-store without --cluster was accepted"
printf '%s' "$out" | grep -q "need --cluster" || fail "no --cluster: $out"
echo secret > "$T/pw"; chmod 644 "$T/pw"
out=$("$CKPTFS" mount "$T/badmnt" --backend "$BACKEND" --state-dir "$T/badstate" --cluster job --cluster-store "$STORE" \
      --cluster-store-user u --cluster-store-password-file "$T/pw" 2>&1) && fail "a world-readable password file was accepted"
printf '%s' "$out" | grep -q "chmod 600" || fail "world-readable password file: $out"
note "bad --cluster-store input refused in one line"

COMMON=(--cluster job --member-timeout 5 --shared-ttl 30 --cluster-store "$STORE")
for n in a b c d; do mount_node "$n" -- "${COMMON[@]}" --node "$n"; done
A=$(node_mnt a) B=$(node_mnt b) C=$(node_mnt c) D=$(node_mnt d)
status_json() { "$CKPTFS" status "$1" --json; }
jq_py() { $PY -c "import json,sys; j=json.load(sys.stdin); $1"; }

# Waits until every node's status shows 4 live members and a leader.
for _ in $(seq 100); do
  status_json "$A" | jq_py 'c = j["cluster"]; assert c["live_members"] == 4 and c["leader"], c' 2>/dev/null && break
  sleep 0.1
done
status_json "$A" | jq_py 'c = j["cluster"]; assert c["live_members"] == 4 and c["leader"] and c["store"].startswith("etcd://"), c' \
  || fail "a does not see 4 live members and an elected one"
"$CKPTFS" status "$A" | grep -q "store    etcd://.*4 live members" || fail "status text: no store line"

# ---- 1. rank 0's mkdir, a barrier, every rank's shard at once ----
cat > "$T/ranks.py" <<'PY'
# ranks.py STEP MNT0 MNT1 ...: rank 0 makes STEP/ on its mount; then at
# once (no sleep: the barrier is this process) the others write their
# shards into it on theirs; exits 1 naming any that failed.
import os, sys
step, mnts = sys.argv[1], sys.argv[2:]
os.mkdir(os.path.join(mnts[0], step))
bad = []
for r, m in enumerate(mnts):
    try:
        with open(os.path.join(m, step, f"shard_{r}"), "wb") as f:
            f.write(os.urandom(100000))
    except OSError as e:
        bad.append(f"rank {r}: {e}")
sys.exit("; ".join(bad) if bad else 0)
PY
for s in 1 2 3 4 5; do
  $PY "$T/ranks.py" "global_step$s" "$A" "$B" "$C" "$D" || fail "step $s: a shard could not be written"
  echo "global_step$s" > "$A/latest"
done
for n in a b c d; do "$CKPTFS" drain "$(node_mnt $n)" --timeout 60 > /dev/null || fail "drain of $n"; done
expect_eq global_step5 "$(cat "$BACKEND/latest")" "latest after five steps"
for s in 1 2 3 4 5; do
  for r in 0 1 2 3; do [ -f "$BACKEND/global_step$s/shard_$r" ] || fail "global_step$s/shard_$r missing in the backend"; done
done
note "rank 0's mkdir seen at once by ranks 1..3 on b, c, d: 5 of 5 steps (shared TTL 30 s)"

# ---- 2. close-to-open of a persisted file ----
expect_eq global_step5 "$(cat "$B/latest")" "b reads latest"
echo global_step6 > "$A/latest"
"$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "drain of a"
sleep 0.2  # the name of a persisted file is written by a's sweeper (every 25 ms)
expect_eq global_step6 "$(cat "$B/latest")" "b's open after a's latest was persisted"
note "b's open after a's drain reads the new latest (TTL 30 s)"

# ---- 3. one etcd member killed ----
"$ETCD" kill "$T/etcd" 0
$PY "$T/ranks.py" global_step7 "$A" "$B" "$C" "$D" || fail "step 7 (one etcd member down): a shard failed"
echo global_step7 > "$A/latest"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "drain of a with one etcd member down"
expect_eq global_step7 "$(cat "$BACKEND/latest")" "latest with one etcd member down"
"$ETCD" restart "$T/etcd" 0 || fail "etcd member 0 did not come back"
note "one of three etcd members killed: the job went on"

# ---- 4. etcd stopped under the job ----
"$ETCD" stop "$T/etcd"
for r in 0 1 2 3; do
  m=$(node_mnt $(echo a b c d | cut -d' ' -f$((r + 1))))
  mkdir -p "$m/global_step8"
  head -c 100000 /dev/urandom > "$m/global_step8/shard_$r" || fail "a save failed with etcd down"
done
echo global_step8 > "$A/latest"
sleep 2
expect_eq global_step7 "$(cat "$BACKEND/latest")" "latest while etcd is down"
status_json "$A" | jq_py '
c = j["cluster"]
assert c["waiting"] or c["publish_blocked_reason"], c
assert c["last_error"], c
' || fail "a's status does not say why publication holds"
for i in 0 1 2; do "$ETCD" restart "$T/etcd" "$i" > /dev/null 2>&1 & done
wait
for _ in $(seq 300); do [ "$(cat "$BACKEND/latest")" = global_step8 ] && break; sleep 0.1; done
expect_eq global_step8 "$(cat "$BACKEND/latest")" "latest once etcd is back"
for r in 0 1 2 3; do [ -f "$BACKEND/global_step8/shard_$r" ] || fail "global_step8/shard_$r missing after etcd came back"; done
note "etcd stopped: saves landed, latest held; etcd back: published in order"

# ---- 5. hostile keys ----
EP0=${EPS%%,*}
b64() { printf %s "$1" | base64 -w0; }
put() { curl -sf "http://$EP0/v3/kv/put" -d "{\"key\":\"$(b64 "$1")\",\"value\":\"$(b64 "$2")\"${3:+,\"lease\":\"$3\"}}" > /dev/null; }
future=$(( ($(date +%s) + 10 * 365 * 86400) * 1000000 ))
put /ckptfs/job/members/ghost "{\"version\":2,\"cluster\":\"job\",\"node\":\"ghost\",\"state\":\"live\",\"heartbeat_us\":$(date +%s)000000,\"watermark_us\":0,\"oldest_gate_us\":1,\"unpersisted\":1,\"paths\":[],\"refused\":[]}" \
  || fail "could not write the lease-less key"
lease=$(curl -sf "http://$EP0/v3/lease/grant" -d '{"TTL":"60"}' | $PY -c 'import json,sys; print(json.load(sys.stdin)["ID"])')
put /ckptfs/job/members/future "{\"version\":2,\"cluster\":\"job\",\"node\":\"future\",\"state\":\"live\",\"heartbeat_us\":$future,\"watermark_us\":0,\"oldest_gate_us\":$future,\"unpersisted\":1,\"paths\":[],\"refused\":[]}" "$lease" \
  || fail "could not write the future key"
mkdir -p "$A/global_step9" && echo 9 > "$A/global_step9/shard_0"
echo global_step9 > "$A/latest"
"$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "a's drain was held by a forged record"
expect_eq global_step9 "$(cat "$BACKEND/latest")" "latest with forged records in etcd"
status_json "$A" | jq_py '
c = j["cluster"]
assert [r["node"] for r in c["refused"]] == ["future"], c["refused"]
assert "ghost" not in [m["node"] for m in c["members"]], c["members"]
' || fail "a's status: the forged records"
note "a record without a lease and one ten years ahead: no members"

# No password or token anywhere a user sees it.
for n in a b c d; do umount_node $n; done
check_log --allow-errors "etcd|record of future is refused|cluster job" --allow-warnings "."
