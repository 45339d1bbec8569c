"""Forget objectives (METHODS.md §1, §3): pure functions of TokenStats returning a loss to minimise."""
from __future__ import annotations

from torch import Tensor

from obliviate.modeling.logprobs import TokenStats, masked_token_kl
from obliviate.objectives.base import forget_objective


@forget_objective("asu", needs=("teacher",), teacher_params={"tau": 2.0, "layers": None})
def asu(policy: TokenStats, teacher: TokenStats) -> Tensor:
    """ASU forget loss (arXiv 2603.01285, §1): mean_x (1/|y|) Σ_t KL(p_θτ ‖ p_θ); stats [B, T-1, V] -> scalar.

    The teacher is θ0 with attention temperature tau on `layers` (None = all). Hand check: one
    answer token, teacher (0.5, 0.5), student (0.25, 0.75): KL = 0.5·ln2 + 0.5·ln(2/3) ≈ 0.1438.
    """
    return masked_token_kl(teacher, policy).mean()


@forget_objective("ga")
def ga(policy: TokenStats) -> Tensor:
    """Gradient ascent: −NLL_θ on forget answers (mean over tokens, then examples); [B] -> scalar."""
    return -policy.nll.mean()
