"""Results -> one self-contained HTML page (inline CSS, plots as base64 PNG data URIs, no JavaScript)."""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any, Iterable, Mapping

from obliviate.errors import ObliviateError
from obliviate.eval.metrics import fmt, metric_infos
from obliviate.report.markdown import GEOMETRY, columns, geometry_rows, metric_label
from obliviate.report.page import page
from obliviate.report.plots import figures, png_base64

NOTE = ("Forget quality: KS-test p-value of forget truth ratios against the retain model (TOFU). "
        "Model utility: harmonic mean of 9 numbers on retain, real authors, world facts. "
        "Fact recall: share of the annotated facts that the greedy answer contains.")


def _read_json(path: Path) -> Any:
    """A JSON file's content; unreadable or malformed files are user errors."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ObliviateError(f"cannot read {path}: {e}") from e


def load_results(run_dir: str | Path, label: str | None = None) -> dict[str, Any]:
    """A demo's results.json, or an unlearn/eval/finetune run's metrics.json in the same shape."""
    run_dir = Path(run_dir)
    if (run_dir / "results.json").is_file():
        res = _read_json(run_dir / "results.json")
        if not isinstance(res, dict) or not isinstance(res.get("runs"), dict):
            raise ObliviateError(f"{run_dir / 'results.json'} has no 'runs' mapping; is it an obliviate demo result?")
        return res
    if (run_dir / "metrics.json").is_file():
        m = _read_json(run_dir / "metrics.json")
        if not isinstance(m, dict):
            raise ObliviateError(f"{run_dir / 'metrics.json'} is not a JSON object; is it an obliviate run?")
        run: dict[str, Any] = {"metrics": m.get("eval") or {}}
        if m.get("history"):
            run["history"] = m["history"]
        name = label or run_dir.resolve().name or "run"
        return {"runs": {name: run}, "questions": m.get("questions", []), "answers": m.get("answers", [])}
    raise ObliviateError(f"{run_dir} holds neither results.json (obliviate demo) nor metrics.json "
                         "(obliviate unlearn / eval / finetune); pass the run's output_dir")


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], labels: int = 1) -> str:
    """An HTML table of already escaped cells; columns after the first `labels` are right-aligned numbers."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = []
    for row in rows:
        cells = [f"<td>{c}</td>" if i < labels else f'<td class="num">{c}</td>' for i, c in enumerate(row)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def headline_section(results: Mapping[str, Any]) -> str:
    """The headline metrics of every run (the numbers of markdown_table); empty without any of them."""
    runs = results["runs"]
    cols = columns(results)
    if not any(k in r["metrics"] for r in runs.values() for k, _ in cols):
        return ""
    rows = [[escape(n)] + [escape(fmt(r["metrics"].get(k))) for k, _ in cols] for n, r in runs.items()]
    return ("<h2>Forget set vs utility</h2>" + _table(["model"] + [escape(t) for _, t in cols], rows)
            + f'<p class="note">{escape(results.get("note") or NOTE)}</p>')


def plots_section(results: Mapping[str, Any]) -> str:
    """Every plot with data, embedded as a base64 PNG."""
    parts = [f'<figure><img src="data:image/png;base64,{png_base64(fig)}" alt="{escape(key)} plot">'
             f"<figcaption>{escape(caption)}</figcaption></figure>" for key, caption, fig in figures(results)]
    return "<h2>Plots</h2>" + "".join(parts) if parts else ""


def geometry_section(results: Mapping[str, Any]) -> str:
    """Means over steps of the gradient-geometry statistics (runs with separate backward passes)."""
    geo = geometry_rows(results)
    if not geo:
        return ""
    head = ["run", "cos(g_f, g_r)", "cos(g, g_f)", "cos(g, g_r)", "conflicting coordinates", "steps"]
    rows = [[escape(n)] + [escape(fmt(g[k])) for k in GEOMETRY] + [escape(fmt(g["steps"]))] for n, g in geo]
    return "<h2>Gradient geometry (mean over optimizer steps)</h2>" + _table(head, rows)


def analysis_section(results: Mapping[str, Any]) -> str:
    """Factual vs functional Δlogp and attention entropy per layer, for runs that carry an analysis."""
    rows = []
    for name, run in results["runs"].items():
        a = run.get("analysis") or {}
        for label, key, ekey in ((name, "token_shift", "attention_entropy"),
                                 (f"{name} teacher", "teacher_token_shift", "teacher_attention_entropy")):
            if key in a or (key == "token_shift" and a.get(ekey)):
                s = a.get(key, {})
                ent = ", ".join(_entropy(x) for x in a.get(ekey) or [])
                rows.append([escape(label)] + [escape(fmt(s.get(k))) for k in ("factual", "functional", "selectivity")]
                            + [escape(ent)])
    if not rows:
        return ""
    head = ["model", "factual Δlogp", "functional Δlogp", "selectivity", "attention entropy per layer"]
    note = ("Mean per-token log-prob change on the forget answers against the target model (factual = annotated "
            "fact/name tokens), and mean attention entropy (nats) per layer. Selectivity (functional − factual, nats) "
            "only means something while functional tokens stay near 0.")
    return ("<h2>Factual vs functional tokens, attention entropy</h2>" + f'<p class="note">{escape(note)}</p>'
            + _table(head, rows))


def _entropy(x: Any) -> str:
    """One layer's attention entropy to two decimals ('n/a' when missing)."""
    return f"{x:.2f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def _answer(text: Any) -> str:
    """A generation for display, escaped; blank answers shown as their repr so they stay visible."""
    text = str(text)
    return escape(repr(text) if not text.strip() else text)


def samples_section(results: Mapping[str, Any], n: int = 3) -> str:
    """The first `n` forget questions with the gold answer and each run's greedy answer."""
    questions, answers = results.get("questions") or [], results.get("answers") or []
    items = []
    for i, q in enumerate(questions[:n]):
        lines = [f'<li class="gold"><b>gold:</b> {escape(str(answers[i]))}</li>'] if i < len(answers) else []
        for name, run in results["runs"].items():
            gens = run["metrics"].get("forget_generations") or []
            if i < len(gens):
                lines.append(f"<li><b>{escape(name)}:</b> {_answer(gens[i])}</li>")
        items.append(f'<div class="sample"><b>Q{i + 1}. {escape(str(q))}</b><ul>{"".join(lines)}</ul></div>')
    return "<h2>Forget questions, before and after</h2>" + "".join(items) if items else ""


def _direction(name: str, infos: Mapping[str, Any]) -> str:
    """↑ / ↓ from the metric's MetricInfo, '→ 0' for PrivLeak, '' when unknown."""
    if name == "privleak":
        return "→ 0"
    info = infos.get(name)
    return "" if info is None else ("↑" if info.higher_is_better else "↓")


def all_metrics_section(results: Mapping[str, Any]) -> str:
    """Every scalar metric of every run with its direction; the description shows on hover."""
    runs = results["runs"]
    names: list[str] = []
    for run in runs.values():
        names += [k for k, v in run["metrics"].items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in names]
    if not names:
        return ""
    infos, first = metric_infos(), next(iter(runs.values()))["metrics"]
    rows = []
    for n in names:
        desc = getattr(infos.get(n), "description", "")
        cell = f'<span title="{escape(desc)}">{escape(metric_label(n, first))}</span>' if desc else escape(metric_label(n, first))
        rows.append([cell, escape(_direction(n, infos))] + [escape(fmt(r["metrics"].get(n))) for r in runs.values()])
    return "<h2>All metrics</h2>" + _table(["metric", "better"] + [escape(n) for n in runs], rows, labels=2)


def notes_section(results: Mapping[str, Any]) -> str:
    """The evaluation notes of every run, deduplicated."""
    notes = {f"{name}: {n}" for name, run in results["runs"].items() for n in run["metrics"].get("notes") or []}
    if not notes:
        return ""
    return "<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in sorted(notes)) + "</ul>"


def render_html(results: Mapping[str, Any], title: str = "obliviate report") -> str:
    """The whole report as one self-contained HTML page."""
    meta = f"{len(results['runs'])} run(s): " + ", ".join(results["runs"])
    if isinstance(results.get("seconds"), (int, float)):
        meta += f" · {results['seconds']:.0f} s in all"
    body = "".join(section(results) for section in (headline_section, plots_section, geometry_section,
                                                     analysis_section, samples_section, all_metrics_section,
                                                     notes_section))
    return page(title, body, meta)


def write_html(path: str | Path, results: Mapping[str, Any], title: str = "obliviate report") -> None:
    """Write the HTML report of a demo or evaluation run."""
    Path(path).write_text(render_html(results, title=title), encoding="utf-8")
