"""Scores over a run's metrics: small arithmetic expressions, the Pareto front, the matched-utility bar.

A sweep's objectives, its pruning rules, a run's keep-best score and the comparison report all name
metrics the same way: an expression over metric names with numbers, + - * /, unary minus and the
functions min, max and abs, e.g. `min(neighbours_accuracy, retain_accuracy)` or `forget_score`. A metric
that is missing (None, NaN) makes the whole expression NaN, never 0: a score is never silently replaced.
"""
from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from obliviate.errors import ConfigError

_BINARY: dict[type, Callable[[float, float], float]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                        ast.Mult: operator.mul, ast.Div: operator.truediv}
_FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max, "abs": abs}


@dataclass(frozen=True)
class Expr:
    """A parsed metric expression: its text, the metric names it reads, and its syntax tree."""

    text: str
    names: tuple[str, ...]
    tree: ast.expr

    def __call__(self, metrics: Mapping[str, Any]) -> float:
        """The expression's value on `metrics` (NaN when a metric it reads is missing or not a number)."""
        try:
            return float(_eval(self.tree, metrics))
        except ZeroDivisionError:
            return math.nan

    @property
    def rests_on(self) -> tuple[str, ...]:
        """The metrics its value rests on (`metrics_read` of its names)."""
        return metrics_read(self.names)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _eval(node: ast.expr, metrics: Mapping[str, Any]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return _number(metrics.get(node.id))
    if isinstance(node, ast.UnaryOp):
        return -_eval(node.operand, metrics)
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, metrics), _eval(node.right, metrics))
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = [_eval(a, metrics) for a in node.args]
    if any(math.isnan(a) for a in args):  # min/max would otherwise drop a NaN depending on its position
        return math.nan
    return _FUNCTIONS[node.func.id](*args)


def _check(node: ast.AST, text: str, names: list[str]) -> None:
    """Only numbers, metric names, + - * /, unary minus and min/max/abs calls are allowed."""
    bad = f"{text!r} is not a metric expression (allowed: metric names, numbers, + - * /, min(), max(), abs())"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ConfigError(bad)
    elif isinstance(node, ast.Name):
        names.append(node.id)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _check(node.operand, text, names)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left, text, names)
        _check(node.right, text, names)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
          and not node.keywords and node.args):
        for a in node.args:
            _check(a, text, names)
    else:
        raise ConfigError(bad)


def parse_expr(text: Any, valid: Iterable[str] | None = None, where: str = "metric") -> Expr:
    """Parse `text`; with `valid`, every name it reads must be one of them (the error lists them)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: expected a metric name or expression such as 'forget_accuracy' or "
                          f"'min(neighbours_accuracy, retain_accuracy)', got {text!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ConfigError(f"{where}: {text!r} is not a metric expression (a syntax error)") from None
    names: list[str] = []
    _check(tree, text, names)
    if not names:
        raise ConfigError(f"{where}: {text!r} names no metric; valid metrics: {sorted(valid or [])}")
    if valid is not None:
        known = set(valid)
        unknown = [n for n in dict.fromkeys(names) if n not in known]
        if unknown:
            raise ConfigError(f"{where}: {text!r} names no metric {unknown}; valid metrics: {sorted(known)}")
    return Expr(text.strip(), tuple(dict.fromkeys(names)), tree)


def forget_score(generation_accuracy: float | None, mcq_accuracy: float | None, options: int = 4) -> float | None:
    """The stronger of two forget probes: max(generation accuracy, MCQ accuracy above chance rescaled to [0, 1]).

    MCQ accuracy a over k options counts as (a − 1/k)/(1 − 1/k), clipped at 0, so chance (0.25 of 4) scores 0 and
    a model that hides the answer in generation but still ranks it first scores high. None when both are missing."""
    parts = []
    if generation_accuracy is not None and not math.isnan(generation_accuracy):
        parts.append(float(generation_accuracy))
    if mcq_accuracy is not None and not math.isnan(mcq_accuracy):
        chance = 1.0 / options
        parts.append(max(0.0, (float(mcq_accuracy) - chance) / (1.0 - chance)))
    return max(parts) if parts else None


FORGET_SCORE_PARTS = ("forget_accuracy", "forget_mcq_accuracy")


def metrics_read(names: Iterable[str]) -> tuple[str, ...]:
    """The metrics an expression over `names` rests on: the names, with forget_score's two parts added after it."""
    out = list(dict.fromkeys(names))
    return tuple(out + [n for n in FORGET_SCORE_PARTS if n not in out] if "forget_score" in out else out)


