#!/usr/bin/env bash
# --max-file-size under FUSE passthrough: the kernel writes the tier file
# without the daemon, so nothing stops a write past the limit; the close
# (FUSE flush) and fsync that find the file over it cut it back to the
# limit, seal that, and fail with EFBIG, as the copying path's writes do.
#   1. An O_TRUNC passthrough writer writes 4 MiB under a 1 MiB limit: its
#      writes succeed, close(2) fails with EFBIG, the file is 1 MiB.
#   2. fsync(2) of such a writer fails with EFBIG and cuts it back; the
#      close after it (nothing more written) succeeds.
#   2b. A reader's fsync and close meanwhile neither cut it nor are told
#      (the writer's close is); the last, as it leaves later files the
#      copying path (the largest file seen was over the limit).
#   3. The drain publishes what was sealed: no backend file over the limit.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

require_root
mount_fs --cache-size 64M --max-file-size 1M
pt_field() { "$CKPTFS" status "$MNT" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['passthrough']['$1'])"; }
if [ "$(pt_field active)" != True ]; then
  skip "passthrough not available here: $(pt_field why_not)"
fi
# The first file of a mount says how large a checkpoint is: the copying
# path, and then O_TRUNC writers are passthrough.
head -c 1M /dev/urandom > "$MNT/first.bin"

# 1. close(2) reports the overrun.
$PY - "$MNT/big.pt" <<'PY'
import errno, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
io = os.getxattr(path, "user.ckptfs.io").decode()
assert io == "passthrough", f"writer handle: {io}"
for _ in range(4):
    assert os.write(fd, os.urandom(1 << 20)) == 1 << 20
try:
    os.close(fd)
    raise SystemExit("close of a 4 MiB passthrough file under a 1 MiB limit succeeded")
except OSError as e:
    assert e.errno == errno.EFBIG, f"close failed with {e}, not EFBIG"
st = os.stat(path)
assert st.st_size <= 1 << 20, f"size after close: {st.st_size}"
PY

# 2. fsync(2) reports it too, and cuts the file back before the close.
$PY - "$MNT/synced.pt" <<'PY'
import errno, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
io = os.getxattr(path, "user.ckptfs.io").decode()
assert io == "passthrough", f"writer handle: {io}"
os.write(fd, os.urandom(3 << 20))
try:
    os.fsync(fd)
    raise SystemExit("fsync of a 3 MiB passthrough file under a 1 MiB limit succeeded")
except OSError as e:
    assert e.errno == errno.EFBIG, f"fsync failed with {e}, not EFBIG"
assert os.stat(path).st_size <= 1 << 20, f"size after fsync: {os.stat(path).st_size}"
os.close(fd)
PY

# 2b. A reader that opens, fsyncs and closes the file meanwhile is not the
#     one told (nor the one whose close cuts it): the writer's close is.
$PY - "$MNT/read.pt" <<'PY'
import errno, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
assert os.getxattr(path, "user.ckptfs.io").decode() == "passthrough"
os.write(fd, os.urandom(3 << 20))
r = os.open(path, os.O_RDONLY)
os.read(r, 4096)
os.fsync(r)
os.close(r)
try:
    os.close(fd)
    raise SystemExit("the writer's close succeeded after a reader's close")
except OSError as e:
    assert e.errno == errno.EFBIG, f"close failed with {e}, not EFBIG"
assert os.stat(path).st_size <= 1 << 20, f"size after close: {os.stat(path).st_size}"
PY

# 3. What the drain sends is within the limit.
check_backend
for f in big.pt read.pt synced.pt; do
  s=$(size_of "$BACKEND/$f")
  [ "$s" -le $((1 << 20)) ] || fail "$f in the backend is $s bytes, over --max-file-size"
done
umount_fs
check_log --allow-warnings "over --max-file-size"
