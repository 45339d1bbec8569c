"""Vocabulary chunks (train.vocab_chunk): every objective and retain term gives the same loss and the same gradient
as the unchunked path, while no [tokens, vocab] tensor of the whole batch is ever built.

The comparison runs `unlearn` for one step with plain SGD (lr 1, so the step is exactly −.grad) twice on copies of
the same θ0: train.vocab_chunk=0 (all rows at once) and train.vocab_chunk=5 (a few rows at a time, many chunks).
"""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from obliviate.config import MethodConfig, TrainConfig
from obliviate.data.tokenize import collate, pad_id
from obliviate.errors import ConfigError
from obliviate.modeling import logprobs
from obliviate.modeling.cache import CacheBudget
from obliviate.modeling.logprobs import forward_stats, map_rows, resolve_vocab_chunk
from obliviate.modeling.lora import apply_lora
from obliviate.objectives import FORGET, RETAIN
from obliviate.train.unlearn import encode_rows, unlearn

N = 4
TOL = {"rtol": 1e-5, "atol": 1e-6}
HIDDEN_ONLY = {"rmu", "hidden_mse"}  # no vocabulary rows at all: nothing to chunk


def _step(theta0, tok, world, method, chunk, steps=1, lora=False):
    """(history, parameter deltas) of `steps` SGD steps of `method` from a copy of θ0 with train.vocab_chunk=chunk."""
    model = copy.deepcopy(theta0)
    if lora:
        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None)
    for p in model.parameters():
        p.requires_grad_(p.requires_grad or not lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    built = []
    real = logprobs.chunked_token_stats

    def counted(*a, **kw):
        built.append(True)
        return real(*a, **kw)
    cfg = TrainConfig(max_steps=steps, batch_size=N, lr=1.0, max_grad_norm=None, weight_decay=0.0,
                      scheduler="constant", progress=False, vocab_chunk=chunk)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logprobs, "chunked_token_stats", counted)
        res = unlearn(model, tok, world.splits["forget10"][:N], world.splits["retain90"][:N], method, cfg,
                      max_length=64)
    assert bool(built) is bool(chunk)  # the chunked run did chunk, the other did not
    return res.history, {n: p.detach() - before[n] for n, p in model.named_parameters()}


def _same(a, b):
    (ha, da), (hb, db) = a, b
    for ea, eb in zip(ha, hb):
        for key in ("forget_loss", "retain_loss", "loss"):
            if key in ea:
                assert eb[key] == pytest.approx(ea[key], rel=1e-5, abs=1e-6), key
    moved = [n for n in da if da[n].abs().max() > 0]
    assert moved  # the step did something to compare
    for n in da:
        torch.testing.assert_close(db[n], da[n], **TOL, msg=n)


def _method(forget=None, retain=None):
    if retain is None:
        kw = {"forget": forget, "retain": None}
    else:
        kw = {"forget": "ga", "retain": retain}
    if "asu" in (forget,):
        kw["forget_args"] = {"tau": 4.0, "layers": [0]}
    if forget == "rmu":
        kw["forget_args"] = {"layer": 1, "trainable_params": [".*"]}
    if retain == "hidden_mse":
        kw["retain_args"] = {"layer": 1}
    return MethodConfig(**kw, cache="none")


@pytest.mark.parametrize("name", sorted(set(FORGET.names()) - HIDDEN_ONLY))
def test_every_forget_objective_is_the_same_chunked(name, plain_sgd, small_world, small_tok, trained_small):
    method = _method(forget=name)
    _same(_step(trained_small, small_tok, small_world, method, 0), _step(trained_small, small_tok, small_world, method, 5))


@pytest.mark.parametrize("name", sorted(set(RETAIN.names()) - HIDDEN_ONLY))
def test_every_retain_term_is_the_same_chunked(name, plain_sgd, small_world, small_tok, trained_small):
    method = _method(retain=name)
    _same(_step(trained_small, small_tok, small_world, method, 0), _step(trained_small, small_tok, small_world, method, 5))


@pytest.mark.parametrize("forget, retain", [("asu", "kl"), ("undial", None), ("me", None), ("npo", "nll")])
def test_lora_students_are_the_same_chunked(forget, retain, plain_sgd, small_world, small_tok, trained_small):
    """θ0 = the student with adapters off, its rows recomputed chunk by chunk; adapters on the head too."""
    method = MethodConfig(forget=forget, retain=retain, cache="none",
                          forget_args={"tau": 4.0, "layers": [0]} if forget == "asu" else {})
    runs = [_step(trained_small, small_tok, small_world, method, c, lora=True) for c in (0, 5)]
    _same(*runs)
    assert all("lora_" in n for n, d in runs[1][1].items() if d.abs().max() > 0)


