# shellcheck shell=bash
# common.sh — sourced by every mounted case (tests/mount/cases/*.sh), like
# libfuse's test/cases/lib: a private directory, mount/unmount helpers, an
# EXIT trap that leaves nothing mounted or running, assertions, and a scan
# of the daemon log for warnings and errors.
#
# A case exits 0 on success, 77 to be skipped (no /dev/fuse, not root, ...),
# anything else on failure. tests/run_all.sh runs them; each also runs alone:
#     tests/mount/cases/rename.sh        (BUILD=build-address to pick a build)
#
# What a case gets:
#   $T        private temp dir (reference files go here); mode 0755
#   $MNT      $T/mnt, the mount point      $BACKEND  $T/backend
#   $STATE    $T/state (log: $STATE/ckptfs.log)
#   $TIER     /dev/shm/ckptfs-test-<unique>, removed at exit (and $TIER-*);
#             as root a tmpfs of its own is mounted there (--tier-huge):
#             remove it with rm_tier, never rm -rf alone
#   $CKPTFS   the binary    $PY  /usr/bin/python3    $CASE  the case name
#   at_exit CMD       run CMD (eval'd) first thing in the EXIT trap
#   mount_fs [ARGS]   mount $MNT (defaults: --cache-size 2G, --state-dir
#                     $STATE, --tier-dir $TIER; an ARG given overrides)
#   umount_fs         `ckptfs umount`, then wait for the daemon to exit
#   remount_fs [ARGS] umount_fs + mount_fs with the same ARGS as before
#   check_log [--allow-errors RE] [--allow-warnings RE]
#   fail MSG, skip MSG, require_root, same_bytes A B, expect_eq WANT GOT MSG
#   expect_errno ERRNO OP ARGS...  (OP from lib/fsop.py; `--as UID:GID` first
#   expect_ok OP ARGS...            to act as another user), fsop OP ARGS...
#   as_nobody CMD...  run CMD as uid/gid 65534
#   drop_caches       drop the kernel's page/dentry/inode caches (root)
#   size_of F, used_bytes, df_size_bytes, state_of F, check_state F
#   check_backend     `ckptfs drain`, then diff -r the mount and the backend
#                     and compare their modes, owners and file mtimes
#
# Environment: BUILD (default build), KEEP=1 keeps $T on failure,
# DUMP_GDB=1 adds the daemon's user-space stacks (gdb) to what dump_stuck
# prints when a command did not answer,
# CKPTFS_TEST_ROOT (set by run_all.sh) is where $T is created (and $TIER is
# written to CKPTFS_TEST_ROOT/tiers, for run_all.sh's check that nothing of
# the case is left once it has ended). With a sanitizer build
# (BUILD=build-thread, BUILD=build-address) a case fails if any of its
# processes reported a race, a memory error or undefined behaviour
# (TSAN_OPTIONS, ASAN_OPTIONS and UBSAN_OPTIONS log_path: $T/san/r.PID).
#
# Running side by side: run_all.sh runs cases JOBS (2) at a time, so a case
# keeps to its own $T, $TIER, state dir, s3rver (port 0: a free one) and
# daemon. A case that cannot share the machine says why in a line
#     # serial: REASON
# in its header comment, and then runs with no other case beside it. Mark
# a case serial when it changes something global (a sysctl or other
# /proc/sys setting, /sbin/mount.ckptfs, a fixed user from useradd, bdi
# settings in sysfs), needs a fixed port that another case could take, or
# measures time or memory (a deadline in seconds, "writers still wait after
# 3 s", throughput, a budget filled many times over, kill -9 at random
# moments). drop_caches alone is no reason: it only evicts clean caches,
# which costs another case time but never changes what it reads, and the
# cases that measure time are serial anyway. Deadlines that only guard
# against a hang (timeout 120, drain --timeout) are no reason either.

set -euo pipefail
export LC_ALL=C TZ=UTC

CASE=$(basename "$0" .sh)
LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$LIB/../../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
CKPTFS=$BUILD/ckptfs
PY=/usr/bin/python3
FSOP="$PY $LIB/fsop.py"

