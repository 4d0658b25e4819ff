#!/usr/bin/python3
"""writer.py — a trainer-like checkpoint writer for the crash harness.

Per step N it makes step_N/ in the mount, writes a few shards of
deterministic bytes (seeded by seed, step and shard), a real torch.save
file, then — once every file of the step is closed — `latest` holding
"step_N" (rewritten in place, or written to latest.tmp and renamed over
`latest`), and finally deletes the steps older than the last two.

Every operation is journaled outside the mount, one JSON line each, fsynced
before the writer goes on:

    {"op":"begin", "path":P, "sha":H, "size":S, "gen":G}   before open(O_TRUNC)
    {"op":"closed", "path":P, "sha":H, "size":S}            close() returned 0
    {"op":"begin_mkdir"|"mkdir", "path":D}
    {"op":"begin_rmtree"|"rmtree", "path":D}
    {"op":"begin_rename"|"renamed", "path":SRC, "to":DST}
    {"op":"barrier", "path":P, "sha":H}   fsync(P) returned (a mount with
                                          --fsync=backend: P and all before it
                                          are in the backend)
    {"op":"step_done", "step":N}
    {"op":"resumed", "step":N, "sha":H}   a restart read step_N/model.pt back
    {"op":"error", "errno":E, "msg":M, "at":WHAT}   I/O failed; the writer stops
    {"op":"done"}

"begin" comes before the bytes reach the mount, so anything the mount or
the backend shows under P can be checked against the versions begun;
"closed" is the acknowledgement (the file must survive a crash). G says how
to rebuild the bytes: {"shard": [seed, step, shard, size]} or {"blob": F}
(a copy of the torch.save bytes kept next to the journal), which the harness
uses to tell a short file from a wrong one.

Exit status: 0 all steps done, 3 stopped by an I/O error (the daemon died),
2 bad usage, 4 an internal problem (torch.save not deterministic...), 6
stopped at a barrier because a peer rank is gone (multi-node mode).

Multi-node mode (the harness's --nodes N; here --rank R --nranks N
--barrier DIR): one writer per node, each on its own mount of one cluster.
Rank R writes its shards as step_N/shard_<R>_<i>.bin (bytes seeded by the
shard id "<R>_<i>"), then meets the other ranks at a file barrier in DIR,
outside the mount (it creates DIR/<N>.<R> and waits until all N ranks'
files of step N exist, then 0.1 s more, longer than the cluster's ordering
margin; DIR/abort stops it there), journaled as

    {"op":"arrived", "step":N}   every shard of step N closed
    {"op":"passed", "step":N}    every rank arrived
    {"op":"aborted", "step":N}   a peer is gone; the writer stops (exit 6)

After the barrier rank 0 alone writes model.pt and `latest`; then every
rank removes its own copy of the steps older than the last two (with no
shared namespace a mount sees only its own files; rank 0's removal is the
one that removes every rank's shards of the step from the backend).

Run alone:  writer.py MNT JOURNAL --seed 1 --steps 10
The harness imports this module once (torch takes seconds to import) and
forks a child per run.
"""
import argparse
import errno
import hashlib
import io
import json
import os
import random
import shutil
import sys
import time

CHUNK = 512 << 10
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


def shard_bytes(seed, step, shard, size):
    """The deterministic bytes of one shard."""
    return random.Random(f"ckptfs-crash:{seed}:{step}:{shard}").randbytes(size)


