"""Forget objectives (docs/METHODS.md §1, §3): pure functions of TokenStats returning a loss to minimise.

Shapes: every TokenStats is [B, T-1] (logits [B, T-1, V]); `.logp` [B] sums answer-token log-probs,
`.nll` [B] is their per-token mean. Token-level losses take `reduction`: "token" pools every answer
token of the batch (Σ/N, what the reference code does for GA, IDK, ME, WGA, SatImp, UNDIAL and the
default of each), "example" averages per example, then over examples (ASU's equation, RMU as
open-unlearning computes it). Prompt and padding never count. Sequence-level losses (npo, simnpo,
dpo, idk_dpo) have no token reduction.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from obliviate.modeling.logprobs import TokenStats, hidden_at, hidden_mean, map_rows, masked_token_kl, token_mse
from obliviate.modeling.teacher import Teacher
from obliviate.objectives.base import forget_objective

ME_EPS = 1e-12  # the closer-look code's log(p + 1e-12) inside KL(u ‖ p)


@forget_objective("asu", needs=("teacher",), loop_params=Teacher().as_args(), frozen_use="kl")
def asu(policy: TokenStats, teacher: TokenStats, *, reduction: str = "example") -> Tensor:
    """ASU forget loss (arXiv 2603.01285, §1): mean_x (1/|y|) Σ_t KL(p_θτ ‖ p_θ); stats [B, T-1, V] -> scalar.

    The teacher is θ0 with attention temperature tau on `layers` (None = all). "example" is the
    paper's equation and the authors' `asu_loss` (Salehzz/ASU-unlearning, Right-to-be-forgotten/trainer/
    losses.py; benchmarks/authors_oracle.py compares them). Hand check: one answer token, teacher
    (0.5, 0.5), student (0.25, 0.75): KL = 0.5·ln2 + 0.5·ln(2/3) ≈ 0.1438.
    """
    return masked_token_kl(teacher, policy, reduction)


@forget_objective("ga")
def ga(policy: TokenStats, *, reduction: str = "token") -> Tensor:
    """Gradient ascent: −NLL_θ on forget answers = mean answer-token log-prob; [B, T-1] -> scalar.

    "token" (default) is Σ log p / N over the batch's answer tokens, the reference's `-outputs.loss`.
    """
    return policy.mean(policy.token_logp, reduction)


def _check_same_shape(a: TokenStats, b: TokenStats, what: str) -> None:
    """Stats of two models on one batch must align token by token."""
    if a.mask.shape != b.mask.shape:
        raise ValueError(f"{what} differ in shape: {tuple(a.mask.shape)} vs {tuple(b.mask.shape)}")


def _check_same_batch(a: TokenStats, b: TokenStats, what: str) -> None:
    """Paired batches (answer vs refusal) must hold the same questions; lengths T may differ."""
    if a.mask.shape[0] != b.mask.shape[0]:
        raise ValueError(f"{what} hold different numbers of examples: {a.mask.shape[0]} vs {b.mask.shape[0]}")


@forget_objective("npo", needs=("reference",), frozen_use="scalar")
def npo(policy: TokenStats, reference: TokenStats, *, beta: float = 0.1) -> Tensor:
    """NPO (Zhang et al. 2024, eq. 3): −(2/β)·mean log σ(−β·(logp_θ − logp_ref)); logp [B] -> scalar.

    Hand check: at logp_θ = logp_ref the loss is (2/β)·ln 2 (= 13.8629 at β 0.1); with β = 1 and
    logp_θ − logp_ref = −ln 3, σ(ln 3) = 3/4 and the loss is 2·ln(4/3) ≈ 0.5754.
    """
    _check_same_shape(policy, reference, "policy and reference stats")
    return -(2.0 / beta) * F.logsigmoid(-beta * (policy.logp - reference.logp.detach())).mean()


def simnpo_loss(nll: Tensor, *, beta: float, delta: float) -> Tensor:
    """SimNPO on per-example mean NLL [B] -> scalar: −(2/β)·mean log σ(β·(NLL − δ))."""
    return -(2.0 / beta) * F.logsigmoid(beta * (nll - delta)).mean()


@forget_objective("simnpo")
def simnpo(policy: TokenStats, *, beta: float = 4.5, delta: float = 0.0) -> Tensor:
    """SimNPO (Fan et al. 2024): −(2/β)·mean log σ(−β·(logp_θ/|y| + δ)); [B] -> scalar.

    logp_θ/|y| = −NLL_θ, so the argument −β·(−NLL_θ + δ) = β·(NLL_θ − δ): the two forms in
    docs/METHODS.md §3.3 are one loss. Sign of δ: it is SUBTRACTED from the mean NLL inside β (as in the
    SimNPO authors' code); the paper's equation −(2/β) log σ(−(β/|y|)·logp_θ − γ) has its margin
    outside β, so γ_paper = β·δ. (The table's γ 0.125 is the forget weight, not this margin.)
    Hand check: NLL = 1.5, β = 2, δ = 1.5 − ln(3)/2: β·(NLL − δ) = ln 3, loss = −ln(3/4) ≈ 0.2877.
    """
    return simnpo_loss(policy.nll, beta=beta, delta=delta)


@forget_objective("dpo", needs=("reference", "refusal", "refusal_reference"), frozen_use="scalar")
def dpo(policy: TokenStats, reference: TokenStats, refusal: TokenStats, refusal_reference: TokenStats,
        *, beta: float = 0.1) -> Tensor:
    """DPO with a refusal as the preferred answer (Rafailov et al. 2023; IdkDPO in TOFU, Maini et al. 2024).

    −(2/β)·mean log σ(β·[(logp_θ(y_idk) − logp_ref(y_idk)) − (logp_θ(y) − logp_ref(y))]); `policy`/
    `reference` are on (question, forget answer), `refusal`/`refusal_reference` on (question,
    refusal); each .logp [B] -> scalar. Hand check: at θ = ref the loss is (2/β)·ln 2 (13.8629 at
    β 0.1); with β = 1, refusal margin ln 3 and answer margin 0: −2·ln(3/4) ≈ 0.5754.
    """
    _check_same_shape(policy, reference, "policy and reference stats")
    _check_same_shape(refusal, refusal_reference, "refusal and refusal_reference stats")
    _check_same_batch(policy, refusal, "forget and refusal batches")
    chosen = refusal.logp - refusal_reference.logp.detach()
    rejected = policy.logp - reference.logp.detach()
    return -(2.0 / beta) * F.logsigmoid(beta * (chosen - rejected)).mean()


# IdkDPO is the same loss under its TOFU recipe name.
forget_objective("idk_dpo", needs=("reference", "refusal", "refusal_reference"), frozen_use="scalar")(dpo)


@forget_objective("idk", needs=("refusal",))
def idk(policy: TokenStats, refusal: TokenStats, *, reduction: str = "token") -> Tensor:
    """IDK fine-tuning (TOFU, Maini et al. 2024): NLL_θ of a refusal to each forget question -> scalar.

    `policy` (the forget answer) is passed by the loop but unused; the refusal's [B, T-1] token
    log-probs are reduced over its answer tokens. Hand check: refusal token log-probs (−1, −3) and
    (−4, padding): "token" (1 + 3 + 4)/3 = 8/3, "example" mean(2, 4) = 3.
    """
    _check_same_batch(policy, refusal, "forget and refusal batches")
    return -refusal.mean(refusal.token_logp, reduction)


@forget_objective("me", loop_params={"positions": "answer"},
                  choices={"positions": ("answer", "sequence", "batch", "max_length")})
def me(policy: TokenStats, *, reduction: str = "token") -> Tensor:
    """Maximum entropy (Yuan et al. 2024, "A Closer Look at Machine Unlearning for LLMs"): mean KL(u ‖ p_θ).

    KL(uniform ‖ p) = Σ_v (1/V)·(−ln V − log p_v) = −ln V − mean_v log p_v per counted token, with
    log p_v read as log(p_v + 1e-12) as in the authors' code (finite when p_v = 0); logits
    [B, T-1, V] -> scalar. positions (a loop parameter): "answer" counts answer tokens; "sequence" every
    real token, prompt included; "max_length" every position of rows padded to data.max_length, padding
    included (the authors' ME+GD runs: mask=false on rows padded with EOS to 500 tokens).
    Hand check: V = 4, p = (1/2, 1/4, 1/8, 1/8): (1/4)·(ln ½ + 0 + ln 2 + ln 2) = ln(2)/4 ≈ 0.1733.
    """
    kl = map_rows(uniform_kl, [policy])  # [N]
    return policy.mean(policy.spread(kl), reduction)


def uniform_kl(log_p: Tensor) -> Tensor:
    """ME's KL(u ‖ p) per row: [..., V] log-probs -> [...], log p_v read as log(p_v + 1e-12) (`me`)."""
    log_p = torch.logaddexp(log_p, log_p.new_tensor(math.log(ME_EPS)))
    return -log_p.mean(-1) - math.log(log_p.shape[-1])


def undial_targets(reference_log_probs: Tensor, targets: Tensor, beta: float) -> Tensor:
    """Detached UNDIAL target softmax(log p_ref − β·onehot(y_t)): [..., V] log-probs, [...] ids -> [..., V].

    Log-probs differ from logits by a per-position constant, which softmax ignores.
    """
    onehot = F.one_hot(targets, reference_log_probs.shape[-1]).to(reference_log_probs.dtype)
    return torch.softmax(reference_log_probs.detach() - beta * onehot, dim=-1).detach()


@forget_objective("undial", needs=("reference",), loop_params={"positions": "answer"},
                  choices={"positions": ("answer", "batch")})
def undial(policy: TokenStats, reference: TokenStats, *, beta: float = 10.0, reduction: str = "token") -> Tensor:
    """UNDIAL (Dong et al. 2024): CE(p_θ, softmax(logits_ref − β·onehot(y_t))) on answer tokens; -> scalar.

    Target from the frozen reference with the gold token's logit lowered by β, detached; per token
    −Σ_v q_v log p_θ,v (terms with q_v = 0 count 0), reduced over the counted positions: answer tokens, or
    with positions "batch" (a loop parameter) every position of the padded batch, where a −100 label lowers
    id V − 100 as open-unlearning's one-hot does. Uncounted positions never index the vocabulary. Shapes: logits [B, T-1, V], targets
    [B, T-1]. Hand check: reference uniform over V = 3, gold 0, β = ln 2 -> q = (0.2, 0.4, 0.4);
    p_θ = (½, ¼, ¼): CE = 0.2·ln 2 + 0.8·ln 4 = 1.8·ln 2 ≈ 1.2477 (a uniform p_θ gives ln V).
    """
    _check_same_shape(policy, reference, "policy and reference stats")
    ids = policy.targets if policy.targets is not None else reference.targets
    if ids is None:
        raise ValueError("undial needs target token ids: build TokenStats with token_stats() or pass targets=")
    ids = ids[policy.mask]  # [N]: answer tokens only (prompt/padding never index the vocabulary)
    ce = map_rows(lambda ref, log_p, y: undial_ce(ref, log_p, y, beta), [reference, policy], [ids])  # [N]
    return policy.mean(policy.spread(ce), reduction)


def undial_ce(reference_log_probs: Tensor, log_p: Tensor, ids: Tensor, beta: float) -> Tensor:
    """UNDIAL's per-row cross-entropy −Σ_v q_v log p_θ,v against `undial_targets` (terms with q_v = 0 count 0):
    [n, V] reference and student log-probs, [n] ids -> [n]."""
    q = undial_targets(reference_log_probs, ids, beta)
    return -torch.where(q > 0, q * log_p, 0.0).sum(-1)


def weighted_nll_ascent(policy: TokenStats, weight: Tensor, reduction: str) -> Tensor:
    """−mean_t[sg(w_t)·NLL_t] with NLL_t = −log p_t: policy [B, T-1] log-probs, weights [B, T-1] -> scalar."""
    return policy.mean(weight.detach() * policy.token_logp, reduction)


@forget_objective("wga")
def wga(policy: TokenStats, *, beta: float = 1.0, reduction: str = "token") -> Tensor:
    """WGA (Wang et al., ICLR 2025, loss reweighting): −mean_t[sg(p_t^β)·NLL_t]; token_logp [B, T-1] -> scalar.

    The mean divides by the number of answer tokens, not by Σ w. Hand check: β = 1, p = (½, ¼),
    one example: −(½·ln 2 + ¼·2 ln 2)/2 = −ln(2)/2 ≈ −0.3466.
    """
    p = policy.token_logp.detach().exp()
    return weighted_nll_ascent(policy, p.pow(beta), reduction)


@forget_objective("satimp")
def satimp(policy: TokenStats, *, beta1: float = 5.0, beta2: float = 1.0, reduction: str = "token") -> Tensor:
    """SatImp (Yang et al. 2025): −mean_t[sg(p_t^β1·(1−p_t)^β2)·NLL_t]; token_logp [B, T-1] -> scalar.

    Reduced like `wga`. Hand check: β1 = β2 = 1, p = (½, ¼), one example: weights ¼ and 3/16,
    −(¼·ln 2 + (3/16)·2 ln 2)/2 = −0.3125·ln 2 ≈ −0.2166.
    """
    p = policy.token_logp.detach().exp()
    return weighted_nll_ascent(policy, p.pow(beta1) * (1.0 - p).clamp_min(0.0).pow(beta2), reduction)


def steering_vector(hidden_size: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """RMU's fixed random direction u: uniform [0, 1)^H from `seed`, normalised to unit length. -> [H]."""
    u = torch.rand(hidden_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (u / u.norm()).to(dtype)


@forget_objective("rmu", needs=("hidden",), loop_params={"trainable_params": "wmdp", "trainable_layers": None})
def rmu(policy: TokenStats, *, layer: int = 7, steering_coef: float = 6.5, seed: int = 0,
        reduction: str = "example") -> Tensor:
    """RMU forget loss (Li et al. 2024, WMDP): MSE(h_layer(forget), c·u) on label tokens; [B, T, H] -> scalar.

    h_layer is decoder layer `layer`'s output (forward hook), u = steering_vector(H, seed). Per
    token the squared error is averaged over H; "example" then averages over each example's label
    tokens and over examples (open-unlearning's RMU), "token" pools them (WMDP's mse_loss, which
    also counts padding). Trained parameters: `trainable_params` of `trainable_layers` (loop).
    Hand check: H = 2, h = (3, 4) at the one label token, u = (0.6, 0.8), c = 5: loss 0.
    """
    h = hidden_at(policy, layer)
    u = steering_vector(h.shape[-1], seed, h.dtype).to(h.device)
    return hidden_mean(policy, token_mse(h, steering_coef * u), reduction)
