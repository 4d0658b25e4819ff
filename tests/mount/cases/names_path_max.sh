#!/usr/bin/env bash
# Paths near and past PATH_MAX, as pjdfstest's */03.t make them: PATH_MAX
# bounds the path one system call takes (relative to its working
# directory), not how deep a tree goes, so a 4095-byte path works from the
# mount's root, from a directory below it (4099 bytes from the root) and
# from the bottom of such a tree (past 8 KiB from the root); a 4096-byte
# path is ENAMETOOLONG from the kernel, a 256-byte name from the daemon.
# Create, mkdir, symlink, link, rename, chmod, chown, truncate and unlink at
# full length; the drain persists all of it under a backend root with a
# long path of its own, and after a remount `ckptfs warmup` fetches every
# file back from the backend. Trees are compared through directory
# descriptors (os.fwalk): no path string names their deepest entries.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

# A backend root whose own path is about 200 bytes longer than $T's.
BACKEND=$T/$(printf 'b%.0s' $(seq 1 100))/$(printf 'c%.0s' $(seq 1 100))
mkdir -p "$BACKEND"
mount_fs

cat > "$T/tree.py" <<'PY'
import os, stat, sys

def tree(top):
    """{relative path: (kind, mode, uid, gid, bytes or target, nlink)} of
    everything under top, read through directory descriptors."""
    out = {}
    for dirpath, dirs, files, dfd in os.fwalk(top):
        rel = os.path.relpath(dirpath, top)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != ".ckptfs-tmp"]
            files = [f for f in files if f != ".ckptfs-tmp"]
        for name in dirs + files:
            p = name if rel == "." else rel + "/" + name
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                data, kind = os.readlink(name, dir_fd=dfd), "l"
            elif stat.S_ISDIR(st.st_mode):
                data, kind = None, "d"
            else:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                with os.fdopen(fd, "rb") as f:
                    data, kind = f.read(), "f"
            nlink = st.st_nlink if kind == "f" else 0
            mode = stat.S_IMODE(st.st_mode) if kind != "l" else 0
            out[p] = (kind, mode, st.st_uid, st.st_gid, data, nlink)
    return out

def states(top):
    """The user.ckptfs.state of every regular file under top."""
    out = {}
    for dirpath, _, files, dfd in os.fwalk(top):
        for name in files:
            p = f"/proc/self/fd/{dfd}/{name}"  # the name beneath the open directory
            if stat.S_ISREG(os.lstat(p).st_mode):
                out[os.path.relpath(dirpath, top) + "/" + name] = os.getxattr(p, "user.ckptfs.state").decode()
    return out

def compare(a, b):
    ta, tb = tree(a), tree(b)
    bad = sorted(set(ta) ^ set(tb))
    for p in bad[:5]:
        print(f"only in {'mount' if p in ta else 'backend'}: {p[:60]}...{p[-40:]} ({len(p)} bytes)")
    for p in sorted(set(ta) & set(tb)):
        if ta[p] != tb[p]:
            print(f"differs: ...{p[-40:]} ({len(p)} bytes): {ta[p][:4]} vs {tb[p][:4]}")
            bad.append(p)
    longest = max((len(p) for p in ta), default=0)
    print(f"{len(ta)} entries compared, the longest path {longest} bytes")
    return not bad

if __name__ == "__main__":
    sys.exit(0 if compare(sys.argv[1], sys.argv[2]) else 1)
PY

# pjdfstest's dirgen_max: components of NAME_MAX/2 bytes, 4095 bytes in all.
$PY - "$MNT" > "$T/make.out" 2>&1 <<'PY' || fail "making the long paths failed: $(tail -n 1 "$T/make.out" | cut -c 1-200)"
import errno, os, sys
mnt = sys.argv[1]

def dirgen_max(c):
    p = ""
    while len(p) < 4095:
        p += c * 127 + "/"
    p = p[:4095]
    return p[:-1] + "x" if p.endswith("/") else p

