#!/usr/bin/env bash
# A replacement machine that mounts under the lost node's id (issue #30:
# "mounts with the same or a new node id"), before the lost node's lease
# has expired: three mounts a, b, c of one job, --replicas 1, etcd.
#  1. a's drain is held; a closes its shard of step 1, which becomes
#     `replicated`; b closes its shard and then step 1's `latest`.
#  2. a is lost (kill -9, tier and state dir deleted) and a new daemon
#     mounts at once with --node a and a new state dir, well within a's
#     30 s lease. Its record replaces a's under the same id, with another
#     incarnation (the state dir's id): the holder must publish a's shard
#     in a's place, not take the new record's "nothing pending" as a's
#     drain having applied it (it dropped the replica unpublished, and b's
#     `latest` reached the backend naming a step without a's shard); and
#     `latest` never stands in the backend without a's shard.
#  3. The new a reads a's shard back, and `latest --safe` names step 1 on
#     both ranks' nodes.
# serial: kills a daemon and mounts its replacement
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_job 30  # a's lease outlasts its replacement's mount

# ---- 1. the shards, a's replicated, and latest ----
mkdir -p "$A/global_step1" "$B/global_step1"
head -c 3000000 /dev/urandom > "$T/shard_a"
head -c 2000000 /dev/urandom > "$T/shard_b"
cp "$T/shard_a" "$A/global_step1/shard_a"
is_replicated() { [ "$(state_of "$A/global_step1/shard_a")" = replicated ]; }
wait_for 30 "a's shard never became replicated" is_replicated
holder=""
for n in b c; do for f in "$TIER-$n-replicas"/a.[1-9]*; do [ -f "$f" ] && holder=$n; done; done
[ -n "$holder" ] || fail "no holder of a's shard"
cp "$T/shard_b" "$B/global_step1/shard_b"
sleep 0.2  # the barrier
echo global_step1 > "$B/latest"
sleep 1
[ ! -e "$BACKEND/latest" ] || fail "latest reached the backend before a's shard (a's drain is held)"

# ---- 2. a is lost, and a new machine mounts under its id at once ----
kill_node a
t0=$(date +%s.%N)
rm -rf "$(node_state a)"
kept=(); for s in "${_STATE_DIRS[@]}"; do [ "$s" = "$(node_state a)" ] || kept+=("$s"); done; _STATE_DIRS=("${kept[@]}")
rm_tier "$TIER-a"
mount_node a2 -- "${COMMON[@]}" --member-timeout 30 --node a
A2=$(node_mnt a2)
since=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
[ "$since" -lt 25 ] || skip "the replacement mounted $since s after the kill: a's 30 s lease may have ended first"
note "a lost (its shard held by $holder); a new run of node a mounted $since s later"
for _ in $(seq 400); do
  if [ -e "$BACKEND/latest" ]; then
    [ -e "$BACKEND/global_step1/shard_a" ] || fail "latest is in the backend without a's shard"
    break
  fi
  sleep 0.1
done
if [ ! -e "$BACKEND/latest" ]; then
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/members/ >&2 || true
  fail "latest never reached the backend after a was replaced: $("$CKPTFS" status "$B")"
fi
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
note "latest in the backend $dt s after a was lost (its lease 30 s), a's shard before it"
same_bytes "$T/shard_a" "$BACKEND/global_step1/shard_a"
same_bytes "$T/shard_b" "$BACKEND/global_step1/shard_b"
H=$(node_mnt "$holder")
repl_of "$H" 'assert j["published_for_dead"] >= 1 and j["held_files"] == 0, j' ||
  fail "$holder did not publish a's shard for its dead run: $(repl_of "$H" 'print(j)')"
# b names a's first run dead (the digest's lost list), beside the live one.
"$CKPTFS" status "$B" --json | $PY -c 'import json, sys
c = json.load(sys.stdin)["cluster"]
runs = sorted(m["state"] for m in c["members"] if m["node"] == "a")
assert runs == ["dead", "live"], c["members"]' || fail "b's members: $("$CKPTFS" status "$B" --json)"

# ---- 3. the new run of a reads the shard back; latest --safe ----
same_bytes "$T/shard_a" "$A2/global_step1/shard_a"
for m in "$A2" "$B"; do
  expect_eq "$m/global_step1" "$("$CKPTFS" latest --safe "$m")" "latest --safe on $m"
done

for n in b c a2; do umount_node "$n"; done
check_log --allow-errors "lease expired|is dead|lost|new run" --allow-warnings "replicas:|replica link|etcd|lease|is dead|lost|new run"
echo "PASS: $CASE"
