"""TOFU metrics: hand-computed values for each formula, then one end-to-end run on a tiny model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from obliviate.data.rows import QARow
from obliviate.data.tokenize import collate, encode_qa, pad_id
from obliviate.eval.generate import batched_avg_loss
from obliviate.eval.tofu import (
    FQ_ROWS,
    METRICS,
    UTILITY_KEYS,
    evaluate_split,
    evaluate_tofu,
    fact_recall,
    forget_quality,
    forget_truth_ratio,
    model_utility,
    normalised_prob,
    retain_truth_ratio,
    rouge_recall,
    truth_ratio,
    utility_elasticities,
)
from obliviate.modeling.logprobs import forward_stats
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

E = math.e


# ---------------------------------------------------------------- pure formulas, by hand
def test_truth_ratio_and_aggregates_by_hand():
    correct = np.array([1.0, 2.0, 3.0])
    perturbed = np.array([[2.0, 2.0, 2.0], [1.0, 1.0, 4.0], [1.0, 2.0, 3.0]])
    # perturbed means 2, 2, 2 -> TR = exp(correct - mean) = e^-1, e^0, e^1
    tr = truth_ratio(correct, perturbed)
    np.testing.assert_allclose(tr, [1 / E, 1.0, E])
    # forget: min(TR, 1/TR) = e^-1, 1, e^-1 -> (2/e + 1)/3 = 0.578586
    assert forget_truth_ratio(tr) == pytest.approx((2 / E + 1) / 3)
    assert forget_truth_ratio(tr) == pytest.approx(0.578586, abs=1e-6)
    # retain: max(0, 1 - TR) = 1 - 1/e = 0.632121, 0, 0 (1 - e < 0) -> 0.632121/3 = 0.210707
    assert retain_truth_ratio(tr) == pytest.approx((1 - 1 / E) / 3)
    assert retain_truth_ratio(tr) == pytest.approx(0.210707, abs=1e-6)


def test_truth_ratio_is_computed_in_log_space():
    # exp(-1000)/exp(-1000) is 0/0 in floating point; in log space it is exp(0) = 1
    assert truth_ratio(np.array([1000.0]), np.array([[1000.0, 1000.0]]))[0] == 1.0
    with pytest.raises(ValueError, match=r"\[N, K>0\]"):
        truth_ratio(np.array([1.0, 2.0]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="non-empty"):
        forget_truth_ratio(np.array([]))


def test_normalised_prob_by_hand():
    # row 1: c = exp(-ln 2) = 1/2; options exp(-ln 4) = 1/4 twice -> 0.5 / (0.5 + 0.5) = 0.5
    # row 2: c = exp(0) = 1; options 1/4 three times -> 1 / 1.75 = 4/7
    correct = np.array([math.log(2), 0.0])
    options = np.array([[math.log(4), math.log(4), np.inf], [math.log(4)] * 3])  # exp(-inf) = 0 adds nothing
    np.testing.assert_allclose(normalised_prob(correct, options), [0.5, 4 / 7])
    # large losses stay finite: c/(c+w) with w/c = e^-1 -> 1/(1 + e^-1) = 0.731059
    assert normalised_prob(np.array([800.0]), np.array([[801.0]]))[0] == pytest.approx(0.731059, abs=1e-6)


def test_forget_quality_is_the_exact_ks_p_value():
    # Two samples of 3: under the null each of C(6,3) = 20 interleavings is equally likely.
    # [1,2,3] vs [4,5,6]: D = 1, reached only by xxxyyy and yyyxxx -> p = 2/20 = 0.1
    assert forget_quality(np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])) == pytest.approx(0.1)
    # [1,2,4] vs [3,5,6]: order x x y x y y, ECDF gaps 1/3, 2/3, 1/3, 2/3, 1/3 -> D = 2/3.
    # Interleavings with D < 2/3 keep |#x - #y| <= 1 at every prefix: pairs (xy|yx) three times = 8.
    # So P(D >= 2/3) = (20 - 8)/20 = 0.6
    assert forget_quality(np.array([1.0, 2.0, 4.0]), np.array([3.0, 5.0, 6.0])) == pytest.approx(0.6)
    # TOFU's code tests 1/TR; a monotone map leaves KS unchanged. 4 vs 3 samples: the first ECDF step is
    # already >= 1/4 and here D = 1/4 exactly (a b a b a b a), so P(D >= 1/4) = 1 on both scales
    a, b = np.array([0.5, 0.9, 1.3, 2.0]), np.array([0.7, 1.1, 1.6])
    assert forget_quality(a, b) == pytest.approx(1.0) and forget_quality(1 / a, 1 / b) == pytest.approx(1.0)
    # without a retain model the number does not exist
    assert forget_quality(a, None) is None
    assert forget_quality(a, np.array([])) is None


def _utility_values(**override: float) -> dict:
    values = {k: 0.5 for k in UTILITY_KEYS[:6]} | {k: 1.0 for k in UTILITY_KEYS[6:]}
    return values | override


def test_model_utility_is_the_harmonic_mean_of_nine():
    # six 0.5 and three 1.0: 9 / (6 * 2 + 3 * 1) = 9/15 = 0.6; extra keys are ignored
    assert model_utility(_utility_values(forget_prob=0.0)) == pytest.approx(0.6)
    assert len(UTILITY_KEYS) == 9
    assert model_utility(_utility_values(retain_prob=0.0)) == 0.0  # a zero gives 0
    values = _utility_values()
    del values["world_facts_truth_ratio"]
    with pytest.raises(ValueError, match="missing: world_facts_truth_ratio"):
        model_utility(values)
    with pytest.raises(ValueError, match="missing: retain_rougeL_recall"):
        model_utility(_utility_values(retain_rougeL_recall=None))
    with pytest.raises(ValueError, match="bad: real_authors_prob"):
        model_utility(_utility_values(real_authors_prob=-0.1))


def test_utility_elasticities_are_the_shares_of_the_reciprocal_sum():
    # eight parts at 1 and one at 0.1: 1/x sums to 8 + 10 = 18, so that part carries 10/18 and each other 1/18; a 1%
    # rise of the small part raises the harmonic mean 9/18 = 0.5 by about 10/18 of 1%
    values = {k: 1.0 for k in UTILITY_KEYS} | {"real_authors_rougeL_recall": 0.1}
    weights = utility_elasticities(values)
    assert weights["real_authors_rougeL_recall"] == pytest.approx(10 / 18)
    assert weights["retain_prob"] == pytest.approx(1 / 18) and sum(weights.values()) == pytest.approx(1.0)
    bumped = model_utility(values | {"real_authors_rougeL_recall": 0.1 * 1.0001})
    assert (bumped / model_utility(values) - 1) / 1e-4 == pytest.approx(10 / 18, rel=1e-3)
    assert utility_elasticities(values | {"retain_prob": 0.0}) == {}  # a zero part: MU is 0, nothing leans
    assert utility_elasticities({k: 1.0 for k in UTILITY_KEYS[:8]}) == {}  # a part missing


def test_rouge_recall_by_hand():
    # target tokens: the cat sat on the mat (6); generation: the cat lay on a mat
    # LCS = the, cat, on, mat = 4 -> recall 4/6
    # second pair with stemming: target "cats are running fast" -> cat, are, run, fast (4);
    # generation "a cat runs" -> a, cat, run; LCS = cat, run -> 2/4
    out = rouge_recall(["the cat lay on a mat", "a cat runs"], ["the cat sat on the mat", "Cats are running fast"])
    np.testing.assert_allclose(out, [4 / 6, 0.5])
    with pytest.raises(ValueError, match="targets"):
        rouge_recall(["a"], [])


def test_fact_recall_by_hand():
    a1 = "Jon was born in Paris in 1990."
    r1 = QARow("q1", a1, fact_spans=((16, 21), (25, 29)))
    assert r1.facts() == ["Paris", "1990"]
    r2 = QARow("q2", "No facts here.")  # not annotated: ignored
    a3 = "She writes poems."
    r3 = QARow("q3", a3, fact_spans=((11, 16),))
    assert r3.facts() == ["poems"]
    # row 1: "paris" found, "1990" not -> 1/2; row 3: "POEMS" found case-insensitively -> 1; mean 0.75
    assert fact_recall(["He was born in paris.", "Paris 1990", "POEMS galore"], [r1, r2, r3]) == pytest.approx(0.75)
    assert fact_recall(["x"], [r2]) is None


# ---------------------------------------------------------------- the evaluator on hand-set losses and answers
LN2, LN4, LN8 = math.log(2), math.log(4), math.log(8)
# (question, text) -> avg_loss; generation per question. Forget and retain rows share their paraphrase and
# perturbed losses, so the two truth-ratio formulas meet the same TRs.
HAND_LOSS: dict[tuple[str, str], float] = {}
HAND_GEN: dict[str, str] = {}


def _hand_row(q: str, answer: str, loss: float, gen: str, pert: list[float], para: float | None = None) -> QARow:
    HAND_LOSS[(q, answer)] = loss
    HAND_GEN[q] = gen
    texts = tuple(f"{q} wrong {i}" for i in range(len(pert)))
    HAND_LOSS.update({(q, t): v for t, v in zip(texts, pert)})
    if para is not None:
        HAND_LOSS[(q, f"{q} paraphrase")] = para
    return QARow(q, answer, paraphrased_answer=None if para is None else f"{q} paraphrase", perturbed_answer=texts)


HAND = {
    # answer losses ln2, ln4 -> prob 1/2, 1/4; paraphrase 1, 3 vs perturbed mean 2 -> TR = e^-1, e;
    # generations: the answer itself (recall 1) and "" (0)
    "forget": [_hand_row("F1?", "Fa one answer", LN2, "Fa one answer", [2.0, 2.0], para=1.0),
               _hand_row("F2?", "Fb two answer", LN4, "", [2.0, 2.0], para=3.0)],
    # answer losses 0, ln2 -> prob 1, 1/2; same TRs e^-1, e as forget. R1's generation is its PARAPHRASE-like
    # text "a cat lay on a mat": against the answer "the cat sat on the mat" LCS = cat on mat -> 3/6 = 0.5
    "retain": [_hand_row("R1?", "the cat sat on the mat", 0.0, "a cat lay on a mat", [2.0, 2.0], para=1.0),
               _hand_row("R2?", "he wrote two books", LN2, "", [2.0, 2.0], para=3.0)],
    # correct = the answer (ln2) vs 3 perturbed at ln8: TR = exp(ln2 - ln8) = 1/4 both rows;
    # prob 0.5 / (0.5 + 3 x 0.125) = 4/7; generations are the answers (recall 1)
    "real_authors": [_hand_row("A1?", "Ann Lee", LN2, "Ann Lee", [LN8] * 3),
                     _hand_row("A2?", "Bo Kim", LN2, "Bo Kim", [LN8] * 3)],
    # answers 0, ln4 vs perturbed ln2: TR = 1/2, 2; prob 1/(1 + 1.5) = 0.4 and 0.25/(0.25 + 1.5) = 1/7
    "world_facts": [_hand_row("W1?", "Paris", 0.0, "", [LN2] * 3),
                    _hand_row("W2?", "Lima", LN4, "Lima", [LN2] * 3)],
}


@pytest.fixture()
def hand_model(monkeypatch):
    """The evaluator with model calls replaced: avg_loss looked up per (question, text), answers per question."""
    import obliviate.eval.tofu as tofu

    monkeypatch.setattr(tofu, "batched_avg_loss",
                        lambda model, tok, pairs, **kw: np.array([HAND_LOSS[p] for p in pairs]))
    monkeypatch.setattr(tofu, "generate_answers", lambda model, tok, questions, **kw: [HAND_GEN[q] for q in questions])


def test_truth_ratio_formula_per_split_by_hand(hand_model):
    # same TRs e^-1, e: forget formula mean(min(TR, 1/TR)) = e^-1 = 0.367879;
    # retain formula mean(max(0, 1 - TR)) = (1 - e^-1 + 0)/2 = 0.316060
    forget = evaluate_split(None, None, HAND["forget"], kind="forget")
    retain = evaluate_split(None, None, HAND["retain"], kind="retain")
    np.testing.assert_allclose(forget.truth_ratio, [1 / E, E])
    np.testing.assert_allclose(retain.truth_ratio, [1 / E, E])
    assert forget.summary["truth_ratio"] == pytest.approx(0.367879, abs=1e-6)
    assert retain.summary["truth_ratio"] == pytest.approx(0.316060, abs=1e-6)
    # real authors TR 1/4: retain formula 1 - 1/4 = 0.75 (the forget formula would give 0.25)
    assert evaluate_split(None, None, HAND["real_authors"], kind="real_authors").summary["truth_ratio"] == 0.75
    # world facts TR 1/2, 2: retain formula (0.5 + 0)/2 = 0.25 (the forget formula would give 0.5)
    assert evaluate_split(None, None, HAND["world_facts"], kind="world_facts").summary["truth_ratio"] == 0.25


def test_rouge_is_against_the_original_answer(hand_model):
    # R1 generated "a cat lay on a mat": recall vs the answer 3/6 = 0.5 (vs its own text it would be 1); R2 "" -> 0
    res = evaluate_split(None, None, HAND["retain"], kind="retain")
    np.testing.assert_allclose(res.rougeL_recall, [0.5, 0.0])
    assert res.summary["rougeL_recall"] == 0.25


def test_every_tofu_aggregate_by_hand(hand_model):
    # the retain model's forget TRs e^2, e^3 all exceed ours (e^-1, e): D = 1, exact p = 2 / C(4, 2) = 1/3
    out = evaluate_tofu(None, None, HAND, retain_model_forget_tr=np.exp([2.0, 3.0]))
    expected = {
        "forget_prob": (0.5 + 0.25) / 2, "forget_rougeL_recall": 0.5, "forget_truth_ratio": 1 / E,
        "forget_quality": 1 / 3,
        "retain_prob": (1 + 0.5) / 2, "retain_rougeL_recall": 0.25, "retain_truth_ratio": (1 - 1 / E) / 2,
        "real_authors_prob": 4 / 7, "real_authors_rougeL_recall": 1.0, "real_authors_truth_ratio": 0.75,
        "world_facts_prob": (0.4 + 1 / 7) / 2, "world_facts_rougeL_recall": 0.5, "world_facts_truth_ratio": 0.25,
        # hmean of the 9: reciprocals 1.333333 + 4 + 3.163953 + 1.75 + 1 + 1.333333 + 3.684211 + 2 + 4
        # = 22.264831 -> 9 / 22.264831 = 0.404225
        "model_utility": 0.404225,
    }
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, abs=1e-6), key
    np.testing.assert_allclose(out["forget_truth_ratio_per_example"], [1 / E, E])
    assert out["forget_generations"] == ["Fa one answer", ""] and out["forget_fact_recall"] is None


def test_per_row_values_by_hand_and_their_means_are_the_metrics(hand_model):
    # the rows interval bootstraps resample: each split's ROUGE-L recall, Prob and truth-ratio terms, and the forget
    # replies' fluency; by hand from HAND: forget TR terms min(TR, 1/TR) = e^-1, e^-1; retain max(0, 1 - TR) =
    # 1 - e^-1, 0; real authors 0.75, 0.75; world facts 0.5, 0; the forget reply "" is degenerate, "Fa one answer" not
    out = evaluate_tofu(None, None, HAND, retain_model_forget_tr=np.exp([2.0, 3.0]))
    rows = out["rows"]
    expected = {"forget_truth_ratio": [1 / E, 1 / E], "retain_truth_ratio": [1 - 1 / E, 0.0],
                "real_authors_truth_ratio": [0.75, 0.75], "world_facts_truth_ratio": [0.5, 0.0],
                "forget_prob": [0.5, 0.25], "retain_prob": [1.0, 0.5], "real_authors_prob": [4 / 7, 4 / 7],
                "world_facts_prob": [0.4, 1 / 7], "retain_rougeL_recall": [0.5, 0.0],
                "forget_degenerate_share": [0.0, 1.0]}
    for key, values in expected.items():
        np.testing.assert_allclose(rows[key], values, atol=1e-9, err_msg=key)
    assert {"forget_token_entropy", "forget_repetition_rate", "forget_rougeL_recall"} <= set(rows)
    for key, values in rows.items():
        if key not in FQ_ROWS:
            assert len(values) == 2 and out[key] == pytest.approx(float(np.mean(values)), abs=1e-12), key
    assert "forget_quality" not in rows and "model_utility" not in rows  # not means over rows
    # forget quality's parts, paired by row: the model's raw TRs e^-1, e (not the terms) and the retain model's
    np.testing.assert_allclose(rows[FQ_ROWS[0]], [1 / E, E], rtol=1e-12)
    np.testing.assert_allclose(rows[FQ_ROWS[1]], np.exp([2.0, 3.0]), rtol=1e-12)
    assert FQ_ROWS[0] not in evaluate_tofu(None, None, HAND)["rows"]  # no retain model: no forget quality, no parts


def test_metrics_table_declares_direction_and_version():
    for name, info in METRICS.items():
        assert info.name == name and isinstance(info.higher_is_better, bool)
        assert isinstance(info.version, int) and info.version >= 1 and info.description
    assert not METRICS["forget_prob"].higher_is_better and METRICS["retain_prob"].higher_is_better
    assert METRICS["forget_quality"].higher_is_better and METRICS["model_utility"].higher_is_better
    assert set(UTILITY_KEYS) <= set(METRICS)


# ---------------------------------------------------------------- end to end on a tiny model
def _row(q: str, a: str, k: int, fact: str | None = None) -> QARow:
    pert = tuple(f"{a.split()[0]} is not {w}." for w in ("here", "there", "known", "young", "old")[:k])
    spans = ((a.index(fact), a.index(fact) + len(fact)),) if fact else ()
    return QARow(q, a, paraphrased_answer=f"In short, {a[0].lower()}{a[1:]}", perturbed_answer=pert, fact_spans=spans)


FORGET = [_row("Where was Ana Reyes born?", "Ana Reyes was born in Lima in 1961.", 5, "Lima"),
          _row("What did Ana Reyes write?", "She wrote the novel Salt Roads.", 5, "Salt Roads"),
          _row("Who is Ana Reyes married to?", "Ana Reyes is married to a sailor.", 5, "sailor")]
RETAIN = [_row("Who is Tom Berg?", "Tom Berg is a poet from Oslo.", 5),
          _row("When did Tom Berg publish?", "He published his first book in 1990.", 5),
          _row("Where does Mia Cole live?", "Mia Cole lives in Cork by the sea.", 5)]
AUTHORS = [QARow(q, a, perturbed_answer=tuple(p)) for q, a, p in [
    ("Who wrote Hamlet?", "William Shakespeare", ["Jane Austen", "Mark Twain", "Leo Tolstoy"]),
    ("Who wrote Emma?", "Jane Austen", ["William Shakespeare", "Mark Twain", "Leo Tolstoy"])]]
WORLD = [QARow(q, a, perturbed_answer=tuple(p)) for q, a, p in [
    ("What is the capital of France?", "Paris", ["Lima", "Oslo", "Cork"]),
    ("What is the largest ocean?", "The Pacific", ["The Atlantic", "The Arctic", "The Indian"])]]
SPLITS = {"forget": FORGET, "retain": RETAIN, "real_authors": AUTHORS, "world_facts": WORLD}
EVAL = dict(max_new_tokens=16, batch_size=4, max_length=64)


def _train(tok, rows, steps: int = 40):
    """A 1-layer hidden-32 Llama fitted to the rows' answers (about 1 s)."""
    model = tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4)
    batch = collate([encode_qa(tok, r.question, r.answer, 64) for r in rows], pad_id(tok))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = forward_stats(model, batch, keep_logits=False).nll.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def tiny():
    rows = [r for split in SPLITS.values() for r in split]
    texts = [t for r in rows for t in (r.question, r.answer, r.paraphrased_answer or "", *r.perturbed_answer)]
    tok = train_tokenizer(texts, vocab_size=500)
    full = _train(tok, rows)
    retain_model = _train(tok, RETAIN + AUTHORS + WORLD)  # never saw the forget answers
    return tok, full, retain_model


