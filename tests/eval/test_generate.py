"""Batched greedy generation and batched answer losses equal their one-at-a-time versions."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from obliviate.data.tokenize import answer_ids, collate, encode_qa, pad_id, prompt_ids
from obliviate.eval.generate import (
    answer_budgets,
    batched_avg_loss,
    decode_continuations,
    generate_answers,
    length_order,
    token_batches,
)
from obliviate.modeling import prefix
from obliviate.modeling.logprobs import forward_stats
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

QA = [
    ("Where was Ana Reyes born?", "Ana Reyes was born in Lima in 1961."),
    ("What did Ana Reyes write?", "She wrote the novel Salt Roads."),
    ("Who is Tom Berg?", "Tom Berg is a poet from Oslo."),
    ("When did Tom Berg publish?", "He published his first book in 1990."),
    ("What is Mia Cole known for?", "Mia Cole is known for crime stories."),
    ("Where does Mia Cole live?", "Mia Cole lives in Cork by the sea."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Who wrote Hamlet?", "Hamlet was written by William Shakespeare."),
]
# Unseen questions of very different lengths, so batches mix heavy and no left padding.
UNSEEN = ["Hi?", "Where was Tom Berg born and what did he write about the sea near Oslo in 1990?", "Mia?"]


@pytest.fixture(scope="module")
def tok_model():
    """A 1-layer, hidden-32 Llama trained for 40 full-batch Adam steps on QA (about 1 s on CPU)."""
    tok = train_tokenizer([q + " " + a for q, a in QA], vocab_size=400)
    model = tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4)
    batch = collate([encode_qa(tok, q, a, 64) for q, a in QA], pad_id(tok))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        loss = forward_stats(model, batch, keep_logits=False).nll.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.train()  # generation must switch to eval itself and restore this
    return tok, model


def test_length_order_is_stable():
    assert length_order([3, 1, 3, 2, 1]) == [1, 4, 3, 0, 2]


def test_decode_cuts_at_first_eos_and_strips(tok_model):
    tok, _ = tok_model
    eos = tok.eos_token_id
    hello = tok(" Paris is nice", add_special_tokens=False)["input_ids"]
    junk = tok(" Oslo", add_special_tokens=False)["input_ids"]
    rows = [hello + [eos] + junk, junk + [eos, eos] + hello]  # text after the first EOS must vanish
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    assert decode_continuations(tok, ids, [eos]) == ["Paris is nice", "Oslo"]
    no_eos = torch.tensor([hello + [tok.pad_token_id]])  # no EOS: pad is a special token, skipped
    assert decode_continuations(tok, no_eos, [eos]) == ["Paris is nice"]
    assert decode_continuations(tok, [hello, [], junk + [eos] + hello], [eos]) == ["Paris is nice", "", "Oslo"]


def test_batched_generation_equals_one_at_a_time(tok_model):
    tok, model = tok_model
    questions = [q for q, _ in QA] + UNSEEN
    batched = generate_answers(model, tok, questions, max_new_tokens=16, batch_size=4)
    single = [generate_answers(model, tok, [q], max_new_tokens=16, batch_size=1)[0] for q in questions]
    assert batched == single
    assert model.training, "generate_answers must restore the model's training mode"
    # The trained model answers the training questions and stops at EOS (nothing after the answer).
    assert batched[0] == QA[0][1]
    assert all(tok.eos_token not in g and tok.pad_token not in g for g in batched)


def test_generation_respects_max_new_tokens(tok_model):
    tok, model = tok_model
    out = generate_answers(model, tok, [QA[1][0]], max_new_tokens=2)[0]
    assert len(tok(out, add_special_tokens=False)["input_ids"]) <= 2
    assert generate_answers(model, tok, []) == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_answers(model, tok, ["x"], max_new_tokens=0)


def test_total_length_budget_by_hand():
    # closer-look generate(max_length=200): prompts of 10, 30, 200, 250 tokens get 190, 170, 0, -50 new tokens
    assert answer_budgets([10, 30, 200, 250], 16, 200) == [190, 170, 0, -50]
    assert answer_budgets([10, 30], 16, None) == [16, 16]


def test_total_length_limit_equals_per_row_new_tokens(tok_model):
    tok, model = tok_model
    questions = [QA[0][0], UNSEEN[1], UNSEEN[0], QA[2][0]]
    lengths = [len(prompt_ids(tok, q)) for q in questions]
    total = min(lengths) + 5  # the shortest prompt may add 5 tokens, the longest none
    out = generate_answers(model, tok, questions, max_new_tokens=1, max_total_tokens=total, batch_size=4)
    for q, n, text in zip(questions, lengths, out):
        if total - n < 1:
            assert text == ""  # no room left after the prompt
        else:
            assert text == generate_answers(model, tok, [q], max_new_tokens=total - n)[0]
    assert out[lengths.index(max(lengths))] == "" and any(out)


def _manual_avg_loss(model, tok, q: str, a: str) -> float:
    """Independent of logprobs.py: mean of -log p(answer token | everything before it), by hand."""
    p, ans = prompt_ids(tok, q), answer_ids(tok, q, a)
    ids = torch.tensor([p + ans])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    # Token at position t is predicted by the logits at position t-1.
    return float(-sum(logp[t - 1, ids[0, t]] for t in range(len(p), len(p) + len(ans))) / len(ans))


def test_batched_avg_loss_equals_per_example(tok_model):
    tok, model = tok_model
    pairs = [(q, a) for q, a in QA] + [(q, "Paris.") for q in UNSEEN] + [(QA[0][0], QA[5][1])]
    batched = batched_avg_loss(model, tok, pairs, batch_size=3)
    single = np.array([batched_avg_loss(model, tok, [pair], batch_size=1)[0] for pair in pairs])
    assert batched.shape == (len(pairs),) and batched.dtype == np.float64
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)
    for i in (0, len(QA), len(pairs) - 1):
        assert batched[i] == pytest.approx(_manual_avg_loss(model, tok, *pairs[i]), abs=1e-5)
    assert model.training
    # A memorised answer is far likelier than another row's answer to the same question.
    assert batched[0] < batched[-1]


def test_answers_to_one_question_are_scored_after_one_shared_prompt(tok_model, monkeypatch):
    """TOFU scores several answers per question: one cached prompt forward, the same values as scoring each alone."""
    import obliviate.eval.generate as g

    tok, model = tok_model
    answers = [a for _, a in QA] + ["Paris.", "It was Hamlet, a long time ago, in a far away land."]
    pairs = [(q, a) for q, _ in QA[:3] for a in answers] + [(UNSEEN[1], "No idea.")]  # 3 groups + a singleton
    calls = []
    real = g._shared_losses
    monkeypatch.setattr(prefix, "_EXACT", {})  # measured once per kind of model: start unmeasured
    monkeypatch.setattr(g, "_shared_losses", lambda m, groups, *a: calls.append(len(groups)) or real(m, groups, *a))
    shared = batched_avg_loss(model, tok, pairs, batch_size=2 * len(answers))
    plain = batched_avg_loss(model, tok, pairs, batch_size=4, share_prompts=False)
    single = np.array([_manual_avg_loss(model, tok, *p) for p in (pairs[0], pairs[len(answers) + 3], pairs[-1])])
    np.testing.assert_allclose(shared, plain, atol=1e-5, rtol=0)
    np.testing.assert_allclose(shared[[0, len(answers) + 3, -1]], single, atol=1e-5, rtol=0)
    assert calls == [1, 2, 1]  # the exactness check on one group, then chunks of <= 2 x len(answers) answers
    assert model.training
    # a model on which sharing would change the values keeps the plain path
    monkeypatch.setattr(prefix, "_EXACT", {})
    monkeypatch.setattr(g, "_shared_losses", lambda m, groups, *a: np.zeros(sum(len(x) for x in groups)))
    np.testing.assert_allclose(batched_avg_loss(model, tok, pairs, batch_size=8), plain, atol=1e-5, rtol=0)


def test_token_batches_by_hand():
    # lengths 5, 1, 4, 2, 4 in length order: 1 (len 1), 3 (2), 2 (4), 4 (4), 0 (5)
    assert token_batches([5, 1, 4, 2, 4], 2) == [[1, 3], [2, 4], [0]]
    # at most 8 padded tokens: [1, 3] (2 x 2 = 4; adding len 4 makes 3 x 4 = 12 > 8), [2, 4] (2 x 4), [0] (5)
    assert token_batches([5, 1, 4, 2, 4], None, tokens=8) == [[1, 3], [2, 4], [0]]
    assert token_batches([5, 1, 4, 2, 4], None, tokens=12) == [[1, 3, 2], [4, 0]]  # 3 x 4 = 12 fits
    assert token_batches([9], None, tokens=4) == [[0]]  # a row longer than the budget still gets a batch
    assert token_batches([], None) == []


def test_automatic_scoring_batches_equal_per_example(tok_model, monkeypatch):
    """batch_size None: prompts run once per window, answers in several length-sorted token batches, each given its
    rows of the prompt cache again; the same losses as one pair at a time."""
    import obliviate.eval.generate as g

    tok, model = tok_model
    answers = [a for _, a in QA] + ["Paris.", "It was Hamlet, a long time ago, in a far away land."]
    pairs = [(q, a) for q, _ in QA[:4] for a in answers] + [(UNSEEN[1], "No idea."), (UNSEEN[0], "Hm.")]
    parts = []
    real = g.forward_stats
    monkeypatch.setattr(g, "forward_stats", lambda m, b, **kw: parts.append(b["input_ids"].shape) or real(m, b, **kw))
    monkeypatch.setattr(g, "SCORE_TOKENS", 40)
    monkeypatch.setattr(g, "SCORE_WINDOW", 2 * len(answers))
    auto = batched_avg_loss(model, tok, pairs, batch_size=None)
    single = np.array([batched_avg_loss(model, tok, [p], batch_size=1)[0] for p in pairs])
    np.testing.assert_allclose(auto, single, atol=1e-5, rtol=0)
    assert len(parts) > 6 and all(s[0] * s[1] <= 40 or s[0] == 1 for s in parts[-4:])


def test_encode_many_equals_pair_by_pair(tok_model):
    from obliviate.data.tokenize import encode_qa_many

    tok, _ = tok_model
    pairs = [(q, a) for q, a in QA[:3]] + [(QA[0][0], "Lima."), (UNSEEN[1], QA[4][1] * 8)]
    for length in (256, 12):  # 12: answers and a prompt cut by the truncation policy
        assert encode_qa_many(tok, pairs, length) == [encode_qa(tok, q, a, length) for q, a in pairs]
    with pytest.raises(ValueError, match="max_length"):
        encode_qa_many(tok, pairs, 1)
