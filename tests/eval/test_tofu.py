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
    # TOFU's code tests 1/TR; a monotone map leaves KS unchanged
    a, b = np.array([0.5, 0.9, 1.3, 2.0]), np.array([0.7, 1.1, 1.6])
    assert forget_quality(a, b) == pytest.approx(forget_quality(1 / a, 1 / b))
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
    np.testing.assert_allclose(res.truth_ratio, truth_ratio(para, pert), rtol=1e-4)
    assert res.summary["truth_ratio"] == pytest.approx(forget_truth_ratio(res.truth_ratio))
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
    assert out["model_utility"] == pytest.approx(model_utility(out)) and 0 <= out["model_utility"] <= 1
    assert len(out["forget_truth_ratio_per_example"]) == 3 and len(out["forget_generations"]) == 3
    assert 0 <= out["forget_degenerate_share"] <= 1 and 0 <= out["forget_token_entropy"] <= 1
    # the full model learned the forget answers; the retain model never saw them
    assert out["forget_prob"] > ref["forget_prob"]
    with_ref = evaluate_tofu(full, tok, {"forget": FORGET},
                             retain_model_forget_tr=np.array(ref["forget_truth_ratio_per_example"]), **EVAL)
    fq = with_ref["forget_quality"]
    assert isinstance(fq, float) and 0 <= fq <= 1
    assert fq == pytest.approx(forget_quality(np.array(out["forget_truth_ratio_per_example"]),
                                              np.array(ref["forget_truth_ratio_per_example"])), rel=1e-6)
