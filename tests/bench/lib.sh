# lib.sh — what the shell benchmarks share (sourced).
#
# stats NAME VALUES...: one line, min / median / max and n.
stats() {
  local name=$1; shift
  printf '%s\n' "$@" | sort -g | awk -v n="$name" '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%-44s %8.3f / %8.3f / %8.3f  (n=%d)\n", n, v[1], m, v[NR], NR }'
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", b - a }'; }  # secs T0 T1: T1 - T0

# quiet_daemons: until this case's daemons together used at most 2 % of a
# core over half a second (30 s at most). Where several "nodes" share this
# machine's two cores, one node's background work (the spare made after a
# save, a replica landing, a drain) would otherwise be timed in another
# node's save; on a cluster they are different machines.
quiet_daemons() {
  local pids ticks prev=-1
  pids=$(_our_daemons | tr '\n' ' ')
  for _ in $(seq 60); do
    # utime + stime (fields 14, 15) of every daemon, in clock ticks (100 Hz).
    ticks=$(for p in $pids; do awk '{ print $14 + $15 }' "/proc/$p/stat" 2> /dev/null; done | awk '{ s += $1 } END { print s + 0 }')
    [ "$prev" -ge 0 ] && [ $((ticks - prev)) -le 1 ] && return
    prev=$ticks
    sleep 0.5
  done
}
