"""Retain terms (docs/METHODS.md §4; the ASU recipes: §1.3): keep the model useful on the retain batch.

Token-level terms take `reduction` ("token" pools the batch's answer tokens, "example" averages per
example then over examples; obliviate.modeling.logprobs.answer_mean); the default of each is what
the reference code does. `ap` is sequence-level and has none.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from obliviate.modeling.logprobs import TokenStats, hidden_at, hidden_mean, masked_token_kl, token_mse
from obliviate.objectives.base import retain_term


@retain_term("nll")
def nll(policy: TokenStats, *, reduction: str = "token") -> Tensor:
    """GD retain term: NLL_θ on retain answers; [B, T-1] token log-probs -> scalar.

    "token" (default) is −Σ log p / N over the batch's answer tokens, Hugging Face's `outputs.loss`
    that GradDiff uses in the reference code.
    """
    return -policy.mean(policy.token_logp, reduction)


@retain_term("kl", needs=("reference",), loop_params={"positions": "answer"}, frozen_use="kl",
             choices={"positions": ("answer", "batch", "max_length")}, last_position=True)
def kl(policy: TokenStats, reference: TokenStats, *, reduction: str = "token") -> Tensor:
    """KL(p_θ0 ‖ p_θ) on the counted positions of the retain batch; [B, T-1, V] -> scalar.

    "token" (default) pools them. positions (a loop parameter): "answer" (default, the ASU paper's term) counts
    answer tokens only; "batch" every logit of the padded batch, prompt, padding and each row's last position
    included, as open-unlearning's kl_div(batchmean) over the flattened [B·T, V] logits; "max_length" the same
    with every row padded to data.max_length: the ASU authors' TOFU term as released (Right-to-be-forgotten
    trainer/losses.py, the second `kl_loss`, which shadows the first: unshifted, batchmean over rows padded to 500).
    """
    return masked_token_kl(reference, policy, reduction)


@retain_term("ap", needs=("refusal",))
def ap(policy: TokenStats, refusal: TokenStats, *, beta: float = 0.1) -> Tensor:
    """Answer preservation (Yuan et al. 2024, "A Closer Look"): keep preferring the true answer to a refusal.

    −(1/β)·mean log σ(β·(logp_θ(y|x) − logp_θ(y_idk|x))) on retain questions; `policy` on
    (question, answer), `refusal` on (question, refusal), summed answer log-probs [B] -> scalar.
    Hand check: at equal log-probs (1/β)·ln 2 (6.9315 at β 0.1); with β = 1 and a margin of
    ln 3 for the true answer, −ln(3/4) ≈ 0.2877.
    """
    if policy.mask.shape[0] != refusal.mask.shape[0]:
        raise ValueError(f"retain and refusal batches hold different numbers of examples: "
                         f"{policy.mask.shape[0]} vs {refusal.mask.shape[0]}")
    return -(1.0 / beta) * F.logsigmoid(beta * (policy.logp - refusal.logp)).mean()


@retain_term("hidden_mse", needs=("hidden", "reference"))
def hidden_mse(policy: TokenStats, reference: TokenStats, *, layer: int = 7, reduction: str = "example") -> Tensor:
    """RMU retain term (Li et al. 2024): MSE(h_layer(retain), h_layer^ref(retain)) on label tokens -> scalar.

    Decoder layer `layer`'s output [B, T, H] of student and frozen θ0 (forward hooks); reduced like
    `rmu` ("example": open-unlearning's EMBED_DIFF; "token": WMDP's mse_loss without padding).
    """
    return hidden_mean(policy, token_mse(hidden_at(policy, layer), hidden_at(reference, layer).detach()), reduction)
