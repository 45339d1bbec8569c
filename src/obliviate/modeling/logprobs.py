"""The ONE place that shifts, masks and reduces token log-probs and KL divergences.

Convention: a batch holds `input_ids` [B, T], `attention_mask` [B, T] and `labels` [B, T] with
-100 on prompt and padding positions. Position t of the logits predicts token t+1, so every
statistic here is aligned to the shifted targets `labels[:, 1:]` and has length T-1.

`forward_stats` skips the prefix of positions that predict no label in any row (the prompt part
every row shares): the model computes logits (LM head, softmax, KL over the vocabulary) only from
the first position that predicts a label (`logits_to_keep`), and the stats cover that window
[B, T-1-start]. Every statistic is masked to answer tokens, so no value changes; with a long chat
template prompt this removes most of the vocabulary-sized work.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


@dataclass
class TokenStats:
    """Statistics of one model on one batch, aligned to next-token targets.

    logits: [B, T-1, V] (may be None when only token log-probs were kept); from `forward_stats` every
    [.., T-1] here is the window from `label_start` on, [.., T-1-start];
    token_logp: [B, T-1] log p(y_t | x, y_<t) (0 where mask is False);
    mask: [B, T-1] bool, True on answer tokens that count;
    targets: [B, T-1] long next-token ids (0 where mask is False), or None when not kept;
    hidden: hidden states (embeddings, layer 0 output, ...), each [B, T, H], when asked for (RMU);
    attention_mask: [B, T] of the batch (1 = real token), set together with `hidden`.
    """

    logits: Tensor | None
    token_logp: Tensor
    mask: Tensor
    targets: Tensor | None = None
    hidden: tuple[Tensor, ...] | None = None
    attention_mask: Tensor | None = None
    _log_probs: Tensor | None = field(default=None, repr=False)

    @property
    def n_tokens(self) -> Tensor:
        """[B] number of counted tokens, at least 1 (so empty answers give 0, not NaN)."""
        return self.mask.sum(-1).clamp_min(1).to(self.token_logp.dtype)

    @property
    def logp(self) -> Tensor:
        """[B] summed answer log-prob `logp_θ(y|x)` (METHODS.md notation)."""
        return (self.token_logp * self.mask).sum(-1)

    @property
    def nll(self) -> Tensor:
        """[B] mean per-token negative log-likelihood `-logp/|y|`."""
        return -self.logp / self.n_tokens

    def log_probs(self) -> Tensor:
        """[B, T-1, V] log-softmax over the vocabulary (computed once, in float32 or wider)."""
        if self.logits is None:
            raise ValueError("these TokenStats were built without logits (keep_logits=False)")
        if self._log_probs is None:
            self._log_probs = F.log_softmax(_wide(self.logits), dim=-1)
        return self._log_probs


def _wide(x: Tensor) -> Tensor:
    """Half-precision logits are upcast to float32 before softmax; float32/float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def shift_labels(labels: Tensor) -> tuple[Tensor, Tensor]:
    """[B, T] labels -> ([B, T-1] targets with ignored positions set to 0, [B, T-1] bool mask)."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    return targets.masked_fill(~mask, 0), mask


def token_stats(logits: Tensor, labels: Tensor, *, keep_logits: bool = True) -> TokenStats:
    """Token log-probs of `labels` under `logits`. logits [B, T, V], labels [B, T] -> TokenStats."""
    targets, mask = shift_labels(labels)
    shifted = logits[:, :-1, :]
    log_probs = F.log_softmax(_wide(shifted), dim=-1)  # once: KL-type objectives reuse it via log_probs()
    logp = torch.gather(log_probs, -1, targets.unsqueeze(-1)).squeeze(-1)
    logp = logp * mask
    return TokenStats(logits=shifted if keep_logits else None, token_logp=logp, mask=mask, targets=targets,
                      _log_probs=log_probs if keep_logits else None)


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Tensor]:
    """The keys a causal LM forward takes from a collated batch (labels are not passed: no HF loss)."""
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def label_start(labels: Tensor) -> int:
    """First position whose logits predict a label in some row ([B, T] labels -> int; 0 when none do)."""
    predicts = (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero()
    return int(predicts[0]) if len(predicts) else 0


@functools.lru_cache(maxsize=None)
def _class_takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """The (unwrapped: DDP `.module`, PEFT base model) causal LM's forward accepts `logits_to_keep`."""
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return _class_takes_logits_to_keep(type(inner))


def forward_stats(model: torch.nn.Module, batch: Mapping[str, Any], *, keep_logits: bool = True,
                  hidden: bool = False) -> TokenStats:
    """Run `model` on a collated batch and return its TokenStats on the batch's labels (+ hidden states).

    Logits are computed from `label_start` on (module docstring); the stats cover that window."""
    labels = batch["labels"]
    start = label_start(labels) if takes_logits_to_keep(model) else 0
    extra = {"logits_to_keep": labels.shape[1] - start} if start else {}
    out = model(**model_inputs(batch), use_cache=False, output_hidden_states=hidden, **extra)
    stats = token_stats(out.logits, labels[:, start:], keep_logits=keep_logits)
    if hidden:
        stats.hidden, stats.attention_mask = tuple(out.hidden_states), batch["attention_mask"]
    return stats


def kl_per_token(p_log_probs: Tensor, q_log_probs: Tensor) -> Tensor:
    """KL(p ‖ q) per position. Inputs [..., V] log-probabilities -> [...]; p is the target."""
    return (p_log_probs.exp() * (p_log_probs - q_log_probs)).sum(-1)


def sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` [B, T] over the True positions of `mask` per row -> [B] (0 for empty rows)."""
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp_min(1)


def masked_token_kl(p: TokenStats, q: TokenStats) -> Tensor:
    """[B] mean over answer tokens of KL(p ‖ q); the mask of `q` (the student) decides what counts."""
    if p.mask.shape != q.mask.shape:
        raise ValueError(f"teacher and student batches differ in shape: {tuple(p.mask.shape)} vs {tuple(q.mask.shape)}")
    kl = kl_per_token(p.log_probs(), q.log_probs())
    return sequence_mean(kl, q.mask)


@torch.no_grad()
def per_example_avg_loss(model: torch.nn.Module, batch: Mapping[str, Any]) -> Tensor:
    """[B] mean answer-token NLL of each example (METRICS.md `avg_loss`), no gradients kept."""
    return forward_stats(model, batch, keep_logits=False).nll


def hidden_at(stats: TokenStats, layer: int) -> Tensor:
    """[B, T, H] output of decoder layer `layer` (0-based; hidden_states[layer + 1]) from TokenStats."""
    if stats.hidden is None:
        raise ValueError("these TokenStats carry no hidden states (the objective must need 'hidden')")
    n_layers = len(stats.hidden) - 1
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range: the model has {n_layers} decoder layers (0..{n_layers - 1})")
    return stats.hidden[layer + 1]


def masked_mse(h: Tensor, target: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean squared error over real tokens and hidden units. h [B, T, H], target broadcastable, mask [B, T]."""
    m = attention_mask.to(h.dtype).unsqueeze(-1)
    return (((h - target) ** 2) * m).sum() / (m.sum() * h.shape[-1]).clamp_min(1)
