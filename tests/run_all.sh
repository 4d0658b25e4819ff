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
#   TSAN=build-thread tests/run_all.sh   then the ThreadSanitizer phase
#   TSAN=build-thread ONLY=tsan tests/run_all.sh   only that phase (make tsan)
#   TSAN_BUILD_CMD="make SAN=thread all units"   builds TSAN's tree beside the
#                    parallel mounted cases instead of before the run (make test)
#   ASAN=build-address tests/run_all.sh  then the AddressSanitizer (+UBSan)
#                    phase; ONLY=asan and ASAN_BUILD_CMD as for TSan
#
# The ThreadSanitizer phase (TSAN=DIR, a `make SAN=thread` build) runs DIR's
# unit binaries and the mounted cases whose header has a line
# `# tsan: REASON` against DIR's daemon, each named tsan-NAME. Any TSan
# report fails the binary or case (reports go to files, TSAN_OPTIONS
# log_path; suppressions: tests/tsan.supp). The AddressSanitizer phase
# (ASAN=DIR, a `make SAN=address` build: ASan and UBSan) does the same with
# the cases marked `# asan: REASON`, each named asan-NAME: any ASan or UBSan
# report fails (ASAN_OPTIONS and UBSAN_OPTIONS log_path). With both build
# commands, the two builds run one after the other in the background, TSan
# first. See docs/testing.md.
#
# Environment: BUILD (default build), CASE_TIMEOUT (seconds per mounted case,
# default 600), UNIT_TIMEOUT (per unit binary, default 600), UNIT_BESIDE
# (unit binaries run in the background beside the others; default unit_etcd), JOBS (mounted
# cases run at once, default 3; a case marked `# serial: REASON` always runs
# alone, see tests/mount/lib/common.sh), KEEP=1 keeps a failed case's temp
# dir. A mounted case exits 0 (pass), 77 (skip) or anything else (fail);
# a case that leaves a process, a mount under its temp dir or a tier dir
# behind fails whatever it exited with (one line per thing left), and what
# it left is cleaned up. Case results print as each case finishes, each
# case's block whole; a failed case's block starts with its FAIL: line(s)
# (the check that failed), then the end of its output (the daemon logs).
#
# No test passes vacuously: a missing precondition is a counted skip, and
# a skip fails the run unless the machine's list names it. A Criterion test
# that is skipped (cr_skip_test, .disabled) must be in
# tests/unit/expected_skips.txt (`suite::test  reason`), a mounted case that
# exits 77 in tests/mount/expected_skips.txt (`case  reason`; a line for
# CASE covers tsan-CASE and asan-CASE). UNIT_EXPECTED_SKIPS=FILE and
# MOUNT_EXPECTED_SKIPS=FILE name other lists (another kind of machine).
# Every skip, expected or not, is listed with its reason before the
# summary line.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
export BUILD
ONLY=${ONLY:-}
CASE_TIMEOUT=${CASE_TIMEOUT:-600}
UNIT_TIMEOUT=${UNIT_TIMEOUT:-600}
JOBS=${JOBS:-3}
case $JOBS in ''|*[!0-9]*|0) echo "JOBS must be a positive number, not '$JOBS'" >&2; exit 2 ;; esac
FILTERS=("$@")
case $ONLY in
  ""|unit|mount) ;;
  tsan) [ -n "${TSAN:-}" ] || { echo "ONLY=tsan needs TSAN=DIR (a make SAN=thread build)" >&2; exit 2; } ;;
  asan) [ -n "${ASAN:-}" ] || { echo "ONLY=asan needs ASAN=DIR (a make SAN=address build)" >&2; exit 2; } ;;
  *) echo "ONLY must be unit, mount, tsan or asan, not '$ONLY'" >&2; exit 2 ;;
