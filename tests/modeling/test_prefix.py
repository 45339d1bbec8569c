"""A batch's shared leading tokens run once (modeling/prefix.py): the same values and gradients as the plain
forward, fewer token positions through the decoder, and the plain path wherever sharing is not allowed."""
import copy

import pytest
import torch

from obliviate.modeling import prefix
from obliviate.modeling.logprobs import IGNORE_INDEX, forward_stats
from obliviate.modeling.prefix import eligible, prefix_is_exact, shared_prefix_length


def _mask(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_shared_prefix_length_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 9, 4], [5, 6, 7, 1, 2, 3]])
    ones = torch.ones_like(ids)
    # first label predicted from column 4 (shifted mask): the common run of 3 decides
    labels = _mask([[0, 0, 0, 0, 1], [0, 0, 0, 0, 1]])
    assert shared_prefix_length(ids, ones, labels, min_length=1) == 3
    assert shared_prefix_length(ids, ones, labels, min_length=3) == 3
    assert shared_prefix_length(ids, ones, labels, min_length=4) == 0  # too short to be worth a call
    # a label predicted from column 2 (token 3 is an answer token in row 1): the prefix stops before it
    assert shared_prefix_length(ids, ones, _mask([[0, 0, 0, 0, 1], [0, 0, 1, 0, 0]]), min_length=1) == 2
    # a position not attended in one row (left padding) ends the prefix there
    left = ones.clone()
    left[1, 1] = 0
    assert shared_prefix_length(ids, left, labels, min_length=1) == 1
    # one row: nothing to share
    assert shared_prefix_length(ids[:1], ones[:1], labels[:1], min_length=1) == 0
    # identical rows without labels: at least one position stays after the prefix
    same = torch.tensor([[5, 6, 7], [5, 6, 7]])
    assert shared_prefix_length(same, torch.ones_like(same), _mask([[0, 0], [0, 0]]), min_length=1) == 2


def _batch(vocab, prefix_len=10, rows=((6, 4), (3, 5), (5, 2), (4, 6)), seed=0):
    """Right-padded rows: a common prefix, then (question tokens, answer tokens) of each row; labels on answers."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, vocab, (prefix_len,), generator=g).tolist()
    seqs, labels = [], []
    for q, a in rows:
        body = torch.randint(3, vocab, (q + a,), generator=g).tolist()
        seqs.append(shared + body)
        labels.append([IGNORE_INDEX] * (prefix_len + q) + body[q:])
    width = max(map(len, seqs))
    return {"input_ids": torch.tensor([s + [0] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "labels": torch.tensor([lab + [IGNORE_INDEX] * (width - len(lab)) for lab in labels])}


def _embedded_positions(model):
    """A list that collects how many token positions each forward runs through the first decoder layer."""
    seen = []

    def count(_module, args, kwargs, _out):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(hidden.numel() // hidden.shape[-1])
    model.model.layers[0].register_forward_hook(count, with_kwargs=True)
    return seen


def _loss_and_grads(model, batch, share, **kw):
    model.zero_grad()
    stats = forward_stats(model, batch, share_prefix=share, **kw)
    # a loss that reads the token log-probs and the vocabulary rows (KL-type objectives)
    loss = -stats.token_logp.sum() + stats.answer_log_probs().exp().pow(2).sum() if kw.get("chunk") is None \
        else -stats.token_logp.sum()
    loss.backward()
    return stats, [p.grad.clone() for p in model.parameters()]


def _same_gradients(shared, plain):
    """Equal to float32 rounding: Llama's RMSNorm runs in float32 even in a float64 model, and the prefix's
    gradient is summed over the rows before that norm's backward here, after it in the plain forward."""
    scale = max(float(g.abs().max()) for g in plain)
    assert scale > 0
    for a, b in zip(shared, plain):
        torch.testing.assert_close(a, b, atol=1e-6 * scale, rtol=0)