skip() { echo "SKIP: $CASE: $*" >&2; exit 77; }
fail() { echo "FAIL: $CASE: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

[ -e /dev/fuse ] || skip "no /dev/fuse"
( exec 9<>/dev/fuse ) 2>/dev/null || skip "cannot open /dev/fuse"
command -v fusermount3 >/dev/null || skip "no fusermount3"
[ -x "$PY" ] || skip "no $PY"
[ -x "$CKPTFS" ] || fail "no $CKPTFS: run make"

require_root() { [ "$(id -u)" = 0 ] || skip "needs root"; }
# make_memory_cgroup BYTES: a memory cgroup of that limit (v1 or v2; SKIP
# where none can be made), removed at exit with everything in it moved
# back. CG: its dir; CG_USAGE: its usage file. enter_memory_cgroup: this
# shell (and what it starts from then on) into it.
make_memory_cgroup() {
  if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
    CG=/sys/fs/cgroup/memory/ckptfs-test-$$
    mkdir "$CG" 2> /dev/null || skip "cannot make a memory cgroup under /sys/fs/cgroup/memory"
    echo "$1" > "$CG/memory.limit_in_bytes" || skip "cannot set memory.limit_in_bytes"
    CG_USAGE=$CG/memory.usage_in_bytes
    _CG_BACK=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2> /dev/null; then
    CG=/sys/fs/cgroup/ckptfs-test-$$
    mkdir "$CG" 2> /dev/null || skip "cannot make a cgroup under /sys/fs/cgroup"
    echo "$1" > "$CG/memory.max" 2> /dev/null || skip "the memory controller is not enabled for new cgroups"
    CG_USAGE=$CG/memory.current
    _CG_BACK=/sys/fs/cgroup$(awk -F: '$1 == 0 {print $3}' /proc/self/cgroup)
  else
    skip "no memory cgroup controller"
  fi
  at_exit _leave_memory_cgroup
}
enter_memory_cgroup() { echo $$ > "$CG/cgroup.procs"; }
_leave_memory_cgroup() {
  echo $$ > "$_CG_BACK/cgroup.procs" 2> /dev/null || true
  for p in $(cat "$CG/cgroup.procs" 2> /dev/null); do echo "$p" > "$_CG_BACK/cgroup.procs" 2> /dev/null || true; done
  rmdir "$CG" 2> /dev/null || true
}

_base=${CKPTFS_TEST_ROOT:-${TMPDIR:-/tmp}}
mkdir -p "$_base"
T=$(mktemp -d "$_base/ckptfs-$CASE.XXXXXX")
chmod 755 "$T"   # other uids must reach $MNT in the permission cases
MNT=$T/mnt
BACKEND=$T/backend
STATE=$T/state
TIER=/dev/shm/ckptfs-test-$$-$(basename "$T")
mkdir -p "$MNT" "$BACKEND"
# run_all.sh checks, once the case has ended, that none of its tier dirs
# ($TIER, $TIER-*) is left: $T is gone by then, so the name is kept beside it.
[ -z "${CKPTFS_TEST_ROOT:-}" ] || echo "$TIER" >> "$CKPTFS_TEST_ROOT/tiers"

# A sanitizer build (BUILD=build-thread: TSan; BUILD=build-address: ASan
# and UBSan) writes its reports to $T/san/r.PID instead of stderr, which a
# daemon has pointed at /dev/null: _cleanup fails the case if any are
# there. UBSan beside ASan ignores log_path and writes to stderr, so the
# daemons keep theirs in $T/san/stderr.PID (CKPTFS_DAEMON_STDERR, a test
# knob of fs/daemon.cc), scanned alike. Mode 1777: the cases run ckptfs as
# other users too. Other builds ignore the *SAN_OPTIONS. The defaults match
# tests/run_all.sh's, for a case run alone.
mkdir -m 1777 "$T/san"
export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan.supp ${TSAN_OPTIONS:-} log_path=$T/san/r"
export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-} log_path=$T/san/r"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-} log_path=$T/san/r"
export CKPTFS_DAEMON_STDERR=$T/san/stderr

