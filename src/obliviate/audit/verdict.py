"""The verdict: per attack, the share of forgotten knowledge that came back, and its tables (terminal, Markdown, HTML).

share = (K_attacked - K_ref0) / (K_original - K_ref0)
  K_original  the original (pre-unlearning) model's K on the same rows, direct prompt, no attack   -> 100%
  K_ref0      the retain (never-trained) model under the SAME attack when one is given, else the
              unlearned model without attack (MIA without a retain model: AUC 0.5, chance)         -> 0%
The raw share is kept (it can be < 0 or > 1); tables show it clipped to [0%, 100%] with a '*'. When
K_original <= K_ref0 the share is undefined (n/a): the original knew nothing the reference does not.
Its interval (`share_interval`): a percentile bootstrap over the forget rows, the three per-row K drawn on the same
rows (paired), through eval/intervals.bootstrap; one audited model, so rows are all it resamples.
No torch here.
"""
from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from html import escape
from typing import Any, Mapping, Sequence

from obliviate.report.page import page

EPS = 1e-9


def recovered_share(k_attacked: float | None, k_original: float | None, k_ref0: float | None) -> float | None:
    """(K_attacked - K_ref0) / (K_original - K_ref0); None when a value is missing or K_original <= K_ref0
    (the original knew no more than the reference: there is nothing forgotten to recover)."""
    if k_attacked is None or k_original is None or k_ref0 is None or k_original - k_ref0 < EPS:
        return None
    return (k_attacked - k_ref0) / (k_original - k_ref0)


def share_interval(attacked: Any, original: Any, ref0: Any, *, level: float = 0.95, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float] | None:
    """The recovered share's `level` percentile-bootstrap interval over rows, from per-row K [N] of the attacked
    model, the original and the 0% reference on the same N rows (drawn together); rows where any K is undefined (NaN)
    are left out, and so are draws where the share is undefined. None with fewer than 2 such rows or when the share
    of all of them is undefined."""
    import numpy as np

    from obliviate.eval.intervals import bootstrap

    a, o, r = (np.asarray(x, dtype=np.float64) for x in (attacked, original, ref0))
    if not a.shape == o.shape == r.shape:
        raise ValueError(f"share_interval: per-row K of {a.shape}, {o.shape} and {r.shape} rows; they must be the "
                         "same rows")
    keep = np.isfinite(a) & np.isfinite(o) & np.isfinite(r)
    if keep.sum() < 2:
        return None

    def score(m: Mapping[str, Any]) -> float:
        share = recovered_share(m["attacked"], m["original"], m["ref0"])
        return float("nan") if share is None else share

    iv = bootstrap(score, [({}, {"attacked": a[keep], "original": o[keep], "ref0": r[keep]})], level=level,
                   draws=draws, seed=seed)
    return None if iv.estimate != iv.estimate else (iv.low, iv.high)


def share_text(share: float | None) -> str:
    """A share for display: a whole percent clipped to [0, 100], '*' when clipped, 'n/a' when undefined."""
    if share is None:
        return "n/a"
    clipped = min(1.0, max(0.0, share))
    return f"{100 * clipped:.0f}%" + ("*" if clipped != share else "")


def share_with_interval(share: float | None, interval: Sequence[float] | None) -> str:
    """share_text, then its interval's ends clipped the same way when there is one: '62% [40%, 81%]'."""
    if share is None or not interval:
        return share_text(share)
    low, high = (share_text(e).rstrip("*") for e in interval)
    return f"{share_text(share)} [{low}, {high}]"


def num(x: float | None) -> str:
    """A K value for display."""
    return "n/a" if x is None else f"{x:.3f}"


@dataclass
class AttackRow:
    """One attack variant: K of the unlearned model without and with the attack, the two references and the share."""

    attack: str
    variant: str
    metric: str
    n: int
    k_unlearned: float | None
    k_attacked: float | None
    k_original: float | None
    k_ref0: float | None
    ref0: str
    k_ref0_plain: float | None = None
    headline: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    interval: tuple[float, float] | None = None  # the share's 95% interval over rows (share_interval)

    @property
    def share(self) -> float | None:
        return recovered_share(self.k_attacked, self.k_original, self.k_ref0)

    @property
    def share_without_attack(self) -> float | None:
        """The unlearned model's own share before the attack (0% reference without attack: k_ref0_plain)."""
        return recovered_share(self.k_unlearned, self.k_original, self.k_ref0_plain)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"share": self.share, "share_without_attack": self.share_without_attack}


def mark_headlines(rows: Sequence[AttackRow], controls: Sequence[str] = ("retain-only control",)) -> dict[str, Any]:
    """Per attack, flag the variant with the largest share (controls excluded) as its headline; -> verdict dict."""
    verdict: dict[str, Any] = {}
    for attack in dict.fromkeys(r.attack for r in rows):
        cands = [r for r in rows if r.attack == attack and r.variant not in controls]
        scored = [r for r in cands if r.share is not None]
        best = max(scored, key=lambda r: r.share) if scored else (cands[0] if cands else None)  # type: ignore[arg-type]
        if best is None:
            continue
        best.headline = True
        verdict[attack] = {"variant": best.variant, "metric": best.metric, "share": best.share,
                           "interval": best.interval and list(best.interval), "k_attacked": best.k_attacked,
                           "k_original": best.k_original, "k_ref0": best.k_ref0}
    return verdict


