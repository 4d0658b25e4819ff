#!/usr/bin/python3
"""test_checks.py — the crash harness's checks must be able to fail.

Builds small journals by hand (no mount, no torch), lays out "mount" and
"backend" trees in a temp dir the way a correct or a broken ckptfs could
leave them, and asserts that harness.py's P1/P2/P3 checks and the watcher
accept the good ones and name the fault in each bad one. Runs in well
under a second; crash_bounded.sh runs it before the harness.

    tests/crash/test_checks.py
"""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import harness  # noqa: E402
from model import Model  # noqa: E402
from writer import sha, shard_bytes  # noqa: E402

SEED = 99


class Journal:
    """Records as writer.py would journal them."""

    def __init__(self):
        self.recs = []
        self.data = {}

    def file(self, path, data, gen, close=True):
        self.recs.append({"op": "begin", "path": path, "sha": sha(data), "size": len(data), "gen": gen})
        self.data[path] = data
        if close:
            self.recs.append({"op": "closed", "path": path, "sha": sha(data), "size": len(data)})

    def shard(self, step, i, size=3000, close=True):
        data = shard_bytes(SEED, step, i, size)
        self.file(f"step_{step}/shard_{i}.bin", data, {"shard": [SEED, step, i, size]}, close)
        return data

    def latest(self, step, close=True):
        t = f"step_{step}"
        self.file("latest", t.encode(), {"text": t}, close)

    def op(self, op, path):
        self.recs.append({"op": op, "path": path})

    def step(self, n, close_latest=True):
        self.op("begin_mkdir", f"step_{n}")
        self.op("mkdir", f"step_{n}")
        self.shard(n, 0)
        self.shard(n, 1)
        self.latest(n, close_latest)
        if close_latest and n > 2:
            self.op("begin_rmtree", f"step_{n - 2}")
            self.op("rmtree", f"step_{n - 2}")


class FakeHarness:
    def __init__(self, root):
        self.root = root
        self.tier_prefix = os.path.join(root, "tier")


