"""TOFU extraction strength / exact memorisation and MUSE PrivLeak: by hand, then on tiny models."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from obliviate.data.tokenize import answer_ids
from obliviate.eval.memorization import (
    MEMORIZATION_METRICS,
    evaluate_memorization,
    exact_memorization,
    exact_memorization_from_correct,
    extraction_strength,
    extraction_strength_from_correct,
    min_k_privleak_auc,
    privleak,
    privleak_auc,
)
from obliviate.eval.mia import mia_auc


# ---------------------------------------------------------------- pure formulas, by hand
@pytest.mark.parametrize("correct, es", [
    ([1, 1, 1], 1.0),          # k = 0: the whole answer follows from the prompt alone
    ([0, 1, 1], 1 - 1 / 3),    # k = 1: after the first gold token the rest is reproduced
    ([1, 0, 1], 1 - 2 / 3),    # k = 2: token 1 is wrong, so the rest must start at 2
    ([1, 1, 0], 0.0),          # the last token is wrong: only k = N (empty rest) qualifies
    ([0, 0, 0], 0.0),
    ([1], 1.0),
    ([0, 1, 1, 1], 0.75),      # k = 1 of 4
])
def test_extraction_strength_by_hand(correct, es):
    assert extraction_strength_from_correct(np.array(correct)) == pytest.approx(es)


def test_exact_memorization_by_hand():
    assert exact_memorization_from_correct(np.array([1, 0, 1, 1])) == pytest.approx(0.75)  # 3 of 4
    assert exact_memorization_from_correct(np.array([True, False, False])) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="non-empty"):
        exact_memorization_from_correct(np.array([]))
    with pytest.raises(ValueError, match="non-empty"):
        extraction_strength_from_correct(np.array([]))


def test_privleak_by_hand():
    # no retrained model: AUC_retrain = 0.5 -> (0.3 - 0.5) / 0.5 * 100 = -40, with a note saying so
    value, note = privleak(0.3)
    assert value == pytest.approx(-40.0) and "0.5" in note
    # (0.6 - 0.4) / 0.4 * 100 = 50, no note
    assert privleak(0.6, 0.4) == (pytest.approx(50.0), None)
    # MUSE NEWS retrain constant 0.4772: (0.4772 - 0.4772) -> 0
    assert privleak(0.4772, 0.4772)[0] == 0.0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        privleak(1.2)
    with pytest.raises(ValueError, match="undefined"):
        privleak(0.5, 0.0)


def test_privleak_auc_uses_muse_orientation():
    # P(score_forget > score_holdout), ties 1/2. forget [1, 2], holdout [3, 1.5, 1]:
    # 1>3 no, 1>1.5 no, 1=1 tie 1/2, 2>3 no, 2>1.5 yes, 2>1 yes -> 2.5/6
    f, h = np.array([1.0, 2.0]), np.array([3.0, 1.5, 1.0])
    assert privleak_auc(f, h) == pytest.approx(2.5 / 6)
    assert privleak_auc(f, h) == pytest.approx(1 - mia_auc(f, h))  # the attack AUC is 3.5/6
    # forget scored far lower (still known) -> AUC 0 -> PrivLeak -100 (under-unlearning, as MUSE's target)
    assert privleak(privleak_auc(np.array([0.1, 0.2]), np.array([1.0, 2.0])))[0] == pytest.approx(-100.0)


def test_metrics_table():
    assert {"forget_extraction_strength", "forget_exact_memorization", "privleak", "privleak_auc"} <= set(
        MEMORIZATION_METRICS)
    for name, info in MEMORIZATION_METRICS.items():
        assert info.name == name and info.version >= 1 and info.description
    assert not MEMORIZATION_METRICS["forget_extraction_strength"].higher_is_better


# ---------------------------------------------------------------- models
class ConstantLM(torch.nn.Module):
    """Predicts token `token` at every position (logits: 10 there, 0 elsewhere)."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.vocab, self.token = vocab, token
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # so model_device finds a device

    def forward(self, input_ids, attention_mask=None, **_):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., self.token] = 10.0
        return SimpleNamespace(logits=logits)


