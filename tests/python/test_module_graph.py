"""Imports run one way: no cycle among the crate's modules, at any level of the tree.

Each `use` and each `crate::`/`super::` path in src/ (test code left out) is an edge from
the module it is written in to the module that holds the item, drawn between the two
siblings below their lowest common ancestor: `api::generation` using `engine::Usage` is
`api -> engine`; `api::generation` using `api::openapi` is `generation -> openapi` inside
`api`; a module using its own parent or child is no edge (they are one part). A cycle
among siblings means neither can be read, tested or replaced without the other.

`python3 tests/python/test_module_graph.py` prints the cycles with the paths behind each
edge. A regex reading of Rust, not a compiler's: macros and glob imports are not followed
(the crate uses neither for its own modules).
"""

import re
import sys
from pathlib import Path
from collections import defaultdict

def modules(src):
    mods = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        if rel.parts[0] in ("main", "bin") or rel.name == "tests":
            continue  # the binary is above everything; test files are not layering
        mods[tuple(parts)] = f
    return mods

# Comments, string literals (raw ones too) and char literals, scanned in one pass so
# that a "//" or "/*" inside a string is not a comment, nor a quote in a comment a string.
LEXEMES = re.compile(
    r"//[^\n]*|/\*.*?\*/|r(#*)\"(?:.|\n)*?\"\1|b?\"(?:\\.|[^\"\\])*\"|b?'(?:\\.|[^'\\])'",
    re.S,
)


def strip(text):
    text = LEXEMES.sub(lambda m: '""' if m.group(0)[-1] in "\"#'" else " ", text)
    # test modules are not part of the layering: cut each, to its matching brace
    while m := re.search(r"#\[cfg\(test\)\]\s*mod \w+\s*\{", text):
        depth, end = 0, len(text)
        for i in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        text = text[: m.start()] + text[end:]
    return text


def expand(tree):
    """`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e"""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree]
    head, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""; continue
        depth += ch == "{"; depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out += [head + x for x in expand(p.strip())]
    return out

def paths(text):
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        # `x as y` names x: the alias goes before the white space that separates it
        tree = re.sub(r"\s+as\s+\w+", "", m.group(1))
        yield from expand(re.sub(r"\s+", "", tree))
    body = re.sub(r"\buse\s+[^;]+;", "", text)
    for m in re.finditer(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)", body):
        yield m.group(1)

def resolve(path, here, mods):
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = base
    for i in range(len(segs)):
        cand = base + tuple(segs[: i + 1])
        if cand in mods:
            best = cand
        else:
            break
    return best

def edges(src):
    mods = modules(src)
    out = defaultdict(set)
    why = defaultdict(set)
    for mod, f in mods.items():
        for p in paths(strip(f.read_text())):
            target = resolve(p, mod, mods)
            if target is None or target == mod:
                continue
            # between the two siblings under their lowest common ancestor
            k = 0
            while k < min(len(mod), len(target)) and mod[k] == target[k]:
                k += 1
            if k == len(mod) or k == len(target):
                continue  # an ancestor or a descendant: the same part
            a, b = mod[: k + 1], target[: k + 1]
            out[a].add(b)
            why[(a, b)].add(("::".join(mod), p))
    return out, why

def cycles(graph):
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1:
                comps.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return comps

SRC = Path(__file__).resolve().parents[2] / "src"


def report(src=SRC):
    graph, why = edges(src)
    found = cycles(graph)
    lines = []
    for comp in found:
        lines.append("cycle: " + " ".join("::".join(c) for c in comp))
        for a in comp:
            for b in comp:
                if b in graph.get(a, ()):
                    ex = sorted(why[(a, b)])[:3]
                    lines.append(f"  {'::'.join(a)} -> {'::'.join(b)}: " + "; ".join(f"{m}: {p}" for m, p in ex))
    return graph, lines


def test_no_module_imports_another_that_imports_it_back():
    _, lines = report()
    assert not lines, "\n".join(lines)


def test_the_reader_sees_edges_and_cycles(tmp_path):
    """The reading itself: a planted cycle between two siblings is found, an edge to a
    parent is not one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "lib.rs").write_text("pub mod a;\npub mod b;\n")
    (tmp_path / "a" / "mod.rs").write_text("pub mod x;\nuse crate::b::{B, c::{C}};\n")
    (tmp_path / "a" / "x.rs").write_text("use super::A;\nfn f() { crate::a::x::g(); }\n")
    (tmp_path / "b.rs").write_text(
        "// use crate::a::A;\n#[cfg(test)]\nmod tests { fn t() { let _ = \"{\"; } }\nuse crate::a as alias;\n"
    )
    graph, lines = report(tmp_path)
    assert graph == {("a",): {("b",)}, ("b",): {("a",)}}, graph
    assert lines[0] == "cycle: a b", lines


if __name__ == "__main__":
    _, lines = report(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    print("\n".join(lines) or "no cycles")
    sys.exit(1 if lines else 0)
