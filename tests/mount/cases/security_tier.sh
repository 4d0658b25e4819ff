#!/usr/bin/env bash
# The memory tier belongs to one daemon (issue #16 item 2). A second mount
# given the same --tier-dir is refused with one line while the first lives,
# and the first one's files stay whole (it used to delete them as "unknown"
# and the first then published 0-byte files). A tier dir holding a symlink
# (planted as the next inode's tier file, it received that file's bytes) or
# anything else ckptfs did not make is refused, nothing in it touched.
#
# On 4 KiB pages (--tier-huge off): the tier directory is renamed below,
# which a tmpfs mounted on it would refuse; tier_huge checks the same
# refusals with the tier's own tmpfs.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 64M --tier-huge off
head -c 2M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/model.pt"
before=$(ls "$TIER" | sort)
# 1. A second daemon on the same tier dir (another mount point and state).
mkdir -p "$T/mnt2" "$T/backend2"
expect_mount_refused "tier directory .* in use by another ckptfs daemon" "$T/mnt2" --backend "$T/backend2" \
  --state-dir "$T/state2" --tier-dir "$TIER" --cache-size 64M --tier-huge off
[ "$(ls "$TIER" | sort)" = "$before" ] || fail "the second mount changed the first one's tier dir"
cmp "$T/ref" "$MNT/model.pt" || fail "model.pt changed"
"$CKPTFS" drain "$MNT" --timeout 60
cmp "$T/ref" "$BACKEND/model.pt" || fail "the backend got something else than model.pt's bytes"
umount_fs --keep-cache  # the tier stays for the planted entries below

# 2. Planted entries in a tier dir: refused, never followed, never removed.
echo "precious" > "$T/victim"
for kind in symlink fifo foreign dir; do
  case $kind in
    symlink) ln -s "$T/victim" "$TIER/00000000000000ff"; what=00000000000000ff ;;
    fifo) mkfifo "$TIER/00000000000000fe"; what=00000000000000fe ;;
    foreign) echo x > "$TIER/notes.txt"; what=notes.txt ;;
    dir) mkdir "$TIER/0000000000000abc"; what=0000000000000abc ;;
  esac
  expect_mount_refused "tier directory .*$what.*not a file ckptfs made" "$MNT" --backend "$BACKEND" --state-dir "$STATE" \
    --tier-dir "$TIER" --cache-size 64M --tier-huge off
  [ -e "$TIER/$what" ] || [ -L "$TIER/$what" ] || fail "$kind: $what was removed"
  rm -rf "${TIER:?}/$what"
done
[ "$(cat "$T/victim")" = precious ] || fail "the symlink's target was written"
# 3. The tier dir itself a symlink.
mv "$TIER" "$TIER-real"
ln -s "$TIER-real" "$TIER"
expect_mount_refused "tier directory .*not a directory" "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" \
  --cache-size 64M --tier-huge off
rm "$TIER"
mv "$TIER-real" "$TIER"
# Clean again: mounts, and the file is still there.
mount_fs --cache-size 64M --tier-huge off
cmp "$T/ref" "$MNT/model.pt" || fail "model.pt after the refusals"
umount_fs
check_log --allow-errors "tier directory"
