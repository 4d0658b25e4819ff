#!/usr/bin/python3
"""fsop.py — run one filesystem call and print how it went.

    fsop.py [--as UID:GID] OP ARGS...

Prints `OK` (followed by a result for calls that return one) or the errno
name (`ENOENT`, `EACCES`, ...) and exits 0; a usage error exits 2. The
shell helpers expect_errno / expect_ok / fsop in common.sh wrap it, so a
case can say `expect_errno ENOTEMPTY rmdir "$MNT/d"`.

--as drops to another uid/gid (supplementary groups cleared) before the
call, for permission tests.

OPs:
  open PATH FLAGS [MODE]   FLAGS: comma list of r,w,rw,creat,excl,trunc,
                           append,directory,nofollow; opens and closes
  write PATH DATA          open(O_WRONLY|O_CREAT|O_TRUNC, 0666), write DATA
  read PATH                read the whole file; prints its length
  stat|lstat PATH          prints mode(octal) uid gid size nlink ino
  mkdir PATH [MODE]        rmdir PATH       unlink PATH      listdir PATH
  rename SRC DST [noreplace|exchange]       (renameat2 through ctypes)
  link SRC DST             symlink TARGET PATH       readlink PATH
  truncate PATH SIZE       chmod PATH MODE  chown PATH UID GID
  utime PATH ATIME_NS MTIME_NS   (either may be `now` or `omit`, utimensat)
  getxattr PATH NAME       setxattr PATH NAME VALUE [create|replace]
  removexattr PATH NAME    listxattr PATH
  fallocate PATH OFF LEN [keep_size|punch_hole]   (fallocate(2) itself)
"""
import ctypes
import ctypes.util
import errno
import os
import sys

AT_FDCWD = -100
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), what)


def _renameat2(src, dst, flags):
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _check(fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags), src)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _ts(v):
    if v == "now":
        return _Timespec(0, UTIME_NOW)
    if v == "omit":
        return _Timespec(0, UTIME_OMIT)
    n = int(v)
    return _Timespec(n // 1_000_000_000, n % 1_000_000_000)


def _utimensat(path, a, m):
    fn = _libc.utimensat
    times = (_Timespec * 2)(_ts(a), _ts(m))
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec), ctypes.c_int]
    _check(fn(AT_FDCWD, os.fsencode(path), times, 0), path)


def _fallocate(path, off, length, mode):
    fn = _libc.fallocate
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(path, os.O_WRONLY)
    try:
        _check(fn(fd, mode, off, length), path)
    finally:
        os.close(fd)


FLAGS = {
    "r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR, "creat": os.O_CREAT,
    "excl": os.O_EXCL, "trunc": os.O_TRUNC, "append": os.O_APPEND,
    "directory": os.O_DIRECTORY, "nofollow": os.O_NOFOLLOW,
}


def run(op, a):
    if op == "open":
        flags = 0
        for f in a[1].split(","):
            flags |= FLAGS[f]
        fd = os.open(a[0], flags, int(a[2], 8) if len(a) > 2 else 0o644)
        os.close(fd)
    elif op == "write":
        fd = os.open(a[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.write(fd, a[1].encode())
        finally:
            os.close(fd)
    elif op == "read":
        with open(a[0], "rb") as f:
            return str(len(f.read()))
    elif op in ("stat", "lstat"):
        st = os.stat(a[0]) if op == "stat" else os.lstat(a[0])
        return "%o %d %d %d %d %d" % (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink, st.st_ino)
    elif op == "mkdir":
        os.mkdir(a[0], int(a[1], 8) if len(a) > 1 else 0o777)
    elif op == "rmdir":
        os.rmdir(a[0])
    elif op == "unlink":
        os.unlink(a[0])
    elif op == "listdir":
        return str(len(os.listdir(a[0])))
    elif op == "rename":
        flag = {"": 0, "noreplace": 1, "exchange": 2}[a[2] if len(a) > 2 else ""]
        _renameat2(a[0], a[1], flag)
    elif op == "link":
        os.link(a[0], a[1])
    elif op == "symlink":
        os.symlink(a[0], a[1])
    elif op == "readlink":
        return os.readlink(a[0])
    elif op == "truncate":
        os.truncate(a[0], int(a[1]))
    elif op == "chmod":
        os.chmod(a[0], int(a[1], 8))
    elif op == "chown":
        os.chown(a[0], int(a[1]), int(a[2]))
    elif op == "utime":
        _utimensat(a[0], a[1], a[2])
    elif op == "getxattr":
        return os.getxattr(a[0], a[1]).decode(errors="backslashreplace")
    elif op == "setxattr":
        flags = {"": 0, "create": os.XATTR_CREATE, "replace": os.XATTR_REPLACE}[a[3] if len(a) > 3 else ""]
        os.setxattr(a[0], a[1], a[2].encode(), flags)
    elif op == "removexattr":
        os.removexattr(a[0], a[1])
    elif op == "listxattr":
        return " ".join(sorted(os.listxattr(a[0])))
    elif op == "fallocate":
        mode = {"": 0, "keep_size": 1, "punch_hole": 3}[a[3] if len(a) > 3 else ""]
        _fallocate(a[0], int(a[1]), int(a[2]), mode)
    else:
        raise KeyError(op)
    return None


def main(argv):
    if len(argv) >= 2 and argv[0] == "--as":
        uid, gid = (int(x) for x in argv[1].split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        argv = argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        out = run(argv[0], argv[1:])
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)))
        return 0
    except (KeyError, IndexError, ValueError) as e:
        print(f"fsop.py: bad usage {argv!r}: {e!r}", file=sys.stderr)
        return 2
    print("OK" if out is None else "OK " + out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
