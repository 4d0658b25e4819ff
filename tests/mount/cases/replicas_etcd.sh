#!/usr/bin/env bash
# Replicas in peers' memory (--replicas, issue #30), the parts built so far:
# three mounts a, b, c of one job over one backend and a 1-member etcd,
# each with a replica link on 127.0.0.1 and the same --cluster-secret.
#  1. Bad input: --replicas without --cluster-store, a listener on 0.0.0.0,
#     a secret file others can read, a short secret, --replicas 9,
#     --replica-group 0: one line, exit 2, nothing mounted.
#  2. With a's drain held, a file closed on a becomes `replicated`; one of b
#     and c holds a replica whose bytes are the file's, in its tier's budget
#     (status, df: free but not available, and the metrics); status says so on
#     both sides; `ckptfs latest --safe` names its checkpoint, --persisted
#     does not.
#  3. The holder leaves the cluster: the file is sent to the other member
#     (`replicated` means held by live members).
#  4. a's drain goes on: the file is persisted and the replica dropped.
#  5. A member d with another secret: its replication is refused by the
#     holders (logged and counted there), nothing of it is held, and its
#     file is never `replicated`.
# serial: four daemons with replica links and an etcd
# tsan: the replica link's UCX thread, the replicator and the members' watch beside the drain and the FUSE workers
source "$(dirname "$0")/../lib/common.sh"
require_root

start_etcd 1
STORE="etcd://$ETCD_EPS"
SECRET=$T/secret
make_secret "$SECRET"
COMMON=(--cluster job --member-timeout 2 --cluster-store "$STORE")
REPL=(--replica-listen 127.0.0.1:0 --cluster-secret "$SECRET")

# ---- 1. bad input ----
cp "$SECRET" "$T/open-secret"; chmod 644 "$T/open-secret"
echo short > "$T/short-secret"; chmod 600 "$T/short-secret"
bad_mount() {  # bad_mount WHAT ARGS...
  local what=$1; shift
  mkdir -p "$T/badmnt"
  out=$("$CKPTFS" mount "$T/badmnt" --backend "$BACKEND" --state-dir "$T/badstate" --tier-dir "$TIER-bad" \
        --cluster job "$@" 2>&1) && fail "$what was accepted"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "$what: not one line: $out"
  ! findmnt -M "$T/badmnt" > /dev/null || fail "$what: mounted anyway"
  note "$what: $out"
}
bad_mount "--replicas without --cluster-store" --replicas 1 "${REPL[@]}"
bad_mount "a listener on 0.0.0.0" --cluster-store "$STORE" --replicas 1 --replica-listen 0.0.0.0:7000 \
  --cluster-secret "$SECRET"
bad_mount "a secret others can read" --cluster-store "$STORE" --replicas 1 --replica-listen 127.0.0.1:0 \
  --cluster-secret "$T/open-secret"
bad_mount "a short secret" --cluster-store "$STORE" --replicas 1 --replica-listen 127.0.0.1:0 \
  --cluster-secret "$T/short-secret"
bad_mount "--replicas 9" --cluster-store "$STORE" --replicas 9 "${REPL[@]}"
bad_mount "--replica-group 0" --cluster-store "$STORE" --replicas 1 --replica-group 0 "${REPL[@]}"
bad_mount "--replicas without a listener" --cluster-store "$STORE" --replicas 1 --cluster-secret "$SECRET"

# ---- 2. a file closed on a is replicated on b or c ----
touch "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --node a --replicas 1 "${REPL[@]}" \
  --metrics-textfile "$T/a.prom"
mount_node b -- "${COMMON[@]}" --node b --replicas 1 "${REPL[@]}" --metrics-textfile "$T/b.prom"
mount_node c -- "${COMMON[@]}" --node c --replicas 1 "${REPL[@]}" --metrics-textfile "$T/c.prom"
A=$(node_mnt a) B=$(node_mnt b) C=$(node_mnt c)
status_json() { "$CKPTFS" status "$1" --json; }
repl_of() {  # repl_of MOUNT PYTHON: j is status.cluster.replicas
  status_json "$1" | $PY -c "import json,sys; j=json.load(sys.stdin)['cluster']['replicas']; $2"
}
wait_for 20 "a does not see b's and c's replica links" repl_of "$A" 'assert j["peers"] == 2, j'

mkdir -p "$A/global_step1"
head -c 9437185 /dev/urandom > "$T/shard_a"  # 9 MiB + 1: three chunks, the last short
cp "$T/shard_a" "$A/global_step1/shard_a"
is_replicated() { [ "$(state_of "$A/global_step1/shard_a")" = replicated ]; }
wait_for 30 "a's shard never became replicated (state $(state_of "$A/global_step1/shard_a"))" is_replicated
[ ! -e "$BACKEND/global_step1/shard_a" ] || fail "the shard reached the backend with a's drain held"
expect_eq "$A/global_step1" "$("$CKPTFS" latest --safe "$A")" "latest --safe once the shard is replicated"
! "$CKPTFS" latest --persisted "$A" > /dev/null 2>&1 || fail "latest --persisted names a checkpoint not persisted"
held=$( (ls "$TIER-b-replicas" "$TIER-c-replicas" 2> /dev/null || true) | grep '^a\.[1-9]' | grep -vc '\.meta$' || true)
expect_eq 1 "$held" "replicas of a's shard held by b and c"
replica="" holder=""
for n in b c; do
  for f in "$TIER-$n-replicas"/a.[1-9]*; do [ -f "$f" ] && [ "${f%.meta}" = "$f" ] && replica=$f holder=$n; done
