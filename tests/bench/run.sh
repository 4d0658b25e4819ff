#!/usr/bin/env bash
# run.sh — `make bench`: ckptfs against tmpfs (/dev/shm), a local disk
# directory and rclone (vfs-cache-mode full), each mounted or created fresh
# for every measurement, in an order that rotates from one repetition to the
# next. bench.py does the timing; this script mounts, drops caches, collects
# `metric value unit` lines into a CSV, and at the end calls report.py, which
# writes docs/benchmarks.md (the tables between its markers) and
# docs/benchmarks.png. Every goal is a ratio against a peer measured in the
# same repetition, reported as min/median/max over the repetitions.
#
#   make bench                                # full run (root; ~20-30 min on 2 cores)
#   BUILD=build-bench SIZE=512M TORCH_GIB=0.25 REPS=2 FILES=1000 tests/bench/run.sh   # quick
#   PHASES=fsync TARGETS="ckptfs tmpfs" REPORT=0 tests/bench/run.sh         # one phase alone
#
# Environment (defaults in brackets):
#   BUILD [build]        where ckptfs was built
#   SIZE [4G]            sequential file size (1 MiB blocks)
#   TORCH_GIB [2]        model + Adam state size for torch.save/load
#   SHARDS [64]          the same state split into this many files
#   FILES [10000]        files in the tier for the remount test (FILE_BYTES [16384] each)
#   REPS [3]             repetitions (each one measures every target once)
#   TRAINER_REPS [5]     repetitions of the trainer phase (cheap, and the noisiest: fresh pages
#                        on this VM cost 0.4 to 3 GB/s from one minute to the next)
#   PAT_GIB [1]          state saved in the patterns phase (PATTERNS [keep keep2 pressure full ranks first])
#   TRAINER_ONLY         targets of the trainer phase's first group (default: ckptfs ckptfs-nopt tmpfs disk); set, the second group is skipped
#   TARGETS [ckptfs ckptfs-nopt ckptfs-huge tmpfs disk rclone]   (ckptfs-nopt: ckptfs -o passthrough=off;
#                        ckptfs-huge: ckptfs --tier-huge on, the tier on 2 MiB pages;
#                        with ckptfs, the trainer and frameworks phases also run
#                        ckptfs-nopt, ckptfs-noyield: ckptfs --drain-yield 0, and
#                        ckptfs-nouring: ckptfs -o io_uring=off, requests through /dev/fuse)
#   PHASES [trainer patterns frameworks seq interfere torch remount fsync s3]   (trainer: one long-lived process
#                        saving TORCH_GIB to ckptfs, ckptfs -o passthrough=off, tmpfs and disk in
#                        turn, then another to the other ckptfs variants, tmpfs and disk (phase
#                        trainer-b: seven targets at once held more RAM than the machine); frameworks: DCP (4 ranks x 24 fsynced files of ~FW_MIB [2] MiB) and
#                        HF Trainer checkpoint dirs the same way, each read back by a new process)
#   FSYNC_SIZE [2G]      file size for the fsync phase (tests/bench/fsync_latency.py: fsync of a
#                        file still open for writing, then a 1 MiB write, while another thread
#                        stats other paths; ckptfs with --fsync memory and its drain paused, and
#                        tmpfs; the other targets are not measured there)
#   CACHE_SIZE [fits]    ckptfs --cache-size (default: what the largest phase needs, +25 %)
#   BENCH_WORK [tests/bench/out/work-PID]  the local disk directory (disk target, ckptfs backend
#                        and state, rclone's remote and cache)
#   S3_SIZE [1G]         file size for tests/bench/s3_drain.sh (run with N=REPS)
#   REPORT [1]           0: do not touch docs/ (CSV only)
#   BENCH_NOTE           a sentence added to the report (e.g. "quiet machine")
#   BENCH_SETTLE [6]     seconds of quiet before each timed save and load (bench.py settle)
#
# Output: tests/bench/out/results-STAMP.csv (and results.csv, a copy of the
# latest), columns run,phase,metric,target,rep,value,unit. tests/bench/s3_drain.sh,
# if present, is run last (SIZE=$S3_SIZE N=$REPS, with BENCH_CSV, BENCH_RUN and
# BUILD exported): it prints its own results (kept in out/s3_drain-STAMP.out,
# whose summary lines the report quotes) and may append rows (phase s3_drain)
# to $BENCH_CSV, which the report shows as they are.
#
# Needs root (mounts, /proc/sys/vm/drop_caches); cleans up every mount,
# daemon and /dev/shm directory it created, also on failure or Ctrl-C.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
REPO=$(pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$REPO/$BUILD ;; esac
CKPTFS=$BUILD/ckptfs
PY=/usr/bin/python3
BENCH="$PY $REPO/tests/bench/bench.py"
export LC_ALL=C

SIZE=${SIZE:-4G}
TORCH_GIB=${TORCH_GIB:-2}
SHARDS=${SHARDS:-64}
FILES=${FILES:-10000}
FILE_BYTES=${FILE_BYTES:-16384}
REPS=${REPS:-3}
TRAINER_REPS=${TRAINER_REPS:-$((REPS < 5 ? 5 : REPS))}
TARGETS=${TARGETS:-"ckptfs ckptfs-nopt ckptfs-huge tmpfs disk rclone"}
PHASES=${PHASES:-"trainer patterns frameworks seq interfere torch remount fsync s3"}
FSYNC_SIZE=${FSYNC_SIZE:-2G}
REPORT=${REPORT:-1}
OUT=$REPO/tests/bench/out
STAMP=$(date -u +%Y%m%d-%H%M%S)
RUN_ID=$STAMP
WORK=${BENCH_WORK:-$OUT/work-$$}
SHM=/dev/shm/ckptfs-bench-$$
CSV=$OUT/results-$STAMP.csv
LOG=$OUT/run-$STAMP.log
S3_OUT=$OUT/s3_drain-$STAMP.out
S3_SIZE=${S3_SIZE:-1G}

die() { echo "bench: $*" >&2; exit 1; }
say() { echo "bench: $*" | tee -a "$LOG" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts for every user, drop_caches)"
[ -x "$CKPTFS" ] || die "no $CKPTFS: run make BUILD=${BUILD#"$REPO"/}"
[ -e /dev/fuse ] || die "no /dev/fuse"
command -v fusermount3 >/dev/null || die "no fusermount3"
case " $PHASES " in
  *" torch "*|*" trainer "*) "$PY" -c 'import torch' 2>/dev/null || die "python3-torch missing (scripts/install-bench-deps.sh)" ;;
