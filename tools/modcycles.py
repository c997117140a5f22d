#!/usr/bin/env python3
"""Module cycles inside each crate of the workspace.

    tools/modcycles.py [--root DIR] [--known FILE] [--json]

For every crate under DIR/crates (default: this checkout) it reads the module tree from the
crate root (`src/lib.rs`, else `src/main.rs`) through its `mod` declarations (files and inline
blocks, `#[path]` is not used here), and records which module refers to which: every `use`
tree and every path in the code that starts with `crate::`, `super::`, `self::` or the name of
a child module. A path is resolved to the deepest module it names; a name that a module
re-exports (`pub use a::X` in `lib.rs`, say) resolves to the module it comes from, so
`crate::X` counts as a reference to `a`.

A reference between two modules counts between their ancestors that are siblings (under the
lowest common ancestor): `a::x -> b::y` is an edge `a -> b` among the crate root's children.
References between a module and its own ancestors or descendants are not edges (a parent
declares its children; a child may use its parent). A cycle is a strongly connected group of
two or more siblings.

Prints each crate's cycles, largest first, as `crate: a -> b -> c -> a` with one path
that makes each edge (`file:line`). Exit status 1 when a cycle is found that `--known` (one
cycle per line, `crate: a b c`, modules sorted, `#` comments) does not list, and 2 when a
listed cycle is gone (the list must shrink with the code); 0 otherwise.
"""

import argparse
import json
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
TOKEN = re.compile(r"(?:r#)?" + IDENT + r"|::|[{}();,*]")


def strip(text):
    """The code without comments, string and char literals (newlines kept for line numbers)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not re.match(IDENT, text[i - 1 : i] or " "):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    """One module: its path from the crate root, file, children and `pub use` re-exports."""

    def __init__(self, path, file):
        self.path = path  # tuple of names, () for the crate root
        self.file = file
        self.children = {}
        self.reexports = {}  # name -> absolute path it re-exports
        self.globs = []  # absolute module paths re-exported with `*`
        self.uses = []  # (absolute path, line)


def tokens(code):
    line = 1
    pos = 0
    for m in TOKEN.finditer(code):
        line += code.count("\n", pos, m.start())
        pos = m.start()
        yield m.group(0), line


def use_trees(toks, i):
    """Expands the `use` tree starting at toks[i]; returns ([(segments, alias, line)], next)."""
    out = []

    def tree(i, prefix):
        segs = list(prefix)
        line = toks[i][1] if i < len(toks) else 0
        while i < len(toks):
            t = toks[i][0]
            if t == "{":
                i += 1
                while i < len(toks) and toks[i][0] != "}":
                    i = tree(i, segs)
                    if i < len(toks) and toks[i][0] == ",":
                        i += 1
                return i + 1
            if t == "*":
                out.append((segs + ["*"], None, line))
                return i + 1
            if t == "::":
                i += 1
                continue
            if t in (",", "}", ";"):
                break
            if t == "as":
                out.append((segs, toks[i + 1][0], line))
                return i + 2
            segs.append(t.removeprefix("r#"))
            i += 1
        out.append((segs, None, line))
        return i

    i = tree(i, [])
    while i < len(toks) and toks[i][0] != ";":
        i += 1
    return out, i + 1


def parse_crate(src_root):
    """The crate's modules by path."""
    root_file = src_root / "lib.rs"
    if not root_file.exists():
        root_file = src_root / "main.rs"
    modules = {}
    pending = [((), root_file, None)]
    raw = {}
    while pending:
        path, file, toks = pending.pop()
        mod = Module(path, file)
        modules[path] = mod
        if toks is None:
            toks = list(tokens(strip(file.read_text(encoding="utf-8"))))
        # Split off inline `mod name { ... }` blocks; `mod name;` names a file.
        i, body = 0, []
        while i < len(toks):
            t, line = toks[i]
            if t == "mod" and i + 2 < len(toks) and re.fullmatch(IDENT, toks[i + 1][0]):
                name, nxt = toks[i + 1][0], toks[i + 2][0]
                if nxt == ";":
                    base = file.parent if file.name in ("lib.rs", "main.rs", "mod.rs") else (
                        file.parent / file.stem
                    )
                    cand = [base / f"{name}.rs", base / name / "mod.rs"]
                    found = next((c for c in cand if c.exists()), None)
                    if found is not None:
                        mod.children[name] = path + (name,)
                        pending.append((path + (name,), found, None))
                    i += 3
                    continue
                if nxt == "{":
                    j, d = i + 3, 1
                    while j < len(toks) and d:
                        d += {"{": 1, "}": -1}.get(toks[j][0], 0)
                        j += 1
                    inner = toks[i + 3 : j - 1]
                    mod.children[name] = path + (name,)
                    pending.append((path + (name,), file, inner))
                    i = j
                    continue
            body.append((t, line))
            i += 1
        raw[path] = body
    return modules, raw


