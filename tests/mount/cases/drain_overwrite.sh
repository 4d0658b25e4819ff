#!/usr/bin/env bash
# The most common save pattern: torch.save to the same path every step
# (O_TRUNC rewrite), plus an in-place `r+` patch, while the slowed drain is
# still publishing the previous versions. Each sealed version is kept until
# published, so a watcher on the backend must only ever see one of the
# versions that were closed, whole — never a torn or truncated mix — and the
# last one after `ckptfs drain`; it must see one before the last (the saver
# waits after step 3 until it has).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

CKPTFS_DRAIN_DELAY_MS=100 mount_fs --cache-size 1G  # a slowed drain

cat > "$T/saver.py" <<'PY'
import hashlib, json, os, sys, time, torch
mnt, sums_path, pause = sys.argv[1:4]
p = os.path.join(mnt, "ckpt.pt")
sums = []
def record():
    with open(p, "rb") as f:
        sums.append(hashlib.sha256(f.read()).hexdigest())
    with open(sums_path + ".tmp", "w") as f:
        json.dump(sums, f)
    os.replace(sums_path + ".tmp", sums_path)
for step in range(8):
    state = {"step": step, "w": torch.full((1 << 20,), float(step))}  # 4 MiB
    # Recorded before the save: the watcher may see the new version at once.
    buf = __import__("io").BytesIO(); torch.save(state, buf)
    sums.append(hashlib.sha256(buf.getvalue()).hexdigest())
    torch.save(state, p)
    record()
    if step % 3 == 2:  # an in-place patch of the closed file
        with open(p, "r+b") as f:
            f.seek(1 << 20)
            f.write(os.urandom(4096))
        record()
    if step == 3:  # wait (60 s at most) until the watcher saw a version
        deadline = time.monotonic() + 60
        while not os.path.exists(pause) and time.monotonic() < deadline:
            time.sleep(0.02)
PY

cat > "$T/watch.py" <<'PY'
# Polls the backend until told to stop, then once more (the drained state);
# fails on a ckpt.pt that is no closed version, and if it never saw a whole
# version other than the last: a watcher that sees nothing proves nothing.
# Its first sighting lets the saver go on past step 3.
import hashlib, json, os, sys, time
import watching  # tests/mount/lib, on PYTHONPATH
backend, sums_path, stop, pause = sys.argv[1:5]
seen, last = set(), None
def poll():
    global last
    try:
        data = open(os.path.join(backend, "ckpt.pt"), "rb").read()
    except FileNotFoundError:
        return
    h = hashlib.sha256(data).hexdigest()
    if h not in json.load(open(sums_path)):
        # Re-read once: the version may have been recorded just after publish.
        time.sleep(0.2)
        if h not in json.load(open(sums_path)):
            sys.exit(f"backend ckpt.pt ({len(data)} bytes) is no version that was closed")
    seen.add(h)
    last = h
    open(pause, "w").close()
watching.watch(stop, poll, 0.01)
print(f"watcher: {len(seen)} whole versions observed")
if not seen - {last}:
    sys.exit("watcher: never saw a whole version before the last one")
PY

echo '[]' > "$T/sums.json"
PYTHONPATH="$ROOT/tests/mount/lib" $PY "$T/watch.py" "$BACKEND" "$T/sums.json" "$T/stop" "$T/pause" > "$T/watch.out" 2>&1 &
watcher=$!
$PY "$T/saver.py" "$MNT" "$T/sums.json" "$T/pause"
"$CKPTFS" drain "$MNT" --timeout 300
touch "$T/stop"
wait "$watcher" || { cat "$T/watch.out"; fail "the backend showed a torn checkpoint, or no version before the last"; }
cat "$T/watch.out"
cmp "$MNT/ckpt.pt" "$BACKEND/ckpt.pt" || fail "backend does not hold the last version"
# Step 7 is not patched in place (7 % 3 != 2): both load as step 7.
for f in "$BACKEND/ckpt.pt" "$MNT/ckpt.pt"; do
  $PY -c 'import torch,sys; s=torch.load(sys.argv[1]); assert s["step"]==7, s["step"]' "$f" || fail "$f: not step 7"
done
snaps=$(find "$TIER" -maxdepth 1 -name '8*' | wc -l)
[ "$snaps" = 0 ] || fail "$snaps snapshots left in the tier after the drain"
umount_fs
check_log
