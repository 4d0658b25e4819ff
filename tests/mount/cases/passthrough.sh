#!/usr/bin/env bash
# FUSE passthrough (issue #15): the kernel serves handles from the tier file,
# and every guarantee of the copying path still holds.
#   1. Negotiated (status says so), or the case is skipped with the reason.
#   2. An O_TRUNC writer (torch.save) and readers are passthrough handles
#      (user.ckptfs.io); bytes, size and mtime come out right; the drain
#      publishes the exact bytes. So is the writer of a name it creates
#      without O_TRUNC (O_CREAT|O_EXCL: cp, tempfile), into fresh pages
#      (no spare); O_CREAT on a file that exists is not, nor O_APPEND.
#   3. A passthrough reader is open while a writer rewrites the file with
#      O_TRUNC and the drain still owes the old version: the reader sees the
#      truncation (one file, as POSIX wants); the old version is copied
#      aside at the open, so the drain still publishes it, then the new one.
#   4. fsync under a passthrough writer, then more writes, then close: the
#      backend gets the final bytes; nothing is "lost".
#   5. O_TRUNC + ftruncate + MAP_SHARED stores (no size or mtime change the
#      daemon could see): the close still seals and drains them.
#   6. An r+ open (np.memmap) keeps the copying path; -o passthrough=off
#      turns it off for every handle, and status says why.
#   7. Pre-allocated tier pages: spares appear once files are sealed, a new
#      version is written into one and its unused tail is freed at close;
#      --prealloc 0 keeps none.
# tsan: open replies marked on the way out, the 50 ms budget watch and the spare refill beside the drain
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

require_root
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs
at_exit 'rm -f "$T/pause"'
status_json() { "$CKPTFS" status "$MNT" --json; }
pt_field() { status_json | $PY -c "import json,sys; print(json.load(sys.stdin)['passthrough']['$1'])"; }
if [ "$(pt_field active)" != True ]; then
  skip "passthrough not available here: $(pt_field why_not)"
fi
"$CKPTFS" status "$MNT" | grep -q '^io  *passthrough' || fail "status text does not show passthrough"
# The preferred I/O size is a page, as on tmpfs: Python and stdio size
# their buffers by it, and 1 MiB made every small read take a MiB.
head -c 4096 /dev/urandom > "$MNT/blksize.bin"
expect_eq 4096 "$(stat -c %o "$MNT/blksize.bin")" "st_blksize with passthrough"

# 2. writer and readers. The first file of a mount takes the copying path
# (nothing says how large a checkpoint is yet: PassthroughRoom).
head -c 1M /dev/urandom > "$MNT/first.bin"
head -c $((48 << 20)) /dev/urandom > "$T/ref1"
$PY - "$MNT/model.pt" "$T/ref1" <<'PY'
import os, sys
path, ref = sys.argv[1:3]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
io = os.getxattr(path, "user.ckptfs.io").decode()
assert io == "passthrough", f"writer handle: {io}"
data = open(ref, "rb").read()
for off in range(0, len(data), 3 << 20):
    os.write(fd, data[off:off + (3 << 20)])
st = os.stat(path)
assert st.st_size == len(data), f"size while open: {st.st_size}"
os.close(fd)
with open(path, "rb") as f:
    assert os.getxattr(path, "user.ckptfs.io").decode() == "passthrough"
    assert f.read() == data, "read back differs"
# The kernel sends a reader's RELEASE after close(2) returns (asynchronously:
# readers have no FLUSH), so the handle may be seen for a moment longer.
import time
for _ in range(200):
    if os.getxattr(path, "user.ckptfs.io").decode() == "closed":
        break
    time.sleep(0.01)
assert os.getxattr(path, "user.ckptfs.io").decode() == "closed", "the reader's handle is not released"
PY
same_bytes "$T/ref1" "$MNT/model.pt"
expect_eq 640 "$(stat -c %a "$MNT/model.pt")" "mode"
# A new name written without O_TRUNC (cp, tempfile, open(..., "xb"):
# O_CREAT|O_EXCL) is a new version from nothing too: a passthrough writer,
# into fresh pages (an adopted spare's pages are all there, and a sparse
# file written so would take them all: file_sparse.sh). O_CREAT without
# O_TRUNC on a file that exists is an update in place: the copying path,
# which sees every change; so is an O_APPEND writer.
$PY - "$MNT/excl.pt" "$MNT/model.pt" "$T/ref1" "$MNT/append.log" <<'PY'
import os, sys
path, existing, ref, log = sys.argv[1:5]
data = open(ref, "rb").read()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
io = os.getxattr(path, "user.ckptfs.io").decode()
assert io == "passthrough", f"O_CREAT|O_EXCL writer of a new name: {io}"
os.write(fd, data)
os.close(fd)
assert open(path, "rb").read() == data, "read back differs"
fd = os.open(existing, os.O_WRONLY | os.O_CREAT)
io = os.getxattr(existing, "user.ckptfs.io").decode()
assert io == "daemon", f"O_CREAT without O_TRUNC on an existing file: {io}"
os.close(fd)
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
io = os.getxattr(log, "user.ckptfs.io").decode()
assert io == "daemon", f"O_APPEND writer of a new name: {io}"
os.write(fd, b"one\n")
os.close(fd)
PY
same_bytes "$T/ref1" "$MNT/excl.pt"
expect_eq 600 "$(stat -c %a "$MNT/excl.pt")" "mode of the O_EXCL file"