_MOUNT_ARGS=()        # the extra ARGS of the last mount_fs (for remount_fs)
_STATE_DIRS=()        # every state dir used (check_log scans all their logs)
_TIER_DIRS=("$TIER")  # every tier dir used (removed at exit)

# Processes whose command line names a path under $T: the daemons this
# case started (and nothing else), by pid.
_our_daemons() {
  # One grep over every cmdline (NUL-separated args, so match "mount" then
  # a path under $T as separate args); forking per process is far slower.
  # grep exits 2 when a process ends between the glob and its read (often,
  # with other cases running): under pipefail that failed the whole case.
  { grep -lasz -- "$T/" /proc/[0-9]*/cmdline 2>/dev/null || true; } | while IFS= read -r f; do
    local cmd
    { cmd=$(tr '\0' ' ' < "$f"); } 2>/dev/null || continue
    case $cmd in
      *ckptfs*" mount "*"$T/"*) f=${f#/proc/}; echo "${f%/cmdline}" ;;
    esac
  done
}

# Mount points under $T, deepest first.
_our_mounts() {
  awk -v t="$T/" 'index($2, t) == 1 { print $2 }' /proc/mounts | sort -r
}

_AT_EXIT=()           # commands at_exit registered, run first by _cleanup

# Runs CMD (a string, eval'd) at exit, before the unmounts, in reverse order.
at_exit() { _AT_EXIT=("$1" "${_AT_EXIT[@]}"); }

