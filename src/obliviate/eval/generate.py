"""Batched greedy generation and batched per-example answer loss, the two model calls evaluation makes.

Both sort their inputs by token length so that a batch holds examples of similar length (less
padding, less wasted compute) and return results in the caller's order. Generation follows
METRICS.md: greedy, left padding, KV cache, cut at EOS. Losses go through `forward_stats`, the one
place that computes token log-probs, so `avg_loss` here is exactly `TokenStats.nll`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id, prompt_ids
from obliviate.modeling.logprobs import IGNORE_INDEX, forward_stats


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
    out = model.generate(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        # Neutralise processors a checkpoint's generation_config may switch on: plain greedy only.
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        pad_token_id=pad_id(tokenizer),
        eos_token_id=eos_ids,
    )
    width = batch["input_ids"].shape[1]
    new_ids = out[:, width:].cpu()
    return decode_continuations(tokenizer, new_ids if caps is None else cap_rows(new_ids, caps, eos_ids[0]), eos_ids)


def answer_budgets(prompt_lengths: Sequence[int], max_new_tokens: int, max_total_tokens: int | None) -> list[int]:
    """New tokens each prompt may get: max_new_tokens, or max_total_tokens - prompt length when that total is
    set (HF generate's max_length, as the closer-look authors generate; <= 0 = no room). [N] -> [N]."""
    if max_total_tokens is None:
        return [max_new_tokens] * len(prompt_lengths)
    return [max_total_tokens - n for n in prompt_lengths]


@torch.no_grad()
def generate_answers(model: Any, tokenizer: Any, questions: Sequence[str], *, max_new_tokens: int = 200,
                     batch_size: int = 16, max_total_tokens: int | None = None) -> list[str]:
    """Greedy answers to `questions` (METRICS.md "Generation"; TOFU uses 200 new tokens), in input order.

    max_total_tokens (closer-look: 200) bounds prompt + answer per row instead; a prompt that fills it gets "".
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    budgets = answer_budgets([len(p) for p in prompts], max_new_tokens, max_total_tokens)
    eos_ids = stop_ids(model, tokenizer)
    answers = [""] * len(prompts)
    with eval_mode(model):
        for idx in chunks(length_order([len(p) for p in prompts]), batch_size):
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
                     max_length: int = 256) -> np.ndarray:
    """Per-example mean answer NLL `avg_loss(q, a)` (METRICS.md) of (question, answer) pairs -> [N] float64."""
    encoded = [encode_qa(tokenizer, q, a, max_length) for q, a in pairs]
    losses = np.zeros(len(encoded), dtype=np.float64)
    device = model_device(model)
    pad = pad_id(tokenizer)
    with eval_mode(model):
        for idx in chunks(length_order([len(e.input_ids) for e in encoded]), batch_size):
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad).items()}
            nll = forward_stats(model, batch, keep_logits=False).nll
            losses[list(idx)] = nll.double().cpu().numpy()
    return losses