def layout(root, files, dirs=()):
    """Creates `root` holding `files` (rel -> bytes) and `dirs`."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for d in dirs:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)


def final_tree(j):
    """The files and dirs the journal leaves (everything closed, deletes applied)."""
    files, dirs = Model(j.recs).state_at(len(j.recs))
    out = {p: j.data[p] for p, s in files.items() if s is not None}
    return out, [d for d, present in dirs.items() if present]


failures = []


def expect(name, errs, want):
    """want: None (no error) or a substring one of the errors must contain."""
    ok = (not errs) if want is None else any(want in e for e in errs)
    if not ok:
        failures.append(f"{name}: expected {'no error' if want is None else repr(want)}, got {errs}")


def main():
    tmp = tempfile.mkdtemp(prefix="ckptfs-crash-checks.")
    try:
        it = harness.Iteration(FakeHarness(tmp), 7)
        os.makedirs(it.dir)
        j = Journal()
        for n in range(1, 5):
            j.step(n)
        m = Model(j.recs)
        files, dirs = final_tree(j)
        assert set(files) == {"latest", "step_3/shard_0.bin", "step_3/shard_1.bin", "step_4/shard_0.bin",
                              "step_4/shard_1.bin"}, files

        # A faithful mount and backend pass every check.
        layout(it.mnt, files, dirs)
        layout(it.backend, files, dirs + [".ckptfs-tmp"])
        expect("good mount", it.check_mount(m, "t", set(), False, {}), None)
        expect("good backend", it.check_backend(m, "t"), None)
        expect("good equal", it.check_equal("t"), None)
        # A staged partial file in .ckptfs-tmp is fine.
        layout(it.backend, dict(files, **{".ckptfs-tmp/st-1": b"xx"}), dirs)
        expect("staging ignored", it.check_backend(m, "t"), None)

        # P2: a partial shard under its final name.
        bad = dict(files)
        bad["step_4/shard_0.bin"] = files["step_4/shard_0.bin"][:1000]
        layout(it.backend, bad, dirs)
        expect("partial in backend", it.check_backend(m, "t"), "short")
        # P2: bytes nobody wrote.
        bad["step_4/shard_0.bin"] = b"garbage"
        layout(it.backend, bad, dirs)
        expect("garbage in backend", it.check_backend(m, "t"), "wrong bytes")
        # P2: a name the writer never used.
        layout(it.backend, dict(files, **{"step_4/extra": b"x"}), dirs)
        expect("unknown file in backend", it.check_backend(m, "t"), "step_4/extra, a name the writer never wrote")

        # P3: latest names step_4 but a step_4 shard is missing.
        bad = dict(files)
        del bad["step_4/shard_1.bin"]
        layout(it.backend, bad, dirs)
        expect("latest before its step", it.check_backend(m, "t"), "latest names step_4 but step_4/shard_1.bin is missing")
        # P3: latest names step_4 but step_1 (removed before it) is still there.
        j1 = Journal()
        for n in range(1, 5):
            j1.step(n)
        layout(it.backend, dict(files, **{"step_1/shard_0.bin": j1.data["step_1/shard_0.bin"]}), dirs + ["step_1"])
        expect("removed dir resurrected", it.check_backend(m, "t"), "removed before it, is present")
        # An older prefix of the history is fine: latest=step_2 with steps 1-2.
        older = {"latest": b"step_2"}
        for n in (1, 2):
            for i in (0, 1):
                older[f"step_{n}/shard_{i}.bin"] = j.data[f"step_{n}/shard_{i}.bin"]
        layout(it.backend, older, ["step_1", "step_2"])
        expect("older prefix", it.check_backend(m, "t"), None)
        # ... but not with step_2's shard_1 missing.
        del older["step_2/shard_1.bin"]
        layout(it.backend, older, ["step_1", "step_2"])
        expect("older prefix, torn", it.check_backend(m, "t"), "latest names step_2 but step_2/shard_1.bin")
        # P3 after the drain: backend and mount differ.
        layout(it.mnt, files, dirs)
        layout(it.backend, dict(files, latest=b"step_3"), dirs)
        expect("mount != backend", it.check_equal("t"), "after drain, mount latest")

        # P1: an acknowledged file silently missing, short, or wrong.
        bad = dict(files)
        del bad["step_4/shard_0.bin"]
        layout(it.mnt, bad, dirs)
        expect("acked missing", it.check_mount(m, "t", set(), False, {}), "silently missing")
        bad = dict(files)
        bad["step_4/shard_0.bin"] = files["step_4/shard_0.bin"][:10]
        layout(it.mnt, bad, dirs)
        expect("acked short", it.check_mount(m, "t", set(), False, {}), "short")
        bad["step_4/shard_0.bin"] = files["step_3/shard_0.bin"]
        layout(it.mnt, bad, dirs)
        expect("acked wrong", it.check_mount(m, "t", set(), False, {}), "wrong bytes")
        layout(it.mnt, dict(files, latest=b"step_3"), dirs)
        expect("stale latest", it.check_mount(m, "t", set(), False, {}), "older or newer")
        layout(it.mnt, files, dirs + ["step_1"])
        expect("removed dir in mount", it.check_mount(m, "t", set(), False, {}), "dir step_1 present")

        # Lost: after a daemon kill an acknowledged file may not be lost;
        # after a reboot it may, if gone from the namespace and not persisted.
        bad = dict(files)
        del bad["step_4/shard_0.bin"]
        layout(it.mnt, bad, dirs)
        lost = {"step_4/shard_0.bin"}
        expect("acked lost after kill", it.check_mount(m, "t", lost, False, {}), "though its last close")
        expect("lost after reboot", it.check_mount(m, "t", lost, True, {}), None)
        crash_backend = {"step_4/shard_0.bin": ("file", sha(files["step_4/shard_0.bin"]), 3000)}
        expect("persisted but lost", it.check_mount(m, "t", lost, True, crash_backend), "backend held")
        layout(it.mnt, files, dirs)
        expect("lost but present", it.check_mount(m, "t", lost, True, {}), "half-present")

        # In flight at the crash: old version, empty or the whole new one;
        # a prefix only when the writer itself was killed.
        j2 = Journal()
        j2.step(1)
        j2.op("begin_mkdir", "step_2")
        j2.op("mkdir", "step_2")
        data = j2.shard(2, 0, size=5000, close=False)
        files2, dirs2 = final_tree(j2)
        for shown, want in ((data, None), (b"", None), (data[:2000], "short")):
            layout(it.mnt, dict(files2, **{"step_2/shard_0.bin": shown}), dirs2 + ["step_2"])
            expect(f"in flight {len(shown)}", it.check_mount(Model(j2.recs), "t", set(), False, {}), want)
        layout(it.mnt, dict(files2, **{"step_2/shard_0.bin": data[:2000]}), dirs2 + ["step_2"])
        expect("writer killed: prefix", it.check_mount(Model(j2.recs, writer_killed=True), "t", set(), False, {}),
               None)
        layout(it.mnt, dict(files2, **{"step_2/shard_0.bin": data[:1999] + b"!"}), dirs2 + ["step_2"])
        expect("writer killed: torn", it.check_mount(Model(j2.recs, writer_killed=True), "t", set(), False, {}),
               "wrong bytes")
        layout(it.mnt, files2, dirs2 + ["step_2"])
        expect("in flight absent", it.check_mount(Model(j2.recs), "t", set(), False, {}), None)
        # latest rewritten in place at the crash: old, empty or new.
        j3 = Journal()
        j3.step(1)
        j3.step(2, close_latest=False)
        f3, d3 = final_tree(j3)
        for shown, want in ((b"step_1", None), (b"", None), (b"step_2", None), (b"step", "short")):
            layout(it.mnt, dict(f3, latest=shown), d3)
            expect(f"latest in flight {shown!r}", it.check_mount(Model(j3.recs), "t", set(), False, {}), want)

        # A barrier (fsync with --fsync=backend): the backend may not be
        # older than it, even with a consistent latest.
        j4 = Journal()
        j4.step(1)
        j4.step(2)
        j4.recs.insert(len(j4.recs) - 1, {"op": "barrier", "path": "latest", "sha": sha(b"step_2")})
        j4.step(3)
        m4 = Model(j4.recs)
        f4, d4 = final_tree(j4)
        layout(it.backend, f4, d4)
        expect("barrier, current", it.check_backend(m4, "t"), None)
        older = {"latest": b"step_2"}
        for n in (1, 2):
            for i in (0, 1):
                older[f"step_{n}/shard_{i}.bin"] = j4.data[f"step_{n}/shard_{i}.bin"]
        layout(it.backend, older, ["step_1", "step_2"])
        expect("barrier, at it", it.check_backend(m4, "t"), None)
        layout(it.backend, {"latest": b"step_1", "step_1/shard_0.bin": older["step_1/shard_0.bin"],
                            "step_1/shard_1.bin": older["step_1/shard_1.bin"]}, ["step_1"])
        expect("barrier, behind", it.check_backend(m4, "t"), "closed before the last barrier")
        expect("barrier, latest behind", it.check_backend(m4, "t"), "latest was fsynced")

        # The watcher: a backend whose latest names a torn step is caught;
        # a consistent one is not.
        jpath = os.path.join(tmp, "journal.jsonl")
        with open(jpath, "w") as f:
            for r in j.recs:
                f.write(harness.json.dumps(r) + "\n")
        w = harness.Watcher(it.backend, jpath)
        layout(it.backend, files, dirs)
        for _ in range(5):
            w.poll()
        expect("watcher, good", w.violations, None)
        bad = dict(files)
        del bad["step_4/shard_1.bin"]
        bad["step_3/shard_0.bin"] = b"junk"
        layout(it.backend, bad, dirs)
        for _ in range(5):
            w.poll()
        expect("watcher, torn step", w.violations, "latest names step_4 but step_4/shard_1.bin missing")
        expect("watcher, junk file", w.violations, "backend file step_3/shard_0.bin: wrong bytes")

        # Multi-node mode: two ranks; rank 0 writes latest after the barrier.
        # The cross-node P3 check must report a latest that names a step
        # missing (or holding a wrong) shard of another rank.
        ranks = [Journal(), Journal()]
        mn_files, mn_dirs = {}, set()
        for n in (1, 2):
            for r, jr in enumerate(ranks):
                jr.op("begin_mkdir", f"step_{n}")
                jr.op("mkdir", f"step_{n}")
                for i in (0, 1):
                    data = shard_bytes(SEED, n, f"{r}_{i}", 2000)
                    jr.file(f"step_{n}/shard_{r}_{i}.bin", data, {"shard": [SEED, n, f"{r}_{i}", 2000]})
                    mn_files[f"step_{n}/shard_{r}_{i}.bin"] = data
                jr.recs.append({"op": "arrived", "step": n})
                jr.recs.append({"op": "passed", "step": n})
                mn_dirs.add(f"step_{n}")
            ranks[0].latest(n)
        mn_files["latest"] = b"step_2"
        models = [Model(jr.recs) for jr in ranks]
        mn_dirs = sorted(mn_dirs)
        be = it.backend

        def cluster(files):
            layout(be, files, mn_dirs)
            return harness.check_backend_cluster(models, harness.walk(be, harness.BACKEND_SKIP), be, "t")

        expect("cluster, good", cluster(mn_files), None)
        bad = dict(mn_files)
        del bad["step_2/shard_1_1.bin"]
        expect("cluster, latest before another rank's shard", cluster(bad),
               "P3 t: backend latest names step_2 but step_2/shard_1_1.bin is missing")
        bad = dict(mn_files, **{"step_2/shard_1_0.bin": mn_files["step_1/shard_1_0.bin"]})
        expect("cluster, another rank's shard wrong", cluster(bad), "step_2/shard_1_0.bin is not the acknowledged")
        bad = dict(mn_files, **{"step_2/shard_1_0.bin": mn_files["step_2/shard_1_0.bin"][:100]})
        expect("cluster, partial shard", cluster(bad), "P2 t: backend step_2/shard_1_0.bin: short")
        expect("cluster, unknown name", cluster(dict(mn_files, **{"step_2/x": b"x"})), "a name no rank wrote")
        # latest naming a step a rank never reached its barrier for.
        r1 = Model([x for x in ranks[1].recs if not (x.get("op") == "arrived" and x.get("step") == 2)])
        layout(be, mn_files, mn_dirs)
        expect("cluster, rank never arrived",
               harness.check_backend_cluster([models[0], r1], harness.walk(be, harness.BACKEND_SKIP), be, "t"),
               "rank 1 never closed its shards of it")
        # The cross-node watcher, from the journals.
        jps = []
        for r, jr in enumerate(ranks):
            jp = os.path.join(tmp, f"journal-{r}.jsonl")
            with open(jp, "w") as f:
                for x in jr.recs:
                    f.write(harness.json.dumps(x) + "\n")
            jps.append(jp)
        cw = harness.ClusterWatcher(be, jps)
        layout(be, mn_files, mn_dirs + [".ckptfs-cluster/job"])
        for _ in range(5):
            cw.poll()
        expect("cluster watcher, good", cw.violations, None)
        if cw.consistent == 0:
            failures.append("cluster watcher: never found the good backend consistent")
        bad = dict(mn_files)
        del bad["step_2/shard_1_1.bin"]
        layout(be, bad, mn_dirs)
        for _ in range(5):
            cw.poll()
        expect("cluster watcher, torn step", cw.violations, "latest names step_2 but step_2/shard_1_1.bin missing")

        # Node loss (mn-lost): rank 1 is lost. A file seen replicated before
        # the kill must survive it (P1'); one not seen so may be lost, and
        # `latest` may then stand without it (P3), never without another.
        removed = ["step_1"]  # a rank began to remove step_1
        safe = {"step_2/shard_1_0.bin": sha(mn_files["step_2/shard_1_0.bin"])}
        required, at_risk = harness.must_survive(models[1], safe, removed)
        if set(required) != {"step_2/shard_1_0.bin"} or set(at_risk) != {"step_2/shard_1_1.bin"}:
            failures.append(f"must_survive: required {sorted(required)}, at risk {sorted(at_risk)}")

        def tree(files):
            layout(be, files, mn_dirs)
            return harness.walk(be, harness.BACKEND_SKIP)

        expect("lost node, replicated file there", harness.check_survived(required, tree(mn_files), "t"), None)
        gone = {k: d for k, d in mn_files.items() if k != "step_2/shard_1_0.bin"}
        expect("lost node, replicated file lost", harness.check_survived(required, tree(gone), "t"),
               "P1' t: step_2/shard_1_0.bin, acknowledged and replicated or persisted before the node was lost, is absent")
        expect("lost node, replicated file wrong",
               harness.check_survived(required, tree(dict(mn_files, **{"step_2/shard_1_0.bin": b"x"})), "t"),
               "step_2/shard_1_0.bin, acknowledged and replicated")
        lost1 = models[1].paths()

        def judge(rel, files, unsafe=()):
            return harness.judge_torn({("step_2", frozenset({rel}))}, tree(files), required, lost1, removed, unsafe)

        no_s11 = {k: d for k, d in mn_files.items() if k != "step_2/shard_1_1.bin"}
        expect("torn latest, a file lost with the node", judge("step_2/shard_1_1.bin", no_s11), None)
        expect("torn latest, the file came after it", judge("step_2/shard_1_1.bin", mn_files),
               "step_2/shard_1_1.bin reached the backend after it")
        expect("torn latest, a replicated file", judge("step_2/shard_1_0.bin", gone),
               "latest named step_2 without step_2/shard_1_0.bin")
        no_s00 = {k: d for k, d in mn_files.items() if k != "step_2/shard_0_0.bin"}
        expect("torn latest, a live rank's file", judge("step_2/shard_0_0.bin", no_s00), "without step_2/shard_0_0.bin")
        # A live rank's file under a removed step: an error, named as the
        # hole stop 44 closed when rank 0 was lost with a newer latest not
        # replicated.
        no_1 = {k: d for k, d in mn_files.items() if not k.startswith("step_1/")}
        look = {("step_1", frozenset({"step_1/shard_0_0.bin"}))}
        expect("torn latest, rank 0's newer latest lost",
               harness.judge_torn(look, tree(no_1), required, lost1, removed, [2]), "a rotation ordered after it")
        expect("torn latest, rank 0's newer latest replicated",
               harness.judge_torn(look, tree(no_1), required, lost1, removed, []), "without step_1/shard_0_0.bin")
        seen = {("latest", sha(b"step_2"))}
        if harness.unsafe_latests(models[0], seen) != [1]:
            failures.append(f"unsafe_latests: {harness.unsafe_latests(models[0], seen)}, want [1]")
        # The final look: a missing file may be excused (may_miss), a wrong one never.
        miss = {"step_2/shard_1_1.bin"}
        expect("cluster, lost file excused",
               harness.check_backend_cluster(models, tree(no_s11), be, "t", may_miss=miss), None)
        wrong = dict(mn_files, **{"step_2/shard_1_1.bin": mn_files["step_1/shard_1_1.bin"]})
        expect("cluster, wrong file not excused",
               harness.check_backend_cluster(models, tree(wrong), be, "t", may_miss=miss), "not the acknowledged")
        # The watcher: missing files are a violation before the loss, kept
        # for judge_torn after it; a wrong version is a violation at once.
        lw = harness.LossWatcher(be, jps, 1)
        tree(no_s11)
        for _ in range(3):
            lw.poll()
        expect("loss watcher, before the loss", lw.violations, "latest names step_2 but step_2/shard_1_1.bin missing")
        lw = harness.LossWatcher(be, jps, 1)
        lw.lost.set()
        for _ in range(3):
            lw.poll()
        expect("loss watcher, after the loss", lw.violations, None)
        if lw.unsure != {("step_2", frozenset({"step_2/shard_1_1.bin"}))}:
            failures.append(f"loss watcher: unsure {lw.unsure}")
        tree(wrong)
        lw.poll()
        expect("loss watcher, wrong version", lw.violations, "step_2/shard_1_1.bin has sha")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL", f)
    print(f"test_checks: {'all checks behave' if not failures else str(len(failures)) + ' failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