# Fails (returns 1) if a sanitizer report (san_report.sh) is in $T/san
# (report files, daemons' stderr): prints the first report, then the
# summary line of each.
source "$LIB/san_report.sh"
_check_san() {
  local reports
  reports=$(san_files "$T"/san/*) || return 0
  echo "FAIL: $CASE: sanitizer reports (KEEP=1 keeps them in $T/san):" >&2
  # shellcheck disable=SC2086  # one file name per line, none with spaces
  san_show $reports >&2
  return 1
}

_cleanup() {
  local rc=$? m p c
  trap - EXIT INT TERM
  set +e
  for c in "${_AT_EXIT[@]}"; do eval "$c"; done
  for m in $(_our_mounts); do
    fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  for p in $(_our_daemons); do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do [ -z "$(_our_daemons)" ] && break; sleep 0.1; done
  for p in $(_our_daemons); do kill -9 "$p" 2>/dev/null; done
  if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
    local s
    for s in "${_STATE_DIRS[@]}"; do
      [ -f "$s/ckptfs.log" ] || continue
      echo "--- last lines of $s/ckptfs.log" >&2
      tail -n 15 "$s/ckptfs.log" >&2
    done
  fi
  _check_san || rc=1
  for p in "${_TIER_DIRS[@]}"; do
    case $p in /dev/shm/ckptfs-test-?*|"$T"/?*) rm_tier "$p" "$p"-* ;; esac
  done
  if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ -n "${KEEP:-}" ]; then
    echo "kept $T" >&2
  else
    rm -rf "$T"
  fi
  exit "$rc"
}
trap _cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# True when ARGS (after the first) contain the option named first.
_has_opt() {
  local o=$1 a
  shift
  for a in "$@"; do [ "$a" = "$o" ] && return 0; done
  return 1
}

# True when $1 equals one of the remaining args.
_has_item() {
  local x=$1 a
  shift
  for a in "$@"; do [ "$a" = "$x" ] && return 0; done
  return 1
}

# The value of option $1 in the remaining args, or nothing.
_opt_val() {
  local o=$1
  shift
  while [ $# -gt 0 ]; do
    if [ "$1" = "$o" ] && [ $# -gt 1 ]; then echo "$2"; return; fi
    shift
  done
}

is_mounted() { findmnt -n -M "${1:-$MNT}" >/dev/null 2>&1; }
# True when $1 (absolute, no spaces) is a mount point in the mount table;
# unlike findmnt, it never stats $1, so it answers for a dead mount too.
_in_mount_table() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

# rm_tier DIR...: removes tier directories as a reboot would, the tmpfs
# of their own (--tier-huge, the default as root) included.
rm_tier() {
  local p
  for p in "$@"; do
    if findmnt -n -M "$p" >/dev/null 2>&1; then umount -l "$p" 2>/dev/null || true; fi
    rm -rf "$p"
  done
}

# Installs mount-helpers/mount.ckptfs as /sbin/mount.ckptfs for this case
# (what was there is put back at exit) and points it at the binary under
# test, for the `mount -t fuse.ckptfs` cases.
install_mount_helper() {
  local helper=/sbin/mount.ckptfs
  if [ -e "$helper" ] || [ -L "$helper" ]; then cp -a "$helper" "$T/mount.ckptfs.saved"; fi
  _restore_mount_helper() {
    if [ -e "$T/mount.ckptfs.saved" ] || [ -L "$T/mount.ckptfs.saved" ]; then
      cp -a "$T/mount.ckptfs.saved" /sbin/mount.ckptfs
    else
      rm -f /sbin/mount.ckptfs
    fi
  }
  at_exit _restore_mount_helper
  install -m 0755 "$ROOT/mount-helpers/mount.ckptfs" "$helper"
  export CKPTFS_BIN=$CKPTFS
}

mount_fs() {
  local args=("$@") st td
  _MOUNT_ARGS=("$@")
  _has_opt --cache-size "$@" || args+=(--cache-size 2G)
  _has_opt --state-dir "$@" || args+=(--state-dir "$STATE")
  _has_opt --tier-dir "$@" || args+=(--tier-dir "$TIER")
  _has_opt --backend "$@" || args+=(--backend "$BACKEND")
  st=$(_opt_val --state-dir "${args[@]}")
  td=$(_opt_val --tier-dir "${args[@]}")
  _has_item "$st" "${_STATE_DIRS[@]}" || _STATE_DIRS+=("$st")
  _has_item "$td" "${_TIER_DIRS[@]}" || _TIER_DIRS+=("$td")
  if ! "$CKPTFS" mount "$MNT" "${args[@]}" > "$T/mount.out" 2>&1; then
    cat "$T/mount.out" >&2
    fail "ckptfs mount $MNT ${args[*]} failed"
  fi
  [ "$(findmnt -n -o FSTYPE -M "$MNT")" = fuse.ckptfs ] || fail "ckptfs mount returned 0 but $MNT is not a ckptfs mount"
  stat "$MNT" >/dev/null || fail "mount point not usable right after mount"
}

# FUSE over io_uring starts right after the kernel's INIT, a moment after the
# mount is usable (over /dev/fuse until then; status says "starting"):
# cases that check which way requests come wait for it.
wait_uring() {
  for _ in $(seq 200); do
    "$CKPTFS" status "${1:-$MNT}" | grep -q "^requests   through /dev/fuse (io_uring starting" || return 0
    sleep 0.1
  done
  fail "FUSE over io_uring still starting 20 s after the mount"
}

# Several mounts over one backend (cluster cases), each a "node" NAME with
# its own mount point $T/NAME/mnt, state dir $T/NAME/state and tier dir
# $TIER-NAME (removed at exit with $TIER):
#   mount_node NAME [VAR=VALUE...] [-- ARGS]  mount it (--backend $BACKEND,
#                      --cache-size 1G unless ARGS say); VAR=VALUE go to the
#                      daemon's environment (test knobs)
#   node_mnt NAME      its mount point        node_state NAME  its state dir
#   umount_node NAME   `ckptfs umount`, then wait for its daemon to exit
#   kill_node NAME     kill -9 its daemon and wait until it is gone; its dead
#                      mount stays (ENOTCONN, as after a crash) until
#                      mount_node NAME, whose `ckptfs mount` detaches it
# start_etcd [MEMBERS]: a private etcd (tests/etcd/etcd.sh) of MEMBERS (1)
# members under $T/etcd, stopped at exit; sets ETCD_EPS (HOST:PORT,...).
# Skips the case when etcd is not installed.
start_etcd() {
  local rc=0
  ETCD_EPS=$("$ROOT/tests/etcd/etcd.sh" start "$T/etcd" "${1:-1}") || rc=$?
  [ "$rc" = 77 ] && skip "etcd is not installed"
  [ "$rc" = 0 ] || fail "etcd did not start"
  at_exit "\"$ROOT/tests/etcd/etcd.sh\" stop \"$T/etcd\""
}
# wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds (tried every
# 0.1 s), else fail with WHAT.
wait_for() {
  local n=$(($1 * 10)) what=$2
  shift 2
  for _ in $(seq "$n"); do "$@" 2> /dev/null && return 0; sleep 0.1; done
  fail "$what"
}
# make_secret FILE: a --cluster-secret file (48 random bytes, base64, 0600).
make_secret() {
  head -c 48 /dev/urandom | base64 > "$1"
  chmod 600 "$1"
}

# The replica cases' job (issue #30): a 1-member etcd, a 0600 secret, COMMON
# (the cluster and replica options), and nodes a, b and c mounted with
# them — a's drain held while $T/pause_a exists, its lease (--member-timeout)
# $1 s, b's and c's $2 s (default 2) — then waits until a sees both links.
# Sets SECRET, COMMON, A and B.
replica_job() {
  replica_store
  touch "$T/pause_a"
  mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout "$1" --node a
  mount_node b -- "${COMMON[@]}" --member-timeout "${2:-2}" --node b
  mount_node c -- "${COMMON[@]}" --member-timeout "${2:-2}" --node c
  A=$(node_mnt a) B=$(node_mnt b)
  wait_for 20 "a does not see b's and c's replica links" repl_of "$A" 'assert j["peers"] == 2, j'
}
# replica_store: etcd and a secret for a --replicas 1 job; COMMON, the
# options every node of it mounts with.
replica_store() {
  start_etcd 1
  SECRET=$T/secret
  make_secret "$SECRET"
  COMMON=(--cluster job --cluster-store "etcd://$ETCD_EPS" --replicas 1
    --replica-listen 127.0.0.1:0 --cluster-secret "$SECRET")
}
# replica_writer_back NODE FILE GONE ARGS...: NODE mounted again on its
# state dir with ARGS, its drain let go; once drained, the backend holds
# $T/data at FILE and nothing at GONE (a directory a later entry moved:
# the writer's replay must not bring it back).
replica_writer_back() {
  local n=$1 file=$2 gone=$3 tree
  shift 3
  rm -f "$T/pause_$n"
  mount_node "$n" -- "$@"
  "$CKPTFS" drain "$(node_mnt "$n")" --timeout 40 > /dev/null || fail "$n's drain does not empty after it came back"
  tree=$(cd "$BACKEND" && find . -not -path './.ckptfs*' | sort | tr '\n' ' ')
  cmp "$T/data" "$BACKEND/$file" || fail "$file is not $n's file: $tree"
  [ ! -e "$BACKEND/$gone" ] || fail "$gone came back with $n: $tree"
}
# given_up_in_etcd WRITER: how many holders' give-ups of WRITER's entries
# etcd names (gaveup/WRITER/; a done mark's "+" beside it is not one).
given_up_in_etcd() {
  ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EPS" get --prefix "/ckptfs/job/gaveup/$1/" -w json |
    $PY -c 'import base64,json,sys; print(sum(base64.b64decode(k["value"]) != b"+" for k in json.load(sys.stdin).get("kvs", [])))'
}
# repl_of MOUNT PYTHON: runs PYTHON with j the status's cluster.replicas.
repl_of() { "$CKPTFS" status "$1" --json | $PY -c "import json,sys; j=json.load(sys.stdin)['cluster']['replicas']; $2"; }
node_mnt() { echo "$T/$1/mnt"; }
node_state() { echo "$T/$1/state"; }
_node_pid() { _our_daemons | while read -r p; do
  tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- " $T/$1/mnt " && echo "$p"; done; true; }
mount_node() {
  local name=$1 envs=() args=() m st td
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  args=("$@")
  m=$(node_mnt "$name"); st=$(node_state "$name"); td=$TIER-$name
  # A killed node's dead mount answers ENOTCONN to mkdir's stat: leave it
  # to `ckptfs mount`, which detaches it.
  _in_mount_table "$m" || mkdir -p "$m"
  _has_opt --cache-size "$@" || args+=(--cache-size 1G)
  _has_opt --backend "$@" || args+=(--backend "$BACKEND")
  _has_item "$st" "${_STATE_DIRS[@]}" || _STATE_DIRS+=("$st")
  if ! env "${envs[@]}" "$CKPTFS" mount "$m" --state-dir "$st" --tier-dir "$td" "${args[@]}" \
      > "$T/mount-$name.out" 2>&1; then
    cat "$T/mount-$name.out" >&2
    fail "ckptfs mount $m ${args[*]} failed"
  fi
  [ "$(findmnt -n -o FSTYPE -M "$m")" = fuse.ckptfs ] || fail "node $name: $m is not a ckptfs mount"
}
umount_node() {
  local m pid _i
  m=$(node_mnt "$1")
  pid=$(_node_pid "$1")
  "$CKPTFS" umount "$m" > "$T/umount-$1.out" 2>&1 || { cat "$T/umount-$1.out" >&2; fail "ckptfs umount $m failed"; }
  for _i in $(seq 600); do
    [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "node $1: daemon $pid still running 60 s after umount"
}
kill_node() {
  local pid
  pid=$(_node_pid "$1")
  [ -n "$pid" ] || fail "node $1: no daemon to kill"
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  # Not detached here: processes of the case may still use the mount point
  # (a job's rank on this node). Detached, it is a plain directory again and
  # they write into it: multinode_jobs' rank 2, started after the detach on a
  # busy machine, wrote global_step5/ there and the remount of node c was
  # refused ("mount point ... is not empty"). Dead, it answers ENOTCONN, as
  # a node that crashed does; `ckptfs mount` detaches it itself (and the
  # EXIT trap if the case never mounts it again).
}

# Waits until no daemon of this case runs (the log is complete then).
wait_daemon_exit() {
  local _i
  for _i in $(seq 600); do
    [ -z "$(_our_daemons)" ] && return 0
    sleep 0.1
  done
  fail "daemon still running 60 s after umount: $(_our_daemons)"
}

# crash_daemon [PID...]: kill -9 this case's daemon, then kill (SIGTERM)
# and reap the PIDs given (processes holding files open on the mount),
# detach the dead mount and wait until no daemon of the case runs. Sets
# CRASH_LOG_LINES: the log's length at the kill (what follows is recovery).
crash_daemon() {
  local pid p
  pid=$(_our_daemons | head -1)
  [ -n "$pid" ] || fail "no daemon to kill"
  CRASH_LOG_LINES=$(wc -l < "$STATE/ckptfs.log")
  kill -9 "$pid"
  for p in "$@"; do
    kill "$p" 2> /dev/null || true
    wait "$p" 2> /dev/null || true
  done
  fusermount3 -uz "$MNT" 2> /dev/null || true
  wait_daemon_exit
}

# umount_fs [--keep-cache]: ckptfs umount (which gives the tier back once
# everything is persisted, unless --keep-cache), then waits for the daemon.
umount_fs() {
  is_mounted || fail "umount_fs: $MNT is not mounted"
  stat "$MNT" >/dev/null 2>&1 || fail "mount is dead before umount (daemon crashed?): $(stat "$MNT" 2>&1)"
  if ! "$CKPTFS" umount "$MNT" "$@" > "$T/umount.out" 2>&1; then
    cat "$T/umount.out" >&2
    fail "ckptfs umount $MNT failed"
  fi
  ! is_mounted || fail "$MNT still mounted after ckptfs umount"
  wait_daemon_exit
}

remount_fs() {
  local prev=("${_MOUNT_ARGS[@]}")
  umount_fs
  if [ $# -gt 0 ]; then mount_fs "$@"; else mount_fs "${prev[@]}"; fi
}

# Fails the case if any daemon log of this case has C or E lines (except
# those matching --allow-errors RE) or W lines (except --allow-warnings RE).
check_log() {
  local allow_e="" allow_w="" s log bad=""
  while [ $# -gt 0 ]; do
    case $1 in
      --allow-errors) allow_e=$2; shift 2 ;;
      --allow-warnings) allow_w=$2; shift 2 ;;
      *) fail "check_log: unknown argument $1" ;;
    esac
  done
  for s in "${_STATE_DIRS[@]}"; do
    log=$s/ckptfs.log
    [ -f "$log" ] || fail "no daemon log at $log"
    bad+=$(awk -v ae="$allow_e" -v aw="$allow_w" '
      $2 == "C" { print; next }
      $2 == "E" { if (ae == "" || $0 !~ ae) print; next }
      $2 == "W" { if (aw == "" || $0 !~ aw) print; next }' "$log")$'\n'
  done
  bad=$(printf '%s' "$bad" | sed '/^$/d')
  [ -z "$bad" ] || fail "daemon log has warnings or errors:
$bad"
}

# staged_left BACKEND: what is staged in BACKEND/.ckptfs-tmp, one name a
# line (not the daemons' lock files, lk-*: backend/posix_backend.cc).
staged_left() {
  ls -A "$1/.ckptfs-tmp" 2>/dev/null | grep -v '^lk-' || true
}

same_bytes() {
  cmp "$1" "$2" || fail "$2 differs from $1"
}

expect_eq() {
  [ "$1" = "$2" ] || fail "$3: expected '$1', got '$2'"
}

fsop() { $FSOP "$@"; }

expect_errno() {
  local want=$1 got
  shift
  got=$($FSOP "$@") || fail "fsop.py $* broke"
  [ "$got" = "$want" ] || fail "$*: expected $want, got $got"
}

expect_ok() {
  local got
  got=$($FSOP "$@") || fail "fsop.py $* broke"
  case $got in OK*) ;; *) fail "$*: expected success, got $got" ;; esac
}

# expect_mount_refused PATTERN MNT ARGS...: `ckptfs mount MNT ARGS` fails
# with one line on stderr matching PATTERN and leaves nothing mounted.
expect_mount_refused() {
  local pat=$1 mnt=$2 rc=0
  shift 2
  "$CKPTFS" mount "$mnt" "$@" > "$T/refused.out" 2> "$T/refused.err" < /dev/null || rc=$?
  [ "$rc" != 0 ] || fail "mount $mnt $* succeeded"
  [ "$(wc -l < "$T/refused.err")" = 1 ] || fail "mount $*: want one line on stderr: $(cat "$T/refused.err")"
  grep -Eq -- "$pat" "$T/refused.err" || fail "mount $*: stderr does not name /$pat/: $(cat "$T/refused.err")"
  ! is_mounted "$mnt" || fail "mount $*: left $mnt mounted"
  note "ok: $(cat "$T/refused.err")"
}

# alive PID...: how many of the processes still run.
alive() {
  local n=0 p
  for p; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
  echo "$n"
}

# answers_within SECONDS CMD...: runs CMD (output discarded); false if it
# fails or is still running after SECONDS, and then $STUCK_PID is its pid,
# left running for dump_stuck (which ends it).
answers_within() {
  local limit=$1 end
  shift
  "$@" > /dev/null 2>&1 &
  STUCK_PID=$!
  # Polled. It used to be `wait -n` over the command and a `sleep LIMIT`:
  # a command that ended before `wait -n` began was reported only when the
  # sleeper ended, so an answer in milliseconds read as one at the limit
  # (under TSan with stress-ng beside: "took 10.02 s" with a 10 s limit,
  # then 2.02 s with a 2 s one).
  end=$(awk -v l="$limit" -v n="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (n + l) * 1000000 }')
  while kill -0 "$STUCK_PID" 2> /dev/null; do
    [ "${EPOCHREALTIME/./}" -lt "$end" ] || return 1
    sleep 0.02
  done
  wait "$STUCK_PID"
}

# dump_stuck WHAT: where a command that did not answer ($STUCK_PID) and
# every thread of this case's daemon wait (kernel stacks, scheduling
# policy), and the FUSE connection's count of requests waiting; then ends
# the command. On stderr, so that the case's log shows it.
dump_stuck() {
  local d tid f
  {
    echo "--- '$1' did not answer; where it and the daemon wait"
    if kill -0 "${STUCK_PID:-0}" 2> /dev/null; then
      for tid in /proc/"$STUCK_PID"/task/*; do
        echo "command $(cat "$tid/comm" 2> /dev/null) ${tid##*/}:"
        sed 's/^/    /' "$tid/stack" 2> /dev/null || true
      done
      pkill -P "$STUCK_PID" 2> /dev/null || true
    fi
    for f in /sys/fs/fuse/connections/*/waiting; do
      [ -e "$f" ] && echo "fuse connection ${f%/waiting}: $(cat "$f") requests waiting"
    done
    for d in $(_our_daemons); do
      for tid in /proc/"$d"/task/*; do
        # policy: 0 SCHED_OTHER, 5 SCHED_IDLE; the top of the kernel stack
        echo "daemon thread $(cat "$tid/comm" 2> /dev/null) ${tid##*/} policy $(awk '{print $41}' "$tid/stat" 2> /dev/null) state $(awk '{print $3}' "$tid/stat" 2> /dev/null):" \
          "$(head -n 3 "$tid/stack" 2> /dev/null | sed 's/.*\] //' | tr '\n' ' ')"
      done
    done
    if [ -n "${DUMP_GDB:-}" ]; then
      for d in $(_our_daemons); do gdb -p "$d" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^Thread|^#" ; done
    fi
    echo "--- end"
  } >&2
  kill -9 "${STUCK_PID:-0}" 2> /dev/null || true
  wait "${STUCK_PID:-0}" 2> /dev/null || true
}

