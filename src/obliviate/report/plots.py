"""Results -> matplotlib Figures (training curves, headline bars, token shifts, attention entropy, the teacher map).

Every plot function is pure: it reads the results mapping (see `report.markdown`) and returns a
Figure, or None when the results hold none of its data. Figures are built with `Figure()` on an Agg
canvas, never through pyplot, so nothing is registered globally, no display is needed and a figure
is freed as soon as it is dropped (the pattern matplotlib recommends for web servers).
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any, Callable, Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from obliviate.report.markdown import columns

# (history key, panel title); a panel is drawn when at least one run logged its key
CURVES: tuple[tuple[str, str], ...] = (
    ("forget", "forget loss"),
    ("retain", "retain loss"),
    ("nll", "NLL (fine-tuning)"),
    ("grad_norm", "grad norm (before clipping)"),
    ("cos_f_r", "cos(g_f, g_r)"),
    ("cos_g_f", "cos(g, g_f)"),
    ("cos_g_r", "cos(g, g_r)"),
    ("conflict_share", "conflicting coordinates"),
)


def new_figure(width: float, height: float) -> Figure:
    """A new Figure on an Agg canvas with a constrained layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _number(value: Any) -> float | None:
    """A finite float, or None for missing, boolean, non-numeric or non-finite values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _colors(results: Mapping[str, Any]) -> dict[str, str]:
    """One colour per run, by its position in results["runs"], so a run looks the same in every plot."""
    return {name: f"C{i % 10}" for i, name in enumerate(results["runs"])}


def _series(history: list[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one logged quantity; x falls back to the 1-based position without `step`."""
    xs, ys = [], []
    for i, entry in enumerate(history):
        y = _number(entry.get(key))
        if y is not None:
            xs.append(float(entry.get("step", i + 1)))
            ys.append(y)
    return xs, ys


def training_curves(results: Mapping[str, Any]) -> Figure | None:
    """One panel per logged quantity (losses, grad norm, gradient geometry), one line per run, x = step."""
    runs = {n: r["history"] for n, r in results["runs"].items() if r.get("history")}
    panels = [(k, t) for k, t in CURVES if any(_series(h, k)[1] for h in runs.values())]
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = new_figure(4.2 * cols, 3.0 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    colors = _colors(results)
    for ax, (key, title) in zip(axes, panels):
        for name, history in runs.items():
            xs, ys = _series(history, key)
            if ys:
                ax.plot(xs, ys, label=name, color=colors[name], linewidth=1.4, marker="." if len(ys) < 20 else None)
        if key.startswith("cos"):
            ax.axhline(0.0, color="0.6", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8)
    fig.suptitle("training curves")
    return fig


def headline_bars(results: Mapping[str, Any]) -> Figure | None:
    """Grouped bars of the headline metrics (markdown.columns, arrow = better) across runs; n/a shown."""
    runs = results["runs"]
    cols = [(k, t) for k, t in columns(results) if any(_number(r["metrics"].get(k)) is not None for r in runs.values())]
    if not cols:
        return None
    fig = new_figure(max(6.0, 1.3 * len(cols) + 2.0), 4.2)
    ax = fig.subplots()
    width = 0.8 / len(runs)
    for i, (name, run) in enumerate(runs.items()):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(cols))]
        vals = [_number(run["metrics"].get(k)) for k, _ in cols]
        ax.bar(xs, [0.0 if v is None else v for v in vals], width, label=name, color=f"C{i % 10}")
        for x, v in zip(xs, vals):
            if v is None:
                ax.text(x, 0.01, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color="0.4")
    ax.set_xticks(range(len(cols)), [t for _, t in cols], rotation=25, ha="right", fontsize=9)
    ax.axhline(0.0, color="0.3", linewidth=0.8)
    ax.set_ylabel("value")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("headline metrics (↑ / ↓ = which direction is better)")
    return fig


