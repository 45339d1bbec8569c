"""TOFU extraction strength / exact memorisation and MUSE PrivLeak: by hand, then on tiny models."""
from __future__ import annotations

import math

import numpy as np
import pytest

from obliviate.data.tokenize import answer_ids
from obliviate.eval.memorization import (
    MEMORIZATION_METRICS,
    evaluate_memorization,
    exact_memorization,
    exact_memorization_from_correct,
    extraction_strength,
    extraction_strength_from_correct,
    forget_memorization,
    min_k_privleak_auc,
    privleak,
    privleak_auc,
)
from obliviate.eval.mia import drop_last_token, mia_auc, token_scores


# ---------------------------------------------------------------- pure formulas, by hand
@pytest.mark.parametrize("correct, es_reference, es_all", [
    ([1, 1, 1], 1.0, 1.0),              # k = 0: the whole answer follows from the prompt alone
    ([0, 1, 1], 1 - 1 / 3, 1 - 1 / 3),  # k = 1: after the first gold token the rest is reproduced
    ([1, 0, 1], 1 - 2 / 3, 1 - 2 / 3),  # k = 2: token 1 is wrong, so the rest must start at 2
    ([1, 1, 0], 1 / 3, 0.0),            # last wrong: open-unlearning's loop stops at k = N-1 = 2 -> 1/3;
    ([0, 0, 0], 1 / 3, 0.0),            #   with an empty rest allowed k = N = 3 -> 0
    ([1], 1.0, 1.0),
    ([0], 1.0, 0.0),                    # N = 1: the reference loop never moves past k = 0 -> 1 - 0/1
    ([0, 1, 1, 1], 0.75, 0.75),         # k = 1 of 4
])
def test_extraction_strength_by_hand(correct, es_reference, es_all):
    assert extraction_strength_from_correct(np.array(correct)) == pytest.approx(es_reference)
    assert extraction_strength_from_correct(np.array(correct), empty_rest=True) == pytest.approx(es_all)


