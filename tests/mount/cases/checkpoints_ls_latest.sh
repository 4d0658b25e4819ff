#!/usr/bin/env bash
# Checkpoints as units (issue #13): `ckptfs ls` and `ckptfs latest` on HF-,
# DeepSpeed- and Lightning-style layouts. A checkpoint with a file still
# open for writing is not `latest`; one is `latest --persisted` only once
# the drain has put every file in the backend; `latest` exits 1 when there
# is none; a bad --checkpoint-regex is refused in one line; each checkpoint
# gets one line in STATE/history.csv once persisted (`ckptfs history`).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

rows() { "$CKPTFS" ls "$MNT" --json > "$T/ls.json" && cat "$T/ls.json"; }
field() {  # field PATH KEY
  $PY -c 'import json,sys
for r in json.load(open(sys.argv[1])):
    if r["path"] == sys.argv[2]: print(r[sys.argv[3]])' "$T/ls.json" "$1" "$2"
}

touch "$T/pause"  # nothing drains until the case says so
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 256M
rc=0
"$CKPTFS" latest "$MNT" > "$T/out" 2> "$T/err" || rc=$?
expect_eq 1 "$rc" "latest on an empty mount"
grep -qF "no complete checkpoint" "$T/err" || fail "latest on an empty mount: $(cat "$T/err")"

# HF Trainer: output_dir/checkpoint-N/ with several files.
mkdir -p "$MNT/hf/checkpoint-500" "$MNT/hf/checkpoint-1000"
for s in 500 1000; do
  head -c 2M /dev/urandom > "$MNT/hf/checkpoint-$s/model.safetensors"
  echo '{}' > "$MNT/hf/checkpoint-$s/trainer_state.json"
  sleep 0.05
done
# DeepSpeed: global_stepN/ shards from ranks, and a `latest` tag file.
mkdir "$MNT/global_step7"
for r in 0 1 2 3; do head -c 1M /dev/urandom > "$MNT/global_step7/mp_rank_0${r}_model_states.pt"; done
echo global_step7 > "$MNT/latest"
sleep 0.05
# Lightning: single files.
head -c 3M /dev/urandom > "$MNT/epoch=2-step=300.ckpt"
rows > /dev/null
expect_eq "hf/checkpoint-500 hf/checkpoint-1000 global_step7 epoch=2-step=300.ckpt" \
  "$($PY -c 'import json,sys; print(" ".join(r["path"] for r in json.load(open(sys.argv[1]))))' "$T/ls.json")" \
  "checkpoints, oldest first"
expect_eq 4 "$(field global_step7 files)" "global_step7 files"
expect_eq $((4 << 20)) "$(field global_step7 bytes)" "global_step7 bytes"
expect_eq "in RAM" "$(field hf/checkpoint-1000 state)" "state with the drain held"
expect_eq "$MNT/epoch=2-step=300.ckpt" "$("$CKPTFS" latest "$MNT")" "latest"
rc=0
"$CKPTFS" latest --persisted "$MNT" > /dev/null 2>&1 || rc=$?
expect_eq 1 "$rc" "latest --persisted before the drain"
"$CKPTFS" ls "$MNT" > "$T/ls.txt"
grep -qE "^global_step7 +4 +4.0 MiB +in RAM " "$T/ls.txt" || fail "text ls: $(cat "$T/ls.txt")"

# A newer checkpoint with a file still open: not latest.
mkdir "$MNT/global_step8"
exec 7> "$MNT/global_step8/mp_rank_00_model_states.pt"
echo partial >&7
rows > /dev/null
expect_eq writing "$(field global_step8 state)" "state of a checkpoint being written"
expect_eq False "$(field global_step8 complete)" "complete while a file is open"
expect_eq "$MNT/epoch=2-step=300.ckpt" "$("$CKPTFS" latest "$MNT")" "latest while global_step8 is written"
exec 7>&-
sleep 0.2  # the close's release
expect_eq "$MNT/global_step8" "$("$CKPTFS" latest "$MNT")" "latest once global_step8 is closed"

# The drain: persisted, with a time to durable.
rm "$T/pause"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "drain"
rows > /dev/null
expect_eq persisted "$(field global_step8 state)" "state after the drain"
expect_eq "$MNT/global_step8" "$("$CKPTFS" latest --persisted "$MNT")" "latest --persisted after the drain"
$PY -c 'import json,sys
r=[r for r in json.load(open(sys.argv[1])) if r["path"]=="global_step7"][0]
assert r["time_to_durable_s"] >= 0 and r["time_to_ram_s"] >= 0, r' "$T/ls.json" || fail "times: $(cat "$T/ls.json")"

# History: one line per checkpoint once persisted (the daemon looks once a
# second after the drain applied something).
for _ in $(seq 50); do
  [ "$(grep -c . "$STATE/history.csv" 2> /dev/null || echo 0)" -ge 6 ] && break
  sleep 0.1
done
"$CKPTFS" history "$MNT" --csv > "$T/history.csv"
note "history: $(cat "$T/history.csv")"
head -1 "$T/history.csv" | grep -qF "checkpoint,files,bytes,closed_at,time_to_ram_s,time_to_durable_s,drain_mb_s"   || fail "history header: $(head -1 "$T/history.csv")"
for c in hf/checkpoint-500 hf/checkpoint-1000 global_step7 global_step8 epoch=2-step=300.ckpt; do
  expect_eq 1 "$(grep -c "^$c," "$T/history.csv")" "history lines for $c"
done
grep -q "^global_step7,4,4194304,20[0-9-]*T[0-9:]*Z," "$T/history.csv" || fail "history row: $(grep global_step7 "$T/history.csv")"
"$CKPTFS" history "$MNT" | grep -qE "^global_step7 +4 +4.0 MiB" || fail "history table: $("$CKPTFS" history "$MNT")"

# Rotation: the oldest goes; ls follows.
rm -r "$MNT/hf/checkpoint-500"
rows > /dev/null
[ -z "$(field hf/checkpoint-500 path)" ] || fail "a removed checkpoint is still listed"
umount_fs

# A pattern of one's own; bad ones refused.
mount_fs --cache-size 256M --checkpoint-regex 'ckpt_[0-9]+'
mkdir "$MNT/ckpt_3" && echo x > "$MNT/ckpt_3/w"
expect_eq "$MNT/ckpt_3" "$("$CKPTFS" latest "$MNT")" "latest with --checkpoint-regex"
# Only the checkpoint's own name must match: a directory above it with a
# newline would make `$(ckptfs latest)` two paths. Refused, with the path escaped.
mkdir -p "$MNT/run"$'\n'"x/ckpt_4" && echo x > "$MNT/run"$'\n'"x/ckpt_4/w"
rc=0
"$CKPTFS" latest "$MNT" > "$T/out" 2> "$T/err" || rc=$?
expect_eq 1 "$rc" "latest of a path with a newline"
[ ! -s "$T/out" ] || fail "latest printed a path with a newline: $(cat "$T/out")"
grep -qF 'run\nx/ckpt_4' "$T/err" || fail "latest of a path with a newline: $(cat "$T/err")"
# A backslash is harmless in $(...): printed as it is.
mkdir -p "$MNT/back\\slash/ckpt_5" && echo x > "$MNT/back\\slash/ckpt_5/w"
expect_eq "$MNT/back\\slash/ckpt_5" "$("$CKPTFS" latest "$MNT")" "latest under a directory with a backslash"
umount_fs
for bad in '(' ''; do
  expect_mount_refused "invalid --checkpoint-regex" "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" \
    --checkpoint-regex "$bad"
done
check_log
