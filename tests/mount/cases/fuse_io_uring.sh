#!/usr/bin/env bash
# FUSE over io_uring (fs/fuse/fuse_uring.h): where the kernel has it, requests
# come through one ring queue per CPU and `ckptfs status` says so (the count
# grows with the requests); every kind of request works there — create,
# write, read, rename, readdir, xattrs, fsync, truncate, unlink, a real
# torch.save/torch.load, four processes at once — the same bytes reach the
# backend; umount ends the daemon; kill -9 and a new mount serve the files
# again. -o io_uring=off keeps /dev/fuse and status says why. (Where the
# kernel has it, io_uring is the default, so every other mounted case runs
# over it too; drain_fsync_backend_waits, recovery_full_tier and
# remote_open_waits check that replies that come later hold nothing up.)
# tsan: ring threads, replies from other threads through the eventfd, entries added while requests wait
# asan: ring entries, replies from other threads, kill -9 and a new mount over the rings
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

uring_requests() { $CKPTFS status --json "$MNT" | $PY -c 'import json,sys; print(json.load(sys.stdin)["fuse_io_uring"]["requests"])'; }

uring_state() { wait_uring && $CKPTFS status --json "$MNT" | $PY -c 'import json,sys; u=json.load(sys.stdin)["fuse_io_uring"]; print(u["active"], u["why_not"])'; }

mount_fs --fsync backend
state=$(uring_state)
if [ "${state%% *}" != True ]; then
  why=${state#* }
  case "$why" in
    *"no FUSE over io_uring"*|*"cannot be turned on"*) skip "this kernel: $why" ;;
    *) fail "io_uring not in use on a kernel that has it: $why" ;;
  esac
fi
$CKPTFS status "$MNT" | grep -q "^requests   over io_uring" || fail "status does not say requests come over io_uring"
n0=$(uring_requests)

# 1. Every kind of request.
head -c 3M /dev/urandom > "$T/a"
mkdir -p "$MNT/d/e"
cp "$T/a" "$MNT/d/e/a.bin"
same_bytes "$T/a" "$MNT/d/e/a.bin" || fail "read back differs"
mv "$MNT/d/e/a.bin" "$MNT/d/b.bin"
[ "$(ls "$MNT/d")" = "$(printf 'b.bin\ne')" ] || fail "readdir after rename: $(ls "$MNT/d")"
setfattr -n user.note -v hello "$MNT/d/b.bin"
[ "$(getfattr --only-values -n user.note "$MNT/d/b.bin")" = hello ] || fail "user xattr lost"
truncate -s 1000 "$MNT/d/b.bin"
[ "$(size_of "$MNT/d/b.bin")" = 1000 ] || fail "truncate: size $(size_of "$MNT/d/b.bin")"
echo gone > "$MNT/d/tmp" && rm "$MNT/d/tmp"
[ ! -e "$MNT/d/tmp" ] || fail "unlinked file still there"
$PY - "$MNT" <<'EOF'
import os, sys, torch
m = sys.argv[1]
state = {f"t{i}": torch.randn(64 * (i + 1), 128) for i in range(24)}
torch.save(state, f"{m}/model.pt")
back = torch.load(f"{m}/model.pt")
assert all(torch.equal(state[k], back[k]) for k in state), "torch.load differs from what was saved"
EOF
# Four processes at once (ranks): each writes, fsyncs and reads back its shards.
$PY - "$MNT/ranks" <<'EOF'
import os, sys, multiprocessing as mp
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
def rank(r):
    for i in range(24):
        data = os.urandom(65536 + 4096 * i)
        p = f"{d}/__{r}_{i}.distcp"
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with open(p, "rb") as f:
            assert f.read() == data, p
ps = [mp.Process(target=rank, args=(r,)) for r in range(4)]
[p.start() for p in ps]
[p.join() for p in ps]
assert all(p.exitcode == 0 for p in ps), [p.exitcode for p in ps]
EOF
[ "$(ls "$MNT/ranks" | wc -l)" = 96 ] || fail "ranks: $(ls "$MNT/ranks" | wc -l) files, want 96"
n1=$(uring_requests)
[ "$n1" -gt $((n0 + 500)) ] || fail "io_uring request count went from $n0 to $n1 only"
$CKPTFS drain "$MNT" > /dev/null
same_bytes "$MNT/ranks/__3_23.distcp" "$BACKEND/ranks/__3_23.distcp" || fail "backend copy differs"
[ "$(size_of "$BACKEND/d/b.bin")" = 1000 ] || fail "backend d/b.bin has size $(size_of "$BACKEND/d/b.bin")"

# 2. kill -9, then a new mount serves the files (from the tier).
crash_daemon
mount_fs --fsync backend
$PY -c 'import torch,sys; torch.load(sys.argv[1])' "$MNT/model.pt" || fail "torch.load after kill -9 and remount"
[ "$(uring_state)" = "True " ] || fail "io_uring not used after remount: $(uring_state)"
umount_fs

# 3. -o io_uring=off: /dev/fuse, and status says why.
mount_fs -o io_uring=off
[ "$(uring_state)" = "False off (-o io_uring=off)" ] || fail "-o io_uring=off still uses io_uring"
$CKPTFS status "$MNT" | grep -q "^requests   through /dev/fuse (io_uring off (-o io_uring=off))" ||
  fail "status: $($CKPTFS status "$MNT" | grep ^requests)"
same_bytes "$MNT/ranks/__0_0.distcp" "$BACKEND/ranks/__0_0.distcp" || fail "read over /dev/fuse differs"
umount_fs
check_log
echo "PASS: $CASE"