esac
case " $TARGETS " in *" rclone "*) command -v rclone >/dev/null || die "rclone missing (scripts/install-bench-deps.sh)" ;; esac
SIZE_BYTES=$(numfmt --from=iec "$SIZE") || die "bad SIZE $SIZE"
FSYNC_BYTES=$(numfmt --from=iec "$FSYNC_SIZE") || die "bad FSYNC_SIZE $FSYNC_SIZE"
TORCH_BYTES=$(awk -v g="$TORCH_GIB" 'BEGIN { printf "%.0f", g * 2^30 * 1.02 }')
if [ -z "${CACHE_SIZE:-}" ]; then
  CACHE_SIZE=$(awk -v a="$SIZE_BYTES" -v b="$TORCH_BYTES" -v c="$((FILES * (FILE_BYTES + 4096)))" \
    'BEGIN { m = a; if (2 * b > m) m = 2 * b; if (c > m) m = c; printf "%dM", m * 1.25 / 2^20 + 64 }')
fi
need_kb=$(( $(numfmt --from=iec "$CACHE_SIZE") / 1024 * 2 + 3 * TORCH_BYTES / 1024 ))
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
shm_kb=$(df -k --output=avail /dev/shm | tail -n 1 | tr -d ' ')
[ "$shm_kb" -gt $(( $(numfmt --from=iec "$CACHE_SIZE") / 1024 )) ] || die "/dev/shm has ${shm_kb} KiB free, the tier needs $CACHE_SIZE"

mkdir -p "$OUT" "$WORK" || die "cannot create $WORK"
: > "$CSV"
: > "$LOG"
[ "$avail_kb" -gt "$need_kb" ] || say "warning: ${avail_kb} KiB available, ~${need_kb} KiB wanted; results may include reclaim or swap"
echo "run,phase,metric,target,rep,value,unit" > "$CSV"

# ---------------------------------------------------------------- cleanup
CK_PIDS=()   # ckptfs daemons we started
RC_PIDS=()   # rclone processes we started
failures=0

our_mounts() { awk -v w="$WORK/" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r; }

# Kills pid $1 if it is still the process we started (its command line names $WORK or $SHM).
kill_ours() {
  local p=$1 cmd
  { cmd=$(tr '\0' ' ' < "/proc/$p/cmdline"); } 2>/dev/null || return 0
  case $cmd in *"$WORK"*|*"$SHM"*) kill "${2:--TERM}" "$p" 2>/dev/null ;; esac
}

