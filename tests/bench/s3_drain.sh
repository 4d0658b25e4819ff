#!/usr/bin/env bash
# s3_drain.sh — how fast ckptfs drains a large file to S3, against the AWS
# CLI uploading the same file to the same server (s3rver on loopback, from
# tests/s3/s3rver.sh). Not part of `make test`.
#
#   tests/bench/s3_drain.sh                 4 GiB file, 3 runs of each
#   SIZE=512M N=5 tests/bench/s3_drain.sh   smaller, more runs
#
# ckptfs: the file is copied into a fresh mount (the memory tier, /dev/shm),
# then `ckptfs drain` is timed: from the file's close to the object being in
# the bucket under its final name (multipart upload of the staged copy, then
# the server-side copy to the final key; see docs/s3.md). AWS CLI: `aws s3
# cp` of the same file from /dev/shm (a multipart upload straight to the
# final key), timed whole. Each run writes under a fresh prefix, checks the
# object's size, and deletes it. Prints min/median/max MiB/s of each and the
# ratio of the medians (ckptfs / aws).
#
# Environment: SIZE (default 4G), N (runs, default 3), BUILD (default build),
# AWS (the aws binary; default /usr/bin/aws, else the one on PATH),
# CKPTFS_S3_PART_SIZE / CKPTFS_S3_PARALLEL (ckptfs tuning, passed through).
# Needs awscli (scripts/install-bench-deps.sh) and s3rver
# (scripts/install-deps.sh). Exits 77 when one is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
CKPTFS=$BUILD/ckptfs
SIZE=${SIZE:-4G}
N=${N:-3}
BUCKET=ckptfs-bench

[ -x "$CKPTFS" ] || { echo "s3_drain: no $CKPTFS (make BUILD=...)" >&2; exit 1; }
# The Debian package's aws (awscli 2) first: a pip or pyenv `aws` on PATH
# may be another version.
AWS=${AWS:-$( [ -x /usr/bin/aws ] && echo /usr/bin/aws || command -v aws || true)}
[ -n "$AWS" ] || { echo "s3_drain: SKIP: no aws CLI (scripts/install-bench-deps.sh)" >&2; exit 77; }
bytes=$(numfmt --from=iec "${SIZE%B}") || { echo "s3_drain: bad SIZE '$SIZE'" >&2; exit 2; }

W=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-bench-s3.XXXXXX")
SRC=/dev/shm/ckptfs-bench-s3-src-$$
TIER=/dev/shm/ckptfs-bench-s3-tier-$$
MNT=$W/mnt
cleanup() {
  set +e
  findmnt -n -M "$MNT" > /dev/null 2>&1 && { "$CKPTFS" umount "$MNT" --no-drain || fusermount3 -uz "$MNT"; }
  "$ROOT/tests/s3/s3rver.sh" stop "$W/s3"
  findmnt -n -M "$TIER" > /dev/null 2>&1 && umount -l "$TIER"
  rm -rf "$W" "$SRC" "$TIER"
}
trap cleanup EXIT
mkdir -p "$MNT"

rc=0
PORT=$("$ROOT/tests/s3/s3rver.sh" start "$W/s3" 0 "$BUCKET") || rc=$?
[ "$rc" = 77 ] && { echo "s3_drain: SKIP: s3rver not installed (scripts/install-deps.sh)" >&2; exit 77; }
[ "$rc" = 0 ] || exit 1
EP=http://127.0.0.1:$PORT
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_CONFIG_FILE=$W/aws-config AWS_SHARED_CREDENTIALS_FILE=$W/aws-credentials AWS_PAGER=""
: > "$AWS_CONFIG_FILE"
: > "$AWS_SHARED_CREDENTIALS_FILE"
awscli() { "$AWS" --endpoint-url "$EP" --no-cli-pager "$@"; }

now() { date +%s.%N; }
object_size() { awscli s3api head-object --bucket "$BUCKET" --key "$1" --query ContentLength --output text; }

echo "s3_drain: $SIZE ($bytes bytes), $N runs each, s3rver at $EP, data in $W, $("$AWS" --version)"
echo "s3_drain: ckptfs part size ${CKPTFS_S3_PART_SIZE:-16M}, ${CKPTFS_S3_PARALLEL:-4} in flight;" \
  "aws CLI defaults (8 MiB parts, 10 in flight)"
head -c "$bytes" /dev/urandom > "$SRC"

ck=() cli=()
for run in $(seq "$N"); do
  "$CKPTFS" mount "$MNT" --backend "s3://$BUCKET/ck-$run" --s3-endpoint "$EP" --state-dir "$W/state-$run" \
    --tier-dir "$TIER" --cache-size $((bytes + (256 << 20))) > /dev/null
  t0=$(now)
  cp "$SRC" "$MNT/f"
  t1=$(now)
  "$CKPTFS" drain "$MNT" --timeout 3600 2> "$W/drain.err" || { cat "$W/drain.err" >&2; exit 1; }
  t2=$(now)
  "$CKPTFS" umount "$MNT" > "$W/umount.out" 2>&1 || { cat "$W/umount.out" >&2; exit 1; }
  findmnt -n -M "$TIER" > /dev/null 2>&1 && umount -l "$TIER"  # its tmpfs (--tier-huge), if the tier was kept
  rm -rf "$TIER"
  [ "$(object_size "ck-$run/f")" = "$bytes" ] || { echo "s3_drain: ckptfs object has the wrong size" >&2; exit 1; }
  awscli s3 rm --quiet --recursive "s3://$BUCKET/ck-$run/"
  ck+=("$(awk -v b="$bytes" -v a="$t1" -v c="$t2" 'BEGIN { printf "%.1f", b / 1048576 / (c - a) }')")
  w=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN { printf "%.0f", b / 1048576 / (c - a) }')

  t0=$(now)
  awscli s3 cp --quiet "$SRC" "s3://$BUCKET/aws-$run/f"
  t1=$(now)
  [ "$(object_size "aws-$run/f")" = "$bytes" ] || { echo "s3_drain: aws object has the wrong size" >&2; exit 1; }
  awscli s3 rm --quiet --recursive "s3://$BUCKET/aws-$run/"
  cli+=("$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN { printf "%.1f", b / 1048576 / (c - a) }')")
  echo "run $run: ckptfs drain ${ck[-1]} MiB/s (write into the mount $w MiB/s), aws s3 cp ${cli[-1]} MiB/s"
done

stats() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "min %.1f  median %.1f  max %.1f MiB/s", v[1], m, v[NR] }'; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "ckptfs drain:  $(stats "${ck[@]}")"
echo "aws s3 cp:     $(stats "${cli[@]}")"
awk -v a="$(median "${ck[@]}")" -v b="$(median "${cli[@]}")" 'BEGIN { printf "ratio (median ckptfs / median aws): %.2f\n", a / b }'
