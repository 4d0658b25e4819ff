#!/usr/bin/env python3
"""fsstress.py — random namespace and data operations, in the spirit of
xfstests' fsstress (which Debian does not package): N processes, each with
its own directory pN, doing OPS random operations with a fixed seed each.
Writes, overwrites, appends, truncates, fallocate (incl. punching holes),
fsync, renames (over existing files too), hard links, unlinks, symlinks,
mkdir/rmdir, chmod and utime. Errors that the operation's random choice
makes possible (ENOENT, EEXIST, ENOTEMPTY, ...) are expected; anything
else is printed and fails the run.

    fsstress.py DIR [--procs 4] [--ops 2000] [--seed 1]
"""
import argparse
import errno
import os
import random
import sys

EXPECTED = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR, errno.EINVAL, errno.EXDEV}


def pick(rng, base, kind):
    # Few names, so operations meet each other's files often.
    sub = rng.choice(["", "d0/", "d1/", "d0/d2/"])
    return os.path.join(base, sub + f"{kind}{rng.randrange(6)}")


def one_op(rng, base):
    op = rng.choice(["write", "write", "write", "append", "overwrite", "truncate", "punch", "fsync", "rename",
                     "rename", "link", "unlink", "symlink", "mkdir", "rmdir", "chmod", "utime", "read"])
    f = pick(rng, base, "f")
    g = pick(rng, base, "f")
    if op == "write":
        with open(f, "wb") as h:
            h.write(os.urandom(rng.choice([0, 1, 100, 4096, 65536, 300000])))
    elif op == "append":
        with open(f, "ab") as h:
            h.write(os.urandom(rng.randrange(1, 20000)))
    elif op == "overwrite":
        fd = os.open(f, os.O_WRONLY)
        try:
            os.pwrite(fd, os.urandom(rng.randrange(1, 10000)), rng.randrange(0, 200000))
        finally:
            os.close(fd)
    elif op == "truncate":
        os.truncate(f, rng.randrange(0, 300000))
    elif op == "punch":
        fd = os.open(f, os.O_RDWR)
        try:
            # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE through os.posix_fallocate is not possible:
            # plain fallocate grows the file instead.
            os.posix_fallocate(fd, rng.randrange(0, 100000), rng.randrange(1, 100000))
        finally:
            os.close(fd)
    elif op == "fsync":
        fd = os.open(f, os.O_RDWR)
        try:
            os.write(fd, os.urandom(rng.randrange(1, 5000)))
            os.fsync(fd)
        finally:
            os.close(fd)
    elif op == "rename":
        os.rename(f, g)
    elif op == "link":
        os.link(f, g)
    elif op == "unlink":
        os.unlink(f)
    elif op == "symlink":
        os.symlink("target-" + str(rng.randrange(100)), pick(rng, base, "l"))
    elif op == "mkdir":
        os.mkdir(os.path.join(base, rng.choice(["d0", "d1", "d0/d2", "d3"])))
    elif op == "rmdir":
        os.rmdir(os.path.join(base, rng.choice(["d0", "d1", "d0/d2", "d3"])))
    elif op == "chmod":
        os.chmod(f, rng.choice([0o600, 0o644, 0o755]))
    elif op == "utime":
        os.utime(f, (rng.randrange(1 << 30), rng.randrange(1 << 30)))
    elif op == "read":
        with open(f, "rb") as h:
            h.read()


def worker(base, ops, seed):
    rng = random.Random(seed)
    os.makedirs(base, exist_ok=True)
    for d in ("d0", "d1", "d0/d2"):
        os.makedirs(os.path.join(base, d), exist_ok=True)
    bad = 0
    for _ in range(ops):
        try:
            one_op(rng, base)
        except OSError as e:
            if e.errno not in EXPECTED:
                print(f"fsstress {base}: {e}", file=sys.stderr)
                bad += 1
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    pids = []
    for p in range(a.procs):
        pid = os.fork()
        if pid == 0:
            bad = worker(os.path.join(a.dir, f"p{p}"), a.ops, a.seed * 1000 + p)
            os._exit(1 if bad else 0)
        pids.append(pid)
    rc = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
