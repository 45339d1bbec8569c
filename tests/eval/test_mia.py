"""Membership inference: hand-computed scores and AUCs, then one run on the session's tiny model."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from obliviate.eval.generate import batched_avg_loss
from obliviate.eval.mia import (
    MIA_METRICS,
    TokenScores,
    attack_scores,
    document_logp,
    document_windows,
    encode_item,
    evaluate_mia,
    keeps_last_token,
    mia_auc,
    mia_from_scores,
    mia_scores,
    min_k_plus_plus_score,
    min_k_score,
    next_token_moments,
    reference_score,
    token_scores,
    zlib_score,
)
from obliviate.modeling.logprobs import IGNORE_INDEX

LN2 = math.log(2)


# ---------------------------------------------------------------- pure formulas, by hand
def test_min_k_by_hand():
    logp = np.array([-3.0, -1.0, -5.0, -2.0, -4.0])
    # k = 0.4 of 5 tokens -> floor(2.0) = 2 lowest: -5, -4 -> mean -4.5 -> score 4.5
    assert min_k_score(logp, 0.4) == pytest.approx(4.5)
    # k = 0.1 -> floor(0.5) = 0, kept at 1 token: -5 -> 5.0 (MUSE would average nothing: NaN)
    assert min_k_score(logp, 0.1) == pytest.approx(5.0)
    # k = 1 -> all five: mean -3 -> 3.0; k = 0.6 -> floor(3) = 3: -5, -4, -3 -> 4.0
    assert min_k_score(logp, 1.0) == pytest.approx(3.0)
    assert min_k_score(logp, 0.6) == pytest.approx(4.0)
    # 0.29 * 100 = 28.999999999999996 in floating point; the count is still 29 (values -1..-100: lowest 29
    # are -100..-72, mean -86)
    assert min_k_score(-np.arange(1.0, 101.0), 0.29) == pytest.approx(86.0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        min_k_score(logp, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        min_k_score(np.array([]), 0.4)


def test_next_token_moments_by_hand():
    # p = (1/2, 1/4, 1/4): log p = (-ln2, -2ln2, -2ln2)
    # mu = 1/2 (-ln2) + 1/2 (-2ln2) = -1.5 ln2; deviations +0.5ln2 (p 1/2), -0.5ln2 (p 1/2) -> var 0.25 ln2^2
    # -> sigma = 0.5 ln2.  Uniform 3-way: mu = -ln3, sigma 0.  A -inf entry (p 0) adds nothing: [0.5, 0.5, 0].
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]], dtype=torch.float64))
    mu, sigma = next_token_moments(lp)
    np.testing.assert_allclose(mu.numpy(), [-1.5 * LN2, -math.log(3), -LN2], atol=1e-12)
    np.testing.assert_allclose(sigma.numpy(), [0.5 * LN2, 0.0, 0.0], atol=1e-7)


def test_min_k_plus_plus_by_hand():
    # Two positions, both with p = (1/2, 1/4, 1/4): mu = -1.5 ln2, sigma = 0.5 ln2 (test above).
    # Token 1 has p 1/2: z = (-ln2 + 1.5ln2) / 0.5ln2 = +1; token 2 has p 1/4: z = (-2ln2 + 1.5ln2) / 0.5ln2 = -1
    logp, mu, sigma = np.array([-LN2, -2 * LN2]), np.full(2, -1.5 * LN2), np.full(2, 0.5 * LN2)
    # k = 0.5 -> 1 lowest z: -1 -> score 1;  k = 1 -> mean(1, -1) = 0 -> score 0
    assert min_k_plus_plus_score(logp, mu, sigma, 0.5) == pytest.approx(1.0)
    assert min_k_plus_plus_score(logp, mu, sigma, 1.0) == pytest.approx(0.0)
    # uniform distribution: logp = mu, sigma = 0 -> z = 0 / floor = 0, finite
    assert min_k_plus_plus_score(np.array([-math.log(3)]), np.array([-math.log(3)]), np.array([0.0]), 1.0) == 0.0
    # sigma 0 is floored at 1e-3 (open-unlearning clamps the variance at 1e-6): z = (-1 + 0.999) / 1e-3 = -1 -> 1
    assert min_k_plus_plus_score(np.array([-1.0]), np.array([-0.999]), np.array([0.0]), 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one shape"):
        min_k_plus_plus_score(logp, mu[:1], sigma, 0.5)


def test_zlib_and_reference_by_hand():
    text = "the cat sat on the mat " * 10 + "é"
    n_bytes = len(zlib.compress(text.encode("utf-8")))  # repetitive: far fewer than the 232 raw bytes
    assert n_bytes < 60
    assert zlib_score(2.0, text) == pytest.approx(2.0 / n_bytes)
    # loss - reference loss: [2 - 1.5, 3 - 3.5] = [0.5, -0.5]
    np.testing.assert_allclose(reference_score(np.array([2.0, 3.0]), np.array([1.5, 3.5])), [0.5, -0.5])
    with pytest.raises(ValueError, match="shape"):
        reference_score(np.array([1.0]), np.array([1.0, 2.0]))


def test_mia_auc_counts_pairs_by_hand():
    # AUC = P(score_nonmember > score_member), ties count 1/2 (scores: higher = less likely a member).
    # members [1, 2], nonmembers [3, 0.5]: 3>1 yes, 3>2 yes, 0.5>1 no, 0.5>2 no -> 2/4
    assert mia_auc(np.array([1.0, 2.0]), np.array([3.0, 0.5])) == pytest.approx(0.5)
    # members [1, 2], nonmembers [3, 1.5, 1]: 3>1, 3>2, 1.5>1 yes; 1.5>2 no; 1=1 tie 1/2; 1>2 no -> 3.5/6
    assert mia_auc(np.array([1.0, 2.0]), np.array([3.0, 1.5, 1.0])) == pytest.approx(3.5 / 6)
    # perfectly separated in the right direction -> 1; in the wrong direction -> 0
    assert mia_auc(np.array([0.1, 0.2]), np.array([1.0])) == 1.0
    assert mia_auc(np.array([1.0]), np.array([0.1, 0.2])) == 0.0
    with pytest.raises(ValueError, match="non-empty"):
        mia_auc(np.array([]), np.array([1.0]))
    with pytest.raises(ValueError, match="finite"):
        mia_auc(np.array([np.nan]), np.array([1.0]))


def test_attack_scores_from_token_arrays_by_hand():
    ts = TokenScores(logp=[np.array([-1.0, -2.0, -3.0, -4.0, -5.0]), np.array([-LN2, -2 * LN2])],
                     correct=[np.ones(5, bool), np.ones(2, bool)],
                     mu=[np.full(5, -3.0), np.full(2, -1.5 * LN2)], sigma=[np.full(5, 2.0), np.full(2, 0.5 * LN2)],
                     avg_loss=np.array([3.0, 1.5 * LN2]), texts=["abc", "abcabc"])
    out = attack_scores(ts, k=0.4, reference_loss=np.array([1.0, 0.0]))
    assert set(out) == {"loss", "zlib", "min_k", "min_k_plus_plus", "reference"}
    np.testing.assert_allclose(out["loss"], [3.0, 1.5 * LN2])
    # row 1: lowest 2 of 5 -> 4.5; row 2: floor(0.8) = 0 -> 1 token: 2 ln2
    np.testing.assert_allclose(out["min_k"], [4.5, 2 * LN2])
    # row 1: z = (logp + 3)/2 = 1, .5, 0, -.5, -1 -> lowest two mean -0.75 -> 0.75; row 2: lowest z -1 -> 1
    np.testing.assert_allclose(out["min_k_plus_plus"], [0.75, 1.0])
    n1, n2 = len(zlib.compress(b"abc")), len(zlib.compress(b"abcabc"))
    np.testing.assert_allclose(out["zlib"], [3.0 / n1, 1.5 * LN2 / n2])
    np.testing.assert_allclose(out["reference"], [2.0, 1.5 * LN2])
    assert "reference" not in attack_scores(ts)


def test_document_windows_by_hand():
    ids = [99, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # BOS then 9 tokens; window 4, stride 2
    wins = document_windows(ids, 4, 2)
    # starts 0, 2, 4, 6; each labels only ids past the previous end (4, 6, 8): every id after BOS exactly once
    assert [w.input_ids for w in wins] == [[99, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    x = IGNORE_INDEX
    assert [w.labels for w in wins] == [[x, 1, 2, 3], [x, x, 4, 5], [x, x, 6, 7], [x, x, 8, 9]]
    # stride 3: starts 0, 3, 6 -> ids[0:4], [3:7] labels 4..6 (past 4), [6:10] labels 7..9 (past 7)
    assert [w.labels for w in document_windows(ids, 4, 3)] == [[x, 1, 2, 3], [x, 4, 5, 6], [x, 7, 8, 9]]
    with pytest.raises(ValueError, match="stride < window"):
        document_windows(ids, 4, 4)  # no overlap: each window's first id would never be scored
    with pytest.raises(ValueError, match="at least 2"):
        document_windows([99], 4, 2)
    with pytest.raises(ValueError, match="unknown token_rule"):
        keeps_last_token("eos")


def test_document_logp_scores_whole_documents(small_tok, constant_lm):
    text = " ".join(["the"] * 300)  # 300 tokens: more than the old 256-token cut
    ids = small_tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 300 and len(set(ids[1:])) == 1 and ids[0] != ids[1]  # "the", then " the" 299 times
    model = constant_lm(len(small_tok), ids[1])
    log_z = math.log(math.exp(10) + len(small_tok) - 1)
    # after BOS: "the" is not the predicted token (-log Z), each " the" is (10 - log Z)
    expected = np.array([-log_z] + [10 - log_z] * 299)
    (whole,), n_windowed = document_logp(model, small_tok, [text], window=None)
    assert n_windowed == 0
    np.testing.assert_allclose(whole, expected, atol=1e-5)
    # windows of 64, stride 32 (default window // 2): the same 300 tokens, each once; 1 of 2 documents windowed
    (win, short), n_windowed = document_logp(model, small_tok, [text, "the the"], window=64, batch_size=3)
    assert n_windowed == 1 and len(short) == 2
    np.testing.assert_allclose(win, expected, atol=1e-5)
    # max_tokens keeps BOS + 9 ids -> 9 scores
    assert len(document_logp(model, small_tok, [text], window=None, max_tokens=10)[0][0]) == 9


def test_metrics_table():
    attacks = ("loss", "zlib", "min_k", "min_k_plus_plus", "reference")
    assert set(MIA_METRICS) == {f"mia_{a}_auc{gap}" for a in attacks for gap in ("", "_gap")}
    for name, info in MIA_METRICS.items():
        assert info.name == name and info.version >= 1 and info.description and not info.higher_is_better


def test_the_gap_is_two_sided():
    """An AUC far below 0.5 (members now stand out by a higher loss) leaks as much as one far above it."""
    members, nonmembers = np.array([5.0, 6.0, 7.0]), np.array([1.0, 2.0, 3.0])  # scores: higher = less likely a member
    low = mia_from_scores({"loss": np.concatenate([members, nonmembers])}, 3)
    high = mia_from_scores({"loss": np.concatenate([nonmembers, members])}, 3)
    assert (low["mia_loss_auc"], high["mia_loss_auc"]) == (0.0, 1.0)
    assert low["mia_loss_auc_gap"] == high["mia_loss_auc_gap"] == 0.5
    mixed = mia_from_scores({"loss": np.array([1.0, 3.0, 2.0, 4.0])}, 2)  # AUC 0.75 -> gap 0.25
    assert mixed["mia_loss_auc"] == 0.75 and mixed["mia_loss_auc_gap"] == 0.25


# ---------------------------------------------------------------- on the session's tiny model
def test_raw_text_is_bos_plus_all_tokens(small_tok):
    ids = small_tok("The author wrote", add_special_tokens=False)["input_ids"]
    for item in ("The author wrote", ("", "The author wrote")):
        enc = encode_item(small_tok, item, 64)
        assert enc.input_ids == [small_tok.bos_token_id] + ids
        assert enc.labels == [IGNORE_INDEX] + ids  # every text token counted, no EOS added
    assert encode_item(small_tok, "The author wrote", 2).input_ids == [small_tok.bos_token_id, ids[0]]
    with pytest.raises(ValueError, match="nothing to score"):
        encode_item(small_tok, "", 64)


def _items(world):
    rows = world.splits["full"][:5] + world.splits["holdout10"][:3]
    return rows + ["Brethen Bakemel was born in Eskar.", ("", "A novel about the sea and its long winter nights.")]


def test_batched_scores_equal_one_at_a_time(trained_small, small_tok, small_world):
    items = _items(small_world)
    batched = token_scores(trained_small, small_tok, items, batch_size=4, max_length=64)
    single = token_scores(trained_small, small_tok, items, batch_size=1, max_length=64)
    for field in ("logp", "mu", "sigma"):
        for a, b in zip(getattr(batched, field), getattr(single, field)):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(batched.correct, single.correct))
    np.testing.assert_allclose(batched.avg_loss, single.avg_loss, atol=1e-5)
    # on QA rows the LOSS score is exactly docs/METRICS.md §1.1 avg_loss
    pairs = [(r.question, r.answer) for r in items[:8]]
    np.testing.assert_allclose(batched.avg_loss[:8], batched_avg_loss(trained_small, small_tok, pairs, max_length=64),
                               atol=1e-6)
    s_b = mia_scores(trained_small, small_tok, items, batch_size=4, max_length=64)
    s_1 = mia_scores(trained_small, small_tok, items, batch_size=1, max_length=64)
    for attack in ("loss", "zlib", "min_k", "min_k_plus_plus"):
        np.testing.assert_allclose(s_b[attack], s_1[attack], atol=1e-5)
    assert all(s.shape == (len(items),) and np.all(np.isfinite(s)) for s in s_b.values())


def test_evaluate_mia_end_to_end(trained_small, small_tok, small_world):
    members, nonmembers = small_world.splits["full"], small_world.splits["holdout10"]
    out = evaluate_mia(trained_small, small_tok, members, nonmembers, batch_size=32, max_length=64)
    aucs = {k for k in out if k.endswith("_auc")}
    assert aucs | {f"{k}_gap" for k in aucs} == set(MIA_METRICS) - {"mia_reference_auc", "mia_reference_auc_gap"}
    assert "mia_reference_auc_gap" not in out  # absent, never invented
    assert all(out[f"{k}_gap"] == abs(out[k] - 0.5) for k in aucs)
    assert any("no reference model" in n for n in out["notes"])
    assert all(0.0 <= out[k] <= 1.0 for k in aucs)
    assert out["n_members"] == len(members) and out["n_nonmembers"] == len(nonmembers) and out["mia_k"] == 0.4
    assert out["mia_loss_auc"] > 0.5  # the model was fine-tuned on the members
    # the model as its own reference: every score is 0 (identical batches), all pairs tie -> AUC exactly 0.5
    few = evaluate_mia(trained_small, small_tok, members[:6], nonmembers[:4], reference_model=trained_small,
                       batch_size=32, max_length=64)
    assert few["mia_reference_auc"] == 0.5 and few["notes"] == []
    with pytest.raises(ValueError, match="members and nonmembers"):
        evaluate_mia(trained_small, small_tok, members, [])
