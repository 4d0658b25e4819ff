#!/usr/bin/env bash
# Checkpoint policies (issue #13), with a real torch.save trainer:
# --persist-every 3 over 9 steps puts steps 3, 6 and 9 in the backend and
# nothing of the others; the others are memory-only (ls, status, xattr),
# read back with torch.load, and their rotation never reaches the backend
# (no log entry at all); `ckptfs persist --wait` drains one after all;
# --keep-in-memory 2 with a budget that forces eviction evicts older steps
# first although the trainer keeps reading step 1; bad counts and
# contradictory options are refused in one line.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

# Bad input: one line each, nothing mounted.
mkdir -p "$MNT"
for bad in "--persist-every 0" "--persist-every -1" "--keep-in-memory 0" "--persist-interval 1.5" \
  "--persist-every three" "-o persist_every=0" "-o keep_in_memory=-2"; do
  # shellcheck disable=SC2086  # the option and its value are two words
  expect_mount_refused "want a whole number from 1" "$MNT" --backend "$BACKEND" $bad
done
for flag in --persist-every --persist-interval --keep-in-memory; do
  expect_mount_refused "want a whole number from 1" "$MNT" --backend "$BACKEND" "$flag" ''
done
expect_mount_refused "fsync backend cannot go with --persist-every" "$MNT" --backend "$BACKEND" --fsync backend \
  --persist-every 2

