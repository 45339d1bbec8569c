"""`obliviate compare RUN_OR_SWEEP_DIR...`: one report over many runs: each method's forget–utility frontier.

Inputs: sweep directories (every trial of every method's study, from the sweep's storage), demo result
directories (results.json: every method of the run) and unlearn run directories (metrics.json). Output
(report.md, report.html, frontier.png, curves.png, compare.json):
  - per method, the Pareto front of (forget ↓, utility ↑) over its finished trials;
  - each method's best trial at matched utility (the bar: e.g. the lowest forget score with neighbour and
    retain accuracy >= 0.9x θ0's and <= 10% degenerate replies), or "none found", with the spread over the
    seeds it was repeated with (mean ± sd);
  - a scatter of every trial, the fronts drawn, fluency as colour; the front trials' curves during training.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from obliviate.errors import ObliviateError
from obliviate.eval.intervals import Interval, bootstrap, check_level, tied_groups
from obliviate.eval.score import Bar, Expr, best_under_bar, nearest_to_bar, pareto_front, with_forget_score
from obliviate.files import write_json_atomic
from obliviate.report.page import markdown_body, page
from obliviate.report.plots import new_figure, png_bytes
from obliviate.sweep.audits import audit_section
from obliviate.sweep.defaults import DEMO_DEFAULTS, KNOWLEDGE_DEFAULTS, UNLEARN_DEFAULTS, parse_axes, parse_bar
from obliviate.sweep.papers import num as _num
from obliviate.sweep.papers import papers_section, resampling, share_of_original
from obliviate.sweep.points import Collection, Point, collect, judged, seeds_of
from obliviate.sweep.teachermap import teacher_map_section

Log = Callable[[str], None]


BAR_GIVEN = "bar_given"  # in a collection's sweep config: its bar came from `compare --bar`, not from the sweep


def track_defaults(coll: Collection) -> Any:
    """The bar and axes a collection's track gives when its sweep sets none."""
    return {"knowledge": KNOWLEDGE_DEFAULTS, "demo": DEMO_DEFAULTS}.get(coll.kind, UNLEARN_DEFAULTS)


def scales(coll: Collection) -> tuple[Bar, dict[str, Expr]]:
    """The bar and axes: the sweep's own (or the one `with_bar` gave), else the track's defaults."""

    defaults = track_defaults(coll)
    sweep = coll.sweep or {}
    return parse_bar(sweep.get("bar") or {}, defaults, None), parse_axes(sweep.get("report") or {}, defaults, None)


