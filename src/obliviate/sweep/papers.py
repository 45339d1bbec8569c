"""`obliviate compare`'s TOFU table in the ASU and SAGO papers' columns, each cell with its interval.

Each method at its recipe and at its best, on the verdict's rows (the held-out ones when the study kept them): the
mean over the seeds each ran with and its percentile-bootstrap interval over seeds × rows (eval/intervals.py).
Forget quality, model utility and the closer-look FE / MU are recomputed from their resampled per-row parts
(eval/aggregates.py), each split drawn on its own. "MU ÷ θ0" is model utility over θ0's on the same draw of the same
rows (a paired ratio: the bar's "≥ 0.9 × θ0's utility" asked of the held-out rows with its uncertainty). θ0 and the
retain model get intervals over their rows when the study kept them. With the bests' audits (sweep/audits.py), each
best's row also gives the share of the forgotten knowledge relearning and quantisation bring back (each attack's
strongest variant, with its interval over the forget rows: one audited run).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Sequence

from obliviate.audit.verdict import share_with_interval
from obliviate.eval.aggregates import PARTS, parts_of, row_group, with_tofu_aggregates
from obliviate.eval.intervals import Interval, bootstrap, paired, ratio_to_reference
from obliviate.eval.score import with_forget_score
from obliviate.eval.tofu import FQ_ROWS, utility_elasticities
from obliviate.sweep.points import Collection, judged, seeds_of

Table = tuple[Mapping[str, Any], Mapping[str, Any]]  # one seed's (metrics, per-row values)
TOFU_KINDS = ("unlearn", "demo")  # the tracks whose evaluations are TOFU's

# TOFU's table as the ASU and SAGO papers print it: (metric, heading), the arrow saying which way is better; RATIO is
# this table's own column, model utility relative to θ0's on the same rows
RATIO = "model_utility ÷ θ0"
PAPER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("forget_quality", "FQ ↑"), ("model_utility", "MU ↑"), (RATIO, "MU ÷ θ0 (paired) ↑"), ("fe_partial", "FE ↑"),
    ("mu_partial", "MU (closer look) ↑"), ("forget_rougeL_recall", "forget ROUGE-L ↓"),
    ("forget_truth_ratio", "forget truth ratio"), ("forget_degenerate_share", "degenerate ↓"))
# the audit's attacks in the table when the bests were audited: (attack, heading)
RECOVERY_COLUMNS = (("relearn", "relearning brings back ↓"), ("quantize", "quantisation brings back ↓"))


def num(v: float) -> str:
    """3 decimals, or 2 significant digits below 1e-3 (forget quality is a p-value, often tiny)."""
    return f"{v:.1e}" if 0 < abs(v) < 1e-3 else f"{v:.3f}"


def resampling(coll: Collection, metrics: Sequence[str], seen: Sequence[Table]) -> dict[str, Any]:
    """bootstrap's keywords for an interval of a score over `metrics` from `seen` (each seed's metrics and rows):
    the knowledge track recomputes forget_score from its resampled parts; TOFU tracks recompute model utility,
    forget quality and FE / MU from theirs when every seed kept per-row values of them (eval/aggregates.py; else
    their interval is over seeds only), drawing each split's rows on its own (a score of row means alone keeps the
    default draws, which give one split's rows the same intervals); the interval's row count is that of the parts."""
    if coll.kind == "knowledge":
        return {"derive": with_forget_score, "reads": tuple(metrics)}
    if coll.kind in TOFU_KINDS:
        which = tuple(m for m in metrics if m in PARTS and all(set(PARTS[m]) & set(r) for _, r in seen))
        if not which:  # row means alone: drawn as always (by length), so earlier reports' intervals stay the same
            return {"reads": tuple(metrics)}
        return {"derive": functools.partial(with_tofu_aggregates, which=which), "group": row_group, "whole": FQ_ROWS,
                "reads": parts_of(tuple(metrics))}
    return {"reads": tuple(metrics)}


def _value(metric: str) -> Callable[[Mapping[str, Any]], float]:
    def score(m: Mapping[str, Any]) -> float:
        v = m.get(metric)
        return math.nan if v is None else float(v)

    return score


def share_of_original(coll: Collection, metric: str, seen: Sequence[Table], level: float) -> Interval:
    """`metric` over θ0's in each draw of `seen` (seeds × the verdict's rows), θ0's drawn on the same rows when the
    study kept them (a paired ratio: the bar's "keeps >= 0.9x the original's" with its uncertainty), else fixed; the
    same recomputation from parts as `resampling`. NaN when θ0 has no value of `metric`."""
    reference: Table = (coll.original_report or coll.original, coll.original_rows)
    if reference[0].get(metric) is None:
        return Interval(math.nan, math.nan, math.nan, level, len(seen), 0, False)
    kw = resampling(coll, (metric,), seen)
    score = ratio_to_reference(metric, kw.pop("derive", None))
    if "group" not in kw and coll.kind in TOFU_KINDS:
        kw["group"] = row_group  # each split on its own, θ0's rows with the model's
    return bootstrap(score, [paired(t, reference) for t in seen], level=level, **kw)


def metric_interval(coll: Collection, metric: str, seen: Sequence[Table], level: float) -> Interval:
    """One column's bootstrap interval over `seen` (seeds × the verdict's rows; `resampling`); RATIO: model utility
    over θ0's (`share_of_original`). NaN when the metric is missing."""
    if metric == RATIO:
        return share_of_original(coll, "model_utility", seen, level)
    return bootstrap(_value(metric), seen, level=level, **resampling(coll, (metric,), seen))