cleanup() {
  local rc=$? m p i
  trap - EXIT INT TERM
  for m in $(our_mounts); do fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  for p in "${CK_PIDS[@]}" "${RC_PIDS[@]}"; do kill_ours "$p"; done
  for i in $(seq 50); do
    local alive=0
    for p in "${CK_PIDS[@]}" "${RC_PIDS[@]}"; do [ -d "/proc/$p" ] && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${CK_PIDS[@]}" "${RC_PIDS[@]}"; do kill_ours "$p" -KILL; done
  rm_tier "$SHM"-*
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- helpers
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.6f", b - a }'; }

rec() {  # phase metric target rep value unit
  echo "$RUN_ID,$1,$2,$3,$4,$5,$6" >> "$CSV"
  printf '  %-8s %-28s %-14s rep %s  %12s %s\n' "$1" "$2" "$3" "$4" "$5" "$6" | tee -a "$LOG" >&2
}

# measure PHASE TARGET REP PREFIX CMD...: runs CMD, records its `metric value unit` lines.
measure() {
  local phase=$1 target=$2 rep=$3 prefix=$4 out m v u
  shift 4
  if ! out=$(timeout 1200 "$@" 2>>"$LOG"); then
    say "FAILED ($target rep $rep): $*"
    failures=$((failures + 1))
    return 1
  fi
  while read -r m v u; do
    [ -n "$m" ] && rec "$phase" "$prefix$m" "$target" "$rep" "$v" "$u"
  done <<< "$out"
}

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# rm_tier DIR...: removes tier directories, the tmpfs of their own that
# ckptfs mounts there (--tier-huge) first.
rm_tier() {
  local p
  for p in "$@"; do
    findmnt -n -M "$p" >/dev/null 2>&1 && umount -l "$p" 2>/dev/null
    rm -rf "$p"
  done
}

ck_pid() { "$CKPTFS" status --json "$1" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["pid"])'; }

# ck_mount TAG [ARGS...]: mounts ckptfs at $WORK/TAG/mnt (backend, state under
# $WORK/TAG, tier $SHM-TAG, ARGS added); sets DIR and CK_PID. Mounting an
# existing TAG re-attaches it.
ck_mount() {
  local t=$WORK/$1
  mkdir -p "$t/mnt" "$t/backend" "$t/state"
  "$CKPTFS" mount "$t/mnt" --backend "$t/backend" --state-dir "$t/state" --tier-dir "$SHM-$1" \
    --cache-size "$CACHE_SIZE" "${@:2}" >> "$LOG" 2>&1 || { say "ckptfs mount failed (see $t/state/ckptfs.log)"; return 1; }
  CK_PID=$(ck_pid "$t/mnt") || return 1
  CK_PIDS+=("$CK_PID")
  DIR=$t/mnt
}

# ck_umount TAG [--no-drain|--keep-cache]: unmounts and waits for the daemon
# to exit. Without --keep-cache the tier is given back once all is persisted.
ck_umount() {
  "$CKPTFS" umount "$WORK/$1/mnt" ${2:-} >> "$LOG" 2>&1 || { say "ckptfs umount $1 failed"; return 1; }
}

rc_mount() {
  local t=$WORK/$1 i
  mkdir -p "$t/mnt" "$t/remote" "$t/cache"
  rclone mount ":local:$t/remote" "$t/mnt" --vfs-cache-mode full --cache-dir "$t/cache" --config /dev/null \
    --log-file "$t/rclone.log" &
  RC_PIDS+=($!)
  for i in $(seq 300); do
    findmnt -n -M "$t/mnt" >/dev/null 2>&1 && { DIR=$t/mnt; return 0; }
    sleep 0.1
  done
  say "rclone mount did not appear in 30 s"
  return 1
}

rc_umount() {
  local t=$WORK/$1 p=${RC_PIDS[-1]} i
  fusermount3 -u "$t/mnt" 2>/dev/null || fusermount3 -uz "$t/mnt"
  for i in $(seq 300); do [ -d "/proc/$p" ] || return 0; sleep 0.1; done
  kill_ours "$p"
}

# up TARGET TAG: creates or mounts a fresh instance of TARGET; sets DIR.
up() {
  case $1 in
    ckptfs) ck_mount "$2" ;;
    ckptfs-nopt) ck_mount "$2" -o passthrough=off ;;
    ckptfs-huge) ck_mount "$2" --tier-huge on ;;
    ckptfs-noyield) ck_mount "$2" --drain-yield 0 ;;
    ckptfs-nouring) ck_mount "$2" -o io_uring=off ;;
    rclone) rc_mount "$2" ;;
    tmpfs) DIR=$SHM-$2; mkdir -p "$DIR" ;;
    disk) DIR=$WORK/$2; mkdir -p "$DIR" ;;
  esac
}

