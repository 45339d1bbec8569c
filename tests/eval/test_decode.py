"""The evaluation's greedy decoding loop gives Hugging Face `generate`'s greedy ids, drops finished rows, and sizes
its automatic batches from the KV cache by hand-checkable arithmetic."""
from __future__ import annotations

import pytest
import torch

from obliviate.data.tokenize import Encoded, collate, pad_id
from obliviate.eval import decode
from obliviate.eval.decode import generation_rows, greedy_decode, growing_cache, kv_bytes_per_token
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran far away from home", "birds sing in the early morning light",
         "rain falls on the quiet town", "she wrote a long letter to her friend"]


@pytest.fixture(scope="module")
def tok_model():
    tok = train_tokenizer(TEXTS, vocab_size=300)
    model = tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3).eval()
    return tok, model


def hf_greedy(model, prompts, steps, eos, pad):
    """`model.generate`'s greedy ids per row, cut before the first EOS (the reference)."""
    batch = collate([Encoded(p, [-100] * len(p), False) for p in prompts], pad, left=True)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=steps,
                         do_sample=False, pad_token_id=pad, eos_token_id=eos)
    rows = out[:, batch["input_ids"].shape[1]:].tolist()
    return [r[:next((j for j, t in enumerate(r) if t in eos), len(r))] for r in rows]


def prompts_of(tok, n=6):
    texts = TEXTS + ["x", "the"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts[:n]]


def test_greedy_ids_equal_generate_with_padding_and_eos_stops(tok_model):
    tok, model = tok_model
    prompts = prompts_of(tok, 7)
    pad = pad_id(tok)
    # a random model never says EOS; make frequent ids stops so rows finish at different steps
    free = greedy_decode(model, prompts, [12] * len(prompts), [tok.eos_token_id], pad)
    assert all(len(r) == 12 for r in free)
    eos = sorted({r[k] for r, k in zip(free, (2, 5, 0, 7, 3, 9, 1))})
    ours = greedy_decode(model, prompts, [12] * len(prompts), eos, pad)
    assert ours == hf_greedy(model, prompts, 12, eos, pad)
    assert sorted(len(r) for r in ours) != [12] * len(prompts)  # some rows stopped early
    assert all(not set(r) & set(eos) for r in ours)


def test_finished_rows_leave_the_batch_and_the_cache(tok_model, monkeypatch):
    tok, model = tok_model
    prompts = prompts_of(tok, 6)
    pad = pad_id(tok)
    free = greedy_decode(model, prompts, [10] * 6, [tok.eos_token_id], pad)
    eos = [free[0][1], free[3][2]]  # rows 0 and 3 stop early (and any row meeting those ids)
    widths = []
    real = decode._last_logits
    monkeypatch.setattr(decode, "_last_logits", lambda m, ids, *a: widths.append(ids.shape[0]) or real(m, ids, *a))
    ours = greedy_decode(model, prompts, [10] * 6, eos, pad)
    assert ours == hf_greedy(model, prompts, 10, eos, pad)
    assert widths[0] == 6 and min(widths) < 6 and widths == sorted(widths, reverse=True)
    assert sum(widths) < 6 * 10


def test_row_budgets_cap_each_row(tok_model):
    tok, model = tok_model
    prompts = prompts_of(tok, 4)
    pad = pad_id(tok)
    full = greedy_decode(model, prompts, [9] * 4, [tok.eos_token_id], pad)
    capped = greedy_decode(model, prompts, [9, 1, 4, 2], [tok.eos_token_id], pad)
    assert capped == [full[0], full[1][:1], full[2][:4], full[3][:2]]
    with pytest.raises(ValueError, match="budget"):
        greedy_decode(model, prompts, [3, 0, 1, 1], [tok.eos_token_id], pad)
    assert greedy_decode(model, [], [], [tok.eos_token_id], pad) == []


def test_growing_cache_grows_past_its_capacity(tok_model):
    """A cache planned too small doubles once and keeps every position: the same ids as a roomy one."""
    tok, model = tok_model
    prompt = torch.tensor([prompts_of(tok, 1)[0]])
    kw = "cache" if "cache" in __import__("inspect").signature(model.forward).parameters else "past_key_values"
    logits = []
    for capacity in (2, 64):
        cache = growing_cache(model, capacity)
        assert cache is not None and type(cache.layers[0]).__name__ == "GrowingLayer"
        with torch.no_grad():
            out = model(input_ids=prompt, use_cache=True, **{kw: cache})
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(input_ids=nxt, use_cache=True, **{kw: cache})
        assert cache.get_seq_length() == prompt.shape[1] + 1
        logits.append(out.logits)
    assert cache.layers[0].capacity == 64
    torch.testing.assert_close(logits[0], logits[1])


def test_kv_bytes_and_automatic_rows_by_hand(tok_model):
    _, model = tok_model
    # 2 (K and V) x 2 layers x 2 KV heads x head dim 8 (32 / 4 heads) x 4 bytes = 256 bytes per token
    assert kv_bytes_per_token(model) == 256
    # a row of 100 positions: 25,600 bytes of cache + 8 x 300 logit bytes = 28,000 bytes; 8 rows need 224,000
    assert generation_rows(model, 100, 300, 28_000 * 8 - 1) == 7 and generation_rows(model, 100, 300, 28_000 * 8) == 8
    assert generation_rows(model, 100, 300, 10) == 1  # always at least one row
    assert generation_rows(model, 100, 300, 10**12) == decode.MAX_ROWS
    assert generation_rows(torch.nn.Linear(2, 2), 100, 300, 10**12) == 64  # no config: a fixed batch


def test_automatic_batches_give_the_same_answers(tok_model, monkeypatch):
    from obliviate.eval.generate import generate_answers

    tok, model = tok_model
    questions = TEXTS + ["x"]
    fixed = generate_answers(model, tok, questions, max_new_tokens=6, batch_size=2)
    monkeypatch.setattr(decode, "MAX_ROWS", 4)  # 6 rows: batches of 4 and 2
    assert generate_answers(model, tok, questions, max_new_tokens=6, batch_size=None) == fixed


def test_a_lora_model_decodes_like_generate_without_deprecation_warnings(tok_model):
    """PEFT's forward passes keyword arguments on: the cache goes by the base model's own name (no per-step
    warning about a deprecated keyword), and the ids equal generate's."""
    import copy
    import warnings

    from peft import LoraConfig, get_peft_model

    tok, model = tok_model
    lora = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    prompts, pad = prompts_of(tok, 3), pad_id(tok)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ours = greedy_decode(lora, prompts, [6] * 3, [tok.eos_token_id], pad)
    assert not [w for w in seen if "deprecated" in str(w.message)], [str(w.message) for w in seen]
    assert ours == hf_greedy(lora, prompts, 6, [tok.eos_token_id], pad)
