"""The evaluation's faster paths give the plain paths' numbers: ROUGE with remembered stems and a bit-parallel LCS, one generation pool
over every split, answers scored in vocabulary chunks at large vocabularies."""
import copy

import numpy as np
import pytest
from rouge_score import rouge_scorer

from obliviate.eval import generate as gen
from obliviate.eval import tofu
from obliviate.eval.generate import batched_avg_loss, scoring_chunk


def test_rouge_with_remembered_stems_equals_rouge_score_itself():
    texts = ["The authors were running; she runs, they ran and keeps running.", "Generously generated generations",
             "Running runners run", "", "a b c", "Historical fiction novels, historically", "running " * 50]
    targets = ["She was running the races.", "generation", "The runner runs.", "anything", "c b a",
               "history of fiction", "run"]
    plain = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    expected = [plain.score(t, g)["rougeL"].recall for g, t in zip(texts, targets)]
    assert list(tofu.rouge_recall(texts, targets)) == expected
    assert list(tofu.rouge_recall(texts, targets)) == expected  # and again, from the remembered stems
    assert 0 < expected[2] < 1  # stemming matters on these rows


def test_bit_parallel_lcs_equals_rouge_scores_table():
    import random

    from rouge_score.rouge_scorer import _lcs_table

    rng = random.Random(0)
    for _ in range(3000):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        b = [rng.choice("abcdef") for _ in range(rng.randint(0, 40))]
        assert tofu.lcs_length(a, b) == (_lcs_table(a, b)[-1][-1] if a and b else 0)
    assert tofu.lcs_length(list("abcbdab"), list("bdcaba")) == 4  # the textbook pair (CLRS): "bcba"


def test_every_split_is_generated_in_one_pool(monkeypatch, small_world, small_tok, trained_small):
    calls = []
    real = tofu.generate_answers

    def spy(model, tok, questions, **kw):
        calls.append(list(questions))
        return real(model, tok, questions, **kw)

    monkeypatch.setattr(tofu, "generate_answers", spy)
    splits = {"forget": small_world.splits["forget10_perturbed"][:3], "retain": small_world.splits["retain_perturbed"][:4]}
    results = {}
    tofu.evaluate_tofu(trained_small, small_tok, splits, max_new_tokens=6, batch_size=4, max_length=64,
                       results_out=results)
    assert calls == [[r.question for k in ("forget", "retain") for r in splits[k]]]
    pooled = real(trained_small, small_tok, calls[0], max_new_tokens=6, batch_size=4)
    assert results["forget"].generations == pooled[:3] and results["retain"].generations == pooled[3:]
    with pytest.raises(ValueError, match="2 generations for 3 rows"):
        tofu.evaluate_split(trained_small, small_tok, splits["forget"], kind="forget", generations=["a", "b"])


def test_answers_at_a_large_vocabulary_are_scored_in_chunks_with_the_same_losses(monkeypatch, small_tok,
                                                                                  trained_small, small_world):
    model = copy.deepcopy(trained_small)
    model.resize_token_embeddings(70_000, mean_resizing=False)  # >= 64k ids: the auto rule chunks
    assert scoring_chunk(model) == 119 and scoring_chunk(trained_small) is None
    pairs = [(r.question, r.answer) for r in small_world.splits["forget10"][:6]]
    seen = []
    real = gen.forward_stats
    monkeypatch.setattr(gen, "forward_stats", lambda *a, **kw: seen.append(kw.get("chunk")) or real(*a, **kw))
    chunked = batched_avg_loss(model, small_tok, pairs, batch_size=4, max_length=64)
    assert seen and set(seen) == {119}
    monkeypatch.setattr(gen, "scoring_chunk", lambda m: None)
    plain = batched_avg_loss(model, small_tok, pairs, batch_size=4, max_length=64)
    np.testing.assert_allclose(chunked, plain, rtol=1e-5)
