"""Greedy decoding for evaluation: one loop over the model's own forward, no `generate` machinery.

Why a loop of our own (docs/METRICS.md §1.1 fixes what it computes: greedy, left padding, KV cache, cut at EOS):

* **Finished rows leave the batch.** `generate` keeps computing a row after its EOS until every row of the batch is
  done; here, once an eighth of the rows still in the batch have stopped, they are dropped from the batch and from
  the KV cache (`Cache.batch_select_indices`), so a batch costs what its rows need and large batches are safe.
* **A KV cache that grows without copies.** Full-attention layers write into a buffer allocated once for the
  longest row (`GrowingLayer`) and attend over the filled part only: no `torch.cat` of the whole cache per step
  (Hugging Face's dynamic cache) and no attention over empty slots (its static cache). Sliding-window, linear and
  other special layers keep the layer class the model's config asks for.
* **Plain greedy only.** No logits processors (a checkpoint's `generation_config` may switch on repetition
  penalties); the argmax of the last position's logits.

The ids equal `model.generate(do_sample=False)`'s up to each row's first EOS (tests/eval/test_decode.py compares
them on models with and without padding, stops and budgets).
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any, Sequence

import torch
from torch import Tensor

from obliviate.data.tokenize import Encoded, collate
from obliviate.modeling.logprobs import IGNORE_INDEX
from obliviate.modeling.prefix import cache_keyword

COMPACT_SHARE = 0.125  # drop stopped rows once they are this share of the rows still in the batch
MAX_ROWS = 512  # the most rows an automatic generation batch holds
ROW_BUDGET_CPU = 2 << 30  # bytes of KV cache + logits the automatic batch may take on a CPU (or a quarter of free RAM)


def cache_classes() -> tuple[type, type] | None:
    """(transformers' DynamicLayer, DynamicCache), or None on a version without per-layer caches."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return None
    return DynamicLayer, DynamicCache


@lru_cache(maxsize=1)
def _growing_layer_class() -> type | None:
    """A DynamicLayer subclass whose keys/values live in a buffer allocated for `capacity` positions (made once)."""
    classes = cache_classes()
    if classes is None:
        return None
    base = classes[0]

    class GrowingLayer(base):  # type: ignore[misc, valid-type]
        """Keys/values [B, H, capacity, D] written in place; `keys`/`values` are views of the filled part."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity, self.length = int(capacity), 0

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            self.device = key_states.device
            b, h, _, dk = key_states.shape
            self._k = key_states.new_empty((b, h, self.capacity, dk))
            self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
            self.length = 0
            self._views()
            self.is_initialized = True

        def _views(self) -> None:
            self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            if self.length + n > self.capacity:  # more than planned: grow (once per doubling)
                grow = max(self.capacity, n)
                self._k = torch.cat([self._k, self._k.new_empty(self._k.shape[:2] + (grow,) + self._k.shape[3:])], 2)
                self._v = torch.cat([self._v, self._v.new_empty(self._v.shape[:2] + (grow,) + self._v.shape[3:])], 2)
                self.capacity += grow
            self._k[:, :, self.length:self.length + n] = key_states
            self._v[:, :, self.length:self.length + n] = value_states
            self.length += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length if self.is_initialized else 0

        def batch_select_indices(self, indices: Tensor) -> None:
            if self.is_initialized:
                self._k, self._v = self._k[indices], self._v[indices]
                self._views()

        def reorder_cache(self, beam_idx: Tensor) -> None:
            self.batch_select_indices(beam_idx)

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative number of tokens to remove")
            if self.is_initialized:
                self.length = max(self.length + tokens_to_remove, 0)
                self._views()

        def reset(self) -> None:
            self.length = 0
            if self.is_initialized:
                self._views()

    return GrowingLayer


def growing_cache(model: Any, capacity: int) -> Any:
    """A KV cache for `model` whose full-attention layers hold `capacity` positions without copies; other layer kinds
    as `DynamicCache(config=...)` makes them. None when this transformers has no per-layer caches (the model then
    makes its own cache)."""
    growing, classes = _growing_layer_class(), cache_classes()
    if growing is None or classes is None:
        return None
    base, dynamic_cache = classes
    config = getattr(model, "config", None)
    try:
        cache = dynamic_cache(config=config)
    except (TypeError, ValueError, AttributeError):
        return None
    if not cache.layers:  # no config: layers appear lazily, each a plain DynamicLayer
        return None
    cache.layers = [growing(capacity) if type(layer) is base else layer for layer in cache.layers]
    return cache


def _last_logits(model: Any, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any, keyword: str,
                 out_cache: list[Any]) -> Tensor:
    """Logits [B, V] of the last position of one forward (KV cache kept in `out_cache[0]`)."""
    kwargs: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    if cache is not None:
        kwargs[keyword] = cache
    try:
        out = model(**kwargs, logits_to_keep=1)
    except TypeError:  # a model whose forward does not take logits_to_keep
        out = model(**kwargs)
    got = getattr(out, "cache", None)
    out_cache[0] = got if got is not None else out.past_key_values
    return out.logits[:, -1]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (where input tensors must go)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def greedy_decode(model: Any, prompts: Sequence[list[int]], budgets: Sequence[int], eos_ids: Sequence[int],
                  pad: int) -> list[list[int]]:
    """Greedy new ids of one batch of prompts (left padded), row i ending before its first EOS or after budgets[i]
    ids (>= 1 each). prompts [B] lists of ids -> [B] lists of new ids (EOS not included)."""
    if not prompts:
        return []
    if len(budgets) != len(prompts) or min(budgets) < 1:
        raise ValueError("one budget >= 1 per prompt is needed")
    device = model_device(model)
    batch = collate([Encoded(list(p), [IGNORE_INDEX] * len(p), False) for p in prompts], pad, left=True)
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    steps = max(budgets)
    keyword, holder = cache_keyword(model), [None]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = _last_logits(model, ids, mask, positions, growing_cache(model, ids.shape[1] + steps), keyword, holder)
    nxt = logits.argmax(-1)
    n = len(prompts)
    out = torch.empty((n, steps), dtype=torch.long, device=device)
    kept = torch.zeros(n, dtype=torch.long, device=device)  # new ids each row keeps
    alive = torch.arange(n, device=device)  # original index of each row still in the batch
    budget = torch.tensor(list(budgets), device=device)
    eos = torch.tensor(list(eos_ids), device=device)
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    last = positions[:, -1]
    for t in range(steps):
        out[alive, t] = nxt
        is_eos = torch.isin(nxt, eos)
        stop = ~stopped & (is_eos | (budget[alive] <= t + 1))
        kept[alive[stop]] = t + 1 - is_eos[stop].long()
        stopped |= stop
        done = int(stopped.sum())
        if done == len(alive):
            break
        if done and done >= COMPACT_SHARE * len(alive):
            keep = (~stopped).nonzero().squeeze(-1)
            holder[0].batch_select_indices(keep)
            alive, nxt, mask, last, stopped = alive[keep], nxt[keep], mask[keep], last[keep], stopped[keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        last = last + 1
        nxt = _last_logits(model, nxt[:, None], mask, last[:, None], holder[0], keyword, holder).argmax(-1)
    lengths = kept.tolist()
    return [row[:k] for row, k in zip(out.tolist(), lengths)]


def kv_bytes_per_token(model: Any) -> int | None:
    """Bytes one token of one row takes in the KV cache (2 × layers × KV heads × head dim × element size), from the
    model's config; None when the config does not say."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layers, heads = getattr(text, "num_hidden_layers", None), getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    hidden = getattr(text, "hidden_size", None)
    head_dim = getattr(text, "head_dim", None) or (hidden // heads if hidden and heads else None)
    if not all(isinstance(x, int) and x > 0 for x in (layers, kv_heads, head_dim)):
        return None
    try:
        size = next(model.parameters()).element_size()
    except StopIteration:
        size = 4
    return 2 * layers * kv_heads * head_dim * size


def free_bytes(device: torch.device) -> int:
    """Memory the automatic batch may use: half the free memory of a CUDA device; on a CPU a quarter of the free
    RAM, at most ROW_BUDGET_CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) // 2
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 4 * ROW_BUDGET_CPU
    return min(ROW_BUDGET_CPU, int(avail) // 4)


def generation_rows(model: Any, tokens_per_row: int, vocab: int, budget: int) -> int:
    """Rows of an automatic generation batch: as many as `budget` bytes hold at tokens_per_row KV positions each
    plus two [V] float32 logit rows, between 1 and MAX_ROWS (64 when the config does not give the KV size)."""
    per_token = kv_bytes_per_token(model)
    if per_token is None:
        return 64
    per_row = per_token * max(tokens_per_row, 1) + 8 * max(vocab, 1)
    return max(1, min(MAX_ROWS, budget // per_row))
