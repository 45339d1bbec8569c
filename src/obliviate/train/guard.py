"""Divergence checks: a run whose loss, gradients or weights stop being finite (or explode) stops with a
DivergenceError before the optimizer steps on them and before a checkpoint of them is written.

The rules, per optimizer step (every value is global: averaged over micro-batches and ranks, so every rank
raises at the same step and none waits forever in an all-reduce):
- every loss term and the total must be finite. A non-finite micro-batch makes the step's mean non-finite,
  so one host sync per step checks all micro-batches;
- a term that was >= 0 at the run's first step is bounded below (NLL, KL, NPO, SimNPO, DPO, ME, UNDIAL,
  RMU's MSE): it has exploded when |value| > EXPLODE · max(|first value|, 1). Terms that start negative
  (GA, WGA, SatImp: a −NLL that falls without bound while forgetting works, −35 in the demo) are only
  checked for finiteness;
- the gradient norm (before clipping; measured even when clipping is off) must be finite, else the step
  is refused: the optimizer never sees a non-finite gradient;
- after the step, the global norm of the trained weights must be finite and at most GROWTH times its value
  before the step (AdamW moves each weight by about lr per step, so lr=1e6 multiplies a 0.02-sized weight
  by ~10^7 in one step, while a healthy step changes the norm by percents).
After the run, a forget loss that barely moved (`stalled`: its last quarter of steps within 1% of its first) is a
note, not an error: the run may have left the model as it was.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from obliviate.errors import DivergenceError

EXPLODE = 1e4
GROWTH = 1e3
NOT_TERMS = {"step", "lr", "grad_norm", "step_seconds"}


def weight_norm(params: list[Tensor]) -> float:
    """Global L2 norm of the trained weights (one host sync)."""
    from torch.nn.utils import get_total_norm

    with torch.no_grad():
        return float(get_total_norm([p.detach() for p in params]))


@dataclass
class DivergenceGuard:
    """Checks each step's logs and the weights after it; `first` holds the first step's terms (the baseline)."""

    lr: float
    max_grad_norm: float | None
    checkpoint: str = ""  # "the checkpoint in DIR holds step N", when one exists
    first: dict[str, float] = field(default_factory=dict)
    norm: float | None = None

    def start(self, history: list[dict[str, float]], params: list[Tensor]) -> None:
        """Take the baseline from a resumed history (if any) and measure the starting weights."""
        if history:
            self.first = {k: v for k, v in history[0].items() if k not in NOT_TERMS}
        self.norm = weight_norm(params)

    def check_step(self, step: int, entry: dict[str, float]) -> None:
        """Raise before the optimizer step when a loss term or the gradient norm is bad."""
        terms = {k: v for k, v in entry.items() if k not in NOT_TERMS}
        if not self.first:
            self.first = dict(terms)
        for name in sorted(terms, key=lambda k: k == "loss"):  # name a part before the total
            value = terms[name]
            if not math.isfinite(value):
                self._fail(step, f"the {name} loss is {value}")
            base = self.first.get(name)
            if base is not None and base >= 0 and abs(value) > EXPLODE * max(abs(base), 1.0):
                self._fail(step, f"the {name} loss exploded to {value:.4g} (first step: {base:.4g}; "
                                 f"the limit is {EXPLODE:g} x max(|first|, 1))")
        grad_norm = entry.get("grad_norm")
        if grad_norm is not None and not math.isfinite(grad_norm):
            self._fail(step, f"the gradient norm is {grad_norm} (the optimizer step was not taken)")

    def check_weights(self, step: int, params: list[Tensor]) -> None:
        """Raise when the weights after the step are non-finite or grew more than GROWTH x in one step."""
        norm = weight_norm(params)
        if not math.isfinite(norm):
            self._fail(step, f"the weights are non-finite after the optimizer step (norm {norm})")
        if self.norm is not None and self.norm > 0 and norm > GROWTH * self.norm:
            self._fail(step, f"the weights' norm grew from {self.norm:.4g} to {norm:.4g} in one optimizer step "
                             f"(more than {GROWTH:g}x)")
        self.norm = norm

    def _fail(self, step: int, what: str) -> None:
        clip = ("enable gradient clipping (train.max_grad_norm=1.0)" if self.max_grad_norm is None
                else f"clip harder (train.max_grad_norm={self.max_grad_norm:g} now)")
        kept = f"; {self.checkpoint}" if self.checkpoint else ""
        raise DivergenceError(f"training diverged at optimizer step {step}: {what}. The model was not saved{kept}. "
                              f"Lower train.lr (now {self.lr:g}) or {clip}")


STALL = 0.01  # a forget term whose last-quarter mean is within 1% of its first-quarter mean barely moved
STALL_MIN_STEPS = 8


def quarter_means(history: list[dict[str, float]], term: str = "forget") -> tuple[float, float] | None:
    """(mean of `term` over the first quarter of steps, over the last quarter); None for runs shorter than
    STALL_MIN_STEPS steps or without the term."""
    values = [e[term] for e in history if isinstance(e.get(term), (int, float)) and math.isfinite(e[term])]
    if len(values) < STALL_MIN_STEPS:
        return None
    q = len(values) // 4
    return sum(values[:q]) / q, sum(values[-q:]) / q


def loss_change(history: list[dict[str, float]], term: str = "forget") -> float | None:
    """|last − first| / |first| over `quarter_means` (None when there are none): how far a run moved its loss."""
    means = quarter_means(history, term)
    return None if means is None else abs(means[1] - means[0]) / max(abs(means[0]), 1e-12)


def stalled(history: list[dict[str, float]], lr: float, term: str = "forget") -> str | None:
    """A note when `term` barely moved over the run: `loss_change` below STALL (None otherwise). Such a run may have
    left the model as it was: RMU at its recipe's rate on the TOFU-20 SmolLM2 target moves its loss 201.3 -> 200.3
    in 15 steps, and its trials forget nothing."""
    change, means = loss_change(history, term), quarter_means(history, term)
    if change is None or means is None or change >= STALL:
        return None
    return (f"the {term} loss barely moved over the run ({means[0]:.4g} over its first quarter of steps, {means[1]:.4g} "
            f"over its last, {change:.2%}): the model may be left almost as it was; a larger train.lr (now {lr:g}) or "
            "more steps moves it further")


def describe_checkpoint(directory: Any, step: int) -> str:
    """The clause naming the last good checkpoint, for DivergenceError messages."""
    return f"the checkpoint in {directory} still holds step {step}, the last good one" if step else ""
