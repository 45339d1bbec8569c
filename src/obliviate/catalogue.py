"""The built-in objectives, retain terms and gradient rules read from their source files, without importing
torch: `obliviate ls` answers in a fraction of a second. tests/test_catalogue.py checks that this reading
equals the live registries (names and one-line summaries), so the two cannot drift.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SOURCES = {"forget": PACKAGE / "objectives" / "forget.py", "retain": PACKAGE / "objectives" / "retain.py",
           "rule": PACKAGE / "gradients" / "rules.py"}
DECORATORS = {"forget": "forget_objective", "retain": "retain_term", "rule": "rule"}


def _registered_name(call: ast.expr, decorator: str) -> str | None:
    """'name' of `@forget_objective("name", ...)` / `@rule("name", ...)`, else None."""
    if not isinstance(call, ast.Call) or not call.args or not isinstance(call.args[0], ast.Constant):
        return None
    func = call.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return call.args[0].value if called == decorator and isinstance(call.args[0].value, str) else None


def _summary(fn: ast.FunctionDef) -> str:
    doc = (ast.get_docstring(fn) or "").strip().splitlines()
    return doc[0] if doc else ""


def builtin(kind: str) -> dict[str, str]:
    """name -> first docstring line of every built-in of `kind` ('forget', 'retain' or 'rule'), sorted by name."""
    tree = ast.parse(SOURCES[kind].read_text(encoding="utf-8"))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                name = _registered_name(dec, DECORATORS[kind])
                if name:
                    found[name] = _summary(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # forget_objective("alias")(fn)
            outer = node.value
            name = _registered_name(outer.func, DECORATORS[kind])
            if name and outer.args and isinstance(outer.args[0], ast.Name) and outer.args[0].id in functions:
                found[name] = _summary(functions[outer.args[0].id])
    return dict(sorted(found.items()))


def _needs(call: ast.Call) -> tuple[str, ...]:
    """The literal `needs=(...)` of a registering decorator call (() when absent)."""
    for kw in call.keywords:
        if kw.arg == "needs" and isinstance(kw.value, (ast.Tuple, ast.List)):
            return tuple(e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return ()


def builtin_needs(kind: str) -> dict[str, tuple[str, ...]]:
    """name -> the θ0 statistics a built-in objective of `kind` ('forget' or 'retain') declares in `needs`."""
    tree = ast.parse(SOURCES[kind].read_text(encoding="utf-8"))
    found: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        calls = node.decorator_list if isinstance(node, ast.FunctionDef) else \
            [node.value.func] if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else []
        for call in calls:
            name = _registered_name(call, DECORATORS[kind])
            if name and isinstance(call, ast.Call):
                found[name] = _needs(call)
    return found
