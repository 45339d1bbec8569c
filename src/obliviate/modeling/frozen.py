"""θ0 as reference model and (with smoothed attention) ASU teacher: a frozen copy, or, for a LoRA
student, the student itself with its adapters disabled (no second copy of the weights)."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch

from obliviate.modeling.logprobs import TokenStats, forward_stats, output_head
from obliviate.modeling.smoothing import remove_smoothing, smooth_attention
from obliviate.modeling.teacher import Teacher


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy in eval mode with every parameter frozen."""
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


def has_adapters(model: torch.nn.Module) -> bool:
    """A PEFT model whose adapters can be switched off (then it computes its base model)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class FrozenModels:
    """θ0 giving reference stats, and teacher stats with attention temperature (docs/METHODS.md §1.1, §7).

    Full fine-tuning: one frozen deep copy serves both roles (smoothing is toggled), so memory is
    one extra model. LoRA: the student with adapters disabled IS θ0 (adapters start at zero and
    the base weights are frozen), so no copy is made at all.
    """

    def __init__(self, model: torch.nn.Module, teacher: Teacher | None,
                 chunk: int | None = None, share_prefix: bool = True) -> None:
        if teacher is not None and not isinstance(teacher, Teacher):
            raise TypeError(f"teacher must be a modeling.teacher.Teacher or None, got {type(teacher).__name__}; "
                            "build it once with Teacher.from_args(forget_args)")
        self.shared = has_adapters(model)
        self.model = model if self.shared else frozen_copy(model)
        self.teacher = teacher
        self.chunk = chunk  # vocabulary-chunked stats (modeling/logprobs.py), None: unchunked
        self.share_prefix = share_prefix  # a batch's shared leading tokens run once (modeling/prefix.py)

    def _head(self) -> Any:
        """θ0's LM head for chunked stats, run after the forward: the copy's own head, or the LoRA student's with
        its adapters off when the head itself carries adapters (None: forward_stats takes the model's head)."""
        head = output_head(self.model)
        if not self.shared or head is None or not any("lora_" in n for n, _ in head.named_parameters()):
            return None

        def theta0_head(hidden: torch.Tensor) -> torch.Tensor:
            with self._theta0():
                return head(hidden)
        return theta0_head

    @contextmanager
    def _theta0(self) -> Iterator[torch.nn.Module]:
        """The θ0 network: the frozen copy, or the LoRA student with adapters off and in eval mode."""
        if not self.shared:
            yield self.model
            return
        training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                yield self.model
        finally:
            self.model.train(training)

    @torch.no_grad()
    def reference_stats(self, batch: Mapping[str, Any], hidden_layer: int | None = None) -> TokenStats:
        """TokenStats of θ0 (unsmoothed) on `batch` (with decoder layer `hidden_layer`'s output when asked)."""
        with self._theta0() as m:
            return forward_stats(m, batch, hidden_layer=hidden_layer, chunk=self.chunk, head=self._head(),
                                 share_prefix=self.share_prefix)

    @torch.no_grad()
    def teacher_stats(self, batch: Mapping[str, Any]) -> TokenStats:
        """TokenStats of θ0 with temperature tau on the chosen layers (ASU forget-teacher)."""
        if self.teacher is None:
            raise RuntimeError("no teacher configured")
        with self._theta0() as m:
            smooth_attention(m, self.teacher.tau, self.teacher.layers)
            try:
                return forward_stats(m, batch, chunk=self.chunk, head=self._head(), share_prefix=self.share_prefix)
            finally:
                remove_smoothing(m)