def shard_sizes(seed, step):
    """Shard sizes of a step: the first crosses the backend's 4 MiB staging
    chunk (so a kill can land mid-transfer), the others are small."""
    r = random.Random(f"ckptfs-crash-sizes:{seed}:{step}")
    return [r.randrange(4 << 20, 6 << 20)] + [r.randrange(1, 1 << 20) for _ in range(2)]


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Journal:
    """Append-only, one fsynced JSON line per record."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def log(self, **rec):
        rec["t"] = round(time.time(), 4)
        os.write(self.fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fdatasync(self.fd)


class Stopped(Exception):
    """An I/O error in the mount: record it and stop."""


class Aborted(Exception):
    """Multi-node mode: a peer rank is gone (DIR/abort exists)."""


class Writer:
    def __init__(self, mnt, journal, seed, latest_mode, blob_dir, fsync_latest=False, pace_ms=0,
                 rank=0, nranks=1, barrier_dir=None):
        self.mnt = mnt
        self.rank = rank
        self.nranks = nranks
        self.barrier_dir = barrier_dir
        self.pace_ms = pace_ms
        self.fsync_latest = fsync_latest
        self.j = Journal(journal)
        self.seed = seed
        self.latest_mode = latest_mode
        self.blob_dir = blob_dir
        self.at = "start"

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def io(self, what, fn, *args):
        """Runs one mount operation; an OSError (or torch's RuntimeError over
        one) is journaled and stops the writer."""
        self.at = what
        try:
            return fn(*args)
        except OSError as e:
            self.j.log(op="error", errno=e.errno, msg=str(e), at=what)
            raise Stopped(what) from e
        except RuntimeError as e:  # torch's zip writer wraps write errors
            self.j.log(op="error", errno=errno.EIO, msg=f"RuntimeError: {e}", at=what)
            raise Stopped(what) from e

    def write_file(self, rel, data, gen, writer=None, barrier=False):
        """Writes `data` to rel (O_CREAT|O_TRUNC) through `writer(f)` if given
        (torch.save into a Python file object), else in 512 KiB os.write
        calls, `pace_ms` apart (a trainer copying tensors out while it
        writes, so that a crash often finds a file half written); with
        `barrier`, fsyncs before the close and journals the barrier."""
        h = sha(data)
        self.j.log(op="begin", path=rel, sha=h, size=len(data), gen=gen)

        def do():
            if writer is not None:
                with open(self.p(rel), "wb") as f:
                    writer(f)
                return
            fd = os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                off = 0
                while off < len(data):
                    off += os.write(fd, view[off:off + CHUNK])
                    if self.pace_ms and off < len(data):
                        time.sleep(self.pace_ms / 1000)
                if barrier:
                    os.fsync(fd)
                    self.j.log(op="barrier", path=rel, sha=h)
            finally:
                os.close(fd)  # a failing close raises: not acknowledged

        self.io(f"write {rel}", do)
        self.j.log(op="closed", path=rel, sha=h, size=len(data))

    def mkdir(self, rel):
        self.j.log(op="begin_mkdir", path=rel)
        self.io(f"mkdir {rel}", os.mkdir, self.p(rel))
        self.j.log(op="mkdir", path=rel)

    def rmtree(self, rel):
        self.j.log(op="begin_rmtree", path=rel)
        self.io(f"rmtree {rel}", shutil.rmtree, self.p(rel))
        self.j.log(op="rmtree", path=rel)

    def rename(self, src, dst):
        self.j.log(op="begin_rename", path=src, to=dst)
        self.io(f"rename {src}", os.replace, self.p(src), self.p(dst))
        self.j.log(op="renamed", path=src, to=dst)

    def save_step(self, step, model, opt, torch):
        d = f"step_{step}"
        if self.io(f"stat {d}", os.path.lexists, self.p(d)):
            self.rmtree(d)  # a restart redoes a step that never completed
        self.mkdir(d)
        for i, size in enumerate(shard_sizes(self.seed, step)):
            sid = f"{self.rank}_{i}" if self.nranks > 1 else i
            self.write_file(f"{d}/shard_{sid}.bin", shard_bytes(self.seed, step, sid, size),
                            {"shard": [self.seed, step, sid, size]})
        if self.nranks > 1:
            self.barrier(step)
            if self.rank != 0:
                self.rotate(step)
                self.j.log(op="step_done", step=step)
                return
        state = {"step": step, "model": model.state_dict(), "optim": opt.state_dict()}
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        blob = os.path.join(self.blob_dir, sha(data))
        with open(blob, "wb") as f:
            f.write(data)
        self.write_file(f"{d}/model.pt", data, {"blob": blob}, writer=lambda f: torch.save(state, f))
        text = f"step_{step}".encode()
        if self.latest_mode == "rename":
            self.write_file("latest.tmp", text, {"text": text.decode()}, barrier=self.fsync_latest)
            self.rename("latest.tmp", "latest")
        else:
            self.write_file("latest", text, {"text": text.decode()}, barrier=self.fsync_latest)
        self.rotate(step)
        self.j.log(op="step_done", step=step)

    def rotate(self, step):
        for old in range(step - 2, 0, -1):
            if not self.io(f"stat step_{old}", os.path.lexists, self.p(f"step_{old}")):
                break
            self.rmtree(f"step_{old}")

    def barrier(self, step):
        """Multi-node mode: waits until every rank closed its shards of `step`."""
        self.j.log(op="arrived", step=step)
        with open(os.path.join(self.barrier_dir, f"{step}.{self.rank}"), "w"):
            pass
        while True:
            if os.path.exists(os.path.join(self.barrier_dir, "abort")):
                self.j.log(op="aborted", step=step)
                raise Aborted()
            if all(os.path.exists(os.path.join(self.barrier_dir, f"{step}.{r}")) for r in range(self.nranks)):
                break
            time.sleep(0.01)
        time.sleep(0.1)  # longer than the cluster's ordering margin (docs/consistency.md)
        self.j.log(op="passed", step=step)


def make_model(torch, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 192), torch.nn.ReLU(), torch.nn.Linear(192, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def train_step(torch, model, opt, seed, step):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    x = torch.randn(16, 64, generator=g)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def check_torch_save(torch, blob_dir):
    """torch.save must give the same bytes into a BytesIO and a file object,
    or the journal's checksums would blame the filesystem."""
    model, opt = make_model(torch, 7)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    a, b = io.BytesIO(), io.BytesIO()
    torch.save(state, a)
    torch.save(state, b)
    probe = os.path.join(blob_dir, "probe.pt")
    with open(probe, "wb") as f:
        torch.save(state, f)
    with open(probe, "rb") as f:
        c = f.read()
    os.unlink(probe)
    return a.getvalue() == b.getvalue() == c


