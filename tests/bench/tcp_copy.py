#!/usr/bin/python3
"""tcp_copy.py — what loopback TCP carries from one tmpfs file to another,
without ckptfs (tests/bench/replicas.sh's baseline for the replica link):
a child process receives into DST (4 MiB recv_into, then write), the parent
sends SRC, either read + send (the link's copies: pread into a buffer, the
socket's copy in, its copy out, the write into the file) or sendfile (the
sender's copy skipped). DST is written over in place when it exists: the
holder lands a replica in the pages of the last one it dropped.

    tcp_copy.py SRC DST copy|sendfile REPS   -> one "GB/s" figure a line
"""
import os
import socket
import sys
import time

BUF = 4 << 20


def receive(ls, dst, size):
    c, _ = ls.accept()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o600)
    buf = bytearray(BUF)
    mv = memoryview(buf)
    got = 0
    while got < size:
        n = c.recv_into(mv)
        if n == 0:
            break
        os.pwrite(fd, mv[:n], got)
        got += n
    os.close(fd)
    c.sendall(b"k" if got == size else b"x")


def one(src, dst, mode):
    size = os.path.getsize(src)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    pid = os.fork()
    if pid == 0:
        try:
            receive(ls, dst, size)
        finally:
            os._exit(0)
    s = socket.create_connection(ls.getsockname())
    fd = os.open(src, os.O_RDONLY)
    t = time.monotonic()
    if mode == "sendfile":
        off = 0
        while off < size:
            off += os.sendfile(s.fileno(), fd, off, size - off)
    else:
        mv = memoryview(bytearray(BUF))
        off = 0
        while off < size:
            n = os.preadv(fd, [mv], off)
            s.sendall(mv[:n])
            off += n
    ok = s.recv(1) == b"k"
    dt = time.monotonic() - t
    os.close(fd)
    s.close()
    ls.close()
    os.waitpid(pid, 0)
    if not ok:
        sys.exit("tcp_copy: the receiver got fewer bytes than were sent")
    return size / dt / 1e9


def main():
    if len(sys.argv) != 5 or sys.argv[3] not in ("copy", "sendfile"):
        sys.exit(__doc__)
    for _ in range(int(sys.argv[4])):
        print(f"{one(sys.argv[1], sys.argv[2], sys.argv[3]):.3f}", flush=True)


if __name__ == "__main__":
    main()
