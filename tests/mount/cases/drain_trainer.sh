#!/usr/bin/env bash
# A trainer saves step_1..step_6 with torch.save (model + optimizer), writes
# `latest` after each step and deletes old steps. While the (slowed) drain
# runs, a watcher walks the backend and checks that `latest` never names a
# step whose files are not complete, and that it saw at least one complete
# step before the last (the trainer waits after step 3 until it has). After
# `ckptfs drain` the backend tree equals the mount tree byte for byte.
# tsan: the drain publishes in order while the trainer writes and a watcher reads
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

CKPTFS_DRAIN_DELAY_MS=150 mount_fs --cache-size 2G  # a slowed drain


cat > "$T/watch.py" <<'PY'
# Polls the backend until told to stop, then once more (the drained state);
# fails if `latest` ever names a step whose files are missing, short or
# different from what the trainer wrote, and if it never saw a consistent
# step before the last (step_6): a watcher that sees nothing proves
# nothing. The trainer waits after step 3 until the watcher has seen
# step_3 (TRAINER_PAUSE, lib/trainer.py).
import hashlib, json, os, sys, time
import watching  # tests/mount/lib, on PYTHONPATH
backend, manifest, stop, pause = sys.argv[1:5]
def latest():
    try:
        return open(os.path.join(backend, "latest")).read()
    except FileNotFoundError:
        return None
checks, steps, mid = 0, set(), set()
def poll():
    global checks
    step = latest()
    if step is None:
        return
    sums = json.load(open(manifest))
    for n in ("model.pt", "optim.pt"):
        p = os.path.join(backend, step, n)
        try:
            data = open(p, "rb").read()
        except FileNotFoundError:
            # Deleted by a later step: fine only if latest moved on meanwhile.
            if latest() != step:
                return
            sys.exit(f"latest names {step} but {p} is missing")
        if hashlib.sha256(data).hexdigest() != sums[f"{step}/{n}"]:
            if latest() == step and os.path.exists(p):
                sys.exit(f"latest names {step} but {p} has wrong bytes")
            return
    if latest() != step:
        return
    checks += 1
    steps.add(step)
    if step != "step_6":
        mid.add(step)
    if step == "step_3":  # the trainer waits there for this sighting
        open(pause, "w").close()
watching.watch(stop, poll, 0.01)
print(f"watcher: {checks} consistent observations of {sorted(steps)}")
if "step_3" not in mid or "step_6" not in steps:
    sys.exit("watcher: never saw a consistent intermediate checkpoint, or not the last one")
PY

PYTHONPATH="$ROOT/tests/mount/lib" /usr/bin/python3 "$T/watch.py" "$BACKEND" "$T/manifest.json" "$T/stop" "$T/pause" > "$T/watch.out" 2>&1 &
watcher=$!
TRAINER_PAUSE=$T/pause /usr/bin/python3 "$(dirname "$0")/../lib/trainer.py" "$MNT" "$T/manifest.json"
"$CKPTFS" drain "$MNT" --timeout 300
touch "$T/stop"
wait "$watcher" || { cat "$T/watch.out"; fail "the backend showed an inconsistent checkpoint, or none"; }
cat "$T/watch.out"

# The backend equals the mount, byte for byte (the staging dir aside).
diff -r --exclude=.ckptfs-tmp "$MNT" "$BACKEND" || fail "backend differs from the mount"
[ "$(cat "$BACKEND/latest")" = step_6 ] || fail "latest in backend is $(cat "$BACKEND/latest")"
[ ! -e "$BACKEND/step_1" ] || fail "deleted step_1 still in backend"
[ -z "$(staged_left "$BACKEND")" ] || fail "staging files left behind: $(staged_left "$BACKEND")"
for f in "$MNT"/step_6/*; do
  [ "$(getfattr --only-values -n user.ckptfs.state "$f")" = persisted ] || fail "$f not persisted"
done
"$CKPTFS" status "$MNT" --json | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["dirty"]["files"] == 0 and s["draining"]["files"] == 0, s
assert s["drain"]["queue"] == 0, s
'
umount_fs
check_log
