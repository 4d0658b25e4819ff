#!/usr/bin/env bash
# A holder that gave a dead writer's entry up and stopped before the mark
# (with the entry's names) was in etcd marks it, back on its tier, with
# those names: not with "*", which would give up every later entry of the
# writer's run (issue #30; docs/replicas.md, "A give-up's names outlast
# the holder"). Two nodes, --replicas 1: a writes, b holds. a's drain held:
# `mv L P` (the backend refuses it for good: P is a directory there), then
# `mkdir Q` (other names). a is killed; b's marks fail (fault
# takeover.mark); b gives the rename up, drops its replica, and dies
# (failpoint takeover.gave_up) before it reaches `mkdir Q`. b, back on its
# tier and state dir, the marks let through:
#  - before: its claim of the rename read back unmarked with no replica:
#    given up with its names unknown ("*"), and `mkdir Q` with it (Q never
#    reached the backend until a came back);
#  - now: the note b kept on its tier gives the mark and its names (L, P):
#    `mkdir Q` touches neither and is applied;
#  - a, back on its state dir, applies the rename itself.
# With NO_NOTE=1 (replicas_give_up_no_note.sh), b cannot write its note
# either (fault replica.note, as on a full tier): it keeps the replica
# itself, unpublished, until the mark is in, and reads the names from it
# when it is back (before: dropped, and read back as "*"). With LIVE=1 too
# (replicas_give_up_no_note_live.sh), b is not stopped: it keeps the
# replica, without deciding it again each pass, until its marks go in,
# and then drops it.
# serial: kills daemons and waits out their leases
source "$(dirname "$0")/../lib/common.sh"
require_root
faults=takeover.mark
[ "${NO_NOTE:-0}" = 1 ] && faults=takeover.mark,replica.note

replica_store
touch "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 3 --node a
failpoint=takeover.gave_up
[ "${LIVE:-0}" = 1 ] && failpoint=
mount_node b "CKPTFS_FAULT=$faults:$T/nomark" "CKPTFS_FAILPOINT=$failpoint" -- \
  "${COMMON[@]}" --member-timeout 2 --node b
B=$(node_mnt b)
A=$(node_mnt a)
wait_for 20 "a does not see b's replica link" repl_of "$A" 'assert j["peers"] == 1, j'
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }
entries() { repl_of "$A" 'print(j["replicated_entries"])'; }
notes() { ls -A "$TIER-b-replicas" 2> /dev/null | grep -c '^\.note-' || true; }
held_of_a() { ls -A "$TIER-b-replicas" 2> /dev/null | grep '^a\.0\.[1-9]' | grep -vc '\.meta$' || true; }
gaveup() { ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix /ckptfs/job/gaveup/a/ --print-value-only | tr '\0' ' ' | grep -vx '+' || true; }
head -c 300000 /dev/urandom > "$T/data"

rm -f "$T/pause_a"
cp "$T/data" "$A/L"
"$CKPTFS" drain "$A" --timeout 30 > /dev/null || fail "L did not drain"
touch "$T/pause_a"
n0=$(entries)
mv "$A/L" "$A/P"
mkdir "$A/Q"
wait_for 30 "a's rename and mkdir were not both replicated" eval '[ "$(entries)" -ge $((n0 + 2)) ]'

