"""Batched greedy generation and batched per-example answer loss, the two model calls evaluation makes.

Both sort their inputs by token length so that a batch holds examples of similar length (less
padding, less wasted compute) and return results in the caller's order. Generation follows
docs/METRICS.md §1.1: greedy, left padding, KV cache, cut at EOS. Losses go through `forward_stats`, the one
place that computes token log-probs, so `avg_loss` here is exactly `TokenStats.nll`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id, prompt_ids
from obliviate.modeling.logprobs import IGNORE_INDEX, forward_stats, head_width, output_head, resolve_vocab_chunk
from obliviate.progress import phase


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Put `model` in eval mode (no dropout) for the block, then restore its previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (where input tensors must go)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def length_order(lengths: Sequence[int]) -> list[int]:
    """Indices sorted by length (stable, so ties keep the caller's order)."""
    return sorted(range(len(lengths)), key=lambda i: lengths[i])


def chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    """Consecutive slices of at most `size` items."""
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start:start + size]


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """Token ids that end an answer: the tokenizer's EOS plus any EOS the model's generation config lists.

    Chat models often stop on an end-of-turn token that only the generation config names.
    """
    ids: list[int] = []
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for i in (source if isinstance(source, (list, tuple)) else [source]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an EOS token; "
                         "generation could not stop and cannot be cut at EOS")
    return ids


def decode_continuations(tokenizer: Any, new_ids: Tensor, eos_ids: Sequence[int]) -> list[str]:
    """Decode generated ids [B, L]: cut each row before its first EOS, skip special tokens, strip."""
    out = []
    for row in new_ids.tolist():
        cut = next((j for j, t in enumerate(row) if t in eos_ids), len(row))
        out.append(tokenizer.decode(row[:cut], skip_special_tokens=True).strip())
    return out


def cap_rows(new_ids: Tensor, caps: Sequence[int], fill: int) -> Tensor:
    """Generated ids [B, L] with row i's ids from position caps[i] on set to `fill` (an EOS: decoding cuts there)."""
    out = new_ids.clone()
    for i, cap in enumerate(caps):
        out[i, max(cap, 0):] = fill
    return out


def _greedy_batch(model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                  eos_ids: list[int], caps: Sequence[int] | None = None) -> list[str]:
    """Greedy continuations of one batch of prompt ids (left padded, KV cache); row i keeps <= caps[i] new ids."""
    enc = [Encoded(p, [IGNORE_INDEX] * len(p), False) for p in prompts]
    batch = collate(enc, pad_id(tokenizer), left=True)
    device = model_device(model)
    kwargs = dict(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                  max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, use_cache=True,
                  # Neutralise processors a checkpoint's generation_config may switch on: plain greedy only.
                  repetition_penalty=1.0, no_repeat_ngram_size=0, pad_token_id=pad_id(tokenizer), eos_token_id=eos_ids)
    try:  # a preallocated KV cache: no growing copies per step (same tokens; ~15% faster here)
        out = model.generate(**kwargs, cache_implementation="static")
    except (ValueError, TypeError, NotImplementedError):  # architectures without a static cache
        out = model.generate(**kwargs)
    width = batch["input_ids"].shape[1]
    new_ids = out[:, width:].cpu()
    return decode_continuations(tokenizer, new_ids if caps is None else cap_rows(new_ids, caps, eos_ids[0]), eos_ids)


@torch.no_grad()
def greedy_ids(model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, max_new_tokens: int,
               batch_size: int, desc: str = "generating") -> list[str]:
    """Greedy continuations of prompt ids, batched in length order, returned in input order."""
    eos = stop_ids(model, tokenizer)
    out = [""] * len(prompts)
    with eval_mode(model), phase(desc, len(prompts)) as advance:
        for idx in chunks(length_order([len(p) for p in prompts]), batch_size):
            for i, text in zip(idx, _greedy_batch(model, tokenizer, [list(prompts[i]) for i in idx], max_new_tokens, eos)):
                out[i] = text
            advance(len(idx))
    return out


