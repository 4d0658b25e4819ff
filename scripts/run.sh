#!/usr/bin/env bash
# `make run`: mounts ckptfs at ./mnt on defaults — backend ./var/backend,
# state ./var/state, memory tier on /dev/shm — and says how to use it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BIN=${BUILD:-build}/ckptfs
MNT=$ROOT/mnt
mkdir -p "$MNT" var/backend var/state
if grep -q " $MNT fuse.ckptfs " /proc/mounts 2>/dev/null && stat "$MNT" >/dev/null 2>&1; then
  echo "ckptfs is already mounted at $MNT"
else
  "$BIN" mount "$MNT" --backend "$ROOT/var/backend" --state-dir "$ROOT/var/state" ${CACHE_SIZE:+--cache-size "$CACHE_SIZE"}
fi
cat <<MSG

  Try it:   /usr/bin/python3 -c "import torch; torch.save({'w': torch.randn(1024, 1024)}, '$MNT/ckpt.pt')"
  Look:     ls -l $MNT;  df -h $MNT;  getfattr -n user.ckptfs.state $MNT/ckpt.pt
            $BIN status $MNT
  Log:      $ROOT/var/state/ckptfs.log
  Stop:     make stop    (or: $BIN umount $MNT)
MSG
