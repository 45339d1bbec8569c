"""Results -> a console table and a Markdown report (metrics, directions, sample answers, notes)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from obliviate.eval.metrics import fmt, metric_infos

# (metric key, column title); the arrow says which direction is better
COLUMNS: tuple[tuple[str, str], ...] = (
    ("forget_quality", "forget quality ↑"),
    ("model_utility", "model utility ↑"),
    ("forget_rougeL_recall", "forget ROUGE-L ↓"),
    ("forget_fact_recall", "forget fact recall ↓"),
    ("forget_truth_ratio", "forget truth ratio"),
    ("forget_token_entropy", "token entropy ↑"),
    ("forget_repetition_rate", "repetition ↓"),
    ("forget_degenerate_share", "degenerate ↓"),
)


def columns(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The headline columns of a results dict: its own `columns` (e.g. the knowledge demo's), else TOFU's."""
    return [tuple(c) for c in results.get("columns") or COLUMNS]  # type: ignore[misc]


GEOMETRY = ("cos_f_r", "cos_g_f", "cos_g_r", "conflict_share")


def geometry_summary(history: list[dict[str, float]]) -> dict[str, float] | None:
    """Means over a run's steps of the gradient-geometry statistics (None for a fused `sum` run)."""
    steps = [h for h in history if all(k in h for k in GEOMETRY)]
    if not steps:
        return None
    return {k: sum(h[k] for h in steps) / len(steps) for k in GEOMETRY} | {"steps": len(steps)}


def geometry_rows(results: Mapping[str, Any]) -> list[tuple[str, dict[str, float]]]:
    rows = []
    for name, run in results["runs"].items():
        geo = geometry_summary(run.get("history", []))
        if geo:
            rows.append((name, geo))
    return rows


def console_table(results: Mapping[str, Any]) -> str:
    """The headline metrics of every run as a rich table, rendered to text."""
    table = Table(title="obliviate: forget set vs utility (↑/↓ = better)")
    table.add_column("model")
    cols = columns(results)
    for _, title in cols:
        table.add_column(title, justify="right")
    for name, run in results["runs"].items():
        table.add_row(name, *(fmt(run["metrics"].get(k)) for k, _ in cols))
    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False, color_system=None)
    console.print(table)
    geo = geometry_rows(results)
    if geo:
        gt = Table(title="gradient geometry, mean over steps (cos = cosine; g = the update written to .grad)")
        for col in ("run", "cos(g_f, g_r)", "cos(g, g_f)", "cos(g, g_r)", "conflicting coordinates"):
            gt.add_column(col, justify="right" if col != "run" else "left")
        for name, g in geo:
            gt.add_row(name, *(fmt(g[k]) for k in GEOMETRY))
        console.print(gt)
    return buf.getvalue().rstrip()


def markdown_table(results: Mapping[str, Any]) -> str:
    """The same headline metrics as a Markdown table."""
    cols = columns(results)
    lines = ["| model | " + " | ".join(t for _, t in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, run in results["runs"].items():
        lines.append(f"| {name} | " + " | ".join(fmt(run["metrics"].get(k)) for k, _ in cols) + " |")
    return "\n".join(lines)


def samples(results: Mapping[str, Any], n: int = 3) -> str:
    """The first `n` forget questions with the gold answer and each run's greedy answer."""
    out = []
    for i, q in enumerate(results.get("questions", [])[:n]):
        out.append(f"**Q{i + 1}. {q}**\n\n- gold: {results['answers'][i]}")
        for name, run in results["runs"].items():
            gens = run["metrics"].get("forget_generations") or []
            if i < len(gens):
                out.append(f"- {name}: {gens[i]!r}" if not gens[i].strip() else f"- {name}: {gens[i]}")
        out.append("")
    return "\n".join(out)


def write_report(path: Path, results: Mapping[str, Any]) -> None:
    """Write the Markdown report of a demo or evaluation run."""
    note = results.get("note") or ("Forget quality: KS-test p-value of forget truth ratios against the retain model "
                                   "(TOFU). Model utility: harmonic mean of 9 numbers on retain, real authors, world "
                                   "facts. Fact recall: share of the annotated facts that the greedy answer contains.")
    parts = ["# obliviate report", "", markdown_table(results), "", note, "",
             "## Forget questions, before and after", "", samples(results)]
    parts += list(results.get("extra_markdown") or [])
    geo = geometry_rows(results)
    if geo:
        parts += ["## Gradient geometry (mean over optimizer steps)", "",
                  "| run | cos(g_f, g_r) | cos(g, g_f) | cos(g, g_r) | conflicting coordinates |", "|---|---|---|---|---|"]
        parts += [f"| {n} | " + " | ".join(fmt(g[k]) for k in GEOMETRY) + " |" for n, g in geo] + [""]
    parts += analysis_table(results)
    parts += all_metrics_table(results)
    notes = {f"{name}: {n}" for name, run in results["runs"].items() for n in run["metrics"].get("notes", [])}
    if notes:
        parts += ["## Notes", ""] + [f"- {n}" for n in sorted(notes)]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def calibration_table(res: Mapping[str, Any]) -> str:
    """The τ calibration sweep as a Markdown table, with the recommendation and the rule behind it."""
    mapped = "base" in res
    extra = " forget recall | forget degenerate | retain recall | retain degenerate | facts drop, fluent |" if mapped else ""
    lines = ["| tau | layers | factual Δlogp | functional Δlogp | selectivity | admissible |" + extra,
             "|---|---|---|---|---|---|" + "---|" * (5 if mapped else 0)]
    if mapped:
        lines.append("| θ0 | — | 0 | 0 | 0 | — |" + _replies_cells(res["base"]) + " — |")
    for g in res["grid"]:
        layers = "all" if g["layers"] is None else _layer_span(g["layers"])
        lines.append(f"| {g['tau']:g} | {layers} | {g['factual_shift']:.3f} | {g['functional_shift']:.3f} | "
                     f"{g['selectivity']:.3f} | {'yes' if g['admissible'] else 'no'} |"
                     + (_replies_cells(g) + f" {'yes' if g['fluent_forgetting'] else 'no'} |" if mapped else ""))
    if mapped:
        r = res["replies"]
        measure = res["base"]["forget"]["measure"]
        lines += ["", f"Teacher map: greedy replies of {r['max_new_tokens']} new tokens; recall = "
                      + ("fact recall (annotated facts found in the reply)" if measure == "fact" else
                         "ROUGE-L recall of the answer") + f". Facts drop, fluent: forget recall ≤ {r['recall_ratio']:g} × "
                      f"θ0's and ≤ {r['degenerate_max']:g} of the forget replies degenerate (ASU's search space)."]
    best = res["recommended"]
    n = res["grid"][0] if res["grid"] else {}
    lines += ["", f"Mean per-token log-prob change of the smoothed teacher vs the model on the forget answers "
                  f"({n.get('n_factual', 0)} factual, {n.get('n_functional', 0)} functional tokens). "
                  f"Admissible: functional loss ≤ {res['functional_budget']} nats."]
    if best:
        layers = "all" if best["layers"] is None else best["layers"]
        lines.append(f"Recommended for ASU: tau={best['tau']:g}, layers={layers} "
                     f"(method.forget_args={{tau: {best['tau']:g}, layers: {best['layers'] if best['layers'] is not None else 'null'}}}).")
    else:
        lines.append(f"No recommendation: {res['note']}")
    return "\n".join(lines)


def _layer_span(layers: Sequence[int]) -> str:
    """'6-8' for a contiguous window, else the layers comma-separated."""
    if len(layers) > 2 and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers))


