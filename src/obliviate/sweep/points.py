"""The points a comparison reads: each finished run or sweep trial with its method, settings, metrics, per-row values
and held-out report (`Point`), gathered from sweep storages, demo results and run directories (`collect`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from obliviate.errors import ObliviateError
from obliviate.report.html import load_results
from obliviate.sweep.storage import ORIGINAL_ROWS, RETAIN_ROWS, STORAGE_FILE, open_storage, recorded_url


@dataclass
class Point:
    """One run or trial: where it comes from, its method, settings, state and metrics."""

    source: str
    method: str
    name: str
    state: str = "complete"
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    repeat_of: str | None = None
    note: str = ""
    rows: dict[str, list[float]] = field(default_factory=dict)  # metric -> per-row values (eval/intervals.py)
    report: dict[str, Any] | None = None  # {metrics, rows} on held-out rows selection never read (eval/heldout.py)
    recipe: bool = False  # the method's recipe, its study's first trial (sweep start_at_recipe)
    seconds: float | None = None  # a trial's wall time: training and evaluation (None: a run, or a trial cut short)
    cpu_seconds: float | None = None  # its worker process's CPU time over the trial, every thread (None: not recorded)
    queued: bool = False  # a point of the sweep's `queue`, not the sampler's


@dataclass
class Collection:
    points: list[Point]
    original: dict[str, Any]
    kind: str
    sweep: dict[str, Any] | None = None  # the sweep's config (its bar and axes)
    original_report: dict[str, Any] | None = None  # θ0 on the held-out rows (knowledge sweeps)
    retain: dict[str, Any] | None = None  # the retain model on the verdict's rows (TOFU sweeps with eval.retain_model)
    original_rows: dict[str, list] = field(default_factory=dict)  # θ0's per-row values on the held-out rows
    retain_rows: dict[str, list] = field(default_factory=dict)  # the retain model's on the verdict's rows


def _numbers(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}


def _sweep_points(directory: Path, storage: Any = None) -> Collection:
    """Every trial of a sweep directory's studies (its sweep.yaml names the storage)."""
    import optuna

    cfg = yaml.safe_load((directory / "sweep.yaml").read_text(encoding="utf-8")) or {}
    if storage is None:
        url = recorded_url(directory, cfg)
        if url is None:
            raise ObliviateError(f"{directory}: the sweep has no storage yet ({STORAGE_FILE} is missing): run the "
                                 "sweep first")
        storage = open_storage(url)
    prefix = f"{cfg.get('study', 'sweep')}/"
    points, original, kind, original_report, retain = [], {}, "", None, None
    original_rows: dict[str, list] = {}
    retain_rows: dict[str, list] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if not summary.study_name.startswith(prefix):
            continue
        method = summary.study_name[len(prefix):]
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        original = original or dict(study.user_attrs.get("original", {}))
        original_report = original_report or study.user_attrs.get("original_report")
        retain = retain or study.user_attrs.get("retain_report")
        kind = kind or study.user_attrs.get("track", "")
        original_rows = original_rows or dict(study.user_attrs.get(ORIGINAL_ROWS) or {})
        retain_rows = retain_rows or dict(study.user_attrs.get(RETAIN_ROWS) or {})
        for t in study.get_trials(deepcopy=False):
            ua = t.user_attrs
            if t.state.name == "FAIL" and ("stale" in ua or "interrupted" in ua or "surplus" in ua):
                continue  # a stopped worker's trial (done again elsewhere), or one over the budget that never ran
            if t.state.name in ("RUNNING", "WAITING"):
                continue
            note = ua.get("error") or ua.get("pruned") or ""
            points.append(Point(str(directory), method, f"{method} #{t.number}", t.state.name.lower(),
                                dict(ua.get("params", {})), dict(ua.get("metrics", {})), list(ua.get("curve", [])),
                                f"{method} #{ua['repeat_of']}" if "repeat_of" in ua else None, note,
                                dict(ua.get("rows", {})), ua.get("report"), bool(ua.get("recipe")),
                                ua.get("seconds"), ua.get("cpu_seconds"), bool(ua.get("queued"))))
    return Collection(points, original, kind, cfg, original_report, retain, original_rows, retain_rows)


def _result_points(directory: Path) -> Collection:
    """A demo's results.json (every method; target / original as θ0) or a run's metrics.json (one point)."""

    results = load_results(directory)
    runs = results.get("runs") or {}
    base = runs.get("original") or runs.get("target") or {}
    points = [Point(str(directory), name, f"{name} ({directory.name})", metrics=_numbers(run.get("metrics") or {}))
              for name, run in runs.items() if name not in ("original", "target", "retain")]
    kind = "knowledge" if any("forget_accuracy" in p.metrics for p in points) else "demo"
    return Collection(points, _numbers(base.get("metrics") or {}), kind)


def collect(dirs: Sequence[str], storage: Any = None) -> Collection:
    """Points of every directory (sweeps, demo results, runs); a directory with none of them is an error."""
    out = Collection([], {}, "")
    for i, d in enumerate(dirs):
        p = Path(d)
        if not p.is_dir():
            raise ObliviateError(f"compare: {d} is not a directory; pass sweep, demo or unlearn run directories")
        if (p / "sweep.yaml").is_file():
            c = _sweep_points(p, storage if i == 0 else None)
        elif (p / "results.json").is_file() or (p / "metrics.json").is_file():
            c = _result_points(p)
        else:
            raise ObliviateError(f"compare: {d} holds no runs (no sweep.yaml, results.json or metrics.json); pass a "
                                 "sweep directory (obliviate sweep), a demo directory or an unlearn run directory")
        out.points += c.points
        out.original = out.original or c.original
        out.kind = out.kind or c.kind
        out.sweep = out.sweep or c.sweep
        out.original_report, out.retain = out.original_report or c.original_report, out.retain or c.retain
        out.original_rows, out.retain_rows = out.original_rows or c.original_rows, out.retain_rows or c.retain_rows
    return out


def judged(p: Point) -> tuple[dict[str, Any], dict[str, list]]:
    """(metrics, per-row values) a verdict reads of a point: its held-out report when the study kept one (rows the
    selection never read), else what selection read."""
    if p.report:
        return dict(p.report.get("metrics") or {}), dict(p.report.get("rows") or {})
    return p.metrics, p.rows


def seeds_of(coll: Collection, p: Point) -> list[Point]:
    """A trial and its finished repeats (the same settings, other seeds)."""
    return [p] + [q for q in coll.points if q.repeat_of == p.name and q.state == "complete"]