head_seq() { "$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["drain"]["head_seq"])'; }
ls_field() {  # ls_field PATH KEY
  "$CKPTFS" ls "$MNT" --json | $PY -c 'import json,sys
for r in json.load(sys.stdin):
    if r["path"] == sys.argv[1]: print(r[sys.argv[2]])' "$1" "$2"
}

mount_fs --persist-every 3 --cache-size 512M
# One long-lived trainer: 9 saves of a model and an optimizer state, and
# `latest` (outside any checkpoint) after each.
$PY - "$MNT" <<'PY'
import os, sys, torch
m = sys.argv[1]
torch.manual_seed(0)
for step in range(1, 10):
    d = f"{m}/step_{step}"
    os.makedirs(d)
    torch.save({"w": torch.full((256, 1024), float(step)), "b": torch.arange(step)}, f"{d}/model.pt")
    torch.save({"m": torch.full((64, 1024), -float(step))}, f"{d}/optim.pt")
    with open(f"{m}/latest", "w") as f:
        f.write(f"step_{step}")
PY
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
expect_eq "latest step_3 step_6 step_9" "$(cd "$BACKEND" && echo $(ls -d latest step_*))" "backend after 9 steps"
expect_eq "model.pt optim.pt" "$(cd "$BACKEND/step_6" && echo $(ls))" "files of a drained step"
expect_eq step_9 "$(cat "$BACKEND/latest")" "latest drains every time"
expect_eq memory-only "$(state_of "$MNT/step_4/model.pt")" "state xattr of a memory-only file"
expect_eq persisted "$(state_of "$MNT/step_6/model.pt")" "state xattr of a drained file"
expect_eq memory-only "$(ls_field step_4 state)" "ls state of step_4"
expect_eq persisted "$(ls_field step_9 state)" "ls state of step_9"
expect_eq True "$(ls_field step_4 complete)" "a memory-only step is complete"
expect_eq False "$(ls_field step_4 persisted)" "a memory-only step is not persisted"
expect_eq "$MNT/step_9" "$("$CKPTFS" latest "$MNT" --persisted)" "latest --persisted"
"$CKPTFS" status "$MNT" > "$T/status.txt"
grep -qE "^mem-only +12 files" "$T/status.txt" || fail "status: $(cat "$T/status.txt")"
"$CKPTFS" ls "$MNT" > "$T/ls.txt"
grep -qE "^step_5 +2 .* memory-only " "$T/ls.txt" || fail "ls: $(cat "$T/ls.txt")"
# Memory-only steps read back like any other.
$PY - "$MNT" <<'PY'
import sys, torch
m = sys.argv[1]
for step in (1, 5, 8):
    sd = torch.load(f"{m}/step_{step}/model.pt")
    assert torch.equal(sd["w"], torch.full((256, 1024), float(step))), step
    assert torch.equal(sd["b"], torch.arange(step)), step
PY

# Rotation of memory-only steps: nothing is logged for the backend.
before=$(head_seq)
rm -r "$MNT/step_1" "$MNT/step_2" "$MNT/step_5"
expect_eq "$before" "$(head_seq)" "log entries made by the rotation of memory-only steps"
# A drained step's rotation does reach it.
rm -r "$MNT/step_3"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
[ ! -e "$BACKEND/step_3" ] || fail "step_3 removed on the mount but not in the backend"

# Persist one memory-only step after all (the last before a planned stop).
"$CKPTFS" persist "$MNT/step_8" --wait > "$T/persist.out" || fail "persist: $(cat "$T/persist.out")"
grep -q "queued for the backend" "$T/persist.out" || fail "persist said: $(cat "$T/persist.out")"
$PY - "$BACKEND" <<'PY'
import sys, torch
sd = torch.load(f"{sys.argv[1]}/step_8/model.pt")
assert torch.equal(sd["w"], torch.full((256, 1024), 8.0))
PY
expect_eq persisted "$(state_of "$MNT/step_8/optim.pt")" "state after persist"
"$CKPTFS" persist "$MNT/step_9" > "$T/persist.out"
grep -q "drains already" "$T/persist.out" || fail "persist of a draining step: $(cat "$T/persist.out")"
rc=0
"$CKPTFS" persist /tmp > "$T/persist.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "not in a ckptfs mount" "$T/persist.out" || fail "persist outside: $(cat "$T/persist.out")"
# Moving a file out of a memory-only step is a copy (EXDEV for rename).
mv "$MNT/step_7/optim.pt" "$MNT/optim-7.pt"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
same_bytes "$MNT/optim-7.pt" "$BACKEND/optim-7.pt" || fail "a file moved out of a memory-only step did not drain"
[ ! -e "$BACKEND/step_7" ] || fail "step_7 reached the backend"
umount_fs
# The tier holds memory-only steps (4, 7): it is kept, and says why.
grep -q "memory-only" "$T/umount.out" || fail "umount did not say why the tier stays: $(cat "$T/umount.out")"
mount_fs --persist-every 3 --cache-size 512M
expect_eq memory-only "$(state_of "$MNT/step_4/model.pt")" "memory-only after a remount"
same_bytes "$MNT/step_6/model.pt" "$BACKEND/step_6/model.pt" || fail "step_6 after the remount"
rm -r "$MNT"/step_* "$MNT/latest" "$MNT/optim-7.pt"
umount_fs

# --keep-in-memory 2 with a 64M budget and 12M steps: after four steps the
# evaluator reads steps 1 and 2 again, so plain LRU would evict steps 3 and
# 4 first when a 24M file needs room; the newest two are kept instead.
rm -rf "${BACKEND:?}"/* "$STATE"
rm_tier "$TIER"
mount_fs --keep-in-memory 2 --cache-size 64M
$PY - "$MNT" <<'PY'
import os, sys, torch
m = sys.argv[1]
for step in range(1, 5):
    os.makedirs(f"{m}/step_{step}")
    torch.save({"w": torch.full((3 << 20,), float(step))}, f"{m}/step_{step}/model.pt")  # 12 MiB
PY
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
cat "$MNT/step_1/model.pt" "$MNT/step_2/model.pt" > /dev/null  # the evaluator
head -c 24M /dev/urandom > "$MNT/scratch.bin"
for s in 3 4; do
  expect_eq persisted "$(state_of "$MNT/step_$s/model.pt")" "step_$s (among the newest 2) stays in RAM"
done
expect_eq remote "$(state_of "$MNT/step_1/model.pt")" "the oldest step made the room"
umount_fs
check_log
