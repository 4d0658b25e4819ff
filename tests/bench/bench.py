#!/usr/bin/python3
"""bench.py — the measuring half of `make bench` (tests/bench/run.sh mounts,
this times). Each subcommand does one measured thing in its own process and
prints `metric value unit` lines on stdout; run.sh turns them into CSV rows.

  seq-write PATH BYTES          write BYTES in 1 MiB blocks (open..close timed);
                                --poll-state: then the time until ckptfs says
                                the file is persisted; --pid: the daemon's
                                CPU seconds at close
  seq-read PATH                 read PATH in 1 MiB blocks
  torch-save DIR GIB SHARDS     build a ~GIB GiB model + Adam state, torch.save
                                it as DIR/single/model.pt, then split into
                                SHARDS files under DIR/sharded/; each save's
                                blocked time, and with --after CMD the time
                                from save return until CMD (run with {dir}
                                replaced) exits: the time to durable; with
                                --poll-state, until ckptfs's user.ckptfs.state
                                says every file is persisted (5 ms polling)
  torch-load DIR MODE           a new process loads what torch-save wrote:
                                MODE plain (torch.load) or mmap (see below);
                                --pin keeps the loader on one CPU (as a
                                trainer under taskset/numactl is): see
                                docs/benchmarks.md, "Where a load's round
                                trips go"
  mkfiles DIR COUNT BYTES       create COUNT files of BYTES each
  proc PID                      the daemon's CPU seconds and memory

mmap: torch 1.13 has no torch.load(mmap=True). `mmap` mode does what torch
2.1's mmap=True does, by hand: the whole file is mapped MAP_PRIVATE with
torch.UntypedStorage.from_file(path, shared=False), each tensor record is a
slice of that mapping (zip records are stored uncompressed), and the pickle
is unpickled with a persistent_load that hands out those slices. Nothing is
copied; the figure includes touching every 4 KiB page of every tensor, which
is when the bytes are actually read.
"""
import argparse
import json
import mmap
import os
import pickle
import resource
import struct
import subprocess
import sys
import time
import zipfile

BS = 1 << 20


def out(metric, value, unit):
    print(f"{metric} {value:.6f} {unit}", flush=True)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def seq_write(path, nbytes, poll=False, pid=0):
    buf = os.urandom(BS)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = nbytes
    while left > 0:
        n = os.write(fd, buf if left >= BS else buf[:left])
        left -= n
    os.close(fd)
    t = time.perf_counter() - t0
    if pid:
        out("written_cpu_seconds", cpu_seconds(pid), "s")
    out("write_seconds", t, "s")
    out("write_throughput", nbytes / t / 1e9, "GB/s")
    if poll:
        out("durable_seconds", wait_persisted([path]), "s")


def seq_read(path):
    buf = bytearray(BS)
    mv = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(mv)
            if not n:
                break
            total += n
    t = time.perf_counter() - t0
    out("seconds", t, "s")
    out("throughput", total / t / 1e9, "GB/s")


def build_state(gib):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    width = 2048
    per_layer = (width * width + width) * 4 * 3  # weights + Adam's exp_avg, exp_avg_sq
    layers = max(1, round(gib * 2**30 / per_layer))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = p.detach().clone()
    opt.step()
    for p in model.parameters():
        p.grad = None
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1000}


def shard_state(state, shards):
    """Splits the state into `shards` dicts of about equal bytes."""
    items = [("model/" + k, v) for k, v in state["model"].items()]
    for pid, st in state["optimizer"]["state"].items():
        for k, v in st.items():
            items.append((f"optimizer/{pid}/{k}", v))
    items.sort(key=lambda kv: -kv[1].numel() * kv[1].element_size())
    parts = [{} for _ in range(shards)]
    sizes = [0] * shards
    for k, v in items:
        i = sizes.index(min(sizes))
        parts[i][k] = v
        sizes[i] += v.numel() * v.element_size()
    parts[0]["param_groups"] = state["optimizer"]["param_groups"]
    parts[0]["step"] = state["step"]
    return parts


