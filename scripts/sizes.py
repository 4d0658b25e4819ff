#!/usr/bin/env python3
"""The sizes issue #31 bounds, measured: member functions of every class
and struct under fs/ (clang's AST: methods declared in the class, not
constructors, destructors or operators), lines of every header and .cc
under fs/. `make sizes` prints them, worst first; with --check it exits 1
when one is over its bound (60 member functions, 300 header lines, 900 .cc
lines). Usage: sizes.py CLANG FLAGS... [--check]"""
import glob
import os
import re
import subprocess
import sys
import tempfile

MAX_METHODS, MAX_H, MAX_CC = 60, 300, 900


def methods(clang, flags):
    headers = sorted(glob.glob("fs/*.h") + glob.glob("fs/*/*.h"))
    with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as tu:
        tu.write("".join(f'#include "{h}"\n' for h in headers))
    try:
        out = subprocess.run([clang, *flags, "-fsyntax-only", "-Xclang", "-ast-dump", "-Xclang",
                              "-ast-dump-filter=ckpt::fs::", tu.name],
                             capture_output=True, text=True, check=False).stdout
    finally:
        os.unlink(tu.name)
    counts = {}
    name = None
    for line in out.splitlines():
        m = re.match(r"Dumping (ckpt::fs::[\w:]+):$", line)
        if m:
            name = None
            continue
        if name is None:
            m = re.match(r"CXXRecordDecl .* (?:class|struct) (\w+) definition$", line)
            if m:
                name = m.group(1)
                counts[name] = 0
            else:
                name = ""  # not a class: skip its section
            continue
        if name and re.match(r"[|`]-CXXMethodDecl ", line) and "implicit" not in line.split("CXXMethodDecl", 1)[1][:60]:
            if not re.search(r" operator\W", line):
                counts[name] += 1
    return counts


def lines(pattern):
    out = {}
    for f in sorted(glob.glob(pattern)):
        with open(f) as fh:
            out[f] = sum(1 for _ in fh)
    return out


def main():
    args = sys.argv[1:]
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    if not args:
        sys.exit("usage: sizes.py CLANG FLAGS... [--check]")
    clang, flags = args[0], [f for f in args[1:] if f not in ("-fsyntax-only", "-Werror")]
    over = []
    counts = methods(clang, flags)
    if not counts:
        sys.exit("sizes: clang printed no class (is the compiler there, do the flags compile fs/?)")
    print(f"member functions (bound {MAX_METHODS}):")
    for n, c in sorted(counts.items(), key=lambda x: -x[1])[:12]:
        print(f"  {c:4d}  {n}")
        if c > MAX_METHODS:
            over.append(f"{n}: {c} member functions")
    for title, pat, bound in (("header lines", "fs/**/*.h", MAX_H), (".cc lines", "fs/**/*.cc", MAX_CC)):
        files = {}
        for p in (pat.replace("**/", ""), pat.replace("**", "*")):
            files.update(lines(p))
        print(f"{title} (bound {bound}):")
        for f, n in sorted(files.items(), key=lambda x: -x[1])[:6]:
            print(f"  {n:4d}  {f}")
        over += [f"{f}: {n} lines" for f, n in files.items() if n > bound]
    if over:
        print("over the bounds: " + "; ".join(over))
    if check and over:
        sys.exit(1)


if __name__ == "__main__":
    main()