esac
TSAN=${TSAN:-}
case $TSAN in ''|/*) ;; *) TSAN=$REPO/$TSAN ;; esac
ASAN=${ASAN:-}
case $ASAN in ''|/*) ;; *) ASAN=$REPO/$ASAN ;; esac
# What every sanitizer-built process gets (a unit binary or case adds
# log_path). Later options win: the caller's options go after the defaults.
export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$REPO/tests/tsan.supp ${TSAN_OPTIONS:-}"
# ASan stops at its first report (its default); LeakSanitizer checks each
# process as it exits (unit tests, the CLI; not the daemon, which ends with
# _exit). UBSan stops too (the build has -fno-sanitize-recover=undefined)
# and prints the stack.
export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-}"
# UCX (the replica link) patches mmap, madvise and malloc when its library
# loads, to keep an RDMA registration cache coherent; under TSan a thread's
# exit then calls the patched madvise after TSan let go of the thread, and
# crashes. Nothing here uses RDMA: every test runs without the hooks
# (docs/operations.md, "Replicas"). UCX reads these when it loads, so they
# cannot be set from the code.
export UCX_MEM_EVENTS=${UCX_MEM_EVENTS:-no} UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-none} \
  UCX_MEM_MALLOC_HOOKS=${UCX_MEM_MALLOC_HOOKS:-no} UCX_MEMTYPE_CACHE=${UCX_MEMTYPE_CACHE:-n}
PREFIX=""  # tsan- or asan- in a sanitizer phase

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

# A case's root is $RUN/case-NAME: its $T is made there, and
# tests/mount/lib/common.sh writes its $TIER to ROOT/tiers. Everything below
# is keyed on that root and those names, so cases side by side never see
# each other's processes, mounts or tiers.

# Processes whose command line names a path under root $1, "PID CMDLINE"
# each: the case's ckptfs daemons, and anything else it started with a path
# of its own. The grep is over when the list is read: its own command line
# (which names the root) is gone, as is any other process that ended.
root_procs() {
  local f list cmd
  list=$(grep -lasz -- "$1/" /proc/[0-9]*/cmdline 2>/dev/null)
  for f in $list; do
    { cmd=$(tr '\0' ' ' < "$f"); } 2>/dev/null || continue
    [ -n "$cmd" ] || continue
    f=${f#/proc/}
    echo "${f%/cmdline} $cmd"
  done
}

# Mount points under root $1 (from /proc/self/mountinfo), deepest first.
root_mounts() {
  awk -v t="$1/" 'index($5, t) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}

# The tier dirs of root $1 that exist: each $TIER in ROOT/tiers and its
# $TIER-* (nodes, the crash harness's iterations, degraded_mount's second).
root_tiers() {
  local t d
  [ -f "$1/tiers" ] || return 0
  while IFS= read -r t; do
    case $t in /dev/shm/ckptfs-test-?*) ;; *) continue ;; esac
    for d in "$t" "$t"-*; do
      [ -e "$d" ] || [ -L "$d" ] && echo "$d"
    done
  done < "$1/tiers" | sort -u
}

# What the ended case of root $1 left behind, one line each (nothing if
# nothing): processes, mounts, tier dirs. A process gets 10 s to end first:
# the EXIT trap's kill -9 does not wait, and a killed daemon can take a
# second or two to go.
leftovers() {
  local root=$1 procs p cmd m d _i
  for _i in $(seq 100); do
    procs=$(root_procs "$root")
    [ -z "$procs" ] && break
    sleep 0.1
  done
  while read -r p cmd; do
    [ -n "$p" ] || continue
    case $cmd in
      *ckptfs*" mount "*) echo "left behind: ckptfs daemon $p: ${cmd:0:200}" ;;
      *) echo "left behind: process $p: ${cmd:0:200}" ;;
    esac
  done <<< "$procs"
  for m in $(root_mounts "$root"); do echo "left behind: mount $m"; done
  for d in $(root_tiers "$root"); do
    if findmnt -n -M "$d" > /dev/null 2>&1; then
      echo "left behind: tier dir $d (a tmpfs mounted there)"
    else
      echo "left behind: tier dir $d"
    fi
  done
}

