"""A batch's shared leading tokens run once: the prefix forward on one row, the rest of every row on its KV cache.

Chat-formatted rows start with the same tokens (SmolLM2's default system turn is about 20 of a 47-token forget
row), and right-padded rows of one batch are aligned from position 0. When the first P tokens are identical in
every row, attended to by all of them, and predict no label (the shifted label mask is False on columns 0..P-1),
the model runs on input_ids[:1, :P] once (KV cache kept, gradients on) and then on input_ids[:, P:] with that
cache repeated B times, positions P..T-1 and the full [B, T] attention mask. Attention over [prefix | rest] is
the same computation as over the whole row, so values and gradients equal the plain forward's up to float
rounding (the prefix's gradient is the sum over the B rows that read it, as the repeat's backward gives).
What it saves: B-1 rows × P tokens of every decoder layer, forward and backward.

Whether a model's forward honours a cache and position ids is measured once per (class, dtype, attention
backend, training mode) on the first eligible batch (`prefix_is_exact`: the label log-probs of both paths agree
to 1e-3 relative, 1e-4 absolute); a model that fails keeps the plain path. Never used under torch.distributed
(DDP/FSDP count one forward per backward), gradient checkpointing (transformers turns the cache off) or
torch.compile.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import Tensor

MIN_PREFIX = 8  # shorter shared prefixes are not worth the extra forward call


def cache_keyword(model: Any) -> str:
    """The name a model's forward gives its KV cache argument (`cache` from transformers 5, else
    `past_key_values`); a PEFT model passes its keyword arguments on, so its base model's forward decides."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def shared_prefix_length(input_ids: Tensor, attention_mask: Tensor, label_mask: Tensor,
                         min_length: int = MIN_PREFIX) -> int:
    """P: the leading positions whose token is the same in every row, attended in every row, and that predict
    no label; input_ids, attention_mask [B, T], label_mask [B, T-1] (shifted) -> 0 when P < `min_length`, when
    B < 2, or when no position would be left after it."""
    B, T = input_ids.shape
    if B < 2 or T < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & (attention_mask != 0).all(0)  # [T]
    common = int(same.long().cumprod(0).sum())
    labelled = label_mask.any(0).nonzero()
    first_label = int(labelled[0]) if len(labelled) else T - 1  # logit column j predicts token j + 1
    length = min(common, first_label, T - 1)
    return length if length >= min_length else 0


def eligible(model: torch.nn.Module) -> bool:
    """Whether prefix sharing may run on `model` here (module docstring: not distributed, no gradient
    checkpointing, not compiled)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    flag = "is_activation_checkpointing" if hasattr(type(inner), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"  # transformers 5 renamed it (the old name warns)
    if getattr(inner, flag, False) or hasattr(inner, "_orig_mod"):
        return False
    return not any(hasattr(m, "_orig_mod") or type(m).__name__ == "OptimizedModule" for m in inner.modules())


def prefix_forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, length: int) -> Any:
    """The model's output on input_ids[:, length:] [B, T-P] after the shared prefix input_ids[0, :length] ran
    once; its logits (and decoder-layer outputs) cover the T-P positions after the prefix only.

    The token embeddings of the batch are looked up once and handed to both calls (inputs_embeds), so the
    embedding's backward runs once, as in the plain forward: its gradient is a dense [V, H] tensor (tied with the
    LM head on SmolLM2), whose zeroing and accumulation cost more than the prefix saves on a CPU."""
    B, T = input_ids.shape
    keyword = cache_keyword(model)
    embeds = model.get_input_embeddings()(input_ids)  # [B, T, H]
    head = model(inputs_embeds=embeds[:1, :length], attention_mask=attention_mask[:1, :length], use_cache=True,
                 logits_to_keep=1)
    cache = getattr(head, "cache", None)
    cache = cache if cache is not None else head.past_key_values
    cache.batch_repeat_interleave(B)
    positions = torch.arange(length, T, device=input_ids.device).expand(B, -1)
    return model(inputs_embeds=embeds[:, length:], attention_mask=attention_mask, position_ids=positions,
                 use_cache=True, **{keyword: cache})


_EXACT: dict[tuple, bool] = {}  # (kind, class, dtype, attention backend, training) -> a shared path measured exact


def prefix_is_exact(model: torch.nn.Module, measure: Callable[[], bool], kind: str = "prefix") -> bool:
    """Whether a shared path (`kind`: this module's prefix, or eval's shared prompts) gives this model's plain
    values: `measure()` once per (kind, class, dtype, attention backend, training mode), its answer kept for the
    process; an error while measuring counts as no. The RNG state is left as it was (a model with dropout would
    otherwise draw differently after the check)."""
    config = getattr(model, "config", None)
    try:
        dtype = next(model.parameters()).dtype
    except StopIteration:
        return False
    key = (kind, type(model), dtype, getattr(config, "_attn_implementation", None), model.training)
    if key not in _EXACT:
        with torch.random.fork_rng(), torch.no_grad():
            try:
                _EXACT[key] = bool(measure())
            except (TypeError, ValueError, RuntimeError, AttributeError):
                _EXACT[key] = False
    return _EXACT[key]