# expect_answers SECONDS WHAT [PREFIX...]: stat, ls -l and `ckptfs status`
# of $MNT each answer within SECONDS (while WHAT keeps requests waiting in
# the daemon); each run under PREFIX if given (e.g. `taskset -c 0`).
expect_answers() {
  local limit=$1 what=$2 cmd t0 dt
  shift 2
  for cmd in "stat $MNT" "ls -l $MNT" "$CKPTFS status $MNT"; do
    t0=$(date +%s.%N)
    if ! answers_within 10 "$@" $cmd; then
      dump_stuck "$cmd"
      fail "'$cmd' did not answer while $what"
    fi
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d < l) }' || fail "'$cmd' took $dt s while $what"
    note "'${cmd%% *} ...' answered in $dt s while $what"
  done
}

as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }

drop_caches() {
  [ -w /proc/sys/vm/drop_caches ] || { note "cannot drop caches"; return 0; }
  echo 3 > /proc/sys/vm/drop_caches
}

size_of() { stat -c %s "$1"; }
df_size_bytes() { df -B1 --output=size "$MNT" | tail -n 1 | tr -d ' '; }
used_bytes() { df -B1 --output=used "$MNT" | tail -n 1 | tr -d ' '; }
state_of() { getfattr --only-values --absolute-names -n user.ckptfs.state "$1"; }

