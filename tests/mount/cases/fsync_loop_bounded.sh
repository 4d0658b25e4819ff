#!/usr/bin/env bash
# A file rewritten in place costs a small multiple of its own size in the
# memory tier, however slowly the drain goes (issue #10, problem c). With
# the drain stuck and a 160 MiB budget, a 32 MiB file gets 60 rewrites of
# 1-4 MiB at random offsets, in two ways:
#   fsync   one open handle, fsync (--fsync memory) after every rewrite;
#   reopen  open, rewrite, close, 60 times.
# Each seal makes a version the drain has not taken; only the newest one
# still has to reach the backend (the drain skips versions rewritten since),
# so the tier must never hold more than 4x the file (`tier.used` of `ckptfs
# status --json`, and the bytes of the files in the tier dir, checked after
# every rewrite), and no write may fail (ENOSPC) or wait for a drain that
# cannot come (a timeout guards that). It used to keep a full copy of every
# sealed version until it drained: the budget filled after a few rewrites,
# then the writer waited in Tier::Reserve (10 min) for the stuck drain.
# Then the drain resumes, and the backend must hold the last bytes written.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

SIZE=$((32 << 20))
OPS=60
LIMIT=$((4 * SIZE))
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 160M
at_exit 'rm -f "$T/pause"'

cat > "$T/rewrite.py" <<'PY'
import json, os, random, subprocess, sys
mode, path, ref, ckptfs, mnt, tier = sys.argv[1:7]
size, ops, limit, base = (int(x) for x in sys.argv[7:11])
MIB = 1 << 20
rng = random.Random(f"{mode}-{size}-{ops}")
worst = (0, "")

def used():
    j = json.loads(subprocess.run([ckptfs, "status", mnt, "--json"], check=True, capture_output=True,
                                  text=True, timeout=30).stdout)
    # Pre-allocated spare pages are a separate, capped cost (--prealloc).
    return j["tier"]["used"] - j.get("passthrough", {}).get("prealloc_bytes", 0)

def tier_bytes():  # what the tier dir holds, whatever status counts (spares, *.tmp, aside)
    n = 0
    for d, _, files in os.walk(tier):
        if os.path.relpath(d, tier).split(os.sep)[0] == "orphans":
            continue
        for f in files:
            if f.endswith(".tmp"):
                continue
            try:
                n += os.lstat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return n

def check(when):
    global worst
    u, t = used() - base, tier_bytes() - base
    m = max(u, t)
    if m > worst[0]:
        worst = (m, when)
    if m > limit:
        sys.exit(f"{mode}: {when}: tier used {u >> 20} MiB (status), {t >> 20} MiB (files in the tier dir) "
                 f"for one {size >> 20} MiB file: more than {limit // size}x")

def rewrite(fd, rf, i):
    n = rng.randint(MIB, 4 * MIB) + rng.randrange(4096)
    off = rng.randrange(size - n)
    data = rng.randbytes(n)
    if os.pwrite(fd, data, off) != n:
        sys.exit(f"{mode}: op {i}: short write")
    rf.seek(off)
    rf.write(data)

with open(ref, "wb") as rf:
    first = rng.randbytes(size)
    rf.write(first)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, first)
    if mode == "fsync":
        os.fsync(fd)
        check("after the first fsync")
        for i in range(1, ops + 1):
            rewrite(fd, rf, i)
            check(f"after rewrite {i}")
            os.fsync(fd)
            check(f"after fsync {i}")
        os.close(fd)
        check("after the close")
    else:
        os.close(fd)
        check("after the first close")
        for i in range(1, ops + 1):
            fd = os.open(path, os.O_RDWR)
            rewrite(fd, rf, i)
            check(f"after rewrite {i} (open)")
            os.close(fd)
            check(f"after close {i}")
print(f"{mode}: {ops} rewrites; the tier held at most {worst[0] / MIB:.1f} MiB above the start "
      f"({worst[0] / size:.2f}x the file), {worst[1]}")
PY

tier_used() { "$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["tier"]["used"])'; }

for mode in fsync reopen; do
  touch "$T/pause"
  base=$(tier_used)
  rc=0
  timeout -k 5 120 $PY "$T/rewrite.py" "$mode" "$MNT/$mode.bin" "$T/$mode.ref" "$CKPTFS" "$MNT" "$TIER" \
    "$SIZE" "$OPS" "$LIMIT" "$base" > "$T/$mode.out" 2> "$T/$mode.err" || rc=$?
  [ "$rc" != 124 ] && [ "$rc" != 137 ] \
    || fail "$mode: the rewrites did not finish in 120 s (a writer waiting for space the stuck drain cannot free?): $(tail -n 3 "$T/$mode.err")"
  [ "$rc" = 0 ] || fail "$(tail -n 5 "$T/$mode.err")"
  note "$(cat "$T/$mode.out") (tier used $((base >> 20)) MiB before)"
  same_bytes "$T/$mode.ref" "$MNT/$mode.bin"
  rm -f "$T/pause"
  "$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || { cat "$T/drain.out" >&2; fail "$mode: ckptfs drain failed"; }
  same_bytes "$T/$mode.ref" "$BACKEND/$mode.bin"
done
check_backend
umount_fs
check_log
