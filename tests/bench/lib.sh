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
