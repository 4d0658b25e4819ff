#!/usr/bin/env bash
# A writer restarts on its state dir with its memory tier intact, within
# its lease, its drain still held (--replicas 1, etcd). Before, its file
# was `draining` afterwards with no replica anywhere: its first record
# named the recovered entry's gate from its samples, later than the exact
# gate the replica carried, the holder took that for "applied" and
# dropped the replica, and the replicator never saw the recovered entry
# (nor had a gate to send it with). A single node loss later lost a file
# that had been replicated. Now the holder drops a live writer's replica
# by the writer's log position (its record's applied_seq), the restarted
# writer sends its pending entries again (the holder that kept one answers
# at once and takes the gate the writer's record names now): the file is
# `replicated` again, stays so, and once the writer is lost for good (its
# tier and state dir gone) it reaches the backend through its holder.
# serial: kills a daemon, mounts it again within its lease, then waits out its lease
source "$(dirname "$0")/../lib/common.sh"
require_root
# a's lease (30 s) outlasts its restart.
replica_job 30
head -c 2000000 /dev/urandom > "$T/f"
cp "$T/f" "$A/f"
is_replicated() { [ "$(state_of "$A/f")" = replicated ]; }
wait_for 30 "a's file never became replicated" is_replicated
ino=$(stat -c %i "$A/f")  # its replica's name: a.INO.VERSION~GATE~CHECKSUM
held_at() { for f in "$TIER-$1-replicas"/a."$ino".[1-9]*; do [ -f "$f" ] && [[ $f != *.meta ]] && echo "$f"; done; true; }
holder=""
for n in b c; do [ -n "$(held_at $n)" ] && holder=$n; done
[ -n "$holder" ] || fail "no holder of a's f (a.$ino.*): $(ls "$TIER"-[bc]-replicas)"
before=$(held_at "$holder")
note "held at $holder: ${before##*/}"

kill_node a
# Its new lease short: the loss below is noticed within seconds.
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
wait_for 30 "a's f is not replicated after a's restart: $(state_of "$A/f"); held at $holder: $(ls "$TIER-$holder-replicas")" \
  is_replicated
# Past the holder's check of a live writer's record (every 5 s): still held.
sleep 7
expect_eq replicated "$(state_of "$A/f")" "a's f after its restart"
after=$(held_at "$holder")
[ -n "$after" ] || fail "$holder dropped a's pending f: $(ls "$TIER-$holder-replicas")"
note "held at $holder after a's restart: ${after##*/}"
# Held under the gate a's record names now (kept under the old, earlier
# one, it held a's own drain back for ever: a waited for the holder, the
# holder for a's drain).
gate=${after##*/}; gate=${gate#*~}; gate=${gate%%~*}
record_gate() { ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get /ckptfs/job/members/a --print-value-only |
  $PY -c 'import json,sys; print(json.load(sys.stdin)["oldest_gate_us"])'; }
expect_eq "$(record_gate)" "$gate" "the gate $holder holds a's f under, and the one a's record names"
[ ! -e "$BACKEND/f" ] || fail "a's f drained (a's drain is held)"

# a lost for good: the holder publishes f in its place.
kill_node a
rm -rf "$(node_state a)"
kept=(); for s in "${_STATE_DIRS[@]}"; do [ "$s" = "$(node_state a)" ] || kept+=("$s"); done; _STATE_DIRS=("${kept[@]}")
rm_tier "$TIER-a"
in_backend() { [ -e "$BACKEND/f" ]; }
wait_for 60 "a's f never reached the backend after a was lost: $("$CKPTFS" status "$(node_mnt "$holder")")" in_backend
same_bytes "$T/f" "$BACKEND/f"
repl_of "$(node_mnt "$holder")" 'assert j["published_for_dead"] >= 1, j' ||
  fail "$holder: $(repl_of "$(node_mnt "$holder")" 'print(j)')"
note "a lost after its restart: its f reached the backend through $holder"
echo "PASS: $CASE"
