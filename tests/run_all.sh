#!/usr/bin/env bash
# run_all.sh — runs every Criterion unit test binary ($BUILD/tests/unit_*)
# and every mounted case (tests/mount/cases/*.sh), then prints one summary
# line `N passed, N failed, N skipped` (unit tests counted one by one) and
# exits non-zero if anything failed.
#
#   tests/run_all.sh                  everything
#   ONLY=unit tests/run_all.sh        only the unit binaries
#   ONLY=mount tests/run_all.sh       only the mounted cases
#   tests/run_all.sh rename errors    only names containing one of the words
#
# Environment: BUILD (default build), CASE_TIMEOUT (seconds per mounted case,
# default 600), UNIT_TIMEOUT (per unit binary, default 600), KEEP=1 keeps a
# failed case's temp dir. A mounted case exits 0 (pass), 77 (skip) or
# anything else (fail); whatever it leaves mounted or running is cleaned up.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
export BUILD
ONLY=${ONLY:-}
CASE_TIMEOUT=${CASE_TIMEOUT:-600}
UNIT_TIMEOUT=${UNIT_TIMEOUT:-600}
FILTERS=("$@")
case $ONLY in
  ""|unit|mount) ;;
  *) echo "ONLY must be unit or mount, not '$ONLY'" >&2; exit 2 ;;
esac

passed=0 failed=0 skipped=0
RUN=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-run.XXXXXX")
chmod 755 "$RUN"

# True if no filter was given or $1 contains one of the filter words.
selected() {
  local f
  [ ${#FILTERS[@]} -eq 0 ] && return 0
  for f in "${FILTERS[@]}"; do
    case $1 in *"$f"*) return 0 ;; esac
  done
  return 1
}

# Whatever a case left under its root: mounts (lazily detached), daemons
# (killed by pid), tier dirs in /dev/shm.
clean_root() {
  local root=$1 m p cmd d
  for m in $(awk -v t="$root/" 'index($2, t) == 1 { print $2 }' /proc/mounts | sort -r); do
    echo "  cleanup: stale mount $m" >&2
    fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  for p in $(grep -lasz -- "$root/" /proc/[0-9]*/cmdline 2>/dev/null); do
    p=${p%/cmdline}
    { cmd=$(tr '\0' ' ' < "$p/cmdline"); } 2>/dev/null || continue
    case $cmd in
      *ckptfs*" mount "*"$root/"*)
        echo "  cleanup: stale daemon ${p#/proc/}" >&2
        kill -9 "${p#/proc/}" 2>/dev/null ;;
    esac
  done
  for d in "$root"/ckptfs-*; do
    [ -d "$d" ] || continue
    rm -rf /dev/shm/ckptfs-test-*-"$(basename "$d")" /dev/shm/ckptfs-test-*-"$(basename "$d")"-*
  done
  rm -rf "$root"
}

cleanup_run() {
  local r
  for r in "$RUN"/case-*; do [ -d "$r" ] && clean_root "$r"; done
}
trap 'cleanup_run; exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

run_units() {
  local bin name out t0 rc syn tested passing failing crashing
  shopt -s nullglob
  local bins=("$BUILD"/tests/unit_*)
  shopt -u nullglob
  if [ ${#bins[@]} -eq 0 ]; then
    echo "FAIL unit: no binaries in $BUILD/tests (run make units)"
    failed=$((failed + 1))
    return
  fi
  for bin in "${bins[@]}"; do
    [ -x "$bin" ] || continue
    name=$(basename "$bin")
    selected "$name" || continue
    out=$RUN/$name.log
    t0=$(now)
    timeout -k 10 "$UNIT_TIMEOUT" "$bin" --ascii > "$out" 2>&1
    rc=$?
    syn=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E 'Synthesis: Tested: [0-9]+' | tail -n 1)
    if [ -z "$syn" ]; then
      echo "FAIL $name (exit $rc, no Criterion synthesis line, $(elapsed "$t0")s)"
      tail -n 30 "$out" | sed 's/^/  | /'
      failed=$((failed + 1))
      continue
    fi
    tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<< "$syn")
    passing=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<< "$syn")
    failing=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<< "$syn")
    crashing=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<< "$syn")
    passed=$((passed + passing))
    failed=$((failed + failing))
    # Criterion counts crashes among the failures; if not, add them.
    if [ $((passing + failing)) -lt "$tested" ]; then failed=$((failed + tested - passing - failing)); fi
    if [ "$failing" -eq 0 ] && [ "$crashing" -eq 0 ] && [ "$passing" -eq "$tested" ] && [ "$rc" -eq 0 ]; then
      echo "PASS $name: $passing tests ($(elapsed "$t0")s)"
    else
      if [ "$failing" -eq 0 ] && [ "$passing" -eq "$tested" ]; then
        failed=$((failed + 1))  # exit status says something broke
      fi
      echo "FAIL $name: $passing of $tested passed, $failing failing, $crashing crashing (exit $rc, $(elapsed "$t0")s)"
      sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E '\[(FAIL|----)\]|CRASH|signal|Assertion' | head -n 40 | sed 's/^/  | /'
    fi
  done
}

run_mounted() {
  local c name root out t0 rc why
  shopt -s nullglob
  local cases=("$REPO"/tests/mount/cases/*.sh)
  shopt -u nullglob
  for c in "${cases[@]}"; do
    name=$(basename "$c" .sh)
    selected "$name" || continue
    root=$RUN/case-$name
    mkdir -p "$root"
    chmod 755 "$root"
    out=$RUN/$name.log
    t0=$(now)
    CKPTFS_TEST_ROOT=$root timeout -k 20 "$CASE_TIMEOUT" bash "$c" > "$out" 2>&1 < /dev/null
    rc=$?
    case $rc in
      0)
        echo "PASS $name ($(elapsed "$t0")s)"
        passed=$((passed + 1)) ;;
      77)
        why=$(grep -E '^SKIP: ' "$out" | tail -n 1 | sed -E 's/^SKIP: [^:]*: //')
        echo "SKIP $name${why:+ ($why)}"
        skipped=$((skipped + 1)) ;;
      *)
        [ "$rc" = 124 ] && why="timed out after ${CASE_TIMEOUT}s" || why="exit $rc"
        echo "FAIL $name ($why, $(elapsed "$t0")s)"
        tail -n 40 "$out" | sed 's/^/  | /'
        failed=$((failed + 1)) ;;
    esac
    clean_root "$root"
  done
}

case $ONLY in
  "") run_units; run_mounted ;;
  unit) run_units ;;
  mount) run_mounted ;;
esac

cleanup_run
rm -rf "$RUN"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
