#!/usr/bin/env bash
# No exception leaves a FUSE callback (issue #16, "also found"): with the
# fault fuse.throw on, every callback throws at its top (fs/fuse/fuse_ops.cc
# Guard); each request gets EIO and one log line, the daemon stays up, and
# with the fault off again everything works and the data is intact. With
# fuse.nomem the callbacks throw std::bad_alloc: ENOMEM.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

head -c 1M /dev/urandom > "$T/ref"
for kind in throw nomem; do
  want=EIO
  [ $kind = nomem ] && want=ENOMEM
  rm -f "$T/fault"
  CKPTFS_FAULT=fuse.$kind:$T/fault mount_fs
  mkdir -p "$MNT/d"
  cp "$T/ref" "$MNT/d/a-$kind"
  pid=$(_our_daemons | head -1)
  touch "$T/fault"
  # Names the kernel has not cached: each is a request the daemon answers.
  expect_errno "$want" stat "$MNT/none-$kind"
  expect_errno "$want" mkdir "$MNT/new-$kind"
  expect_errno "$want" open "$MNT/d/b-$kind" w
  alive "$pid" || fail "the daemon died on a throwing callback ($kind)"
  rm "$T/fault"
  expect_errno ENOENT stat "$MNT/none-$kind"
  mkdir "$MNT/new-$kind" || fail "mkdir after the fault ($kind)"
  cmp "$T/ref" "$MNT/d/a-$kind" || fail "d/a-$kind reads back wrong after the fault"
  check_backend
  umount_fs
done
grep -q "internal error: fault fuse.throw" "$STATE/ckptfs.log" || fail "no 'internal error' line for fuse.throw"
check_log --allow-errors "internal error" --allow-warnings "fault fuse"
