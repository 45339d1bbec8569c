"""ASU's trials beside the teacher map their space was drawn from: per (τ, layers) point, what the smoothed teacher
does alone (its forget and retain recall, its degenerate share: `obliviate calibrate replies=true`) and what the
students distilled towards it reach (trials, how many pass the bar, the best under it, the lowest forget score).
It answers "does ASU win where its teacher forgets fluently, and how far is its nearest point from the bar?"."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from obliviate.eval.score import Bar, Expr
from obliviate.sweep.points import Collection, Point, judged
from obliviate.sweep.space import MAP_KEY

Cell = tuple[float, tuple[int, ...] | None]  # (τ, layers; None: every layer)


def map_path(sweep: Mapping[str, Any] | None) -> str | None:
    """The teacher map (calibration.json) a sweep's space draws `method.forget_args` from, else None."""
    raw = ((sweep or {}).get("space") or {}).get(MAP_KEY)
    for dim in raw if isinstance(raw, list) else [raw]:
        if isinstance(dim, dict) and dim.get("teacher_map"):
            return str(dim["teacher_map"])
    return None


def cell_of(args: Any) -> Cell | None:
    """A trial's (τ, layers) from its forget_args {tau, layers}; None when it set no τ."""
    if not isinstance(args, Mapping) or not isinstance(args.get("tau"), (int, float)):
        return None
    layers = args.get("layers")
    return float(args["tau"]), (tuple(int(i) for i in layers) if layers is not None else None)


def teacher_cells(data: Mapping[str, Any]) -> dict[Cell, Mapping[str, Any]]:
    """The map's grid by (τ, layers): each point's forget / retain recall and degenerate share, fluent_forgetting."""
    return {c: g for g in data.get("grid") or [] if (c := cell_of(g)) is not None}


