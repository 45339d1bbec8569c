"""Does a fine-tuned model know a split yet? The check `obliviate finetune` runs after every epoch (knows.split).

A target is only worth unlearning once it knows its forget set: TOFU-style studies ask for the forget split's
greedy-answer ROUGE-L recall (docs/METRICS.md §1.1) and, where rows annotate facts, its fact recall to reach a bar
(0.8) before anything is forgotten. The check answers the split's questions greedily at each due step; the values
join that step's history entry as `eval_rougeL_recall` / `eval_fact_recall` (train/monitor.py), so they survive a
resumed run, and `known_summary` reads the curve back from the history: the first epoch at which both reach the bar.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from obliviate.data.rows import QARow
from obliviate.eval.generate import generate_answers
from obliviate.eval.tofu import fact_recall, rouge_recall


def recall_check(model: Any, tokenizer: Any, rows: Sequence[QARow], *, max_new_tokens: int = 200,
                 batch_size: int = 32) -> dict[str, float | None]:
    """Greedy answers to `rows`' questions scored against their answers: {"rougeL_recall": mean over rows of
    TOFU's ROUGE-L recall, "fact_recall": mean share of asked facts found (None when no row annotates facts)}."""
    answers = generate_answers(model, tokenizer, [r.question for r in rows], max_new_tokens=max_new_tokens,
                               batch_size=batch_size, desc="checking what the model knows")
    return {"rougeL_recall": float(np.mean(rouge_recall(answers, [r.answer for r in rows]))),
            "fact_recall": fact_recall(answers, rows)}


def knows(values: dict[str, Any], bar: float) -> bool:
    """Known at one check: ROUGE-L recall >= bar and, where measured (not None), fact recall >= bar."""
    fact = values.get("fact_recall")
    return values["rougeL_recall"] >= bar and (fact is None or fact >= bar)


def steps_per_epoch(n_rows: int, global_batch: int, grad_accum: int = 1) -> int:
    """How often the check runs: the first whole step by which every row was seen once, ceil(n / (B · accum))."""
    return max(1, math.ceil(n_rows / (global_batch * grad_accum)))


def known_curve(history: Sequence[dict[str, Any]], epoch_steps: float) -> list[dict[str, Any]]:
    """The checks kept in a run's history: [{"step", "epoch", "rougeL_recall", "fact_recall"}] for every entry
    holding `eval_rougeL_recall`, in step order. epoch = step / epoch_steps, the passes over the data made by then
    (epoch_steps = n / (B · accum), fractional when the rows do not fill whole batches: the batch stream runs on
    across epochs, data/pairing.py)."""
    return [{"step": int(h["step"]), "epoch": round(h["step"] / epoch_steps, 4),
             "rougeL_recall": h["eval_rougeL_recall"], "fact_recall": h.get("eval_fact_recall")}
            for h in history if h.get("eval_rougeL_recall") is not None]


def known_summary(history: Sequence[dict[str, Any]], split: str, bar: float, epoch_steps: float) -> dict[str, Any]:
    """What metrics.json keeps: the split, the bar, the curve, and the first check that reached the bar
    ("first_step"/"first_epoch", None when none did), with the last check's values."""
    curve = known_curve(history, epoch_steps)
    first = next((c for c in curve if knows(c, bar)), None)
    last = curve[-1] if curve else {}
    return {"split": split, "bar": bar, "curve": curve,
            "first_step": first["step"] if first else None, "first_epoch": first["epoch"] if first else None,
            "last_rougeL_recall": last.get("rougeL_recall"), "last_fact_recall": last.get("fact_recall")}


def known_line(summary: dict[str, Any]) -> str:
    """One printed sentence: when the model first knew the split, or that it never did, with the last values."""
    last = f"ROUGE-L recall {summary['last_rougeL_recall']:.3f}" if summary["curve"] else "no check ran"
    if summary["curve"] and summary["last_fact_recall"] is not None:
        last += f", fact recall {summary['last_fact_recall']:.3f}"
    if summary["first_step"] is None:
        return f"{summary['split']}: recall never reached {summary['bar']:g} (last check: {last})"
    return (f"{summary['split']}: recall >= {summary['bar']:g} from epoch {summary['first_epoch']:g} "
            f"(step {summary['first_step']}); last check: {last}")