def answer_budgets(prompt_lengths: Sequence[int], max_new_tokens: int, max_total_tokens: int | None) -> list[int]:
    """New tokens each prompt may get: max_new_tokens, or max_total_tokens - prompt length when that total is
    set (HF generate's max_length, as the closer-look authors generate; <= 0 = no room). [N] -> [N]."""
    if max_total_tokens is None:
        return [max_new_tokens] * len(prompt_lengths)
    return [max_total_tokens - n for n in prompt_lengths]


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, questions: Sequence[str], *, max_new_tokens: int = 200,
                     batch_size: int = 16, max_total_tokens: int | None = None,
                     desc: str = "generating answers") -> list[str]:
    """Greedy answers to `questions` (docs/METRICS.md §1.1; TOFU uses 200 new tokens), in input order.

    max_total_tokens (closer-look: 200) bounds prompt + answer per row instead; a prompt that fills it gets "".
    A call that runs over 10 s shows its progress as `desc` (obliviate.progress).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    budgets = answer_budgets([len(p) for p in prompts], max_new_tokens, max_total_tokens)
    eos_ids = stop_ids(model, tokenizer)
    answers = [""] * len(prompts)
    with eval_mode(model), phase(desc, len(prompts)) as advance:
        for idx in chunks(length_order([len(p) for p in prompts]), batch_size):
            advance(len(idx))
            idx = [i for i in idx if budgets[i] >= 1]
            if not idx:
                continue
            caps = None if max_total_tokens is None else [budgets[i] for i in idx]
            texts = _greedy_batch(model, tokenizer, [prompts[i] for i in idx], max(budgets[i] for i in idx),
                                  eos_ids, caps)
            for i, text in zip(idx, texts):
                answers[i] = text
    return answers


@torch.no_grad()
def batched_avg_loss(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32,
                     max_length: int = 256, share_prompts: bool = True, desc: str = "scoring answers") -> np.ndarray:
    """Per-example mean answer NLL `avg_loss(q, a)` (docs/METRICS.md §1.1) of (question, answer) pairs -> [N] float64.

    With `share_prompts`, answers to the same question (TOFU scores the answer, its paraphrase and five
    perturbed answers of each question) are scored after ONE forward of their shared prompt (`_shared_losses`),
    when a first check on the model shows the same values as the plain path; singletons go the plain way."""
    encoded = [encode_qa(tokenizer, q, a, max_length) for q, a in pairs]
    losses = np.zeros(len(encoded), dtype=np.float64)
    device = model_device(model)
    pad = pad_id(tokenizer)
    groups = prompt_groups(encoded) if share_prompts and batch_size > 1 else []  # batch 1: one example at a time
    shared = [g for g in groups if len(g) > 1]
    with eval_mode(model), phase(desc, len(encoded)) as advance:
        if shared and _sharing_is_exact(model, encoded, shared[0], pad, device):
            for chunk in _group_chunks(shared, batch_size):
                idx = [i for g in chunk for i in g]
                losses[idx] = _shared_losses(model, [[encoded[i] for i in g] for g in chunk], pad, device)
                advance(len(idx))
            done = {i for g in shared for i in g}
        else:
            done = set()
        rest = [i for i in range(len(encoded)) if i not in done]
        for part in chunks(length_order([len(encoded[i].input_ids) for i in rest]), batch_size):
            idx = [rest[j] for j in part]
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad).items()}
            losses[idx] = forward_stats(model, batch, keep_logits=False, chunk=scoring_chunk(model)).nll.double().cpu().numpy()
            advance(len(idx))
    return losses


def scoring_chunk(model: Any) -> int | None:
    """Rows per vocabulary chunk when answers are scored: train.vocab_chunk's `auto` rule at the model's vocabulary
    (None below 64k ids), so a large vocabulary never needs a [tokens, vocab] tensor here either."""
    head = output_head(model)
    return None if head is None else resolve_vocab_chunk("auto", head_width(head))


def prompt_length(e: Encoded) -> int:
    """Tokens before the first label (the prompt)."""
    return next((j for j, t in enumerate(e.labels) if t != IGNORE_INDEX), len(e.labels))


def prompt_groups(encoded: Sequence[Encoded]) -> list[list[int]]:
    """Indices grouped by identical prompt ids (groups ordered by prompt length; each in input order)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, e in enumerate(encoded):
        n = prompt_length(e)
        if 0 < n < len(e.input_ids):
            by_prompt.setdefault(tuple(e.input_ids[:n]), []).append(i)
    return sorted(by_prompt.values(), key=lambda g: len(encoded[g[0]].input_ids))


def _group_chunks(groups: list[list[int]], batch_size: int) -> Iterator[list[list[int]]]:
    """Consecutive groups with at most `batch_size` answers in all (a larger group alone)."""
    chunk: list[list[int]] = []
    for g in groups:
        if chunk and sum(len(c) for c in chunk) + len(g) > batch_size:
            yield chunk
            chunk = []
        chunk.append(g)
    if chunk:
        yield chunk


