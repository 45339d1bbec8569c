"""Forget objectives and retain terms: values worked out by hand, masking, registry errors."""
import math

import pytest
import torch

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import TokenStats, token_stats
from obliviate.objectives import FORGET, RETAIN


def stats(probs, mask):
    """TokenStats from explicit next-token distributions [B, T, V] and a mask [B, T]."""
    logits = torch.tensor(probs, dtype=torch.float64).log()
    mask = torch.tensor(mask, dtype=torch.bool)
    return TokenStats(logits=logits, token_logp=torch.zeros(mask.shape, dtype=torch.float64), mask=mask)


def test_asu_hand_value():
    # teacher (0.5, 0.5), student (0.25, 0.75): KL = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.143841
    teacher, student = stats([[[0.5, 0.5]]], [[1]]), stats([[[0.25, 0.75]]], [[1]])
    got = FORGET.get("asu").fn(student, teacher)
    assert got.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-9)


def test_asu_ignores_masked_positions_and_averages_per_example():
    # example 0: one counted token with KL k1, then a masked position with a huge KL that must not count;
    # example 1: two counted tokens, KL k1 and 0 -> per-example means k1 and k1/2 -> batch mean 0.75 k1
    k1 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    teacher = stats([[[0.5, 0.5], [0.999, 0.001]], [[0.5, 0.5], [0.3, 0.7]]], [[1, 0], [1, 1]])
    student = stats([[[0.25, 0.75], [0.001, 0.999]], [[0.25, 0.75], [0.3, 0.7]]], [[1, 0], [1, 1]])
    got = FORGET.get("asu").fn(student, teacher)
    assert got.item() == pytest.approx(0.75 * k1, abs=1e-9)


def test_ga_and_nll_hand_values():
    # token log-probs -1, -2 counted, a padded position (-50) not: NLL = 1.5, GA = -1.5
    s = TokenStats(logits=None, token_logp=torch.tensor([[-1.0, -2.0, -50.0]]), mask=torch.tensor([[True, True, False]]))
    assert FORGET.get("ga").fn(s).item() == pytest.approx(-1.5)
    assert RETAIN.get("nll").fn(s).item() == pytest.approx(1.5)


def test_retain_kl_is_zero_for_identical_and_hand_value():
    ref, pol = stats([[[0.5, 0.5]]], [[1]]), stats([[[0.25, 0.75]]], [[1]])
    assert RETAIN.get("kl").fn(ref, ref).item() == pytest.approx(0.0, abs=1e-12)
    assert RETAIN.get("kl").fn(pol, ref).item() == pytest.approx(0.143841, abs=1e-6)


def test_kl_from_real_logits_never_counts_prompt_or_padding():
    torch.manual_seed(0)
    labels = torch.tensor([[-100, -100, 5, 6, -100]])  # prompt, prompt, answer, answer, pad
    a, b = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    b2 = b.clone()
    b2[0, 0], b2[0, 3:] = torch.randn(8), torch.randn(2, 8)  # change only logits whose targets are not answers
    v1 = RETAIN.get("kl").fn(token_stats(b, labels), token_stats(a, labels))
    v2 = RETAIN.get("kl").fn(token_stats(b2, labels), token_stats(a, labels))
    assert v1.item() == pytest.approx(v2.item(), abs=1e-6)


def test_hyperparameter_typo_names_valid_keys():
    with pytest.raises(ConfigError, match=r"valid keys: \['layers', 'tau'\]"):
        FORGET.get("asu").resolve({"taus": 2.0})


def test_unknown_objective_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: .*asu.*ga"):
        FORGET.get("gradient_ascent")


@pytest.mark.parametrize("name", FORGET.names())
def test_every_forget_objective_returns_finite_scalar(name, small_tok, trained_small):
    """Contract: every registered objective gives a finite scalar with a gradient to the student only."""
    from obliviate.data.tokenize import collate, encode_qa, pad_id
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.modeling.logprobs import forward_stats

    spec = FORGET.get(name)
    kw, tkw = spec.resolve({})
    batch = collate([encode_qa(small_tok, "Who is Ann?", "Ann is a writer.", 64)], pad_id(small_tok))
    student = trained_small
    frozen = FrozenModels(student, {**tkw, "tau": 3.0} if "teacher" in spec.needs else None)
    extra = {}
    if "teacher" in spec.needs:
        extra["teacher"] = frozen.teacher_stats(batch)
    if "reference" in spec.needs:
        extra["reference"] = frozen.reference_stats(batch)
    student.zero_grad()
    loss = spec.fn(forward_stats(student, batch), **extra, **kw)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert all(p.grad is None for p in frozen.model.parameters())
    student.zero_grad()
