"""model.py — what a crash may leave, derived from the writer's journal.

The journal (tests/crash/writer.py) lists, in order, every operation the
writer began and every one the mount acknowledged. From it this module
answers, for each path:

  * allowed(path): what the mount may show after a crash and a remount —
    a set of sha256 digests, ABSENT, and (only when the writer itself was
    killed, so the kernel closed its half-written file) PREFIX: any prefix
    of the version in flight;
  * ever(path): every version ever begun (what the backend may hold under
    a final name, besides the empty file of a create or O_TRUNC);
  * state_at(i): the acknowledged state just before journal record i, and
    touched_after(path, i), for the "prefix of the history" checks.

No filesystem access here: the harness walks trees and asks.
"""
import hashlib
from collections import defaultdict

EMPTY_SHA = hashlib.sha256(b"").hexdigest()
ABSENT = None
PREFIX = "prefix"


def under(path, d):
    return path == d or path.startswith(d + "/")


class Model:
    def __init__(self, records, writer_killed=False):
        self.records = records
        self.writer_killed = writer_killed
        self.cur = {}                    # path -> set of allowed outcomes
        self.dirs = {}                   # dir -> set of {True, False}: present allowed
        self.pending = {}                # path -> the begin record still in flight
        self.ever = defaultdict(set)     # path -> every sha begun (and EMPTY)
        self.begins = defaultdict(list)  # path -> [(index, begin record)]
        self.events = defaultdict(list)  # path or dir -> indexes of records touching it
        self.latest_begins = []          # (index, text) of every begin of latest / latest.tmp
        self.barrier = None              # (index, record) of the last acknowledged barrier
        self.error = None                # the writer's error record, if any
        self.done = False
        for i, r in enumerate(records):
            self._apply(i, r)

    # ---- replay ----
    def _files_under(self, d):
        return [p for p in self.cur if under(p, d)]

    def _apply(self, i, r):
        op = r.get("op")
        p = r.get("path")
        if op == "begin":
            prev = self.cur.get(p, {ABSENT})
            # Until close returns, the mount may show the old version, the
            # empty file of the create/O_TRUNC, or (sealed, not yet
            # acknowledged) the whole new version.
            self.cur[p] = set(prev) | {EMPTY_SHA, r["sha"]}
            if self.writer_killed:
                self.cur[p].add(PREFIX)
            self.pending[p] = r
            self.ever[p] |= {EMPTY_SHA, r["sha"]}
            self.begins[p].append((i, r))
            self.events[p].append(i)
            if p in ("latest", "latest.tmp"):
                self.latest_begins.append((i, r["gen"].get("text")))
        elif op == "closed":
            self.cur[p] = {r["sha"]}
            self.pending.pop(p, None)
            self.events[p].append(i)
        elif op == "begin_mkdir":
            self.dirs[p] = self.dirs.get(p, {False}) | {True}
            self.events[p].append(i)
        elif op == "mkdir":
            self.dirs[p] = {True}
            self.events[p].append(i)
        elif op == "begin_rmtree":
            for f in self._files_under(p):
                self.cur[f] = self.cur[f] | {ABSENT}
                self.events[f].append(i)
            self.dirs[p] = self.dirs.get(p, {True}) | {False}
            self.events[p].append(i)
        elif op == "rmtree":
            for f in self._files_under(p):
                self.cur[f] = {ABSENT}
                self.events[f].append(i)
            self.dirs[p] = {False}
            self.events[p].append(i)
        elif op == "begin_rename":
            src, dst = p, r["to"]
            self.cur[dst] = self.cur.get(dst, {ABSENT}) | (self.cur[src] - {ABSENT})
            self.cur[src] = self.cur[src] | {ABSENT}
            self.ever[dst] |= self.ever[src]
            for b in self.begins[src]:
                self.begins[dst].append(b)
            self.events[src].append(i)
            self.events[dst].append(i)
        elif op == "renamed":
            src, dst = p, r["to"]
            self.cur[dst] = self.cur[src] - {ABSENT}
            self.cur[src] = {ABSENT}
            self.events[src].append(i)
            self.events[dst].append(i)
        elif op == "barrier":
            self.barrier = (i, r)
            self.events[p].append(i)
        elif op == "error":
            self.error = r
        elif op == "done":
            self.done = True

    # ---- queries ----
    def paths(self):
        return set(self.cur)

    def allowed(self, path):
        return self.cur.get(path, {ABSENT})

    def must_exist(self, path):
        return ABSENT not in self.allowed(path)

    def acked(self, path):
        """The one acknowledged version the mount must show, or None."""
        a = self.allowed(path)
        return next(iter(a)) if len(a) == 1 and ABSENT not in a else None

    def gen_for(self, path, sha):
        """The begin record of `path` (or of what was renamed to it) with this sha."""
        for _, b in reversed(self.begins[path]):
            if b["sha"] == sha:
                return b
        return None

    def pending_begin(self, path):
        """The begin record in flight for `path` when the journal ends."""
        if path in self.pending:
            return self.pending[path]
        return None

    def latest_index(self, text):
        """Index of the last begin that wrote `text` into latest (or latest.tmp)."""
        for i, t in reversed(self.latest_begins):
            if t == text:
                return i
        return None

    def state_at(self, upto):
        """The acknowledged state before record `upto`: path -> sha or ABSENT,
        for files; dir -> True/False for directories."""
        files, dirs = {}, {}
        for r in self.records[:upto]:
            op, p = r.get("op"), r.get("path")
            if op == "closed":
                files[p] = r["sha"]
            elif op == "mkdir":
                dirs[p] = True
            elif op == "rmtree":
                for f in list(files):
                    if under(f, p):
                        files[f] = ABSENT
                for d in list(dirs):
                    if under(d, p):
                        dirs[d] = False
            elif op == "renamed":
                files[r["to"]] = files.get(p, ABSENT)
                files[p] = ABSENT
        return files, dirs

    def touched_after(self, path, i):
        return any(j >= i for j in self.events.get(path, []))

    def begun_after(self, path, i):
        """Shas of the versions of `path` begun at or after record i."""
        return {b["sha"] for j, b in self.begins.get(path, []) if j >= i}

    def step_files(self, text):
        """Files the step that `text` ("step_N") names held when latest was
        set to it: path -> sha, from the acknowledged state at that point."""
        i = self.latest_index(text)
        if i is None:
            return None, None
        files, _ = self.state_at(i)
        return i, {p: s for p, s in files.items() if s is not ABSENT and under(p, text)}

    def expected_bytes(self, begin):
        """The bytes of a begun version (to tell a short file from a wrong one)."""
        from writer import shard_bytes  # noqa: late import keeps this module torch-free
        g = begin["gen"]
        if "shard" in g:
            return shard_bytes(*g["shard"])
        if "blob" in g:
            with open(g["blob"], "rb") as f:
                return f.read()
        if "text" in g:
            return g["text"].encode()
        return None