def test_constant_model_by_hand(small_tok, small_world):
    rows = small_world.splits["forget10"][:5]
    n = np.array([len(answer_ids(small_tok, r.question, r.answer)) for r in rows])  # N answer tokens incl. EOS
    eos = ConstantLM(len(small_tok), small_tok.eos_token_id)
    # always EOS: only the final answer token (EOS) is right -> correct = [0, ..., 0, 1]
    # -> k = N - 1, ES = 1 - (N-1)/N = 1/N; EM = 1/N  (answers hold no EOS before the end)
    # (max_length 128: no answer is cut, so every one still ends in EOS)
    np.testing.assert_allclose(extraction_strength(eos, small_tok, rows, batch_size=2, max_length=128), 1 / n)
    np.testing.assert_allclose(exact_memorization(eos, small_tok, rows, batch_size=2, max_length=128), 1 / n)
    pad = ConstantLM(len(small_tok), small_tok.pad_token_id)  # never right -> ES 0, EM 0
    assert not extraction_strength(pad, small_tok, rows, batch_size=3).any()
    assert not exact_memorization(pad, small_tok, rows, batch_size=3).any()


def test_batched_equals_one_at_a_time_and_em_bounds_es(trained_small, small_tok, small_world):
    rows = small_world.splits["forget10"] + small_world.splits["holdout10"][:3]
    es8 = extraction_strength(trained_small, small_tok, rows, batch_size=8, max_length=64)
    es1 = extraction_strength(trained_small, small_tok, rows, batch_size=1, max_length=64)
    em8 = exact_memorization(trained_small, small_tok, rows, batch_size=8, max_length=64)
    em1 = exact_memorization(trained_small, small_tok, rows, batch_size=1, max_length=64)
    np.testing.assert_array_equal(es8, es1)
    np.testing.assert_allclose(em8, em1)
    # all tokens from k on are right, so at least (N - k)/N of them are: EM >= ES
    assert np.all(em8 >= es8 - 1e-12) and np.all((0 <= es8) & (es8 <= 1))


def test_evaluate_memorization_end_to_end(trained_small, small_tok, small_world):
    forget, holdout = small_world.splits["forget10"], small_world.splits["holdout10"]
    kw = dict(batch_size=32, max_length=64)
    out = evaluate_memorization(trained_small, small_tok, forget, holdout, **kw)
    assert set(MEMORIZATION_METRICS) <= set(out)
    assert 0 <= out["forget_extraction_strength"] <= out["forget_exact_memorization"] <= 1
    assert out["privleak_auc_retrain"] is None and any("0.5" in n for n in out["notes"])
    assert out["privleak"] == pytest.approx((out["privleak_auc"] - 0.5) / 0.5 * 100)
    assert out["privleak_abs"] == abs(out["privleak"]) and out["privleak_k"] == 0.4
    # trained on the forget rows, never on the holdout rows: forget scores lower -> MUSE AUC < 0.5
    assert out["privleak_auc"] < 0.5 and out["privleak"] < 0
    assert min_k_privleak_auc(trained_small, small_tok, forget, holdout, **kw) == out["privleak_auc"]
    # raw texts (MUSE's privleak sets are plain passages): BOS + text, every token scored; still exposed
    raw = min_k_privleak_auc(trained_small, small_tok, [r.answer for r in forget], [r.answer for r in holdout], **kw)
    assert 0 <= raw < 0.5
    # its own retrained model: same AUC -> PrivLeak 0, no note
    same = evaluate_memorization(trained_small, small_tok, forget, holdout, retain_model=trained_small, **kw)
    assert same["privleak"] == 0.0 and same["privleak_auc_retrain"] == out["privleak_auc"] and same["notes"] == []
    given = evaluate_memorization(trained_small, small_tok, forget, holdout, auc_retrain=0.4772, **kw)
    assert given["privleak"] == pytest.approx((out["privleak_auc"] - 0.4772) / 0.4772 * 100)
    with pytest.raises(ValueError, match="not both"):
        evaluate_memorization(trained_small, small_tok, forget, holdout, retain_model=trained_small, auc_retrain=0.5)