# 3. A reader open while the file is rewritten, the first version not yet drained.
head -c $((20 << 20)) /dev/urandom > "$T/ref2"
$PY - "$MNT/model.pt" "$T/ref1" "$T/ref2" <<'PY'
import os, sys
path, ref1, ref2 = sys.argv[1:4]
old, new = open(ref1, "rb").read(), open(ref2, "rb").read()
r = os.open(path, os.O_RDONLY)
assert os.pread(r, 4096, 0) == old[:4096]
w = os.open(path, os.O_WRONLY | os.O_TRUNC)
assert os.getxattr(path, "user.ckptfs.io").decode() == "passthrough"
assert os.fstat(r).st_size == 0, "the reader does not see the truncation"
os.write(w, new)
os.close(w)
assert os.pread(r, len(new) + 10, 0) == new, "the reader does not see the new bytes"
os.close(r)
PY
same_bytes "$T/ref2" "$MNT/model.pt"

# 4. fsync, then more writes, then close.
$PY - "$MNT/shard.distcp" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"a" * 100000)
os.fsync(fd)
os.write(fd, b"b" * 5000)
os.pwrite(fd, b"c" * 10, 0)
os.close(fd)
PY
# 5. Stores through a shared mapping of a passthrough writer.
$PY - "$MNT/mapped.bin" <<'PY'
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
m[4096:4101] = b"HELLO"
m.flush()
m.close()
os.close(fd)
PY
# 6. r+ keeps the copying path.
$PY - "$MNT/model.pt" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
assert os.getxattr(sys.argv[1], "user.ckptfs.io").decode() == "daemon", "r+ open"
os.pwrite(fd, b"XY", 100)
os.close(fd)
PY
python3 -c 'import sys; b=bytearray(open(sys.argv[1],"rb").read()); b[100:102]=b"XY"; open(sys.argv[1],"wb").write(b)' "$T/ref2"
same_bytes "$T/ref2" "$MNT/model.pt"

# The drain resumes: every pending version is published (none "lost": the
# first version of model.pt was copied aside when the writer opened it
# under the reader), and the end state is right.
rm -f "$T/pause"
check_backend
same_bytes "$T/ref2" "$BACKEND/model.pt"
expect_eq 105000 "$(size_of "$BACKEND/shard.distcp")" "shard size in the backend"
expect_eq cccccccccc "$(head -c 10 "$BACKEND/shard.distcp")" "shard head in the backend"
expect_eq HELLO "$(dd if="$BACKEND/mapped.bin" bs=1 skip=4096 count=5 status=none)" "mapped stores in the backend"
lost=$(status_json | $PY -c 'import json,sys; j=json.load(sys.stdin); print(len(j.get("lost", [])))')
expect_eq 0 "$lost" "lost files"
grep -q "passthrough negotiated" "$STATE/ckptfs.log" || fail "log does not say passthrough was negotiated"

# Pre-allocated pages: with files sealed, the watch keeps spares (twice
# the largest file, whole 2 MiB) while no passthrough writer is open; a new
# O_TRUNC version is written into one, and its unused tail is given back
# at the close: the tier then holds the files and the spares, no more.
spares() { pt_field prealloc_bytes; }
for _ in $(seq 100); do [ "$(spares)" -gt 0 ] && break; sleep 0.1; done
[ "$(spares)" -ge $((48 << 20)) ] || fail "no pre-allocated pages after 10 s: $(spares) bytes"
head -c $((5 << 20)) /dev/urandom > "$T/ref3"
cp "$T/ref3" "$MNT/small.pt"
same_bytes "$T/ref3" "$MNT/small.pt"
files=$(du -sb --apparent-size "$MNT" | cut -f1)
used=$(status_json | $PY -c 'import json,sys; print(json.load(sys.stdin)["tier"]["used"])')
extra=$((used - files - $(spares)))
note "tier used $((used >> 20)) MiB: files $((files >> 20)) MiB, spares $(($(spares) >> 20)) MiB"
[ "$extra" -le $((4 << 20)) ] || fail "the tier holds $((extra >> 20)) MiB beyond the files and spares: a spare's tail was not freed"
remount_fs --prealloc 0
sleep 0.5
expect_eq 0 "$(spares)" "pre-allocated bytes with --prealloc 0"
# After a restart the files already there say how large a checkpoint is:
# the first save of this mount is passthrough.
$PY - "$MNT/after_restart.pt" <<'PY'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
io = os.getxattr(sys.argv[1], "user.ckptfs.io").decode()
assert io == "passthrough", f"first writer after a restart: {io}"
os.write(fd, b"x" * 70000)
os.close(fd)
PY
expect_eq 70000 "$(size_of "$MNT/after_restart.pt")" "size after a passthrough write"
"$CKPTFS" mount "$T/m2" --backend "$T/b2" --prealloc lots > "$T/bad.out" 2>&1 && fail "--prealloc lots accepted"
grep -q "prealloc" "$T/bad.out" || fail "bad --prealloc message: $(cat "$T/bad.out")"

# -o passthrough=off.
remount_fs -o passthrough=off
expect_eq False "$(pt_field active)" "active with passthrough=off"
pt_field why_not | grep -q "passthrough=off" || fail "status does not say why: $(pt_field why_not)"
expect_eq $((1 << 20)) "$(stat -c %o "$MNT/blksize.bin")" "st_blksize without passthrough (every request a round trip)"
$PY - "$MNT/model.pt" <<'PY'
import os, sys
with open(sys.argv[1], "rb") as f:
    assert os.getxattr(sys.argv[1], "user.ckptfs.io").decode() == "daemon"
PY
same_bytes "$T/ref2" "$MNT/model.pt"
"$CKPTFS" mount "$T/m2" --backend "$T/b2" -o passthrough=maybe > "$T/bad.out" 2>&1 && fail "passthrough=maybe accepted"
grep -q "want passthrough=on or passthrough=off" "$T/bad.out" || fail "bad value message: $(cat "$T/bad.out")"
umount_fs
check_log
