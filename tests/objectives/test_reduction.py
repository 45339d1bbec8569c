"""Token reduction ("token" pools the batch, "example" averages per example), its defaults, non-finite
log-probs in KL-type losses, step-wide pooling in the loop, and ME's "sequence" positions."""
import copy
import math
from dataclasses import replace

import pytest
import torch

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import REDUCTIONS, TokenStats, answer_mean, kl_per_token, masked_token_kl
from obliviate.objectives import FORGET, RETAIN

# The reference code's reduction for each token-level term (file read, see the module docstrings):
# open-unlearning src/trainer/unlearn/grad_ascent.py / grad_diff.py (-outputs.loss; NLL retain outputs.loss),
# src/trainer/utils.py (compute_kl_divergence kl_div batchmean, compute_undial_loss loss.mean(),
# compute_wga_loss / compute_satimp_loss [labels != -100].mean()), closer-look trainer/losses.py (idk_loss
# outputs.loss, get_me_loss sum/loss_mask.sum()), open-unlearning rmu.py compute_activation_loss (per example);
# ASU has no public code: its equation averages per example.
REFERENCE = {("forget", "ga"): "token", ("forget", "idk"): "token", ("forget", "me"): "token",
             ("forget", "undial"): "token", ("forget", "wga"): "token", ("forget", "satimp"): "token",
             ("forget", "asu"): "example", ("forget", "rmu"): "example",
             ("retain", "nll"): "token", ("retain", "kl"): "token", ("retain", "hidden_mse"): "example"}
SEQUENCE_LEVEL = [("forget", "npo"), ("forget", "simnpo"), ("forget", "dpo"), ("forget", "idk_dpo"), ("retain", "ap")]


def _spec(side, name):
    return (FORGET if side == "forget" else RETAIN).get(name)


def test_every_token_level_default_is_the_reference_choice():
    have = {(side, n): reg.get(n).loss_defaults()["reduction"] for side, reg in (("forget", FORGET), ("retain", RETAIN))
            for n in reg.names() if "reduction" in reg.get(n).loss_defaults()}
    assert have == REFERENCE


@pytest.mark.parametrize("side,name", SEQUENCE_LEVEL)
def test_sequence_level_losses_have_no_reduction_key(side, name):
    with pytest.raises(ConfigError, match="unknown hyper-parameter"):
        _spec(side, name).resolve({"reduction": "token"})


@pytest.mark.parametrize("side,name", sorted(REFERENCE))
def test_invalid_reduction_names_the_valid_values(side, name):
    with pytest.raises(ConfigError, match=r"reduction must be one of \['token', 'example'\], got 'tokens'"):
        _spec(side, name).resolve({"reduction": "tokens"})
    assert _spec(side, name).resolve({"reduction": "example"})[0]["reduction"] == "example"


def test_answer_mean_hand_values_and_direct_misuse():
    v = torch.tensor([[1.0, 3.0, 50.0], [6.0, 70.0, 80.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, False], [True, False, False]])
    # token: (1 + 3 + 6)/3 = 10/3; example: (2 + 6)/2 = 4; token with the loop's total 5: 10/5 = 2
    assert answer_mean(v, m, "token").item() == pytest.approx(10 / 3, abs=1e-12)
    assert answer_mean(v, m, "example").item() == pytest.approx(4.0, abs=1e-12)
    assert answer_mean(v, m, "token", 5.0).item() == pytest.approx(2.0, abs=1e-12)
    assert REDUCTIONS == ("token", "example")
    with pytest.raises(ConfigError, match="reduction must be one of"):
        answer_mean(v, m, "mean")
    with pytest.raises(ConfigError, match="reduction must be one of"):
        FORGET.get("ga").fn(TokenStats(logits=None, token_logp=v, mask=m), reduction="sum")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_answer_mean_ignores_non_finite_masked_entries_in_value_and_gradient(reduction):
    # NaN and ±inf at masked positions: value as if they were 0 ((1 + 2)/2 either way here), gradient finite
    x = torch.tensor([[1.0, float("nan"), float("inf")], [2.0, -float("inf"), 0.0]], requires_grad=True)
    m = torch.tensor([[True, False, False], [True, False, False]])
    out = answer_mean(x * 3, m, reduction)
    assert out.item() == pytest.approx(4.5)
    out.backward()
    assert torch.isfinite(x.grad).all() and x.grad.tolist() == [[1.5, 0.0, 0.0], [1.5, 0.0, 0.0]]


