#!/usr/bin/env bash
# replicas.sh — what --replicas 1 costs and gives (issue #30), on this
# machine, in one run: three mounts of one job over a local backend and a
# 1-member etcd: w (writes, --replicas 1), h (holds), p (writes, no
# replicas, no replica link); w's and p's drains held while saves are
# timed, so that nothing else moves. Every
# node fresh each repetition, each mount's first spare made, and every
# save begins with the three daemons idle (quiet_daemons: on a cluster
# they are three machines; here one node's spare or replica landing would
# be timed in another's save), its bytes read from RAM. Per repetition,
# in rotated order:
#   - the save of a SIZE_MIB file (dd bs=4M, then close) into w and into p:
#     save with replicas ÷ without (goal ≤ 1.05);
#   - on w, the time from close to `replicated`, and the replication's
#     throughput (SIZE ÷ that time) ÷ ucx_perftest tag_bw over loopback TCP
#     in the same run (goal ≥ 0.8);
#   - the next save into w and into p (rotated), once both drains, let go
#     together, persisted the first: the save ratio again, in the steady state (the holder keeps
#     the dropped replica's pages as a spare): close to `replicated` again;
#   - the next save's replication ÷ loopback TCP carrying a tmpfs file into
#     another without ckptfs (tcp_copy.py), and the replica link alone
#     (link_bw), both in the same run: what ucx_perftest's cache-hot
#     buffer leaves out;
#   - w lost (its daemon killed, its tier removed): the time until the
#     holder has published its second file to the backend (lease expiry included).
# Prints min / median / max of each ratio. Needs root, etcd, ucx-utils.
#
#   BUILD=build REPS=3 SIZE_MIB=2048 tests/bench/replicas.sh
set -euo pipefail
REPS=${REPS:-3}
SIZE_MIB=${SIZE_MIB:-2048}
export CASE=bench-replicas
source "$(dirname "$0")/../mount/lib/common.sh"
require_root
command -v ucx_perftest > /dev/null || skip "ucx_perftest (ucx-utils) is not installed"
export UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no UCX_MEMTYPE_CACHE=n

source "$(dirname "$0")/lib.sh"

# Until FILE's user.ckptfs.state is STATE; after 60 s the bench fails (a
# state never reached would time a wrong interval): each save is timed
# with the other mount quiet (w: replicated, p: persisted), whichever order.
# (Only when p went first: the job's drain is ordered across nodes, so a
# file p closes after w's held one waits for w's drain.) One process asks
# every 10 ms: a getfattr forked per look took ~0.4 s of this VM's two
# cores from the 2.6 s replication it timed.
wait_state() {
  $PY - "$1" "$2" << 'EOF'
import os, sys, time
deadline, last = time.monotonic() + 60, "(none)"
while time.monotonic() < deadline:
    try:
        last = os.getxattr(sys.argv[1], "user.ckptfs.state").decode()
        if last == sys.argv[2]:
            sys.exit(0)
    except OSError as e:
        last = e.strerror
    time.sleep(0.01)
sys.exit(f"{sys.argv[1]}: still {last} after 60 s, waiting for {sys.argv[2]}")
EOF
}

# status_is MNT EXPR: EXPR (Python, over `s`, the node's status --json)
# holds at MNT; for wait_for, whose timeout fails the bench (before, the
# waits for a peer and for a spare fell through and timed a save without).
status_is() {
  "$CKPTFS" status "$1" --json | $PY -c "import json,sys; s=json.load(sys.stdin); sys.exit(not ($2))"
}

