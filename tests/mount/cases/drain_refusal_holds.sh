#!/usr/bin/env bash
# Truth under failure (DESIGN.md guarantee 12; issue #27's first report):
# a file the backend refuses for good (a directory in the way of its name)
# holds the drain. fsync with --fsync backend says EIO for it and for a
# `latest` written after it, `ckptfs drain` and `ckptfs umount` exit
# non-zero naming it, the backend never gets `latest` without the shard,
# and the state xattr and status say `held`. Then the three ways out:
# the operator fixes the backend (the retry publishes both, in order),
# `ckptfs skip` (recorded as failed: drain names it until `lost --clear`;
# the checkpoint is never reported persisted), and -o on_refusal=skip.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

# write_fsync FILE TEXT WANT: writes TEXT, fsyncs, and checks the fsync's
# outcome (WANT: ok or EIO).
write_fsync() {
  $PY - "$@" <<'EOF'
import errno, os, sys
path, text, want = sys.argv[1:4]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, text.encode())
try:
    os.fsync(fd)
    got = "ok"
except OSError as e:
    got = errno.errorcode.get(e.errno, str(e.errno))
os.close(fd)
if got != want:
    sys.exit(f"fsync {path}: {got}, want {want}")
EOF
}
status_json() { "$CKPTFS" status "$MNT" --json; }
held_path() { status_json | $PY -c 'import json,sys; h=json.load(sys.stdin)["drain"]["held"]; print(h["path"] if h else "")'; }

mount_fs --fsync backend --shared-ttl 0
mkdir -p "$BACKEND/step1/shard0.pt"  # something in the way of the shard's name
mkdir "$MNT/step1"
write_fsync "$MNT/step1/shard0.pt" "shard of step 1" EIO
write_fsync "$MNT/latest" step1 EIO  # everything before it is covered: the shard is refused
expect_eq held "$(state_of "$MNT/step1/shard0.pt")" "state of the refused shard"
expect_eq step1/shard0.pt "$(held_path)" "status names the held file"
"$CKPTFS" status "$MNT" > "$T/status.txt"
grep -q "^held .*step1/shard0.pt.*ckptfs skip" "$T/status.txt" || fail "status does not say the drain holds: $(cat "$T/status.txt")"
if "$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain.err"; then fail "drain exited 0 with a refused shard"; fi
grep -q "holds at step1/shard0.pt" "$T/drain.err" || fail "drain did not name the held file: $(cat "$T/drain.err")"
if "$CKPTFS" umount "$MNT" 2> "$T/umount.err"; then fail "umount exited 0 with a refused shard"; fi
is_mounted || fail "umount unmounted with a refused shard"
[ ! -e "$BACKEND/latest" ] || fail "latest reached the backend before the shard"
[ -e "$MNT/latest" ] && [ "$(cat "$MNT/step1/shard0.pt")" = "shard of step 1" ] || fail "held files not readable"

# 1. The operator fixes the backend: `ckptfs drain` retries at once and
# both land, the shard first.
rmdir "$BACKEND/step1/shard0.pt"
"$CKPTFS" drain "$MNT" --timeout 60 || fail "drain after the fix"
expect_eq "shard of step 1" "$(cat "$BACKEND/step1/shard0.pt")" "shard in backend"
expect_eq step1 "$(cat "$BACKEND/latest")" "latest in backend"
expect_eq persisted "$(state_of "$MNT/step1/shard0.pt")" "state after the fix"
expect_eq "" "$(held_path)" "nothing held after the fix"
write_fsync "$MNT/step1/extra.pt" "fsync answers again" ok

# 2. The operator gives the file up: recorded as failed, named by every
# drain until cleared; `latest --persisted` never names its checkpoint.
mkdir -p "$BACKEND/step_2/shard0.pt"
mkdir "$MNT/step_2"
echo "shard of step 2" > "$MNT/step_2/shard0.pt"
echo step_2 > "$MNT/latest"
for _ in $(seq 100); do [ "$(held_path)" = step_2/shard0.pt ] && break; sleep 0.1; done
expect_eq step_2/shard0.pt "$(held_path)" "held at step 2's shard"
if "$CKPTFS" skip "$MNT" step_2/other.pt 2> "$T/skip.err"; then fail "skip of a file not held succeeded"; fi
grep -q "holds at step_2/shard0.pt" "$T/skip.err" || fail "skip of the wrong file: $(cat "$T/skip.err")"
"$CKPTFS" skip "$MNT" "$MNT/step_2/shard0.pt" > "$T/skip.out" || fail "skip failed: $(cat "$T/skip.out")"
if "$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain2.err"; then fail "drain exited 0 after a skip"; fi
grep -q "failed: step_2/shard0.pt: skipped by the operator" "$T/drain2.err" ||
  fail "drain did not name the skipped file: $(cat "$T/drain2.err")"
expect_eq failed "$(state_of "$MNT/step_2/shard0.pt")" "state of the skipped file"
expect_eq step_2 "$(cat "$BACKEND/latest")" "latest after the operator's skip"
expect_eq "$MNT/step1" "$("$CKPTFS" latest "$MNT" --persisted)" "latest --persisted passes over the skipped checkpoint"
"$CKPTFS" lost "$MNT" --clear > /dev/null
"$CKPTFS" drain "$MNT" --timeout 60 || fail "drain after lost --clear"
rmdir "$BACKEND/step_2/shard0.pt"
umount_fs

# 3. -o on_refusal=skip: failed at once, the drain goes on, still told.
mount_fs --fsync backend --shared-ttl 0 -o on_refusal=skip
mkdir -p "$BACKEND/step3/shard0.pt"
mkdir "$MNT/step3"
write_fsync "$MNT/step3/shard0.pt" "shard of step 3" EIO
# The shard's failure was its own fsync's answer; this fsync answers for
# itself and what was pending when it was called (docs/consistency.md).
write_fsync "$MNT/latest" step3 ok
expect_eq failed "$(state_of "$MNT/step3/shard0.pt")" "state with on_refusal=skip"
expect_eq step3 "$(cat "$BACKEND/latest")" "on_refusal=skip goes on"
if "$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain3.err"; then fail "drain exited 0 with a failed file"; fi
grep -q "failed: step3/shard0.pt" "$T/drain3.err" || fail "drain did not name the failed file: $(cat "$T/drain3.err")"
"$CKPTFS" lost "$MNT" --clear > /dev/null
umount_fs
check_log --allow-errors "drain: seq" --allow-warnings "skip: the operator|a directory is in the way|is failed$"
echo "drain_refusal_holds: ok"
