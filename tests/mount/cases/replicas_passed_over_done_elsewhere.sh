#!/usr/bin/env bash
# A claim passed over that another holder of the same entry did is done,
# not given up (issue #30; docs/replicas.md, "A claim passed over").
# Three nodes, --replicas 2: b and c hold every entry of a. a's drain held:
# `mkdir d; cp data d/f; mv d e`. a is killed; b publishes d/f in its
# place and dies right after (failpoint takeover.published), while c's
# publishes fail (fault takeover.publish); then c's go: c finds d/f there
# (done), and once b's record is gone applies `mv d e`. b, back on its
# tier and state dir, reads its claim of d/f back unmarked, with c past it:
#  - the entry is done (c marked it so): not given up — a give-up would
#    put its names (d/f, its file) in etcd and poison every later entry
#    of a on them, at every holder, though c did it (and the writer, back,
#    would skip it as c's);
#  - nothing of a's is given up or poisoned anywhere, etcd names no
#    give-up of a's, and a, back, leaves e/f alone and nothing at d.
# serial: kills daemons and waits out their leases
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_store
COMMON2=() prev=
for x in "${COMMON[@]}"; do [ "$prev" = --replicas ] && x=2; COMMON2+=("$x") prev=$x; done
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON2[@]}" --member-timeout 6 --node a
mount_node b "CKPTFS_FAILPOINT=takeover.published" -- "${COMMON2[@]}" --member-timeout 2 --node b
mount_node c "CKPTFS_FAULT=takeover.publish:$T/nopub" -- "${COMMON2[@]}" --member-timeout 2 --node c
A=$(node_mnt a) B=$(node_mnt b) C=$(node_mnt c)
wait_for 20 "a does not see b's and c's replica links" repl_of "$A" 'assert j["peers"] == 2, j'
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }
is_replicated() { [ "$(state_of "$1")" = replicated ]; }
head -c 300000 /dev/urandom > "$T/data"

touch "$T/pause_a" "$T/nopub"
n0=$(repl_of "$A" 'print(j["replicated_entries"])')
mkdir "$A/d"
cp "$T/data" "$A/d/f"
wait_for 30 "d/f never became replicated" is_replicated "$A/d/f"
mv "$A/d" "$A/e"
wait_for 30 "a's mkdir and rename were not both replicated" repl_of "$A" "assert j['replicated_entries'] >= $n0 + 2, j"

kill_node a
wait_for 60 "b never published d/f for a: $(backend_tree)" test -f "$BACKEND/d/f"
wait_for 30 "b did not stop at the failpoint" eval '[ -z "$(_node_pid b)" ]'
rm -f "$T/nopub"
wait_for 60 "c never applied mv d e: $(backend_tree)" test -f "$BACKEND/e/f"
repl_of "$C" 'assert j["already_in_backend"] >= 1 and j["published_for_dead"] == 0, j' ||
  fail "c did not find d/f in the backend, done"
note "b published d/f and died; c found it there and applied the rename: $(backend_tree)"

mount_node b -- "${COMMON2[@]}" --member-timeout 2 --node b
decided() { repl_of "$B" 'assert j.get("passed_over_for_dead", 0) + j["already_in_backend"] + j["published_for_dead"] >= 1, j'; }
wait_for 60 "b, back, did nothing with its claim" decided
sleep 1
[ ! -e "$BACKEND/d" ] || fail "b, back, published d/f again after c moved it: $(backend_tree)"
for m in "$B" "$C"; do
  repl_of "$m" 'assert j["passed_over_for_dead"] == 0 and j["lost_for_dead"] == 0 and j["poisoned_for_dead"] == 0, j' ||
    fail "$m gave an entry of a up that c did"
done
names=$(given_up_in_etcd a)
expect_eq 0 "$names" "give-ups of a named in etcd"
note "b took its claim as done (c did it)"

replica_writer_back a e/f d "${COMMON2[@]}" --member-timeout 6 --node a

for n in a b c; do umount_node $n; done
check_log --allow-errors "lease expired|cut off|replicas: |failpoint|takeover.publish" \
  --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd|waits"
echo "PASS: $CASE"
