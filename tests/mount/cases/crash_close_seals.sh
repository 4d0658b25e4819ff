#!/usr/bin/env bash
# A writer's close(2) seals its version before it returns (docs/
# consistency.md, "the unit of durability"): the kernel answers close(2)
# after FUSE flush and sends release later, without waiting. FUSE's flush
# request carries no open flags (libfuse hands the handler 0, O_RDONLY),
# and the daemon once took every flush for a reader's: the seal waited for
# release, and a CI run lost a file whose cp had returned (a metadata fault
# struck between the two). Here each writer closes its descriptor while a
# dup of it stays open, so flush comes and release does not; the daemon is
# then killed. Every file must come back with the bytes its close saw —
# copying writers (O_EXCL, as cp opens), passthrough writers (O_TRUNC, as
# torch.save opens) and O_RDWR ones — none "created but never closed".
# asan: the daemon killed (-9) with handles open, then recovery of what it sealed
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M
at_exit 'rm -f "$T/pause"'

cat > "$T/holder.py" <<'PY'
import os, sys, time
mnt, refdir = sys.argv[1:3]
MIB = 1 << 20
modes = {
    "excl.bin": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "trunc.bin": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "rdwr.bin": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
}
held = []
for name, flags in modes.items():
    data = os.urandom(3 * MIB + 11)
    fd = os.open(os.path.join(mnt, name), flags, 0o644)
    os.write(fd, data)
    held.append(os.dup(fd))  # the open file stays: no release
    os.close(fd)             # flush: the close the writer saw return
    with open(os.path.join(refdir, name), "wb") as f:
        f.write(data)
open(os.path.join(refdir, "ready"), "w").close()
while True:
    time.sleep(1)
PY
mkdir -p "$T/ref"
timeout -k 5 120 $PY "$T/holder.py" "$MNT" "$T/ref" 2> "$T/holder.err" &
holder=$!
at_exit 'kill "$holder" 2>/dev/null'
for _ in $(seq 600); do [ -e "$T/ref/ready" ] || ! kill -0 "$holder" 2>/dev/null && break; sleep 0.1; done
[ -e "$T/ref/ready" ] || fail "the holder did not write its files: $(cat "$T/holder.err")"
files=(excl.bin trunc.bin rdwr.bin)

crash_daemon "$holder"

CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M
tail -n "+$((CRASH_LOG_LINES + 1))" "$STATE/ckptfs.log" > "$T/recovery.log"
if grep -E "never closed|lost" "$T/recovery.log" > "$T/lost"; then
  fail "recovery lost files whose close had returned: $(cat "$T/lost")"
fi
for f in "${files[@]}"; do same_bytes "$T/ref/$f" "$MNT/$f"; done
rm -f "$T/pause"
check_backend
for f in "${files[@]}"; do same_bytes "$T/ref/$f" "$BACKEND/$f"; done
umount_fs
check_log --allow-warnings "open for writing when the daemon stopped"
