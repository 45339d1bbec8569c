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

from obliviate.data.tokenize import Encoded, collate, encode_qa_many, pad_id, prompt_ids
from obliviate.eval.decode import cache_classes, free_bytes, generation_rows, greedy_decode, model_device
from obliviate.modeling.logprobs import IGNORE_INDEX, forward_stats, head_width, output_head, resolve_vocab_chunk
from obliviate.modeling.prefix import prefix_is_exact
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


def decode_continuations(tokenizer: Any, new_ids: Sequence[Sequence[int]], eos_ids: Sequence[int]) -> list[str]:
    """Decode generated ids (rows of any length): cut each row before its first EOS, skip special tokens, strip."""
    rows = []
    for row in (new_ids.tolist() if isinstance(new_ids, Tensor) else new_ids):
        row = list(row)
        rows.append(row[:next((j for j, t in enumerate(row) if t in eos_ids), len(row))])
    return [text.strip() for text in tokenizer.batch_decode(rows, skip_special_tokens=True)] if rows else []


def generation_batches(model: Any, prompts: Sequence[Sequence[int]], budgets: Sequence[int],
                       batch_size: int | None) -> Iterator[list[int]]:
    """Indices of `prompts` in length order, cut into generation batches: `batch_size` rows each, or with None as
    many as the KV cache budget holds at the longest prompt + answer (`decode.generation_rows`)."""
    order = [i for i in length_order([len(p) for p in prompts]) if budgets[i] >= 1]
    if batch_size is not None:
        yield from (list(c) for c in chunks(order, batch_size))
        return
    if not order:
        return
    head = output_head(model)
    vocab = head_width(head) if head is not None else 0
    longest = max(len(prompts[i]) + budgets[i] for i in order)
    rows = generation_rows(model, longest, vocab, free_bytes(model_device(model)))
    yield from (list(c) for c in chunks(order, rows))


def _generate(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], budgets: Sequence[int],
              batch_size: int | None, desc: str) -> list[str]:
    """Greedy continuations of prompt ids, row i at most budgets[i] new ids ("" where < 1), in input order."""
    eos_ids = stop_ids(model, tokenizer)
    pad = pad_id(tokenizer)
    out = [""] * len(prompts)
    with eval_mode(model), phase(desc, len(prompts)) as advance:
        advance(sum(1 for b in budgets if b < 1))
        for idx in generation_batches(model, prompts, budgets, batch_size):
            ids = greedy_decode(model, [list(prompts[i]) for i in idx], [budgets[i] for i in idx], eos_ids, pad)
            for i, text in zip(idx, decode_continuations(tokenizer, ids, eos_ids)):
                out[i] = text
            advance(len(idx))
    return out


@torch.no_grad()
def greedy_ids(model: Any, tokenizer: Any, prompts: Sequence[list[int]], *, max_new_tokens: int,
               batch_size: int | None, desc: str = "generating") -> list[str]:
    """Greedy continuations of prompt ids, batched in length order (None: automatic rows), in input order."""
    return _generate(model, tokenizer, prompts, [max_new_tokens] * len(prompts), batch_size, desc)


