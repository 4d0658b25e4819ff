#!/usr/bin/env bash
# A writer's run that comes back after its holders took its files over
# (issue #30): 3 nodes, --replicas 1, a's drain held. a makes staging.tmp/,
# writes opt_a into it (replicated), renames the directory to opt_step1
# (the entries replicated too), then:
#  1. a is killed (tier and state dir kept); its lease (6 s) ends, the
#     holders publish opt_a and apply the mkdir and rename in its place;
#     a restarts on its state dir (the same run) with its drain let go.
#  2. The same with a stopped (SIGSTOP: a VM paused, a node cut off) past
#     its lease, then continued.
# Each time a's drain must skip what the holders applied (before, it
# replayed them: staging.tmp/opt_a came back in the backend, and the
# rename failed ENOTEMPTY for ever, holding every member's drain), its
# files read persisted, and b's next file reaches the backend; once its
# drain went past them, the holders' claims are deleted from etcd.
# serial: kills and stops a daemon past its lease
source "$(dirname "$0")/../lib/common.sh"
require_root

replica_job 6
is_replicated() { [ "$(state_of "$1")" = replicated ]; }
no_claims_of() {
  local k
  k=$(ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix "/ckptfs/job/taken/$1/" --keys-only) && [ -z "$k" ]
}
backend_tree() { (cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' '); }

# round N: a's staged file and its rename, replicated, a's drain held.
stage_round() {
  touch "$T/pause_a"
  head -c 2000000 /dev/urandom > "$T/opt_$1"
  mkdir "$A/staging$1.tmp"
  cp "$T/opt_$1" "$A/staging$1.tmp/opt_a"
  wait_for 30 "round $1: a's staged file never became replicated" is_replicated "$A/staging$1.tmp/opt_a"
  local before
  before=$(repl_of "$A" 'print(j["replicated_entries"])')
  mv "$A/staging$1.tmp" "$A/opt_step$1"
  wait_for 30 "round $1: a's rename not replicated: $(repl_of "$A" 'print(j)')" \
    repl_of "$A" "assert j['queued'] == 0 and j['replicated_entries'] >= $before + 1, j"
}

# after round N: the holders' takeover stands, a's drain empties, nothing
# of it replayed, and the cluster goes on.
check_round() {
  "$CKPTFS" drain "$A" --timeout 40 > /dev/null ||
    fail "round $1: a's drain does not empty after it came back: $(grep -E 'drain: seq' "$(node_state a)/ckptfs.log" | tail -3)"
  [ ! -e "$BACKEND/staging$1.tmp" ] || fail "round $1: staging$1.tmp is back in the backend: $(backend_tree)"
  cmp "$T/opt_$1" "$BACKEND/opt_step$1/opt_a" || fail "round $1: opt_step$1/opt_a differs in the backend"
  expect_eq persisted "$(state_of "$A/opt_step$1/opt_a")" "round $1: a's file"
  cmp "$T/opt_$1" "$A/opt_step$1/opt_a" || fail "round $1: a reads other bytes"
  echo "after $1" > "$B/after_b$1"
  "$CKPTFS" drain "$B" --timeout 30 > /dev/null || fail "round $1: b's next file is held"
  [ -e "$BACKEND/after_b$1" ] || fail "round $1: b's next file is not in the backend"
  grep -q "took over .* of this run's entries" "$(node_state a)/ckptfs.log" ||
    fail "round $1: a's log does not say what its holders took over"
  # Its drain past them, a deletes its holders' claims (one key an entry).
  wait_for 20 "round $1: a's holders' claims are still in etcd after its drain went past them" no_claims_of a
}

# ---- 1. killed, restarted on its state dir ----
stage_round 1
kill_node a
wait_for 60 "the holders never published a's file" test -e "$BACKEND/opt_step1/opt_a"
rm -f "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 6 --node a
wait_for 20 "a does not see b's and c's replica links again" repl_of "$A" 'assert j["peers"] == 2, j'
check_round 1
note "killed and restarted: a skipped what its holders applied ($(backend_tree))"

# ---- 2. stopped past its lease, continued ----
stage_round 2
pid=$(_node_pid a)
kill -STOP "$pid"
at_exit "kill -CONT $pid 2> /dev/null || true"
wait_for 60 "the holders never published a's second file" test -e "$BACKEND/opt_step2/opt_a"
rm -f "$T/pause_a"
kill -CONT "$pid"
check_round 2
note "stopped past its lease and continued: a skipped what its holders applied"

for n in a b c; do umount_node $n; done
check_log --allow-errors "lease expired|cut off" --allow-warnings "replicas|is dead|lease|took over|rejoins|drain holds|lost|etcd"
echo "PASS: $CASE"