# Removes whatever a case left under its root: mounts (lazily detached),
# processes (killed by pid), its tier dirs (their tmpfs detached first),
# then the root itself.
clean_root() {
  local root=$1 m p cmd d
  for m in $(root_mounts "$root"); do
    echo "  cleanup: stale mount $m" >&2
    fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  while read -r p cmd; do
    [ -n "$p" ] || continue
    echo "  cleanup: stale process $p" >&2
    kill -9 "$p" 2>/dev/null
  done <<< "$(root_procs "$root")"
  for d in $(root_tiers "$root"); do
    echo "  cleanup: stale tier dir $d" >&2
    if findmnt -n -M "$d" > /dev/null 2>&1; then umount -l "$d" 2>/dev/null; fi
    rm -rf "$d"
  done
  rm -rf "$root"
}

cleanup_run() {
  local r f
  for f in "$RUN"/*.tpid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  [ -z "$(jobs -p)" ] || sleep 2  # the cases' own EXIT traps go first
  for r in "$RUN"/case-*; do [ -d "$r" ] && clean_root "$r"; done
}
trap 'cleanup_run; exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The skips this machine may have: `NAME  reason` per line, # comments;
# NAME is suite::test (unit) or a case's name (mounted).
UNIT_EXPECTED_SKIPS=${UNIT_EXPECTED_SKIPS:-$REPO/tests/unit/expected_skips.txt}
MOUNT_EXPECTED_SKIPS=${MOUNT_EXPECTED_SKIPS:-$REPO/tests/mount/expected_skips.txt}
# Every skip of the run, one line each, listed before the summary line.
SKIPS=$RUN/skips
: > "$SKIPS"
# Prints the reason list $1 gives for skipping $2; false if it is not listed.
expected_skip() {
  [ -f "$1" ] && awk -v t="$2" '$1 == t { f = 1; $1 = ""; sub(/^[ \t]+/, ""); print } END { exit !f }' "$1"
}

# Reports and counts the Criterion tests in log $1 of binary $2 that were
# skipped (`[SKIP] suite::test: why`, shown with --verbose). Returns 1 if one
# of them is not an expected skip.
check_unit_skips() {
  local log=$1 name=$2 t why listed bad=0
  while IFS=$'\t' read -r t why; do
    if listed=$(expected_skip "$UNIT_EXPECTED_SKIPS" "$t"); then
      skipped=$((skipped + 1))
      echo "  skip $t: $why (expected: $listed)"
      echo "skip        $name $t: $why (expected: $listed)" >> "$SKIPS"
    else
      failed=$((failed + 1))
      echo "  UNEXPECTED SKIP $t: $why (fix the condition, or list it in ${UNIT_EXPECTED_SKIPS#"$REPO"/})"
      echo "UNEXPECTED  $name $t: $why (not in ${UNIT_EXPECTED_SKIPS#"$REPO"/}: failed)" >> "$SKIPS"
      bad=1
    fi
  done < <(sed 's/\x1b\[[0-9;]*m//g' "$log" | sed -nE 's/^\[SKIP\] ([^ :]+::[^ :]+): ?(.*)$/\1\t\2/p')
  return $bad
}

# Sanitizer reports written under directory $1 (tests/mount/lib/san_report.sh:
# the first whole, six frames a stack, then one summary line each); false
# if there are none.
source "$REPO/tests/mount/lib/san_report.sh"
san_reports() {
  local reports
  reports=$(san_files "$1"/r.*) || return 1
  # shellcheck disable=SC2086  # one file name per line, none with spaces
  san_show $reports | sed 's/^/  | /'
  return 0
}

# The name of the sanitizer phase PREFIX is in, for messages.
san_name() {
  case $PREFIX in
    tsan-) echo ThreadSanitizer ;;
    asan-) echo AddressSanitizer/UndefinedBehaviorSanitizer ;;
    *) echo sanitizer ;;
  esac
}

# One unit binary, run to its end: its exit status and seconds go to
# $RUN/NAME.urc for report_unit.
exec_unit() {
  local bin=$1 name=$2 t0 rc out=$RUN/$2.log
  mkdir -p "$RUN/san-$name"
  t0=$(now)
  # --verbose: only then does Criterion print [SKIP] lines.
  # In the background and waited for, its pid in NAME.tpid (as run_case):
  # an INT or TERM stops it (cleanup_run) even when it runs beside others.
  TSAN_OPTIONS="$TSAN_OPTIONS log_path=$RUN/san-$name/r" \
    ASAN_OPTIONS="$ASAN_OPTIONS log_path=$RUN/san-$name/r" \
    UBSAN_OPTIONS="$UBSAN_OPTIONS log_path=$RUN/san-$name/r" \
    timeout -k 10 "$UNIT_TIMEOUT" "$bin" --ascii --verbose > "$out" 2>&1 &
  echo $! > "$RUN/$name.tpid"
  wait $!
  rc=$?
  rm -f "$RUN/$name.tpid"
  # UBSan beside ASan ignores log_path and reports on stderr, here the
  # binary's log: its part from the first report on is scanned too.
  if grep -q ': runtime error: ' "$out"; then
    sed 's/\x1b\[[0-9;]*m//g' "$out" | awk '/: runtime error: / { r = 1 } r' > "$RUN/san-$name/r.stderr"
  fi
  echo "$rc $(elapsed "$t0")" > "$RUN/$name.urc"
}

# UNIT_BESIDE: binaries that wait most of their time (unit_etcd runs its
# tests one at a time against etcd servers: 16 s of CPU in 80 s, as long
# under a sanitizer). Each starts in the background before the others run
# and its result prints after theirs.
UNIT_BESIDE=${UNIT_BESIDE:-unit_etcd}

run_units() {
  local bin name pid
  local -a beside_pids=() beside_names=()
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
    name=$PREFIX$(basename "$bin")
    selected "$name" || continue
    [[ " $UNIT_BESIDE " == *" $(basename "$bin") "* ]] || continue
    exec_unit "$bin" "$name" &
    beside_pids+=($!)
    beside_names+=("$name")
  done
  for bin in "${bins[@]}"; do
    [ -x "$bin" ] || continue
    name=$PREFIX$(basename "$bin")
    selected "$name" || continue
    [[ " $UNIT_BESIDE " != *" $(basename "$bin") "* ]] || continue
    exec_unit "$bin" "$name"
    report_unit "$name"
  done
  for pid in "${!beside_pids[@]}"; do
    wait "${beside_pids[$pid]}"
    report_unit "${beside_names[$pid]}"
  done
}

# The result of exec_unit's run of NAME: printed and counted.
report_unit() {
  local name=$1 out=$RUN/$1.log rc secs syn tested passing failing crashing skips skip_rc san
  read -r rc secs < "$RUN/$name.urc" || { rc=1; secs=?; }
  syn=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E 'Synthesis: Tested: [0-9]+' | tail -n 1)
  # Criterion does not see TSan's reports (a test that raced still
  # passes), nor always ASan's (the test's process ends): each binary
  # with reports fails once.
  if san=$(san_reports "$RUN/san-$name"); then
    echo "FAIL $name: $(san_name) reports (${secs}s)"
    echo "$san"
    failed=$((failed + 1))
    # The tests that failed or crashed beside the reports are shown and
    # counted too (a crash may be what the report was about).
    if [ -n "$syn" ]; then
      echo "  $syn (exit $rc)"
      passed=$((passed + $(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<< "$syn")))
      failed=$((failed + $(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<< "$syn")))
    else
      echo "  (exit $rc, no Criterion synthesis line)"
    fi
    sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E '\[(FAIL|----)\]|CRASH|signal|Assertion' | head -n 40 | sed 's/^/  | /'
    return
  fi
  if [ -z "$syn" ]; then
    echo "FAIL $name (exit $rc, no Criterion synthesis line, ${secs}s)"
    tail -n 30 "$out" | sed 's/^/  | /'
    failed=$((failed + 1))
    return
  fi
  tested=$(sed -E 's/.*Tested: ([0-9]+).*/\1/' <<< "$syn")
  passing=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<< "$syn")
  failing=$(sed -E 's/.*Failing: ([0-9]+).*/\1/' <<< "$syn")
  crashing=$(sed -E 's/.*Crashing: ([0-9]+).*/\1/' <<< "$syn")
  passed=$((passed + passing))
  failed=$((failed + failing))
  # Criterion counts crashes among the failures; if not, add them.
  if [ $((passing + failing)) -lt "$tested" ]; then failed=$((failed + tested - passing - failing)); fi
  check_unit_skips "$out" "$name" > "$out.skips"
  skip_rc=$?
  skips=$(cat "$out.skips")
  if [ "$failing" -eq 0 ] && [ "$crashing" -eq 0 ] && [ "$passing" -eq "$tested" ] && [ "$rc" -eq 0 ] \
    && [ "$skip_rc" -eq 0 ]; then
    echo "PASS $name: $passing tests (${secs}s)"
    [ -z "$skips" ] || echo "$skips"
  elif [ "$failing" -eq 0 ] && [ "$crashing" -eq 0 ] && [ "$passing" -eq "$tested" ] && [ "$rc" -eq 0 ]; then
    echo "FAIL $name: $passing tests passed, but some were skipped (${secs}s)"
    echo "$skips"
  else
    [ -z "$skips" ] || echo "$skips"
    if [ "$failing" -eq 0 ] && [ "$passing" -eq "$tested" ]; then
      failed=$((failed + 1))  # exit status says something broke
    fi
    echo "FAIL $name: $passing of $tested passed, $failing failing, $crashing crashing (exit $rc, ${secs}s)"
    sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -E '\[(FAIL|----)\]|CRASH|signal|Assertion' | head -n 40 | sed 's/^/  | /'
  fi
}

