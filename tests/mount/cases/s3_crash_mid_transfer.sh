#!/usr/bin/env bash
# The daemon dies (failpoint drain.mid_transfer: SIGKILL once the first
# part of a multipart upload is in the store) with an S3 backend. The bucket
# then holds an incomplete upload and no object under the final name. A new
# daemon on the same state dir aborts the leftover upload at mount, resumes
# the drain, and the object arrives byte for byte; nothing staged is left.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
P=crash

export CKPTFS_S3_PART_SIZE=5M CKPTFS_S3_PARALLEL=2 CKPTFS_FAILPOINT=drain.mid_transfer
mount_s3 "$P" --cache-size 256M
unset CKPTFS_S3_PART_SIZE CKPTFS_S3_PARALLEL CKPTFS_FAILPOINT

head -c 48M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/shard.bin"
for _ in $(seq 200); do
  stat "$MNT" > /dev/null 2>&1 || break
  sleep 0.1
done
! stat "$MNT" > /dev/null 2>&1 || fail "the daemon did not die at drain.mid_transfer"
grep -q "failpoint drain.mid_transfer reached" "$STATE/ckptfs.log" || fail "failpoint not logged"

s3c uploads "$P/" > "$T/uploads"
[ "$(wc -l < "$T/uploads")" = 1 ] || fail "expected one upload in progress, got: $(cat "$T/uploads")"
! s3c list "$P/" | grep -q "^$P/shard.bin	" || fail "shard.bin is in the bucket before its upload completed"

mount_s3 "$P" --cache-size 256M   # detaches the dead mount, re-attaches tier and log
grep -q "aborted 1 leftover multipart uploads under s3://$S3_BUCKET/$P/" "$STATE/ckptfs.log" \
  || fail "the leftover upload was not aborted at mount"
"$CKPTFS" drain "$MNT" --timeout 60 > "$T/drain.out" 2>&1 || { cat "$T/drain.out"; fail "drain after the restart"; }
s3c get "$P/shard.bin" "$T/got" || fail "GET shard.bin"
cmp "$T/ref" "$T/got" || fail "shard.bin in the bucket differs from what was written"
same_bytes "$T/ref" "$MNT/shard.bin"
[ -z "$(s3c uploads "$P/")" ] || fail "uploads left: $(s3c uploads "$P/")"
[ -z "$(s3_uploads_on_disk)" ] || fail "s3rver still holds uploads: $(s3_uploads_on_disk)"
! s3c list "$P/" | grep -q '/\.ckptfs-tmp/' || fail "staged objects left: $(s3c list "$P/")"
umount_fs
check_log --allow-errors "failpoint drain.mid_transfer reached"