done
[ -n "$replica" ] || fail "no replica file of a's shard"
same_bytes "$T/shard_a" "$replica" || fail "the replica's bytes differ from the shard's"
H=$(node_mnt "$holder")
repl_of "$A" 'assert j["replicated_files"] == 1 and j["replicas"] == 1, j' || fail "a's status: $(repl_of "$A" 'print(j)')"
# What it takes of the budget (replica::Store::Charge): its 9437185 bytes,
# a page for its meta and 1 KiB for each of its two files' inodes.
CHARGED=$((9437185 + 4096 + 2048))
repl_of "$H" "assert j['held_files'] == 1 and j['held_bytes'] == $CHARGED, j" ||
  fail "$holder's status: $(repl_of "$H" 'print(j)')"
repl_of "$H" "assert j['failure_group'] == '$holder', j" || fail "$holder's failure group: $(repl_of "$H" 'print(j)')"
grep -q "replicas held here for 2 other member(s): 1 files" <<< "$("$CKPTFS" status "$H")" ||
  fail "$holder's status text: $("$CKPTFS" status "$H")"
# One budget: the replica takes the holder's tier room, shown apart in
# status and in df (free but not available: Size - Used - Avail).
status_json "$H" | $PY -c "import json,sys; t=json.load(sys.stdin)['tier']; assert t['replica_bytes'] == $CHARGED, t" ||
  fail "$holder's tier does not count the replica: $(status_json "$H")"
grep -q "of other members' replicas" <<< "$("$CKPTFS" status "$H")" || fail "status text: $("$CKPTFS" status "$H")"
read -r size used avail < <(df -B1 --output=size,used,avail "$H" | tail -1)
apart=$((size - used - avail))
[ "$apart" -ge "$CHARGED" ] && [ "$apart" -le $((CHARGED + 8192)) ] ||
  fail "df of $holder: size $size - used $used - avail $avail = $apart, not the replica's $CHARGED bytes"
note "df of $holder: $apart bytes of the budget held for a's replica, apart from its files"
# And in the metrics (the text file is written every 5 s).
metric_is() { grep -qx "ckptfs_$2 $3" "$T/$1.prom"; }
wait_for 15 "a's metrics: $(grep replica "$T/a.prom")" metric_is a replicas_replicated_files_total 1
wait_for 15 "$holder's metrics: $(grep replica "$T/$holder.prom")" metric_is "$holder" replicas_held_files 1
metric_is "$holder" tier_replica_bytes "$CHARGED" || fail "$holder's metrics: $(grep replica "$T/$holder.prom")"
note "a's shard replicated on $holder"

# ---- 3. the holder leaves: the shard goes to the other member ----
umount_node "$holder"
other=b; [ "$holder" = b ] && other=c
on_other() { for f in "$TIER-$other-replicas"/a.[1-9]*; do [ -f "$f" ] && [ "${f%.meta}" = "$f" ] && return 0; done; return 1; }
wait_for 30 "a's shard was not sent to $other after $holder left" on_other
wait_for 10 "a's shard is not replicated after $holder left" is_replicated
for f in "$TIER-$other-replicas"/a.[1-9]*; do [ "${f%.meta}" = "$f" ] && same_bytes "$T/shard_a" "$f"; done
note "$holder left: a's shard replicated on $other"
holder=$other H=$(node_mnt "$other")

# ---- 4. persisted: the replica is dropped ----
rm -f "$T/pause_a"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "drain of a"
same_bytes "$T/shard_a" "$BACKEND/global_step1/shard_a" || fail "the backend's shard differs"
expect_eq persisted "$(state_of "$A/global_step1/shard_a")" "the shard's state once drained"
no_replica() { ! (ls "$TIER-$holder-replicas" || true) | grep -q '^a\.'; }
wait_for 20 "the replica on $holder was not dropped once the shard was persisted" no_replica
repl_of "$A" 'assert j["dropped"] >= 1, j' || fail "a's status: $(repl_of "$A" 'print(j)')"

# ---- 5. a member without the secret ----
make_secret "$T/other-secret"
touch "$T/pause_d"
mount_node d "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_d" -- "${COMMON[@]}" --node d --replicas 1 \
  --replica-listen 127.0.0.1:0 --cluster-secret "$T/other-secret"
D=$(node_mnt d)
head -c 1048576 /dev/urandom > "$D/intruder"
refused() { [ "$(repl_of "$H" 'print(j["peers_refused"])')" -ge 1 ]; }
wait_for 30 "$holder did not refuse d" refused
sleep 1
[ "$(state_of "$D/intruder")" != replicated ] || fail "d's file counts as replicated without the secret"
! (ls "$TIER-b-replicas" "$TIER-c-replicas" || true) | grep -q '^d\.' || fail "a replica of d's file is held"
repl_of "$D" 'assert j["failures"] >= 1 and j["replicated_files"] == 0, j' || fail "d's status: $(repl_of "$D" 'print(j)')"
grep -q "failed the handshake" "$(node_state "$holder")/ckptfs.log" || fail "$holder did not log the refused handshake"
! grep -q -- "$(cat "$T/other-secret")" "$(node_state b)/ckptfs.log" "$(node_state c)/ckptfs.log" \
  "$(node_state d)/ckptfs.log" || fail "a secret is in a log"
rm -f "$T/pause_d"

for n in a "$holder" d; do umount_node "$n"; done
check_log --allow-errors "replica link: refused|failed the handshake" --allow-warnings "replicas:|replica link|etcd|lease"
echo "PASS: $CASE"
