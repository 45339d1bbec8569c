"""Fixtures shared by the evaluation tests."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import pytest
import torch


class ConstantLM(torch.nn.Module):
    """Predicts token `token` at every position (logits 10 there, 0 elsewhere), whatever the context:
    log p(token) = 10 - log Z and log p(other) = -log Z, log Z = log(e^10 + V - 1)."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.vocab, self.token = vocab, token
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # so model_device finds a device

    def forward(self, input_ids, attention_mask=None, **_):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., self.token] = 10.0
        return SimpleNamespace(logits=logits)


@pytest.fixture()
def constant_lm() -> Callable[[int, int], ConstantLM]:
    """ConstantLM(vocab, token): a context-free model whose token log-probs are known by hand."""
    return ConstantLM
