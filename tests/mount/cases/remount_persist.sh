#!/usr/bin/env bash
# Metadata and data survive an unmount and a mount with the same state and
# tier dirs: a tree of dirs, files (empty, small, 20 MiB, sparse), modes,
# owners, ns times, xattrs, symlinks, hard links, inode numbers; a second
# remount after more changes (renames, deletes, overwrite) shows those.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

cat > "$T/manifest.py" <<'PY'
# Prints one line per path: type, mode, uid, gid, size, nlink, ino, mtime
# (ns), atime (ns, only for files never read), link target, xattrs, sha256.
import hashlib, os, sys
root = sys.argv[1]
no_read = {"timed"}
rows = []
for dirpath, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(dirs + files) + ([] if dirpath != root else []):
        p = os.path.join(dirpath, name)
        rel = os.path.relpath(p, root)
        digest = ""
        if os.path.isfile(p) and not os.path.islink(p) and name not in no_read:
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest()
        st = os.lstat(p)
        target = os.readlink(p) if os.path.islink(p) else ""
        xa = ""
        if not os.path.islink(p):
            xa = ",".join(f"{k}={os.getxattr(p, k).hex()}" for k in sorted(os.listxattr(p)) if not k.startswith("user.ckptfs."))
        atime = st.st_atime_ns if name in no_read else ""
        rows.append(f"{rel} {st.st_mode:o} {st.st_uid} {st.st_gid} {st.st_size} {st.st_nlink} {st.st_ino} "
                    f"{st.st_mtime_ns} {atime} {target!r} {xa} {digest}")
print("\n".join(rows))
PY

mount_fs
mkdir -p "$MNT/a/b/c" "$MNT/empty_dir" "$MNT/modes"
head -c 20M /dev/urandom > "$MNT/a/big"
echo small > "$MNT/a/b/small"
: > "$MNT/a/b/c/empty"
dd if=/dev/urandom of="$MNT/a/sparse" bs=4k count=1 seek=10000 status=none
echo timed > "$MNT/timed"
ln "$MNT/a/b/small" "$MNT/modes/hardlink"
ln -s ../a/b/small "$MNT/modes/symlink"
ln -s /nonexistent/target "$MNT/dangling"
chmod 0600 "$MNT/a/big"; chmod 0751 "$MNT/a/b"; chmod 4755 "$MNT/a/b/c/empty"; chmod 1777 "$MNT/empty_dir"
chown 1000:2000 "$MNT/a/b/small"
setfattr -n user.note -v "hello" "$MNT/a/big"
setfattr -n user.bin -v 0x000102ff "$MNT/a/b"
setfattr -n user.empty "$MNT/empty_dir"
$PY -c 'import os, sys; os.utime(sys.argv[1], ns=(1_111_111_111_123_456_789, 1_222_222_222_987_654_321))' "$MNT/timed"
touch -h -d '2020-02-02 02:02:02.020202020' "$MNT/modes/symlink"
touch -d '2019-01-01 01:01:01.000000001' "$MNT/a/b/c"
$PY "$T/manifest.py" "$MNT" > "$T/m1"
[ "$(wc -l < "$T/m1")" -ge 13 ] || fail "manifest too short: $(cat "$T/m1")"

remount_fs
$PY "$T/manifest.py" "$MNT" > "$T/m2"
diff "$T/m1" "$T/m2" || fail "tree differs after remount"

# More changes, then another remount.
mv "$MNT/a/b" "$MNT/moved_b"
rm "$MNT/a/sparse"
rm -r "$MNT/empty_dir"
head -c 1M /dev/urandom > "$MNT/a/big"
echo new > "$MNT/moved_b/new"
setfattr -x user.note "$MNT/a/big"
$PY "$T/manifest.py" "$MNT" > "$T/m3"
remount_fs
$PY "$T/manifest.py" "$MNT" > "$T/m4"
diff "$T/m3" "$T/m4" || fail "tree differs after the second remount"
check_backend
umount_fs
check_log