def test_shared_prefix_gives_the_plain_values_and_gradients_with_fewer_positions(trained_small, small_tok):
    model = copy.deepcopy(trained_small).double().train()
    batch = _batch(len(small_tok))
    B, T = batch["input_ids"].shape
    seen = _embedded_positions(model)
    lookups = []
    model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: lookups.append(args[0].numel()))
    plain, g_plain = _loss_and_grads(model, batch, share=False)
    assert seen == [B * T]
    seen.clear()
    lookups.clear()
    shared, g_shared = _loss_and_grads(model, batch, share=True)
    assert seen[-2:] == [10, B * (T - 10)]  # the prefix once, then every row after it
    assert lookups[-1:] == [B * T] and len(lookups) in (1, 3)  # one embedding lookup (after a measurement's two)
    assert shared.mask.shape == plain.mask.shape and torch.equal(shared.mask, plain.mask)
    assert torch.equal(shared.targets, plain.targets)
    torch.testing.assert_close(shared.token_logp, plain.token_logp, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(shared.answer_log_probs(), plain.answer_log_probs(), atol=1e-10, rtol=1e-10)
    _same_gradients(g_shared, g_plain)


def test_shared_prefix_keeps_hidden_states_and_chunked_rows(trained_small, small_tok):
    model = copy.deepcopy(trained_small).double()
    batch = _batch(len(small_tok), seed=1)
    with torch.no_grad():
        plain = forward_stats(model, batch, hidden_layer=1, share_prefix=False)
        shared = forward_stats(model, batch, hidden_layer=1, share_prefix=True)
    assert shared.hidden.shape == plain.hidden.shape
    torch.testing.assert_close(shared.hidden, plain.hidden, atol=1e-10, rtol=1e-10)  # prefix rows included
    assert torch.equal(shared.hidden_mask, plain.hidden_mask)
    _, g_plain = _loss_and_grads(model, batch, share=False, chunk=3)
    chunked, g_shared = _loss_and_grads(model, batch, share=True, chunk=3)
    assert chunked.rows is not None
    _same_gradients(g_shared, g_plain)


def test_no_sharing_where_labels_start_early_or_the_prefix_is_short(trained_small, small_tok):
    model = copy.deepcopy(trained_small).double()
    seen = _embedded_positions(model)
    batch = _batch(len(small_tok))
    B, T = batch["input_ids"].shape
    early = {**batch, "labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)}
    with torch.no_grad():
        forward_stats(model, early)  # every token a label (positions="sequence"): nothing is shared
        forward_stats(model, _batch(len(small_tok), prefix_len=prefix.MIN_PREFIX - 1))
    assert seen == [B * T, B * (T - 10 + prefix.MIN_PREFIX - 1)]


def test_sharing_off_under_gradient_checkpointing(trained_small):
    model = copy.deepcopy(trained_small)
    assert eligible(model)
    from obliviate.train.switches import enable_checkpointing

    enable_checkpointing(model)
    assert not eligible(model)


def test_a_model_whose_sharing_is_not_exact_keeps_the_plain_path(monkeypatch, trained_small, small_tok):
    model = copy.deepcopy(trained_small).double()
    monkeypatch.setattr(prefix, "_EXACT", {})
    calls = []
    assert prefix_is_exact(model, lambda: calls.append(1) or False) is False
    assert prefix_is_exact(model, lambda: calls.append(1) or True) is False  # measured once per kind of model
    assert calls == [1]
    seen = _embedded_positions(model)
    batch = _batch(len(small_tok))
    with torch.no_grad():
        forward_stats(model, batch)
    assert seen == [batch["input_ids"].numel()]
    # a measurement that raises counts as "not exact", and the RNG is left as it was
    model.train()
    state = torch.get_rng_state()
    def broken():
        torch.rand(3)
        raise RuntimeError("this model's forward takes no cache")

    assert prefix_is_exact(model, broken) is False
    assert torch.equal(torch.get_rng_state(), state)


def test_a_wrong_prefix_forward_is_caught_by_the_measurement(monkeypatch, trained_small, small_tok):
    """The measurement compares with the plain forward: positions that restart at 0 after the prefix (a model
    that ignored position ids) change the values, and sharing is then refused for that kind of model."""
    model = copy.deepcopy(trained_small).double()
    monkeypatch.setattr(prefix, "_EXACT", {})
    real = prefix.prefix_forward

    def restarted(m, ids, mask, length):
        B, T = ids.shape
        keyword = prefix.cache_keyword(m)
        head = m(input_ids=ids[:1, :length], attention_mask=mask[:1, :length], use_cache=True)
        cache = getattr(head, "cache", None) or head.past_key_values
        cache.batch_repeat_interleave(B)
        return m(input_ids=ids[:, length:], attention_mask=mask, use_cache=True,
                 position_ids=torch.arange(T - length).expand(B, -1), **{keyword: cache})

    import obliviate.modeling.logprobs as lp
    monkeypatch.setattr(lp, "prefix_forward", restarted)
    seen = _embedded_positions(model)
    batch = _batch(len(small_tok))
    with torch.no_grad():
        forward_stats(model, batch)
    assert seen[-1] == batch["input_ids"].numel()  # measured, refused, plain
    monkeypatch.setattr(lp, "prefix_forward", real)
    monkeypatch.setattr(prefix, "_EXACT", {})
    seen.clear()
    with torch.no_grad():
        forward_stats(model, batch)
    assert seen[-1] < batch["input_ids"].numel()  # the real one passes the same measurement


@pytest.mark.parametrize("method", [{"forget": "npo", "retain": "nll"}, {"forget": "asu", "retain": "kl",
                                     "forget_args": {"tau": 3.0, "layers": [0]}}])
def test_training_with_a_shared_prefix_follows_the_plain_trajectory(method, trained_small, small_world, small_tok):
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.data.synthetic import QARow
    from obliviate.train.unlearn import unlearn

    # questions that open alike, so that each batch shares its first tokens
    forget = [QARow(f"Question about the author born in the city number {i}: who is it?", f"Author {i} it is.")
              for i in range(8)]
    retain = small_world.splits["retain90"][:8]
    out = {}
    for share in (True, False, True):  # the first run measures exactness once per kind of model (not counted)
        model = copy.deepcopy(trained_small).double()
        seen = _embedded_positions(model)
        cfg = TrainConfig(max_steps=2, batch_size=4, lr=1e-3, weight_decay=0.0, scheduler="constant",
                          progress=False, share_prefix=share)
        unlearn(model, small_tok, forget, retain, MethodConfig(**method), cfg, max_length=64)
        out[share] = (model, sum(seen))
    (plain, n_plain), (shared, n_shared) = out[False], out[True]
    assert n_shared < 0.9 * n_plain
    with torch.no_grad():
        diff = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), shared.parameters()))
        moved = max(float((p - q).abs().max()) for p, q in zip(plain.parameters(), trained_small.parameters()))
    assert moved > 1e-4 and diff < 1e-4 * moved  # float32 rounding of the RMSNorm (see _same_gradients)
