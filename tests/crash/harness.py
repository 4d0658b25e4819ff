#!/usr/bin/python3
"""harness.py — the kill -9 crash harness (issue 5).

Each iteration mounts ckptfs on a fresh backend, state dir and tier dir,
runs the trainer-like writer (writer.py) into it, crashes something, then
checks what survived against the writer's fsynced journal (model.py):

  kill      SIGKILL the daemon at a random moment
  fp:NAME   arm the failpoint NAME@N (common/failpoint.h) in the daemon
            and let it kill itself; load.recovery is armed on the remount
            after a random kill instead
  reboot    SIGKILL the daemon, remove the tier directory (what a node
            reboot does to /dev/shm), remount
  trainer   SIGKILL the writer (the daemon lives), restart it: it reads
            its checkpoint back from the mount and goes on

After a daemon crash the writer must stop with an I/O error (ENOTCONN, EIO,
ECONNABORTED); the harness checks the backend as the crash left it, mounts
again on the same mount point (ckptfs mount is to detach the dead mount
itself), runs `ckptfs drain` and checks:

  P1  every acknowledged file reads back with its bytes, or (reboot only)
      is listed in status "lost" and gone from the namespace; never wrong,
      short, unreadable or silently missing. Files in flight show the
      version of their last close, the empty file of their create or
      O_TRUNC, or the whole new version — never part of it (a killed
      writer is the exception: the kernel closed its half-written file).
  P2  the backend, walked directly (.ckptfs-tmp aside), holds under each
      name only versions the writer began: never a partial file.
  P3  the backend is a prefix of the history: `latest` never names a step
      whose files are missing or wrong; what was removed before that
      `latest` was written is gone, and what was closed before it and
      never touched again is there. Checked on the backend as the crash
      left it, while the writer runs (a watcher thread polls the backend,
      the drain slowed with CKPTFS_DRAIN_DELAY_MS), and after the drain,
      when the backend must equal the mount byte for byte.

Every iteration prints its seed, its kill point and its result. The seed
alone fixes the kind and the parameters (KINDS[seed % 17]), so

    tests/crash/harness.py --seed S --iterations 1

repeats an iteration (timing aside). The bounded set (make test, through
tests/mount/cases/crash_bounded.sh) is one of each kind from the block of
seeds S..S+16, S a multiple of 17: each failpoint, a reboot, a trainer
restart and one of the 10 random kills (bounded_seeds(); --bounded picks a
random such S). The other kills are `make crash-soak`'s. The watcher must
have found a consistent `latest` while the writer ran in at least one
iteration of a bounded set, and in every iteration whose backend holds a
`latest` when the writer stops.

Multi-node mode (issue 11), --nodes N (2..8), kind mn-kill: each
iteration mounts N nodes with --cluster cm<seed> --node n<k> (own state
dir, tier dir and mount point) on one fresh backend, runs one writer per
node (writer.py with rank k: shards step_N/shard_<k>_<i>.bin, a file
barrier outside the mount after closing them, then rank 0 alone writes
model.pt and `latest`; every rank removes its own old steps, rank 0's
removal taking every rank's shards of the step from the backend), and
SIGKILLs the daemon of one node picked by the seed (rank 0's or another)
at a random moment. The killed node's writer must stop with an I/O error;
the others stop at their next barrier (DIR/abort, exit 6). The killed node
is mounted again at once (same state dir: it rejoins before
--member-timeout, default 60 s: no member dies), it finishes the removal
of old steps its writer had begun elsewhere (journaled, as a restarted
rank would), every node drains, and:

  P1  on every node, every file its writer acknowledged reads back from
      that node's mount (or is listed lost), after the remount and after
      the drain;
  P2  every name in the backend holds only a version its rank began;
  P3  across nodes: `latest` never names a step whose files from every
      rank (cluster_step_files: rank 0's at that `latest`, every shard the
      others closed under the step, each rank having reached that step's
      barrier) are not all in the backend, each the acknowledged version —
      polled by ClusterWatcher while the writers run, after the crash,
      through the remount and the drain; and after the drain the backend
      equals the union of what the nodes hold.

The seed alone fixes the scenario (victim, steps, kill delay, drain delay,
latest mode); `--nodes 3 --seed S --iterations 1` repeats one, --bounded
runs one iteration. The rule "some watcher saw a consistent latest while
the writer ran" is not applied to a multi-node --bounded run (one
iteration; an early kill leaves no `latest` until the drain); the
iteration's own last-look rule still is.

Node loss (issue #30), --nodes N --kind mn-lost --cluster-store etcd://...
(without a store: exit 77): as mn-kill, but the nodes mount with
--replicas 1, --replica-listen 127.0.0.1:0, a 0600 --cluster-secret and
--member-timeout 2, and the victim's machine is lost: until the kill a
thread (StatePoller) reads user.ckptfs.state of its writer's acknowledged
files, its daemon is SIGKILLed, its tier (and the replicas it held for
the others) and state dir deleted, its dead mount detached once its
writer stopped. The live nodes drain (their holders publish the lost
node's replicas once its lease expired: the takeover) until they hold no
replica but published ones; then a fresh node mounts in the victim's
place with a new state and tier dir, under the same --node id or a new
one (the seed picks), and:

  P1' every file the victim's writer acknowledged and that was seen
      `replicated` or `persisted` before the kill (must_survive: not
      removed since, not renamed, under no step a rank began to remove) is
      in the backend and on the fresh node with its bytes; the fresh
      node's mount equals the backend. Files not seen so may be lost: the
      notes list them;
  P1  on every live node, as mn-kill, after the drain;
  P2  every name in the backend holds only a version its rank began;
  P3  across nodes, polled by LossWatcher while the writers run, through
      the takeover, and at the end: `latest` never names a step with a
      file of the wrong version, nor one missing before the loss; after
      it, a missing file must be one lost with the node (absent for good,
      not seen safe: judge_torn), never one that turned up later nor a
      live rank's.

Removals the live ranks made after the lost node's last replicated
entry and before the loss was known are kept out of the backend
(docs/consistency.md, "Removals ordered after what a lost node took with
it"): `latest` never names a step they removed — until stop 44 the one
known hole, a "BUG:" note. `--nodes 3 --kind mn-lost
--cluster-store etcd://HOST:PORT --seed S` repeats an iteration (its
draws are its own: mn-kill's are unchanged).

Environment: BUILD (build dir, default build, as tests/mount/lib/common.sh),
CKPTFS_TEST_ROOT or TMPDIR (where the iteration dirs go), KEEP=1 (keep a
failed iteration's dir). Needs root-free FUSE
(/dev/fuse, fusermount3) and /usr/bin/python3 with torch. Exit: 0 all passed, 1 a check failed, 77
cannot run here.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

from model import ABSENT, EMPTY_SHA, Model, classify, cluster_step_files, under  # noqa: E402

FAILPOINTS = ["drain.mid_transfer", "drain.after_publish", "meta.after_commit", "evict.mid", "load.recovery"]
KINDS = [f"fp:{f}" for f in FAILPOINTS] + ["reboot", "trainer"] + ["kill"] * 10
IO_ERRNOS = {"ENOTCONN", "EIO", "ECONNABORTED", "ENODEV"}


def bounded_seeds(seed):
    """The bounded set that holds `seed`: the first seed of each kind in
    its block of len(KINDS), the kill being `seed` itself when it is one,
    else one picked by the block's number (so repeated runs cover them)."""
    base = seed - seed % len(KINDS)
    first = KINDS.index("kill")
    kill = seed if KINDS[seed % len(KINDS)] == "kill" else base + first + (base // len(KINDS)) % KINDS.count("kill")
    return [base + i for i in range(first)] + [kill]


def remove_tier(t):
    """Removes a tier directory, and the tmpfs of its own (--tier-huge) first."""
    subprocess.run(["umount", "-l", t], stderr=subprocess.DEVNULL)
    shutil.rmtree(t, ignore_errors=True)


def log(msg=""):
    print(msg, flush=True)


class Failed(Exception):
    """A checked property does not hold."""


class Skip(Exception):
    pass


# ---------------------------------------------------------------- helpers

def run(cmd, env=None, timeout=300, check=False):
    e = dict(os.environ)
    for k in ("CKPTFS_FAILPOINT", "CKPTFS_DRAIN_DELAY_MS"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(cmd, env=e, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        raise Failed(f"{' '.join(cmd)} exited {p.returncode}: {p.stdout.strip()}")
    return p


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


def mounted_type(path):
    # Bytes: another mount's path may be no UTF-8 at all (a test of hostile
    # names); /proc escapes space, tab, newline and backslash as \ooo.
    want = os.fsencode(path)
    with open("/proc/self/mounts", "rb") as f:
        for line in f:
            dev, mnt, typ = line.split()[:3]
            if re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), mnt) == want:
                return typ.decode()
    return None


def sha_file(path):
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def walk(root, skip_top=()):
    """{rel: ("dir",) | ("file", sha, size) | ("error", errno name) | ("other",)}"""
    out = {}
    for dirpath, dirs, files in os.walk(root, onerror=lambda e: out.setdefault(
            os.path.relpath(e.filename, root), ("error", errno_name(e.errno)))):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirs[:] = [d for d in dirs if not any(d.startswith(s) for s in skip_top)]
            files = [f for f in files if not any(f.startswith(s) for s in skip_top)]
        for d in dirs:
            out[os.path.normpath(os.path.join(rel_dir, d))] = ("dir",)
        for name in files:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            p = os.path.join(dirpath, name)
            try:
                if os.path.islink(p) or not os.path.isfile(p):
                    out[rel] = ("other",)
                    continue
                s, n = sha_file(p)
                out[rel] = ("file", s, n)
            except OSError as e:
                out[rel] = ("error", errno_name(e.errno))
    return out


def latest_mismatches(tree, files, text, where):
    """P3 errors for a backend `tree` whose latest (`text`) names `files` {rel: acknowledged sha}."""
    errs = []
    for rel, want in sorted(files.items()):
        got = tree.get(rel)
        if got is None:
            errs.append(f"P3 {where}: backend latest names {text} but {rel} is missing")
        elif got[0] != "file" or got[1] != want:
            errs.append(f"P3 {where}: backend latest names {text} but {rel} is not the acknowledged version")
    return errs


def errno_name(e):
    import errno as E
    return E.errorcode.get(e, str(e))


BACKEND_SKIP = (".ckptfs-tmp", ".ckptfs-probe-", ".ckptfs-cluster")


# ---------------------------------------------------------------- watcher

class Watcher(threading.Thread):
    """Polls the backend while the writer runs: `latest` must never name a
    step whose files are missing or wrong (P3), and no file may hold bytes
    the writer never began (P2). Tolerates the races of a live tree: a
    missing step file counts only if `latest` still names that step after
    the look (steps only grow, and a step is deleted in the backend only
    after a later `latest` is), a file unknown to the journal only if the
    journal, read again after the walk, still does not know it."""

    def __init__(self, backend, journal):
        super().__init__(daemon=True)
        self.backend = backend
        self.journal = journal
        self.stop = threading.Event()
        self.violations = Notes()  # each once: a torn latest stays torn for many polls
        self.polls = 0
        self.consistent = 0
        self.deferred = 0  # looks judged at the end instead (LossWatcher)
        self.cache = {}

    def records(self):
        return load_journal(self.journal)

    def file_sha(self, rel):
        p = os.path.join(self.backend, rel)
        st = os.stat(p)
        key = (rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in self.cache:
            self.cache[key] = sha_file(p)[0]
        return self.cache[key]

    def mismatched(self, files):
        """(rel, what) for each of {rel: acknowledged sha} the backend does
        not hold as acknowledged."""
        bad = []
        for rel, want in sorted(files.items()):
            try:
                got = self.file_sha(rel)
            except FileNotFoundError:
                bad.append((rel, "missing"))
                continue
            if got != want:
                bad.append((rel, f"has sha {got[:12]}, acknowledged {want[:12]}"))
        return bad

    def mismatches(self, files):
        return [f"{rel} {what}" for rel, what in self.mismatched(files)]

    def read_latest(self):
        try:
            return read_all(os.path.join(self.backend, "latest")).decode(errors="replace")
        except FileNotFoundError:
            return None

    def poll(self):
        self.polls += 1
        v = self.read_latest()
        if v and v.startswith("step_"):
            m = Model(self.records())
            i, files = m.step_files(v)
            if files is None:
                self.violations.append(f"backend latest is '{v}', which the writer never began to write")
                return
            bad = self.mismatches(files)
            if bad:
                if self.read_latest() == v:
                    self.violations.append(f"backend latest names {v} but " + "; ".join(bad))
            else:
                self.consistent += 1
        if self.polls % 5 == 0:
            m = Model(self.records())
            for rel, obs in walk(self.backend, BACKEND_SKIP).items():
                if obs[0] != "file":
                    continue
                if obs[1] in m.ever.get(rel, ()):
                    continue
                m2 = Model(self.records())
                if obs[1] in m2.ever.get(rel, ()):
                    continue
                try:  # the file may have been replaced since the walk
                    if self.file_sha(rel) != obs[1]:
                        continue
                except FileNotFoundError:
                    continue
                self.violations.append(f"backend file {rel}: {classify(m2, rel, obs[1], obs[2], lambda: read_all(os.path.join(self.backend, rel)), m2.ever.get(rel, set()))}")

    def run(self):
        while not self.stop.is_set():
            self.poll_once()
            self.stop.wait(0.03)

    def poll_once(self):
        try:
            self.poll()
        except Exception as e:  # a racing rename or rmdir under the walk
            if not isinstance(e, OSError):
                self.violations.append(f"watcher error: {e!r}")

    def last_look(self, timeout=5.0):
        """After the thread stopped: polls the backend as the crash left it
        (a live drain may still move it: then until one poll is consistent,
        for at most `timeout` s). Returns True if the backend has a `latest`
        naming a step, which the watcher must then have found consistent."""
        deadline = time.monotonic() + timeout
        while True:
            before = self.consistent + self.deferred
            v = self.read_latest()
            if not (v and v.startswith("step_")):
                return False
            self.poll_once()
            if self.consistent + self.deferred > before or self.violations or time.monotonic() > deadline:
                return True
            time.sleep(0.05)


def load_journal(path):
    recs = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    recs.append(json.loads(line))
                except ValueError:  # a line being appended, read by the watcher
                    break
    except FileNotFoundError:
        pass
    return recs


# ---------------------------------------------------------------- one iteration

class Iteration:
    def __init__(self, h, seed):
        self.h = h
        self.seed = seed
        self.kind = KINDS[seed % len(KINDS)]
        r = random.Random(seed)
        self.steps = r.randrange(8, 14)
        self.compute_ms = r.choice([20, 50, 80])
        self.pace_ms = r.choice([2, 5, 8])
        # Slow enough that the drain falls steps behind the writer.
        self.drain_delay_ms = r.choice([30, 80, 150])
        self.latest_mode = "rename" if self.kind == "trainer" else r.choice(["inplace", "rename"])
        self.cache = r.choice(["24M", "64M", "1G"])
        # The writer runs 2-4 s, the slowed drain trails it by a few more.
        self.kill_delay = r.uniform(0.05, 4.0)
        # A third of the runs mount with --fsync=backend and fsync `latest` before
        # its close: a barrier the backend must never fall behind.
        self.fsync_backend = r.random() < 0.35
        self.fp = None
        self.recovery_fp = None
        if self.kind.startswith("fp:"):
            name = self.kind[3:]
            n = {"drain.mid_transfer": r.randrange(1, 25), "drain.after_publish": r.randrange(1, 40),
                 "meta.after_commit": r.randrange(1, 150), "evict.mid": r.randrange(1, 4),
                 "load.recovery": 1}[name]
            if name == "load.recovery":
                self.recovery_fp = f"{name}@{n}"
            else:
                self.fp = f"{name}@{n}"
            if name == "evict.mid":
                self.cache = "16M"  # eviction needs a full tier of clean files
                self.drain_delay_ms = 20
        self.dir = os.path.join(h.root, f"it-{seed}")
        self.mnt = os.path.join(self.dir, "mnt")
        self.backend = os.path.join(self.dir, "backend")
        self.state = os.path.join(self.dir, "state")
        self.journal = os.path.join(self.dir, "journal.jsonl")
        self.tier = f"{h.tier_prefix}-{seed}"
        self.notes = Notes()
        self.live_consistent = 0
        self.kill_point = "?"
        self.writer_pid = None
        self.daemon_pid = None
        # Multi-node mode (MultiIteration makes one Iteration per node).
        self.extra_args = []
        self.rank, self.nranks, self.barrier_dir = 0, 1, None

    def describe(self):
        fp = self.fp or self.recovery_fp
        return (f"seed={self.seed} kind={self.kind}{' ' + fp if fp else ''} steps={self.steps} "
                f"latest={self.latest_mode}{'+fsync' if self.fsync_backend else ''} cache={self.cache} "
                f"drain_delay={self.drain_delay_ms}ms")

    # ---- daemon ----
    def mount(self, env=None, expect_ok=True):
        self.h.tiers.add(self.tier)
        p = run([self.h.ckptfs, "mount", self.mnt, "--backend", self.backend, "--state-dir", self.state,
                 "--tier-dir", self.tier, "--cache-size", self.cache,
                 "--fsync", "backend" if self.fsync_backend else "memory"] + self.extra_args, env=env, timeout=120)
        if p.returncode != 0:
            if expect_ok:
                raise Failed(f"ckptfs mount failed ({p.returncode}): {p.stdout.strip()}")
            return p
        if mounted_type(self.mnt) != "fuse.ckptfs":
            raise Failed("ckptfs mount returned 0 but nothing is mounted")
        self.daemon_pid = self.status()["pid"]
        return p

    def status(self):
        p = run([self.h.ckptfs, "status", self.mnt, "--json"], timeout=60)
        if p.returncode != 0:
            raise Failed(f"ckptfs status failed: {p.stdout.strip()}")
        return json.loads(p.stdout)

    def lost(self):
        # The full list: status carries only the first 100 (`ckptfs lost`).
        p = run([self.h.ckptfs, "lost", self.mnt, "--json"], timeout=60)
        if p.returncode != 0:
            raise Failed(f"ckptfs lost failed: {p.stdout.strip()}")
        out = set()
        for x in json.loads(p.stdout)["lost"]:
            x = x if isinstance(x, str) else x.get("path", "")
            if x.startswith(self.mnt + "/"):
                x = x[len(self.mnt) + 1:]
            out.add(x.lstrip("/"))
        return out

    def kill_daemon(self):
        if self.daemon_pid and pid_alive(self.daemon_pid):
            os.kill(self.daemon_pid, signal.SIGKILL)
        if self.daemon_pid and not wait_gone(self.daemon_pid, 30):
            raise Failed(f"daemon {self.daemon_pid} survived SIGKILL for 30 s")

    def remount_after_crash(self, env=None, expect_ok=True):
        """`ckptfs mount` on the dead mount: it is to detach it itself."""
        typ = mounted_type(self.mnt)
        p = self.mount(env=env, expect_ok=False)
        if p.returncode != 0 and typ and mounted_type(self.mnt):
            self.notes.append("BUG: ckptfs mount did not detach the dead mount itself; fusermount3 -uz did")
            subprocess.run(["fusermount3", "-uz", self.mnt], stderr=subprocess.DEVNULL)
            p = self.mount(env=env, expect_ok=False)
        if p.returncode != 0 and expect_ok:
            raise Failed(f"remount failed ({p.returncode}): {p.stdout.strip()}")
        return p

    def daemon_log(self):
        try:
            with open(os.path.join(self.state, "ckptfs.log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    # ---- writer ----
    def start_writer(self, steps, resume=False):
        pid = os.fork()
        if pid == 0:
            rc = 5
            try:
                os.setpgid(0, 0)
                import writer
                rc = writer.run(self.mnt, self.journal, self.seed, steps, self.compute_ms, self.latest_mode, resume,
                                self.fsync_backend, self.pace_ms, self.rank, self.nranks, self.barrier_dir)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(rc)
        self.writer_pid = pid
        self.writer_rc = None
        self.h.children.add(pid)
        return pid

    def wait_writer(self, timeout):
        """The writer's exit status, or None if it still runs after `timeout`."""
        end = time.monotonic() + timeout
        while self.writer_rc is None:
            pid, st = os.waitpid(self.writer_pid, os.WNOHANG)
            if pid:
                self.h.children.discard(self.writer_pid)
                self.writer_rc = os.waitstatus_to_exitcode(st)
                break
            if time.monotonic() >= end:
                break
            time.sleep(0.02)
        return self.writer_rc

    def wait_ready(self, nready, timeout=120):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            recs = load_journal(self.journal)
            if sum(1 for r in recs if r["op"] == "ready") >= nready or any(r["op"] in ("error", "internal") for r in recs):
                return
            if self.wait_writer(0) is not None:
                raise Failed(f"writer exited ({self.writer_rc}) before it was ready")
            time.sleep(0.02)
        raise Failed("writer not ready after 120 s")

    def journal_point(self):
        recs = load_journal(self.journal)
        last = recs[-1] if recs else {}
        what = last.get("path", last.get("step", last.get("at", "")))
        return f"journal #{len(recs)} ({last.get('op')} {what})"

    # ---- checks ----
    def check_backend(self, m, where, strict=True, lost=frozenset()):
        """P2 and P3 on the backend tree as it is (static: no daemon runs, or
        the drain is done)."""
        errs = []
        tree = walk(self.backend, BACKEND_SKIP)
        for rel, obs in sorted(tree.items()):
            if obs[0] == "dir":
                if rel not in m.dirs:
                    errs.append(f"P2 {where}: backend has dir {rel} the writer never made")
                continue
            if obs[0] != "file":
                errs.append(f"P2 {where}: backend {rel}: {obs}")
                continue
            if rel not in m.ever:
                errs.append(f"P2 {where}: backend has {rel}, a name the writer never wrote")
                continue
            ever = set(m.ever[rel])
            if m.writer_killed:
                ever.add("prefix")
            if obs[1] not in ever:
                why = classify(m, rel, obs[1], obs[2], lambda: read_all(os.path.join(self.backend, rel)),
                               ever)
                if why:
                    errs.append(f"P2 {where}: backend {rel}: {why}")
        latest = tree.get("latest")
        if latest and latest[0] == "file" and latest[2] > 0:
            text = read_all(os.path.join(self.backend, "latest")).decode(errors="replace")
            i, files = m.step_files(text)
            if files is None:
                errs.append(f"P3 {where}: backend latest is '{text}', never written by the writer")
            else:
                errs += latest_mismatches(tree, files, text, where)
                if strict:
                    acked, dirs = m.state_at(i)
                    for rel, s in sorted(acked.items()):
                        if m.touched_after(rel, i):
                            continue
                        got = tree.get(rel)
                        if s is ABSENT and got is not None:
                            errs.append(f"P3 {where}: backend latest is {text}, but {rel}, removed before it, is present")
                        elif s is not ABSENT and (got is None or got[0] != "file" or got[1] != s):
                            errs.append(f"P3 {where}: backend latest is {text}, but {rel}, closed before it and never touched again, is {'missing' if got is None else 'different'}")
                    for d, present in sorted(dirs.items()):
                        if not present and not m.touched_after(d, i) and d in tree:
                            errs.append(f"P3 {where}: backend latest is {text}, but dir {d}, removed before it, is present")
        if strict and m.barrier:
            errs += self.check_barrier(m, tree, where, lost)
        return errs

    def check_barrier(self, m, tree, where, lost=frozenset()):
        """P3: the backend is at or after the last acknowledged barrier (an
        fsync with --fsync=backend): the file fsynced, everything closed
        before it and everything removed before it, unless touched since."""
        errs = []
        b, rec = m.barrier
        acked, dirs = m.state_at(b)
        for rel, s in sorted(acked.items()):
            if m.touched_after(rel, b):
                continue
            got = tree.get(rel)
            if s is ABSENT and got is not None:
                errs.append(f"P3 {where}: {rel}, removed before the last barrier (record {b}), is in the backend")
            elif s is not ABSENT and (got is None or got[0] != "file" or got[1] != s):
                errs.append(f"P3 {where}: {rel}, closed before the last barrier (record {b}), is "
                            f"{'missing from' if got is None else 'different in'} the backend")
        for d, present in sorted(dirs.items()):
            if not present and not m.touched_after(d, b) and d in tree:
                errs.append(f"P3 {where}: dir {d}, removed before the last barrier (record {b}), is in the backend")
        p = rec["path"]
        moved = any(r.get("op") in ("begin_rename", "begin_rmtree") and (r["path"] == p or p.startswith(r["path"] + "/"))
                    for r in m.records[b:])
        got = tree.get(p)
        if p in lost and got is None:
            # A node reboot lost a newer acknowledged version of the fsynced
            # file: the file is listed lost, and its older copy removed from
            # the backend too, so the backend equals the mount again.
            self.notes.append(f"{p}: fsynced at record {b}, rewritten since; that version was lost (listed)")
        elif not moved and (got is None or got[0] != "file" or got[1] not in {rec["sha"]} | m.begun_after(p, b)):
            errs.append(f"P3 {where}: {p} was fsynced (--fsync=backend, record {b}) but the backend "
                        f"{'lacks it' if got is None else 'holds an older version'}")
        return errs

    def check_mount(self, m, where, lost, reboot, backend_at_crash):
        """P1 on the mount (and, on reboot, the "lost" list)."""
        errs = []
        tree = walk(self.mnt)
        for rel in sorted(lost):
            if rel in tree:
                errs.append(f"P1 {where}: {rel} is listed lost but still in the namespace (half-present)")
            if not reboot and ABSENT not in m.allowed(rel):
                errs.append(f"P1 {where}: {rel} listed lost after a daemon crash (the tier survived), "
                            "though its last close was acknowledged")
            elif not reboot:
                self.notes.append(f"{rel} (never closed) dropped and listed lost")
            if rel not in m.paths():
                errs.append(f"P1 {where}: lost lists {rel}, a path the writer never wrote")
            a = m.acked(rel)
            b = backend_at_crash.get(rel)
            if a and b and b[0] == "file" and b[1] == a:
                errs.append(f"P1 {where}: {rel} is listed lost but the backend held its acknowledged bytes at the crash")
        for rel in sorted(m.paths()):
            if rel in lost:
                continue
            allowed = m.allowed(rel)
            obs = tree.get(rel)
            if obs is None:
                if ABSENT not in allowed:
                    errs.append(f"P1 {where}: acknowledged {rel} is silently missing")
                continue
            if obs[0] == "error":
                errs.append(f"P1 {where}: {rel} is in the namespace but unreadable ({obs[1]})")
                continue
            if obs[0] != "file":
                errs.append(f"P1 {where}: {rel} is a {obs[0]}")
                continue
            why = classify(m, rel, obs[1], obs[2], lambda: read_all(os.path.join(self.mnt, rel)))
            if why:
                what = "acknowledged" if m.acked(rel) else "in-flight"
                errs.append(f"P1 {where}: {what} {rel}: {why}")
        for rel, obs in sorted(tree.items()):
            if obs[0] == "dir":
                if True not in m.dirs.get(rel, {False}):
                    errs.append(f"P1 {where}: dir {rel} present, removed (or never made) per the journal")
            elif rel not in m.paths():
                errs.append(f"P1 {where}: unexpected {obs[0]} {rel}")
        for d, allowed in sorted(m.dirs.items()):
            if allowed == {True} and tree.get(d) != ("dir",) and not any(x.startswith(d + "/") for x in lost):
                errs.append(f"P1 {where}: acknowledged dir {d} missing")
        return errs

    def check_equal(self, where):
        """After the drain: the backend equals the mount, names and bytes."""
        a = walk(self.mnt)
        b = walk(self.backend, BACKEND_SKIP)
        errs = []
        for rel in sorted(set(a) | set(b)):
            if a.get(rel) != b.get(rel):
                errs.append(f"P3 {where}: after drain, mount {rel}={fmt(a.get(rel))} but backend {fmt(b.get(rel))}")
        tmp = os.path.join(self.backend, ".ckptfs-tmp")
        staged = [n for n in os.listdir(tmp) if not n.startswith("lk-")] if os.path.isdir(tmp) else []
        if staged:  # lk-*: the daemons' locks (backend/posix_backend.cc)
            self.notes.append(f"{len(staged)} staged files left in .ckptfs-tmp after the drain")
        return errs

    @staticmethod
    def only_lost(p):
        # drain/umount exit 1 naming the files that are not in the backend:
        # lost ones are checked by check_mount (a crash may lose what was
        # never closed); a failed or held file is always a failure here.
        out = p.stdout
        return (p.returncode == 1 and "files are not in the backend" in out and "failed:" not in out
                and "holds at" not in out)

    def drain(self):
        p = run([self.h.ckptfs, "drain", self.mnt, "--timeout", "180"], timeout=240)
        if p.returncode != 0 and not self.only_lost(p):
            raise Failed(f"ckptfs drain failed ({p.returncode}): {p.stdout.strip()[-300:]}")

    def umount(self):
        p = run([self.h.ckptfs, "umount", self.mnt], timeout=300)
        if p.returncode != 0 and not self.only_lost(p):
            raise Failed(f"ckptfs umount failed ({p.returncode}): {p.stdout.strip()}")
        if self.daemon_pid and not wait_gone(self.daemon_pid, 60):
            raise Failed("daemon still running 60 s after ckptfs umount")

    # ---- the iteration ----
    def run(self):
        os.makedirs(self.mnt)
        os.makedirs(self.backend)
        env = {"CKPTFS_DRAIN_DELAY_MS": str(self.drain_delay_ms)}
        if self.fp:
            env["CKPTFS_FAILPOINT"] = self.fp
        self.mount(env=env)
        first_pid = self.daemon_pid
        watcher = Watcher(self.backend, self.journal)
        self.start_writer(self.steps)  # fork before the watcher thread starts
        errs = []
        try:
            watcher.start()
            self.wait_ready(1)
            t0 = time.monotonic()
            daemon_crashed = True
            if self.kind in ("kill", "reboot", "fp:load.recovery"):
                time.sleep(self.kill_delay)
                self.kill_point = f"SIGKILL after {time.monotonic() - t0:.2f}s at {self.journal_point()}"
                self.kill_daemon()
            elif self.kind == "trainer":
                time.sleep(self.kill_delay)
                self.kill_point = f"writer SIGKILL after {time.monotonic() - t0:.2f}s at {self.journal_point()}"
                os.killpg(self.writer_pid, signal.SIGKILL)
                daemon_crashed = False
            else:
                # Wait for the failpoint: the daemon dies, or the writer ends
                # and the drain finishes with the daemon still alive.
                while pid_alive(first_pid) and self.wait_writer(0.05) is None:
                    pass
                if pid_alive(first_pid):
                    run([self.h.ckptfs, "drain", self.mnt, "--timeout", "120"], timeout=180)
                    time.sleep(0.2)
                if pid_alive(first_pid):
                    self.notes.append(f"failpoint {self.fp} never reached: killed the daemon after the drain")
                    self.kill_point = f"failpoint {self.fp} not reached; SIGKILL at the end, {self.journal_point()}"
                    self.kill_daemon()
                else:
                    if f"failpoint {self.fp.split('@')[0]} reached" not in self.daemon_log():
                        self.notes.append("daemon died without the failpoint's log line")
                    self.kill_point = f"failpoint {self.fp} fired at {self.journal_point()}"
                    self.kill_daemon()
            rc = self.wait_writer(60)
            if rc is None:
                os.killpg(self.writer_pid, signal.SIGKILL)
                self.wait_writer(10)
                errs.append("writer hung on the dead mount for 60 s (its I/O should fail)")
        finally:
            watcher.stop.set()
            watcher.join(30)
        self.live_consistent = watcher.consistent
        if watcher.last_look() and watcher.consistent == 0 and not watcher.violations:
            errs.append(f"P3 watcher: the backend's latest is '{watcher.read_latest()}', "
                        "and the watcher never found it (or any latest) consistent")
        errs += [f"P3 while running: {v}" for v in watcher.violations]
        self.notes.append(f"watcher: {watcher.polls} polls, {self.live_consistent} consistent latest "
                          f"while the writer ran, {watcher.consistent} with the last look")

        recs = load_journal(self.journal)
        m = Model(recs, writer_killed=(self.kind == "trainer"))
        if any(r["op"] == "internal" for r in recs):
            raise Failed(f"writer: {[r for r in recs if r['op'] == 'internal']}")
        if daemon_crashed:
            if rc == 0:
                self.notes.append("writer finished before the crash")
            elif rc == 3:
                e = m.error
                if e and errno_name(e["errno"]) not in IO_ERRNOS:
                    self.notes.append(f"writer stopped with {errno_name(e['errno'])} at {e['at']}")
            elif rc == -signal.SIGABRT and m.error and errno_name(m.error["errno"]) in IO_ERRNOS \
                    and m.error["at"].endswith(".pt"):
                # torch 1.13's zip writer: an I/O error inside torch.save
                # (journaled above) is raised again by its C++ destructor,
                # which aborts the process. The writer did stop on the I/O
                # error; the abort is torch's (seed 5624841).
                self.notes.append(f"writer aborted inside torch.save after {errno_name(m.error['errno'])} "
                                  f"at {m.error['at']} (torch's zip writer destructor)")
            else:
                errs.append(f"writer exited {rc} (want 0 or 3: stopped by an I/O error)")

        # The backend as the crash left it.
        backend_at_crash = walk(self.backend, BACKEND_SKIP)
        errs += self.check_backend(m, "at crash")

        if daemon_crashed:
            if self.kind == "reboot":
                remove_tier(self.tier)  # its tmpfs too, as a reboot does
            if self.recovery_fp:
                p = self.remount_after_crash(env={"CKPTFS_FAILPOINT": self.recovery_fp}, expect_ok=False)
                fired = f"failpoint {self.recovery_fp.split('@')[0]} reached" in self.daemon_log()
                if p.returncode == 0 and self.daemon_pid and not wait_gone(self.daemon_pid, 0.5):
                    if not fired:
                        self.notes.append(f"failpoint {self.recovery_fp} never reached at mount")
                    self.kill_daemon()
                elif not fired:
                    self.notes.append(f"mount with {self.recovery_fp} failed without reaching it: {p.stdout.strip()}")
                self.kill_point += f"; then {self.recovery_fp} {'fired' if fired else 'not reached'} on remount"
            self.remount_after_crash()
            lost = self.lost()
            errs += self.check_mount(m, "after remount", lost, self.kind == "reboot", backend_at_crash)
            self.drain()
            lost2 = self.lost()
            errs += self.check_mount(m, "after drain", lost2, self.kind == "reboot", backend_at_crash)
            errs += self.check_backend(m, "after drain", lost=lost2)
            errs += self.check_equal("after drain")
        else:
            errs += self.check_mount(m, "after writer kill", set(), False, backend_at_crash)
            # The trainer restarts: reads latest and its model back, goes on.
            if self.wait_writer(0) == 0:
                self.notes.append("writer finished before it was killed")
            if os.path.exists(os.path.join(self.mnt, "latest")):
                n_ready = sum(1 for r in recs if r["op"] == "ready")
                self.start_writer(2, resume=True)
                self.wait_ready(n_ready + 1)
                rc = self.wait_writer(120)
                recs = load_journal(self.journal)
                if rc != 0:
                    errs.append(f"restarted writer exited {rc}: {recs[-1] if recs else ''}")
                res = [r for r in recs if r["op"] == "resumed"]
                if res:
                    self.notes.append(f"restarted writer loaded {res[-1]['path']} back and wrote 2 more steps")
                    m0 = Model(recs[:recs.index(res[-1])], writer_killed=True)
                    want = m0.acked(res[-1]["path"])
                    if want and want != res[-1]["sha"]:
                        errs.append(f"P1 restart read {res[-1]['path']} with sha {res[-1]['sha'][:12]}, acknowledged {want[:12]}")
                m = Model(recs, writer_killed=True)
            else:
                self.notes.append("killed before any latest: nothing to restart from")
            self.drain()
            errs += self.check_mount(m, "after restart", set(), False, backend_at_crash)
            errs += self.check_backend(m, "after drain")
            errs += self.check_equal("after drain")
        self.umount()
        return errs


# ---------------------------------------------------------------- multi-node mode

def merged_owner(models, rel):
    """The model (rank) that wrote `rel`: ranks write disjoint file names."""
    for m in models:
        if rel in m.ever:
            return m
    return None


def check_backend_cluster(models, tree, backend, where, may_miss=frozenset()):
    """Multi-node mode, on a backend that does not move: P2 under every name
    (each file a version its rank began), P3 across nodes (`latest` names a
    step whose files from every rank are all there, each the acknowledged
    version: cluster_step_files), but for the files of `may_miss` absent
    from the backend (mn-lost: lost with their node)."""
    errs = []
    for rel, obs in sorted(tree.items()):
        if obs[0] == "dir":
            if not any(rel in m.dirs for m in models):
                errs.append(f"P2 {where}: backend has dir {rel} no rank ever made")
            continue
        if obs[0] != "file":
            errs.append(f"P2 {where}: backend {rel}: {obs}")
            continue
        m = merged_owner(models, rel)
        if m is None:
            errs.append(f"P2 {where}: backend has {rel}, a name no rank wrote")
            continue
        if obs[1] not in m.ever[rel]:
            why = classify(m, rel, obs[1], obs[2], lambda: read_all(os.path.join(backend, rel)), m.ever[rel])
            if why:
                errs.append(f"P2 {where}: backend {rel}: {why}")
    latest = tree.get("latest")
    if latest and latest[0] == "file" and latest[2] > 0:
        text = read_all(os.path.join(backend, "latest")).decode(errors="replace")
        files, why = cluster_step_files(models, text)
        if files is None:
            errs.append(f"P3 {where}: backend latest is '{text}', {why}")
        else:
            files = {rel: s for rel, s in files.items() if rel in tree or rel not in may_miss}
            errs += latest_mismatches(tree, files, text, where)
    return errs


class ClusterWatcher(Watcher):
    """The watcher across nodes: `latest` (rank 0's) must never name a step
    whose files from every rank are not all in the backend, each the
    acknowledged version (P3), and no file may hold bytes its rank never
    began (P2); the same tolerance of a live tree as Watcher."""

    def __init__(self, backend, journals):
        super().__init__(backend, None)
        self.journals = journals

    def models(self):
        return [Model(load_journal(j)) for j in self.journals]

    def poll(self):
        self.polls += 1
        v = self.read_latest()
        if v and v.startswith("step_"):
            files, why = cluster_step_files(self.models(), v)
            if files is None:
                if self.read_latest() == v:
                    self.violations.append(f"backend latest is '{v}', {why}")
                return
            bad = self.mismatched(files)
            if bad:
                if self.read_latest() == v:
                    self.torn(v, bad)
            else:
                self.consistent += 1
        if self.polls % 5 == 0:
            models = self.models()
            for rel, obs in walk(self.backend, BACKEND_SKIP).items():
                if obs[0] != "file":
                    continue
                m = merged_owner(models, rel)
                if m is not None and obs[1] in m.ever.get(rel, ()):
                    continue
                models2 = self.models()
                m2 = merged_owner(models2, rel)
                if m2 is not None and obs[1] in m2.ever.get(rel, ()):
                    continue
                try:  # the file may have been replaced since the walk
                    if self.file_sha(rel) != obs[1]:
                        continue
                except FileNotFoundError:
                    continue
                if m2 is None:
                    self.violations.append(f"backend file {rel}: a name no rank wrote")
                else:
                    self.violations.append(f"backend file {rel}: {classify(m2, rel, obs[1], obs[2], lambda: read_all(os.path.join(self.backend, rel)), m2.ever.get(rel, set()))}")

    def torn(self, v, bad):
        """`latest`, still `v` after the look, names files the backend does
        not hold as acknowledged: bad, [(rel, what)]."""
        self.violations.append(f"backend latest names {v} but " + "; ".join(f"{r} {w}" for r, w in bad))


class MultiIteration:
    """--nodes N: N mounts with --cluster over one backend, one writer per
    node (rank = node index), kill -9 of one random node's daemon (see the
    file's comment, "Multi-node mode"). NodeLoss, below, varies the crash
    and what follows it (the hooks kill, recover, final_checks)."""

    kind = "mn-kill"

    def __init__(self, h, seed):
        self.h = h
        self.seed = seed
        r = random.Random(f"mn:{seed}")
        self.n = h.nodes
        self.steps = r.randrange(6, 9)
        self.compute_ms = r.choice([20, 50])
        self.pace_ms = r.choice([2, 5])
        self.drain_delay_ms = r.choice([30, 80])
        self.latest_mode = r.choice(["inplace", "rename"])
        self.victim = r.randrange(self.n)
        self.kill_delay = r.uniform(0.05, 1.5)
        self.dir = os.path.join(h.root, f"it-{seed}")
        self.backend = os.path.join(self.dir, "backend")
        self.barrier = os.path.join(self.dir, "barrier")
        self.notes = Notes()
        self.live_consistent = 0
        self.kill_point = "?"
        self.tier = f"{h.tier_prefix}-{seed}"
        self.nodes = [self.make_node(k, f"n{k}", os.path.join(self.dir, f"node{k}", "state"), f"{self.tier}-{k}")
                      for k in range(self.n)]
        self.tier_dirs = [x.tier for x in self.nodes]
        self.backend_at_crash = {}

    def make_node(self, k, node_id, state, tier):
        """Node k (rank k's writer) mounting with --node node_id."""
        x = Iteration(self.h, self.seed)
        x.dir = self.dir
        x.mnt = os.path.join(self.dir, f"node{k}", "mnt")
        x.state = state
        x.journal = os.path.join(self.dir, f"journal-{k}.jsonl")
        x.tier = tier
        x.backend = self.backend
        x.cache = "1G"
        x.fsync_backend = False
        x.steps, x.compute_ms, x.pace_ms, x.latest_mode = self.steps, self.compute_ms, self.pace_ms, self.latest_mode
        x.notes = self.notes
        x.rank, x.nranks, x.barrier_dir = k, self.n, self.barrier
        # --shared-ttl 0: each node's P1 is checked against its own
        # writer's journal, so it must show its own files only (the
        # shared namespace has its own cases: shared_namespace.sh).
        x.extra_args = ["--cluster", f"cm{self.seed}", "--node", node_id, "--shared-ttl", "0"]
        if self.h.cluster_store:
            x.extra_args += ["--cluster-store", self.h.cluster_store]
        return x

    def describe(self):
        return (f"seed={self.seed} kind={self.kind} nodes={self.n} victim=n{self.victim}"
                f"{' (rank 0)' if self.victim == 0 else ''} steps={self.steps} latest={self.latest_mode} "
                f"drain_delay={self.drain_delay_ms}ms")

    def daemon_log(self):
        return self.nodes[self.victim].daemon_log()

    def models(self):
        return [Model(load_journal(x.journal)) for x in self.nodes]

    def mounted(self):
        """The nodes to unmount at the end."""
        return self.nodes

    def finish_rotation(self):
        """The killed rank may have stopped half way through removing its
        old steps, which rank 0's removal (or another rank's) has taken
        from the backend already: it does what the restarted rank would,
        journaled in its journal, so that its mount and the backend agree."""
        rotated = set()
        for x in self.nodes:
            for rec in load_journal(x.journal):
                if rec.get("op") == "begin_rmtree":
                    rotated.add(rec["path"])
        for x in self.nodes:
            for d in sorted(rotated):
                if os.path.lexists(os.path.join(x.mnt, d)):
                    j = writer_journal(x.journal)
                    j.log(op="begin_rmtree", path=d)
                    shutil.rmtree(os.path.join(x.mnt, d))
                    j.log(op="rmtree", path=d)
                    self.notes.append(f"n{x.rank}: finished the removal of {d} its writer did not (as a restart would)")

    def check_union(self, where):
        """After the drain: the backend equals the union of the mounts."""
        union, errs = {}, []
        for x in self.nodes:
            for rel, obs in walk(x.mnt).items():
                if rel in union and union[rel] != obs:
                    errs.append(f"P3 {where}: {rel} is {fmt(union[rel])} on one node, {fmt(obs)} on n{x.rank}")
                union.setdefault(rel, obs)
        b = walk(self.backend, BACKEND_SKIP)
        for rel in sorted(set(union) | set(b)):
            if union.get(rel) != b.get(rel):
                errs.append(f"P3 {where}: after drain, the nodes hold {rel}={fmt(union.get(rel))} but the backend "
                            f"{fmt(b.get(rel))}")
        return errs

    def check_mounts(self, models, where, skip=None):
        """P1 on every node's mount (but `skip`'s) against its own writer's journal."""
        errs = []
        for x, m in zip(self.nodes, models):
            if x is not skip:
                errs += [e.replace("P1 ", f"P1 n{x.rank} ", 1) for e in
                         Iteration.check_mount(x, m, where, x.lost(), False, self.backend_at_crash)]
        return errs

    # ---- the steps of run() that NodeLoss varies ----
    def make_watcher(self):
        return ClusterWatcher(self.backend, [x.journal for x in self.nodes])

    def watch(self):
        self.watcher.start()

    def kill(self, v, t0):
        self.kill_point = f"SIGKILL n{self.victim} after {time.monotonic() - t0:.2f}s at {v.journal_point()}"
        v.kill_daemon()

    def recover(self, v, errs, t1):
        """After the writers stopped: the killed node mounts again, every
        node drains. Returns the writers' models."""
        # The backend as the crash left it: the live nodes' drains may
        # still move it (the watcher goes on, through the remount of
        # the killed node and the drain of every node).
        self.backend_at_crash = walk(self.backend, BACKEND_SKIP)
        v.remount_after_crash()
        self.notes.append(f"remount: {time.monotonic() - t1:.1f}s")
        errs += self.check_mounts(self.models(), "after remount")
        self.finish_rotation()
        for x in self.nodes:
            td = time.monotonic()
            x.drain()
            self.notes.append(f"drain n{x.rank}: {time.monotonic() - td:.1f}s")
        self.notes.append(f"remount, checks and drain of every node: {time.monotonic() - t1:.1f}s")
        return self.models()

    def final_checks(self, models):
        errs = self.check_mounts(models, "after drain")
        errs += check_backend_cluster(models, walk(self.backend, BACKEND_SKIP), self.backend, "after drain")
        return errs + self.check_union("after drain")

    @staticmethod
    def wait_or_kill(x, secs):
        """x's writer's exit status, or None once it was killed for not
        exiting within `secs`."""
        rc = x.wait_writer(secs)
        if rc is None:
            os.killpg(x.writer_pid, signal.SIGKILL)
            x.wait_writer(10)
        return rc

    def stop_writers(self, v):
        """The killed node's writer must stop on an I/O error; the others
        are told to stop at their next barrier."""
        errs = []
        rc = self.wait_or_kill(v, 60)
        if rc is None:
            errs.append(f"n{self.victim}'s writer hung on the dead mount for 60 s (its I/O should fail)")
        elif rc not in (0, 3):
            errs.append(f"n{self.victim}'s writer exited {rc} (want 0 or 3: stopped by an I/O error)")
        elif rc == 0:
            self.notes.append("the killed node's writer finished before the crash")
        with open(os.path.join(self.barrier, "abort"), "w"):
            pass  # the other ranks stop at their next barrier
        for x in self.nodes:
            if x is v:
                continue
            rc = self.wait_or_kill(x, 120)
            if rc is None:
                errs.append(f"n{x.rank}'s writer did not stop at its barrier in 120 s")
            elif rc not in (0, 6):
                errs.append(f"n{x.rank}'s writer exited {rc} (its daemon lives: want 0, or 6 at the barrier)")
        for x in self.nodes:
            recs = load_journal(x.journal)
            if any(r["op"] == "internal" for r in recs):
                raise Failed(f"writer n{x.rank}: {[r for r in recs if r['op'] == 'internal']}")
        return errs

    def run(self):
        os.makedirs(self.backend)
        os.makedirs(self.barrier)
        env = {"CKPTFS_DRAIN_DELAY_MS": str(self.drain_delay_ms)}
        for x in self.nodes:
            os.makedirs(x.mnt)
            x.mount(env=env)
        self.watcher = watcher = self.make_watcher()
        for x in self.nodes:  # fork before the watcher thread starts
            x.start_writer(self.steps)
        v = self.nodes[self.victim]
        errs = []
        try:
            self.watch()
            for x in self.nodes:
                x.wait_ready(1)
            t0 = time.monotonic()
            time.sleep(self.kill_delay)
            self.kill(v, t0)
            errs += self.stop_writers(v)
            self.live_consistent = watcher.consistent
            models = self.recover(v, errs, time.monotonic())
        finally:
            watcher.stop.set()
            watcher.join(30)
        seen = watcher.last_look()
        for _ in range(5):
            watcher.poll_once()
        # A look at a latest that stands without files lost with a node
        # (mn-lost) is judged by final_checks (judge_torn), not here.
        if seen and watcher.consistent + watcher.deferred == 0 and not watcher.violations:
            errs.append(f"P3 watcher: the backend's latest is '{watcher.read_latest()}', "
                        "and the watcher never found it (or any latest) consistent")
        errs += [f"P3/P2 while running, after the crash or in the drain: {x}" for x in watcher.violations]
        self.notes.append(f"watcher: {watcher.polls} polls, {self.live_consistent} consistent latest "
                          f"until the writers stopped, {watcher.consistent} until the drain ended, "
                          f"{watcher.deferred} without files lost with the node (judged below)")
        errs += self.final_checks(models)
        t2 = time.monotonic()
        for x in self.mounted():
            x.umount()
        self.notes.append(f"umount of every node: {time.monotonic() - t2:.1f}s")
        return errs


# ---------------------------------------------------------------- node loss (mn-lost)

SAFE_STATES = ("replicated", "persisted")
# A file closed this long before its node was lost is named in the node's
# record (at risk: listed lost), the store's round trip included.
RECORD_WINDOW_S = 0.2


def begun_removals(models):
    """Every dir some rank began to remove."""
    return [r["path"] for m in models for r in m.records if r.get("op") == "begin_rmtree"]


def must_survive(vm, safe, removed):
    """P1' (mn-lost): which of the lost node's files must survive it. vm:
    its writer's model; safe: {rel: sha} seen `replicated` or `persisted`
    before the kill (StatePoller); removed: begun_removals of every rank.
    Returns (required, at_risk), each {rel: acknowledged sha}: every file
    acknowledged when the writer stopped (not removed, not in flight),
    required if that version was seen safe. Left out of both: a file the
    writer renamed (whether the rename's own replica was held is not shown
    anywhere: it may be lost with the node, docs/consistency.md,
    "Replicas"), and any under a step some rank began to remove (rank 0's
    removal takes every rank's shards from the backend)."""
    renamed = set()
    for r in vm.records:
        if r.get("op") == "begin_rename":
            renamed |= {r["path"], r["to"]}
    required, at_risk = {}, {}
    for rel in sorted(vm.paths()):
        a = vm.acked(rel)
        if a is None or rel in renamed or any(under(rel, d) for d in removed):
            continue
        (required if safe.get(rel) == a else at_risk)[rel] = a
    return required, at_risk


def check_survived(required, tree, where):
    """P1': every required file {rel: sha} is in `tree` (walk()) with its acknowledged bytes."""
    errs = []
    for rel, want in sorted(required.items()):
        got = tree.get(rel)
        if got is None or got[0] != "file" or got[1] != want:
            errs.append(f"P1' {where}: {rel}, acknowledged and replicated or persisted before the node was lost, "
                        f"is {fmt(got)}, acknowledged file({want[:12]})")
    return errs


def step_no(text):
    try:
        return int(text[len("step_"):]) if text and text.startswith("step_") else 0
    except ValueError:
        return 0


def unsafe_latests(m, seen):
    """The steps of the `latest` versions this writer (rank 0) closed that
    were never seen safe (seen: {(rel, sha)}, StatePoller), and of every
    latest.tmp: whether its rename into `latest` was replicated is not
    shown anywhere."""
    return [step_no(m.gen_for(r["path"], r["sha"])["gen"].get("text")) for r in m.records
            if r.get("op") == "closed" and (r["path"] == "latest.tmp"
                                            or r["path"] == "latest" and ("latest", r["sha"]) not in seen)]


def judge_torn(looks, tree, required, lost_paths, removed, unsafe):
    """P3 (mn-lost) on the looks at a `latest` that named files missing from
    the backend once the node was lost: looks, {(latest, {rel})}. A file
    may be missing only as one of the lost node's, lost with it: absent for
    good (`tree`, after every drain) and not required (must_survive); one
    there now reached the backend after that `latest`. A live rank's file
    under a step some rotation removed (`removed`, dirs) while rank 0's
    newer `latest` was never seen replicated (`unsafe`: unsafe_latests) is
    the hole stop 44 closed (such removals are kept out of the backend):
    named so in the error. Returns the errors."""
    errs = set()
    for v, rels in looks:
        for rel in sorted(rels):
            if rel in tree:
                errs.add(f"P3 after the loss: backend latest named {v} while {rel} was missing; {rel} reached "
                         "the backend after it")
            elif rel in lost_paths and rel not in required:
                continue
            elif any(n > step_no(v) for n in unsafe) and any(under(rel, d) for d in removed):
                errs.add(f"P3 after the loss: backend latest named {v} without {rel}: rank 0 was lost with a newer "
                         "latest not yet replicated, and a rotation ordered after it reached the backend")
            else:
                errs.add(f"P3 after the loss: backend latest named {v} without {rel}")
    return sorted(errs)


class StatePoller(threading.Thread):
    """mn-lost: until the kill, reads user.ckptfs.state of the lost-to-be
    node's acknowledged files. `safe` maps each file seen `replicated` or
    `persisted` to that version: the journal acknowledged that same sha
    before and after the read, so the state read was that version's."""

    def __init__(self, mnt, journal):
        super().__init__(daemon=True)
        self.mnt, self.journal = mnt, journal
        self.stop = threading.Event()
        self.safe, self.states, self.polls = {}, {}, 0
        self.seen = set()  # every (rel, sha) seen safe

    def acked(self):
        m = Model(load_journal(self.journal))
        return {p: m.acked(p) for p in m.paths() if m.acked(p)}

    def poll(self):
        seen = {}
        for rel, s in self.acked().items():
            if self.safe.get(rel) == s:
                continue
            try:
                st = os.getxattr(os.path.join(self.mnt, rel), "user.ckptfs.state").decode()
            except OSError:
                continue
            if st in SAFE_STATES:
                seen[rel] = (s, st)
        after = self.acked()
        for rel, (s, st) in seen.items():
            if after.get(rel) == s:
                self.safe[rel], self.states[rel] = s, st
                self.seen.add((rel, s))
        self.polls += 1

    def run(self):
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(0.03)


class LossWatcher(ClusterWatcher):
    """ClusterWatcher for mn-lost: once the node is lost, `latest` may name
    a step whose files from that node are missing when they were lost with
    it (docs/consistency.md, "Member timeout and death"): a look that finds
    files missing then is kept in `unsure` and judged at the end
    (judge_torn); a wrong version is a violation at once."""

    def __init__(self, backend, journals, victim):
        super().__init__(backend, journals)
        self.victim = victim
        self.lost = threading.Event()  # set just before the kill
        self.unsure = set()

    def poll(self):
        self.after_loss = self.lost.is_set()
        super().poll()

    def torn(self, v, bad):
        if self.after_loss and all(w == "missing" for _, w in bad):
            self.unsure.add((v, frozenset(r for r, _ in bad)))
            self.deferred += 1
        else:
            super().torn(v, bad)


class NodeLoss(MultiIteration):
    """--nodes N --kind mn-lost (issue #30): the cluster mounts with
    --replicas 1 over an etcd store; the victim's daemon is killed and its
    tier and state dir deleted (a lost machine); a fresh node mounts in its
    place once every live node drained (see the file's comment, "Node
    loss")."""

    kind = "mn-lost"

    def __init__(self, h, seed):
        self.secret = os.path.join(h.root, f"it-{seed}", "secret")
        super().__init__(h, seed)
        r = random.Random(f"mn-lost:{seed}")
        # Late enough that some of the victim's files are replicated, early
        # enough that its writer is still at work (the writers run 1.5-2.5 s).
        self.kill_delay = r.uniform(0.3, 1.8)
        self.fresh_id = f"n{self.victim}" if r.random() < 0.5 else f"n{self.n + self.victim}"
        self.fresh = None
        self.tier_dirs += [t + "-replicas" for t in self.tier_dirs]  # the replica stores (other members' files)
        self.poller = StatePoller(self.nodes[self.victim].mnt, self.nodes[self.victim].journal)
        self.safe = {}

    def make_node(self, k, node_id, state, tier):
        x = super().make_node(k, node_id, state, tier)
        x.extra_args += ["--replicas", "1", "--replica-listen", "127.0.0.1:0", "--cluster-secret", self.secret,
                         "--member-timeout", "2"]
        return x

    def describe(self):
        return super().describe() + f" fresh node {self.fresh_id}"

    def daemon_log(self):
        logs = [os.path.join(self.dir, "lost-node.log")] + [os.path.join(x.state, "ckptfs.log") for x in self.mounted()]
        out = []
        for p in logs:
            try:
                with open(p, errors="replace") as f:
                    out += [line for line in f if "own failure group" not in line]  # every file, 3 nodes
            except FileNotFoundError:
                pass
        return "".join(out)

    def survivors(self):
        return [x for x in self.nodes if x.rank != self.victim]

    def mounted(self):
        return self.survivors() + ([self.fresh] if self.fresh else [])

    def make_watcher(self):
        return LossWatcher(self.backend, [x.journal for x in self.nodes], self.victim)

    def watch(self):
        super().watch()
        self.poller.start()
        self.leader = self.nodes[0].status()["cluster"]["leader"]

    def run(self):
        os.makedirs(self.dir)
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
        return super().run()

    def kill(self, v, t0):
        """The victim's machine is lost: its daemon killed, then its tier
        (with the replicas it held for others) and state dir deleted (its
        log kept aside for the report)."""
        self.poller.stop.set()
        self.poller.join(30)
        self.safe = dict(self.poller.safe)
        self.watcher.lost.set()
        self.kill_wall = time.time()
        super().kill(v, t0)
        try:
            shutil.copy(os.path.join(v.state, "ckptfs.log"), os.path.join(self.dir, "lost-node.log"))
        except OSError:
            pass
        remove_tier(v.tier)
        remove_tier(v.tier + "-replicas")
        shutil.rmtree(v.state)

    def recover(self, v, errs, t1):
        # Its writer stopped: the dead mount can go (before, the writer
        # could have gone on in the directory beneath it).
        subprocess.run(["fusermount3", "-uz", v.mnt], stderr=subprocess.DEVNULL)
        for x in self.survivors():
            td = time.monotonic()
            x.drain()
            self.notes.append(f"drain n{x.rank}: {time.monotonic() - td:.1f}s")
        errs += self.wait_takeover()
        self.notes.append(f"drain of every live node and the takeover: {time.monotonic() - t1:.1f}s")
        self.fresh = self.make_node(self.victim, self.fresh_id,
                                    os.path.join(self.dir, f"node{self.victim}", "fresh-state"),
                                    f"{self.tier}-{self.victim}-fresh")
        self.tier_dirs += [self.fresh.tier, self.fresh.tier + "-replicas"]
        self.fresh.mount()
        return self.models()

    def wait_takeover(self, timeout=60):
        """Until the live nodes hold no replica but the published ones."""
        end = time.monotonic() + timeout
        while True:
            reps = {x.rank: x.status()["cluster"] for x in self.survivors()}
            held = sum(c["replicas"]["held_files"] + c["replicas"].get("held_entries", 0) for c in reps.values())
            if held == 0 or time.monotonic() > end:
                break
            time.sleep(0.2)
        errs = [f"the live nodes still hold {held} replicas (files, entries) {timeout} s after their drain"] if held else []
        for k, c in reps.items():
            r = c["replicas"]
            entries = f" and applied {r['entries_applied_for_dead']} entries" if "entries_applied_for_dead" in r else ""
            self.notes.append(f"n{k}: published {r.get('published_for_dead')} files{entries} for the lost node "
                              f"({r.get('already_in_backend')} already in the backend), lost {r.get('lost_for_dead')}, "
                              f"{r.get('takeover_failures')} takeover failures; lists {c['lost_count']} files lost; "
                              f"kept {c.get('kept_removals', 0)} removals out of the backend "
                              f"{' '.join(c.get('kept_paths', [])[:4])}")
        self.listed_lost = max(c["lost_count"] for c in reps.values())
        self.listed_paths = {e["path"] for c in reps.values() for e in c.get("lost", [])}
        return errs

    def final_checks(self, models):
        v, m0 = self.nodes[self.victim], models[self.victim]
        errs = self.check_mounts(models, "after drain", skip=v)
        tree = walk(self.backend, BACKEND_SKIP)
        removed = begun_removals(models)
        required, at_risk = must_survive(m0, self.safe, removed)
        # P2, and P3 for files of a wrong version; missing ones: judge_torn.
        everything = set().union(*(m.paths() for m in models))
        errs += check_backend_cluster(models, tree, self.backend, "after drain", may_miss=everything)
        looks = set(self.watcher.unsure)
        text = read_all(os.path.join(self.backend, "latest")).decode(errors="replace") if "latest" in tree else ""
        files, _ = cluster_step_files(models, text) if text.startswith("step_") else (None, None)
        if files and set(files) - set(tree):
            looks.add((text, frozenset(set(files) - set(tree))))
        unsafe = unsafe_latests(m0, self.poller.seen) if self.victim == 0 else []
        errs += judge_torn(looks, tree, required, m0.paths(), removed, unsafe)
        errs += check_survived(required, tree, "backend after drain")
        fresh = walk(self.fresh.mnt)
        errs += check_survived(required, fresh, f"on the fresh node {self.fresh_id}")
        for rel in sorted(set(fresh) | set(tree)):
            if fresh.get(rel) != tree.get(rel):
                errs.append(f"P1' on the fresh node {self.fresh_id}: {rel}={fmt(fresh.get(rel))} but the backend "
                            f"{fmt(tree.get(rel))}")
        states = sorted(self.poller.states[r] for r in required)
        self.notes.append(f"n{self.victim}'s files seen safe before the kill ({self.poller.polls} looks): "
                          f"{states.count('replicated')} replicated, {states.count('persisted')} persisted: "
                          "each must be in the backend and on the fresh node")
        lost = sorted(rel for rel in at_risk if rel not in tree)
        if at_risk:
            self.notes.append(f"{len(at_risk)} acknowledged files not seen replicated before the kill: "
                              f"{len(at_risk) - len(lost)} in the backend, {len(lost)} lost: {' '.join(lost)}")
        if [rel for rel in lost if rel not in self.listed_paths]:
            # A close acknowledged just before the kill may not be in the
            # node's record yet: the record is written one store round trip
            # after the replicator sees the close (docs/consistency.md,
            # "Member timeout and death"). Earlier than RECORD_WINDOW_S, it
            # should have been.
            closed = {r["path"]: r["t"] for r in m0.records if r.get("op") == "closed"}
            early = [rel for rel in lost if self.kill_wall - closed.get(rel, self.kill_wall) > RECORD_WINDOW_S]
            self.notes.append(f"n{self.victim} was lost with {len(lost)} acknowledged files, {self.listed_lost} "
                              f"listed lost, the elected reducer being {self.leader}; closed before the kill by "
                              + ", ".join(f"{self.kill_wall - closed[r]:.3f}s" for r in lost if r in closed))
            unlisted = [rel for rel in early if rel not in self.listed_paths]
            if unlisted:
                self.notes.append("BUG: a node lost with files not persisted, and no live node lists "
                                  f"{' '.join(unlisted)} lost (status cluster.lost; lost_count {self.listed_lost}), "
                                  f"closed more than {RECORD_WINDOW_S}s before the kill")
        for v_, rels in sorted(self.watcher.unsure):
            if not (rels & set(tree)):
                self.notes.append(f"latest {v_} stood without {' '.join(sorted(rels))}")
        return errs


def writer_journal(path):
    import writer
    return writer.Journal(path)


class Notes(list):
    """A list that keeps each note once."""

    def append(self, x):
        if x not in self:
            super().append(x)


def fmt(o):
    if o is None:
        return "absent"
    if o[0] == "file":
        return f"file({o[1][:12]},{o[2]})"
    return "/".join(o)


# ---------------------------------------------------------------- the harness

class Harness:
    def __init__(self, args):
        build = os.environ.get("BUILD", "build")
        if not os.path.isabs(build):
            build = os.path.join(ROOT, build)
        self.ckptfs = os.path.join(build, "ckptfs")
        base = args.root or os.environ.get("CKPTFS_TEST_ROOT") or os.environ.get("TMPDIR") or "/tmp"
        os.makedirs(base, exist_ok=True)
        import tempfile
        self.root = tempfile.mkdtemp(prefix="ckptfs-crash.", dir=base)
        os.chmod(self.root, 0o755)
        self.tier_prefix = args.tier_prefix or f"/dev/shm/ckptfs-crash-{os.getpid()}"
        self.tiers = set()
        self.children = set()
        self.keep = args.keep or os.environ.get("KEEP") == "1"
        self.nodes = args.nodes
        self.cluster_store = args.cluster_store
        self.kind = args.kind
        self.failed_dirs = []
        self.bugs = {}  # note starting with "BUG" -> seeds
        self.live_seen = 0  # iterations whose watcher saw a consistent latest while the writer ran
        self.failures = []  # (seed, first errors) of each failed iteration

    def preflight(self):
        if not os.path.exists("/dev/fuse"):
            raise Skip("no /dev/fuse")
        try:
            os.close(os.open("/dev/fuse", os.O_RDWR))
        except OSError as e:
            raise Skip(f"cannot open /dev/fuse: {e}")
        if not shutil.which("fusermount3"):
            raise Skip("no fusermount3")
        if not os.access(self.ckptfs, os.X_OK):
            raise Failed(f"no {self.ckptfs}: run make (BUILD={os.environ.get('BUILD', 'build')})")
        try:
            import torch  # noqa: F401 — once here; forked writers inherit it
        except ImportError:
            raise Skip("no torch for /usr/bin/python3")

    def cleanup_iteration(self, it, passed):
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.children.discard(pid)
        self.cleanup_mounts(it.dir)
        for t in getattr(it, "tier_dirs", [it.tier]):
            remove_tier(t)
            self.tiers.discard(t)
        bug = any(n.startswith("BUG") for n in getattr(it, "notes", ()))
        if (passed and not bug) or not self.keep:  # --keep: a failed one, or one with a BUG: note
            shutil.rmtree(it.dir, ignore_errors=True)
        else:
            self.failed_dirs.append(it.dir)

    def cleanup_mounts(self, under):
        with open("/proc/self/mounts", errors="surrogateescape") as f:
            mnts = [l.split()[1] for l in f]
        for m in sorted((m for m in mnts if m.startswith(under + "/")), reverse=True):
            subprocess.run(["fusermount3", "-uz", m], stderr=subprocess.DEVNULL)
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "ckptfs" in cmd and " mount " in cmd and (under + "/") in cmd:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def cleanup_all(self):
        for pid in list(self.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cleanup_mounts(self.root)
        for t in list(self.tiers):
            remove_tier(t)
        if self.failed_dirs:
            log(f"kept failed iteration dirs: {' '.join(self.failed_dirs)}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def iteration(self, seed):
        if self.nodes == 1:
            it = Iteration(self, seed)
        else:
            it = NodeLoss(self, seed) if self.kind == "mn-lost" else MultiIteration(self, seed)
        t0 = time.monotonic()
        passed = False
        try:
            errs = it.run()
        except Failed as e:
            errs = [str(e)]
        except Exception:
            errs = ["harness error: " + traceback.format_exc()]
        finally:
            dt = time.monotonic() - t0
        passed = not errs
        if it.live_consistent > 0:
            self.live_seen += 1
        log(f"[{'PASS' if passed else 'FAIL'}] {it.describe()}")
        log(f"       kill point: {it.kill_point}; {dt:.1f}s")
        for n in it.notes:
            if n.startswith("BUG"):
                self.bugs.setdefault(n, []).append(seed)
            log(f"       note: {n}")
        for e in errs[:25]:
            log(f"       {e}")
        if len(errs) > 25:
            log(f"       ... and {len(errs) - 25} more")
        if not passed:
            self.failures.append((seed, errs[:5]))
            tail = [l for l in it.daemon_log().splitlines() if " W " in l or " E " in l or " C " in l][-12:]
            for l in tail:
                log(f"       | {l}")
            nodes = f"--nodes {self.nodes} " if self.nodes > 1 else ""
            if self.kind == "mn-lost":
                nodes += "--kind mn-lost --cluster-store etcd://HOST:PORT "
            log(f"       reproduce: tests/crash/harness.py {nodes}--seed {seed} --iterations 1")
        self.cleanup_iteration(it, passed)
        return passed


def main():
    ap = argparse.ArgumentParser(description="ckptfs crash harness (see the file's comment)")
    ap.add_argument("--seed", type=int, help="first seed (default: random)")
    ap.add_argument("--iterations", type=int, help="how many seeds from --seed on (default 1 with --seed)")
    ap.add_argument("--bounded", action="store_true", help="the make test set: one seed of each kind (bounded_seeds)")
    ap.add_argument("--only", help="run only seeds whose kind contains this word (kill, reboot, fp:evict.mid...)")
    ap.add_argument("--root", help="where iteration dirs go")
    ap.add_argument("--tier-prefix", help="tier dirs are PREFIX-<seed> (default /dev/shm/ckptfs-crash-<pid>)")
    ap.add_argument("--keep", action="store_true", help="keep failed iteration dirs")
    ap.add_argument("--nodes", type=int, default=1,
                    help="multi-node mode: N >= 2 mounts with --cluster over one backend, kill -9 of one node's "
                         "daemon (--kind; --bounded: one iteration)")
    ap.add_argument("--cluster-store", help="with --nodes: the members' records in this etcd (etcd://HOST:PORT,...)")
    ap.add_argument("--kind", choices=["mn-kill", "mn-lost"], default="mn-kill",
                    help="with --nodes: mn-kill (default) or mn-lost: the victim's machine is lost (daemon, tier "
                         "and state dir), --replicas 1; needs --cluster-store")
    args = ap.parse_args()
    if args.cluster_store and args.nodes < 2:
        ap.error("--cluster-store needs --nodes N >= 2")
    if args.nodes < 1 or args.nodes > 8:
        ap.error("--nodes: 1 to 8")
    if args.kind != "mn-kill" and args.nodes < 2:
        ap.error("--kind: with --nodes N >= 2")
    if args.kind == "mn-lost" and not args.cluster_store:
        log("SKIP: kind mn-lost needs --cluster-store (the replicas' links are found in etcd)")
        return 77
    if args.nodes > 1:
        if args.only:
            ap.error("--only does not apply with --nodes (the kind is --kind)")
        base = args.seed if args.seed is not None else random.randrange(1, 10 ** 7)
        seeds = list(range(base, base + (1 if args.bounded else args.iterations or 1)))
    elif args.bounded:
        seeds = bounded_seeds(args.seed if args.seed is not None else random.randrange(1, 10 ** 6) * len(KINDS))
    else:
        base = args.seed if args.seed is not None else random.randrange(1, 10 ** 7)
        n = args.iterations or 1
        seeds = []
        s = base
        while len(seeds) < n:
            if not args.only or args.only in KINDS[s % len(KINDS)]:
                seeds.append(s)
            s += 1

    h = Harness(args)

    def on_signal(sig, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    failed = []
    t0 = time.monotonic()
    try:
        try:
            h.preflight()
        except Skip as e:
            log(f"SKIP: {e}")
            return 77
        log(f"crash harness: {len(seeds)} iterations, seeds "
            + (" ".join(map(str, seeds)) if len(seeds) <= 20 else f"{seeds[0]}..{seeds[-1]}") + f", binary {h.ckptfs}")
        for s in seeds:
            if not h.iteration(s):
                failed.append(s)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        h.cleanup_all()
    for bug, where in h.bugs.items():
        log(f"crash harness: {bug} (seeds {' '.join(map(str, where))})")
    # Again at the end, where a test runner's tail of the output shows it.
    for seed, errs in h.failures:
        for e in errs:
            log(f"crash harness: seed {seed} failed: {e[:600]}")
    log(f"crash harness: the watcher saw a consistent latest while the writer ran in {h.live_seen} of {len(seeds)} iterations")
    if args.bounded and args.nodes == 1 and h.live_seen == 0 and not failed:
        log("crash harness: FAIL: in no iteration did the watcher see a consistent latest: it proved nothing")
        return 1
    log(f"crash harness: {len(seeds) - len(failed)} passed, {len(failed)} failed in {time.monotonic() - t0:.0f}s"
        + (f"; failed seeds: {' '.join(map(str, failed))}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