def cell(iv: Interval) -> str:
    """A papers' table cell: 'est [low, high]', '†' when the interval is over seeds only, '–' when missing."""
    if math.isnan(iv.estimate):
        return "–"
    if not iv.resampled:
        return num(iv.estimate)
    return f"{num(iv.estimate)} [{num(iv.low)}, {num(iv.high)}]" + ("" if iv.rows else " †")


def recovery_cells(audit: Mapping[str, Any] | None) -> list[str]:
    """The RECOVERY_COLUMNS cells of a best from its audit summary (audit_section's {shares, intervals}); '–' without
    an audit, 'n/a' where the attack did not run or its share is undefined."""
    if audit is None:
        return ["–"] * len(RECOVERY_COLUMNS)
    return [share_with_interval(audit["shares"].get(k), (audit.get("intervals") or {}).get(k))
            for k, _ in RECOVERY_COLUMNS]


def utility_note(original: Mapping[str, Any]) -> str | None:
    """A sentence on what θ0's model utility leans on: its parts with the largest elasticities (eval/tofu.py) that
    together carry over half of it; None when θ0 lacks a part."""
    weights = sorted(utility_elasticities(original).items(), key=lambda kv: -kv[1])
    if not weights:
        return None
    top, total = [], 0.0
    for key, w in weights:
        top.append(f"{key} ({num(float(original[key]))}) {w:.0%}")
        total += w
        if total > 0.5:
            break
    return (f"What θ0's model utility leans on: {' and '.join(top)} of it; a relative change of 10% in a part moves "
            "utility by that share of 10% (its elasticity, d log MU / d log part; the nine sum to 100%). A "
            "harmonic mean follows its smallest parts: utility is only as steady as they are on these rows.")


def papers_section(coll: Collection, bests: Sequence[Any], level: float = 0.95,
                   audited: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, Any]]:
    """TOFU sweeps: the module's table for θ0, the retain model and each method at its recipe and at its best
    (compare's Best: .method, .point), with RECOVERY_COLUMNS when `audited` (audit_section's summary) holds any best;
    (Markdown lines, the JSON summary); nothing for other tracks."""
    if coll.kind not in TOFU_KINDS or not any("model_utility" in p.metrics for p in coll.points):
        return [], {}
    extra = list(RECOVERY_COLUMNS) if audited else []
    lines = ["## In the papers' columns", "", "TOFU's forget quality (KS test against the retain model) and model "
             "utility, model utility over θ0's on the same rows, the closer-look FE and MU (partial when a "
             "component's model is missing), forget ROUGE-L, truth ratio and degenerate share, on the verdict's "
             f"rows: the mean over seeds and its {level:.0%} bootstrap interval over seeds × rows (forget quality, "
             "model utility, FE and MU recomputed from their resampled per-row parts, each split drawn on its own; "
             "the ratio to θ0 drawn on the same rows for both; † over seeds only: some of those trials kept no "
             "per-row values of that number's parts; ‡ θ0's utility fixed, not drawn: the study kept no per-row "
             "values of θ0, so the ratio's interval is wider than a paired one). Forget quality's mean can lie above "
             "its interval: a KS p-value near 1 means the two truth-ratio columns are nearly alike, and a draw of "
             "rows with repeats mostly parts them, so its percentile interval can sit below the value on all rows."
             + (" The last columns: the share of the forgotten knowledge each attack brings back in the audit of the "
                "best trained again alone (see the next section), with its 95% interval over the forget rows."
                if extra else ""), "",
             "| method | point | seeds | " + " | ".join(h for _, h in [*PAPER_COLUMNS, *extra]) + " |",
             "|---|---|---|" + "---|" * (len(PAPER_COLUMNS) + len(extra))]
    theta0: Table = (coll.original_report or coll.original, coll.original_rows)
    summary: dict[str, Any] = {}
    for name, what, table in (("θ0", "the original model", theta0),
                              ("retain", "the retain model (never trained on the forget rows)",
                               (coll.retain or {}, coll.retain_rows))):
        if table[0]:
            ivs = {k: metric_interval(coll, k, [table], level) for k, _ in PAPER_COLUMNS}
            lines.append(f"| {name} | {what} | | " + " | ".join([cell(ivs[k]) for k, _ in PAPER_COLUMNS]
                                                               + ["–"] * len(extra)) + " |")
            summary[name] = {"intervals": {k: dataclasses.asdict(iv) for k, iv in ivs.items()}}
    note = utility_note(theta0[0])
    recipes = {p.method: p for p in coll.points if p.recipe and p.state == "complete"}
    for b in bests:
        rows = [("recipe", recipes.get(b.method)), ("best", b.point)]
        if rows[0][1] is not None and b.point is not None and rows[0][1].name == b.point.name:
            rows = [("recipe = best", b.point)]
        for label, point in rows:
            if point is None:
                continue
            seen = [judged(q) for q in seeds_of(coll, point)]
            ivs = {k: metric_interval(coll, k, seen, level) for k, _ in PAPER_COLUMNS}
            cells = {k: cell(ivs[k]) + (" ‡" if k == RATIO and ivs[k].resampled and not theta0[1] else "")
                     for k, _ in PAPER_COLUMNS}
            audit = (audited or {}).get(b.method) if point is b.point else None
            recovery = recovery_cells(audit)[:len(extra)]
            lines.append(f"| {b.method} | {label}: {point.name} | {len(seen)} | "
                         + " | ".join([cells[k] for k, _ in PAPER_COLUMNS] + recovery) + " |")
            summary.setdefault(b.method, {})[label] = {
                "trial": point.name, "seeds": len(seen),
                "values": {k: [m.get(k) for m, _ in seen] for k, _ in PAPER_COLUMNS if k != RATIO},
                "intervals": {k: dataclasses.asdict(iv) for k, iv in ivs.items()}}
    return lines + ([""] + [note] if note else []) + [""], summary