def expect_err(err, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        assert e.errno == err, f"{fn.__name__}: {errno.errorcode[e.errno]}, want {errno.errorcode[err]}"
        return
    raise AssertionError(f"{fn.__name__} at {len(args[-1])} bytes succeeded, want {errno.errorcode[err]}")

def at_full_length(tag):
    """What */03.t do, from the working directory: every call's path is
    4095 bytes."""
    nx = dirgen_max(tag)
    assert len(nx) == 4095
    parent, leaf = nx.rsplit("/", 1)
    os.makedirs(parent)
    with open(nx, "wb") as f:  # open/03.t, truncate/03.t
        f.write(tag.encode() * 5000)
    os.truncate(nx, 4000)
    os.chmod(nx, 0o640)  # chmod/03.t
    os.chown(nx, 65534, 65534)  # chown/03.t
    os.link(nx, "n0-" + tag)  # link/03.t, both ways
    os.unlink(nx)
    os.link("n0-" + tag, nx)
    assert os.stat(nx).st_nlink == 2
    os.rename(nx, "n1-" + tag)  # rename/03.t, both ways
    os.rename("n1-" + tag, nx)
    os.mkdir(parent + "/d" + leaf[1:])  # mkdir/03.t, rmdir/03.t
    os.rmdir(parent + "/d" + leaf[1:])
    os.mkdir(parent + "/e" + leaf[1:], 0o710)
    os.symlink("test", parent + "/s" + leaf[1:])  # symlink/03.t
    assert os.readlink(parent + "/s" + leaf[1:]) == "test"
    with open(parent + "/u" + leaf[1:], "w") as f:  # unlink/03.t
        f.write("gone")
    os.unlink(parent + "/u" + leaf[1:])
    with open(parent + "/k" + leaf[1:], "wb") as f:  # kept, under no shorter name
        f.write(os.urandom(70000))
    # One byte more is the kernel's to refuse, a 256-byte name the daemon's.
    expect_err(errno.ENAMETOOLONG, os.open, nx + "x", os.O_CREAT | os.O_WRONLY)
    expect_err(errno.ENAMETOOLONG, os.mkdir, nx + "x")
    expect_err(errno.ENAMETOOLONG, os.link, "n0-" + tag, nx + "x")
    expect_err(errno.ENAMETOOLONG, os.symlink, "test", parent + "/" + "n" * 256)
    return parent

os.chdir(mnt)
at_full_length("a")  # 4095 bytes from the root
os.mkdir("pjd")
os.chdir("pjd")
deep = at_full_length("b")  # 4099 bytes from the root, as in a test directory
os.chdir(deep)
at_full_length("c")  # past 8 KiB from the root
PY

"$CKPTFS" drain "$MNT" --timeout 120 > "$T/drain.out" 2>&1 || { cat "$T/drain.out" >&2; fail "ckptfs drain failed"; }
$PY "$T/tree.py" "$MNT" "$BACKEND" > "$T/cmp.out" 2>&1 || { cat "$T/cmp.out" >&2; fail "backend differs from the mount after the drain"; }
note "after the drain: $(tail -n 1 "$T/cmp.out")"
$PY - "$MNT" "$T" <<'PY'
import pickle, sys
sys.path.insert(0, sys.argv[2])
from tree import tree
pickle.dump(tree(sys.argv[1]), open(sys.argv[2] + "/mount.tree", "wb"))
PY
[ -z "$(staged_left "$BACKEND")" ] || fail "staged files left: $(staged_left "$BACKEND")"

# The memory tier goes at unmount: every file is remote. `ckptfs warmup`
# fetches them all back (it opens each through its directory: no path
# string names the deepest), then they read as before, and as the backend.
remount_fs
$PY - "$MNT" "$T" <<'PY' || fail "not every file is remote after the remount"
import sys
sys.path.insert(0, sys.argv[2])
from tree import states
got = set(states(sys.argv[1]).values())
assert got == {"remote"}, f"states after the remount: {got}"
PY
"$CKPTFS" warmup "$MNT" > "$T/warmup.out" 2>&1 || { cat "$T/warmup.out" >&2; fail "ckptfs warmup failed"; }
note "$(tail -n 1 "$T/warmup.out")"
$PY - "$MNT" "$T" "$BACKEND" <<'PY' || fail "files still remote after warmup, or read back different"
import pickle, sys
sys.path.insert(0, sys.argv[2])
from tree import compare, states, tree
left = [p for p, s in states(sys.argv[1]).items() if s == "remote"]
assert not left, f"{len(left)} files still remote after warmup, e.g. {len(left[0])} bytes deep"
before = pickle.load(open(sys.argv[2] + "/mount.tree", "rb"))
after = tree(sys.argv[1])
assert after == before, f"{len(set(after) ^ set(before))} paths differ"
assert compare(sys.argv[1], sys.argv[3])
PY
umount_fs
check_log
