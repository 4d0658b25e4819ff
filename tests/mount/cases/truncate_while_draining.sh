#!/usr/bin/env bash
# The pattern `write a file, close, reopen it with O_TRUNC (or truncate it)
# at once`, repeated: the drainer is still copying/hashing the closed
# version while the file shrinks under it. The daemon must stay up (no
# SIGBUS from the shrunk tier mapping), log no errors (no EFAULT from the
# staging copy), and mount and backend must end with the final bytes.
# tsan: stagers read a version while writers truncate and rewrite the file
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
$PY - "$MNT" <<'PY'
import os, sys
m = sys.argv[1]
for i in range(150):
    p = f"{m}/t{i % 10}"
    with open(p, "wb") as f:
        f.write(os.urandom(1 << 20))
    if i % 2:
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"short %d" % i)
        os.close(fd)
    else:
        os.truncate(p, 4096)
        with open(p, "r+b") as f:
            f.write(b"cut %d" % i)
    want = (b"short %d" % i) if i % 2 else (b"cut %d" % i)
    got = open(p, "rb").read()
    assert got[:len(want)] == want, (i, got[:20])
    assert len(got) == (len(want) if i % 2 else 4096), (i, len(got))
PY
stat "$MNT" > /dev/null 2>&1 || fail "the daemon died (mount: $(stat "$MNT" 2>&1))"
check_backend
umount_fs
check_log