def absolute(mod_path, segs, modules):
    """The absolute path of `segs` as written in module `mod_path`, or None (external)."""
    if not segs:
        return None
    head = segs[0]
    if head == "crate":
        return tuple(segs[1:])
    if head in ("self", "super"):
        base = list(mod_path)
        k = 0
        while k < len(segs) and segs[k] in ("self", "super"):
            if segs[k] == "super":
                if not base:
                    return None
                base.pop()
            k += 1
        return tuple(base) + tuple(segs[k:])
    if head in modules[mod_path].children:
        return mod_path + tuple(segs)
    return None


def resolve(path, modules, seen=None):
    """The deepest module that the absolute item path `path` lives in (following re-exports)."""
    seen = seen or set()
    cur = ()
    for k, seg in enumerate(path):
        mod = modules[cur]
        if seg in mod.children:
            cur = mod.children[seg]
            continue
        if seg in mod.reexports and (cur, seg) not in seen:
            seen.add((cur, seg))
            return resolve(mod.reexports[seg] + tuple(path[k + 1 :]), modules, seen)
        if seg != "*" and len(mod.globs) == 1 and (cur, "*") not in seen:
            seen.add((cur, "*"))
            return resolve(mod.globs[0] + (seg,) + tuple(path[k + 1 :]), modules, seen)
        return cur
    return cur


def references(modules, raw):
    """Every (from module, to module, file, line) of the crate."""
    # First pass: `use` trees, and re-exports.
    paths = []  # (module, absolute path, line)
    for mpath, toks in raw.items():
        mod = modules[mpath]
        i = 0
        while i < len(toks):
            t, line = toks[i]
            if t == "use":
                public = i > 0 and toks[i - 1][0] in ("pub", ")")
                trees, i = use_trees(toks, i + 1)
                for segs, alias, ln in trees:
                    if segs and segs[-1] == "self":
                        segs = segs[:-1]
                    ab = absolute(mpath, segs, modules)
                    if ab is None:
                        continue
                    paths.append((mpath, ab, ln))
                    if public:
                        if ab and ab[-1] == "*":
                            mod.globs.append(ab[:-1])
                        elif ab:
                            mod.reexports[alias or ab[-1]] = ab
                continue
            # A path in the code: crate::.., super::.., self::.., child::..
            if (t in ("crate", "super", "self") or t in mod.children) and (
                i + 1 < len(toks) and toks[i + 1][0] == "::"
            ) and not (i > 0 and toks[i - 1][0] == "::"):
                segs, j = [t], i + 1
                while j + 1 < len(toks) and toks[j][0] == "::" and re.fullmatch(
                    r"(?:r#)?" + IDENT, toks[j + 1][0]
                ):
                    segs.append(toks[j + 1][0].removeprefix("r#"))
                    j += 2
                ab = absolute(mpath, segs, modules)
                if ab is not None:
                    paths.append((mpath, ab, line))
                i = j
                continue
            i += 1
    out = []
    for mpath, ab, line in paths:
        target = resolve(ab, modules)
        out.append((mpath, target, modules[mpath].file, line))
    return out


