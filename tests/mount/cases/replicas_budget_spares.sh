#!/usr/bin/env bash
# A holder's pre-allocated spares (pages for its own next save, holding
# nobody's bytes) give way to another member's replica when evicting its
# persisted files cannot make the room (issue #30: replicas count against
# the holder's budget; a replica is another node's only other copy of
# bytes not yet in the backend). Before, `MakeRoomForReplicas` evicted
# files only: a fresh holder whose budget was mostly its first-save spare
# answered WAIT for ever, and the writer's file never became `replicated`.
#   h: the holder, 48 MiB with a 40 MiB spare (--prealloc); w: the writer.
# serial: waits on the holder's spare and the replicator's retries
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_store # etcd, the secret, COMMON (--replicas 1: h writes nothing of its own here)
mount_node h -- "${COMMON[@]}" --node h --cache-size 48M --replica-budget 24M --prealloc 40M
H=$(node_mnt h)
MiB=1048576
tj() { "$CKPTFS" status "$1" --json | $PY -c "import json,sys; j=json.load(sys.stdin); $2"; }
[ "$(tj "$H" 'print(j["passthrough"]["active"])')" = True ] ||
  skip "passthrough not available here (no spares): $(tj "$H" 'print(j["passthrough"]["why_not"])')"
head -c $((16 * MiB)) /dev/urandom > "$T/shard"
# replicated_on HOLDER WRITER SPARE_MIB: once HOLDER has SPARE_MIB of
# spares, WRITER (its drain held) saves $T/shard as shard_WRITER, which
# must become `replicated` on HOLDER within its budget.
replicated_on() {
  local h=$1 w=$2 hm wm
  hm=$(node_mnt "$h")
  wait_for 20 "$h made no $3 MiB of spares" tj "$hm" "assert j['passthrough']['prealloc_bytes'] >= $3 * 2**20"
  touch "$T/pause_$w"
  mount_node "$w" "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_$w" -- "${COMMON[@]}" --node "$w"
  wm=$(node_mnt "$w")
  wait_for 20 "$w does not see $h's replica link" tj "$wm" 'assert j["cluster"]["replicas"]["peers"] == 1'
  cp "$T/shard" "$wm/shard_$w"
  is_replicated() { [ "$(state_of "$wm/shard_$w")" = replicated ]; }
  wait_for 30 "$w's shard never became replicated on $h ($h: $(tj "$hm" 'print(j["tier"], j["passthrough"]["prealloc_bytes"])'))" \
    is_replicated
  tj "$hm" 't = j["tier"]; assert t["used"] + t["replica_bytes"] <= t["budget"], t' || fail "$h over budget"
}
replicated_on h w 40
W=$(node_mnt w)
grep -q "dropped .* of pre-allocated spares for a replica" "$(node_state h)/ckptfs.log" ||
  fail "h's log does not say its spares made the room"
note "h dropped its spare for w's 16 MiB replica: $(tj "$H" 'print(j["tier"])')"
rm "$T/pause_w"
"$CKPTFS" drain "$W" --timeout 60 > /dev/null || fail "drain of w"
same_bytes "$T/shard" "$BACKEND/shard_w"
umount_node w
umount_node h

# A holder that saves too (every node of a job does): after its own save
# it makes spares for the next one again, 50 ms after they are dropped
# and well before the writer's next try (0.5-5 s): WAIT after WAIT, the
# replica never placed (review). Dropped, they are held off for a while.
mount_node h2 -- "${COMMON[@]}" --node h2 --cache-size 48M --replica-budget 24M --prealloc 40M
H2=$(node_mnt h2)
head -c $((8 * MiB)) /dev/urandom > "$H2/own.pt" # an O_TRUNC writer: spares for the next save follow
replicated_on h2 w2 24
W2=$(node_mnt w2)
[ "$(state_of "$H2/own.pt")" != remote ] || fail "h2's own last save was evicted for the replica"
note "h2, after a save of its own, dropped and held its spares for w2's replica: $(tj "$H2" 'print(j["tier"])')"
rm "$T/pause_w2"
"$CKPTFS" drain "$W2" --timeout 60 > /dev/null || fail "drain of w2"
umount_node w2
umount_node h2
check_log --allow-warnings "replica|etcd|lease|spare"
echo "PASS: $CASE"