down() {
  case $1 in
    ckptfs|ckptfs-nopt|ckptfs-huge|ckptfs-noyield|ckptfs-nouring) ck_umount "$2"; rm_tier "${SHM:?}-$2" ;;
    rclone) rc_umount "$2" ;;
    tmpfs) rm -rf "${SHM:?}-$2" ;;
  esac
  rm -rf "${WORK:?}/$2"
}

# The targets of repetition $1, rotated so that no target always goes first.
order() {
  local -a t=($TARGETS)
  local n=${#t[@]} i
  for ((i = 0; i < n; i++)); do echo "${t[$(((i + $1 - 1) % n))]}"; done
}

# Daemon figures: CPU seconds and memory (proc), tier bytes.
ck_proc() { measure "$1" ckptfs "$2" "$3" $BENCH proc "$CK_PID"; }
tier_bytes() { du -s -B1 "$SHM-$1" | cut -f1; }
data_bytes() { find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%.0f", s }'; }

# ---------------------------------------------------------------- phases
# The peers of time to durable for ckptfs's seq file $1 (repetition $2, tag
# $3), measured in the same repetition (issue #29: this disk's speed swings
# 0.4-1.7 GB/s from one minute to the next, so a peer measured in another
# target's turn compared the disk's moods): cp + sync, dd with fsync and dd
# with O_DIRECT of the same bytes, from a tmpfs copy, into a directory
# beside the backend, in an order rotated from one repetition to the next.
# After the reads of the file: 12 GiB through /dev/shm and the page cache
# right before them made ckptfs's warm read 0.45-0.68x tmpfs's.
durable_peers() {
  local f=$1 r=$2 tag=$3 d t0 p i
  local -a peers=(cp_sync dd_fsync dd_direct)
  d=$WORK/cp-$tag
  cp "$f" "$SHM-src-$tag" && sync
  for ((i = 0; i < 3; i++)); do
    p=${peers[$(((i + r - 1) % 3))]}
    rm -rf "$d" && mkdir -p "$d" && sync
    t0=$(now)
    case $p in
      cp_sync) cp "$SHM-src-$tag" "$d/" && sync ;;
      dd_fsync) dd if="$SHM-src-$tag" of="$d/dd.bin" bs=4M conv=fsync status=none ;;
      dd_direct) dd if="$SHM-src-$tag" of="$d/dd.bin" bs=4M oflag=direct status=none && sync ;;
    esac
    rec seq "peer_${p}_seconds" ckptfs "$r" "$(since "$t0")" s
  done
  rm -rf "$d" "$SHM-src-$tag"
}