def test_kl_with_zero_target_probabilities_is_finite_in_value_and_gradient():
    # p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): KL = 2·(1/2)·ln(2) + 0 (the p = 0 term) = ln 2
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64).log()
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64).log().requires_grad_(True)
    kl = kl_per_token(p, q)
    assert kl.item() == pytest.approx(math.log(2), abs=1e-12)
    kl.backward()
    # dKL/dlog q_v = -p_v: (-1/2, -1/2, 0)
    assert q.grad.tolist() == pytest.approx([-0.5, -0.5, 0.0], abs=1e-12)
    # both zero at v = 2 (0·(−inf − (−inf)) would be NaN): q = (1/2, 1/2, 0): KL 0, gradient finite
    q2 = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64).log().requires_grad_(True)
    kl2 = kl_per_token(p, q2)
    assert kl2.item() == pytest.approx(0.0, abs=1e-12)
    kl2.backward()
    assert torch.isfinite(q2.grad).all()


def _dist(rows, mask, requires_grad=False):
    logits = torch.tensor(rows, dtype=torch.float64).log().requires_grad_(requires_grad)
    m = torch.tensor(mask, dtype=torch.bool)
    return logits, TokenStats(logits=logits, token_logp=torch.zeros(m.shape, dtype=torch.float64), mask=m)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_masked_kl_survives_a_non_finite_teacher_row_at_a_masked_position(reduction):
    # teacher (1/2, 1/2) vs student (1/4, 3/4) at the one answer token (KL 0.143841); the masked position
    # holds a NaN teacher row (as from a fully masked padding query): value and student
    # gradient stay finite, and the masked row gets zero gradient
    _, teacher = _dist([[[0.5, 0.5], [0.5, 0.5]]], [[1, 0]])
    teacher.logits.data[0, 1] = float("nan")
    s_logits, student = _dist([[[0.25, 0.75], [0.9, 0.1]]], [[1, 0]], requires_grad=True)
    loss = masked_token_kl(teacher, student, reduction)
    assert loss.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-12)
    loss.backward()
    assert torch.isfinite(s_logits.grad).all() and s_logits.grad[0, 1].abs().sum() == 0


@pytest.mark.parametrize("student,want", [
    ([0.5, 0.25, 0.25], 5 / 3 * math.log(2)),  # CE = (1/3)·ln 2 + (2/3)·ln 4 = (5/3)·ln 2 = 1.155245
    ([0.5, 0.5, 0.0], math.log(2)),  # CE = (1/3 + 2/3)·ln 2; the q = 0, log p = -inf term counts 0, not NaN
])
def test_undial_with_minus_inf_log_probs_is_finite(student, want):
    # reference p = (1/2, 1/2, 0) (log 0 = -inf), gold 0, β = ln 2: target ∝ (1/4, 1/2, 0) -> q = (1/3, 2/3, 0)
    _, ref = _dist([[[0.5, 0.5, 0.0]]], [[1]])
    ref.targets = torch.tensor([[0]])
    s_logits, pol = _dist([[student]], [[1]], requires_grad=True)
    pol.targets = ref.targets
    loss = FORGET.get("undial").fn(pol, ref, beta=math.log(2))
    assert loss.item() == pytest.approx(want, abs=1e-12)
    loss.backward()
    assert torch.isfinite(s_logits.grad).all()


# ---- the loop: "token" pools over the whole optimizer step ---------------------------------------

def _side(name, registry, tok, rows, kwargs=None, loop_kw=None, refusals=False):
    from obliviate.data.refusals import RefusalTwins
    from obliviate.data.tokenize import encode_qa
    from obliviate.train.unlearn import Side, encode_rows

    spec = registry.get(name)
    loss_kw, loop = spec.resolve(kwargs or {})
    ref = RefusalTwins(lambda q, a: encode_qa(tok, q, a, 64), [r.question for r in rows], ["I have no idea about that."],
                       0, "per_example") if refusals else None
    return Side(spec, loss_kw, 1.0, encode_rows(tok, rows, 64), ref, {**loop, **(loop_kw or {})})