# Runs one mounted case (in the background under run_mounted): its output
# goes to $RUN/NAME.log, "RC ELAPSED" to $RUN/NAME.rc once it is done and its
# root is cleaned up.
run_case() {
  local c=$1 name root t0 rc
  name=$(case_key "$c")
  root=$RUN/case-$name
  mkdir -p "$root"
  chmod 755 "$root"
  t0=$(now)
  # timeout in the background, so that an interrupted run can stop it by
  # pid (it passes the signal on to the case, whose EXIT trap cleans up).
  CKPTFS_TEST_ROOT=$root timeout -k 20 "$CASE_TIMEOUT" bash "$c" > "$RUN/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$name.tpid"
  wait $!
  rc=$?
  rm -f "$RUN/$name.tpid"
  echo "$rc $(elapsed "$t0")" > "$RUN/$name.rc.tmp"
  # Passed or failed, a case leaves nothing behind (its EXIT trap cleans
  # up): what is left fails it (report_case), and is cleaned here so that
  # the cases after it do not meet it.
  leftovers "$root" > "$RUN/$name.left"
  clean_root "$root" >> "$RUN/$name.log" 2>&1
  mv "$RUN/$name.rc.tmp" "$RUN/$name.rc"
}

# The FAIL: blocks of case output $1: each line `FAIL: case: msg` (the
# `fail` helper of tests/mount/lib/common.sh) and the lines that continue
# its message, up to the next `--- ` (the daemon log tails), `# ` (a note)
# or FAIL: line; 20 lines a block, 60 in all.
fail_blocks() {
  awk '/^FAIL: / { inb = 1; n = 0 }
       !/^FAIL: / && (/^--- / || /^# / || /^kept \//) { inb = 0 }
       inb && n++ < 20 && total++ < 60 { print }' "$1"
}

# Prints the result of a finished case (its whole block at once, so that
# cases running side by side never interleave) and counts it. A skip
# (exit 77) that the machine's list does not name fails.
report_case() {
  local name=$1 out=$RUN/$1.log rc secs why left="" listed first
  read -r rc secs < "$RUN/$name.rc" || { rc=1; secs=?; }
  [ -s "$RUN/$name.left" ] && left=$(cat "$RUN/$name.left")
  case $rc in
    0|77)
      if [ -n "$left" ]; then
        [ "$rc" = 0 ] && why=passed || why=skipped
        echo "FAIL $name ($why, but left things behind, ${secs}s)"
        sed 's/^/  /' <<< "$left"
        failed=$((failed + 1))
      elif [ "$rc" = 0 ]; then
        echo "PASS $name (${secs}s)"
        passed=$((passed + 1))
      else
        why=$(grep -E '^SKIP: ' "$out" | tail -n 1 | sed -E 's/^SKIP: [^:]*: //')
        [ -n "$why" ] || why="exit 77, no SKIP: line"
        if listed=$(expected_skip "$MOUNT_EXPECTED_SKIPS" "$name") \
          || listed=$(expected_skip "$MOUNT_EXPECTED_SKIPS" "${name#"$PREFIX"}"); then
          echo "SKIP $name ($why; expected: $listed)"
          echo "skip        $name: $why (expected: $listed)" >> "$SKIPS"
          skipped=$((skipped + 1))
        else
          echo "FAIL $name (skipped: $why; not in ${MOUNT_EXPECTED_SKIPS#"$REPO"/}: fix the condition, or list it there)"
          echo "UNEXPECTED  $name: $why (not in ${MOUNT_EXPECTED_SKIPS#"$REPO"/}: failed)" >> "$SKIPS"
          failed=$((failed + 1))
        fi
      fi ;;
    *)
      [ "$rc" = 124 ] && why="timed out after ${CASE_TIMEOUT}s" || why="exit $rc"
      echo "FAIL $name ($why, ${secs}s)"
      # The check that failed first, then the end of the output, where the
      # daemon log tails are.
      first=$(fail_blocks "$out")
      if [ -n "$first" ]; then
        sed 's/^/  /' <<< "$first"
      else
        echo "  (no FAIL: line: the case ended without the fail helper; its last lines follow)"
      fi
      tail -n 40 "$out" | sed 's/^/  | /'
      [ -z "$left" ] || sed 's/^/  /' <<< "$left"
      failed=$((failed + 1)) ;;
  esac
}