def with_forget_score(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with forget_score recomputed from forget_accuracy and forget_mcq_accuracy (forget_score's rule),
    for scores whose parts were resampled (eval/intervals.py); unchanged when neither part is there."""
    if all(metrics.get(n) is None for n in FORGET_SCORE_PARTS):
        return metrics
    return {**metrics, "forget_score": forget_score(metrics.get("forget_accuracy"), metrics.get("forget_mcq_accuracy"))}


def dominates(a: Sequence[float], b: Sequence[float], maximize: Sequence[bool]) -> bool:
    """a is at least as good as b on every objective and strictly better on one."""
    better = False
    for x, y, up in zip(a, b, maximize):
        if (x < y) if up else (x > y):
            return False
        if (x > y) if up else (x < y):
            better = True
    return better


def pareto_front(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the points no other point dominates (points with a NaN are never on the front), in input order."""
    ok = [i for i, p in enumerate(points) if not any(math.isnan(v) for v in p)]
    return [i for i in ok if not any(dominates(points[j], points[i], maximize) for j in ok if j != i)]


@dataclass(frozen=True)
class Bar:
    """The matched-utility bar: utility metrics keep >= a share of the original's value, some metrics stay under
    a ceiling; among runs that pass, the lowest `forget` wins."""

    forget: Expr
    keep: dict[str, float]  # metric -> minimum share of the original model's value
    at_most: dict[str, float]  # metric -> absolute ceiling

    def broken(self, metrics: Mapping[str, Any], original: Mapping[str, Any]) -> list[str]:
        """The conditions `metrics` breaks, each as text (e.g. 'forget_degenerate_share 0.808 > 0.1')."""
        out = []
        for name, share in self.keep.items():
            value, ref = _number(metrics.get(name)), _number(original.get(name))
            if math.isnan(value) or math.isnan(ref) or value < share * ref:
                out.append(f"{name} {value:.3g} < {share:g}x {ref:.3g}")
        for name, ceiling in self.at_most.items():
            value = _number(metrics.get(name))
            if math.isnan(value) or value > ceiling:
                out.append(f"{name} {value:.3g} > {ceiling:g}")
        if math.isnan(self.forget(metrics)):
            out.append(f"{self.forget.text} missing")
        return out

    def violations(self, metrics: Mapping[str, Any], original: Mapping[str, Any]) -> int:
        """How many of the bar's conditions `metrics` breaks (a missing value breaks its condition)."""
        return len(self.broken(metrics, original))

    def passes(self, metrics: Mapping[str, Any], original: Mapping[str, Any]) -> bool:
        return self.violations(metrics, original) == 0

    def describe(self) -> str:
        parts = [f"{k} >= {v:g}x the original's" for k, v in self.keep.items()]
        parts += [f"{k} <= {v:g}" for k, v in self.at_most.items()]
        return f"lowest {self.forget.text} with " + (" and ".join(parts) if parts else "no other condition")


def best_under_bar(runs: Sequence[Mapping[str, Any]], bar: Bar, original: Mapping[str, Any]) -> int | None:
    """Index of the run with the lowest bar.forget among those that pass the bar (first on ties), else None."""
    passing = [i for i, m in enumerate(runs) if bar.passes(m, original)]
    return min(passing, key=lambda i: (bar.forget(runs[i]), i)) if passing else None


def nearest_to_bar(runs: Sequence[Mapping[str, Any]], bar: Bar, original: Mapping[str, Any]) -> int | None:
    """Index of the run breaking the fewest of the bar's conditions, then with the lowest bar.forget (None: no
    runs): the bar's winner when one passes, else the closest miss."""
    if not runs:
        return None

    def key(i: int) -> tuple[int, float, int]:
        f = bar.forget(runs[i])
        return bar.violations(runs[i], original), math.inf if math.isnan(f) else f, i

    return min(range(len(runs)), key=key)
