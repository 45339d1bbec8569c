"""Forget objectives (METHODS.md §1, §3): pure functions of TokenStats returning a loss to minimise.

Shapes: every TokenStats is [B, T-1] (logits [B, T-1, V]); `.logp` [B] sums answer-token log-probs,
`.nll` [B] is their per-token mean. Token-level losses average over answer tokens per example, then
over examples (so long and short answers weigh the same), and never count prompt or padding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from obliviate.modeling.logprobs import TokenStats, hidden_at, masked_mse, masked_token_kl, sequence_mean
from obliviate.objectives.base import forget_objective


@forget_objective("asu", needs=("teacher",), loop_params={"tau": 2.0, "layers": None})
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


def _check_same_shape(a: TokenStats, b: TokenStats, what: str) -> None:
    """Stats of two models on one batch must align token by token."""
    if a.mask.shape != b.mask.shape:
        raise ValueError(f"{what} differ in shape: {tuple(a.mask.shape)} vs {tuple(b.mask.shape)}")


def _check_same_batch(a: TokenStats, b: TokenStats, what: str) -> None:
    """Paired batches (answer vs refusal) must hold the same questions; lengths T may differ."""
    if a.mask.shape[0] != b.mask.shape[0]:
        raise ValueError(f"{what} hold different numbers of examples: {a.mask.shape[0]} vs {b.mask.shape[0]}")


def _answer_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over answer tokens per example, then over examples: [B, T-1] -> scalar.

    Masked entries are zeroed first, so a non-finite value at a prompt/padding position cannot leak.
    """
    return sequence_mean(values.masked_fill(~mask, 0.0), mask).mean()