phase_seq() {
  local r t tag f t0 d spare
  for r in $(seq "$REPS"); do
    for t in $(order "$r"); do
      say "seq: $t, repetition $r of $REPS"
      tag=seq-$t-$r
      drop_caches
      up "$t" "$tag" || { failures=$((failures + 1)); down "$t" "$tag"; continue; }
      f=$DIR/seq.bin
      case $t in
        ckptfs)
          ck_proc seq "$r" before_
          # Time to durable: polled in bench.py (user.ckptfs.state every 5 ms)
          # from close; `ckptfs drain` polls only every 500 ms.
          measure seq "$t" "$r" "" $BENCH seq-write "$f" "$SIZE_BYTES" --poll-state --pid "$CK_PID"
          "$CKPTFS" drain "$DIR" >> "$LOG" 2>&1 || failures=$((failures + 1))
          ck_proc seq "$r" drained_
          ;;
        tmpfs)  # and the peer for time to durable: cp + sync of the same bytes to the backend's disk
          measure seq "$t" "$r" "" $BENCH seq-write "$f" "$SIZE_BYTES"
          d=$WORK/cp-$tag
          mkdir -p "$d"
          sync
          t0=$(now)
          cp "$f" "$d/" && sync
          rec seq durable_seconds tmpfs "$r" "$(since "$t0")" s
          rm -rf "$d" ;;
        disk)
          measure seq "$t" "$r" "" $BENCH seq-write "$f" "$SIZE_BYTES"
          t0=$(now)
          sync
          rec seq durable_seconds disk "$r" "$(since "$t0")" s ;;
        *)
          measure seq "$t" "$r" "" $BENCH seq-write "$f" "$SIZE_BYTES" ;;
      esac
      [ "$t" = ckptfs ] && ck_proc seq "$r" read_before_
      measure seq "$t" "$r" read_warm_ $BENCH seq-read "$f"
      [ "$t" = ckptfs ] && ck_proc seq "$r" read_after_
      drop_caches
      measure seq "$t" "$r" read_cold_ $BENCH seq-read "$f"
      if [ "$t" = ckptfs ]; then
        # The tier's bytes less the spares made for the next save (free
        # room in df, status's prealloc_bytes).
        spare=$("$CKPTFS" status "$DIR" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["passthrough"]["prealloc_bytes"])')
        rec seq spare_bytes ckptfs "$r" "$spare" B
        rec seq tier_bytes ckptfs "$r" "$(($(tier_bytes "$tag") - spare))" B
        rec seq data_bytes ckptfs "$r" "$(data_bytes "$DIR")" B
        durable_peers "$f" "$r" "$tag"
      fi
      # The steady state (issue #15): the same write again, as a trainer's
      # next save, after the quiet between checkpoints (the first one
      # persisted, then removed as a trainer rotates; dirty pages written
      # back; a pause in which ckptfs pre-allocates pages). On ckptfs the
      # first file of a mount takes the copying path; this one is
      # passthrough into pre-allocated pages.
      case $t in ckptfs|ckptfs-nopt|ckptfs-huge|ckptfs-noyield|ckptfs-nouring) "$CKPTFS" drain "$DIR" >> "$LOG" 2>&1 || failures=$((failures + 1)) ;; esac
      rm -f "$f"
      sync
      sleep "${BENCH_SETTLE:-6}"  # the quiet between checkpoints (bench.py SETTLE_SECONDS)
      if [ "$t" = ckptfs ]; then
        ck_proc seq "$r" steady_before_
        measure seq "$t" "$r" steady_ $BENCH seq-write "$DIR/seq2.bin" "$SIZE_BYTES" --pid "$CK_PID"
      else
        measure seq "$t" "$r" steady_ $BENCH seq-write "$DIR/seq2.bin" "$SIZE_BYTES"
      fi
      down "$t" "$tag"
    done
  done
}

phase_torch() {
  local r t tag after d
  for r in $(seq "$REPS"); do
    for t in $(order "$r"); do
      say "torch: $t, repetition $r of $REPS"
      tag=torch-$t-$r
      drop_caches
      up "$t" "$tag" || { failures=$((failures + 1)); down "$t" "$tag"; continue; }
      case $t in
        ckptfs|ckptfs-nopt|ckptfs-huge|ckptfs-noyield|ckptfs-nouring) after="$CKPTFS drain $DIR" ;;
        tmpfs) d=$WORK/cp-$tag; mkdir -p "$d"; after="cp -r {dir} $d/ && sync" ;;
        disk) after="sync" ;;
        rclone) after="" ;;
      esac
      sync
      # The trainer: saves, waits until durable (the --after command), exits.
      local poll=()
      [ "$t" = ckptfs ] && poll=(--poll-state)
      measure torch "$t" "$r" "" $BENCH torch-save "$DIR" "$TORCH_GIB" "$SHARDS" --after "$after" "${poll[@]}"
      [ "$t" = tmpfs ] && rm -rf "$d"
      # Trainer restart: a new process loads the checkpoint.
      measure torch "$t" "$r" "" $BENCH torch-load "$DIR" plain
      measure torch "$t" "$r" "" $BENCH torch-load "$DIR" mmap
      # The same load with the loader kept on one CPU: what the scheduler's
      # moving a caller between CPUs at each reply costs (docs/benchmarks.md).
      case $t in ckptfs|tmpfs) measure torch "$t" "$r" pinned_ $BENCH torch-load "$DIR" mmap --which sharded --pin ;; esac
      if [ "$t" = ckptfs ]; then
        ck_proc torch "$r" ""
        rec torch tier_bytes ckptfs "$r" "$(tier_bytes "$tag")" B
        rec torch data_bytes ckptfs "$r" "$(data_bytes "$DIR")" B
        # Daemon restart: umount + mount on the same state dir; the tier on
        # /dev/shm is re-attached. Each load gets its own restart (cold kernel cache).
        local mode
        for mode in plain mmap; do
          ck_umount "$tag" --keep-cache && ck_mount "$tag" || { failures=$((failures + 1)); break; }
          measure torch ckptfs "$r" restart_ $BENCH torch-load "$DIR" "$mode"
        done
      fi
      down "$t" "$tag"
    done
  done
}

