"""The learning-rate schedule's length: optimizer steps from epochs or max_steps, and the warm-up's steps.

Torch-free, so `obliviate validate` checks a schedule before any weights or torch load (preflight.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from obliviate.config import TrainConfig
from obliviate.errors import ConfigError


def total_steps(n_examples: int, global_batch: int, cfg: TrainConfig) -> int:
    """Optimizer steps: max_steps, or ceil(epochs · n / global batch) where global batch counts accumulation."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    return max(1, math.ceil(cfg.epochs * n_examples / (global_batch * cfg.grad_accum)))


@dataclass(frozen=True)
class Schedule:
    """The learning-rate schedule's length: optimizer steps and the linear warm-up's steps among them."""

    steps: int
    warmup: int


def schedule(n_examples: int, global_batch: int, cfg: TrainConfig) -> Schedule:
    """total_steps and the warm-up: int(warmup_ratio · steps), or floor(warmup_epochs · n / global batch) with
    train.warmup_epochs (the ASU authors' forget.py: warmup_steps = one epoch's steps). A warm-up that does not
    end inside the run is a ConfigError."""
    steps = total_steps(n_examples, global_batch, cfg)
    if cfg.warmup_epochs is None:
        return Schedule(steps, int(cfg.warmup_ratio * steps))
    warmup = math.floor(cfg.warmup_epochs * n_examples / (global_batch * cfg.grad_accum))
    if warmup and warmup >= steps:
        raise ConfigError(f"train.warmup_epochs={cfg.warmup_epochs} gives {warmup} warm-up steps ({n_examples} rows, "
                          f"global batch {global_batch * cfg.grad_accum}), but the run has {steps} steps: lower "
                          "train.warmup_epochs or raise train.epochs / train.max_steps")
    return Schedule(steps, warmup)