def sibling_edges(refs):
    """Edges between siblings: {(parent, a, b): (file, line)} for a reference a.. -> b.."""
    edges = {}
    for src, dst, file, line in refs:
        k = 0
        while k < min(len(src), len(dst)) and src[k] == dst[k]:
            k += 1
        if k == len(src) or k == len(dst):
            continue  # ancestor or descendant
        key = (src[:k], src[k], dst[k])
        edges.setdefault(key, (file, line))
    return edges


def cycles(edges):
    """Strongly connected groups of two or more siblings: [(parent, [names], [(a, b, where)])]."""
    by_parent = {}
    for (parent, a, b), where in edges.items():
        by_parent.setdefault(parent, {}).setdefault(a, {})[b] = where
    found = []
    for parent, graph in by_parent.items():
        nodes = set(graph) | {b for tos in graph.values() for b in tos}
        index, low, stack, on, comps = {}, {}, [], set(), []
        counter = [0]

        def visit(v):
            # Iterative Tarjan (module graphs are small, but recursion limits are not ours).
            work = [(v, iter(sorted(graph.get(v, {}))))]
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            while work:
                node, it = work[-1]
                advanced = False
                for w in it:
                    if w not in index:
                        index[w] = low[w] = counter[0]
                        counter[0] += 1
                        stack.append(w)
                        on.add(w)
                        work.append((w, iter(sorted(graph.get(w, {})))))
                        advanced = True
                        break
                    if w in on:
                        low[node] = min(low[node], index[w])
                if advanced:
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))

        for v in sorted(nodes):
            if v not in index:
                visit(v)
        for comp in comps:
            members = set(comp)
            inner = [
                (a, b, graph[a][b]) for a in comp for b in sorted(graph.get(a, {})) if b in members
            ]
            found.append((parent, comp, inner))
    found.sort(key=lambda c: (-len(c[1]), c[0], c[1]))
    return found


def crate_cycles(crate_dir):
    src = crate_dir / "src"
    modules, raw = parse_crate(src)
    return cycles(sibling_edges(references(modules, raw)))


def key(crate, parent, comp):
    scope = "::".join(parent)
    return f"{crate}{'::' + scope if scope else ''}: {' '.join(comp)}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--known", type=Path, help="cycles still allowed, one per line")
    ap.add_argument("--json", action="store_true", help="print the cycles as JSON")
    a = ap.parse_args(argv)
    crates = sorted(p for p in (a.root / "crates").iterdir() if (p / "src").is_dir())
    if (a.root / "src").is_dir() and (a.root / "Cargo.toml").exists():
        crates.insert(0, a.root)
    report = []
    for crate in crates:
        name = crate.name if crate != a.root else "(root)"
        for parent, comp, inner in crate_cycles(crate):
            report.append((key(name, parent, comp), parent, comp, inner, crate))
    known = set()
    if a.known:
        for line in a.known.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                known.add(line)
    if a.json:
        rows = [{"cycle": r[0], "edges": [[x, y] for x, y, _ in r[3]]} for r in report]
        print(json.dumps(rows, indent=1))
    else:
        for k, parent, comp, inner, crate in report:
            print(f"cycle {k}")
            for x, y, (file, line) in inner:
                print(f"    {x} -> {y}  ({file.relative_to(a.root)}:{line})")
        print(f"{len(report)} module cycle(s) in {len(crates)} crate(s)")
    found = {r[0] for r in report}
    new, gone = sorted(found - known), sorted(known - found)
    for k in new:
        print(f"error: new module cycle: {k}", file=sys.stderr)
    for k in gone:
        print(f"error: listed in {a.known} but gone (remove the line): {k}", file=sys.stderr)
    if new:
        return 1
    return 2 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