# A case with a line `# serial: REASON` runs alone (see the header of
# tests/mount/lib/common.sh); the others run JOBS at a time. Results are
# printed in the order the cases finish.
is_serial() { grep -qE '^# serial: ' "$1"; }
# A case with a line `# tsan: REASON` also runs in the ThreadSanitizer
# phase, one with `# asan: REASON` in the AddressSanitizer phase: the
# phase's prefix without its dash names the mark.
in_phase() { grep -qE "^# ${PREFIX%-}: " "$1"; }
# The name a case's files and results go by (tsan-NAME, asan-NAME there).
case_key() { echo "$PREFIX$(basename "$1" .sh)"; }

declare -A _running=()  # pid -> case name
_san_builds=""           # pid of the background sanitizer builds (TSAN_BUILD_CMD, ASAN_BUILD_CMD)
_san_kinds=""            # the kinds it builds, in order (tsan asan)

# Starts the sanitizer builds that have a command (TSAN_BUILD_CMD, then
# ASAN_BUILD_CMD: one after the other, so that they never share the CPUs
# with each other), once per run. Each leaves $RUN/KIND-build.log and then
# $RUN/KIND-build.rc, its exit status.
start_san_builds() {
  local kinds=()
  [ -z "$_san_builds" ] || return 0
  # Only the builds of phases this run has.
  [ -n "$TSAN" ] && [ -n "${TSAN_BUILD_CMD:-}" ] && [ "${ONLY:-tsan}" = tsan ] && kinds+=(tsan)
  [ -n "$ASAN" ] && [ -n "${ASAN_BUILD_CMD:-}" ] && [ "${ONLY:-asan}" = asan ] && kinds+=(asan)
  [ ${#kinds[@]} -gt 0 ] || return 0
  _san_kinds=${kinds[*]}
  (
    for k in "${kinds[@]}"; do
      [ "$k" = tsan ] && cmd=$TSAN_BUILD_CMD || cmd=$ASAN_BUILD_CMD
      (cd "$REPO" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u BUILD bash -c "$cmd" > "$RUN/$k-build.log" 2>&1)
      echo $? > "$RUN/$k-build.rc.tmp"
      mv "$RUN/$k-build.rc.tmp" "$RUN/$k-build.rc"
    done
  ) &
  _san_builds=$!
}

# True while a background sanitizer build runs (one whose status is not in).
san_building() {
  local k
  for k in $_san_kinds; do
    [ -f "$RUN/$k-build.rc" ] || { kill -0 "$_san_builds" 2> /dev/null && return 0; }
  done
  return 1
}

# Waits until no background sanitizer build runs.
wait_san_builds() {
  while san_building; do sleep 1; done
}

# Waits for the background build of KIND (tsan, asan); false if it failed.
wait_san_build() {
  local k=$1 rc
  start_san_builds
  while [ ! -f "$RUN/$k-build.rc" ]; do
    kill -0 "$_san_builds" 2> /dev/null || break
    sleep 1
  done
  read -r rc < "$RUN/$k-build.rc" 2> /dev/null || rc=1
  [ "$rc" = 0 ]
}

# Waits for one running case and reports it (wait -p: bash 5.1).
reap_one() {
  local pid=""
  wait -n -p pid "${!_running[@]}"
  [ -n "$pid" ] || return 0
  report_case "${_running[$pid]}"
  unset "_running[$pid]"
}

run_mounted() {
  local c name
  local -a par=() ser=()
  shopt -s nullglob
  local cases=("$REPO"/tests/mount/cases/*.sh)
  shopt -u nullglob
  for c in "${cases[@]}"; do
    name=$PREFIX$(basename "$c" .sh)
    selected "$name" || continue
    [ -z "$PREFIX" ] || in_phase "$c" || continue
    if is_serial "$c"; then ser+=("$c"); else par+=("$c"); fi
  done
  # The serial cases first, one by one: the longest of them set the pace,
  # and nothing else runs beside them. In the TSan phase the ASan build may
  # still be compiling: then the parallel cases go first, and the serial
  # ones (most of which measure time) wait for it.
  if [ -n "$PREFIX" ] && san_building; then
    run_parallel "${par[@]}"
    wait_san_builds
    run_serial "${ser[@]}"
    return
  fi
  run_serial "${ser[@]}"
  # The sanitizer builds (TSAN_BUILD_CMD, ASAN_BUILD_CMD, from make test)
  # compile beside the parallel cases, which mostly wait on mounts, drains
  # and Python: minutes of the run, no longer in series.
  [ -n "$PREFIX" ] || start_san_builds
  run_parallel "${par[@]}"
}

run_serial() {
  local c
  for c in "$@"; do
    run_case "$c"
    report_case "$(case_key "$c")"
  done
}

run_parallel() {
  local c
  for c in "$@"; do
    while [ "${#_running[@]}" -ge "$JOBS" ]; do reap_one; done
    run_case "$c" &
    _running[$!]=$(case_key "$c")
  done
  while [ "${#_running[@]}" -gt 0 ]; do reap_one; done
}

# A sanitizer phase, KIND tsan or asan: the binaries of its build (TSAN,
# ASAN), the cases marked for it.
run_san() {
  local k=$1 dir build=$BUILD
  [ "$k" = tsan ] && dir=$TSAN || dir=$ASAN
  [ -n "$dir" ] || return 0
  PREFIX=$k-
  if { [ "$k" = tsan ] && [ -n "${TSAN_BUILD_CMD:-}" ]; } || { [ "$k" = asan ] && [ -n "${ASAN_BUILD_CMD:-}" ]; }; then
    if ! wait_san_build "$k"; then
      echo "FAIL $k-build (the $(san_name) build failed)"
      tail -n 30 "$RUN/$k-build.log" | sed 's/^/  | /'
      failed=$((failed + 1))
      PREFIX=""
      return 0
    fi
  fi
  BUILD=$dir
  run_units
  run_mounted
  BUILD=$build PREFIX=""
}

case $ONLY in
  "") run_units; run_mounted; run_san tsan; run_san asan ;;
  unit) run_units ;;
  mount) run_mounted ;;
  tsan) run_san tsan ;;
  asan) run_san asan ;;
esac

cleanup_run
if [ -s "$SKIPS" ]; then
  echo "Skipped ($(wc -l < "$SKIPS"); an UNEXPECTED one counts as failed):"
  sed 's/^/  /' "$SKIPS"
fi
rm -rf "$RUN"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