def wait_persisted(paths, timeout=3600):
    """Polls ckptfs's user.ckptfs.state of `paths` every 5 ms until all are
    persisted; returns the seconds waited. `ckptfs drain` would do, but it
    polls the daemon only every 500 ms."""
    t0 = time.perf_counter()
    left = list(paths)
    while left:
        left = [p for p in left if os.getxattr(p, "user.ckptfs.state") not in (b"persisted", b"remote")]
        if left:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{len(left)} files not persisted after {timeout} s")
            time.sleep(0.005)
    return time.perf_counter() - t0


def host_reported_kib():
    """KiB of free memory this VM has reported to its host so far (free
    page reporting: the host takes those pages back, and the guest's next
    write to one faults on the host), or None where the kernel does not
    say."""
    try:
        with open("/sys/module/page_reporting/parameters/reported_kib") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def prealloc_ready(d):
    """The bytes ckptfs holds pre-allocated for the next passthrough
    writer of the mount `d` (its status, the root's user.ckptfs.status);
    None where `d` is not the root of a ckptfs mount."""
    try:
        st = json.loads(os.getxattr(d, "user.ckptfs.status"))
    except OSError:
        return None
    return st.get("passthrough", {}).get("prealloc_bytes")


def _ckptfs_files(d):
    """The files under `d` if it is on a ckptfs mount (they have a
    user.ckptfs.state), else []."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
    mine = []
    for p in files:
        try:
            os.getxattr(p, "user.ckptfs.state")
            mine.append(p)
        except OSError:
            return []
    return mine


# Seconds of quiet before each timed save or load (BENCH_SETTLE). A trainer
# has minutes between checkpoints; on this VM memory the guest has just
# allocated is backed by the host only seconds later (a write into 1 GiB of
# 2 MiB pages fallocated at once ran at 0.42-0.44 GB/s, 3 s later at 2.7-7.7 GB/s),
# so a pause of 2 s timed the host's catching up, not the save.
SETTLE_SECONDS = float(os.environ.get("BENCH_SETTLE", "6"))


def settle(dirs, pause=None):
    """The quiet between two checkpoints of a trainer (minutes of compute):
    every ckptfs target's files persisted (its drain idle), the page cache's
    dirty pages written back (sync), then `pause` seconds (ckptfs tops up
    its pre-allocated pages then). Not timed. Without it the drain of one
    target's save, or the disk's writeback, would run inside the next
    target's timed save on these 2 cores, which no trainer whose interval
    exceeds its drain time sees."""
    for d in dirs:
        wait_persisted(_ckptfs_files(d))
    os.sync()
    time.sleep(SETTLE_SECONDS if pause is None else pause)


def after(cmd, d, poll):
    """Time to durable after a save into `d`: with `poll`, until ckptfs says
    every file is persisted (xattr), then `cmd` (if any), timed from the
    save's return; returns (poll seconds or None, total seconds or None)."""
    t0 = time.perf_counter()
    tp = None
    if poll:
        tp = wait_persisted([os.path.join(d, f) for f in os.listdir(d)])
    if not cmd:
        return tp, None
    subprocess.run(cmd.replace("{dir}", d), shell=True, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return tp, time.perf_counter() - t0


def torch_save(d, gib, shards, after_cmd, poll):
    import torch

    state = build_state(gib)
    nbytes = sum(v.numel() * v.element_size() for v in state["model"].values())
    nbytes += sum(v.numel() * v.element_size() for st in state["optimizer"]["state"].values() for v in st.values())
    parts = shard_state(state, shards)
    single, sharded = os.path.join(d, "single"), os.path.join(d, "sharded")
    os.makedirs(single, exist_ok=True)
    os.makedirs(sharded, exist_ok=True)
    out("tensor_bytes", nbytes / 1e9, "GB")

    t0 = time.perf_counter()
    torch.save(state, os.path.join(single, "model.pt"))
    out("save_single", time.perf_counter() - t0, "s")
    out("file_bytes_single", os.path.getsize(os.path.join(single, "model.pt")) / 1e9, "GB")
    report_durable("single", *after(after_cmd, single, poll))

    t0 = time.perf_counter()
    for i, p in enumerate(parts):
        torch.save(p, os.path.join(sharded, f"shard_{i:03d}.pt"))
    out("save_sharded", time.perf_counter() - t0, "s")
    report_durable("sharded", *after(after_cmd, sharded, poll))


def report_durable(name, tp, tc):
    """With polling, durable_X is the polled time and durable_cli_X the time
    until the command (ckptfs drain) returned; without, durable_X is the
    command's time."""
    if tp is not None:
        out(f"durable_{name}", tp, "s")
        if tc is not None:
            out(f"durable_cli_{name}", tc, "s")
    elif tc is not None:
        out(f"durable_{name}", tc, "s")


class _MmapUnpickler(pickle.Unpickler):
    def __init__(self, f, storages):
        super().__init__(f)
        self.storages = storages

    def find_class(self, mod, name):
        import torch.serialization

        if isinstance(name, str) and "Storage" in name:
            try:
                return torch.serialization.StorageType(name)
            except KeyError:
                pass
        return super().find_class(mod, name)

    def persistent_load(self, saved_id):
        import torch

        typename, storage_type, key, location, numel = saved_id
        assert typename == "storage"
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        return torch.storage.TypedStorage(wrap_storage=self.storages(key, numel * torch._utils._element_size(dtype)),
                                          dtype=dtype)


def mmap_load(path):
    """torch.load(path, mmap=True) as torch 2.1 does it, for torch 1.13."""
    import torch

    size = os.path.getsize(path)
    whole = torch.UntypedStorage.from_file(path, False, size)  # MAP_PRIVATE
    z = zipfile.ZipFile(path)
    prefix = z.namelist()[0].split("/")[0]
    with open(path, "rb") as f:
        offsets = {}
        for info in z.infolist():
            f.seek(info.header_offset)
            hdr = f.read(30)
            nlen, xlen = struct.unpack("<HH", hdr[26:30])
            offsets[info.filename] = info.header_offset + 30 + nlen + xlen

    def storage(key, nbytes):
        off = offsets[f"{prefix}/data/{key}"]
        return whole[off:off + nbytes]

    return _MmapUnpickler(z.open(f"{prefix}/data.pkl"), storage).load()


def touch(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.numel():
            flat = obj.reshape(-1).view(torch.uint8)
            return int(flat[::4096].sum()) + int(flat[-1])
        return 0
    if isinstance(obj, dict):
        return sum(touch(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(touch(v) for v in obj)
    return 0


def prime_heap(nbytes):
    """Has this process's allocator hold `nbytes` (+256 MiB) of pages it
    has already touched, before a timed load: glibc then serves torch's
    tensors from them (every block from the heap, none given back), and
    the load's time is the file system's reads and torch's own work. On
    this VM (a PVM guest) a new process's first touch of 2 GiB of fresh
    memory costs 1.1 to 5.2 s from one minute to the next, the same on
    every target (the same 528,982 page faults into tmpfs and ckptfs), and
    decided the load ratios: a probe of stop 58 loading one 2 GiB file in
    turn from ckptfs and tmpfs took 1.1-4.8 and 2.2-3.8 s unprimed, and
    0.19-0.28 and 0.20-0.32 s primed (docs/benchmarks.md)."""
    import ctypes

    import torch

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)  # M_MMAP_MAX: every block from the heap
    libc.mallopt(-1, 1 << 40)  # M_TRIM_THRESHOLD: a freed block stays
    x = torch.empty(nbytes + (256 << 20), dtype=torch.uint8)
    x.fill_(1)
    del x


def torch_load(d, mode, which, pin=False):
    import torch

    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    files = []
    if which in ("single", "all"):
        files.append(("single", [os.path.join(d, "single", "model.pt")]))
    if which in ("sharded", "all"):
        sd = os.path.join(d, "sharded")
        files.append(("sharded", sorted(os.path.join(sd, f) for f in os.listdir(sd))))
    prime_heap(max(sum(os.path.getsize(p) for p in paths) for _, paths in files))
    for name, paths in files:
        nbytes = sum(os.path.getsize(p) for p in paths)
        t0 = time.perf_counter()
        for p in paths:
            obj = torch.load(p, map_location="cpu") if mode == "plain" else mmap_load(p)
            touch(obj)
            del obj
        t = time.perf_counter() - t0
        out(f"load_{mode}_{name}", t, "s")
        out(f"load_{mode}_{name}_throughput", nbytes / t / 1e9, "GB/s")


def trainer_state(gib, seed=0):
    """A trainer's state of about `gib` GiB in tensors of several sizes: a
    few large (embeddings, 64 MiB), many medium (1-16 MiB layers and their
    Adam moments), and small ones (biases, norms, 4-64 KiB)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    target = int(gib * 2**30)
    sizes, total = [], 0
    mib = 1 << 20
    pattern = [64 * mib] + [16 * mib] * 2 + [8 * mib] * 4 + [4 * mib] * 8 + [1 * mib] * 8 + [64 << 10, 4 << 10] * 8
    i = 0
    while total < target:
        n = pattern[i % len(pattern)]
        sizes.append(n)
        total += n
        i += 1
    return {f"t{i:04d}": torch.rand(n // 4, generator=g) for i, n in enumerate(sizes)}


def _save_path(d, r, pattern):
    """Where repetition `r` saves: rotate writes step_R.pt beside the last
    one (as issue #15's trainer); the others a new step directory each
    time, as most trainers (step_R/model.pt)."""
    if pattern == "rotate":
        return os.path.join(d, f"step_{r}.pt")
    return os.path.join(d, f"step_{r}", "model.pt")


def _retire(d, r, pattern):
    """What a trainer removes after save `r`: rotate the previous file,
    keep2 and pressure the save before the previous (keep 2), keep nothing."""
    import shutil

    if pattern == "rotate":
        prev = os.path.join(d, f"step_{r - 1}.pt")
        if os.path.exists(prev):
            os.unlink(prev)
    elif pattern in ("keep2", "pressure"):
        shutil.rmtree(os.path.join(d, f"step_{r - 2}"), ignore_errors=True)


def _other_memory(dirs, nbytes):
    """Between two checkpoints other processes use memory (pressure
    pattern): `nbytes` written through the page cache of a disk file and
    as much into a tmpfs file, then both removed, as a data loader or a
    log writer leaves the kernel's free lists."""
    work = next((d for n, d in dirs if n == "disk"), None)
    paths = [os.path.join("/dev/shm", f"bench-other-{os.getpid()}")]
    if work:
        paths.append(os.path.join(work, f"bench-other-{os.getpid()}"))
    buf = b"\x5a" * (1 << 20)
    for p in paths:
        with open(p, "wb") as f:
            for _ in range(nbytes >> 20):
                f.write(buf)
    for p in paths:
        os.unlink(p)


_LOAD_CODE = """
import os, sys, time, torch
sys.path.insert(0, sys.argv[2])
from bench import prime_heap
prime_heap(os.path.getsize(sys.argv[1]))
t0 = time.perf_counter()
state = torch.load(sys.argv[1])
n = sum(float(v.sum()) for v in state.values()) if isinstance(state, dict) else 0.0
print(time.perf_counter() - t0)
"""


def _load_new_process(path):
    """torch.load of `path` by a new process (a restarted trainer), timed
    inside it (the interpreter's start and `import torch` are not the
    file system's); every tensor summed, so every byte is read."""
    res = subprocess.run([sys.executable, "-c", _LOAD_CODE, path, os.path.dirname(os.path.abspath(__file__))],
                         check=True, capture_output=True, text=True)
    return float(res.stdout.strip().splitlines()[-1])


def _rank_main(conn, nbytes, seed):
    """One rank of the ranks pattern: builds its state once, then saves it
    to each path it is sent and answers with the seconds it took."""
    import torch

    state = trainer_state(nbytes / 2**30, seed)
    conn.send("ready")
    while True:
        path = conn.recv()
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t0 = time.perf_counter()
        torch.save(state, path)
        conn.send(time.perf_counter() - t0)


def copy_bandwidth(nbytes=256 << 20):
    """GB/s of write(2) into tmpfs pages that are already there (a file
    written once, then overwritten): the memory-copy part of a save's
    physical limit, measured beside it (issue #29)."""
    path = f"/dev/shm/bench-membw-{os.getpid()}"
    buf = b"\xa5" * (1 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(2):  # the first pass faults the pages in
            t0 = time.perf_counter()
            for off in range(0, nbytes, len(buf)):
                os.pwrite(fd, buf, off)
            t = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return nbytes / t / 1e9


def _prime_kernel_reads(state):
    """Has the kernel read every tensor of `state` once before any timed
    save: written into a pipe that a thread empties, so that no page is
    allocated and freed on the way (a scratch file on /dev/shm handed
    tmpfs's next save the pages it freed). On this VM (a PVM guest) the
    kernel's first read of user pages the process wrote costs ~2.3 s a
    GiB, whatever the file system: a C program's first 1 GiB write from a
    freshly written buffer took 2.4-3.4 s into ckptfs and into tmpfs
    alike, its second write of the same buffer 0.16-0.20 s, and touching
    the buffer from user space first changed nothing (stop 53,
    docs/benchmarks.md). Without this, the first target in a repetition of
    the `first` pattern paid for the process, not for its mount: the
    ckptfs saves of 3.27 and 2.83 s in run 20261130-002259 were the
    repetitions where ckptfs went first."""
    import threading

    r, w = os.pipe()

    def drain():
        while os.read(r, 1 << 20):
            pass

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        for v in state.values():
            mv = memoryview(v.numpy()).cast("B")
            off = 0
            while off < len(mv):
                off += os.write(w, mv[off : off + (1 << 20)])
    finally:
        os.close(w)
        t.join()
        os.close(r)


def trainer(gib, reps, dirs, pattern="rotate", warmup=True, rep_base=1, load=False, ranks=0, other_gib=2.0):
    """A long-lived trainer: builds its state once, then saves it again and
    again, to each DIR in turn (NAME=PATH), rotating which goes first in
    each repetition so no target always follows another. `pattern` is what
    it keeps: rotate (one file per save, step_N.pt, the previous one
    removed after the next is saved), keep (a new step directory per save,
    nothing removed), keep2 (keep the last 2), pressure (keep2, and other
    processes use `other_gib` GiB of page cache and tmpfs between saves).
    With `ranks` N, N processes (built once, 256 MiB-ish states of
    `gib`/N each) save at once and the time is until the last one is done.
    Repetition 0 warms every target (first file of a mount, allocator) and
    is not reported unless `warmup` is False (the first save of a fresh
    mount: then repetitions are numbered from `rep_base`, and the process
    itself is primed first, _prime_kernel_reads). With `load`, a
    new process loads each save (rank 0's file) and its time is reported.
    Prints `NAME REP METRIC VALUE UNIT` lines."""
    import multiprocessing as mp

    import torch

    targets = [d.split("=", 1) for d in dirs]
    procs, conns = [], []
    if ranks > 0:
        ctx = mp.get_context("fork")
        for k in range(ranks):
            a, b = ctx.Pipe()
            pr = ctx.Process(target=_rank_main, args=(b, int(gib * 2**30 / ranks), k), daemon=True)
            pr.start()
            procs.append(pr)
            conns.append(a)
        for c in conns:
            c.recv()
        state = None
        nbytes = int(gib * 2**30)
    else:
        state = trainer_state(gib)
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        if not warmup:
            _prime_kernel_reads(state)
    out("tensor_bytes", nbytes / 1e9, "GB")
    try:
        for r in range(reps + (1 if warmup else 0)):
            shown = r if warmup else r + rep_base
            if r > 0 or not warmup:
                # The physical limit of this repetition's saves: torch's own
                # CPU (save_user_seconds) plus the bytes at this copy rate.
                print(f"membw {shown} copy_gbps {copy_bandwidth():.3f} GB/s", flush=True)
                print(f"membw {shown} save_bytes {nbytes} B", flush=True)
            for k in range(len(targets)):
                name, d = targets[(k + shown) % len(targets)]
                if pattern == "pressure" and (r > 0 or not warmup):
                    _other_memory(targets, int(other_gib * 2**30))
                settle([t[1] for t in targets])
                spare = prealloc_ready(d)
                rep0 = host_reported_kib()
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                if ranks > 0:
                    paths = [_save_path(os.path.join(d, f"rank{i}"), r, pattern) for i in range(ranks)]
                    t0 = time.perf_counter()
                    for c, p in zip(conns, paths):
                        c.send(p)
                    for c in conns:
                        c.recv()
                    t = time.perf_counter() - t0
                    path = paths[0]
                else:
                    path = _save_path(d, r, pattern)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    t0 = time.perf_counter()
                    torch.save(state, path)
                    t = time.perf_counter() - t0
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                rep1 = host_reported_kib()
                if r > 0 or not warmup:
                    # The process's own CPU: user (pickling, the zip writer's
                    # CRC32: the same for every target) and system (the kernel
                    # copying into the target's pages, faulting them in).
                    print(f"{name} {shown} save_seconds {t:.6f} s", flush=True)
                    if ranks == 0:
                        print(f"{name} {shown} save_user_seconds {ru1.ru_utime - ru0.ru_utime:.6f} s", flush=True)
                        print(f"{name} {shown} save_sys_seconds {ru1.ru_stime - ru0.ru_stime:.6f} s", flush=True)
                    if spare is not None:  # what the save found pre-allocated
                        print(f"{name} {shown} prealloc_ready_bytes {spare} B", flush=True)
                    if rep0 is not None:  # free memory the guest handed back to the host meanwhile
                        print(f"{name} {shown} host_reported_mib {(rep1 - rep0) / 1024:.1f} MiB", flush=True)
                    if load:
                        settle([t[1] for t in targets], pause=1)
                        print(f"{name} {shown} load_seconds {_load_new_process(path):.6f} s", flush=True)
                if ranks > 0:
                    for i in range(ranks):
                        _retire(os.path.join(d, f"rank{i}"), r, pattern)
                else:
                    _retire(d, r, pattern)
    finally:
        for c in conns:
            c.send(None)
        for pr in procs:
            pr.join(10)


def _dcp_rank(d, rank, files, nbytes, seed):
    """One rank of a torch.distributed.checkpoint save: its .distcp files,
    each written whole, fsynced and closed (as DCP's FileSystemWriter)."""
    import random

    rng = random.Random(seed * 1000 + rank)
    buf = os.urandom(nbytes * 2)
    for i in range(files):
        n = nbytes // 2 + rng.randrange(nbytes)
        path = os.path.join(d, f"__{rank}_{i}.distcp")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        off = rng.randrange(nbytes)
        os.write(fd, buf[off:off + n])
        os.fsync(fd)
        os.close(fd)


def _hf_save(d, nbytes, seed):
    """An HF Trainer checkpoint-N directory: the weights, the optimizer and
    scheduler states, RNG state, a few JSON files."""
    os.makedirs(d, exist_ok=True)
    parts = [("model.safetensors", nbytes), ("optimizer.pt", 2 * nbytes), ("scheduler.pt", 1100),
             ("rng_state.pth", 14500), ("trainer_state.json", 5000), ("training_args.bin", 5200),
             ("config.json", 700), ("generation_config.json", 150), ("tokenizer.json", 2 << 20),
             ("special_tokens_map.json", 400)]
    buf = os.urandom(2 * nbytes + 1)
    for name, n in parts:
        tmp = os.path.join(d, name + ".tmp")  # HF and Lightning write then replace
        with open(tmp, "wb") as f:
            f.write(buf[:n])
        os.replace(tmp, os.path.join(d, name))


def _read_tree(d):
    # Into one buffer touched first: a new 1 MiB object a read is a fresh
    # mapping of this VM's memory each time (prime_heap), which every
    # target pays alike and which is not the file system's.
    buf = bytearray(1 << 20)
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            with open(os.path.join(root, f), "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(buf)
                    if not n:
                        break
                    total += n
    return total


def frameworks(reps, ranks, files, mib, dirs):
    """Small framework-shaped checkpoints, saved by one long-lived process
    (forking its ranks) to each DIR (NAME=PATH) in turn, rotated: a DCP
    directory (RANKS ranks at once, FILES fsynced .distcp files each,
    ~MIB MiB apiece, then .metadata from rank 0) and an HF Trainer
    checkpoint-N directory (~10 files, temp file + os.replace), the one
    before the previous removed (rotation). The load reads every file back
    in a new process. Prints `NAME REP METRIC VALUE UNIT`."""
    import shutil
    import subprocess

    nbytes = int(mib * (1 << 20))
    targets = [d.split("=", 1) for d in dirs]
    for r in range(reps + 1):  # round 0 warms every target up (first file of a mount)
        for k in range(len(targets)):
            name, d = targets[(k + r) % len(targets)]
            step = os.path.join(d, f"dcp-{r}")
            os.makedirs(step, exist_ok=True)
            settle([t[1] for t in targets])
            t0 = time.perf_counter()
            pids = []
            for rank in range(ranks):
                pid = os.fork()
                if pid == 0:
                    try:
                        _dcp_rank(step, rank, files, nbytes, r)
                        os._exit(0)
                    except BaseException:
                        os._exit(1)
                pids.append(pid)
            ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
            with open(os.path.join(step, ".metadata"), "wb") as f:
                f.write(os.urandom(64 << 10))
                f.flush()
                os.fsync(f.fileno())
            t_dcp = time.perf_counter() - t0
            hf = os.path.join(d, f"checkpoint-{r}")
            settle([t[1] for t in targets])
            t0 = time.perf_counter()
            _hf_save(hf, nbytes * 8, r)
            t_hf = time.perf_counter() - t0
            settle([t[1] for t in targets])  # a restart comes long after the save
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "read-tree", step], check=True, capture_output=True)
            t_dcp_load = time.perf_counter() - t0
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "read-tree", hf], check=True, capture_output=True)
            t_hf_load = time.perf_counter() - t0
            if r > 0 and ok:
                for m, v in (("dcp_save_seconds", t_dcp), ("hf_save_seconds", t_hf),
                             ("dcp_load_seconds", t_dcp_load), ("hf_load_seconds", t_hf_load)):
                    print(f"{name} {r} {m} {v:.6f} s", flush=True)
            for old in (os.path.join(d, f"dcp-{r - 2}"), os.path.join(d, f"checkpoint-{r - 2}")):
                shutil.rmtree(old, ignore_errors=True)


def mkfiles(d, count, nbytes):
    data = os.urandom(nbytes)
    os.makedirs(d, exist_ok=True)
    per_dir = 1000
    t0 = time.perf_counter()
    for i in range(count):
        sub = os.path.join(d, f"d{i // per_dir:03d}")
        if i % per_dir == 0:
            os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"f{i:06d}"), "wb") as f:
            f.write(data)
    t = time.perf_counter() - t0
    out("create_seconds", t, "s")
    out("creates_per_second", count / t, "1/s")


