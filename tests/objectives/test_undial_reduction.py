"""UNDIAL's `reduction` (objectives/forget.py `undial`): "token" pools the answer tokens of the batch, "example"
averages each example's tokens first; two answers of different lengths tell the two apart by hand."""
from __future__ import annotations

import math

import pytest
import torch

from obliviate.modeling.logprobs import token_stats
from obliviate.objectives.forget import undial

IGNORE = -100


def _stats():
    """V = 3, gold token 0 everywhere, β = ln 2 over a uniform reference: target q = (0.2, 0.4, 0.4) at each token.

    Example 0: one answer token (label at position 2, predicted from logits[:, 1]) where the policy gives
    (½, ¼, ¼): CE = 0.2·ln 2 + 0.8·ln 4 = 1.8·ln 2. Example 1: two answer tokens (positions 1, 2) where the policy is
    uniform: CE = ln 3 each. Logits at masked positions are wild, so counting them would show.
    """
    wild = torch.tensor([9.0, -7.0, 3.0])
    policy = torch.stack([torch.stack([wild, torch.tensor([0.5, 0.25, 0.25]).log(), wild]),
                          torch.stack([torch.zeros(3), torch.zeros(3), wild])]).double()  # [B=2, T=3, V=3]
    reference = torch.zeros_like(policy)
    reference[0, 0] = reference[0, 2] = reference[1, 2] = wild
    labels = torch.tensor([[IGNORE, IGNORE, 0], [IGNORE, 0, 0]])
    return token_stats(policy, labels), token_stats(reference, labels)


def test_undial_token_and_example_reductions_by_hand():
    policy, reference = _stats()
    a, b = 1.8 * math.log(2), math.log(3)
    token = undial(policy, reference, beta=math.log(2), reduction="token")
    example = undial(policy, reference, beta=math.log(2), reduction="example")
    assert token.item() == pytest.approx((a + 2 * b) / 3, abs=1e-9)  # three answer tokens pooled: 1.14829
    assert example.item() == pytest.approx((a + b) / 2, abs=1e-9)  # per example, then over examples: 1.17316
    assert abs(token.item() - example.item()) > 0.02
    assert undial(policy, reference, beta=math.log(2)).item() == pytest.approx(token.item(), abs=1e-15)  # default