def test_only_the_last_token_right_by_hand():
    # A 4-token answer (3 text tokens + EOS) where only the EOS is predicted.
    # all_tokens: correct [0, 0, 0, 1] -> EM 1/4; rest from k = 3 is right -> ES 1 - 3/4 = 0.25.
    # open_unlearning: the EOS is dropped -> [0, 0, 0] -> EM 0; k capped at N-1 = 2 -> ES 1 - 2/3 = 1/3.
    full = np.array([0, 0, 0, 1])
    assert exact_memorization_from_correct(full) == 0.25
    assert extraction_strength_from_correct(full, empty_rest=True) == 0.25
    cut = drop_last_token(full)
    assert exact_memorization_from_correct(cut) == 0.0
    assert extraction_strength_from_correct(cut) == pytest.approx(1 / 3)
    # forget_memorization applies the rule's ES search to already-cut vectors: mean over [1,1,0] and [0,1]
    # reference: ES 1/3 (k capped at 2) and 1/2 (k = 1) -> 5/12; EM 2/3 and 1/2 -> 7/12
    # all_tokens: ES 0 and 1/2 -> 1/4; EM unchanged 7/12
    vecs = [np.array([1, 1, 0]), np.array([0, 1])]
    assert forget_memorization(vecs) == pytest.approx({"forget_extraction_strength": 5 / 12,
                                                       "forget_exact_memorization": 7 / 12})
    assert forget_memorization(vecs, token_rule="all_tokens")["forget_extraction_strength"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unknown token_rule"):
        forget_memorization(vecs, token_rule="eos")


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
    # AUC_retrain 0: division by zero -> no number, a note that says why (never an invented value)
    value, note = privleak(0.5, 0.0)
    assert value is None and "undefined" in note


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
def test_constant_model_by_hand(small_tok, small_world, constant_lm):
    rows = small_world.splits["forget10"][:5]
    n = np.array([len(answer_ids(small_tok, r.question, r.answer)) for r in rows])  # N answer tokens incl. EOS
    eos = constant_lm(len(small_tok), small_tok.eos_token_id)
    # always EOS: only the final answer token (EOS) is right -> correct = [0, ..., 0, 1]
    # (max_length 128: no answer is cut, so every one still ends in EOS; answers hold no EOS before the end)
    # all_tokens: k = N - 1 -> ES = 1 - (N-1)/N = 1/N; EM = 1/N
    kw = dict(batch_size=2, max_length=128)
    np.testing.assert_allclose(extraction_strength(eos, small_tok, rows, token_rule="all_tokens", **kw), 1 / n)
    np.testing.assert_allclose(exact_memorization(eos, small_tok, rows, token_rule="all_tokens", **kw), 1 / n)
    # open_unlearning (default): the EOS is dropped -> N-1 wrong tokens: EM 0; ES 1 - (N-2)/(N-1) = 1/(N-1)
    np.testing.assert_allclose(exact_memorization(eos, small_tok, rows, **kw), 0.0)
    np.testing.assert_allclose(extraction_strength(eos, small_tok, rows, **kw), 1 / (n - 1))
    pad = constant_lm(len(small_tok), small_tok.pad_token_id)  # never right -> EM 0; ES 0 (all) or 1/(N-1)
    assert not exact_memorization(pad, small_tok, rows, batch_size=3, token_rule="all_tokens").any()
    assert not extraction_strength(pad, small_tok, rows, batch_size=3, token_rule="all_tokens").any()
    np.testing.assert_allclose(extraction_strength(pad, small_tok, rows, **kw), 1 / (n - 1))


def test_last_token_rule_cuts_min_k_inputs_not_the_loss(small_tok, small_world, constant_lm):
    rows = small_world.splits["forget10"][:3]
    n = [len(answer_ids(small_tok, r.question, r.answer)) for r in rows]
    eos = constant_lm(len(small_tok), small_tok.eos_token_id)
    # logits 10 on EOS, 0 elsewhere: log Z = log(e^10 + V - 1); log p(EOS) = 10 - log Z, any other -log Z
    log_z = math.log(math.exp(10) + len(small_tok) - 1)
    ref = token_scores(eos, small_tok, rows, max_length=128)
    full = token_scores(eos, small_tok, rows, max_length=128, token_rule="all_tokens")
    for i, ni in enumerate(n):
        np.testing.assert_allclose(ref.logp[i], np.full(ni - 1, -log_z), atol=1e-5)  # EOS (10 - log Z) dropped
        np.testing.assert_allclose(full.logp[i], [-log_z] * (ni - 1) + [10 - log_z], atol=1e-5)
        assert len(ref.mu[i]) == len(ref.sigma[i]) == ni - 1 and len(full.mu[i]) == ni
    # LOSS / zlib keep every token under both rules: avg_loss = log Z - 10/N
    np.testing.assert_allclose(ref.avg_loss, [log_z - 10 / ni for ni in n], atol=1e-5)
    np.testing.assert_allclose(full.avg_loss, ref.avg_loss)
    # a raw text is never cut: BOS + text, every text token scored under either rule
    text = "Brethen Bakemel was born in Eskar."
    m = len(small_tok(text, add_special_tokens=False)["input_ids"])
    assert len(token_scores(eos, small_tok, [text]).logp[0]) == m


def test_batched_equals_one_at_a_time_and_em_bounds_es(trained_small, small_tok, small_world):
    rows = small_world.splits["forget10"] + small_world.splits["holdout10"][:3]
    es8 = extraction_strength(trained_small, small_tok, rows, batch_size=8, max_length=64)
    es1 = extraction_strength(trained_small, small_tok, rows, batch_size=1, max_length=64)
    em8 = exact_memorization(trained_small, small_tok, rows, batch_size=8, max_length=64)
    em1 = exact_memorization(trained_small, small_tok, rows, batch_size=1, max_length=64)
    np.testing.assert_array_equal(es8, es1)
    np.testing.assert_allclose(em8, em1)
    # all_tokens: every token from k on is right, so at least (N - k)/N are: EM >= ES. (open_unlearning reports
    # ES = 1/N when no rest is reproduced, so there only EM >= ES - 1/N holds.)
    es_all = extraction_strength(trained_small, small_tok, rows, batch_size=8, max_length=64, token_rule="all_tokens")
    em_all = exact_memorization(trained_small, small_tok, rows, batch_size=8, max_length=64, token_rule="all_tokens")
    assert np.all(em_all >= es_all - 1e-12) and np.all((0 <= es8) & (es8 <= 1))


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