def with_bar(coll: Collection, bar: Mapping[str, Any] | None) -> Collection:
    """`coll` judged by `bar` (`compare --bar`: {forget, keep, at_most} over the track's defaults) instead of its
    sweep's bar; a ConfigError when it names a metric no trial recorded (the names it may use listed)."""
    if bar is None:
        return coll
    recorded = set(coll.original) | {k for p in coll.points for k in p.metrics}
    defaults = track_defaults(coll)
    parse_bar(dict(bar), defaults, recorded)
    return dataclasses.replace(coll, sweep={**(coll.sweep or {}), "bar": dict(bar), BAR_GIVEN: True})


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _params(p: Point) -> str:
    def show(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else json.dumps(v)

    shown = ", ".join(f"{k.split('.')[-1]}={show(v)}" for k, v in p.params.items()) or "base settings"
    return f"queued: {shown}" if p.queued else shown


def fronts(coll: Collection, axes: Mapping[str, Expr]) -> dict[str, list[Point]]:
    """Per method, its finished points on the Pareto front of (forget ↓, utility ↑), by forget score."""
    out = {}
    for method in dict.fromkeys(p.method for p in coll.points):
        pts = [p for p in coll.points if p.method == method and p.state == "complete" and p.repeat_of is None]
        xy = [(axes["forget"](p.metrics), axes["utility"](p.metrics)) for p in pts]
        front = sorted(pareto_front(xy, (False, True)), key=lambda i: xy[i])
        out[method] = [pts[i] for i in front]
    return out


@dataclass
class Best:
    method: str
    point: Point | None
    seeds: list[Point]


def best_per_method(coll: Collection, bar: Bar) -> list[Best]:
    """Each method's best finished trial under the bar (None: none found) with its repeats over other seeds."""
    out = []
    for method in dict.fromkeys(p.method for p in coll.points):
        pts = [p for p in coll.points if p.method == method and p.state == "complete" and p.repeat_of is None]
        i = best_under_bar([p.metrics for p in pts], bar, coll.original)
        best = pts[i] if i is not None else None
        seeds = seeds_of(coll, best) if best else []
        out.append(Best(method, best, seeds))
    return out


def _interval(iv: Interval) -> str:
    """'0.300 [0.200, 0.400]', or the estimate alone with why there is no interval."""
    if not iv.resampled:
        return f"{_fmt(iv.estimate)} (one seed, no per-row values)"
    over = f"{iv.seeds} seed{'s' if iv.seeds != 1 else ''}" + (f" × {iv.rows} rows" if iv.rows else ", no per-row values")
    return f"{_fmt(iv.estimate)} [{_fmt(iv.low)}, {_fmt(iv.high)}] ({over})"


def _spread(values: Sequence[Any], count: bool = True) -> str:
    """Mean ± sample sd over seeds ('(n=3)' with `count`), the value alone for one seed, '–' for none; missing values
    (None, NaN) are left out."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(float(v))]
    if len(vals) < 2:
        return _num(vals[0]) if vals else "–"
    return f"{_num(statistics.mean(vals))} ± {_num(statistics.stdev(vals))}" + (f" (n={len(vals)})" if count else "")


def frontier_plot(coll: Collection, axes: Mapping[str, Expr], front: Mapping[str, list[Point]],
                  bests: Mapping[str, tuple[Point, Interval]] | None = None) -> Any:
    """Scatter of every finished trial (forget x, utility y; the face colour is fluency, the edge and marker the
    method), each method's front as a line in its colour, θ0 as a star underneath; each method's best at matched
    utility ringed, with its interval as a horizontal bar when the bar's forget score is the x axis."""
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    fig = new_figure(7.5, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    markers, palette = "osD^vPXh<>*p", [f"C{i}" for i in range(10)]
    pts = [p for p in coll.points if p.state == "complete"]
    flu = [axes["fluency"](p.metrics) for p in pts]
    finite = [f for f in flu if not math.isnan(f)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    norm = Normalize(low, high if high > low else low + 1e-9)
    handles = []
    if coll.original:
        ax.scatter([axes["forget"](coll.original)], [axes["utility"](coll.original)], marker="*", s=260, c="red",
                   edgecolors="black", zorder=1)
        handles.append(Line2D([], [], marker="*", ls="", color="red", markeredgecolor="black", markersize=12,
                              label="θ0 (original)"))
    sc = None
    for k, method in enumerate(dict.fromkeys(p.method for p in coll.points)):
        color, marker = palette[k % len(palette)], markers[k % len(markers)]
        mine = [(p, f) for p, f in zip(pts, flu) if p.method == method]
        f = front.get(method, [])
        ax.plot([axes["forget"](p.metrics) for p in f], [axes["utility"](p.metrics) for p in f], color=color, lw=1.4,
                alpha=0.9, zorder=2)
        if mine:
            sc = ax.scatter([axes["forget"](p.metrics) for p, _ in mine], [axes["utility"](p.metrics) for p, _ in mine],
                            c=[v if not math.isnan(v) else low for _, v in mine], cmap="viridis_r", norm=norm,
                            marker=marker, edgecolors=color, linewidths=1.6, s=55, zorder=3)
        handles.append(Line2D([], [], marker=marker, ls="-", color=color, markerfacecolor="white",
                              markeredgecolor=color, markeredgewidth=1.6, label=method))
        if bests and method in bests:
            p, iv = bests[method]
            x, y = axes["forget"](p.metrics), axes["utility"](p.metrics)
            ax.scatter([x], [y], s=220, facecolors="none", edgecolors=color, linewidths=2.2, zorder=4)
            if iv.resampled and iv.estimate == iv.estimate:
                ax.errorbar([iv.estimate], [y], xerr=[[iv.estimate - iv.low], [iv.high - iv.estimate]], color=color,
                            capsize=4, lw=2, zorder=4)
    if sc is not None:
        fig.colorbar(sc, ax=ax, label=f"{axes['fluency'].text} (face colour)")
    ax.set_xlabel(f"{axes['forget'].text} ↓")
    ax.set_ylabel(f"{axes['utility'].text} ↑")
    ax.set_title("forget–utility frontier per method (lines: Pareto fronts)")
    ax.legend(handles=handles, fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return fig


def curves_plot(front: Mapping[str, list[Point]]) -> Any:
    """The evaluation-during-training score of the front's trials, one panel per method (None: no curves)."""

    methods = [m for m, pts in front.items() if any(p.curve for p in pts)]
    if not methods:
        return None
    fig = new_figure(4.0 * len(methods), 3.2)
    for k, m in enumerate(methods):
        ax = fig.add_subplot(1, len(methods), k + 1)
        for p in front[m]:
            if p.curve and "score" in p.curve[0]:
                ax.plot([c["step"] for c in p.curve], [c["score"] if c["score"] is not None else math.nan
                                                       for c in p.curve], marker=".", label=p.name.split(" ")[-1])
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.axes[0].set_ylabel("score during training")
    return fig


def forget_interval(coll: Collection, bar: Bar, seeds: Sequence[Point], level: float) -> Interval:
    """bar.forget's bootstrap interval (eval/intervals.py) over `seeds` (one point per seed) and, where trials kept
    them, the rows a verdict reads (`judged`: the held-out ones when the study kept them); see `resampling`."""
    seen = [judged(p) for p in seeds]
    return bootstrap(bar.forget, seen, level=level, **resampling(coll, bar.forget.rests_on, seen))


def recipe_section(coll: Collection, bar: Bar, axes: Mapping[str, Expr], level: float) -> tuple[list[str], dict]:
    """Markdown lines and summary of each method at its recipe (the trials a sweep with start_at_recipe ran first):
    its metrics, bar.forget with its interval over rows and over the seeds it ran with (itself and its repeats, when
    the recipe was a best) on the verdict's rows, whether it passes the bar, and, when the study kept held-out rows,
    its utility there with its interval and the seeds that pass there; nothing when no trial is a recipe."""
    recipes = [p for p in coll.points if p.recipe and p.state == "complete"]
    if not recipes:
        return [], {}
    held = any(p.report for p in recipes)
    extra = (f" | {axes['utility'].text} on the held-out rows [{level:.0%}] | seeds passing there" if held else "")
    lines = ["## Each method at its recipe", "", "The first trial of each study: the base config with the method's "
             "own section (for presets taken from the papers, the authors' recipe scaled to this model).", "",
             f"| method | trial | forget | utility | fluency | {bar.forget.text} | {level:.0%} interval (rows × seeds) | "
             f"passes the bar{' (selection rows)' if held else ''}{extra} | settings |",
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if held else "") + "---|"]
    summary = {}
    for p in recipes:
        seeds = seeds_of(coll, p)
        iv = forget_interval(coll, bar, seeds, level)
        ok = bar.passes(p.metrics, coll.original)
        m = p.metrics
        again = heldout_bar(coll, bar, axes, seeds, level)
        cells = ("" if not held else " | n/a | n/a" if again is None else
                 f" | {_interval(again['utility_interval'])} | {again['passing']} of {again['seeds']}")
        lines.append(f"| {p.method} | {p.name} | {_fmt(axes['forget'](m))} | {_fmt(axes['utility'](m))} | "
                     f"{_fmt(axes['fluency'](m))} | {_fmt(iv.estimate)} | {_interval(iv)} | {'yes' if ok else 'no'}"
                     f"{cells} | {_params(p)} |")
        summary[p.method] = {"trial": p.name, "params": p.params, "metrics": p.metrics, "passes": ok,
                             "interval": dataclasses.asdict(iv), "heldout_bar": again and _plain(again)}
    return lines + [""], summary


def heldout_bar(coll: Collection, bar: Bar, axes: Mapping[str, Expr], seeds: Sequence[Point],
                level: float) -> dict[str, Any] | None:
    """The bar again on the held-out rows of `seeds` (θ0 on those rows as the reference): utility and fluency per
    seed, the seeds that pass, and the utility's bootstrap interval over rows × seeds; None when a seed kept no
    held-out rows."""
    if not seeds or not all(p.report for p in seeds):
        return None
    reference = coll.original_report or coll.original
    seen = [judged(p) for p in seeds]
    mets = [m for m, _ in seen]
    kept = {k: share_of_original(coll, k, seen, level) for k in bar.keep}
    return {"utility": [axes["utility"](m) for m in mets], "fluency": [axes["fluency"](m) for m in mets],
            "passing": sum(bar.passes(m, reference) for m in mets), "seeds": len(mets),
            "utility_interval": bootstrap(axes["utility"], seen, level=level,
                                          **resampling(coll, axes["utility"].rests_on, seen)),
            "kept": {k: {"interval": iv, "share": bar.keep[k], "verdict": kept_verdict(iv, bar.keep[k]),
                         "paired": bool(coll.original_rows)} for k, iv in kept.items()}}


def kept_verdict(iv: Interval, share: float) -> str:
    """Whether a metric's share of θ0's (its interval) keeps the bar's `share`: 'keeps' when the whole interval is at
    or above it, 'loses' when the whole interval is below, else 'cannot tell'; 'n/a' without a value."""
    if math.isnan(iv.estimate):
        return "n/a"
    return "keeps" if iv.low >= share else "loses" if iv.high < share else "cannot tell"


def _plain(again: Mapping[str, Any]) -> dict[str, Any]:
    """heldout_bar's result for compare.json (the intervals as dicts)."""
    return {**again, "utility_interval": dataclasses.asdict(again["utility_interval"]),
            "kept": {k: {**v, "interval": dataclasses.asdict(v["interval"])} for k, v in again["kept"].items()}}


def _kept(again: Mapping[str, Any]) -> str:
    """The held-out table's cell: each kept metric's share of θ0's with its interval and verdict."""
    return "; ".join(f"{k} {_fmt(v['interval'].estimate)} [{_fmt(v['interval'].low)}, {_fmt(v['interval'].high)}]"
                     f"{'' if v['paired'] else ' ‡'}: {v['verdict']} (bar {v['share']:g})"
                     for k, v in again["kept"].items()) or "–"


def heldout_section(coll: Collection, bar: Bar, axes: Mapping[str, Expr], bests: Sequence[Best],
                    level: float) -> tuple[list[str], dict]:
    """Each best against the bar again on the held-out rows (heldout_bar): the utility over its seeds there with its
    bootstrap interval over rows × seeds, the fluency, and how many seeds still pass; nothing when the study kept
    no held-out rows."""
    again = {b.method: heldout_bar(coll, bar, axes, b.seeds, level) for b in bests if b.point is not None}
    named = [b for b in bests if again.get(b.method) is not None]
    if not named:
        return [], {}
    lines = ["", "The same bar on the held-out rows (θ0 on those rows as the reference): a best selected on one part "
             "of the rows may not keep its utility on the other. The share of θ0's is each kept metric over θ0's in "
             f"the same bootstrap draw of the same rows, with its {level:.0%} interval: it keeps the bar when the "
             "whole interval is at or above the bar's share, loses it when the whole interval is below (‡: θ0's "
             "value fixed, not drawn: the study kept no per-row values of θ0).", "",
             f"| method | trial | {axes['utility'].text} over seeds | {level:.0%} interval (rows × seeds) | "
             f"{axes['fluency'].text} over seeds | seeds passing the bar | share of θ0's on the same rows |",
             "|---|---|---|---|---|---|---|"]
    for b in named:
        a = again[b.method]
        lines.append(f"| {b.method} | {b.point.name} | {_spread(a['utility'])} | {_interval(a['utility_interval'])} | "
                     f"{_spread(a['fluency'])} | {a['passing']} of {a['seeds']} | {_kept(a)} |")
    return lines, {b.method: _plain(again[b.method]) for b in named}


def build_report(coll: Collection, level: float = 0.95,
                 audits: Path | None = None) -> tuple[str, dict[str, Any], list[tuple[str, Any]]]:
    """(Markdown, the JSON summary, [(file name, figure)]) of a collection; `level`: the intervals' confidence;
    `audits`: where each best's audit is (sweep/audits.py)."""
    bar, axes = scales(coll)
    front = fronts(coll, axes)
    bests = best_per_method(coll, bar)
    ivs = {b.method: forget_interval(coll, bar, b.seeds, check_level(level)) for b in bests if b.point is not None}
    methods = list(dict.fromkeys(p.method for p in coll.points))
    lines = ["# obliviate compare", "", f"Sources: {', '.join(sorted({p.source for p in coll.points}))}",
             f"Axes: forget = `{axes['forget'].text}` (lower is better), utility = `{axes['utility'].text}` (higher "
             f"is better), fluency = `{axes['fluency'].text}`.", ""]
    if coll.original:
        lines += [f"θ0 (the original model): forget {_fmt(axes['forget'](coll.original))}, utility "
                  f"{_fmt(axes['utility'](coll.original))}, fluency {_fmt(axes['fluency'](coll.original))}.", ""]
    lines += ["## Trials", "", "| method | complete | pruned | failed | minutes per finished trial (median) | "
              "hours in all | CPU minutes per finished trial (median) |", "|---|---|---|---|---|---|---|"]
    timing: dict[str, Any] = {}
    for m in methods:
        states = [p.state for p in coll.points if p.method == m]
        done = [p for p in coll.points if p.method == m and p.state == "complete"]
        secs = [p.seconds for p in done if p.seconds is not None]
        cpu = [p.cpu_seconds for p in done if p.cpu_seconds is not None]
        timing[m] = {"median_s": statistics.median(secs) if secs else None, "total_s": sum(secs), "n": len(secs),
                     "cpu_median_s": statistics.median(cpu) if cpu else None, "cpu_n": len(cpu)}
        lines.append(f"| {m} | {states.count('complete')} | {states.count('pruned')} | {states.count('fail')} | "
                     f"{_fmt(timing[m]['median_s'] / 60, 1) if secs else '–'} | {_fmt(sum(secs) / 3600, 2)} | "
                     f"{_fmt(timing[m]['cpu_median_s'] / 60, 1) if cpu else '–'} |")
    total = sum(t["total_s"] for t in timing.values())
    lines += ["", f"Finished trials took {_fmt(total / 3600, 2)} hours of wall time in all (each trial's training and "
              "evaluation, summed over workers; a worker's start and its trials cut short are not counted). CPU "
              "minutes: the worker process's CPU time over the same span, all its threads; unlike wall time it does "
              "not count a paused or waiting worker (on a GPU it is the host's share only)."]
    recipe_lines, recipes = recipe_section(coll, bar, axes, level)
    lines += [""] + recipe_lines
    audit_lines, audited = audit_section(bests, audits) if audits is not None else ([], {})
    paper_lines, papers = papers_section(coll, bests, level, audited)
    lines += paper_lines + audit_lines
    given = (coll.sweep or {}).get(BAR_GIVEN)
    lines += ["## Best at matched utility", "", f"Bar{' (given with --bar, not the sweep’s own)' if given else ''}: "
              f"{bar.describe()}.", "",
              f"| method | trial | forget | utility | fluency | {bar.forget.text} over seeds | {level:.0%} interval "
              "(rows × seeds) | utility over seeds | seeds passing the bar | settings |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {"axes": {k: e.text for k, e in axes.items()}, "bar": bar.describe(), "methods": {},
                               "recipes": recipes, "papers": papers, "timing": timing, "audits": audited, "retain": coll.retain}
    for b in bests:
        if b.point is None:
            mine = [p for p in coll.points if p.method == b.method and p.state == "complete" and p.repeat_of is None]
            i = nearest_to_bar([p.metrics for p in mine], bar, coll.original)
            miss = "" if i is None else (f"nearest: {mine[i].name}, {_fmt(axes['forget'](mine[i].metrics))} / "
                                         f"{_fmt(axes['utility'](mine[i].metrics))}, breaks "
                                         + "; ".join(bar.broken(mine[i].metrics, coll.original)))
            lines.append(f"| {b.method} | none found | | | | | | | | {miss} |")
        else:
            m = b.point.metrics
            passing = sum(bar.passes(p.metrics, coll.original) for p in b.seeds)
            lines.append(f"| {b.method} | {b.point.name} | {_fmt(axes['forget'](m))} | {_fmt(axes['utility'](m))} | "
                         f"{_fmt(axes['fluency'](m))} | {_spread([bar.forget(p.metrics) for p in b.seeds])} | "
                         f"{_interval(ivs[b.method])} | "
                         f"{_spread([axes['utility'](p.metrics) for p in b.seeds])} | {passing} of {len(b.seeds)} | "
                         f"{_params(b.point)} |")
        summary["methods"][b.method] = {
            "best": None if b.point is None else {"trial": b.point.name, "params": b.point.params,
                                                  "metrics": b.point.metrics},
            "seeds": [bar.forget(p.metrics) for p in b.seeds],
            "seeds_utility": [axes["utility"](p.metrics) for p in b.seeds],
            "seeds_passing": sum(bar.passes(p.metrics, coll.original) for p in b.seeds),
            "interval": None if b.point is None else dataclasses.asdict(ivs[b.method]),
            "front": [{"trial": p.name, "forget": axes["forget"](p.metrics), "utility": axes["utility"](p.metrics),
                       "fluency": axes["fluency"](p.metrics), "params": p.params} for p in front[b.method]]}
    groups = tied_groups(ivs)
    reference = coll.original_report if coll.original_report and any(b.point and b.point.report for b in bests) \
        else coll.original
    base = bar.forget(with_forget_score(dict(reference))) if reference else math.nan

    def won(method: str) -> str:
        f = ivs[method].estimate
        return f"{method} {_interval(ivs[method])}" + (" (forgets nothing: θ0's score)" if f >= base else "")

    missing = [b.method for b in bests if b.point is None]
    ranked = "; then ".join(("tied: " if len(g) > 1 else "") + ", ".join(won(m) for m in g) for g in groups)
    held = all(p.report for b in bests if b.point is not None for p in b.seeds) and bool(groups)
    held_lines, summary["heldout_bar"] = heldout_section(coll, bar, axes, bests, level) if held else ([], {})
    lines += held_lines + ["", ("Selection read one part of each group's rows; the verdict below is scored on the "
                                "held-out part, which selection never read." if held else
                                "Selection and verdict read the same rows (this study kept no held-out rows).")]
    summary["heldout"] = held
    short = [f"{m} {s['seeds'] - s['passing']} of {s['seeds']}" for m, s in summary["heldout_bar"].items()
             if s["passing"] < s["seeds"]]
    lines += ["", "Verdict: " + (ranked + f" (lowest {bar.forget.text} at matched utility first; methods whose "
                                 f"{level:.0%} intervals overlap the group's best are tied, not ranked)" if groups
                                 else "no method has a trial at matched utility")
              + ("; none found for " + ", ".join(missing) if missing and groups else "") + "."
              + (" Seeds whose best fails the bar on the held-out rows: " + ", ".join(short) + "." if short else "")]
    summary["verdict"] = [m for g in groups for m in g]
    summary["tied"] = groups
    summary["level"] = level
    map_lines, summary["teacher_map"] = teacher_map_section(coll, bar, axes)
    lines += [""] + map_lines + ["## Pareto fronts", ""]
    for m in methods:
        lines += [f"**{m}**", "", "| trial | forget | utility | fluency | settings |", "|---|---|---|---|---|"]
        lines += [f"| {p.name} | {_fmt(axes['forget'](p.metrics))} | {_fmt(axes['utility'](p.metrics))} | "
                  f"{_fmt(axes['fluency'](p.metrics))} | {_params(p)} |" for p in front[m]] or ["| none | | | | |"]
        lines.append("")
    stopped = [p for p in coll.points if p.state in ("pruned", "fail")]
    if stopped:
        lines += ["## Pruned and failed trials", ""] + [f"- {p.name} ({p.state}): {p.note} [{_params(p)}]"
                                                        for p in stopped] + [""]
    same_axis = axes["forget"].text == bar.forget.text
    ringed = {b.method: (b.point, ivs[b.method]) for b in bests if b.point is not None and same_axis}
    figs = [("frontier.png", frontier_plot(coll, axes, front, ringed))]
    curves = curves_plot(front)
    if curves is not None:
        figs.append(("curves.png", curves))
    lines += [f"![{name}]({name})" for name, _ in figs]
    return "\n".join(lines) + "\n", summary, figs


def write_compare(dirs: Sequence[str], out: Path, log: Log = print, storage: Any = None, level: float = 0.95,
                  audits: Path | None = None, bar: Mapping[str, Any] | None = None) -> Path:
    """Write report.md, report.html, the figures and compare.json into `out` (bests under `bar` when given, see
    `with_bar`); the report's path."""
    check_level(level)
    coll = collect(dirs, storage)
    if not coll.points:
        raise ObliviateError(f"compare: {', '.join(dirs)} hold no finished runs or trials yet")
    coll = with_bar(coll, bar)
    text, summary, figs = build_report(coll, level, audits)
    out.mkdir(parents=True, exist_ok=True)
    html_page = page("obliviate compare", markdown_body(text, dict(figs)))
    for name, fig in figs:
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(png_bytes(fig))
        tmp.replace(out / name)
    for name, content in (("report.md", text), ("report.html", html_page)):
        tmp = out / f".{name}.tmp"
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(out / name)
    write_json_atomic(out / "compare.json", summary)
    log(text)
    return out / "report.md"
