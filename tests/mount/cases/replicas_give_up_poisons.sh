#!/usr/bin/env bash
# A holder that gives up one of a dead writer's entries gives up the later
# ones on the same names too (issue #30; fs/cluster/poison.h). Two nodes,
# --replicas 1 (b holds every replica of a), a's drain held: the backend
# has `latest` = step 4; a writes step 5 to latest.tmp, then `mv latest
# prev`, `mv latest.tmp latest` — the rotation of a trainer that keeps one
# step back. b's replica of `mv latest prev` is made unreadable, and a is
# killed. Before, b gave that rename up and applied the next one: step 5
# went over step 4 at `latest` and step 4 was nowhere; a, back, then moved
# step 5 to `prev` (or took the rename as done), and `latest` was gone.
# Now b gives the second rename up too (it touches `latest`): the backend
# keeps step 4 at `latest` and step 5 at latest.tmp, and a, back on its
# state dir, applies both renames itself, in its order.
# serial: kills a daemon and waits out its lease
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_store
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
mount_node b -- "${COMMON[@]}" --member-timeout 2 --node b
A=$(node_mnt a) B=$(node_mnt b)
wait_for 20 "a does not see b's replica link" repl_of "$A" 'assert j["peers"] == 1, j'
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }
taken_of_a() { ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/taken/a/ --print-value-only; }

head -c 3000000 /dev/urandom > "$T/s4"
head -c 3000000 /dev/urandom > "$T/s5"
cp "$T/s4" "$A/latest"
"$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "a's step 4 did not drain"
cmp "$T/s4" "$BACKEND/latest" || fail "step 4 is not at latest in the backend"

touch "$T/pause_a"
cp "$T/s5" "$A/latest.tmp"
is_replicated() { [ "$(state_of "$1")" = replicated ]; }
wait_for 30 "a's latest.tmp never became replicated" is_replicated "$A/latest.tmp"
before=$(repl_of "$A" 'print(j["replicated_entries"])')
mv "$A/latest" "$A/prev"
mv "$A/latest.tmp" "$A/latest"
wait_for 30 "a's renames not replicated: $(repl_of "$A" 'print(j)')" \
  repl_of "$A" "assert j['queued'] == 0 and j['replicated_entries'] >= $before + 2, j"

# b's replicas of a's namespace entries (a.0.SEQ~GATE~CHECKSUM): the first
# is `mv latest prev`; made unreadable (cut short).
mapfile -t entries < <(cd "$TIER-b-replicas" && ls a.0.[1-9]* | grep -v '\.meta$' | sort -t. -k3,3n)
[ "${#entries[@]}" -eq 2 ] || fail "b holds ${#entries[@]} of a's namespace entries, not 2: $(ls "$TIER-b-replicas")"
note "b holds a's entries ${entries[*]}; the first cut short"
: > "$TIER-b-replicas/${entries[0]}"

kill_node a
wait_for 60 "b never took a's entries over: $(repl_of "$B" 'print(j)')" \
  repl_of "$B" 'assert j["lost_for_dead"] >= 1 and j["held_files"] == 0, j'
cmp "$T/s4" "$BACKEND/latest" || fail "b moved step 5 over step 4 at latest: $(backend_tree)"
repl_of "$B" 'assert j["lost_for_dead"] == 1 and j.get("poisoned_for_dead") == 1, j' ||
  fail "b did not give up the second rename: $(repl_of "$B" 'print(j)'); backend: $(backend_tree)"
cmp "$T/s5" "$BACKEND/latest.tmp" || fail "step 5 is not at latest.tmp: $(backend_tree)"
[ ! -e "$BACKEND/prev" ] || fail "prev is in the backend though its rename was given up: $(backend_tree)"
claims=$(taken_of_a)
# latest.tmp published ('+'), both renames given up ('!').
expect_eq "1 2" "$(grep -c '^+' <<< "$claims") $(grep -c '^!' <<< "$claims")" "b's claims of a's entries ($claims)"
"$CKPTFS" status "$B" | grep -q 'GIVEN UP here for dead members: 1 entries .* 1 later' ||
  fail "b's status does not say what it gave up: $("$CKPTFS" status "$B")"
grep -q "touches the names of its entry" "$(node_state b)/ckptfs.log" || fail "b's log does not say why"
note "b gave both renames up: $(backend_tree)"

# a back on its state dir, its drain let go: it applies both, in order.
rm -f "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
"$CKPTFS" drain "$A" --timeout 40 > /dev/null || fail "a's drain does not empty after it came back"
cmp "$T/s5" "$BACKEND/latest" || fail "step 5 is not at latest after a came back: $(backend_tree)"
cmp "$T/s4" "$BACKEND/prev" || fail "step 4 is not at prev after a came back: $(backend_tree)"
[ ! -e "$BACKEND/latest.tmp" ] || fail "latest.tmp is left in the backend: $(backend_tree)"
echo "after" > "$B/after_b"
"$CKPTFS" drain "$B" --timeout 30 > /dev/null || fail "b's next file is held"
note "a applied its renames itself: $(backend_tree)"

for n in a b; do umount_node $n; done
check_log --allow-errors "lease expired|cut off|replicas: |given up" \
  --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd"
echo "PASS: $CASE"
