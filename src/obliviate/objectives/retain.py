"""Retain terms (METHODS.md §1, §3): keep the model useful on the retain batch."""
from __future__ import annotations

from torch import Tensor

from obliviate.modeling.logprobs import TokenStats, masked_token_kl
from obliviate.objectives.base import retain_term


@retain_term("nll")
def nll(policy: TokenStats) -> Tensor:
    """GD retain term: NLL_θ on retain answers (mean over answer tokens, then examples) -> scalar."""
    return policy.nll.mean()


@retain_term("kl", needs=("reference",))
def kl(policy: TokenStats, reference: TokenStats) -> Tensor:
    """KL(p_θ0 ‖ p_θ) on retain answer tokens only (never padding/prompt), per-example mean -> scalar."""
    return masked_token_kl(reference, policy).mean()