# Fails unless the state xattr of $1 is one of the four documented values.
check_state() {
  local s
  s=$(state_of "$1") || fail "getfattr user.ckptfs.state $1 failed"
  case $s in dirty|draining|persisted|remote) ;; *) fail "$1: state '$s'" ;; esac
}

# Waits for the drain (`ckptfs drain`), then compares the backend tree with
# the mount (the staging dir aside): names and bytes (diff -r), then what
# docs/consistency.md promises about metadata (lib/tree_meta.py): the mode
# of files and dirs, file mtimes to the ns, and, the daemon running as
# root, every entry's uid and gid.
check_backend() {
  local owners=()
  "$CKPTFS" drain "$MNT" --timeout "${1:-120}" > "$T/drain.out" 2>&1 \
    || { cat "$T/drain.out" >&2; fail "ckptfs drain failed"; }
  diff -r --no-dereference --exclude=.ckptfs-tmp "$MNT" "$BACKEND" > "$T/diff.out" 2>&1 \
    || { head -n 20 "$T/diff.out" >&2; fail "backend differs from the mount after the drain"; }
  # The daemons of a case run as the case's user: owners are kept as root.
  [ "$(id -u)" = 0 ] && owners=(--owners)
  $PY "$LIB/tree_meta.py" "$MNT" "$BACKEND" "${owners[@]}" > "$T/meta.out" 2>&1 \
    || { head -n 31 "$T/meta.out" >&2; fail "backend metadata differs from the mount after the drain"; }
}