def test_the_hidden_state_cache_gives_the_live_teacher(plain_sgd, small_world, small_tok, trained_small):
    """method.cache=auto with chunks keeps θ0's hidden states; step 2 reads them: the same as live, unchunked."""
    chunked = MethodConfig(forget="asu", retain="kl", forget_args={"tau": 4.0, "layers": [0]}, cache="auto")
    live = MethodConfig(forget="asu", retain="kl", forget_args={"tau": 4.0, "layers": [0]}, cache="none")
    _same(_step(trained_small, small_tok, small_world, live, 0, steps=2),
          _step(trained_small, small_tok, small_world, chunked, 5, steps=2))


def test_the_hidden_state_cache_is_chosen_and_sized_by_the_hidden_width():
    lines = []
    budget = CacheBudget("auto", 1.0, 8, False, log=lines.append, chunked=True)
    cache = budget.role("asu", "forget teacher", n_tokens=1000, frozen_use="kl")
    assert cache.kind == "hidden"
    budget.ensure(vocab=128_256, dtype=torch.float32, width=64)
    assert "1000 answer tokens × 64 hidden × 4 B" in lines[0] and "= 0.0003 GB" in lines[0]
    assert CacheBudget("auto", 1.0, 8, False).role("asu", "t", 10, "kl").kind == "exact"  # unchunked: the rows
    with pytest.raises(ConfigError, match="method.cache=topk .* train.vocab_chunk"):
        CacheBudget("topk", 1.0, 8, False, chunked=True).role("asu", "t", 10, "kl")


class _Largest(TorchDispatchMode):
    """The most rows of any [..., V] tensor an op returns while active (rows = numel / V)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel() // self.vocab)
        return out


def test_no_tokens_by_vocab_tensor_exists_in_the_forward_or_the_backward(small_world, small_tok, trained_small):
    """KL(teacher ‖ student) + NLL with 4 rows per chunk: no op returns a [rows, V] tensor of more rows than the
    head's transposed weight [H, V] (the unchunked path returns [N, V]), in the forward and the backward alike."""
    model = copy.deepcopy(trained_small).train()
    teacher = copy.deepcopy(trained_small).eval()
    batch = collate(encode_rows(small_tok, small_world.splits["forget10"][:N], 64), pad_id(small_tok))
    n, vocab = int((batch["labels"][:, 1:] != -100).sum()), model.config.vocab_size
    sizes = {}
    for chunk in (None, 4):
        with _Largest(vocab) as seen:
            with torch.no_grad():
                t = forward_stats(teacher, batch, chunk=chunk)
            s = forward_stats(model, batch, chunk=chunk)
            loss = map_rows(lambda p, q: (p.exp() * (p - q)).sum(-1), [t, s]).mean() + s.nll.mean()
            loss.backward()
        sizes[chunk] = seen.largest
    hidden = model.config.hidden_size
    assert sizes[None] >= n > hidden  # the unchunked path builds [N, V] ...
    assert sizes[4] <= hidden  # ... the chunked one [4, V] pieces (and the head's own [H, V] view)


def test_map_rows_gives_fn_on_every_row_in_order_and_empty_batches_their_shape(small_world, small_tok, trained_small):
    batch = collate(encode_rows(small_tok, small_world.splits["forget10"][:2], 64), pad_id(small_tok))
    with torch.no_grad():
        whole, pieces = forward_stats(trained_small, batch), forward_stats(trained_small, batch, chunk=3)
    torch.testing.assert_close(map_rows(lambda lp: lp.argmax(-1).float(), [pieces]),
                               whole.answer_log_probs().argmax(-1).float())
    torch.testing.assert_close(pieces.token_logp, whole.token_logp, **TOL)
    with pytest.raises(ValueError, match="vocabulary-chunked"):
        pieces.answer_log_probs()
    empty = dict(batch, labels=torch.full_like(batch["labels"], -100))
    with torch.no_grad():
        none = forward_stats(trained_small, empty, chunk=3)
    assert map_rows(lambda lp: lp.sum(-1), [none]).shape == (0,) and none.nll.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("setting, vocab, rows", [
    ("auto", 128_256, 65), ("auto", 151_936, 64), ("auto", 65_536, 128), ("auto", 65_535, None), ("auto", 49_152, None),
    ("auto", 1_000_000, 64), (0, 128_256, None), (512, 1024, 512)])
def test_the_chunk_size_a_setting_gives(setting, vocab, rows):
    assert resolve_vocab_chunk(setting, vocab) == rows


def test_bad_chunk_settings_are_refused():
    for bad in (-1, 1.5, "big", True):
        with pytest.raises(Exception, match="train.vocab_chunk"):
            TrainConfig(vocab_chunk=bad)