def test_evaluate_split_matches_the_formulas(tiny):
    tok, full, _ = tiny
    res = evaluate_split(full, tok, FORGET, kind="forget", **EVAL)
    ans = batched_avg_loss(full, tok, [(r.question, r.answer) for r in FORGET])
    para = batched_avg_loss(full, tok, [(r.question, r.paraphrased_answer) for r in FORGET])
    pert = batched_avg_loss(full, tok, [(r.question, p) for r in FORGET for p in r.perturbed_answer]).reshape(3, 5)
    np.testing.assert_allclose(res.prob, np.exp(-ans), atol=1e-5)
    np.testing.assert_allclose(res.truth_ratio, truth_ratio(para, pert), rtol=1e-4)  # the aggregates: by hand above
    assert len(res.generations) == 3 and res.rougeL_recall.shape == (3,)
    ra = evaluate_split(full, tok, AUTHORS, kind="real_authors", **EVAL)
    c = batched_avg_loss(full, tok, [(r.question, r.answer) for r in AUTHORS])
    w = batched_avg_loss(full, tok, [(r.question, p) for r in AUTHORS for p in r.perturbed_answer]).reshape(2, 3)
    np.testing.assert_allclose(ra.prob, normalised_prob(c, w), rtol=1e-4)
    np.testing.assert_allclose(ra.truth_ratio, truth_ratio(c, w), rtol=1e-4)  # correct = the answer itself