# in_turn PHASE TAG CMD...: mounts every target (ckptfs, ckptfs with
# -o passthrough=off, tmpfs, a local disk directory) as TAG-TARGET, runs
# one long-lived `bench.py CMD... NAME=DIR...` that saves to them in turn,
# records its `NAME REP METRIC VALUE UNIT` lines under PHASE, unmounts.
in_turn() {
  local phase=$1 tag=$2 t name rep m v u
  shift 2
  local -a dirs=() tags=()
  for t in ckptfs ckptfs-nopt ckptfs-noyield ckptfs-nouring ckptfs-huge tmpfs disk; do
    case " $TARGETS " in *" ${t%-no*} "*) ;; *) continue ;; esac
    [ -z "${ONLY:-}" ] || case " $ONLY " in *" $t "*) ;; *) continue ;; esac
    up "$t" "$tag-$t" || { failures=$((failures + 1)); continue; }
    dirs+=("$t=$DIR")
    tags+=("$t")
  done
  # A group of only peers (no ckptfs target selected) measures nothing new.
  case " ${tags[*]} " in
    *" ckptfs"*) ;;
    *) [ -z "${ONLY:-}" ] || { for t in "${tags[@]}"; do down "$t" "$tag-$t"; done; return 0; } ;;
  esac
  say "$phase: ${tags[*]}, ${SHOWN_REPS:-$REPS} repetitions"
  while read -r name rep m v u; do
    [ -n "$u" ] || continue
    rec "$phase" "$m" "$name" "$rep" "$v" "$u"
  done < <(timeout 1800 $BENCH "$@" "${dirs[@]}" 2>>"$LOG" | awk 'NF == 5')
  for t in "${tags[@]}"; do down "$t" "$tag-$t"; done
}

# One long-lived trainer process (issue #15): its state built once, saved
# again and again to every target in turn, REPS times after a warm-up
# round, so every ratio compares saves of the same warm process in the
# same minute. In two groups, each its own process and phase: every ckptfs
# mount keeps its last save in RAM and as much again pre-allocated for the
# next, so the seven targets at once held ~25 GiB of this 24 GiB machine
# (five mounts × 4 GiB, tmpfs's and the disk's copy, the trainer's own
# 2 GiB) and every save ran under reclaim, the goal's target included (run
# 20261124-233301: tmpfs 2.9-5.9 s, ckptfs 3.8-5.1 s for the same save; alone
# beside tmpfs, ckptfs was faster 5 times of 5). A trainer's node has one
# mount. The goal's targets first (phase trainer), then the other ckptfs
# variants with tmpfs and the disk again (phase trainer-b), each group's
# ratios taken within it.
# TRAINER_ONLY="T..." runs the first group with these targets alone.
phase_trainer() {
  SHOWN_REPS=$TRAINER_REPS ONLY="${TRAINER_ONLY:-ckptfs ckptfs-nopt tmpfs disk}" \
    in_turn trainer trainer trainer "$TORCH_GIB" "$TRAINER_REPS"
  [ -z "${TRAINER_ONLY:-}" ] || return 0
  SHOWN_REPS=$TRAINER_REPS ONLY="ckptfs-noyield ckptfs-nouring ckptfs-huge tmpfs disk" \
    in_turn trainer-b trainer trainer "$TORCH_GIB" "$TRAINER_REPS"
}