def _replies_cells(point: Mapping[str, Any]) -> str:
    """The teacher map's cells of one point: forget recall, degenerate share, and the retain rows' (— without)."""
    cells = []
    for side in ("forget", "retain"):
        got = point.get(side)
        cells += [f"{got['recall']:.3f}", f"{got['degenerate']:.2f}"] if got else ["—", "—"]
    return " " + " | ".join(cells) + " |"


def metric_label(name: str, metrics: Mapping[str, Any]) -> str:
    """Metric name, labelled when an aggregate was computed from fewer components than defined."""
    base = name.removesuffix("_partial")
    comps = metrics.get(f"{base}_components")
    if name in ("mu_partial", "fe_partial") and metrics.get(f"{base}_complete") is False and comps is not None:
        return f"{base.upper()} (over {len(comps)} of {18 if base == 'mu' else 5} numbers)"
    return name


def all_metrics_table(results: Mapping[str, Any]) -> list[str]:
    """Every scalar metric of every run, one row each, with its direction (for the Markdown report)."""
    runs = results["runs"]
    names: list[str] = []
    for run in runs.values():
        names += [k for k, v in run["metrics"].items() if (isinstance(v, (int, float)) and not isinstance(v, bool))
                  and k not in names]
    if not names:
        return []
    infos = metric_infos()
    head = "| metric | better | " + " | ".join(runs) + " |"
    lines = ["## All metrics", "", head, "|---" * (len(runs) + 2) + "|"]
    for n in names:
        info = infos.get(n)
        better = "→ 0" if n == "privleak" else ("" if info is None else ("↑" if info.higher_is_better else "↓"))
        label = metric_label(n, next(iter(runs.values()))["metrics"])
        lines.append(f"| {label} | {better} | " + " | ".join(fmt(r["metrics"].get(n)) for r in runs.values()) + " |")
    return lines + [""]


def analysis_table(results: Mapping[str, Any]) -> list[str]:
    """Factual vs functional log-prob shifts and attention entropy per layer (runs that carry an analysis)."""
    rows = []
    for name, run in results["runs"].items():
        a = run.get("analysis")
        if not a:
            continue
        ent = ", ".join(f"{e:.2f}" for e in a.get("attention_entropy", []))
        for label, key, ekey in ((name, "token_shift", "attention_entropy"),
                                 (f"{name} teacher", "teacher_token_shift", "teacher_attention_entropy")):
            if key in a or (key == "token_shift" and ent):
                s = a.get(key, {})
                e = ", ".join(f"{x:.2f}" for x in a.get(ekey, []))
                rows.append(f"| {label} | {fmt(s.get('factual'))} | {fmt(s.get('functional'))} | "
                            f"{fmt(s.get('selectivity'))} | {e} |")
    if not rows:
        return []
    return ["## Factual vs functional tokens, attention entropy", "",
            "Mean per-token log-prob change on the forget answers against the target model (factual = "
            "annotated fact/name tokens), and mean attention entropy (nats) per layer. Selectivity (functional − "
            "factual, nats) only means something while functional tokens stay near 0: a model that lost "
            "30 nats on every token is broken, not selective.", "",
            "| model | factual Δlogp | functional Δlogp | selectivity | attention entropy per layer |",
            "|---|---|---|---|---|"] + rows + [""]