# The rename refused by the backend for good; b's marks refused; a lost.
mkdir "$BACKEND/P" && touch "$BACKEND/P/x"
touch "$T/nomark"
kill_node a
if [ "${LIVE:-0}" = 1 ]; then
  unpublished() { ls -A "$TIER-b-replicas" 2> /dev/null | grep '^a\.0\.[1-9]' | grep -v '\.meta$' | grep -vc '~published~' || true; }
  wait_for 60 "b never gave a's rename up: $(repl_of "$B" 'print(j)')" repl_of "$B" 'assert j["lost_for_dead"] >= 1, j'
  wait_for 30 "b did not apply mkdir Q while its marks failed: $(backend_tree)" test -d "$BACKEND/Q"
  [ -z "$(gaveup)" ] || fail "b's give-up is in etcd though its marks failed: $(gaveup)"
  [ "$(notes)" -eq 0 ] || fail "b kept a note though the fault replica.note was on: the case tests nothing"
  wait_for 10 "b does not keep the rename it gave up with no note of it: $(ls -A "$TIER-b-replicas")" \
    eval '[ "$(unpublished)" -eq 1 ]'
  sleep 3 # passes go by: the kept replica is not decided again
  repl_of "$B" 'assert j["lost_for_dead"] == 1, j' || fail "b decided its kept give-up again: $(repl_of "$B" 'print(j)')"
  rm -f "$T/nomark"
  wait_for 30 "b's give-up never reached etcd" eval '[ -n "$(gaveup)" ]'
  case "$(gaveup)" in *pP*) ;; *) fail "b's give-up in etcd does not name P: '$(gaveup)'" ;; esac
  wait_for 30 "b kept a's replicas after its marks went in: $(ls -A "$TIER-b-replicas")" eval '[ "$(held_of_a)" -eq 0 ]'
  repl_of "$B" 'assert j["lost_for_dead"] == 1 and j["poisoned_for_dead"] == 0, j' ||
    fail "b's counts: $(repl_of "$B" 'print(j)')"
  note "b kept its give-up until the mark was in, then dropped it: $(backend_tree)"
  BM=$B
else
wait_for 60 "b never gave a's rename up (its failpoint)" eval '[ -z "$(_node_pid b)" ]'
[ -z "$(gaveup)" ] || fail "b's give-up is in etcd though its marks failed: $(gaveup)"
if [ "${NO_NOTE:-0}" = 1 ]; then
  [ "$(notes)" -eq 0 ] || fail "b kept a note though the fault replica.note was on: the case tests nothing"
  [ "$(held_of_a)" -ge 2 ] || fail "b dropped the rename it gave up with no note of it (only mkdir Q is held): $(ls -A "$TIER-b-replicas")"
else
  [ "$(notes)" -ge 1 ] || fail "b kept no note of its give-up on its tier: $(ls -A "$TIER-b-replicas")"
fi
[ ! -e "$BACKEND/Q" ] || fail "b applied mkdir Q before it stopped: the case tests nothing: $(backend_tree)"
note "b gave mv L P up and stopped before its mark was in: $(backend_tree)"

# b back on its tier and state dir, its marks let through.
rm -f "$T/nomark"
mount_node b -- "${COMMON[@]}" --member-timeout 2 --node b
BM=$(node_mnt b)
wait_for 60 "b, back, did not apply mkdir Q (its give-up of mv L P read back as '*'?): gaveup/a/ = '$(gaveup)'; $(backend_tree)" \
  test -d "$BACKEND/Q"
wait_for 30 "b's give-up never reached etcd" eval '[ -n "$(gaveup)" ]'
names=$(gaveup)
case "$names" in *pP*) ;; *) fail "b's give-up in etcd does not name P: '$names'" ;; esac
[ "$names" != "*" ] || fail "b's give-up in etcd names nothing ('*')"
repl_of "$BM" 'assert j["poisoned_for_dead"] == 0, j' || fail "b gave up an entry of a that the rename does not touch"
wait_for 20 "b's note outlived its mark" eval '[ "$(notes)" -eq 0 ]'
note "b, back, gave mv L P up with its names ($names) and applied mkdir Q: $(backend_tree)"
fi

# a back on its state dir: it applies the rename itself.
rm -r "$BACKEND/P"
replica_writer_back a P L "${COMMON[@]}" --member-timeout 3 --node a
[ -d "$BACKEND/Q" ] || fail "Q is gone from the backend after a came back: $(backend_tree)"

for n in a b; do umount_node $n; done
check_log --allow-errors "lease expired|cut off|replicas: |given up|failpoint|takeover.mark" \
  --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd|waits"
echo "PASS: $CASE"
