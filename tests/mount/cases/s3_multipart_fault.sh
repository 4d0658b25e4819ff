#!/usr/bin/env bash
# The S3 server dies in the middle of a multipart upload (SIGKILL once its
# first parts are on disk) and comes back on the same port and data dir.
# The drain notices (status in error), resumes by itself, and then: the file
# is in the bucket byte for byte, a file written while the server was down
# too; a poller listing the bucket all along never saw the final key with a
# partial size; the upload cut short was aborted (no multipart upload left,
# through the API and on s3rver's disk) and no staged object is left.
# serial: restarts s3rver on the port it had; another case may take a free port meanwhile
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
PREFIX=ck
SIZE=$((96 << 20))

# 5 MiB parts, 2 in flight: 20 parts, slow enough to cut in the middle.
# 3 attempts per request: the stage fails fast while the server is down.
export CKPTFS_S3_PART_SIZE=5M CKPTFS_S3_PARALLEL=2 CKPTFS_S3_MAX_ATTEMPTS=3
mount_s3 "$PREFIX" --cache-size 512M
unset CKPTFS_S3_PART_SIZE CKPTFS_S3_PARALLEL CKPTFS_S3_MAX_ATTEMPTS

cat > "$T/poll.py" <<'PY'
# Lists the bucket until told to stop; records every listing of the final
# key with a size other than the whole file's.
import os, sys, time
sys.path.insert(0, sys.argv[1])
import s3c
prefix, size, stop = sys.argv[2], int(sys.argv[3]), sys.argv[4]
seen = bad = 0
while not os.path.exists(stop):
    try:
        objs = dict(s3c.list_objects(prefix + "/"))
    except s3c.S3Error:
        time.sleep(0.05); continue  # the server is down
    seen += 1
    got = objs.get(prefix + "/big.bin")
    if got is not None and got != size:
        bad += 1
        print(f"final key listed with {got} of {size} bytes", flush=True)
    time.sleep(0.03)
print(f"poller: {seen} listings, {bad} partial")
sys.exit(1 if bad or seen < 5 else 0)
PY
"$PY" "$T/poll.py" "$LIB" "$PREFIX" "$SIZE" "$T/stop" > "$T/poll.out" 2>&1 &
poller=$!

head -c "$SIZE" /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/big.bin"

# Kill the server once the upload has parts on disk.
uploads=$S3_DATA/$S3_BUCKET/._S3rver_uploads
for _ in $(seq 2000); do
  compgen -G "$uploads/*/1" > /dev/null && break
  sleep 0.01
done
compgen -G "$uploads/*/1" > /dev/null || fail "no multipart upload started within 20 s"
s3_kill
nparts=$(find "$uploads" -type f -name '[0-9]*' ! -name '*.md5' | wc -l)
note "killed s3rver with $nparts of 20 parts on disk"
[ "$nparts" -lt 20 ] || fail "the upload was complete before the kill ($nparts parts)"
[ ! -e "$S3_DATA/$S3_BUCKET/$PREFIX/big.bin._S3rver_object" ] || fail "final key exists before the upload completed"

# The drain notices the failure; a file written meanwhile waits its turn.
for _ in $(seq 100); do
  [ "$("$CKPTFS" status "$MNT" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["drain"]["in_error"])')" = True ] && break
  sleep 0.1
done
"$CKPTFS" status "$MNT" --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)["drain"]
assert d["in_error"] and "big.bin" in d["last_error"], d' || fail "status does not show the failing drain"
echo "written while the server was down" > "$MNT/after.txt"
if "$CKPTFS" drain "$MNT" --timeout 1 > /dev/null 2>&1; then fail "drain succeeded with the server down"; fi

s3_restart
"$CKPTFS" drain "$MNT" --timeout 60 > "$T/drain.out" 2>&1 || { cat "$T/drain.out"; fail "drain did not resume"; }
touch "$T/stop"
wait "$poller" || { cat "$T/poll.out"; fail "poller saw a partial object under the final key"; }
cat "$T/poll.out"

s3c get "$PREFIX/big.bin" "$T/got" || fail "GET big.bin"
cmp "$T/ref" "$T/got" || fail "big.bin in the bucket differs from what was written"
s3c get "$PREFIX/after.txt" "$T/got2" || fail "GET after.txt"
expect_eq "written while the server was down" "$(cat "$T/got2")" "after.txt in the bucket"
expect_eq persisted "$(state_of "$MNT/big.bin")" "state of big.bin"
[ -z "$(s3c uploads "$PREFIX/")" ] || fail "multipart uploads left: $(s3c uploads "$PREFIX/")"
[ -z "$(s3_uploads_on_disk)" ] || fail "s3rver still holds uploads: $(s3_uploads_on_disk)"
! s3c list "$PREFIX/" | grep -q '/\.ckptfs-tmp/' || fail "staged objects left: $(s3c list "$PREFIX/")"
grep -q "aborted the multipart upload of .* left behind earlier" "$STATE/ckptfs.log" \
  || fail "the upload cut short was not aborted once the server came back"
grep -q "healthy again" "$STATE/ckptfs.log" || fail "recovery not logged"

umount_fs
check_log --allow-errors "s3 backend: |drain: seq" --allow-warnings "s3 backend: stage: multipart upload of .* left behind"
