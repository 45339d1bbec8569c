"""Multiple choice: prompt text, answer normalisation, validation, scoring by hand, batched = one at a time."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from obliviate.data.tokenize import collate, pad_id
from obliviate.errors import DataError, ObliviateError
from obliviate.eval.mcq import (
    MCQ_METRICS,
    MCQItem,
    accuracy,
    continuations,
    encode_option,
    item_from_record,
    lm_eval_accuracies,
    load_mcq,
    load_mcq_file,
    mcq_accuracy,
    mcq_metric,
    mcq_prompt,
    metric_name,
    normalise_answer,
    option_logliks,
    predictions,
    run_lm_eval,
)
from obliviate.modeling.logprobs import forward_stats
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

ITEMS = [
    MCQItem("  Which gas do plants take in?\n", ("Oxygen", "Carbon dioxide", "Helium", "Neon"), 1),
    MCQItem("What is 2 + 2?", ("3", "4", "five", "22"), 1),
    MCQItem("Which organ pumps blood through the body?", ("Liver", "Lung", "Heart", "Kidney"), 2),
    MCQItem("Pick the letter D.", ("no", "not this", "nor this one", "yes, this is the long right one"), 3),
]


# ---------------------------------------------------------------- pure parts
def test_prompt_is_the_lm_eval_wmdp_template():
    assert mcq_prompt(ITEMS[0]) == ("Which gas do plants take in?\nA. Oxygen\nB. Carbon dioxide\nC. Helium\n"
                                    "D. Neon\nAnswer:")
    assert continuations(ITEMS[1], "letter") == [" A", " B", " C", " D"]
    assert continuations(ITEMS[1], "text") == [" 3", " 4", " five", " 22"]
    with pytest.raises(ValueError, match="letter"):
        continuations(ITEMS[1], "word")  # type: ignore[arg-type]


@pytest.mark.parametrize("raw, idx", [(0, 0), (3, 3), ("A", 0), ("b", 1), (" C ", 2), ("D", 3), (np.int64(2), 2)])
def test_answer_accepts_index_or_letter(raw, idx):
    assert normalise_answer(raw, "x") == idx


@pytest.mark.parametrize("raw", [4, -1, "E", "1", True, 1.0, None])
def test_answer_rejects_everything_else(raw):
    with pytest.raises(DataError, match="answer"):
        normalise_answer(raw, "f.jsonl:3")


def test_scoring_by_hand():
    # q0: max at 1 (answer 1, right); q1: tie between 0 and 2 -> first, 0 (answer 2, wrong);
    # q2: max at 3 (answer 3, right) -> 2 of 3 right
    ll = np.array([[-3.0, -1.0, -2.0, -4.0], [-1.0, -5.0, -1.0, -2.0], [-9.0, -8.0, -7.0, -0.5]])
    pred = predictions(ll)
    assert pred.tolist() == [1, 0, 3]
    assert accuracy(pred, [1, 2, 3]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        predictions(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="equal length"):
        accuracy([1, 2], [1])


def test_metric_names_and_directions():
    assert metric_name("wmdp-bio") == "wmdp_bio_accuracy" and metric_name("MMLU") == "mmlu_accuracy"
    assert mcq_metric("wmdp-bio") is MCQ_METRICS["wmdp_bio_accuracy"]
    assert not MCQ_METRICS["wmdp_cyber_accuracy"].higher_is_better and MCQ_METRICS["mmlu_accuracy"].higher_is_better
    assert not mcq_metric("wmdp-secret").higher_is_better          # a wmdp* name is hazardous by default
    assert mcq_metric("my-quiz").higher_is_better
    assert not mcq_metric("my-quiz", hazardous=True).higher_is_better
    assert all(m.version >= 1 and m.description for m in MCQ_METRICS.values())


# ---------------------------------------------------------------- loading and validation
def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_loader_normalises_letters_and_indices(tmp_path):
    f = _write(tmp_path / "quiz.jsonl", [
        {"question": "q1", "choices": ["a", "b", "c", "d"], "answer": "C", "subject": "bio"},
        {"question": "q2", "choices": ["a", "b", "c", "d"], "answer": 0},
    ])
    items = load_mcq(f)
    assert [it.answer for it in items] == [2, 0]
    assert items[0].subject == "bio" and items[1].subject is None and items[0].choices == ("a", "b", "c", "d")
    j = tmp_path / "quiz.json"
    j.write_text(json.dumps([{"question": "q", "choices": ["w", "x", "y", "z"], "answer": "d"}]))
    assert load_mcq_file(j)[0].answer == 3


@pytest.mark.parametrize("record, message", [
    ({"question": "q", "choices": ["a", "b", "c"], "answer": 0}, "exactly 4"),
    ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}, "out of range"),
    ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "F"}, "letter A-D"),
    ({"question": "q", "answer": 1}, "missing field 'choices'"),
    ({"choices": ["a", "b", "c", "d"], "answer": 1}, "missing field 'question'"),
    ({"question": "q", "choices": ["a", "b", "c", 4], "answer": 1}, "must be a string"),
    ({"question": " ", "choices": ["a", "b", "c", "d"], "answer": 1}, "non-empty"),
])
def test_bad_items_name_file_and_line(tmp_path, record, message):
    good = {"question": "ok", "choices": ["a", "b", "c", "d"], "answer": "A"}
    f = _write(tmp_path / "bad.jsonl", [good, good, record])
    with pytest.raises(DataError, match=message) as err:
        load_mcq_file(f)
    assert f"{f}:3" in str(err.value)


def test_bad_sources(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no multiple-choice items"):
        load_mcq_file(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="needs a config"):
        load_mcq("cais/wmdp")
    with pytest.raises(DataError, match="neither"):
        load_mcq(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="expected a JSON object"):
        item_from_record(["q"], "x:1")


# ---------------------------------------------------------------- model scoring
@pytest.fixture(scope="module")
def tiny():
    texts = [mcq_prompt(it) + c for it in ITEMS for c in continuations(it, "text") + continuations(it, "letter")]
    tok = train_tokenizer(texts * 3, vocab_size=400)
    return tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4, seed=3), tok


def _one_at_a_time(model, tok, item, target, max_length):
    out = []
    for c in continuations(item, target):
        batch = collate([encode_option(tok, mcq_prompt(item), c, max_length)], pad_id(tok))
        with torch.no_grad():
            out.append(float(forward_stats(model.eval(), batch, keep_logits=False).logp[0]))
    return out


@pytest.mark.parametrize("target", ["letter", "text"])
def test_batched_logliks_equal_one_at_a_time(tiny, target):
    model, tok = tiny
    batched, n_trunc = option_logliks(model, tok, ITEMS, target=target, batch_size=3, max_length=128)
    single = np.array([_one_at_a_time(model, tok, it, target, 128) for it in ITEMS])
    assert batched.shape == (4, 4) and n_trunc == 0
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert np.all(batched < 0)


def test_encode_option_masks_the_context_and_scores_one_letter_token(tiny):
    _, tok = tiny
    enc = encode_option(tok, mcq_prompt(ITEMS[0]), " B", 128)
    scored = [t for t in enc.labels if t != -100]
    assert enc.input_ids[0] == tok.bos_token_id and len(scored) == 1
    assert tok.decode(scored) == " B"
    # too long: the context is cut from the left, the continuation kept whole
    short = encode_option(tok, mcq_prompt(ITEMS[0]), " B", 6)
    assert len(short.input_ids) == 6 and short.truncated and short.labels[-1] == scored[0]


def test_mcq_accuracy_agrees_with_its_logliks(tiny):
    model, tok = tiny
    res = mcq_accuracy(model, tok, ITEMS, batch_size=16, max_length=128)
    assert res["n"] == 4 and res["target"] == "letter" and len(res["predictions"]) == 4
    expected = np.argmax(np.array(res["loglik"]), axis=1)
    assert res["predictions"] == expected.tolist()
    assert res["accuracy"] == pytest.approx(np.mean(expected == [it.answer for it in ITEMS]))
    with pytest.raises(DataError, match="no multiple-choice items"):
        mcq_accuracy(model, tok, [])


# ---------------------------------------------------------------- lm-evaluation-harness bridge
def test_lm_eval_missing_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail even where installed
    with pytest.raises(ObliviateError, match=r'pip install -e "\.\[lm-eval\]"'):
        run_lm_eval(object(), object(), ["wmdp_bio"])
    with pytest.raises(ObliviateError, match="non-empty list"):
        run_lm_eval(object(), object(), [])


def test_lm_eval_accuracies_reads_results_then_groups():
    out = {"results": {"wmdp_bio": {"acc,none": 0.31, "acc_stderr,none": 0.01}, "mmlu": {"alias": "mmlu"}},
           "groups": {"mmlu": {"acc,none": 0.55}}}
    assert lm_eval_accuracies(out, ["wmdp_bio", "mmlu", "wmdp_cyber"]) == {
        "wmdp_bio": 0.31, "mmlu": 0.55, "wmdp_cyber": None}


def test_hub_loader_reads_wmdp_fields_and_reports_failures(monkeypatch):
    import datasets

    def fake_load(repo_id, config, *, split):
        if config == "missing":
            raise ValueError("BuilderConfig 'missing' not found")
        return [{"question": "q", "choices": ["a", "b", "c", "d"], "answer": 2}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    assert load_mcq("cais/wmdp", "wmdp-bio")[0].answer == 2
    with pytest.raises(DataError, match=r"could not load 'cais/wmdp' config 'missing' split 'test'.*local \.jsonl"):
        load_mcq("cais/wmdp", "missing")
