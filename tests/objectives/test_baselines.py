"""Baseline forget objectives and the AP retain term: hand-worked values, properties of docs/METHODS.md §3, §4."""
import math

import pytest
import torch

from obliviate.modeling.logprobs import TokenStats, kl_per_token, token_stats
from obliviate.objectives import FORGET, RETAIN

LN2, LN3 = math.log(2), math.log(3)


def lp(token_logp, mask=None, requires_grad=False):
    """TokenStats from explicit token log-probs [B, T] (masked entries set to 0, as token_stats does)."""
    t = torch.tensor(token_logp, dtype=torch.float64)
    m = torch.ones_like(t, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    t = (t * m).requires_grad_(requires_grad)
    return TokenStats(logits=None, token_logp=t, mask=m)


def dist(probs, mask, targets=None):
    """TokenStats from explicit next-token distributions [B, T, V], a mask [B, T] and optional target ids."""
    logits = torch.tensor(probs, dtype=torch.float64).log()
    m = torch.tensor(mask, dtype=torch.bool)
    tgt = None if targets is None else torch.tensor(targets)
    return TokenStats(logits=logits, token_logp=torch.zeros(m.shape, dtype=torch.float64), mask=m, targets=tgt)


def fn(name):
    return FORGET.get(name).fn


# ---- npo -------------------------------------------------------------------------------------------

def test_npo_hand_value():
    # logp_θ = -1 - 2 = -3 (third token padded), logp_ref = -3 + ln3: difference -ln3.
    # β = 1: -2·log σ(-1·(-ln3)) = -2·log σ(ln3) = -2·ln(3/4) = 2 ln(4/3) = 0.575364
    pol = lp([[-1.0, -2.0, -9.0]], [[1, 1, 0]])
    ref = lp([[-1.0, -2.0 + LN3, -7.0]], [[1, 1, 0]])
    assert fn("npo")(pol, ref, beta=1.0).item() == pytest.approx(2 * math.log(4 / 3), abs=1e-12)


def test_npo_at_reference_is_2_over_beta_ln2_and_descends_likelihood():
    # at θ = ref: -(2/β) log σ(0) = (2/β) ln2 = 20 ln2 at β 0.1. d/dlogp_θ = 2σ(0)/B = 1/B > 0 per counted
    # token, so a gradient step lowers the forget log-likelihood; padded tokens get no gradient.
    pol = lp([[-1.0, -2.0], [-0.5, 0.0]], [[1, 1], [1, 0]], requires_grad=True)
    ref = lp([[-1.0, -2.0], [-0.5, 0.0]], [[1, 1], [1, 0]])
    loss = fn("npo")(pol, ref)
    assert loss.item() == pytest.approx(20 * LN2, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(pol.token_logp.grad, torch.tensor([[0.5, 0.5], [0.5, 0.0]], dtype=torch.float64))


# ---- simnpo ----------------------------------------------------------------------------------------

def test_simnpo_hand_value_and_both_forms_agree():
    # NLL = (1 + 2)/2 = 1.5; β = 2, δ = 1.5 - ln3/2: β·(NLL - δ) = ln3 -> -(2/2)·ln σ(ln3) = ln(4/3) = 0.287682
    pol = lp([[-1.0, -2.0, -5.0]], [[1, 1, 0]])
    beta, delta = 2.0, 1.5 - LN3 / 2
    got = fn("simnpo")(pol, beta=beta, delta=delta)
    assert got.item() == pytest.approx(math.log(4 / 3), abs=1e-12)
    # form 1 of docs/METHODS.md §3.3, -(2/β)·mean log σ(-β·(logp/|y| + δ)), on a random batch equals the implemented
    # form 2, -(2/β)·mean log σ(β·(NLL - δ)), for either sign of δ
    torch.manual_seed(0)
    rows = lp((-3 * torch.rand(4, 5)).tolist(), [[1] * 5, [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    for delta in (0.7, 0.0, -1.3):
        form1 = -(2 / beta) * torch.nn.functional.logsigmoid(-beta * (rows.logp / rows.n_tokens + delta)).mean()
        assert fn("simnpo")(rows, beta=beta, delta=delta).item() == pytest.approx(form1.item(), abs=1e-12)


def test_simnpo_default_at_nll_equal_delta():
    # NLL = δ -> -(2/4.5)·log σ(0) = (2/4.5)·ln2 = 0.308065; averaged over two examples with the same value
    pol = lp([[-0.5, -1.5], [-3.0, 0.0]], [[1, 1], [1, 0]])  # NLLs 1.0 and 3.0
    got = fn("simnpo")(pol, delta=2.0)
    # per example: β(NLL-δ) = -4.5 and +4.5: -(2/4.5)·[log σ(-4.5) + log σ(4.5)]/2
    want = -(2 / 4.5) * (math.log(1 / (1 + math.exp(4.5))) + math.log(1 / (1 + math.exp(-4.5)))) / 2
    assert got.item() == pytest.approx(want, abs=1e-12)
    assert fn("simnpo")(lp([[-2.0]]), delta=2.0).item() == pytest.approx(2 / 4.5 * LN2, abs=1e-12)


# ---- dpo / idk_dpo ---------------------------------------------------------------------------------

def test_dpo_hand_value_and_alias():
    # answer margin: logp_θ(y) - logp_ref(y) = -3 - (-3) = 0; refusal margin: -2 - (-2 - ln3) = ln3.
    # β = 1: -2·log σ(ln3 - 0) = 2 ln(4/3) = 0.575364
    pol, ref = lp([[-1.0, -2.0]]), lp([[-1.0, -2.0]])
    idk, idk_ref = lp([[-2.0, 0.0, 0.0]], [[1, 0, 0]]), lp([[-2.0 - LN3, 0.0, 0.0]], [[1, 0, 0]])
    for name in ("dpo", "idk_dpo"):
        got = fn(name)(pol, reference=ref, refusal=idk, refusal_reference=idk_ref, beta=1.0)
        assert got.item() == pytest.approx(2 * math.log(4 / 3), abs=1e-12)
    assert FORGET.get("idk_dpo").needs == FORGET.get("dpo").needs == ("reference", "refusal", "refusal_reference")


def test_dpo_at_reference_is_2_over_beta_ln2():
    # both margins 0 -> -(2/β) log σ(0) = 20 ln2 = 13.862944 at β 0.1
    pol, idk = lp([[-1.0, -2.0], [-3.0, -1.0]]), lp([[-4.0], [-0.5]])
    got = fn("dpo")(pol, reference=pol, refusal=idk, refusal_reference=idk)
    assert got.item() == pytest.approx(20 * LN2, abs=1e-12)


def test_dpo_rejects_mismatched_batches():
    with pytest.raises(ValueError, match="different numbers of examples"):
        fn("dpo")(lp([[-1.0]]), lp([[-1.0]]), lp([[-1.0], [-2.0]]), lp([[-1.0], [-2.0]]))


# ---- idk -------------------------------------------------------------------------------------------

def test_idk_hand_value():
    # refusal token NLLs 1, 3 | 4 (second token padded); the forget answer is unused.
    # "token" (default, TOFU/closer-look's outputs.loss): (1 + 3 + 4)/3 = 8/3; "example": mean(2, 4) = 3
    refusal = lp([[-1.0, -3.0], [-4.0, -99.0]], [[1, 1], [1, 0]])
    assert fn("idk")(lp([[-50.0], [-60.0]]), refusal=refusal).item() == pytest.approx(8 / 3, abs=1e-12)
    assert fn("idk")(lp([[-50.0], [-60.0]]), refusal=refusal, reduction="example").item() == pytest.approx(3.0, abs=1e-12)
    refusal.token_total = 4.0  # the loop's step-wide count: 8/4
    assert fn("idk")(lp([[-50.0], [-60.0]]), refusal=refusal).item() == pytest.approx(2.0, abs=1e-12)


# ---- me --------------------------------------------------------------------------------------------

def test_me_hand_value_masks_and_uniform_is_zero():
    # p = (1/2, 1/4, 1/8, 1/8): KL(u ‖ p) = (1/4)·[ln(1/2) + ln 1 + ln 2 + ln 2] = ln2/4 = 0.173287
    # (the authors' log(p + 1e-12) moves it by (1/4)·Σ 1e-12/p_v = 5.5e-12, inside the tolerance)
    # example 0: that token + a masked peaked token (must not count); example 1: that token + a uniform
    # token (KL 0). "token" (default): (ln2/4 + ln2/4 + 0)/3 = ln2/6; "example": (ln2/4 + ln2/8)/2 = 3 ln2/16
    p, u, peak = [0.5, 0.25, 0.125, 0.125], [0.25] * 4, [0.97, 0.01, 0.01, 0.01]
    pol = dist([[p, peak], [p, u]], [[1, 0], [1, 1]])
    assert fn("me")(pol).item() == pytest.approx(LN2 / 6, abs=1e-10)
    assert fn("me")(pol, reduction="example").item() == pytest.approx(3 * LN2 / 16, abs=1e-10)
    # the closed form equals the library KL against an explicit uniform distribution
    lp_ = pol.log_probs()[0, 0]
    assert kl_per_token(torch.full_like(lp_, -math.log(4)), lp_).item() == pytest.approx(LN2 / 4, abs=1e-12)
    assert fn("me")(dist([[u, u]], [[1, 1]])).item() == pytest.approx(0.0, abs=1e-10)


def test_me_is_finite_where_the_student_puts_zero_probability():
    # p = (1, 0, 0, 0) exactly (log p = -inf): with the authors' log(p + 1e-12),
    # KL = -ln 4 - (1/4)·[ln(1 + 1e-12) + 3·ln(1e-12)] = -ln 4 + 0.75·27.631021 = 19.336972; exact KL is +inf
    logits = torch.tensor([[[0.0, -math.inf, -math.inf, -math.inf]]], dtype=torch.float64, requires_grad=True)
    pol = TokenStats(logits=logits, token_logp=torch.zeros(1, 1, dtype=torch.float64), mask=torch.ones(1, 1, dtype=torch.bool))
    loss = fn("me")(pol)
    assert loss.item() == pytest.approx(-math.log(4) - 0.75 * math.log(1e-12), rel=1e-9)
    loss.backward()
    assert torch.isfinite(logits.grad).all()


# ---- undial ----------------------------------------------------------------------------------------

def test_undial_hand_value():
    # reference uniform over 3, gold token 0, β = ln2: target ∝ (1/2, 1, 1) -> q = (0.2, 0.4, 0.4).
    # policy (1/2, 1/4, 1/4): CE = -(0.2 ln(1/2) + 0.8 ln(1/4)) = 0.2 ln2 + 1.6 ln2 = 1.8 ln2 = 1.247665
    pol = dist([[[0.5, 0.25, 0.25]]], [[1]], targets=[[0]])
    ref = dist([[[1 / 3] * 3]], [[1]], targets=[[0]])
    assert fn("undial")(pol, ref, beta=LN2).item() == pytest.approx(1.8 * LN2, abs=1e-12)
    # a uniform policy gives CE = ln V whatever the target (default β 10)
    assert fn("undial")(ref, ref).item() == pytest.approx(LN3, abs=1e-12)


def test_undial_ignores_masked_positions_even_with_minus_100_targets():
    # position 1 is masked with target -100 (never used as a vocab index); changing both models' logits
    # there leaves the value unchanged, and it is not averaged in (value = the single counted token's CE).
    pol = dist([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]], [[1, 0]], targets=[[0, -100]])
    ref = dist([[[1 / 3] * 3, [0.6, 0.3, 0.1]]], [[1, 0]], targets=[[0, -100]])
    a = fn("undial")(pol, ref, beta=LN2)
    pol.logits[0, 1], ref.logits[0, 1] = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    pol._log_probs = ref._log_probs = None
    b = fn("undial")(pol, ref, beta=LN2)
    assert a.item() == pytest.approx(1.8 * LN2, abs=1e-12) and b.item() == pytest.approx(a.item(), abs=1e-12)


def test_undial_from_real_logits_counts_answer_tokens_only_and_detaches_target():
    torch.manual_seed(0)
    labels = torch.tensor([[-100, -100, 5, 6, -100], [-100, 2, 3, 4, 7]])  # prompt, answer, padding
    a, b = torch.randn(2, 5, 8, requires_grad=True), torch.randn(2, 5, 8, requires_grad=True)
    pol, ref = token_stats(a, labels), token_stats(b, labels)
    assert pol.targets.tolist() == [[0, 5, 6, 0], [2, 3, 4, 7]]
    v1 = fn("undial")(pol, ref)
    v1.backward()
    assert b.grad is None and a.grad.abs().sum() > 0  # gradient only through the policy
    assert a.grad[0, [0, 3, 4]].abs().sum() == 0  # logits whose next token is prompt/padding: no gradient
    a2, b2 = a.detach().clone(), b.detach().clone()
    a2[0, 0], b2[0, 3:] = torch.randn(8), torch.randn(2, 8)
    v2 = fn("undial")(token_stats(a2, labels), token_stats(b2, labels))
    assert v1.item() == pytest.approx(v2.item(), abs=1e-6)


def test_undial_without_targets_is_a_clear_error():
    pol = dist([[[0.5, 0.5]]], [[1]])
    with pytest.raises(ValueError, match="target token ids"):
        fn("undial")(pol, pol)


# ---- wga / satimp ----------------------------------------------------------------------------------

def test_wga_and_satimp_hand_values():
    # p = (1/2, 1/4), a padded third token. NLL = (ln2, 2 ln2).
    # wga β 1: weights (1/2, 1/4): -(ln2/2 + ln2/2)/2 = -ln2/2 = -0.346574
    # satimp β1 = β2 = 1: weights (1/4, 3/16): -(ln2/4 + 3 ln2/8)/2 = -5 ln2/16 = -0.216608
    # satimp defaults β1 5, β2 1: weights (1/64, 3/4096): -(ln2/64 + 6 ln2/4096)/2 = -70 ln2/8192
    pol = lp([[-LN2, -2 * LN2, -7.0]], [[1, 1, 0]])
    assert fn("wga")(pol).item() == pytest.approx(-LN2 / 2, abs=1e-12)
    assert fn("satimp")(pol, beta1=1.0, beta2=1.0).item() == pytest.approx(-5 * LN2 / 16, abs=1e-12)
    assert fn("satimp")(pol).item() == pytest.approx(-70 * LN2 / 8192, abs=1e-12)


@pytest.mark.parametrize("name,kw,weight", [
    ("wga", {"beta": 2.0}, lambda p: p ** 2),
    ("satimp", {"beta1": 5.0, "beta2": 1.0}, lambda p: p ** 5 * (1 - p)),
])
@pytest.mark.parametrize("reduction", ["token", "example"])
def test_weighted_ascent_gradient_treats_weight_as_constant(name, kw, weight, reduction):
    # d loss / d logp_t = w_t / N with w a constant: the gradient of -mean(w·NLL) at fixed w, where N is
    # the batch's 5 answer tokens ("token", the default) or |y|·B per example ("example": 3·2 and 2·2)
    rows, mask = [[-0.2, -1.0, -3.0], [-0.7, -0.1, 0.0]], [[1, 1, 1], [1, 1, 0]]
    pol = lp(rows, mask, requires_grad=True)
    fn(name)(pol, **kw, reduction=reduction).backward()
    t = torch.tensor(rows, dtype=torch.float64)
    m = torch.tensor(mask, dtype=torch.float64)
    n = m.sum() if reduction == "token" else m.sum(-1, keepdim=True) * 2
    torch.testing.assert_close(pol.token_logp.grad, weight(t.exp()) * m / n, rtol=0, atol=1e-12)


def test_wga_token_and_example_hand_values():
    # β 1, loss = mean of w·log p with w = p. Example 0: p = (1/2, 1/4) -> (-ln2/2, -ln2/2);
    # example 1: p = 1 (then padding) -> 0. "token": (-ln2/2 - ln2/2 + 0)/3 = -ln2/3;
    # "example": (mean(-ln2/2, -ln2/2) + 0)/2 = -ln2/4
    pol = lp([[-LN2, -2 * LN2], [0.0, -5.0]], [[1, 1], [1, 0]])
    assert fn("wga")(pol).item() == pytest.approx(-LN2 / 3, abs=1e-12)
    assert fn("wga")(pol, reduction="example").item() == pytest.approx(-LN2 / 4, abs=1e-12)


# ---- ap (retain) -----------------------------------------------------------------------------------

def test_ap_hand_value_and_sign():
    # β = 1, logp(y) = -1, logp(y_idk) = -1 - ln3: -(1/1)·log σ(ln3) = ln(4/3) = 0.287682
    ap = RETAIN.get("ap").fn
    ans, idk = lp([[-0.25, -0.75]]), lp([[-1.0 - LN3]])
    assert ap(ans, refusal=idk, beta=1.0).item() == pytest.approx(math.log(4 / 3), abs=1e-12)
    # equal log-probs: (1/β) ln2 = 10 ln2 at β 0.1; preferring the true answer lowers the loss, the refusal raises it
    even = ap(lp([[-2.0]]), refusal=lp([[-2.0]]))
    assert even.item() == pytest.approx(10 * LN2, abs=1e-12)
    assert ap(lp([[-1.0]]), refusal=lp([[-3.0]])) < even < ap(lp([[-3.0]]), refusal=lp([[-1.0]]))
    assert RETAIN.get("ap").needs == ("refusal",)


def test_needs_and_defaults_are_registered():
    # sequence-level losses have no `reduction`; token-level ones default to the reference code's choice
    want = {"npo": (("reference",), {"beta": 0.1}), "simnpo": ((), {"beta": 4.5, "delta": 0.0}),
            "dpo": (("reference", "refusal", "refusal_reference"), {"beta": 0.1}),
            "idk": (("refusal",), {"reduction": "token"}),
            "me": ((), {"reduction": "token", "positions": "answer"}),
            "undial": (("reference",), {"beta": 10.0, "reduction": "token", "positions": "answer"}),
            "wga": ((), {"beta": 1.0, "reduction": "token"}),
            "satimp": ((), {"beta1": 5.0, "beta2": 1.0, "reduction": "token"})}
    for name, (needs, defaults) in want.items():
        spec = FORGET.get(name)
        assert spec.needs == needs and spec.defaults() == defaults, name
    assert RETAIN.get("ap").defaults() == {"beta": 0.1}
    assert RETAIN.get("kl").defaults() == {"reduction": "token", "positions": "answer"} and RETAIN.get("kl").last_position
