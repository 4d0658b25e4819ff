#!/usr/bin/env bash
# Cross-node ordering over S3 (s3rver): two mounts a and b of one prefix in
# cluster "job", b's drain held (CKPTFS_DRAIN_PAUSE_FILE). a's shard, then
# b's, a barrier, a's `latest`: while b's shard is not in the bucket,
# `latest` never is (watched with the test's own S3 client); once b resumes,
# both are there. The records are objects under PREFIX/.ckptfs-cluster/job/,
# and neither mount shows them.
source "$(dirname "$0")/../lib/common.sh"
source "$(dirname "$0")/../lib/s3.sh"
s3_start

PAUSE=$T/pause-b
S3=(--backend "s3://$S3_BUCKET/run" --s3-endpoint "$S3_ENDPOINT" --cluster job)
mount_node a -- "${S3[@]}" --node a
mount_node b CKPTFS_DRAIN_PAUSE_FILE="$PAUSE" -- "${S3[@]}" --node b
A=$(node_mnt a) B=$(node_mnt b)

touch "$PAUSE"
mkdir "$A/global_step1"
head -c 100000 /dev/urandom > "$A/global_step1/shard_a"
sleep 0.2  # more than the ordering margin: b's files come after a's
# -p, as every rank's makedirs(exist_ok=True): a's mkdir, drained, shows
# on b within the shared namespace's TTL (CI saw EEXIST here).
mkdir -p "$B/global_step1"
head -c 100000 /dev/urandom > "$B/global_step1/shard_b"
sleep 0.2  # the barrier
echo global_step1 > "$A/latest"
# `latest` first, then the shard: a shard never leaves, so `latest` seen
# before a missing shard is an order the backend showed.
for i in $(seq 40); do
  if s3c get run/latest "$T/latest" 2>/dev/null; then
    s3c get run/global_step1/shard_b "$T/shard_b" 2>/dev/null || fail "latest in the bucket while b's shard is not"
  fi
  sleep 0.1
done
s3c get run/global_step1/shard_a "$T/shard_a" || fail "a's shard (closed before b's) not in the bucket"
! s3c get run/latest "$T/latest" 2>/dev/null || fail "latest in the bucket while b is held"
note "latest held for 4 s behind b's shard; a's shard drained"
rm "$PAUSE"
"$CKPTFS" drain "$A" --timeout 60 > /dev/null || fail "a's drain after b resumed"
s3c get run/global_step1/shard_b "$T/shard_b" || fail "b's shard missing after latest drained"
cmp "$B/global_step1/shard_b" "$T/shard_b" || fail "b's shard differs"
s3c get run/latest "$T/latest"
expect_eq global_step1 "$(cat "$T/latest")" "latest in the bucket"

s3c list run/.ckptfs-cluster/job/ > "$T/records"
expect_eq "2" "$(wc -l < "$T/records")" "records in the bucket: $(cat "$T/records")"
[ ! -e "$A/.ckptfs-cluster" ] && [ -z "$(ls -A "$A" | grep ckptfs)" ] || fail "records visible through a mount"
umount_node b
umount_node a
s3c get run/.ckptfs-cluster/job/a "$T/rec-a"
$PY -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["state"] == "left" and r["node"] == "a", r' "$T/rec-a" \
  || fail "a's last record: $(cat "$T/rec-a")"
check_log