# The transport's own bandwidth here, same run.
port=$((20000 + RANDOM % 20000))
ucx_perftest -p "$port" > /dev/null 2>&1 &
srv=$!
sleep 1
ucx_bw=$(UCX_TLS=tcp ucx_perftest -p "$port" -t tag_bw -s 4194304 -n 200 127.0.0.1 2>/dev/null | awk '/Final:/ { print $6 }')
kill "$srv" 2> /dev/null || true
note "ucx_perftest tag_bw, loopback, 4 MiB: $ucx_bw MiB/s (its \"MB\" is 2^20 bytes)"
# What the transport figure leaves out, same run: ucx_perftest sends one
# 4 MiB buffer, cache-hot, again and again; a replica moves a file that is
# not in the cache from one tmpfs to another. (1) loopback TCP carrying a
# tmpfs file into another without ckptfs (tcp_copy.py: read + send and
# recv + write, the link's copies, no checksum, into resident pages as the
# holder's spare; and sendfile, one copy fewer); (2) the replica link alone,
# writer to holder in one process (link_bw: its first replica lands in fresh
# pages, the next ones in the spare of the one dropped before).
[ -x "$BUILD/link_bw" ] || make -s BUILD="$BUILD" "$BUILD/link_bw" > /dev/null
BASE=/dev/shm/ckptfs-replicas-base-$$
mkdir -p "$BASE"
at_exit 'rm -rf "$BASE"'
head -c $((SIZE_MIB << 20)) /dev/urandom > "$BASE/src"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
tcp_copy=$(median $($PY "$(dirname "$0")/tcp_copy.py" "$BASE/src" "$BASE/dst" copy 5))
tcp_sendfile=$(median $($PY "$(dirname "$0")/tcp_copy.py" "$BASE/src" "$BASE/dst" sendfile 5))
rm -f "$BASE/src" "$BASE/dst"
link_out=$("$BUILD/link_bw" "$BASE" "$SIZE_MIB" 5)
link_first=$(echo "$link_out" | awk -F'gbps=' 'NR == 1 { print $2 }')
link_next=$(median $(echo "$link_out" | awk -F'gbps=' 'NR > 1 { print $2 }'))
note "loopback TCP, tmpfs file to tmpfs file (median of 5): read+send $tcp_copy GB/s, sendfile $tcp_sendfile GB/s"
note "the replica link alone: first replica $link_first GB/s, the next ones (median of 4) $link_next GB/s"

start_etcd 1
SECRET=$T/secret
head -c 48 /dev/urandom | base64 > "$SECRET"
chmod 600 "$SECRET"
COMMON=(--cluster bench --member-timeout 2 --cluster-store "etcd://$ETCD_EPS" --cache-size 8G)
# p has no replica link: it is the job without replicas, and never w's
# holder (the rendezvous hash over every linked member chose p for some
# names, and h held nothing).
LINK=(--replica-listen 127.0.0.1:0 --cluster-secret "$SECRET" --replica-budget 4G)
# The bytes to save in RAM (tmpfs), as a trainer's tensors are: from $T on
# disk, every save after drop_caches timed this VM's disk (0.4-1.7 GB/s).
DATA=/dev/shm/ckptfs-replicas-data-$$
at_exit 'rm -f "$DATA"'
head -c $((SIZE_MIB << 20)) /dev/urandom > "$DATA"