def run(mnt, journal, seed, steps, compute_ms=0, latest_mode="inplace", resume=False, fsync_latest=False,
        pace_ms=0, rank=0, nranks=1, barrier_dir=None):
    """Writes `steps` steps (after the one `latest` names, with resume).
    Returns the exit status (see the module comment)."""
    import torch  # the harness has imported it already; cheap then
    torch.set_num_threads(1)
    blob_dir = journal + ".blobs"
    os.makedirs(blob_dir, exist_ok=True)
    w = Writer(mnt, journal, seed, latest_mode, blob_dir, fsync_latest, pace_ms, rank, nranks, barrier_dir)
    if not check_torch_save(torch, blob_dir):
        w.j.log(op="internal", msg="torch.save is not deterministic")
        return 4
    model, opt = make_model(torch, seed)
    first = 1
    try:
        if resume:
            # A restarted trainer: find `latest`, load that checkpoint back.
            name = w.io("read latest", lambda: open(w.p("latest"), "rb").read()).decode()
            data = w.io(f"read {name}/model.pt", lambda: open(w.p(f"{name}/model.pt"), "rb").read())
            state = torch.load(io.BytesIO(data))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            first = state["step"] + 1
            w.j.log(op="resumed", step=state["step"], path=f"{name}/model.pt", sha=sha(data))
        w.j.log(op="ready", pid=os.getpid())
        for step in range(first, first + steps):
            train_step(torch, model, opt, seed, step)
            if compute_ms:
                time.sleep(compute_ms / 1000)
            w.save_step(step, model, opt, torch)
    except Stopped:
        return 3
    except Aborted:
        return 6
    w.j.log(op="done")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mnt")
    ap.add_argument("journal")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compute-ms", type=int, default=0)
    ap.add_argument("--latest-mode", choices=["inplace", "rename"], default="inplace")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--fsync-latest", action="store_true", help="fsync latest before its close (a barrier)")
    ap.add_argument("--pace-ms", type=int, default=0, help="pause between 512 KiB writes")
    ap.add_argument("--rank", type=int, default=0, help="multi-node mode: this writer's rank")
    ap.add_argument("--nranks", type=int, default=1, help="multi-node mode: how many ranks")
    ap.add_argument("--barrier", help="multi-node mode: the barrier dir, outside the mount")
    a = ap.parse_args()
    if a.nranks > 1 and not a.barrier:
        ap.error("--nranks > 1 needs --barrier")
    sys.exit(run(a.mnt, a.journal, a.seed, a.steps, a.compute_ms, a.latest_mode, a.resume, a.fsync_latest,
                 a.pace_ms, a.rank, a.nranks, a.barrier))


if __name__ == "__main__":
    main()
