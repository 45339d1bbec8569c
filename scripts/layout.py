"""The package's layout drawn from its imports: rooms, floors, cycles, imports that run back up.

A *room* is a top-level module of `obliviate` or one of its sub-packages; a module's room is the
first part of its dotted name. Every `obliviate` import in `src/` is an edge, at module level or
inside a function (a deferred import is still a dependency). A room's *floor* is one more than the
highest floor it imports (a room that imports no other room is on floor 1); rooms that import each
other form a cycle and share the cycle's floor.

    python scripts/layout.py          # the figures and the floors
    python scripts/layout.py --json   # the same as JSON

The rules the tests hold the package to (tests/test_layout.py): no module import cycle, no room
cycle, every import goes to the room's own floor or below, at most `MAX_FLOORS` floors, and no
private name (`_x`) imported from another module.

Lazy loading has one rule, checked here too: a module is *heavy* when importing it loads one of `HEAVY` (torch,
numpy, matplotlib, optuna, …), through its own module-level imports or those of the obliviate modules (and their
packages) it imports at module level; every other module is *light* (what `obliviate --help`, `ls` and the config
checks import). An import is deferred into a function only from a light module to a heavy one: any other deferral
buys nothing and is a *needless deferral*.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = "obliviate"
MAX_FLOORS = 9


@dataclass
class Edge:
    src: str  # importing module, dotted without the package prefix ("train.loop")
    dst: str  # imported module
    names: tuple[str, ...]  # names taken from it ("" for `import x`)
    deferred: bool  # inside a function
    line: int


HEAVY = {"torch", "transformers", "numpy", "matplotlib", "optuna", "accelerate", "scipy", "sklearn", "datasets",
         "huggingface_hub", "rich", "peft", "safetensors", "sqlalchemy", "rouge_score", "lm_eval", "bitsandbytes",
         "tokenizers", "pandas"}


@dataclass
class Layout:
    modules: list[str]
    edges: list[Edge]
    rooms: dict[str, set[str]] = field(default_factory=dict)  # room -> rooms it imports
    external: dict[str, set[str]] = field(default_factory=dict)  # module -> third-party packages it imports at top

    def room_of(self, module: str) -> str:
        return module.split(".")[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC / PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def _is_package(module: str, modules: set[str], packages: set[str]) -> bool:
    return module in packages


def _resolve(node: ast.ImportFrom, module: str, is_pkg: bool) -> str | None:
    """The dotted name (without the package prefix) of an `from X import ...`; None when not ours."""
    if node.level == 0:
        if node.module is None or not (node.module == PKG or node.module.startswith(PKG + ".")):
            return None
        return node.module[len(PKG) + 1:] if node.module != PKG else "__init__"
    base = module.split(".") if module != "__init__" else []
    if not is_pkg:
        base = base[:-1]
    up = node.level - 1
    base = base[: len(base) - up] if up else base
    parts = base + (node.module.split(".") if node.module else [])
    return ".".join(parts) or "__init__"


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    out = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            out[child] = parent
    return out


def _deferred(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return False
    return False


def read_layout() -> Layout:
    # the package's __main__.py is `python -m obliviate`, the console script's twin: an entry point, not a floor
    files = sorted(f for f in (SRC / PKG).rglob("*.py") if f != SRC / PKG / "__main__.py")
    modules = {_module_name(f): f for f in files}
    packages = {_module_name(f) for f in files if f.name == "__init__.py"}
    edges: list[Edge] = []
    externals: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not _deferred(node, parents):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if node.level == 0 else []
                for name in names:
                    if name.split(".")[0] != PKG:
                        externals.setdefault(module, set()).add(name.split(".")[0])
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == PKG or alias.name.startswith(PKG + "."):
                        dst = alias.name[len(PKG) + 1:] or "__init__"
                        edges.append(Edge(module, dst, ("",), _deferred(node, parents), node.lineno))
            elif isinstance(node, ast.ImportFrom):
                dst = _resolve(node, module, module in packages)
                if dst is None:
                    continue
                sub = [a.name for a in node.names if f"{dst}.{a.name}".removeprefix("__init__.") in modules]
                rest = tuple(a.name for a in node.names if a.name not in sub)
                for name in sub:  # `from obliviate.eval import tofu`: an edge to the sub-module
                    full = f"{dst}.{name}".removeprefix("__init__.")
                    edges.append(Edge(module, full, ("",), _deferred(node, parents), node.lineno))
                if rest:
                    edges.append(Edge(module, dst, rest, _deferred(node, parents), node.lineno))
    layout = Layout(sorted(modules), [e for e in edges if e.src != e.dst], external=externals)
    for e in layout.edges:
        a, b = layout.room_of(e.src), layout.room_of(e.dst)
        layout.rooms.setdefault(a, set())
        layout.rooms.setdefault(b, set())
        if a != b:
            layout.rooms[a].add(b)
    for m in layout.modules:
        layout.rooms.setdefault(layout.room_of(m), set())
    return layout


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan), each sorted; singletons included."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that import each other (components of more than one node)."""
    return [c for c in _sccs(graph) if len(c) > 1]


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Floor of each node: 1 + the highest floor it imports; a cycle shares one floor."""
    comp_of = {v: i for i, c in enumerate(_sccs(graph)) for v in c}
    comps = defaultdict(set)
    for v, ws in graph.items():
        for w in ws:
            if comp_of[w] != comp_of[v]:
                comps[comp_of[v]].add(comp_of[w])
    memo: dict[int, int] = {}

    def floor(c: int) -> int:
        if c not in memo:
            memo[c] = 1 + max((floor(d) for d in comps[c]), default=0)
        return memo[c]

    return {v: floor(comp_of[v]) for v in graph}


def module_graph(layout: Layout) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in layout.modules}
    for e in layout.edges:
        graph[e.src].add(e.dst)
    return graph


def private_imports(layout: Layout) -> list[str]:
    """`from x import _name` across modules (a module's own package `__init__` re-export included)."""
    return sorted({f"{e.src} <- {e.dst}.{n}" for e in layout.edges for n in e.names
                   if n.startswith("_") and not n.startswith("__")})


def up_imports(layout: Layout) -> list[str]:
    """Room imports into a room on the same or a higher floor (only possible within a room cycle)."""
    fl = floors(layout.rooms)
    return sorted({f"{layout.room_of(e.src)} -> {layout.room_of(e.dst)} ({e.src} -> {e.dst})"
                   for e in layout.edges if layout.room_of(e.src) != layout.room_of(e.dst)
                   and fl[layout.room_of(e.dst)] >= fl[layout.room_of(e.src)]})


def _packages(module: str, modules: set[str]) -> list[str]:
    """The package modules importing `module` runs first ("eval.tofu" -> "__init__", "eval")."""
    parts = module.split(".")
    return [p for p in ["__init__"] + [".".join(parts[:i]) for i in range(1, len(parts))] if p in modules]


def heavy_modules(layout: Layout) -> set[str]:
    """The modules whose import loads a HEAVY package (module docstring), by a fixpoint over module-level imports."""
    modules = set(layout.modules)
    top: dict[str, set[str]] = defaultdict(set)
    for e in layout.edges:
        if not e.deferred:
            top[e.src].add(e.dst)
    for m in modules:
        top[m].update(p for p in _packages(m, modules) if p != m)
    heavy = {m for m in modules if layout.external.get(m, set()) & HEAVY}
    changed = True
    while changed:
        grown = {m for m in modules - heavy if top[m] & heavy}
        changed = bool(grown)
        heavy |= grown
    return heavy


def needless_deferrals(layout: Layout) -> list[str]:
    """Imports inside functions that keep nothing heavy out: from a heavy module, or of a light one."""
    heavy = heavy_modules(layout)
    modules = set(layout.modules)
    return sorted({f"{e.src}:{e.line} -> {e.dst}" for e in layout.edges if e.deferred
                   and (e.src in heavy or not ({e.dst, *_packages(e.dst, modules)} & heavy))})


def summary(layout: Layout) -> dict:
    fl = floors(layout.rooms)
    by_floor: dict[int, list[str]] = defaultdict(list)
    for room, f in fl.items():
        by_floor[f].append(room)
    return {
        "modules": len(layout.modules),
        "rooms": len(layout.rooms),
        "floors": max(fl.values()),
        "module_cycles": cycles(module_graph(layout)),
        "room_cycles": cycles(layout.rooms),
        "up_imports": up_imports(layout),
        "deferred_imports": sum(e.deferred for e in layout.edges),
        "private_imports": private_imports(layout),
        "needless_deferrals": needless_deferrals(layout),
        "light_modules": len(set(layout.modules) - heavy_modules(layout)),
        "by_floor": {f: sorted(by_floor[f]) for f in sorted(by_floor)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    s = summary(read_layout())
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"{s['modules']} modules in {s['rooms']} rooms on {s['floors']} floors "
          f"(at most {MAX_FLOORS}); {s['deferred_imports']} imports inside functions")
    for f, rooms in reversed(s["by_floor"].items()):
        print(f"  floor {f:2d}: {', '.join(rooms)}")
    print(f"{s['light_modules']} light modules (importing none of torch, numpy, matplotlib, optuna, …)")
    for key in ("module_cycles", "room_cycles", "up_imports", "private_imports", "needless_deferrals"):
        print(f"{key.replace('_', ' ')}: {len(s[key])}")
        for item in s[key]:
            print(f"  {' -> '.join(item) if isinstance(item, list) else item}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
