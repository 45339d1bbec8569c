"""The evaluation run step: the closer-look protocol switch (rows, length limits, FE/MU) and the token rule."""
from __future__ import annotations

import numpy as np
import pytest

from obliviate.config import EvalConfig
from obliviate.data.rows import load_split
from obliviate.data.tokenize import answer_ids, prompt_ids
from obliviate.eval.generate import generate_answers
from obliviate.eval.runner import evaluate_model, length_limits, load_eval_splits, row_cap


def test_protocol_limits_by_hand():
    # tofu: max_examples as given, scored sequences at max_length, generation by max_new_tokens
    assert row_cap(EvalConfig()) is None and row_cap(EvalConfig(max_examples=7)) == 7
    assert length_limits(EvalConfig(), 256) == (256, None)
    # closer_look: ds_size 300 (fewer with max_examples); prompt + answer <= 200 in scoring and generation
    assert row_cap(EvalConfig(protocol="closer_look")) == 300
    assert row_cap(EvalConfig(protocol="closer_look", max_examples=5)) == 5
    assert row_cap(EvalConfig(protocol="closer_look", max_examples=500)) == 300
    assert length_limits(EvalConfig(protocol="closer_look"), 256) == (200, 200)
    assert length_limits(EvalConfig(protocol="closer_look"), 64) == (64, 200)


def test_closer_look_protocol_takes_the_first_300_rows(tofu_dir):
    splits = load_eval_splits(str(tofu_dir), EvalConfig(protocol="closer_look"))
    # forget10 and retain hold 400 rows -> 300; real authors (100) and world facts (117) are whole
    assert {k: len(v) for k, v in splits.items()} == {"forget": 300, "retain": 300, "real_authors": 100,
                                                      "world_facts": 117}
    assert splits["forget"] == load_split(str(tofu_dir), "forget10_perturbed")[:300]
    assert len(load_eval_splits(str(tofu_dir), EvalConfig())["forget"]) == 400


def test_closer_look_protocol_end_to_end(trained_small, small_tok, small_world):
    splits = {"forget": small_world.splits["forget10_perturbed"][:3],
              "retain": small_world.splits["retain_perturbed"][:3],
              "real_authors": small_world.splits["real_authors_perturbed"][:2],
              "world_facts": small_world.splits["world_facts_perturbed"][:2]}
    kw = dict(max_new_tokens=4, memorization=False, embedding_model=None, nli_model=None)
    tofu = evaluate_model(trained_small, small_tok, splits, EvalConfig(**kw), max_length=64)
    cl = evaluate_model(trained_small, small_tok, splits, EvalConfig(protocol="closer_look", **kw), max_length=64)
    questions = [r.question for r in splits["forget"]]
    # tofu: 4 new tokens per answer; closer_look: 200 - prompt length, ignoring max_new_tokens
    assert tofu["forget_generations"] == generate_answers(trained_small, small_tok, questions, max_new_tokens=4)
    assert cl["forget_generations"] == [generate_answers(trained_small, small_tok, [q],
                                                         max_new_tokens=200 - len(prompt_ids(small_tok, q)))[0]
                                        for q in questions]
    assert cl["forget_generations"] != tofu["forget_generations"]  # the memorised answers run past 4 tokens
    # FE/MU come with the protocol; without embedding / NLI models they are null, their partial values labelled
    assert "fe" not in tofu and cl["protocol"] == "closer_look"
    assert cl["fe"] is None and cl["mu"] is None and 0 <= cl["fe_partial"] <= 1 and 0 <= cl["mu_partial"] <= 1
    assert any(n.startswith("protocol closer_look: first 300 rows per split") for n in cl["notes"])


def test_token_rule_reaches_the_memorisation_metrics(small_tok, small_world, constant_lm, monkeypatch):
    import obliviate.eval.tofu as tofu

    monkeypatch.setattr(tofu, "generate_answers", lambda model, tok, questions, **kw: [""] * len(questions))
    rows = small_world.splits["forget10"][:4]
    n = np.array([len(answer_ids(small_tok, r.question, r.answer)) for r in rows])  # answer tokens incl. EOS
    eos = constant_lm(len(small_tok), small_tok.eos_token_id)  # right only on the final EOS
    kw = dict(forget_split="forget10", retain_split=None, real_authors_split=None, world_facts_split=None)
    ref = evaluate_model(eos, small_tok, {"forget": rows}, EvalConfig(**kw), max_length=128)
    full = evaluate_model(eos, small_tok, {"forget": rows}, EvalConfig(token_rule="all_tokens", **kw), max_length=128)
    # open_unlearning: EOS dropped -> EM 0, ES mean 1/(N-1); all_tokens: EM = ES = mean 1/N
    assert ref["token_rule"] == "open_unlearning" and full["token_rule"] == "all_tokens"
    assert ref["forget_exact_memorization"] == 0.0
    assert ref["forget_extraction_strength"] == pytest.approx(np.mean(1 / (n - 1)))
    assert full["forget_exact_memorization"] == pytest.approx(np.mean(1 / n))
    assert full["forget_extraction_strength"] == pytest.approx(np.mean(1 / n))
    with pytest.raises(Exception, match="eval.token_rule"):
        EvalConfig(token_rule="eos")