def wait_quiet(pid, limit=30.0):
    """Waits until the daemon `pid` used at most one clock tick of CPU in
    half a second (no spare being made, nothing draining); False if it did
    not within `limit` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        c0 = cpu_seconds(pid)
        time.sleep(0.5)
        if cpu_seconds(pid) - c0 <= 1.0 / os.sysconf("SC_CLK_TCK"):
            return True
    return False


def steps_while_draining(d, nbytes, pid, steps=12):
    """Issue #29: a trainer's CPU-bound step (matrix multiplies, as between
    saves) timed with the drain idle, then while a `nbytes` file written
    to the ckptfs mount `d` drains, then idle again; the daemon's CPU
    seconds over the drain. The idle steps are taken before and after the
    drain, each time once the daemon is quiet (its spares made), and their
    median is the reference: this VM's speed drifts (a run of 20261130 had
    the idle step at 1.23 s in one repetition and 0.67-0.74 s in the
    others, and one repetition changed speed halfway), and a reference
    taken on one side only turned that drift into ratios of 0.60 and 1.16.
    Prints the medians and their ratio, and the drain's CPU per GiB."""
    import statistics

    import torch

    a = torch.rand(1024, 1024)
    b = torch.rand(1024, 1024)

    def step():  # about 0.35 s here (Debian's CPU torch: 4-5 GFLOP/s a core)
        t0 = time.perf_counter()
        torch.mm(a, b)  # one product (two until 20261130): twice the steps inside a drain
        return time.perf_counter() - t0

    quiet = wait_quiet(pid)
    step()
    idle = [step() for _ in range(steps)]
    path = os.path.join(d, "draining.bin")
    buf = os.urandom(BS)
    with open(path, "wb") as f:
        for _ in range(nbytes // BS):
            f.write(buf)
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    busy = []
    while True:
        try:
            if os.getxattr(path, "user.ckptfs.state").rstrip(b"\0") in (b"persisted", b"remote"):
                break
        except OSError:
            pass
        busy.append(step())
    drain_s = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    os.unlink(path)
    quiet = wait_quiet(pid) and quiet
    idle += [step() for _ in range(steps)]
    out("daemon_quiet_before_idle_steps", 1.0 if quiet else 0.0, "bool")
    out("step_idle_seconds", statistics.median(idle), "s")
    out("step_draining_seconds", statistics.median(busy) if busy else 0.0, "s")
    out("steps_while_draining", len(busy), "steps")
    out("step_draining_ratio", statistics.median(busy) / statistics.median(idle) if busy else 0.0, "x")
    out("drain_seconds", drain_s, "s")
    out("drain_cpu_seconds_per_gib", cpu / (nbytes / 2**30), "s/GiB")


def proc(pid):
    out("cpu_seconds", cpu_seconds(pid), "s")
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out(k, int(v.split()[0]) / 1024, "MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="cmd", required=True)
    p = sp.add_parser("seq-write")
    p.add_argument("path")
    p.add_argument("bytes", type=int)
    p.add_argument("--poll-state", action="store_true")
    p.add_argument("--pid", type=int, default=0, help="print this daemon's CPU seconds at close")
    p = sp.add_parser("seq-read")
    p.add_argument("path")
    p = sp.add_parser("torch-save")
    p.add_argument("dir")
    p.add_argument("gib", type=float)
    p.add_argument("shards", type=int)
    p.add_argument("--after", default="")
    p.add_argument("--poll-state", action="store_true")
    p = sp.add_parser("torch-load")
    p.add_argument("dir")
    p.add_argument("mode", choices=["plain", "mmap"])
    p.add_argument("--which", default="all", choices=["single", "sharded", "all"])
    p.add_argument("--pin", action="store_true", help="run on one CPU")
    p = sp.add_parser("trainer")
    p.add_argument("gib", type=float)
    p.add_argument("reps", type=int)
    p.add_argument("dirs", nargs="+", help="NAME=DIR")
    p.add_argument("--pattern", default="rotate", choices=["rotate", "keep", "keep2", "pressure"])
    p.add_argument("--no-warmup", action="store_true", help="report the first save too (a fresh mount's first)")
    p.add_argument("--rep-base", type=int, default=1, help="with --no-warmup: the first repetition's number")
    p.add_argument("--load", action="store_true", help="time torch.load of each save in a new process")
    p.add_argument("--ranks", type=int, default=0, help="N processes saving gib/N each at once")
    p.add_argument("--other-gib", type=float, default=2.0, help="pressure: GiB other processes write between saves")
    p = sp.add_parser("frameworks")
    p.add_argument("reps", type=int)
    p.add_argument("ranks", type=int)
    p.add_argument("files", type=int, help=".distcp files per rank")
    p.add_argument("mib", type=float, help="mean .distcp file size")
    p.add_argument("dirs", nargs="+", help="NAME=DIR")
    p = sp.add_parser("read-tree")
    p.add_argument("dir")
    p = sp.add_parser("mkfiles")
    p.add_argument("dir")
    p.add_argument("count", type=int)
    p.add_argument("bytes", type=int)
    p = sp.add_parser("steps-while-draining")
    p.add_argument("dir")
    p.add_argument("bytes", type=int)
    p.add_argument("pid", type=int, help="the ckptfs daemon")
    p = sp.add_parser("proc")
    p.add_argument("pid", type=int)
    a = ap.parse_args()
    if a.cmd == "seq-write":
        seq_write(a.path, a.bytes, a.poll_state, a.pid)
    elif a.cmd == "seq-read":
        seq_read(a.path)
    elif a.cmd == "torch-save":
        torch_save(a.dir, a.gib, a.shards, a.after, a.poll_state)
    elif a.cmd == "torch-load":
        torch_load(a.dir, a.mode, a.which, a.pin)
    elif a.cmd == "trainer":
        trainer(a.gib, a.reps, a.dirs, a.pattern, not a.no_warmup, a.rep_base, a.load, a.ranks, a.other_gib)
    elif a.cmd == "frameworks":
        frameworks(a.reps, a.ranks, a.files, a.mib, a.dirs)
    elif a.cmd == "read-tree":
        _read_tree(a.dir)
    elif a.cmd == "mkfiles":
        mkfiles(a.dir, a.count, a.bytes)
    elif a.cmd == "steps-while-draining":
        steps_while_draining(a.dir, a.bytes, a.pid)
    elif a.cmd == "proc":
        proc(a.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