HEAD = ("attack", "variant", "K", "n", "unlearned", "attacked", "original (100%)", "ref 0%", "before attack",
        "recovered [95% over rows]")


def _cells(r: AttackRow) -> list[str]:
    return [r.attack + (" ◆" if r.headline else ""), r.variant, r.metric, str(r.n), num(r.k_unlearned),
            num(r.k_attacked), num(r.k_original), num(r.k_ref0), share_text(r.share_without_attack),
            share_with_interval(r.share, r.interval)]


def console_verdict(rows: Sequence[AttackRow], ref0: str) -> str:
    """The verdict as a rich table rendered to text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="obliviate audit: how much forgotten knowledge each attack brings back "
                        "(0% = robust, 100% = back to the original)")
    for i, h in enumerate(HEAD):
        table.add_column(h, justify="left" if i < 3 else "right")
    for r in rows:
        table.add_row(*_cells(r))
    buf = io.StringIO()
    Console(file=buf, width=170, force_terminal=False, color_system=None).print(table)
    return buf.getvalue().rstrip() + f"\n◆ = the attack's headline (its strongest variant); 0% reference: {ref0}; " \
                                     "* = clipped to [0%, 100%] (raw value in audit.json)"


def markdown_verdict(rows: Sequence[AttackRow]) -> str:
    """The verdict as a Markdown table."""
    lines = ["| " + " | ".join(HEAD) + " |", "|---" * len(HEAD) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def html_verdict(rows: Sequence[AttackRow]) -> str:
    """The verdict as an HTML table (escaped cells)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" if i < 3 else f'<td class="num">{escape(c)}</td>'
                                    for i, c in enumerate(_cells(r))) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


EXPLAIN = (
    "K is the knowledge score on forget rows: {metric}. Each row compares the unlearned model under the attack "
    "with the original model (100%, direct question, no attack) and the 0% reference ({ref0}); recovered = "
    "(K_attacked - K_ref0) / (K_original - K_ref0), with its 95% percentile-bootstrap interval over the rows (the "
    "three K drawn on the same rows; none for mia, an AUC); 'before attack' is the same share of the unlearned model "
    "without attack (its 0% reference: the retain model without attack). relearn: fine-tuned on a share of the "
    "forget rows, measured on the others (control: as many steps on retain rows). quantize: Linear weights "
    "quantised and dequantised in each format named in the variant (rtn_int8 / rtn_int4: obliviate's round-to-"
    "nearest grids; nf4 / fp4: bitsandbytes 4-bit, absmax blocks of 64; gguf_q8_0 / gguf_q4_0: llama.cpp GGUF, "
    "blocks of 32). paraphrase: indirect prompts. mia: membership-inference AUC, forget vs holdout "
    "(K = AUC; 1 = members exposed; 'either direction' = max(AUC, 1 - AUC) of the strongest attack).")


def write_reports(out_dir: Any, result: Mapping[str, Any], rows: Sequence[AttackRow]) -> None:
    """report.md and report.html of an audit into `out_dir`."""
    from pathlib import Path

    out = Path(out_dir)
    text = EXPLAIN.format(metric=result["k_metric"], ref0=result["ref0"])
    notes = result.get("notes") or []
    base = result.get("baseline") or {}
    base_md = ["| model | K (direct) | answer prob |", "|---|---|---|"] + [
        f"| {m} | {num(v.get('k'))} | {num(v.get('prob'))} |" for m, v in base.items()]
    md = ["# obliviate audit", "", f"unlearned model: `{result.get('model')}`; original: `{result.get('original')}`; "
          f"retain model: `{result.get('retain_model')}`; {result.get('n_forget')} forget rows; "
          f"{result.get('seconds', 0):.1f} s", "", "## Verdict", "", markdown_verdict(rows), "", text, "",
          "## Without attack (all forget rows)", "", *base_md, ""]
    samples = (result.get("settings") or {}).get("samples") or {}
    if samples:
        md += ["## The first forget row, answered (model / probe)", ""]
        md += [f"- **{k}**: {v.get('answer')!r}" for k, v in samples.items()] + [""]
    if notes:
        md += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    base_html = "".join(f"<tr><td>{escape(m)}</td><td class='num'>{num(v.get('k'))}</td>"
                        f"<td class='num'>{num(v.get('prob'))}</td></tr>" for m, v in base.items())
    meta = (f"unlearned: {result.get('model')}; original: {result.get('original')}; "
            f"retain model: {result.get('retain_model')}")
    body = (f"<h2>Verdict</h2>{html_verdict(rows)}"
            f"<p class='note'>{escape(text)}</p><h2>Without attack (all forget rows)</h2><table><thead><tr>"
            f"<th>model</th><th>K (direct)</th><th>answer prob</th></tr></thead><tbody>{base_html}</tbody></table>"
            + (f"<h2>Notes</h2><ul>{''.join(f'<li>{escape(n)}</li>' for n in notes)}</ul>" if notes else ""))
    html = page("obliviate audit", body, meta)
    (out / "report.html").write_text(html, encoding="utf-8")
