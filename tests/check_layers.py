#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check_layers.py - the project's structure rules, checked on a build.

  tests/check_layers.py BUILD_DIR

1. No call circle between files: from each object file of daemon/, client/,
   proto/ and kernels/ (BUILD_DIR/obj/...), the global symbols it defines and
   the ones it uses (nm) give a graph "file A uses a symbol of file B"; a
   strongly connected component of more than one file is a circle.  Taking a
   function's address counts as a use; calling through a pointer a callee
   was handed does not (that is how a lower layer reports upward).
2. No include circle: the graph of `#include "x.h"` between the headers of
   those folders has no cycle.
3. No source file of those folders over 700 lines (tests are exempt).
4. The layering of the folders: proto and kernels use nothing of ours;
   libclient (client/*.c) uses proto only; daemon uses proto and kernels.

Prints each violation and exits 1 when there is one; prints a one-line
summary and exits 0 otherwise.
"""
import os
import re
import subprocess
import sys

FOLDERS = ("daemon", "client", "proto", "kernels")
MAX_LINES = 700
# What each folder may use, besides itself.
ALLOWED = {
    "proto": set(),
    "kernels": set(),
    "client": {"proto"},
    "client/ctl": {"client", "proto", "kernels"},
    "daemon": {"proto", "kernels", "daemon/cuda"},
    "daemon/cuda": {"daemon", "proto", "kernels"},
}


def folder_of(path):
    d = os.path.dirname(path)
    return d


def objects(build):
    root = os.path.join(build, "obj")
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(".o"):
                    full = os.path.join(dirpath, f)
                    rel = os.path.relpath(full, root)
                    src = re.sub(r"(\.cu)?\.o$", "", rel)
                    # Only objects of sources that exist: a build directory
                    # keeps the objects of files since moved or removed.
                    if os.path.exists(src + ".c") or os.path.exists(src + ".cu"):
                        yield full, src


def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in "TDBRCui":
            defined.add(name)
    return defined, used


def sccs(nodes, edges):
    """Tarjan: the strongly connected components of the graph."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    build = sys.argv[1]
    problems = []

    # 1. calls
    owner, uses = {}, {}
    for obj, src in objects(build):
        d, u = symbols(obj)
        for s in d:
            owner.setdefault(s, src)
        uses[src] = u
    edges = {}
    for src, used in uses.items():
        for s in used:
            dst = owner.get(s)
            if dst and dst != src:
                edges.setdefault(src, set()).add(dst)
    for comp in sccs(set(uses), edges):
        if len(comp) > 1:
            problems.append("call circle between: " + ", ".join(sorted(comp)))
    # 4. layering of folders, from the same graph
    for src, dsts in edges.items():
        fs = folder_of(src)
        allowed = ALLOWED.get(fs, set()) | {fs}
        for dst in dsts:
            fd = folder_of(dst)
            if fd not in allowed:
                problems.append("%s uses %s (%s may use %s only)" %
                                (src, dst, fs, ", ".join(sorted(allowed))))

    # 2. includes, and 3. sizes
    headers, inc = set(), {}
    nsrc = 0
    for top in FOLDERS:
        for dirpath, _, files in os.walk(top):
            for f in files:
                path = os.path.join(dirpath, f)
                if not re.search(r"\.(c|h|cu|cuh)$", f):
                    continue
                nsrc += 1
                with open(path, errors="replace") as fh:
                    text = fh.read()
                n = text.count("\n")
                if n > MAX_LINES:
                    problems.append("%s has %d lines (more than %d)" % (path, n, MAX_LINES))
                if f.endswith((".h", ".cuh")):
                    headers.add(f)
                    inc[f] = set(re.findall(r'^\s*#\s*include\s+"(?:[^"]*/)?([^"/]+\.(?:h|cuh))"',
                                            text, re.M))
    hedges = {h: {i for i in incs if i in headers and i != h} for h, incs in inc.items()}
    for comp in sccs(headers, hedges):
        if len(comp) > 1:
            problems.append("include circle between: " + ", ".join(sorted(comp)))

    for p in problems:
        print("layers: " + p)
    if problems:
        return 1
    print("layers: %d object files, %d sources: no call or include circle, none over %d lines, "
          "folders used as allowed" % (len(uses), nsrc, MAX_LINES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