def _f(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _layers(layers: tuple[int, ...] | None) -> str:
    if layers is None:
        return "all"
    runs = layers == tuple(range(layers[0], layers[0] + len(layers))) if layers else False
    return f"{layers[0]}-{layers[-1]}" if runs and len(layers) > 1 else ", ".join(map(str, layers))


def map_floor(cells: Mapping[Cell, Mapping[str, Any]], ceiling: float) -> tuple[Cell, float] | None:
    """The map point whose teacher forgets most (lowest forget recall) with at most `ceiling` of its forget replies
    degenerate, and that recall; None when no point stays under the ceiling (ties: the first in the map's order)."""
    fluent = [(float(g["forget"]["recall"]), c) for c, g in cells.items()
              if (g.get("forget") or {}).get("degenerate") is not None and g["forget"]["degenerate"] <= ceiling
              and g["forget"].get("recall") is not None]
    if not fluent:
        return None
    recall, cell = min(fluent, key=lambda rc: rc[0])
    return cell, recall


def fluency_ceilings(bar: Bar, data: Mapping[str, Any]) -> list[tuple[float, str]]:
    """The degenerate-share ceilings a floor is read at: the bar's own (its `at_most` on a *degenerate_share*
    metric) and the map's fluency rule (its config's degenerate_max), each with where it comes from."""
    out = [(float(v), f"the bar's {k} ceiling") for k, v in bar.at_most.items() if k.endswith("degenerate_share")]
    rule = (data.get("config") or {}).get("degenerate_max")
    if isinstance(rule, (int, float)) and all(abs(c - rule) > 1e-12 for c, _ in out):
        out.append((float(rule), "the map's own fluency rule"))
    return out


def floor_lines(rows: list[dict[str, Any]], cells: Mapping[Cell, Mapping[str, Any]], bar: Bar,
                data: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Where the map's teachers forget most: per fluency ceiling, the teacher that forgets most within it (and whether
    the trials tried it), then how far the students came to their teachers (lowest student forget minus teacher's).
    The ceilings are read on the teacher's replies, not the students' (a student can answer more fluently)."""
    tried = {(r["tau"], tuple(r["layers"]) if r["layers"] is not None else None): 0 for r in rows}
    for r in rows:
        tried[(r["tau"], tuple(r["layers"]) if r["layers"] is not None else None)] += r["trials"]
    parts, floors = [], []
    for ceiling, source in fluency_ceilings(bar, data):
        found = map_floor(cells, ceiling)
        if found is None:
            parts.append(f"within {source} (at most {ceiling:g} of its replies degenerate): none, no point stays "
                         "under it")
            floors.append({"ceiling": ceiling, "source": source, "tau": None, "layers": None, "recall": None})
            continue
        (tau, layers), recall = found
        n = tried.get((tau, layers), 0)
        parts.append(f"within {source} (at most {ceiling:g} of its replies degenerate) recalls {_f(recall)} (τ {tau:g}, "
                     f"layers {_layers(layers)}; {f'{n} trials tried it' if n else 'no trial tried it'})")
        floors.append({"ceiling": ceiling, "source": source, "tau": tau, "layers": list(layers) if layers else None,
                       "recall": recall, "trials": n})
    gaps = [r["lowest_forget"] - float(g["forget"]["recall"]) for r in rows
            if (g := cells.get((r["tau"], tuple(r["layers"]) if r["layers"] is not None else None)))
            and (g.get("forget") or {}).get("recall") is not None and not math.isnan(r["lowest_forget"])]
    if not parts:
        return [], floors
    text = (f"The map's floor: of its {len(cells)} points, the teacher that forgets most " + "; ".join(parts) + ". "
            "The ceilings are read on the teachers' replies: a student distilled from a teacher over a ceiling can "
            "still answer fluently, so such a point is not ruled out for its students.")
    if gaps:
        below = sum(g < 0 for g in gaps)
        text += (f" Students against their teacher (each point's lowest student forget score minus the teacher's "
                 f"recall, on the selection rows vs. the map's rows): from {min(gaps):+.3f} to {max(gaps):+.3f}; "
                 + (f"at {below} of {len(gaps)} points a student forgot more than its teacher."
                    if below else f"at none of the {len(gaps)} points did a student forget more than its teacher."))
    return [text, ""], floors


def cell_rows(coll: Collection, bar: Bar, axes: Mapping[str, Expr]) -> list[dict[str, Any]]:
    """One row per (method, τ, layers) the trials tried (first trials only, not their repeats): counts, the best under
    the bar on the selection rows (with its forget score on the held-out rows) and the lowest forget score."""
    groups: dict[tuple[str, Cell], list[Point]] = {}
    for p in coll.points:
        cell = cell_of(p.params.get(MAP_KEY))
        if p.state == "complete" and p.repeat_of is None and cell is not None:
            groups.setdefault((p.method, cell), []).append(p)
    rows = []
    for (method, cell), pts in sorted(groups.items(), key=lambda kv: (kv[0][1][0], kv[0][1][1] or (-1,), kv[0][0])):
        passing = [p for p in pts if bar.passes(p.metrics, coll.original)]
        best = min(passing, key=lambda p: bar.forget(p.metrics)) if passing else None
        low = min(pts, key=lambda p: (math.inf if math.isnan(f := axes["forget"](p.metrics)) else f))
        rows.append({"method": method, "tau": cell[0], "layers": list(cell[1]) if cell[1] is not None else None,
                     "trials": len(pts), "passing": len(passing), "best": best.name if best else None,
                     "best_forget": bar.forget(best.metrics) if best else None,
                     "best_heldout": axes["forget"](judged(best)[0]) if best else None,
                     "lowest": low.name, "lowest_forget": axes["forget"](low.metrics),
                     "lowest_utility": axes["utility"](low.metrics), "lowest_fluency": axes["fluency"](low.metrics)})
    return rows


def teacher_map_section(coll: Collection, bar: Bar, axes: Mapping[str, Expr]) -> tuple[list[str], dict[str, Any]]:
    """The report's "ASU across its teacher map" section and its JSON ([] and {} for a sweep without a map)."""
    path = map_path(coll.sweep)
    rows = cell_rows(coll, bar, axes) if path else []
    if not rows:
        return [], {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cells, missing = teacher_cells(data), ""
    except (OSError, ValueError):
        data, cells = {}, {}
        missing = f" The map itself ({path}) cannot be read from here: run compare from the sweep's folder of origin."
    base = (data.get("base") or {}).get("forget") or {}
    lines = ["## ASU across its teacher map", "",
             f"Each (τ, layers) point the trials tried, from the teacher map `{path}`: the smoothed teacher alone "
             f"(its forget and retain recall, θ0's forget recall {_f(base.get('recall'))}; its degenerate share on "
             "the forget set; fluent: the map's fluent forgetting) beside the students trained towards it, on the "
             "selection rows (held-out in brackets for the best under the bar)." + missing, "",
             "| τ | layers | teacher forget | teacher retain | teacher degenerate | fluent | method | trials | "
             f"pass the bar | best under the bar: {bar.forget.text} [held-out] | lowest forget: trial, forget, "
             "utility, fluency |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = cells.get((r["tau"], tuple(r["layers"]) if r["layers"] is not None else None))
        teacher = (f"{_f(g['forget'].get('recall'))} | {_f(g['retain'].get('recall'))} | "
                   f"{_f(g['forget'].get('degenerate'))} | {'yes' if g.get('fluent_forgetting') else 'no'}"
                   if g else "not on the map | | |")
        best = f"{r['best']}: {_f(r['best_forget'])} [{_f(r['best_heldout'])}]" if r["best"] else "none"
        lines.append(f"| {r['tau']:g} | {_layers(tuple(r['layers']) if r['layers'] is not None else None)} | "
                     f"{teacher} | {r['method']} | {r['trials']} | {r['passing']} | {best} | {r['lowest']}, "
                     f"{_f(r['lowest_forget'])}, {_f(r['lowest_utility'])}, {_f(r['lowest_fluency'])} |")
    floor, floors = floor_lines(rows, cells, bar, data) if cells else ([], [])
    return lines + [""] + floor, {"map": path, "cells": rows, "floors": floors}
