#!/usr/bin/env bash
# mmap reads of a file on the mount, as torch.load(mmap=True) and
# safetensors do: MAP_SHARED and MAP_PRIVATE read the right bytes at random
# offsets, through page-cache misses too; a MAP_PRIVATE write stays private;
# a file changed through write(2) is seen by a new mapping.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
head -c $(((64 << 20) + 12345)) /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/f"
drop_caches
$PY - "$T/ref" "$MNT/f" <<'PY'
import mmap, os, random, sys
ref = open(sys.argv[1], "rb").read()
rng = random.Random(5)
with open(sys.argv[2], "rb") as f:
    for access, name in [(mmap.ACCESS_READ, "MAP_SHARED"), (mmap.ACCESS_COPY, "MAP_PRIVATE")]:
        m = mmap.mmap(f.fileno(), 0, access=access)
        assert len(m) == len(ref), (name, len(m))
        for _ in range(2000):
            off = rng.randrange(0, len(ref))
            n = rng.choice([1, 100, 4096, 70000])
            assert m[off:off + n] == ref[off:off + n], f"{name}: bytes at {off} differ"
        assert m[:] == ref, f"{name}: whole mapping differs"
        if access == mmap.ACCESS_COPY:
            m[0:5] = b"XXXXX"
            assert m[0:5] == b"XXXXX"
        m.close()
    # A mapping at an offset.
    m = mmap.mmap(f.fileno(), 1 << 20, access=mmap.ACCESS_READ, offset=32 << 20)
    assert m[:] == ref[32 << 20:33 << 20], "mapping at an offset"
    m.close()
assert open(sys.argv[2], "rb").read(5) == ref[:5], "MAP_PRIVATE write reached the file"
PY
same_bytes "$T/ref" "$MNT/f"
printf 'NEW!' | dd of="$MNT/f" bs=1 seek=4096 conv=notrunc status=none
$PY - "$MNT/f" <<'PY'
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert m[4096:4100] == b"NEW!", m[4096:4100]
PY
umount_fs
check_log
