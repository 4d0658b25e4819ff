#!/usr/bin/env bash
# peer_loads.sh — loads from peers (issue #30), on this machine, in one run,
# over a local backend directory and a 1-member etcd:
#  - recovery: a writer w (--replicas 1, its drain held) saves a SIZE_MIB
#    file and is lost (daemon killed, tier removed); its holder h publishes
#    the file and keeps the replica. A replacement node r (a node id that
#    is not the file's home, so it asks h) reads the file; a node x without
#    a replica link reads the same file from the backend (page cache
#    dropped before each read). Ratio: x's read ÷ r's (goal ≥ 5).
#  - fan-out: READERS nodes open one persisted file at once: the backend
#    reads they cost together (status to_backend), against READERS without
#    loads from peers, the time until all have it, and the most copies one
#    member sent (status served_bytes ÷ the size): with the tree
#    (--peer-fanout FANOUT, default 2) and without it (--peer-fanout 0, the
#    home serves every reader).
# BENCH_BACKEND=s3: the backend is s3rver on loopback (tests/s3/s3rver.sh)
# instead of a local directory. Prints min / median / max. Needs root, etcd.
#
#   BUILD=build REPS=3 SIZE_MIB=1024 READERS=4 [FANOUT=2] [BENCH_BACKEND=s3] tests/bench/peer_loads.sh
set -euo pipefail
REPS=${REPS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
READERS=${READERS:-4}
FANOUT=${FANOUT:-2}
export CASE=bench-peer_loads
source "$(dirname "$0")/../mount/lib/common.sh"
source "$(dirname "$0")/lib.sh"
require_root
export UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no UCX_MEMTYPE_CACHE=n

start_etcd 1
SECRET=$T/secret
head -c 48 /dev/urandom | base64 > "$SECRET"
chmod 600 "$SECRET"
BASE=(--cluster bench --member-timeout 2 --cluster-store "etcd://$ETCD_EPS" --cache-size 8G)
if [ "${BENCH_BACKEND:-posix}" = s3 ]; then
  source "$(dirname "$0")/../mount/lib/s3.sh"
  s3_start
  BASE+=(--backend "s3://$S3_BUCKET/run" --s3-endpoint "$S3_ENDPOINT")
  in_backend() { s3c get "run/$1" "$T/got" 2> /dev/null && cmp -s "$T/data" "$T/got"; }
else
  in_backend() { cmp -s "$T/data" "$BACKEND/$1"; }
fi
LINK=(--replica-listen 127.0.0.1:0 --cluster-secret "$SECRET" --replica-budget 4G)
head -c $((SIZE_MIB << 20)) /dev/urandom > "$T/data"
loads() { "$CKPTFS" status "$(node_mnt "$1")" --json | $PY -c "import json,sys; j=json.load(sys.stdin)['cluster']['replicas']; $2"; }
wait_peers() {  # wait_peers NODE N
  for _ in $(seq 200); do loads "$1" "assert j['peers'] >= $2" 2> /dev/null && return 0; sleep 0.1; done
  fail "$1 does not see $2 peers"
}
# A node id that ranks below `holder` for `path` in the members' rendezvous
# order (fs/cluster/replicator.cc: XXH3-64 of path NUL node), so that it
# asks the holder.
below() {  # below PATH HOLDER PREFIX
  $PY - "$@" << 'EOF'
import ctypes, sys
x = ctypes.CDLL("libxxhash.so.0").XXH3_64bits
x.restype, x.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]
def r(path, node):
    b = path.encode() + b"\0" + node.encode()
    return x(b, len(b))
path, holder, prefix = sys.argv[1:4]
print(next(prefix + str(i) for i in range(1000) if r(path, prefix + str(i)) < r(path, holder)))
EOF
}
forget_node() {  # unmounted for good: its state dir leaves the case's list
  local kept=() s
  for s in "${_STATE_DIRS[@]}"; do [ "$s" = "$(node_state "$1")" ] || kept+=("$s"); done
  _STATE_DIRS=("${kept[@]}")
  rm -rf "$(node_state "$1")"
}