@pytest.mark.parametrize("name,registry,kwargs", [
    ("ga", FORGET, {}), ("nll", RETAIN, {}), ("idk", FORGET, {}), ("me", FORGET, {"positions": "sequence"}),
    ("rmu", FORGET, {"layer": 1, "reduction": "token"}), ("ga", FORGET, {"reduction": "example"}),
])
def test_micro_batch_losses_average_to_the_step_token_mean(name, registry, kwargs, small_world, small_tok,
                                                           trained_small):
    """Micro-batches [0] and [1, 2] of one step: the loop's (L_a + L_b)/2 equals the loss on one batch of all
    three examples, for "token" (pooled over the step's tokens) and "example" (equal micro-batch sizes
    aside, the per-example mean) alike; pooling per micro-batch instead would differ."""
    from accelerate import Accelerator

    from obliviate.data.tokenize import collate
    from obliviate.modeling.logprobs import forward_stats
    from obliviate.modeling.positions import every_token_labels

    model = copy.deepcopy(trained_small).double()
    rows = small_world.splits["forget10"][:3]
    side = _side(name, registry, small_tok, rows, kwargs, refusals=name == "idk")
    acc, step = Accelerator(cpu=True), ([0, 1, 2], 2)
    with torch.no_grad():
        pooled = (side.loss(model, None, [0], acc, 0, step) + side.loss(model, None, [1, 2], acc, 0, step)) / 2
        local = (side.loss(model, None, [0], acc, 0) + side.loss(model, None, [1, 2], acc, 0)) / 2
        batch = collate(side.enc, 0)
        if name == "me":
            batch = {**batch, "labels": every_token_labels(batch)}
        layer = kwargs.get("layer")
        extra = {"refusal": forward_stats(model, collate(list(side.refusal_enc.at(0)), 0))} if name == "idk" else {}
        whole = side.spec.fn(forward_stats(model, batch, hidden_layer=layer), **extra, **side.kwargs)
    if side.kwargs["reduction"] == "token":
        torch.testing.assert_close(pooled, whole, rtol=1e-12, atol=1e-12)
        assert abs(local.item() - whole.item()) > 1e-6  # per-micro-batch pooling is not the step mean
    else:  # "example": the step helper changes nothing; two unequal micro-batches weigh 1/2 each
        torch.testing.assert_close(pooled, local, rtol=1e-12, atol=1e-12)


def test_pool_total_formula():
    # N_step·scale/(P·G): 12 tokens, scale 1, 2 ranks, 3 micro-batches -> 2; one rank, one micro-batch -> 12
    from obliviate.data.tokenize import Encoded
    from obliviate.train.unlearn import _pool_total

    enc = [Encoded([1, 2, 3, 4, 5], [-100, -100, 3, 4, 5], False), Encoded(list(range(10)), [-100] + list(range(1, 10)), False)]
    # targets (labels[1:] != -100): 3 + 9 = 12; labels: 3 + 9 = 12; sequence (len - 1): 4 + 9 = 13
    assert _pool_total(enc, ([0, 1], 3), "targets", 1.0, 2) == pytest.approx(2.0)
    assert _pool_total(enc, ([0, 1], 1), "targets", 1.0, 1) == pytest.approx(12.0)
    assert _pool_total(enc, ([0, 1], 1), "sequence", 1.0, 1) == pytest.approx(13.0)
    assert _pool_total(enc, ([0], 1), "labels", 0.5, 1) == pytest.approx(1.5)
    assert _pool_total(enc, None, "targets", 1.0, 1) is None


# ---- ME's positions -------------------------------------------------------------------------------

def test_me_sequence_positions_count_every_real_token_end_to_end(monkeypatch, small_world, small_tok, trained_small):
    """unlearn with me positions "sequence": the loss sees a mask over every real next token (prompt included)."""
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.data.tokenize import collate, pad_id
    from obliviate.train.unlearn import encode_rows, unlearn

    seen = []
    spec = FORGET.get("me")

    def spy(policy, *, reduction="token"):
        seen.append(policy)
        return spec.fn(policy, reduction=reduction)

    monkeypatch.setitem(FORGET._items, "me", replace(spec, fn=spy))
    rows = small_world.splits["forget10"][:4]
    for positions in ("sequence", "answer"):
        model = copy.deepcopy(trained_small)
        unlearn(model, small_tok, rows, small_world.splits["retain90"][:4],
                MethodConfig(forget="me", forget_args={"positions": positions}, retain="nll", gamma=0.1),
                TrainConfig(max_steps=1, batch_size=4, progress=False), max_length=64)
    batch = collate(encode_rows(small_tok, rows, 64), pad_id(small_tok))
    real = int(batch["attention_mask"][:, 1:].sum())  # positions whose next token is real
    answer = int((batch["labels"][:, 1:] != -100).sum())
    assert [int(s.mask.sum()) for s in seen] == [real, answer] and real > answer
    assert seen[0].token_total == pytest.approx(real) and seen[1].token_total == pytest.approx(answer)
    with pytest.raises(ConfigError, match=r"positions must be one of \['answer', 'sequence', 'batch', 'max_length'\], "
                                          r"got 'all'"):
        spec.resolve({"positions": "all"})
