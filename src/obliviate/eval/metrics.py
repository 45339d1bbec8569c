"""The home of every reported metric's meaning: MetricInfo (direction, version, description), declared where the
metric is computed (`register(benchmark, table)` in that module) and gathered through one registry.

`metric_infos()` loads the built-in declaring modules (DECLARING) and the installed plugins, then returns every
registered table, built-ins first; the report, the sweep and the keep-best score read metrics only here. A new metric
is declared in one place: the module that computes it. No other obliviate module is imported at the top of this one.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from obliviate.registry import load_plugins


@dataclass(frozen=True)
class MetricInfo:
    """What a reported number means and which direction is good (lm-evaluation-harness habit)."""

    name: str
    higher_is_better: bool
    version: int
    description: str


DECLARING = ("tofu", "knowledge", "memorization", "mia", "closer_look", "muse", "mcq", "rwku")
_TABLES: dict[str, dict[str, MetricInfo]] = {}


def register(benchmark: str, table: Mapping[str, MetricInfo]) -> dict[str, MetricInfo]:
    """Declare `benchmark`'s metrics (name -> MetricInfo); returns the table. A benchmark is declared once."""
    if benchmark in _TABLES and _TABLES[benchmark] != dict(table):
        raise ValueError(f"metrics of {benchmark!r} are already declared differently")
    _TABLES[benchmark] = dict(table)
    return _TABLES[benchmark]


def metric_infos(*benchmarks: str) -> dict[str, MetricInfo]:
    """Every declared metric (or only those of `benchmarks`): the built-in tables in DECLARING order, then any other
    module's (a plugin's, imported through the entry-point group obliviate.plugins) in the order they registered."""

    for module in DECLARING:
        importlib.import_module(f"obliviate.eval.{module}")
    load_plugins()
    unknown = sorted(set(benchmarks) - set(_TABLES))
    if unknown:
        raise KeyError(f"no metrics declared for {unknown}; declared: {', '.join(sorted(_TABLES))}")
    out: dict[str, MetricInfo] = {}
    for name in [*DECLARING, *(n for n in _TABLES if n not in DECLARING)]:
        if not benchmarks or name in benchmarks:
            out.update(_TABLES.get(name, {}))
    return out


def fmt(value: Any) -> str:
    """A metric for display: 'n/a' when undefined, scientific notation for tiny p-values."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and 0 < abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def metrics_markdown(metrics: Mapping[str, Any], title: str = "metrics") -> str:
    """Scalar metrics as a Markdown table with direction and version, then the notes."""
    infos = metric_infos()
    lines = [f"# {title}", "", "| metric | value | better | version | meaning |", "|---|---|---|---|---|"]
    for name, value in metrics.items():
        if isinstance(value, (int, float)) or value is None:
            info = infos.get(name)
            better = "" if info is None else ("↑" if info.higher_is_better else "↓")
            if name == "privleak":
                better = "→ 0"
            lines.append(f"| {name} | {fmt(value)} | {better} | {info.version if info else ''} | "
                         f"{info.description if info else ''} |")
    notes = metrics.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines)
