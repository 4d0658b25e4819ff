#!/usr/bin/env bash
# O_APPEND (a seek before the write does not matter; two appenders never
# overwrite each other), O_EXCL (EEXIST on a file and on a dangling
# symlink), O_TRUNC (old bytes gone, new shorter content only), O_CREAT
# mode with the umask, O_RDONLY|O_WRONLY access enforced on the fd.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
$PY - "$MNT" <<'PY'
import errno, os, sys
m = sys.argv[1]
p = f"{m}/app"
with open(p, "wb") as f:
    f.write(b"0123456789")
a = os.open(p, os.O_WRONLY | os.O_APPEND)
b = os.open(p, os.O_WRONLY | os.O_APPEND)
os.lseek(a, 0, os.SEEK_SET)
os.write(a, b"AAAA")
os.write(b, b"BB")
os.lseek(a, 3, os.SEEK_SET)
os.write(a, b"C" * 100_000)
os.write(b, b"D")
os.close(a); os.close(b)
want = b"0123456789AAAABB" + b"C" * 100_000 + b"D"
got = open(p, "rb").read()
assert got == want, f"O_APPEND: got {len(got)} bytes, want {len(want)}"

# O_TRUNC
with open(f"{m}/t", "wb") as f:
    f.write(os.urandom(1 << 20))
fd = os.open(f"{m}/t", os.O_WRONLY | os.O_TRUNC)
assert os.fstat(fd).st_size == 0, "O_TRUNC left a size"
os.write(fd, b"short")
os.close(fd)
assert open(f"{m}/t", "rb").read() == b"short", "O_TRUNC: old bytes survived"

# O_EXCL
try:
    os.open(f"{m}/t", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    sys.exit("O_EXCL on an existing file succeeded")
except FileExistsError:
    pass
os.symlink("nowhere", f"{m}/dangling")
try:
    os.open(f"{m}/dangling", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    sys.exit("O_EXCL through a dangling symlink succeeded")
except FileExistsError:
    pass
assert not os.path.lexists(f"{m}/nowhere"), "O_EXCL created the symlink target"
fd = os.open(f"{m}/excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
os.close(fd)

# Mode from O_CREAT, minus the umask.
os.umask(0o027)
fd = os.open(f"{m}/masked", os.O_WRONLY | os.O_CREAT, 0o666)
os.close(fd)
mode = os.stat(f"{m}/masked").st_mode & 0o7777
assert mode == 0o640, f"O_CREAT 0666 with umask 027 gave {mode:o}"
assert os.stat(f"{m}/excl").st_mode & 0o7777 == 0o640

# Access mode on the fd.
fd = os.open(f"{m}/t", os.O_RDONLY)
try:
    os.write(fd, b"x")
    sys.exit("write on an O_RDONLY fd succeeded")
except OSError as e:
    assert e.errno == errno.EBADF, e
os.close(fd)
fd = os.open(f"{m}/t", os.O_WRONLY)
try:
    os.read(fd, 1)
    sys.exit("read on an O_WRONLY fd succeeded")
except OSError as e:
    assert e.errno == errno.EBADF, e
os.close(fd)

# O_RDWR: read back what this fd wrote, before close; fsync and fdatasync
# succeed, on a file and on a directory.
fd = os.open(f"{m}/rw", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"hello world")
assert os.pread(fd, 100, 0) == b"hello world"
os.fsync(fd)
os.fdatasync(fd)
os.close(fd)
dfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(dfd)
os.close(dfd)
PY
# Shell redirections: > truncates, >> appends.
echo one > "$MNT/sh"; echo two >> "$MNT/sh"; echo three >> "$MNT/sh"
expect_eq "one
two
three" "$(cat "$MNT/sh")" ">> appends"
echo four > "$MNT/sh"
expect_eq four "$(cat "$MNT/sh")" "> truncates"
expect_errno EEXIST open "$MNT/sh" w,creat,excl
expect_errno ENOENT open "$MNT/absent" w
umount_fs
check_log