def _shift_rows(results: Mapping[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(label, factual, functional) Δlogp of every run, and of its teacher when one was analysed."""
    rows = []
    for name, run in results["runs"].items():
        a = run.get("analysis") or {}
        for label, key in ((name, "token_shift"), (f"{name} teacher", "teacher_token_shift")):
            s = a.get(key)
            if s:
                rows.append((label, _number(s.get("factual")), _number(s.get("functional"))))
    return rows


def token_shift_plot(results: Mapping[str, Any]) -> Figure | None:
    """Factual vs functional mean per-token Δlogp on the forget answers, per run (symlog when wide)."""
    rows = [r for r in _shift_rows(results) if r[1] is not None or r[2] is not None]
    if not rows:
        return None
    fig = new_figure(max(6.0, 1.1 * len(rows) + 2.5), 3.8)
    ax = fig.subplots()
    for off, idx, label in ((-0.2, 1, "factual tokens"), (0.2, 2, "functional tokens")):
        vals = [r[idx] for r in rows]
        ax.bar([i + off for i in range(len(rows))], [0.0 if v is None else v for v in vals], 0.4, label=label)
    spread = max(abs(v) for r in rows for v in r[1:] if v is not None)
    if spread > 10:  # a collapsed model (tens of nats) would flatten the selective ones to nothing
        ax.set_yscale("symlog", linthresh=1.0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=20, ha="right", fontsize=9)
    ax.axhline(0.0, color="0.3", linewidth=0.8)
    ax.set_ylabel("mean Δlogp per token (nats)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("factual vs functional tokens (0 = as the target)", fontsize=10)
    return fig


def attention_entropy_plot(results: Mapping[str, Any]) -> Figure | None:
    """Mean attention entropy per layer, one line per run (dashed: the run's teacher)."""
    lines = []
    for i, (name, run) in enumerate(results["runs"].items()):
        a = run.get("analysis") or {}
        for label, key, style in ((name, "attention_entropy", "-"), (f"{name} teacher", "teacher_attention_entropy", "--")):
            vals = [_number(v) for v in a.get(key) or []]
            if any(v is not None for v in vals):
                lines.append((label, vals, style, f"C{i % 10}"))
    if not lines:
        return None
    fig = new_figure(6.0, 3.8)
    ax = fig.subplots()
    for label, vals, style, color in lines:
        ax.plot(range(len(vals)), [math.nan if v is None else v for v in vals], style, color=color, marker="o", label=label)
    ax.set_xticks(range(max(len(line[1]) for line in lines)))
    ax.set_xlabel("layer")
    ax.set_ylabel("entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("attention entropy per layer")
    return fig


# (key, caption, builder) in page order
PLOTS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], Figure | None]], ...] = (
    ("headline", "Headline metrics per run; the arrow in each label says which direction is better.", headline_bars),
    ("training", "Per-step training logs of each unlearning run.", training_curves),
    ("token_shift", "Mean per-token log-prob change on the forget answers against the target model.", token_shift_plot),
    ("attention", "Mean attention entropy per layer.", attention_entropy_plot),
)


def teacher_map_plot(res: Mapping[str, Any]) -> Figure | None:
    """The teacher map as two heat-maps over (layers, τ): the teacher's forget recall and the degenerate share of its
    forget replies; points where facts drop while the replies stay fluent are ringed (None without replies)."""
    grid = [g for g in res.get("grid", []) if g.get("forget")]
    if not grid:
        return None
    taus = sorted({g["tau"] for g in grid})
    windows = list(dict.fromkeys("all" if g["layers"] is None else _span(g["layers"]) for g in grid))
    fig = new_figure(2.2 + 0.55 * len(taus) * 2, 1.2 + 0.32 * len(windows))
    for k, (key, title) in enumerate((("recall", "forget recall (θ0 {:.2f})"), ("degenerate", "degenerate share"))):
        ax = fig.add_subplot(1, 2, k + 1)
        cells = [[math.nan] * len(taus) for _ in windows]
        for g in grid:
            w = windows.index("all" if g["layers"] is None else _span(g["layers"]))
            cells[w][taus.index(g["tau"])] = g["forget"][key]
        im = ax.imshow(cells, vmin=0, vmax=1, cmap="viridis" if key == "recall" else "magma_r", aspect="auto")
        for g in grid:
            if g.get("fluent_forgetting"):
                ax.scatter([taus.index(g["tau"])], [windows.index("all" if g["layers"] is None else _span(g["layers"]))],
                           s=160, facecolors="none", edgecolors="white" if key == "recall" else "black", linewidths=2)
        ax.set_xticks(range(len(taus)), [f"{t:g}" for t in taus])
        ax.set_yticks(range(len(windows)), windows if k == 0 else [""] * len(windows))
        ax.set_xlabel("τ")
        ax.set_title(title.format(res.get("base", {}).get("forget", {}).get("recall", math.nan)), fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.axes[0].set_ylabel("smoothed layers")
    return fig


def _span(layers: Any) -> str:
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


def figures(results: Mapping[str, Any]) -> list[tuple[str, str, Figure]]:
    """(key, caption, Figure) for every plot whose data the results hold, in page order."""
    out = []
    for key, caption, build in PLOTS:
        fig = build(results)
        if fig is not None:
            out.append((key, caption, fig))
    return out


def png_bytes(fig: Figure, dpi: int = 100, close: bool = True) -> bytes:
    """The Figure as PNG bytes; `close` clears it afterwards so its artists are freed at once."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    if close:
        fig.clear()
    return buf.getvalue()


def png_base64(fig: Figure, dpi: int = 100, close: bool = True) -> str:
    """The Figure as a base64 PNG string (for a data: URI)."""
    return base64.b64encode(png_bytes(fig, dpi=dpi, close=close)).decode("ascii")
