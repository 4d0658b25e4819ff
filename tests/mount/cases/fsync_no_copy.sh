#!/usr/bin/env bash
# An fsync'd file costs its own size in the memory tier, not twice (issue
# #10, problem b). With the drain stuck, a 64 MiB file is written, fsynced
# (--fsync memory) and closed: the tier's `used` (ckptfs status --json) must
# stay about 1x the file right after the fsync (still open, nothing written
# since: no reason to copy yet) and after the close (nothing written since
# the fsync: the version sealed there is the one the close leaves). It used
# to be 2x until the file drained: the fsync of a file open for writing
# copied the sealed version aside at once, and the close kept that copy.
# Then the drain resumes and the backend gets the bytes.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

SIZE=$((64 << 20))
LIMIT=$((SIZE * 9 / 8))  # 1x the file, with room for rounding, never 2x
touch "$T/pause"
# --prealloc 64M: the fresh mount's spare, which the first save writes
# into, is the file's size; pages of a larger one the writer did not use
# count as the file's until its close gives them back.
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M --prealloc 64M
at_exit 'rm -f "$T/pause"'

# The file's pages: pre-allocated spares are a separate, capped cost (--prealloc).
tier_used() {
  "$CKPTFS" status "$MNT" --json |
    $PY -c 'import json,sys; j = json.load(sys.stdin); print(j["tier"]["used"] - j["passthrough"]["prealloc_bytes"])'
}
# expect_used WHEN: the tier holds at most LIMIT bytes.
expect_used() {
  local u
  u=$(tier_used)
  note "tier used $((u >> 20)) MiB $1 (file $((SIZE >> 20)) MiB)"
  [ "$u" -le "$LIMIT" ] || fail "tier used $u bytes ($((u >> 20)) MiB) $1: more than 1x the $((SIZE >> 20)) MiB file"
}

head -c "$SIZE" /dev/urandom > "$T/ref"
# The writer keeps the file open after its fsync until the case has looked.
mkfifo "$T/go"
cat > "$T/writer.py" <<'PY'
import os, sys
path, ref, ready, go = sys.argv[1:5]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
with open(ref, "rb") as f:
    while b := f.read(1 << 20):
        os.write(fd, b)
os.fsync(fd)
open(ready, "w").close()
with open(go) as g:  # blocks until the case has looked at the tier
    g.read()
os.close(fd)
PY
timeout -k 5 120 $PY "$T/writer.py" "$MNT/model.pt" "$T/ref" "$T/ready" "$T/go" 2> "$T/writer.err" &
wpid=$!
at_exit 'kill "$wpid" 2>/dev/null'
for _ in $(seq 600); do [ -e "$T/ready" ] || ! kill -0 "$wpid" 2>/dev/null && break; sleep 0.1; done
[ -e "$T/ready" ] || fail "the writer did not get through write + fsync: $(cat "$T/writer.err")"
expect_used "after the fsync, file still open"
echo go > "$T/go"
wait "$wpid" || fail "writer failed: $(cat "$T/writer.err")"
expect_used "after the close"
same_bytes "$T/ref" "$MNT/model.pt"
expect_used "after reading it back"

rm -f "$T/pause"
check_backend
same_bytes "$T/ref" "$BACKEND/model.pt"
expect_used "after the drain"
umount_fs
check_log