# Every common trainer pattern (issue #29), each one long-lived process
# saving to ckptfs, tmpfs and the disk in turn (same-run ratios), PAT_GIB
# [1] of state, TRAINER_REPS repetitions after a warm-up round, a new
# process loading each save: keep-all (a new step directory each save,
# nothing removed; past the budget this is also "the budget near full"),
# keep2 (rotation, the last two kept), pressure (keep2, and 2 GiB of page
# cache and tmpfs written and removed by others between saves), full
# (keep-all in a budget of 2.5 saves: the tier evicts persisted saves to
# make room), ranks (8 processes saving RANKS_GIB [2] / 8 each at once, keep2), and first (the first save of a fresh mount: every target
# new for each repetition, no warm-up).
phase_patterns() {
  local g=${PAT_GIB:-1} pat r
  local only="ckptfs tmpfs disk"
  for pat in ${PATTERNS:-keep keep2 pressure full ranks first}; do
    case $pat in
      keep|keep2|pressure)
        SHOWN_REPS=$TRAINER_REPS ONLY=$only in_turn "pat-$pat" "pat-$pat" trainer "$g" "$TRAINER_REPS" \
          --pattern "$pat" --load ;;
      full)
        CACHE_SIZE=$(awk -v g="$g" 'BEGIN { printf "%dM", g * 1024 * 2.5 }') SHOWN_REPS=$TRAINER_REPS ONLY=$only \
          in_turn pat-full pat-full trainer "$g" "$TRAINER_REPS" --pattern keep --load ;;
      ranks)
        SHOWN_REPS=$TRAINER_REPS ONLY=$only in_turn pat-ranks pat-ranks trainer "${RANKS_GIB:-2}" "$TRAINER_REPS" \
          --pattern keep2 --ranks 8 ;;
      first)
        for r in $(seq "$TRAINER_REPS"); do
          SHOWN_REPS=1 ONLY=$only in_turn pat-first "pat-first-$r" trainer "$g" 1 --pattern keep2 --no-warmup \
            --rep-base "$r" --load
        done ;;
      *) say "unknown pattern $pat" ;;
    esac
  done
}

# A trainer's CPU-bound step while a SIZE file drains (issue #29): step
# time against the same step with the drain idle, and the daemon's CPU
# per GiB drained (bench.py steps-while-draining).
phase_interfere() {
  local r tag
  case " $TARGETS " in *" ckptfs "*) ;; *) return 0 ;; esac
  for r in $(seq "$REPS"); do
    say "interfere: repetition $r of $REPS"
    tag=interfere-$r
    drop_caches
    ck_mount "$tag" || { failures=$((failures + 1)); continue; }
    measure interfere ckptfs "$r" "" $BENCH steps-while-draining "$DIR" "$SIZE_BYTES" "$CK_PID"
    down ckptfs "$tag"
  done
}

# Small framework-shaped checkpoints (issue #15): a DCP directory of 96
# fsynced .distcp files written by 4 ranks at once plus .metadata, and an HF
# Trainer checkpoint-N directory (~10 files, temp + os.replace), saved by one
# long-lived process to every target in turn and read back by a new process.
phase_frameworks() { in_turn frameworks fw frameworks "$REPS" 4 24 "${FW_MIB:-2}"; }

phase_remount() {
  local r tag=remount t0
  case " $TARGETS " in *" ckptfs "*) ;; *) return 0 ;; esac
  say "remount: creating $FILES files of $FILE_BYTES bytes"
  ck_mount "$tag" || { failures=$((failures + 1)); return; }
  measure remount ckptfs 1 "" $BENCH mkfiles "$DIR/files" "$FILES" "$FILE_BYTES"
  t0=$(now)
  "$CKPTFS" drain "$DIR" >> "$LOG" 2>&1 || failures=$((failures + 1))
  rec remount drain_seconds ckptfs 1 "$(since "$t0")" s
  rec remount tier_files ckptfs 1 "$(find "$SHM-$tag" -type f | wc -l)" files
  for r in $(seq "$REPS"); do
    t0=$(now)
    ck_umount "$tag" --keep-cache || { failures=$((failures + 1)); break; }
    rec remount umount_seconds ckptfs "$r" "$(since "$t0")" s
    t0=$(now)
    ck_mount "$tag" || { failures=$((failures + 1)); break; }
    rec remount mount_seconds ckptfs "$r" "$(since "$t0")" s
    [ "$(find "$DIR/files" -type f | wc -l)" = "$FILES" ] || { say "remount: files missing after remount"; failures=$((failures + 1)); }
    # The peer: mounting an empty ckptfs, same options.
    t0=$(now)
    ck_mount "empty-$r" || { failures=$((failures + 1)); continue; }
    rec remount mount_seconds ckptfs-empty "$r" "$(since "$t0")" s
    ck_umount "empty-$r"
    rm_tier "${SHM:?}-empty-$r"
    rm -rf "${WORK:?}/empty-$r"
  done
  findmnt -n -M "$WORK/$tag/mnt" >/dev/null 2>&1 && ck_umount "$tag"
  rm_tier "${SHM:?}-$tag"
  rm -rf "${WORK:?}/$tag"
}

