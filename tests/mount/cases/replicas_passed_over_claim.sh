#!/usr/bin/env bash
# A holder back after its lease ran out does not publish again a claimed
# file of a dead writer when another holder applied that writer's later
# entries meanwhile (issue #30; docs/replicas.md, "A claim passed over").
# Three nodes, --replicas 1, a's drain held; rounds of `mkdir dI; cp data
# dI/f; mv dI eI` until the file's replica and the rename's are held by
# different holders, X and Y (placement hashes the path). a is killed; X
# publishes dI/f in its place and dies right after (failpoint
# takeover.published: its replica not marked published, its claim not
# marked done); once X's record is gone, Y applies `mv dI eI` (the backend:
# eI/f). X, back on its tier and state dir, reads its claim back unmarked:
#  - before: it published dI/f again (the backend held dI/f and eI/f: a
#    file a later entry moved came back at its old name);
#  - now: Y claimed a later entry of a's run, so X gives its own up (the
#    file is no longer at its name in the backend);
#  - a, back on its state dir, applies what was given up where the later
#    entries left it: eI/f holds the bytes, and nothing is at dI.
# serial: kills daemons and waits out their leases
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_store
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
for n in b c; do mount_node $n "CKPTFS_FAILPOINT=takeover.published" -- "${COMMON[@]}" --member-timeout 2 --node $n; done
A=$(node_mnt a)
wait_for 20 "a does not see b's and c's replica links" repl_of "$A" 'assert j["peers"] == 2, j'
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }
is_replicated() { [ "$(state_of "$1")" = replicated ]; }
held_by() { ls "$TIER-$1-replicas" 2> /dev/null | grep -v '\.meta$' | grep '^a\.' || true; }
# Which node holds a's file replica, and which a's newest namespace entry.
file_holder() { local n; for n in b c; do held_by $n | grep -q '^a\.[1-9][0-9]*\.' && echo $n; done; true; }
entry_holder() {
  local n s best=0 who=
  for n in b c; do
    for s in $(held_by $n | sed -n 's/^a\.0\.\([0-9]*\)~.*/\1/p'); do [ "$s" -gt "$best" ] && best=$s who=$n; done
  done
  echo "$who"
}
entries() { repl_of "$A" 'print(j["replicated_entries"])'; }
nothing_held() { [ -z "$(held_by b)$(held_by c)" ]; }
head -c 300000 /dev/urandom > "$T/data"

crossed=0 X= Y=
for ((i = 1; i <= 16; i++)); do
  touch "$T/pause_a"
  n0=$(entries)
  mkdir "$A/d$i"
  cp "$T/data" "$A/d$i/f"
  wait_for 30 "round $i: d$i/f never became replicated" is_replicated "$A/d$i/f"
  mv "$A/d$i" "$A/e$i"
  wait_for 30 "round $i: a's mkdir and rename were not both replicated" eval '[ "$(entries)" -ge $((n0 + 2)) ]'
  X=$(file_holder) Y=$(entry_holder)
  note "round $i: d$i/f held by ${X:-?}, mv d$i e$i by ${Y:-?}"
  if [ -n "$X" ] && [ -n "$Y" ] && [ "$X" != "$Y" ]; then
    crossed=$i
    break
  fi
  rm -f "$T/pause_a"
  "$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "round $i did not drain"
  wait_for 30 "the holders kept a's replicas after its drain" nothing_held
done
[ $crossed -gt 0 ] || fail "16 rounds and never the file and the rename at different holders"
i=$crossed

kill_node a
wait_for 60 "$X never published d$i/f for a: $(backend_tree)" test -f "$BACKEND/d$i/f"
wait_for 30 "$X did not stop at the failpoint" eval '[ -z "$(_node_pid '"$X"')" ]'
# X's record gone with its lease: Y goes on past X's claim.
wait_for 60 "$Y never applied mv d$i e$i: $(backend_tree)" test -f "$BACKEND/e$i/f"
[ ! -e "$BACKEND/d$i" ] || fail "d$i is still in the backend after the rename: $(backend_tree)"
note "$X published d$i/f and died; $Y applied the rename: $(backend_tree)"

# X back on its tier and state dir (no failpoint): its claim read back.
mount_node "$X" -- "${COMMON[@]}" --member-timeout 2 --node "$X"
XM=$(node_mnt "$X")
decided() { repl_of "$XM" 'assert j.get("passed_over_for_dead", 0) + j["published_for_dead"] + j["already_in_backend"] >= 1, j'; }
wait_for 60 "$X, back, did nothing with its claim" decided
sleep 1
[ ! -e "$BACKEND/d$i" ] || fail "$X, back, published d$i/f again after $Y moved it to e$i: $(backend_tree)"
repl_of "$XM" 'assert j["passed_over_for_dead"] == 1 and j["published_for_dead"] == 0, j' ||
  fail "$X did not give its passed-over claim up"
note "$X gave its claim up: $(backend_tree)"

# a back on its state dir: it applies the given-up file where the rename
# left it.
replica_writer_back a "e$i/f" "d$i" "${COMMON[@]}" --member-timeout 6 --node a
cmp "$T/data" "$A/e$i/f" || fail "a reads another e$i/f"

for n in a b c; do umount_node $n; done
check_log --allow-errors "lease expired|cut off|replicas: |given up|failpoint" \
  --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd|waits"
echo "PASS: $CASE"
