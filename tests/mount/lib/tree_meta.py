#!/usr/bin/python3
"""tree_meta.py MOUNT BACKEND [--owners] — compares what docs/consistency.md
("In the backend", "Owners") promises about metadata after a drain, entry by
entry, for two trees that `diff -r` already found equal in names and bytes:

  files     mode (permission and set-ID bits) and mtime, to the nanosecond
  dirs      mode; not mtime: adding or staging entries in the backend moves it
  symlinks  nothing but the owner (a symlink's mode and times are not kept)
  all       uid and gid with --owners (the daemon runs as root)

The tops of the two trees and the backend's staging dir (.ckptfs-tmp) are
left out. Prints one line per difference (path, field, mount value, backend
value; at most 30) and exits 1 if there is any, 0 if none, 2 on a usage or
walk error. Never follows symlinks."""
import os
import stat
import sys

SKIP_TOP = {".ckptfs-tmp"}


def _raise(e):
    raise e


def entries(top):
    """rel path -> os.stat_result (lstat) for everything under top."""
    out = {}
    for d, dirs, files in os.walk(top, onerror=_raise):
        rel_d = os.path.relpath(d, top)
        if rel_d == ".":
            dirs[:] = [x for x in dirs if x not in SKIP_TOP]
            files = [x for x in files if x not in SKIP_TOP]
        for n in dirs + files:
            rel = n if rel_d == "." else os.path.join(rel_d, n)
            out[rel] = os.lstat(os.path.join(top, rel))
    return out


def kind(st):
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "other"


def fields(st, owners):
    k = kind(st)
    f = {"type": k}
    if k in ("file", "dir", "other"):
        f["mode"] = oct(stat.S_IMODE(st.st_mode))
    if k == "file":
        f["mtime_ns"] = st.st_mtime_ns
    if owners:
        f["uid"] = st.st_uid
        f["gid"] = st.st_gid
    return f


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    owners = "--owners" in argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        m, b = entries(args[0]), entries(args[1])
    except OSError as e:
        print(f"tree_meta: {e}", file=sys.stderr)
        return 2
    diffs = []
    for rel in sorted(set(m) | set(b)):
        if rel not in b:
            diffs.append(f"{rel}: only in the mount")
            continue
        if rel not in m:
            diffs.append(f"{rel}: only in the backend")
            continue
        fm, fb = fields(m[rel], owners), fields(b[rel], owners)
        for k in fm:
            if fm[k] != fb.get(k):
                diffs.append(f"{rel}: {k} mount {fm[k]} backend {fb.get(k)}")
                if k == "type":
                    break
    for d in diffs[:30]:
        print(d)
    if len(diffs) > 30:
        print(f"... and {len(diffs) - 30} more")
    print(f"tree_meta: {len(m)} entries compared, {len(diffs)} differences", file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