save_r=() save_p=() next_ratio=() rep_ratio=() rep_s=() takeover_s=() again_s=() again_ratio=() again_tcp=()
for rep in $(seq "$REPS"); do
  # Both writers' drains held: neither drain runs under a timed save, and
  # both are let go together, so that each next save comes as soon after
  # its node's drain (stop 50: w's drain ran right before its next save
  # and p's minutes before; 1 GiB written to this VM's disk a second
  # earlier made w's next save 1.7-4x p's, with or without replicas: 1.2x
  # when the saves waited 10 s more).
  touch "$T/pause_w" "$T/pause_p"
  mount_node w "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_w" -- "${COMMON[@]}" "${LINK[@]}" --node "w$rep" --replicas 1 ${WLOG:+--log-level debug}
  mount_node h -- "${COMMON[@]}" "${LINK[@]}" --node "h$rep" ${HLOG:+--log-level debug}
  mount_node p "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_p" -- "${COMMON[@]}" --node "p$rep" ${PLOG:+--log-level debug}
  W=$(node_mnt w) P=$(node_mnt p)
  wait_for 10 "w saw no replica peer 10 s after the mounts" status_is "$W" "s['cluster']['replicas']['peers'] >= 1"
  # Each mount's first spare made (a trainer builds its model before its
  # first save, longer than the spare takes): the save measured, not the
  # race with it.
  for m in w h p; do
    wait_for 30 "$m made no ${SIZE_MIB} MiB spare 30 s after its mount" \
      status_is "$(node_mnt $m)" "s['passthrough']['prealloc_bytes'] >= $SIZE_MIB << 20"
  done
  order=(w p); [ $((rep % 2)) = 0 ] && order=(p w)
  for m in "${order[@]}"; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    quiet_daemons
    mnt=$(node_mnt $m)
    # One job's namespace: each node its own name, as ranks have (the
    # same name would make the second writer's open an update of the
    # first's file, fetched before it is written).
    name=shard; [ $m = p ] && name=p-shard
    t0=$(now)
    dd if="$DATA" of="$mnt/$name" bs=4M status=none
    t1=$(now)
    if [ $m = w ]; then
      save_w=$(secs "$t0" "$t1")
      wait_state "$mnt/shard" replicated || fail "w's shard never replicated"
      t2=$(now)
      rs=$(secs "$t1" "$t2")
      rep_s+=("$rs")
      rep_ratio+=("$(awk -v s="$SIZE_MIB" -v t="$rs" -v u="$ucx_bw" 'BEGIN { printf "%.3f", s / t / u }')")
    else
      save_p_one=$(secs "$t0" "$t1")
    fi
  done
  save_r+=("$save_w") save_p+=("$save_p_one")
  note "rep $rep: save with replicas $save_w s, without $save_p_one s, close -> replicated ${rs} s"
  # The next checkpoint (a trainer's steady state): w's drain persists the
  # shard, the holder drops its replica (keeping its pages as a spare), and
  # a second shard is replicated into them.
  rm -f "$T/pause_w" "$T/pause_p"
  H=$(node_mnt h)
  wait_for 60 "the holder kept w's replica 60 s after the drains were let go" \
    status_is "$H" "s['cluster']['replicas']['held_files'] == 0"
  wait_state "$P/p-shard" persisted || fail "p's shard never persisted"
  touch "$T/pause_w" "$T/pause_p"
  sleep 0.5  # the drains see the pause before the next close
  # The next save on both, in rotated order: the steady state a trainer
  # lives in (the first save of a fresh mount above is issue #29's "first").
  for m in "${order[@]}"; do
    mnt=$(node_mnt $m)
    quiet_daemons
    t0=$(now)
    name=shard2; [ $m = p ] && name=p-shard2
    dd if="$DATA" of="$mnt/$name" bs=4M status=none
    t1=$(now)
    if [ $m = p ]; then
      next_p=$(secs "$t0" "$t1")
      continue
    fi
    next_w=$(secs "$t0" "$t1")
    wait_state "$W/shard2" replicated || fail "w's second shard never replicated"
    again=$(secs "$t1" "$(now)")
  done
  next_ratio+=("$(awk -v a="$next_w" -v b="$next_p" 'BEGIN { printf "%.3f", a / b }')")
  again_s+=("$again")
  again_ratio+=("$(awk -v s="$SIZE_MIB" -v t="$again" -v u="$ucx_bw" 'BEGIN { printf "%.3f", s / t / u }')")
  again_tcp+=("$(awk -v s="$SIZE_MIB" -v t="$again" -v u="$tcp_copy" 'BEGIN { printf "%.3f", s * 1048576 / t / 1e9 / u }')")
  note "rep $rep: the next save with replicas $next_w s, without $next_p s, close -> replicated $again s"
  [ -z "${WLOG:-}" ] || grep -h "replicated 1 time\|save" "$(node_state w)/ckptfs.log" | tail -5 >&2
  # w lost: the holder publishes its second shard (after p's, when p
  # closed its own first: the job's drain is ordered across nodes).
  # When w closed first, p's shard waits for w's, held: asked only when p
  # went first (waiting for it either way failed every other repetition
  # once a timeout failed the bench; before, it spent 60 s unseen).
  rm -f "$T/pause_p"
  if [ "${order[0]}" = p ]; then wait_state "$P/p-shard2" persisted || fail "p's second shard never persisted"; fi
  # Timed from the kill: removing the lost node's tier (1-2 GiB) takes a
  # moment, and its lease may expire meanwhile (timed after it until stop
  # 54: 0.6 s "writer lost -> backend" with a 2 s lease).
  t3=$(now)
  kill_node w
  rm_tier "$TIER-w"
  # The publish is atomic (a temporary name, then rename): the file there
  # whole is the end. Compared after the clock stops: the drain writes
  # with O_DIRECT, so cmp reads 1 GiB cold from the disk (1.5-2 s here),
  # which until stop 64 was timed too (writer lost 4.9-6.4 s in stop 64's
  # first run, where the holder's log put the publish 4.0 s after the kill).
  for _ in $(seq 3000); do
    [ "$(stat -c %s "$BACKEND/shard2" 2> /dev/null)" = $((SIZE_MIB << 20)) ] && break
    sleep 0.01
  done
  takeover_s+=("$(secs "$t3" "$(now)")")
  cmp -s "$DATA" "$BACKEND/shard2" || fail "the holder did not publish w's shard"
  for n in h p; do umount_node $n; done
  "$CKPTFS" umount "$W" > /dev/null 2>&1 || umount -l "$W" 2> /dev/null || true
  [ -z "${PLOG:-}" ] || cp "$(node_state p)/ckptfs.log" "/tmp/replicas-p$rep.log"
  [ -z "${HLOG:-}" ] || { cp "$(node_state h)/ckptfs.log" "/tmp/replicas-h$rep.log" && echo "# rep $rep: lost at $t3" >&2; }
  # Every node fresh in the next repetition: a state dir kept made p's next
  # mount re-attach the files of this one (2 GiB in its tier), and such a
  # mount makes no spare before a save: its "first save" took fresh pages.
  for n in w h p; do rm_tier "$TIER-$n"; done
  rm -rf "$(node_state w)" "$(node_state h)" "$(node_state p)" "$BACKEND/shard" "$BACKEND/shard2" \
    "$BACKEND/p-shard" "$BACKEND/p-shard2" "$TIER-h-replicas" "$TIER-p-replicas" "$TIER-w-replicas"
  _STATE_DIRS=()
