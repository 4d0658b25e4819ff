#!/usr/bin/env bash
# Replicas share the holder's one budget (--cache-size, issue #30): a
# holder whose tier is full of its own persisted checkpoints (a keep-all
# trainer) makes room for another member's replica by evicting the oldest
# of them — never its last save's files — and the replica counts in its
# tier (status, df); the holder's own next save still lands in RAM.
#   w: the writer (--replicas 1, its drain held); h: the holder, 48 MiB.
# serial: waits on the housekeeper's eviction and the replicator's retries
# tsan: the tier asking the replica store for room beside the link taking a replica
source "$(dirname "$0")/../lib/common.sh"
require_root

start_etcd 1
SECRET=$T/secret
make_secret "$SECRET"
COMMON=(--cluster job --member-timeout 2 --cluster-store "etcd://$ETCD_EPS" --replica-listen 127.0.0.1:0
  --cluster-secret "$SECRET")
mount_node h -- "${COMMON[@]}" --node h --cache-size 48M --replica-budget 24M --prealloc 0
H=$(node_mnt h)
MiB=1048576

# h keeps its checkpoints: 30 MiB in two old saves, then a new one of 8 MiB.
mkdir -p "$H/step1" "$H/step2" "$H/step3"
head -c $((15 * MiB)) /dev/urandom > "$H/step1/model.pt"
head -c $((15 * MiB)) /dev/urandom > "$H/step2/model.pt"
sleep 4.5  # a quiet spell past Residency::kSaveGap: the next file is a new save
head -c $((8 * MiB)) /dev/urandom > "$T/own3"
cp "$T/own3" "$H/step3/model.pt"
"$CKPTFS" drain "$H" --timeout 60 > /dev/null || fail "drain of h"
tj() { "$CKPTFS" status "$1" --json | $PY -c "import json,sys; j=json.load(sys.stdin); $2"; }
tj "$H" 'assert j["tier"]["used"] >= 38 * 2**20, j["tier"]' || fail "h's tier does not hold its saves: $(tj "$H" 'print(j["tier"])')"

touch "$T/pause_w"
mount_node w "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_w" -- "${COMMON[@]}" --node w --replicas 1
W=$(node_mnt w)
wait_for 20 "w does not see h's replica link" tj "$W" 'assert j["cluster"]["replicas"]["peers"] == 1'
mkdir -p "$W/step1"
head -c $((16 * MiB)) /dev/urandom > "$T/shard"
cp "$T/shard" "$W/step1/shard_w"
is_replicated() { [ "$(state_of "$W/step1/shard_w")" = replicated ]; }
wait_for 60 "w's shard never became replicated on h (h: $(tj "$H" 'print(j["tier"])'))" is_replicated

# In h's budget: its old saves made the room, its last one stays in RAM.
# (16 MiB, a page for its meta, 1 KiB per inode: replica::Store::Charge)
tj "$H" 'assert j["tier"]["replica_bytes"] == 16 * 2**20 + 4096 + 2048, j["tier"]' || fail "h's tier: $(tj "$H" 'print(j["tier"])')"
tj "$H" 't = j["tier"]; assert t["used"] + t["replica_bytes"] <= t["budget"], t' || fail "h over budget"
expect_eq persisted "$(state_of "$H/step3/model.pt")" "h's last save"
evicted=0
for s in step1 step2; do [ "$(state_of "$H/$s/model.pt")" = remote ] && evicted=$((evicted + 1)); done
[ "$evicted" -ge 1 ] || fail "none of h's old saves was evicted for the replica"
read -r size used avail < <(df -B1 --output=size,used,avail "$H" | tail -1)
[ $((size - used - avail)) -ge $((16 * MiB)) ] || fail "df of h does not show the replica apart: $size $used $avail"
note "h evicted $evicted old save(s) for w's 16 MiB replica; df: size $size used $used avail $avail"

# h's own next save lands in RAM beside the replica, and reads back.
mkdir -p "$H/step4"
head -c $((8 * MiB)) /dev/urandom > "$T/own4"
cp "$T/own4" "$H/step4/model.pt" || fail "h's own save beside the replica"
same_bytes "$T/own4" "$H/step4/model.pt" || fail "h's save reads back other bytes"
same_bytes "$T/own3" "$H/step3/model.pt" || fail "h's last save reads back other bytes"

rm -f "$T/pause_w"
"$CKPTFS" drain "$W" --timeout 60 > /dev/null || fail "drain of w"
same_bytes "$T/shard" "$BACKEND/step1/shard_w" || fail "the backend's shard differs"
umount_node w
umount_node h
check_log --allow-warnings "replicas:|replica link|etcd|lease|tier:"
echo "PASS: $CASE"
