"""Evaluation during training: every N optimizer steps a cheap evaluation, kept as a curve in the history,
an optional best checkpoint by a declared score, and rules that stop a run whose score has collapsed.

The training loop calls `Monitor.after_step(step, steps, model)` after each optimizer step; the monitor
decides whether this step is an evaluation step (every `every_steps` and the last one). `evaluate` is any
function of the model returning metric values (e.g. the knowledge track's accuracies on a row subset);
`score` maps those metrics to one number (higher is better after `maximize`). `stop` may raise `StopRun`
(a sweep's pruner does) to end the run early; the loop lets the exception through.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from obliviate.errors import ObliviateError


class StopRun(ObliviateError):
    """A run stopped by its monitor (e.g. a pruned sweep trial): `curve` holds the evaluations so far."""

    def __init__(self, message: str, curve: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.curve = curve


@dataclass
class Monitor:
    """Evaluate every `every_steps` steps (and at the last step); keep the best weights by `score` if asked."""

    every_steps: int
    evaluate: Callable[[torch.nn.Module], dict[str, Any]]
    score: Callable[[dict[str, Any]], float] | None = None
    maximize: bool = True
    keep_best: bool = False
    stop: Callable[[int, dict[str, Any], list[dict[str, Any]]], None] | None = None
    curve: list[dict[str, Any]] = field(default_factory=list)
    best_step: int | None = None
    best_score: float | None = None
    _best_state: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.every_steps, int) and self.every_steps >= 1):
            raise ObliviateError(f"eval every_steps must be an int >= 1, got {self.every_steps!r}")
        if self.keep_best and self.score is None:
            raise ObliviateError("keeping the best checkpoint needs a score to rank the evaluations by")

    def due(self, step: int, steps: int) -> bool:
        return step % self.every_steps == 0 or step == steps

    def after_step(self, step: int, steps: int, model: torch.nn.Module) -> dict[str, Any] | None:
        """Evaluate at a due step (model in eval mode, no gradients), record, keep the best; None otherwise."""
        if not self.due(step, steps):
            return None
        was_training = model.training
        model.eval()
        with torch.no_grad():
            metrics = self.evaluate(model)
        model.train(was_training)
        entry = {"step": step, **{k: v for k, v in metrics.items() if isinstance(v, (int, float)) or v is None}}
        if self.score is not None:
            entry["score"] = self.score(metrics)
            self._consider(step, entry["score"], model)
        self.curve.append(entry)
        if self.stop is not None:
            self.stop(step, entry, self.curve)
        return entry

    def _consider(self, step: int, value: float, model: torch.nn.Module) -> None:
        """Remember the weights of the best score so far (NaN never counts as best)."""
        if math.isnan(value):
            return
        signed = value if self.maximize else -value
        if self.best_score is not None and signed <= (self.best_score if self.maximize else -self.best_score):
            return
        self.best_step, self.best_score = step, value
        if self.keep_best:
            self._best_state = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
                                if p.requires_grad}

    def restore_best(self, model: torch.nn.Module) -> int | None:
        """Load the best evaluation's trainable weights back into `model`; the step restored, or None."""
        if not self.keep_best or self._best_state is None:
            return None
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self._best_state:
                    p.copy_(self._best_state[n].to(p.device))
        return self.best_step