@forget_objective("npo", needs=("reference",))
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
    METHODS.md are one loss. Sign of δ: it is SUBTRACTED from the mean NLL inside β (as in the
    SimNPO authors' code); the paper's equation −(2/β) log σ(−(β/|y|)·logp_θ − γ) has its margin
    outside β, so γ_paper = β·δ. (The table's γ 0.125 is the forget weight, not this margin.)
    Hand check: NLL = 1.5, β = 2, δ = 1.5 − ln(3)/2: β·(NLL − δ) = ln 3, loss = −ln(3/4) ≈ 0.2877.
    """
    return simnpo_loss(policy.nll, beta=beta, delta=delta)


@forget_objective("dpo", needs=("reference", "refusal", "refusal_reference"))
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
forget_objective("idk_dpo", needs=("reference", "refusal", "refusal_reference"))(dpo)


@forget_objective("idk", needs=("refusal",))
def idk(policy: TokenStats, refusal: TokenStats) -> Tensor:
    """IDK fine-tuning (TOFU, Maini et al. 2024): NLL_θ of a refusal to each forget question; [B] -> scalar.

    `policy` (the forget answer) is passed by the loop but unused. Hand check: refusal token
    log-probs (−1, −3) and (−4, padding): per-example NLL 2 and 4, loss 3.
    """
    _check_same_batch(policy, refusal, "forget and refusal batches")
    return refusal.nll.mean()


@forget_objective("me")
def me(policy: TokenStats) -> Tensor:
    """Maximum entropy (Yuan et al. 2024, "A Closer Look at Machine Unlearning for LLMs"): mean KL(u ‖ p_θ).

    KL(uniform ‖ p) = Σ_v (1/V)·(−ln V − log p_v) = −ln V − mean_v log p_v per answer token
    (closed form of kl_per_token(uniform, log p)); logits [B, T-1, V] -> scalar, mean over answer
    tokens per example, then over examples. Hand check: V = 4, p = (1/2, 1/4, 1/8, 1/8):
    (1/4)·(ln ½ + 0 + ln 2 + ln 2) = ln(2)/4 ≈ 0.1733; a uniform p gives 0.
    """
    log_p = policy.log_probs()
    kl = -log_p.mean(-1) - math.log(log_p.shape[-1])
    return _answer_mean(kl, policy.mask)


def undial_targets(reference_log_probs: Tensor, targets: Tensor, beta: float) -> Tensor:
    """Detached UNDIAL target softmax(log p_ref − β·onehot(y_t)): [B, T-1, V], [B, T-1] ids -> [B, T-1, V].

    Log-probs differ from logits by a per-position constant, which softmax ignores.
    """
    onehot = F.one_hot(targets, reference_log_probs.shape[-1]).to(reference_log_probs.dtype)
    return torch.softmax(reference_log_probs.detach() - beta * onehot, dim=-1).detach()


@forget_objective("undial", needs=("reference",))
def undial(policy: TokenStats, reference: TokenStats, *, beta: float = 10.0) -> Tensor:
    """UNDIAL (Dong et al. 2024): CE(p_θ, softmax(logits_ref − β·onehot(y_t))) on answer tokens; -> scalar.

    Target from the frozen reference with the gold token's logit lowered by β, detached; per token
    −Σ_v q_v log p_θ,v, averaged over answer tokens per example, then examples. Masked positions
    are never used to index the vocabulary nor counted. Shapes: logits [B, T-1, V], targets
    [B, T-1]. Hand check: reference uniform over V = 3, gold 0, β = ln 2 -> q = (0.2, 0.4, 0.4);
    p_θ = (½, ¼, ¼): CE = 0.2·ln 2 + 0.8·ln 4 = 1.8·ln 2 ≈ 1.2477 (a uniform p_θ gives ln V).
    """
    _check_same_shape(policy, reference, "policy and reference stats")
    ids = policy.targets if policy.targets is not None else reference.targets
    if ids is None:
        raise ValueError("undial needs target token ids: build TokenStats with token_stats() or pass targets=")
    ids = ids.masked_fill(~policy.mask, 0)  # e.g. -100 on prompt/padding would index entry V-100
    q = undial_targets(reference.log_probs(), ids, beta)
    ce = -(q * policy.log_probs()).sum(-1)
    return _answer_mean(ce, policy.mask)


def weighted_nll_ascent(token_logp: Tensor, weight: Tensor, mask: Tensor) -> Tensor:
    """−mean_t[sg(w_t)·NLL_t] with NLL_t = −log p_t: [B, T-1] log-probs, weights, mask -> scalar."""
    return -_answer_mean(weight.detach() * -token_logp, mask)


@forget_objective("wga")
def wga(policy: TokenStats, *, beta: float = 1.0) -> Tensor:
    """WGA (Yang et al. 2025, loss reweighting): −mean_t[sg(p_t^β)·NLL_t]; token_logp [B, T-1] -> scalar.

    Averaged over answer tokens per example (divided by |y|, not by Σ w), then over examples.
    Hand check: β = 1, p = (½, ¼): −(½·ln 2 + ¼·2 ln 2)/2 = −ln(2)/2 ≈ −0.3466.
    """
    p = policy.token_logp.detach().exp()
    return weighted_nll_ascent(policy.token_logp, p.pow(beta), policy.mask)


@forget_objective("satimp")
def satimp(policy: TokenStats, *, beta1: float = 5.0, beta2: float = 1.0) -> Tensor:
    """SatImp (Yang et al. 2025): −mean_t[sg(p_t^β1·(1−p_t)^β2)·NLL_t]; token_logp [B, T-1] -> scalar.

    Averaged like `wga`. Hand check: β1 = β2 = 1, p = (½, ¼): weights ¼ and 3/16,
    −(¼·ln 2 + (3/16)·2 ln 2)/2 = −0.3125·ln 2 ≈ −0.2166.
    """
    p = policy.token_logp.detach().exp()
    return weighted_nll_ascent(policy.token_logp, p.pow(beta1) * (1.0 - p).clamp_min(0.0).pow(beta2), policy.mask)


def steering_vector(hidden_size: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """RMU's fixed random direction u: uniform [0, 1)^H from `seed`, normalised to unit length. -> [H]."""
    u = torch.rand(hidden_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (u / u.norm()).to(dtype)


@forget_objective("rmu", needs=("hidden",), loop_params={"trainable_layers": None})
def rmu(policy: TokenStats, *, layer: int = 7, steering_coef: float = 6.5, seed: int = 0) -> Tensor:
    """RMU forget loss (Li et al. 2024, WMDP): MSE(h_layer(forget), c·u) over real tokens; [B, T, H] -> scalar.

    u = steering_vector(H, seed); only `trainable_layers` are trained (default layer-2..layer).
    Hand check: H = 2, h = [[3, 4]] at the one real token, c·u = [0.6c, 0.8c] with u = (0.6, 0.8)
    and c = 5 gives target (3, 4): loss 0.
    """
    h = hidden_at(policy, layer)
    u = steering_vector(h.shape[-1], seed, h.dtype).to(h.device)
    return masked_mse(h, steering_coef * u, policy.attention_mask)
