#!/usr/bin/env bash
# drain_trainer against S3: a trainer saves step_1..step_6 with torch.save
# (model + optimizer state dicts), writes `latest` after each step and
# deletes old steps, on a mount whose backend is s3rver. While the (slowed)
# drain runs, a watcher polls the bucket with its own signed GETs and fails
# if `latest` ever names a step whose objects are missing, short or not the
# bytes the trainer wrote. After `ckptfs drain`, every object under the
# prefix is fetched by the test and compared with the file in the mount (and
# the two name sets are equal); no staged object or multipart upload is left.
# Then a checkpoint is evicted from the small tier (state `remote`) and
# torch.load reads it back, fetched from S3, intact.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
PREFIX=jobs/run-1

CKPTFS_DRAIN_DELAY_MS=150 mount_s3 "$PREFIX" --cache-size 160M  # a slowed drain


cat > "$T/watch.py" <<'PY'
# Polls the bucket until told to stop, then once more (the drained state);
# fails if `latest` ever names a step whose objects are missing, short or
# different from what the trainer wrote, and unless it saw step_3 (the
# trainer waits after step 3 until it has) and, once drained, step_6.
import hashlib, json, os, sys, time
prefix, manifest, stop, lib, pause = sys.argv[1:6]
sys.path.insert(0, lib)
import s3c
import watching
def latest():
    try:
        return s3c.get(f"{prefix}/latest").decode()
    except s3c.S3Error as e:
        if e.status == 404:
            return None
        raise
checks, steps, mid = 0, set(), set()
def poll():
    global checks
    step = latest()
    if step is None:
        return
    sums = json.load(open(manifest))
    for n in ("model.pt", "optim.pt"):
        key = f"{prefix}/{step}/{n}"
        try:
            data = s3c.get(key)
        except s3c.S3Error as e:
            if e.status != 404:
                raise
            # Deleted by a later step: fine only if latest moved on meanwhile.
            if latest() != step:
                return
            sys.exit(f"latest names {step} but {key} is missing")
        if hashlib.sha256(data).hexdigest() != sums[f"{step}/{n}"]:
            sys.exit(f"latest names {step} but {key} holds {len(data)} bytes that differ from what was saved")
    if latest() != step:
        return
    checks += 1
    steps.add(step)
    if step != "step_6":
        mid.add(step)
    if step == "step_3":  # the trainer waits there for this sighting
        open(pause, "w").close()
watching.watch(stop, poll, 0.02)
print(f"watcher: {checks} consistent observations of {sorted(steps)}")
# step_3 while the trainer waited, step_6 on the last look: both certain.
if "step_3" not in steps or "step_6" not in steps:
    sys.exit("watcher: too few observations while draining to mean anything")
PY

"$PY" "$T/watch.py" "$PREFIX" "$T/manifest.json" "$T/stop" "$LIB" "$T/pause" > "$T/watch.out" 2>&1 &
watcher=$!
TRAINER_PAUSE=$T/pause "$PY" "$(dirname "$0")/../lib/trainer.py" "$MNT" "$T/manifest.json"
"$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || { cat "$T/drain.out"; fail "ckptfs drain failed"; }
touch "$T/stop"
wait "$watcher" || { cat "$T/watch.out"; fail "the bucket showed an inconsistent checkpoint"; }
cat "$T/watch.out"

# Every object equals its file in the mount, fetched by the test itself.
s3c list "$PREFIX/" > "$T/objects"
: > "$T/obj_files"
: > "$T/obj_dirs"
while IFS=$'\t' read -r key size; do
  rel=${key#"$PREFIX"/}
  case $rel in
    .ckptfs-tmp/*) fail "staged object left behind: $key" ;;
    */) echo "${rel%/}" >> "$T/obj_dirs"; continue ;;
  esac
  echo "$rel" >> "$T/obj_files"
  [ -f "$MNT/$rel" ] || fail "object $key has no file in the mount"
  expect_eq "$(size_of "$MNT/$rel")" "$size" "listed size of $key"
  s3c get "$key" "$T/obj" || fail "GET $key failed"
  cmp "$T/obj" "$MNT/$rel" || fail "object $key differs from $MNT/$rel"
done < "$T/objects"
(cd "$MNT" && find . -type f | sed 's|^\./||' | sort) > "$T/mnt_files"
(cd "$MNT" && find . -mindepth 1 -type d | sed 's|^\./||' | sort) > "$T/mnt_dirs"
sort -o "$T/obj_files" "$T/obj_files"
sort -o "$T/obj_dirs" "$T/obj_dirs"
diff "$T/mnt_files" "$T/obj_files" || fail "files in the mount and objects in the bucket differ"
diff "$T/mnt_dirs" "$T/obj_dirs" || fail "directories in the mount and markers in the bucket differ"
expect_eq "step_5 step_6" "$(tr '\n' ' ' < "$T/mnt_dirs" | sed 's/ $//')" "steps kept"
s3c get "$PREFIX/latest" "$T/latest"
expect_eq step_6 "$(cat "$T/latest")" "latest in the bucket"
[ -z "$(s3c uploads "$PREFIX/")" ] || fail "multipart uploads left: $(s3c uploads "$PREFIX/")"
[ -z "$(s3_uploads_on_disk)" ] || fail "s3rver still holds uploads: $(s3_uploads_on_disk)"
for f in "$MNT"/step_6/*; do expect_eq persisted "$(state_of "$f")" "state of $f"; done

# Evict: a filler needs most of the 160M budget, so the clean checkpoints go.
# The drain then lets the filler's bytes go (its upload is cancelled).
head -c 140M /dev/zero > "$MNT/filler"
rm "$MNT/filler"
"$CKPTFS" drain "$MNT" --timeout 60 > "$T/drain.out" 2>&1 || { cat "$T/drain.out"; fail "drain after the filler"; }
remote=()
for f in "$MNT"/step_5/*.pt "$MNT"/step_6/*.pt; do
  [ "$(state_of "$f")" = remote ] && remote+=("${f#"$MNT"/}")
done
[ ${#remote[@]} -ge 2 ] || fail "the filler did not evict the checkpoints: ${remote[*]:-none} remote"
note "evicted: ${remote[*]}"
"$PY" - "$MNT" "$T/manifest.json" "${remote[@]}" <<'PY'
import hashlib, json, os, sys, torch
mnt, sums, rels = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3:]
for rel in rels:
    p = os.path.join(mnt, rel)
    sd = torch.load(p)  # fetched from S3 and checksum-verified by ckptfs
    assert isinstance(sd, dict) and sd, f"{rel}: loaded {type(sd)}"
    digest = hashlib.sha256(open(p, "rb").read()).hexdigest()
    assert digest == sums[rel], f"{rel}: bytes differ after the fetch"
    if rel.endswith("model.pt"):
        m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
        m.load_state_dict(sd)
print(f"torch.load of {len(rels)} evicted checkpoint files: intact")
PY
for rel in "${remote[@]}"; do
  s=$(state_of "$MNT/$rel")
  [ "$s" = persisted ] || fail "$rel is '$s' after it was read back"
done

"$CKPTFS" status "$MNT" --json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
assert s["dirty"]["files"] == 0 and s["draining"]["files"] == 0, s
assert s["drain"]["queue"] == 0 and not s["drain"]["in_error"], s["drain"]
assert s["lost"] == [], s["lost"]
'
umount_fs
check_log
