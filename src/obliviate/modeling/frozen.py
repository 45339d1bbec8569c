"""The frozen copy of θ0 that serves as reference model and (with smoothed attention) ASU teacher."""
from __future__ import annotations

import copy
from typing import Any, Mapping

import torch

from obliviate.modeling.logprobs import TokenStats, forward_stats
from obliviate.modeling.smoothing import remove_smoothing, smooth_attention


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy in eval mode with every parameter frozen."""
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


class FrozenModels:
    """One frozen copy of θ0 giving reference stats, and teacher stats with attention temperature.

    Sharing one copy for both roles keeps memory at one extra model (smoothing is toggled).
    """

    def __init__(self, model: torch.nn.Module, teacher: Mapping[str, Any] | None) -> None:
        self.model = frozen_copy(model)
        self.teacher = dict(teacher) if teacher is not None else None

    @torch.no_grad()
    def reference_stats(self, batch: Mapping[str, Any], hidden: bool = False) -> TokenStats:
        """TokenStats of θ0 (unsmoothed) on `batch` (with hidden states when asked)."""
        return forward_stats(self.model, batch, hidden=hidden)

    @torch.no_grad()
    def teacher_stats(self, batch: Mapping[str, Any]) -> TokenStats:
        """TokenStats of θ0 with temperature tau on the chosen layers (ASU forget-teacher)."""
        if self.teacher is None:
            raise RuntimeError("no teacher configured")
        smooth_attention(self.model, self.teacher["tau"], self.teacher.get("layers"))
        try:
            return forward_stats(self.model, batch)
        finally:
            remove_smoothing(self.model)
