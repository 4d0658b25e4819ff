#!/usr/bin/env bash
# A fresh mount over a prefix that already holds objects shows them: files
# written by another tool (no ckptfs metadata), odd names, nested keys with
# no directory markers, an empty directory marker, files an earlier ckptfs
# mount wrote (with checksums), and 40 more read through listing pages of 7
# keys (CKPTFS_S3_LIST_MAX_KEYS). They are `remote`, read back byte for
# byte, and become `persisted`. Keys outside the prefix do not appear; keys
# with a "..", "." or empty component are refused (no entry, not even under
# a folded name) and logged. A directory rename then moves every object.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
source "$LIB/s3.sh"
s3_start
P=team/ckpts

# An earlier ckptfs mount writes part of the prefix (checksums in metadata).
mount_s3 "$P" --cache-size 64M --state-dir "$T/state1"
mkdir "$MNT/from_ckptfs"
head -c 3M /dev/urandom > "$T/ck_a"
cp "$T/ck_a" "$MNT/from_ckptfs/a.bin"
umount_fs

# Other tools write the rest, and keys around the prefix.
mkdir -p "$T/ref/step_100" "$T/ref/a/b/c" "$T/ref/many" "$T/ref/ünï"
head -c 6M /dev/urandom > "$T/ref/step_100/model.pt"   # > 5 MiB: fetched in ranges
head -c 1M /dev/urandom > "$T/ref/step_100/optim.pt"
echo "deep" > "$T/ref/a/b/c/deep.bin"
echo "odd name" > "$T/ref/notes with space & plus+.txt"
echo "unicode" > "$T/ref/ünï/cödé.bin"
for i in $(seq -w 0 39); do echo "file $i" > "$T/ref/many/f0$i"; done
"$PY" - "$LIB" "$T/ref" "$P" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[1])
import s3c
ref, p = sys.argv[2], sys.argv[3]
for d, _, files in os.walk(ref):
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), ref)
        s3c.put(f"{p}/{rel}", open(os.path.join(d, f), "rb").read())
s3c.put(f"{p}/empty_dir/", b"")                      # a directory marker
for k in ("team/ckpts-other/x", "team/y", "other/z"):  # outside the prefix
    s3c.put(k, b"outside")
for k in ("bad1/../evil", "bad2//empty", "bad3/./dot"):  # refused
    s3c.put(f"{p}/{k}", b"refused")
PY
grep -q "^$P/bad1/\.\./evil	" <(s3c list "$P/") || fail "s3rver did not keep the key with '..'"

export CKPTFS_S3_LIST_MAX_KEYS=7
STATE=$T/state2  # a new node: fresh state dir and tier
mount_s3 "$P" --cache-size 64M --tier-dir "$TIER-2"
unset CKPTFS_S3_LIST_MAX_KEYS

(cd "$MNT" && find . -mindepth 1 | sed 's|^\./||' | sort) > "$T/names"
cat > "$T/want" <<NAMES
a
a/b
a/b/c
a/b/c/deep.bin
empty_dir
from_ckptfs
from_ckptfs/a.bin
many
$(for i in $(seq -w 0 39); do echo "many/f0$i"; done)
notes with space & plus+.txt
step_100
step_100/model.pt
step_100/optim.pt
ünï
ünï/cödé.bin
NAMES
sort -o "$T/want" "$T/want"
diff "$T/want" "$T/names" > "$T/diff" || { cat "$T/diff"; fail "the mount does not show exactly the objects under the prefix"; }
[ -d "$MNT/empty_dir" ] && [ -z "$(ls -A "$MNT/empty_dir")" ] || fail "empty_dir is not an empty directory"
for k in bad1/../evil bad2//empty bad3/./dot; do
  grep -qF "list: skipping s3://$S3_BUCKET/$P/$k: not a valid path" "$STATE/ckptfs.log" || fail "refused key $k not logged"
done
for f in evil empty dot bad1 bad2 bad3; do
  [ ! -e "$MNT/$f" ] || fail "$f appeared in the mount from a refused key"
done

# Remote, read back intact, then persisted (in memory again).
mkdir -p "$T/ref/from_ckptfs"
cp "$T/ck_a" "$T/ref/from_ckptfs/a.bin"
(cd "$T/ref" && find . -type f | sed 's|^\./||') > "$T/files"
while IFS= read -r rel; do
  expect_eq remote "$(state_of "$MNT/$rel")" "state of $rel before reading"
  expect_eq "$(size_of "$T/ref/$rel")" "$(size_of "$MNT/$rel")" "size of $rel"
done < "$T/files"
while IFS= read -r rel; do
  cmp "$T/ref/$rel" "$MNT/$rel" || fail "$rel read through the mount differs from the object"
  expect_eq persisted "$(state_of "$MNT/$rel")" "state of $rel after reading"
done < "$T/files"
expect_eq 644 "$(stat -c %a "$MNT/step_100/model.pt")" "mode of a file without ckptfs metadata"

# A directory rename is a copy and a delete of every object under it.
mv "$MNT/step_100" "$MNT/step_200"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null
s3c list "$P/" > "$T/after"
! grep -q "^$P/step_100/" "$T/after" || fail "objects left under step_100/ after the rename"
for f in model.pt optim.pt; do
  s3c get "$P/step_200/$f" "$T/got" || fail "GET step_200/$f"
  cmp "$T/ref/step_100/$f" "$T/got" || fail "step_200/$f differs after the rename"
done
grep -q "^team/ckpts-other/x	" <(s3c list team/) || fail "a key outside the prefix was touched"

umount_fs
check_log --allow-errors "list: skipping s3://$S3_BUCKET/$P/bad[123]/"
