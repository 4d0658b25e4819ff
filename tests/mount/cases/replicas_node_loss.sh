#!/usr/bin/env bash
# A lost node is not a lost checkpoint (--replicas 1, issue #30): three
# mounts a, b, c of one job over one backend and a 1-member etcd.
#  1. a's drain is held (a slow backend); a closes its shard of step 1, which
#     becomes `replicated` on b or c; a also writes its optimizer state into
#     a staging directory renamed into place (opt_step1/), and a scratch
#     file it removes — namespace entries, replicated too; b closes its own
#     shard and a scratch file, then (after the "barrier") step 1's `latest`.
#  2. a is lost: kill -9 of its daemon, its tier and state dir deleted (a
#     replacement machine). Once its lease expires the holder publishes a's
#     shard in a's place and applies its namespace entries in its order:
#     the backend ends with both shards and opt_step1/opt_a, bytes as
#     written, no staging directory and no scratch file, and `latest` never
#     stands in the backend without a's shard and a's rename. b removes its
#     scratch file right after a's loss, before the cluster knows of it:
#     ordered after whatever a took with it, that removal is kept out of
#     the backend, listed by b's status and noted by `ckptfs drain`; the
#     shared namespace shows the file again, and removed again, it goes.
#  3. A fresh node a2 mounts and reads a's shard back (from the holder);
#     every rank resumes from `ckptfs latest --safe` and torch.load gives
#     the tensors it saved.
# serial: kills a daemon and waits out its lease
# tsan: the takeover thread publishing beside the drain, the replica link and the cluster's ticks
source "$(dirname "$0")/../lib/common.sh"
require_root

# a's lease (its --member-timeout) is 6 s: b's removal right after a's
# loss is made well before the cluster knows of it, however busy the machine.
replica_job 6

# ---- 1. the shards, a's replicated, and latest ----
mkdir -p "$A/global_step1" "$B/global_step1"
# Each rank's shard: a torch.save of tensors of several sizes.
$PY -c 'import torch' 2> /dev/null || skip "$PY has no torch"
shard() {  # shard SEED FILE
  $PY -c 'import sys, torch
torch.manual_seed(int(sys.argv[1]))
torch.save({"layer.w": torch.randn(1000, 1200), "layer.b": torch.randn(1200), "emb": torch.randn(50, 64),
            "step": 1}, sys.argv[2])' "$@"
}
shard 1 "$T/shard_a"
shard 2 "$T/shard_b"
cp "$T/shard_a" "$A/global_step1/shard_a"
is_replicated() { [ "$(state_of "$A/global_step1/shard_a")" = replicated ]; }
wait_for 30 "a's shard never became replicated" is_replicated
holder=""
for n in b c; do for f in "$TIER-$n-replicas"/a.[1-9]*; do [ -f "$f" ] && holder=$n; done; done
[ -n "$holder" ] || fail "no holder of a's shard"
# A staging directory renamed into place, and a scratch file removed.
head -c 2000000 /dev/urandom > "$T/opt_a"
mkdir "$A/staging.tmp"
cp "$T/opt_a" "$A/staging.tmp/opt_a"
echo scratch > "$A/scratch_a"
staged_replicated() { [ "$(state_of "$A/staging.tmp/opt_a")" = replicated ]; }
wait_for 30 "a's staged file never became replicated" staged_replicated
mv "$A/staging.tmp" "$A/opt_step1"
rm "$A/scratch_a"
entries_held() { repl_of "$A" 'assert j["queued"] == 0 and j["replicated_entries"] >= 4, j'; }
wait_for 30 "a's namespace entries were not replicated: $(repl_of "$A" 'print(j)')" entries_held
cp "$T/shard_b" "$B/global_step1/shard_b"
echo scratch > "$B/scratch_b"
sleep 0.2  # the barrier
echo global_step1 > "$B/latest"
sleep 1
[ ! -e "$BACKEND/latest" ] || fail "latest reached the backend before a's shard (a's drain is held)"

# ---- 2. a is lost ----
tier_a=$TIER-a
kill_node a
rm "$B/scratch_b"  # before the cluster knows of a's loss (its lease: 6 s)
rm -rf "$(node_state a)"
kept=(); for s in "${_STATE_DIRS[@]}"; do [ "$s" = "$(node_state a)" ] || kept+=("$s"); done; _STATE_DIRS=("${kept[@]}")
rm_tier "$tier_a"
note "a lost (its shard held by $holder)"
t0=$(date +%s.%N)
for _ in $(seq 300); do
  if [ -e "$BACKEND/latest" ]; then
    [ -e "$BACKEND/global_step1/shard_a" ] || fail "latest is in the backend without a's shard"
    [ -e "$BACKEND/opt_step1/opt_a" ] || fail "latest is in the backend before a's rename of its staging directory"
    break
  fi
  sleep 0.1
done
if [ ! -e "$BACKEND/latest" ]; then
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/members/ >&2 || true
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/digest/ >&2 || true
  fail "latest never reached the backend after a was lost: $("$CKPTFS" status "$B")"
fi
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
note "latest in the backend $dt s after a was lost (lease 6 s), a's shard before it"
same_bytes "$T/shard_a" "$BACKEND/global_step1/shard_a"
same_bytes "$T/shard_b" "$BACKEND/global_step1/shard_b"
same_bytes "$T/opt_a" "$BACKEND/opt_step1/opt_a"
[ ! -e "$BACKEND/staging.tmp" ] || fail "the staging directory a renamed is in the backend: $(ls -R "$BACKEND")"
[ ! -e "$BACKEND/scratch_a" ] || fail "the scratch file a removed is in the backend"
expect_eq global_step1 "$(cat "$BACKEND/latest")" "latest"
H=$(node_mnt "$holder")
repl_of "$H" 'assert j["published_for_dead"] >= 1 and j["held_files"] == 0 and j["kept_published_files"] >= 1, j' ||
  fail "$holder: $(repl_of "$H" 'print(j)')"