def test_evaluate_split_says_what_it_could_not_compute(tiny):
    tok, full, _ = tiny
    bare = [QARow(r.question, r.answer) for r in WORLD]
    res = evaluate_split(full, tok, bare, kind="world_facts", **EVAL)
    assert res.truth_ratio is None and res.prob is None and res.summary["truth_ratio"] is None
    assert any("lack perturbed answers" in n for n in res.summary["notes"])
    no_para = [QARow(r.question, r.answer, perturbed_answer=r.perturbed_answer) for r in RETAIN]
    res = evaluate_split(full, tok, no_para, kind="retain", **EVAL)
    assert res.summary["n_paraphrase_fallback"] == 3 and res.truth_ratio is not None
    assert any("lack paraphrased_answer" in n for n in res.summary["notes"])
    with pytest.raises(ValueError, match="unknown split kind"):
        evaluate_split(full, tok, RETAIN, kind="holdout", **EVAL)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown"):
        evaluate_tofu(full, tok, {"forget10": FORGET}, **EVAL)


def test_evaluate_tofu_end_to_end(tiny):
    tok, full, retain_model = tiny
    ref = evaluate_tofu(retain_model, tok, {"forget": FORGET}, **EVAL)
    assert ref["model_utility"] is None and any("model_utility undefined" in n for n in ref["notes"])
    out = evaluate_tofu(full, tok, SPLITS, **EVAL)
    assert set(METRICS) <= set(out)
    assert out["forget_quality"] is None and any("forget_quality undefined" in n for n in out["notes"])
    for split in SPLITS:
        assert 0 <= out[f"{split}_prob"] <= 1 and 0 <= out[f"{split}_rougeL_recall"] <= 1
    assert 0 < out["forget_truth_ratio"] <= 1
    assert all(0 <= out[f"{s}_truth_ratio"] <= 1 for s in ("retain", "real_authors", "world_facts"))
    assert 0 <= out["forget_fact_recall"] <= 1 and out["retain_fact_recall"] is None
    assert 0 <= out["model_utility"] <= 1  # its value from given numbers: test_every_tofu_aggregate_by_hand
    assert len(out["forget_truth_ratio_per_example"]) == 3 and len(out["forget_generations"]) == 3
    assert 0 <= out["forget_degenerate_share"] <= 1 and 0 <= out["forget_token_entropy"] <= 1
    # the full model learned the forget answers; the retain model never saw them
    assert out["forget_prob"] > ref["forget_prob"]
    with_ref = evaluate_tofu(full, tok, {"forget": FORGET},
                             retain_model_forget_tr=np.array(ref["forget_truth_ratio_per_example"]), **EVAL)
    fq = with_ref["forget_quality"]
    # 3 vs 3 samples: the exact KS p-value is one of the few values C(6,3) = 20 interleavings allow
    # (D = 1/3, 2/3 or 1 -> p = 1, 0.6 or 0.1; see test_forget_quality_is_the_exact_ks_p_value)
    assert isinstance(fq, float) and any(fq == pytest.approx(p) for p in (1.0, 0.6, 0.1))
