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
has_spare() { tj "$H" 'assert j["passthrough"]["prealloc_bytes"] >= 40 * 2**20, j["passthrough"]'; }
wait_for 20 "h made no 40 MiB spare for its first save" has_spare

touch "$T/pause_w"
mount_node w "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_w" -- "${COMMON[@]}" --node w
W=$(node_mnt w)
wait_for 20 "w does not see h's replica link" tj "$W" 'assert j["cluster"]["replicas"]["peers"] == 1'
head -c $((16 * MiB)) /dev/urandom > "$T/shard"
cp "$T/shard" "$W/shard_w"
is_replicated() { [ "$(state_of "$W/shard_w")" = replicated ]; }
wait_for 30 "w's shard never became replicated on h (h: $(tj "$H" 'print(j["tier"], j["passthrough"]["prealloc_bytes"])'))" \
  is_replicated
tj "$H" 't = j["tier"]; assert t["used"] + t["replica_bytes"] <= t["budget"], t' || fail "h over budget"
grep -q "dropped .* of pre-allocated spares for a replica" "$(node_state h)/ckptfs.log" ||
  fail "h's log does not say its spares made the room"
note "h dropped its spare for w's 16 MiB replica: $(tj "$H" 'print(j["tier"])')"
rm "$T/pause_w"
"$CKPTFS" drain "$W" --timeout 60 > /dev/null || fail "drain of w"
same_bytes "$T/shard" "$BACKEND/shard_w"
umount_node w
umount_node h
check_log --allow-warnings "replica|etcd|lease|spare"
echo "PASS: $CASE"