done

echo "# replicas, $SIZE_MIB MiB, $REPS repetitions (min / median / max)"
ratios=()
for i in "${!save_r[@]}"; do ratios+=("$(awk -v a="${save_r[$i]}" -v b="${save_p[$i]}" 'BEGIN { printf "%.3f", a / b }')"); done
stats "first save of a mount: with --replicas 1 / without" "${ratios[@]}"
stats "next save: with --replicas 1 / without (<= 1.05)" "${next_ratio[@]}"
stats "close -> replicated (s)" "${rep_s[@]}"
stats "replication / ucx_perftest tag_bw (>= 0.8)" "${rep_ratio[@]}"
stats "next save: close -> replicated (s)" "${again_s[@]}"
stats "next save: replication / ucx_perftest" "${again_ratio[@]}"
stats "next save: replication / loopback TCP file copy" "${again_tcp[@]}"
echo "loopback TCP, tmpfs file to tmpfs file: read+send $tcp_copy GB/s, sendfile $tcp_sendfile GB/s (median of 5)"
echo "the replica link alone: first replica $link_first GB/s, the next $link_next GB/s (median of 4)"
echo "ucx_perftest tag_bw: $ucx_bw MiB/s"
stats "writer lost -> its file in the backend (s)" "${takeover_s[@]}"