def _positions(mask: Tensor, offset: Tensor | None = None) -> Tensor:
    """Position ids from an attention mask [B, T] (left padding: 0 from the first real token), plus `offset` [B]."""
    pos = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return pos if offset is None else pos + offset.unsqueeze(-1)


def _shared_losses(model: Any, groups: list[list[Encoded]], pad: int, device: torch.device) -> np.ndarray:
    """Mean answer NLL of every answer in `groups` (each group: one prompt, several answers) -> [Σ sizes].

    One left-padded forward of the G prompts (KV cache kept), then one right-padded forward of all answers with
    the prompt cache repeated per answer and positions continuing each prompt. The last prompt position's logits
    predict the first answer token; the answer forward predicts the rest. Shapes: prompts [G, P], answers [N, A]."""
    prompts = [Encoded(g[0].input_ids[:prompt_length(g[0])], [], False) for g in groups]
    answers = [Encoded(e.input_ids[prompt_length(e):], e.labels[prompt_length(e):], False) for g in groups for e in g]
    owner = torch.tensor([k for k, g in enumerate(groups) for _ in g], device=device)
    pb = collate([Encoded(p.input_ids, [IGNORE_INDEX] * len(p.input_ids), False) for p in prompts], pad, left=True)
    pmask = pb["attention_mask"].to(device)
    out = model(input_ids=pb["input_ids"].to(device), attention_mask=pmask, position_ids=_positions(pmask),
                use_cache=True, logits_to_keep=1)
    first = torch.log_softmax(out.logits[:, -1].float(), -1)[owner]  # [N, V]: predicts each answer's first token
    cache = out.cache if hasattr(out, "cache") else out.past_key_values  # transformers 5 names it `cache`
    cache.batch_select_indices(owner)
    ab = collate(answers, pad)
    amask = ab["attention_mask"].to(device)
    lengths = pmask.sum(-1)[owner]
    full_mask = torch.cat([pmask[owner], amask], dim=-1)
    labels = ab["labels"].to(device)
    # the answer forward sees [prompt cache | answer]; its logits at answer position t predict answer token t+1
    stats = forward_stats(model, {"input_ids": ab["input_ids"].to(device), "attention_mask": full_mask,
                                  "labels": labels, "position_ids": _positions(amask, lengths), "cache": cache},
                          keep_logits=False, chunk=scoring_chunk(model))
    first_lp = first.gather(-1, ab["input_ids"].to(device)[:, :1]).squeeze(-1)  # every answer has >= 1 token
    first_counts = (labels[:, 0] != IGNORE_INDEX).to(first_lp.dtype)
    total = stats.logp.double() + (first_lp * first_counts).double()
    count = stats.mask.sum(-1).double() + first_counts.double()
    return (-total / count.clamp_min(1)).cpu().numpy()


_SHARING_OK: dict[tuple[type, torch.dtype], bool] = {}  # per architecture and dtype: checked once a process


def _sharing_is_exact(model: Any, encoded: Sequence[Encoded], group: list[int], pad: int, device: torch.device) -> bool:
    """Whether prompt sharing gives this model's plain values (1e-4 relative) on one group: a model whose forward
    ignores position_ids or a KV cache would not; it then keeps the plain path. The answer depends on the
    architecture and precision, not the weights, so it is measured once per (class, dtype)."""
    key = (type(model), next(model.parameters()).dtype)
    if key not in _SHARING_OK:
        _SHARING_OK[key] = _measure_sharing(model, encoded, group, pad, device)
    return _SHARING_OK[key]


def _measure_sharing(model: Any, encoded: Sequence[Encoded], group: list[int], pad: int, device: torch.device) -> bool:
    """Shared-prompt losses of one group equal the plain path's (see `_sharing_is_exact`)."""
    try:
        shared = _shared_losses(model, [[encoded[i] for i in group]], pad, device)
    except (TypeError, ValueError, RuntimeError, AttributeError):
        return False
    batch = {k: v.to(device) for k, v in collate([encoded[i] for i in group], pad).items()}
    plain = forward_stats(model, batch, keep_logits=False).nll.double().cpu().numpy()
    return bool(np.allclose(shared, plain, rtol=1e-4, atol=1e-5))