def answer_budgets(prompt_lengths: Sequence[int], max_new_tokens: int, max_total_tokens: int | None) -> list[int]:
    """New tokens each prompt may get: max_new_tokens, or max_total_tokens - prompt length when that total is
    set (HF generate's max_length, as the closer-look authors generate; <= 0 = no room). [N] -> [N]."""
    if max_total_tokens is None:
        return [max_new_tokens] * len(prompt_lengths)
    return [max_total_tokens - n for n in prompt_lengths]


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, questions: Sequence[str], *, max_new_tokens: int = 200,
                     batch_size: int | None = 16, max_total_tokens: int | None = None,
                     desc: str = "generating answers") -> list[str]:
    """Greedy answers to `questions` (docs/METRICS.md §1.1; TOFU uses 200 new tokens), in input order.

    max_total_tokens (closer-look: 200) bounds prompt + answer per row instead; a prompt that fills it gets "".
    batch_size None: as many rows per batch as the KV cache budget holds (`generation_batches`).
    A call that runs over 10 s shows its progress as `desc` (obliviate.progress).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    budgets = answer_budgets([len(p) for p in prompts], max_new_tokens, max_total_tokens)
    return _generate(model, tokenizer, prompts, budgets, batch_size, desc)


SCORE_TOKENS = 2048  # padded answer tokens per forward when answers are scored with an automatic batch size (CPU;
# fastest of 1,024-8,192 on TOFU retain, the [tokens, H] activations staying in cache); x8 on a GPU
SCORE_WINDOW = 512  # answers whose prompts are run once together (automatic batch size)


def token_batches(lengths: Sequence[int], batch_size: int | None, tokens: int = SCORE_TOKENS) -> list[list[int]]:
    """Positions of `lengths` in length order, cut into batches of `batch_size`, or (None) into batches of at most
    `tokens` padded tokens (at least one row each)."""
    order = length_order(lengths)
    if batch_size is not None:
        return [list(c) for c in chunks(order, batch_size)]
    out: list[list[int]] = []
    for i in order:  # ascending: the row just added is the batch's longest
        if out and (len(out[-1]) + 1) * lengths[i] <= tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def score_tokens(device: torch.device) -> int:
    """Padded tokens per scoring forward with an automatic batch size: SCORE_TOKENS on a CPU, 8x on an accelerator."""
    return SCORE_TOKENS if device.type == "cpu" else 8 * SCORE_TOKENS


@torch.no_grad()
def batched_avg_loss(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, batch_size: int | None = 32,
                     max_length: int = 256, share_prompts: bool = True, desc: str = "scoring answers") -> np.ndarray:
    """Per-example mean answer NLL `avg_loss(q, a)` (docs/METRICS.md §1.1) of (question, answer) pairs -> [N] float64.

    With `share_prompts`, answers to the same question (TOFU scores the answer, its paraphrase and five
    perturbed answers of each question) are scored after ONE forward of their shared prompt (`_shared_losses`),
    when a first check on the model shows the same values as the plain path; singletons go the plain way.
    batch_size: answers per forward; None: batches of at most SCORE_TOKENS padded answer tokens in length order."""
    encoded = encode_qa_many(tokenizer, pairs, max_length)
    losses = np.zeros(len(encoded), dtype=np.float64)
    device = model_device(model)
    pad = pad_id(tokenizer)
    groups = prompt_groups(encoded) if share_prompts and batch_size != 1 else []  # batch 1: one example at a time
    shared = [g for g in groups if len(g) > 1]
    with eval_mode(model), phase(desc, len(encoded)) as advance:
        if shared and _sharing_is_exact(model, encoded, shared[0], pad, device):
            for window in _group_chunks(shared, batch_size or SCORE_WINDOW):
                idx = [i for g in window for i in g]
                losses[idx] = _shared_losses(model, [[encoded[i] for i in g] for g in window], pad, device, batch_size)
                advance(len(idx))
            done = {i for g in shared for i in g}
        else:
            done = set()
        rest = [i for i in range(len(encoded)) if i not in done]
        chunk = scoring_chunk(model)
        for part in token_batches([len(encoded[i].input_ids) for i in rest], batch_size, score_tokens(device)):
            idx = [rest[j] for j in part]
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad).items()}
            losses[idx] = forward_stats(model, batch, keep_logits=False, chunk=chunk).nll.double().cpu().numpy()
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


def _shared_losses(model: Any, groups: list[list[Encoded]], pad: int, device: torch.device,
                   batch_size: int | None = None) -> np.ndarray:
    """Mean answer NLL of every answer in `groups` (each group: one prompt, several answers) -> [Σ sizes].

    One left-padded forward of the G prompts (KV cache kept); then the answers in length order, `token_batches` of
    them at a time (batch_size as there), each one right-padded forward with its rows of the prompt cache and
    positions continuing each prompt. The last prompt position's logits predict the first answer token; the answer
    forward predicts the rest. Shapes: prompts [G, P], answers [N, A]."""
    prompts = [Encoded(g[0].input_ids[:prompt_length(g[0])], [], False) for g in groups]
    answers = [Encoded(e.input_ids[prompt_length(e):], e.labels[prompt_length(e):], False) for g in groups for e in g]
    owner = torch.tensor([k for k, g in enumerate(groups) for _ in g], device=device)
    pb = collate([Encoded(p.input_ids, [IGNORE_INDEX] * len(p.input_ids), False) for p in prompts], pad, left=True)
    pmask = pb["attention_mask"].to(device)
    out = model(input_ids=pb["input_ids"].to(device), attention_mask=pmask, position_ids=_positions(pmask),
                use_cache=True, logits_to_keep=1)
    first_all = torch.log_softmax(out.logits[:, -1].float(), -1)  # [G, V]: predicts each answer's first token
    cache = out.cache if hasattr(out, "cache") else out.past_key_values  # transformers 5 names it `cache`
    batches = token_batches([len(a.input_ids) for a in answers], batch_size, score_tokens(device))
    saved = _cache_tensors(cache) if len(batches) > 1 else None
    if len(batches) > 1 and saved is None:  # a cache that cannot be given back its rows: one batch
        batches = [list(range(len(answers)))]
    result = np.zeros(len(answers), dtype=np.float64)
    chunk = scoring_chunk(model)
    for part in batches:
        if saved is not None:
            _restore_cache(cache, saved)
        rows = owner[torch.tensor(part, device=device)]
        cache.batch_select_indices(rows)
        ab = collate([answers[i] for i in part], pad)
        amask = ab["attention_mask"].to(device)
        full_mask = torch.cat([pmask[rows], amask], dim=-1)
        labels = ab["labels"].to(device)
        # the answer forward sees [prompt cache | answer]; its logits at answer position t predict answer token t+1
        stats = forward_stats(model, {"input_ids": ab["input_ids"].to(device), "attention_mask": full_mask,
                                      "labels": labels, "position_ids": _positions(amask, pmask.sum(-1)[rows]),
                                      "cache": cache}, keep_logits=False, chunk=chunk)
        first_lp = first_all[rows].gather(-1, ab["input_ids"].to(device)[:, :1]).squeeze(-1)  # every answer has >= 1
        first_counts = (labels[:, 0] != IGNORE_INDEX).to(first_lp.dtype)
        total = stats.logp.double() + (first_lp * first_counts).double()
        count = stats.mask.sum(-1).double() + first_counts.double()
        result[part] = (-total / count.clamp_min(1)).cpu().numpy()
    return result


def _cache_tensors(cache: Any) -> list[tuple[Tensor, Tensor]] | None:
    """The prompt cache's (keys, values) per layer, to give each answer batch its rows again; None when a layer is
    not a plain full-attention layer (sliding windows keep more state), and the caller then cannot split."""
    layers, classes = getattr(cache, "layers", None), cache_classes()
    if not layers or classes is None or any(type(layer) is not classes[0] for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _restore_cache(cache: Any, saved: list[tuple[Tensor, Tensor]]) -> None:
    """Put the saved prompt keys/values back (each answer forward appended its own positions)."""
    for layer, (k, v) in zip(cache.layers, saved):
        layer.keys, layer.values = k, v


def _sharing_is_exact(model: Any, encoded: Sequence[Encoded], group: list[int], pad: int, device: torch.device) -> bool:
    """Whether prompt sharing gives this model's plain values (1e-4 relative) on one group: a model whose forward
    ignores position_ids or a KV cache would not; it then keeps the plain path. The answer depends on the
    architecture and precision, not the weights, so it is measured once per kind of model (`prefix_is_exact`)."""
    return prefix_is_exact(model, lambda: _measure_sharing(model, encoded, group, pad, device), kind="prompt")


def _measure_sharing(model: Any, encoded: Sequence[Encoded], group: list[int], pad: int, device: torch.device) -> bool:
    """Shared-prompt losses of one group equal the plain path's (see `_sharing_is_exact`)."""
    shared = _shared_losses(model, [[encoded[i] for i in group]], pad, device)  # an error: prefix_is_exact's no
    batch = {k: v.to(device) for k, v in collate([encoded[i] for i in group], pad).items()}
    plain = forward_stats(model, batch, keep_logits=False).nll.double().cpu().numpy()
    return bool(np.allclose(shared, plain, rtol=1e-4, atol=1e-5))
