#!/usr/bin/env bash
# Spares that are ready for every save (issue #29):
#   1. A fresh mount makes one spare for its first save at once (a quarter
#      of the budget), its pages warmed, the cost in status (JSON and text).
#   2. The first save is a passthrough writer into that spare (the spare is
#      taken at its open), and its bytes come out and drain right.
#   3. Keep-all with the budget near full: once the saves are persisted,
#      the oldest is evicted to make room for the next save's spare; the
#      newest stays in RAM, and the evicted one still reads back right; a
#      save is never evicted for its own successor's spare.
#   4. A restart makes none until a save, then one (capped by --prealloc
#      SIZE); --prealloc 0 makes none.
#   5. A log file left open for writing, idle, does not stop spares.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

mount_fs --cache-size 256M
status_json() { "$CKPTFS" status "$MNT" --json; }
pt_field() { status_json | $PY -c "import json,sys; print(json.load(sys.stdin)['passthrough']['$1'])"; }
[ "$(pt_field active)" = True ] || skip "passthrough not available here: $(pt_field why_not)"
spares() { pt_field prealloc_bytes; }
wait_spares() {  # MIN_BYTES WHAT
  for _ in $(seq 100); do [ "$(spares)" -ge "$1" ] && return 0; sleep 0.1; done
  fail "$2: $(spares) bytes pre-allocated after 10 s, $1 wanted"
}

# 1. The fresh mount's spare: a quarter of 256 MiB, warmed.
wait_spares $((64 << 20)) "a fresh mount's spare"
expect_eq $((64 << 20)) "$(spares)" "the first spare is a quarter of the budget"
[ "$(pt_field prealloc_warmed_bytes)" -ge $((64 << 20)) ] || fail "spare pages not warmed: $(pt_field prealloc_warmed_bytes)"
"$CKPTFS" status "$MNT" | grep -Eq '^io .*64\.0 MiB pre-allocated \(64\.0 MiB warmed in [0-9.]+ s' \
  || fail "status text does not show the spare and its cost: $("$CKPTFS" status "$MNT" | grep '^io')"

# 2. The first save: passthrough, into the spare.
mkdir "$MNT/step_0"
head -c $((40 << 20)) /dev/urandom > "$T/ref"
$PY - "$MNT/step_0/model.pt" "$T/ref" "$CKPTFS" "$MNT" <<'PY'
import json, os, subprocess, sys
path, ref, ckptfs, mnt = sys.argv[1:5]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
io = os.getxattr(path, "user.ckptfs.io").decode()
assert io == "passthrough", f"the mount's first writer: {io}"
st = json.loads(subprocess.run([ckptfs, "status", mnt, "--json"], check=True, capture_output=True).stdout)
assert st["passthrough"]["prealloc_bytes"] == 0, f"spare not taken: {st['passthrough']['prealloc_bytes']}"
data = open(ref, "rb").read()
for off in range(0, len(data), 1 << 20):
    os.write(fd, data[off:off + (1 << 20)])
os.close(fd)
PY
same_bytes "$T/ref" "$MNT/step_0/model.pt"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
same_bytes "$T/ref" "$BACKEND/step_0/model.pt"

# 3. Keep-all: 40 MiB saves into new step directories, each persisted
# before the next. 256 MiB holds five and the budget's eighth to spare,
# but not a sixth for the next save's spare: the oldest makes way (without
# that, all five stay and the next save takes fresh pages).
state_of() { getfattr --only-values -n user.ckptfs.state "$1" 2>/dev/null | tr -d '\0'; }
for i in 1 2 3 4; do
  mkdir "$MNT/step_$i"
  cat "$T/ref" > "$MNT/step_$i/model.pt"  # O_TRUNC, as torch.save (cp creates with O_EXCL: the copying path)
  "$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
  sleep 4.2  # the quiet between two saves, past Residency::kSaveGap (a trainer's minutes)
done
for _ in $(seq 100); do [ "$(state_of "$MNT/step_0/model.pt")" = remote ] && break; sleep 0.1; done
expect_eq remote "$(state_of "$MNT/step_0/model.pt")" "the oldest save, evicted for the next save's spare"
wait_spares $((40 << 20)) "a spare for the next save with the budget full"
expect_eq persisted "$(state_of "$MNT/step_4/model.pt")" "the newest save, kept in RAM"
same_bytes "$T/ref" "$MNT/step_0/model.pt"

# 4. A restart: no spare until a save (the trainer reads its checkpoint
# back first, and fetches must find their room), then one under the cap.
remount_fs --cache-size 256M --prealloc 8M
sleep 1.5
expect_eq 0 "$(spares)" "pre-allocated bytes after a restart, before any save"
head -c 1M /dev/urandom > "$MNT/latest.pt"
wait_spares $((8 << 20)) "a spare after the restart's first save"
expect_eq $((8 << 20)) "$(spares)" "the spare under --prealloc 8M"
remount_fs --cache-size 256M --prealloc 0
sleep 1
expect_eq 0 "$(spares)" "pre-allocated bytes with --prealloc 0"

# 5. A trainer's log kept open for writing (a passthrough writer that
# never closes) holds no spare back once it sits idle: the next save gets
# one (it used to freeze spares and the save clock for as long as it was open).
remount_fs --cache-size 256M --prealloc 8M
exec 3> "$MNT/train.log"
echo "step 1 loss 2.3" >&3
head -c 1M /dev/urandom > "$MNT/latest.pt"
wait_spares $((8 << 20)) "a spare beside a log left open"
echo "step 2 loss 2.1" >&3
exec 3>&-
expect_eq 32 "$(stat -c %s "$MNT/train.log")" "the log's bytes"
umount_fs
check_log
