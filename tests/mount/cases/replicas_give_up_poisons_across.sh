#!/usr/bin/env bash
# A give-up poisons the later entries on its names held by *another*
# holder (issue #30; docs/design-holder-give-up.md §1–2). Three nodes,
# --replicas 1: a's entries are spread over b and c by hash. a's drain
# held; rounds of the rotation `cp step5 L.tmp; mv L P; mv L.tmp L` (L =
# step 4 in the backend) until one round's two renames went to different
# holders. Every `mv L P` is then refused by the backend for good (P made
# a directory there), and b's and c's marks in etcd fail (fault
# takeover.mark) when a is killed:
#  - while the give-up's names are not in etcd, its holder keeps naming
#    its gate, so the other holder applies no later entry of a (before,
#    it applied `mv L.tmp L` over step 4 at once);
#  - once the marks go in, the other holder reads the names and gives the
#    second rename up too: every L is still step 4 in the backend;
#  - a, back on its state dir, applies both renames itself, in its order.
# serial: kills a daemon and waits out its lease
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_store
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
for n in b c; do mount_node $n "CKPTFS_FAULT=takeover.mark:$T/nomark" -- "${COMMON[@]}" --member-timeout 2 --node $n; done
A=$(node_mnt a) B=$(node_mnt b)
wait_for 20 "a does not see b's and c's replica links" repl_of "$A" 'assert j["peers"] == 2, j'
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }
is_replicated() { [ "$(state_of "$1")" = replicated ]; }
# holder_of SEQ: which node holds a's namespace entry SEQ.
holder_of() { local n; for n in b c; do compgen -G "$TIER-$n-replicas/a.0.$1~*" > /dev/null && echo $n; done; true; }
entry_seqs() { (cd "$TIER-b-replicas" && ls; cd "$TIER-c-replicas" && ls) | grep '^a\.0\.[0-9]*~' | grep -v '\.meta$' |
  sed 's/^a\.0\.\([0-9]*\)~.*/\1/' | sort -n; }

# Step 4 of every round in the backend, then a's drain held.
max=16
for ((i = 1; i <= max; i++)); do
  head -c 500000 /dev/urandom > "$T/s4_$i"
  head -c 500000 /dev/urandom > "$T/s5_$i"
  rm -f "$T/pause_a"
  cp "$T/s4_$i" "$A/L$i"
done
"$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "step 4 did not drain"
touch "$T/pause_a"
crossed=0 rounds=0
while [ $crossed -eq 0 ]; do
  rounds=$((rounds + 1))
  [ $rounds -le $max ] || fail "$max rounds and no two renames of one round held by different holders: $(entry_seqs | tr '\n' ' ')"
  i=$rounds
  mapfile -t before < <(entry_seqs)
  cp "$T/s5_$i" "$A/L$i.tmp"
  wait_for 30 "round $i: L$i.tmp never became replicated" is_replicated "$A/L$i.tmp"
  mv "$A/L$i" "$A/P$i"
  mv "$A/L$i.tmp" "$A/L$i"
  want=$((${#before[@]} + 2))
  wait_for 30 "round $i: a's renames not held: $(entry_seqs | tr '\n' ' ')" eval '[ "$(entry_seqs | wc -l)" -eq '$want' ]'
  mapfile -t now < <(entry_seqs)
  first=${now[$((want - 2))]} second=${now[$((want - 1))]}
  h1=$(holder_of "$first") h2=$(holder_of "$second")
  note "round $i: mv L$i P$i (entry $first) at $h1, mv L$i.tmp L$i (entry $second) at $h2"
  [ "$h1" != "$h2" ] && crossed=$i
done
note "round $crossed's renames crossed holders"

# Every `mv L P` refused by the backend for good (P a directory there,
# not empty: EISDIR), its names known; marks refused; a lost.
for ((i = 1; i <= rounds; i++)); do mkdir "$BACKEND/P$i" && touch "$BACKEND/P$i/x"; done
touch "$T/nomark"
kill_node a
gave_up() { local n t=0; for n in b c; do t=$((t + $(repl_of "$(node_mnt $n)" 'print(j["lost_for_dead"])'))); done; [ $t -ge "$1" ]; }
wait_for 60 "b and c never gave a's first rename up" gave_up 1
# Its names not in etcd: its holder keeps naming its gate, and nothing of
# a's after it is applied anywhere.
sleep 8
for ((i = 1; i <= rounds; i++)); do
  cmp "$T/s4_$i" "$BACKEND/L$i" || fail "round $i: a second rename was applied while the first's names were not in etcd: $(backend_tree)"
done
rm -f "$T/nomark"
wait_for 60 "b and c never gave every first rename up" gave_up $rounds
poisoned() { local n t=0; for n in b c; do t=$((t + $(repl_of "$(node_mnt $n)" 'print(j["poisoned_for_dead"])'))); done; [ $t -ge $rounds ]; }
wait_for 60 "the second renames were not all given up: $(for n in b c; do repl_of "$(node_mnt $n)" 'print(j)'; done)" poisoned
for ((i = 1; i <= rounds; i++)); do
  cmp "$T/s4_$i" "$BACKEND/L$i" || fail "round $i: step 5 went over step 4 at L$i: $(backend_tree)"
  cmp "$T/s5_$i" "$BACKEND/L$i.tmp" || fail "round $i: step 5 is not at L$i.tmp: $(backend_tree)"
done
names=$(given_up_in_etcd a)
expect_eq $((2 * rounds)) "$names" "give-ups named in etcd (gaveup/a/)"
note "b and c gave every pair up: $(backend_tree)"

# The obstacles gone, a back on its state dir, its drain let go.
for ((i = 1; i <= rounds; i++)); do rm -r "$BACKEND/P$i"; done
rm -f "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
"$CKPTFS" drain "$A" --timeout 40 > /dev/null || fail "a's drain does not empty after it came back"
for ((i = 1; i <= rounds; i++)); do
  cmp "$T/s5_$i" "$BACKEND/L$i" || fail "round $i: step 5 is not at L$i after a came back: $(backend_tree)"
  cmp "$T/s4_$i" "$BACKEND/P$i" || fail "round $i: step 4 is not at P$i after a came back: $(backend_tree)"
done
for ((i = rounds + 1; i <= max; i++)); do
  cmp "$T/s4_$i" "$BACKEND/L$i" || fail "L$i (no round) changed: $(backend_tree)"
done
no_names() { [ -z "$(ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/gaveup/a/ --keys-only)" ]; }
wait_for 20 "the give-ups' names are still in etcd after a's drain went past them" no_names
echo "after" > "$B/after_b"
"$CKPTFS" drain "$B" --timeout 30 > /dev/null || fail "b's next file is held"
note "a applied its renames itself"

for n in a b c; do umount_node $n; done
check_log --allow-errors "lease expired|cut off|replicas: |given up|takeover.mark" \
  --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd"
echo "PASS: $CASE"