# fsync of a large file still open for writing (issue #10): ckptfs with
# --fsync memory and its drain paused (so the version the fsync seals stays
# pending and the next write must keep it aside), and tmpfs for reference.
phase_fsync() {
  local r t tag cs
  # Room for the file twice (the version kept aside and the live bytes:
  # nothing drains) and the write after the fsync.
  cs=$((FSYNC_BYTES * 2 / 1048576 + 256))M
  for r in $(seq "$REPS"); do
    for t in $(order "$r"); do
      case $t in ckptfs|tmpfs) ;; *) continue ;; esac
      say "fsync: $t, repetition $r of $REPS"
      tag=fsync-$t-$r
      drop_caches
      if [ "$t" = ckptfs ]; then
        touch "$WORK/pause-$tag"
        CKPTFS_DRAIN_PAUSE_FILE=$WORK/pause-$tag CACHE_SIZE=$cs ck_mount "$tag" --fsync memory \
          || { failures=$((failures + 1)); rm -rf "${WORK:?}/$tag" "$WORK/pause-$tag"; continue; }
      else
        up "$t" "$tag"
      fi
      measure fsync "$t" "$r" "" "$PY" "$REPO/tests/bench/fsync_latency.py" "$DIR" "$FSYNC_BYTES"
      if [ "$t" = ckptfs ]; then
        # Nothing to learn from draining it: leave without.
        rm -f "$WORK/pause-$tag"
        ck_umount "$tag" --no-drain
        rm_tier "${SHM:?}-$tag"
        rm -rf "${WORK:?}/$tag"
      else
        down "$t" "$tag"
      fi
    done
  done
}

phase_s3() {
  local s=$REPO/tests/bench/s3_drain.sh
  [ -f "$s" ] || { say "s3: tests/bench/s3_drain.sh not present, skipped"; return 0; }
  say "s3: running tests/bench/s3_drain.sh"
  local rc
  BENCH_CSV=$CSV BENCH_RUN=$RUN_ID BUILD=$BUILD SIZE=$S3_SIZE N=$REPS bash "$s" 2>&1 | tee "$S3_OUT" | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) ;;
    77) say "s3: skipped by s3_drain.sh" ;;
    *) say "s3_drain.sh failed (exit $rc)"; failures=$((failures + 1)) ;;
  esac
}

# ---------------------------------------------------------------- main
say "run $RUN_ID: SIZE=$SIZE FSYNC_SIZE=$FSYNC_SIZE TORCH_GIB=$TORCH_GIB SHARDS=$SHARDS FILES=$FILES REPS=$REPS CACHE_SIZE=$CACHE_SIZE"
say "targets: $TARGETS; phases: $PHASES; work dir $WORK; build $BUILD"
T_START=$(now)
rec meta loadavg_start all 0 "$(cut -d' ' -f1 /proc/loadavg)" load
rec meta size_bytes all 0 "$SIZE_BYTES" B
rec meta torch_gib all 0 "$TORCH_GIB" GiB
rec meta shards all 0 "$SHARDS" files
rec meta files all 0 "$FILES" files
rec meta file_bytes all 0 "$FILE_BYTES" B
rec meta fsync_size_bytes all 0 "$FSYNC_BYTES" B
rec meta reps all 0 "$REPS" reps
rec meta cache_size all 0 "$(numfmt --from=iec "$CACHE_SIZE")" B
rec meta cpu_busy_start all 0 "$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat)" ticks
for p in $PHASES; do
  case $p in
    trainer) phase_trainer ;;
    patterns) phase_patterns ;;
    interfere) phase_interfere ;;
    frameworks) phase_frameworks ;;
    seq) phase_seq ;;
    torch) phase_torch ;;
    remount) phase_remount ;;
    fsync) phase_fsync ;;
    s3) phase_s3 ;;
    *) say "unknown phase $p" ;;
  esac
done
rec meta loadavg_end all 0 "$(cut -d' ' -f1 /proc/loadavg)" load
rec meta cpu_busy_end all 0 "$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat)" ticks
rec meta wall_seconds all 0 "$(since "$T_START")" s
cp "$CSV" "$OUT/results.csv"
say "results: $CSV ($failures failures)"
if [ "$REPORT" = 1 ]; then
  "$PY" "$REPO/tests/bench/report.py" "$CSV" ${S3_OUT:+--s3-out "$S3_OUT"} --md "$REPO/docs/benchmarks.md" --png "$REPO/docs/benchmarks.png" \
    ${BENCH_NOTE:+--note "$BENCH_NOTE"} || failures=$((failures + 1))
fi
[ "$failures" = 0 ]
