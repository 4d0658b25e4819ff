#!/usr/bin/env bash
# replicas.sh — what --replicas 1 costs and gives (issue #30), on this
# machine, in one run: three mounts of one job over a local backend and a
# 1-member etcd: w (writes, --replicas 1, its drain held so that nothing
# else moves), h (holds), p (writes, no replicas). Per repetition, in
# rotated order:
#   - the save of a SIZE_MIB file (dd bs=4M, then close) into w and into p:
#     save with replicas ÷ without (goal ≤ 1.05);
#   - on w, the time from close to `replicated`, and the replication's
#     throughput (SIZE ÷ that time) ÷ ucx_perftest tag_bw over loopback TCP
#     in the same run (goal ≥ 0.8);
#   - the next save, once w's drain persisted the first (the holder keeps
#     the dropped replica's pages as a spare): close to `replicated` again;
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

# The transport's own bandwidth here, same run.
port=$((20000 + RANDOM % 20000))
ucx_perftest -p "$port" > /dev/null 2>&1 &
srv=$!
sleep 1
ucx_bw=$(UCX_TLS=tcp ucx_perftest -p "$port" -t tag_bw -s 4194304 -n 200 127.0.0.1 2>/dev/null | awk '/Final:/ { print $6 }')
kill "$srv" 2> /dev/null || true
note "ucx_perftest tag_bw, loopback, 4 MiB: $ucx_bw MB/s"

start_etcd 1
SECRET=$T/secret
head -c 48 /dev/urandom | base64 > "$SECRET"
chmod 600 "$SECRET"
COMMON=(--cluster bench --member-timeout 2 --cluster-store "etcd://$ETCD_EPS" --cache-size 8G
  --replica-listen 127.0.0.1:0 --cluster-secret "$SECRET" --replica-budget 4G)
head -c $((SIZE_MIB << 20)) /dev/urandom > "$T/data"

save_r=() save_p=() rep_ratio=() rep_s=() takeover_s=() again_s=() again_ratio=()
for rep in $(seq "$REPS"); do
  touch "$T/pause_w"
  mount_node w "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_w" -- "${COMMON[@]}" --node "w$rep" --replicas 1 ${WLOG:+--log-level debug}
  mount_node h -- "${COMMON[@]}" --node "h$rep"
  mount_node p -- "${COMMON[@]}" --node "p$rep"
  W=$(node_mnt w) P=$(node_mnt p)
  for _ in $(seq 100); do
    "$CKPTFS" status "$W" --json | $PY -c "import json,sys; assert json.load(sys.stdin)['cluster']['replicas']['peers'] >= 2" \
      2> /dev/null && break
    sleep 0.1
  done
  order=(w p); [ $((rep % 2)) = 0 ] && order=(p w)
  for m in "${order[@]}"; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    mnt=$(node_mnt $m)
    t0=$(now)
    dd if="$T/data" of="$mnt/shard" bs=4M conv=notrunc status=none
    t1=$(now)
    if [ $m = w ]; then
      save_w=$(secs "$t0" "$t1")
      for _ in $(seq 6000); do
        [ "$(getfattr --only-values -n user.ckptfs.state "$mnt/shard" 2> /dev/null)" = replicated ] && break
        sleep 0.01
      done
      t2=$(now)
      rs=$(secs "$t1" "$t2")
      rep_s+=("$rs")
      rep_ratio+=("$(awk -v s="$SIZE_MIB" -v t="$rs" -v u="$ucx_bw" 'BEGIN { printf "%.3f", s * 1.048576 / t / u }')")
    else
      save_p_one=$(secs "$t0" "$t1")
    fi
  done
  save_r+=("$save_w") save_p+=("$save_p_one")
  note "rep $rep: save with replicas $save_w s, without $save_p_one s, close -> replicated ${rs} s"
  # The next checkpoint (a trainer's steady state): w's drain persists the
  # shard, the holder drops its replica (keeping its pages as a spare), and
  # a second shard is replicated into them.
  rm -f "$T/pause_w"
  H=$(node_mnt h)
  for _ in $(seq 600); do
    "$CKPTFS" status "$H" --json | $PY -c "import json,sys; assert json.load(sys.stdin)['cluster']['replicas']['held_files'] == 0" \
      2> /dev/null && break
    sleep 0.1
  done
  touch "$T/pause_w"
  sleep 0.5  # the drain sees the pause before the next close
  dd if="$T/data" of="$W/shard2" bs=4M status=none
  t1=$(now)
  for _ in $(seq 6000); do
    [ "$(getfattr --only-values -n user.ckptfs.state "$W/shard2" 2> /dev/null)" = replicated ] && break
    sleep 0.01
  done
  again=$(secs "$t1" "$(now)")
  again_s+=("$again")
  again_ratio+=("$(awk -v s="$SIZE_MIB" -v t="$again" -v u="$ucx_bw" 'BEGIN { printf "%.3f", s * 1.048576 / t / u }')")
  note "rep $rep: the next save, close -> replicated $again s"
  [ -z "${WLOG:-}" ] || grep -h "replicated 1 time\|save" "$(node_state w)/ckptfs.log" | tail -5 >&2
  # w lost: the holder publishes its second shard.
  kill_node w
  rm_tier "$TIER-w"
  t3=$(now)
  for _ in $(seq 3000); do cmp -s "$T/data" "$BACKEND/shard2" && break; sleep 0.01; done
  cmp -s "$T/data" "$BACKEND/shard2" || fail "the holder did not publish w's shard"
  takeover_s+=("$(secs "$t3" "$(now)")")
  for n in h p; do umount_node $n; done
  "$CKPTFS" umount "$W" > /dev/null 2>&1 || umount -l "$W" 2> /dev/null || true
  rm -rf "$(node_state w)" "$BACKEND/shard" "$BACKEND/shard2" "$TIER-h-replicas"
  kept=(); for s in "${_STATE_DIRS[@]}"; do [ "$s" = "$(node_state w)" ] || kept+=("$s"); done; _STATE_DIRS=("${kept[@]}")
done

echo "# replicas, $SIZE_MIB MiB, $REPS repetitions (min / median / max)"
ratios=()
for i in "${!save_r[@]}"; do ratios+=("$(awk -v a="${save_r[$i]}" -v b="${save_p[$i]}" 'BEGIN { printf "%.3f", a / b }')"); done
stats "save with --replicas 1 / without (<= 1.05)" "${ratios[@]}"
stats "close -> replicated (s)" "${rep_s[@]}"
stats "replication / ucx_perftest tag_bw (>= 0.8)" "${rep_ratio[@]}"
stats "next save: close -> replicated (s)" "${again_s[@]}"
stats "next save: replication / ucx_perftest" "${again_ratio[@]}"
stats "writer lost -> its file in the backend (s)" "${takeover_s[@]}"