# Its copies are kept against eviction only until their done marks are in
# etcd (Store::Keep): with etcd up, none stays kept.
unkept() { repl_of "$H" 'assert j["kept_for_marks_files"] == j["kept_for_marks_entries"] == j["kept_for_marks_bytes"] == 0, j'; }
wait_for 15 "$holder still keeps copies for their marks" unkept
grep -qE "replicas published here for dead members: [0-9]+ files" <<< "$("$CKPTFS" status "$H")" ||
  fail "$holder's status text: $("$CKPTFS" status "$H")"
applied=0
for n in b c; do
  applied=$((applied + $(repl_of "$(node_mnt $n)" 'print(j["entries_applied_for_dead"])')))
  repl_of "$(node_mnt $n)" 'assert j["held_entries"] == 0 and j["held_files"] == 0, j' || fail "$n still holds a's replicas"
done
[ "$applied" -ge 4 ] || fail "a's namespace entries applied in its place: $applied, want 4 or more"
note "a's namespace entries applied for it: $applied"
# b's removal, ordered after what a may have taken with it: kept.
drained=$("$CKPTFS" drain "$B" 2>&1) || fail "drain of b: $drained"
grep -q "1 removals were not applied to the backend" <<< "$drained" || fail "ckptfs drain of b does not say: $drained"
[ -e "$BACKEND/scratch_b" ] || fail "b's removal after a's loss reached the backend"
"$CKPTFS" status "$B" --json | $PY -c 'import json, sys
c = json.load(sys.stdin)["cluster"]
assert c["kept_removals"] == 1 and c["kept_paths"] == ["scratch_b"], c' || fail "b's status: $("$CKPTFS" status "$B" --json)"
grep -q "kept: scratch_b" <<< "$("$CKPTFS" status "$B")" || fail "b's status text: $("$CKPTFS" status "$B")"
# The shared namespace shows what the backend holds: the file is back on
# b's mount, and a removal made now (after the loss was known) goes.
wait_for 10 "b's mount does not show scratch_b, which the backend keeps" test -e "$B/scratch_b"
rm "$B/scratch_b"
drained=$("$CKPTFS" drain "$B" 2>&1) || fail "drain of b: $drained"
[ ! -e "$BACKEND/scratch_b" ] || fail "scratch_b, removed again after a's loss was known, is still in the backend"
note "b's removal right after a's loss was kept out of the backend; removed again later, it went"
# Everything of a was replicated before its loss: nothing of it is listed
# lost (its record names what is at risk, not every unpersisted file).
for n in b c; do
  "$CKPTFS" status "$(node_mnt $n)" --json | $PY -c 'import json, sys
c = json.load(sys.stdin)["cluster"]
dead = [m for m in c["members"] if m["node"] == "a"]
assert c["lost_count"] == 0 and c["lost"] == [], c
assert dead and dead[0]["unpersisted"] > 0 and dead[0]["at_risk"] == 0, dead' ||
    fail "$n lists a's replicated files lost: $("$CKPTFS" status "$(node_mnt $n)" --json)"
done


# ---- 3. a replacement node reads it back ----
# From the holder, which kept the published replica to serve loads (the
# file's home unless a2 outranks it in the rendezvous order: then a2 reads
# the backend itself).
mount_node a2 -- "${COMMON[@]}" --member-timeout 2 --node a2
A2=$(node_mnt a2)
wait_for 20 "a2 does not see b's and c's replica links" repl_of "$A2" 'assert j["peers"] == 2, j'
same_bytes "$T/shard_a" "$A2/global_step1/shard_a"
peer=$(repl_of "$A2" 'print(j["loads"]["from_peers"])') own=$(repl_of "$A2" 'print(j["loads"]["to_backend"])')
expect_eq 1 $((peer + own)) "a2's loads (from a peer + from the backend)"
if [ "$peer" = 1 ]; then
  repl_of "$H" 'assert j["loads"]["served_from_replicas"] == 1, j' || fail "$holder did not serve its replica: $(repl_of "$H" 'print(j)')"
  note "a2 loaded a's shard from $holder's published replica"
else
  note "a2 is the shard's home: it read the backend"
fi

# Every rank resumes from `latest --safe` (a on its replacement a2, b on
# its own node): the newest checkpoint all of whose files survive, and
# torch.load of each rank's shard gives the tensors saved.
for r in "a $A2" "b $B"; do
  set -- $r
  dir=$("$CKPTFS" latest --safe "$2") || fail "latest --safe on rank $1's node: none"
  expect_eq "$2/global_step1" "$dir" "latest --safe on rank $1's node"
  $PY -c 'import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)' \
    "$dir/shard_$1" "$T/shard_$1" || fail "rank $1's shard from latest --safe is not what it saved"
done
note "ranks a (on a2) and b resumed from latest --safe: global_step1, tensors as saved"

for n in b c a2; do umount_node "$n"; done
check_log --allow-errors "lease expired|is dead|lost" --allow-warnings "replicas:|replica link|etcd|lease|is dead|lost"
echo "PASS: $CASE"