peer_s=() backend_s=() ratio=()
for rep in $(seq "$REPS"); do
  touch "$T/pause"
  mount_node w$rep "CKPTFS_DRAIN_PAUSE_FILE=$T/pause" -- "${BASE[@]}" "${LINK[@]}" --node w$rep --replicas 1
  mount_node h$rep -- "${BASE[@]}" "${LINK[@]}" --node h$rep
  wait_peers w$rep 1
  path=step$rep/model.pt
  mkdir -p "$(node_mnt w$rep)/step$rep"
  dd if="$T/data" of="$(node_mnt w$rep)/$path" bs=4M status=none
  for _ in $(seq 6000); do
    [ "$(getfattr --only-values -n user.ckptfs.state "$(node_mnt w$rep)/$path" 2> /dev/null)" = replicated ] && break
    sleep 0.01
  done
  kill_node w$rep
  rm_tier "$TIER-w$rep"
  for _ in $(seq 600); do in_backend "$path" && break; sleep 0.25; done
  in_backend "$path" || fail "the holder did not publish w's file"
  "$CKPTFS" umount "$(node_mnt w$rep)" > /dev/null 2>&1 || umount -l "$(node_mnt w$rep)" 2> /dev/null || true
  forget_node w$rep

  r=$(below "$path" h$rep r$rep-)
  mount_node $r -- "${BASE[@]}" "${LINK[@]}" --node "$r"
  mount_node x$rep -- "${BASE[@]}" --node x$rep
  wait_peers $r 1
  order=($r x$rep); [ $((rep % 2)) = 0 ] && order=(x$rep $r)
  for n in "${order[@]}"; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(now)
    cat "$(node_mnt $n)/$path" > /dev/null
    dt=$(secs "$t0" "$(now)")
    cmp -s "$T/data" "$(node_mnt $n)/$path" || fail "$n read other bytes"
    if [ $n = "$r" ]; then tp=$dt; else tb=$dt; fi
  done
  [ "$(loads $r 'print(j["loads"]["from_peers"])')" = 1 ] || fail "$r did not load from its peer: $(loads $r 'print(j)')"
  peer_s+=("$tp") backend_s+=("$tb")
  ratio+=("$(awk -v a="$tb" -v b="$tp" 'BEGIN { printf "%.3f", a / b }')")
  note "rep $rep: $SIZE_MIB MiB from a peer $tp s, from the backend $tb s"
  for n in h$rep $r x$rep; do umount_node $n; forget_node $n; done
  rm -rf "$TIER-h$rep-replicas"
done

# ---- fan-out: READERS nodes open one file at once ----
fan() {  # fan MODE (0: no links, 1: links and the tree, 2: links, no tree): prints "backend_reads seconds copies"
  local mode=$1 nodes=() n t0 pids=() reads=0 most=0 c
  local opts=("${BASE[@]}")
  case $mode in 1) opts+=("${LINK[@]}" --peer-fanout "$FANOUT") ;; 2) opts+=("${LINK[@]}" --peer-fanout 0) ;; esac
  for i in $(seq 0 "$READERS"); do
    n=f$mode-$i
    mount_node $n -- "${opts[@]}" --node $n
    nodes+=($n)
  done
  [ "$mode" = 0 ] || wait_peers f$mode-0 "$READERS"
  mkdir -p "$(node_mnt f$mode-0)/fan$mode"
  dd if="$T/data" of="$(node_mnt f$mode-0)/fan$mode/model.pt" bs=4M status=none
  "$CKPTFS" drain "$(node_mnt f$mode-0)" > /dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches
  t0=$(now)
  for n in "${nodes[@]:1}"; do cat "$(node_mnt $n)/fan$mode/model.pt" > /dev/null & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  local dt; dt=$(secs "$t0" "$(now)")
  if [ "$mode" != 0 ]; then
    for n in "${nodes[@]}"; do
      reads=$((reads + $(loads $n 'print(j["loads"]["to_backend"])')))
      c=$(loads $n "print(round(j['loads']['served_bytes'] / ($SIZE_MIB << 20)))")
      [ "$c" -le "$most" ] || most=$c
    done
  else
    reads=$READERS
  fi
  for n in "${nodes[@]}"; do umount_node $n; forget_node $n; done
  echo "$reads $dt $most"
}
read -r fan_reads fan_s fan_most <<< "$(fan 1)"
read -r flat_reads flat_s flat_most <<< "$(fan 2)"
read -r plain_reads plain_s _ <<< "$(fan 0)"

echo "# loads from peers, $SIZE_MIB MiB, backend ${BENCH_BACKEND:-posix}, $REPS repetitions (min / median / max)"
stats "recovery: read from a peer (s)" "${peer_s[@]}"
stats "recovery: read from the backend (s)" "${backend_s[@]}"
stats "from the backend / from a peer (>= 5)" "${ratio[@]}"
echo "fan-out, $READERS readers of one $SIZE_MIB MiB file at once: backend reads $fan_reads (without loads from peers: $plain_reads), all read in $fan_s s (without: $plain_s s)"
echo "fan-out, the most copies one member sent: $fan_most with --peer-fanout $FANOUT (backend reads $flat_reads, all read in $flat_s s, $flat_most copies with --peer-fanout 0)"