def classify(model, path, data_sha, data_len, read_bytes, allowed=None):
    """Checks one observed file against the allowed outcomes. Returns None
    if fine, else a short reason ("short: 1048576 of 5000000 bytes of the
    version begun at record 12", "wrong bytes", ...). `read_bytes()` gives
    the observed bytes when a prefix must be compared."""
    allowed = model.allowed(path) if allowed is None else allowed
    if data_sha in allowed:
        return None
    candidates = [b for _, b in model.begins.get(path, [])]
    if PREFIX in allowed:
        b = model.pending_begin(path)
        if b is not None and data_len <= b["size"]:
            full = model.expected_bytes(b)
            if full is not None and read_bytes() == full[:data_len]:
                return None
    data = None
    for b in reversed(candidates):
        if data_len < b["size"]:
            full = model.expected_bytes(b)
            if full is None:
                continue
            if data is None:
                data = read_bytes()
            if data == full[:data_len]:
                return f"short: {data_len} of the {b['size']} bytes of a version begun ({b['sha'][:12]})"
    if data_sha in model.ever.get(path, set()):
        return f"a version ({data_sha[:12]}, {data_len} bytes) older or newer than allowed here"
    return f"wrong bytes ({data_len} bytes, sha {data_sha[:12]}, matches no version begun)"


def cluster_step_files(models, text):
    """Multi-node mode: the files of the step that `text` names across every
    rank (models[r]: rank r's journal), path -> sha: rank 0's when it set
    `latest` to it (step_files), and every shard each other rank closed
    under it. Returns (None, reason) when `latest` cannot name a complete
    step: rank 0 never wrote it, or a rank never arrived at its barrier
    (rank 0 writes `latest` only after every rank did)."""
    i, files = models[0].step_files(text)
    if files is None:
        return None, "never written by rank 0"
    try:
        n = int(text[len("step_"):])
    except ValueError:
        return None, "not a step"
    for r, m in enumerate(models[1:], 1):
        if not any(x.get("op") == "arrived" and x.get("step") == n for x in m.records):
            return None, f"rank {r} never closed its shards of it (no barrier arrival)"
        for x in m.records:
            if x.get("op") == "closed" and under(x["path"], text):
                files[x["path"]] = x["sha"]
    return files, None
