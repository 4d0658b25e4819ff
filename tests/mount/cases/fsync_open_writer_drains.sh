#!/usr/bin/env bash
# An fsync (--fsync memory) under a passthrough writer that keeps its file
# open does not hold the drain (issue: item 8). The version the fsync seals
# stays in place (the kernel writes the live file; no copy at the fsync),
# and the drain used to wait for the writer's close before it, and every
# entry after it (`latest`), could reach the backend. Now, with entries
# waiting behind it, the drain copies that version aside (off the FUSE
# threads, only if the file is quiet and the copy provably untorn) and goes
# on: `ckptfs drain` succeeds and the backend has the fsynced bytes and
# `latest` while the file is still open. Bytes written after the fsync are
# never published as that version: they reach the backend with the close.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 256M --fsync memory
pt=$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(int(json.load(sys.stdin)["passthrough"]["active"]))')
[ "$pt" = 1 ] || skip "passthrough is not active here"

# A first file of that size, so the next O_TRUNC writer gets passthrough
# (the first file of a mount takes the copying path).
head -c 8M /dev/urandom > "$T/ref"
head -c 1M /dev/urandom > "$T/tail"
cp "$T/ref" "$MNT/warm"
"$CKPTFS" drain "$MNT" --timeout 60

cat > "$T/writer.py" <<'PY'
import os, sys
path, ref, tail, ready, go = sys.argv[1:6]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
with open(ref, "rb") as f:
    while b := f.read(1 << 20):
        os.write(fd, b)
os.fsync(fd)
with open(ready, "w") as r:
    r.write(os.getxattr(path, "user.ckptfs.io").decode())
with open(go) as g:  # blocks until the case has drained
    g.read()
with open(tail, "rb") as f:  # bytes after the fsync: never part of its version
    os.write(fd, f.read())
os.close(fd)
PY
mkfifo "$T/go"
timeout -k 5 180 $PY "$T/writer.py" "$MNT/model.pt" "$T/ref" "$T/tail" "$T/ready" "$T/go" 2> "$T/writer.err" &
wpid=$!
at_exit 'kill "$wpid" 2>/dev/null'
for _ in $(seq 600); do [ -s "$T/ready" ] || ! kill -0 "$wpid" 2>/dev/null && break; sleep 0.1; done
[ -s "$T/ready" ] || fail "the writer did not get through write + fsync: $(cat "$T/writer.err")"
expect_eq passthrough "$(cat "$T/ready")" "the writer's handle (user.ckptfs.io)"

echo step_1 > "$MNT/latest"
"$CKPTFS" drain "$MNT" --timeout 20 ||
  fail "the drain waits behind a file fsynced and still open: $("$CKPTFS" status "$MNT" | head -20)"
kill -0 "$wpid" 2>/dev/null || fail "the writer is gone already: $(cat "$T/writer.err")"
expect_eq step_1 "$(cat "$BACKEND/latest")" "latest in the backend"
same_bytes "$T/ref" "$BACKEND/model.pt"

echo go > "$T/go"
wait "$wpid" || fail "writer failed: $(cat "$T/writer.err")"
cat "$T/ref" "$T/tail" > "$T/all"
same_bytes "$T/all" "$MNT/model.pt"
check_backend
same_bytes "$T/all" "$BACKEND/model.pt"
umount_fs
check_log
