"""The ONE place that shifts, masks and reduces token log-probs and KL divergences.

Convention: a batch holds `input_ids` [B, T], `attention_mask` [B, T] and `labels` [B, T] with
-100 on prompt and padding positions. Position t of the logits predicts token t+1, so every
statistic here is aligned to the shifted targets `labels[:, 1:]` and has length T-1.

`forward_stats` skips the prefix of positions that predict no label in any row (the prompt part
every row shares): the model computes logits (LM head, softmax, KL over the vocabulary) only from
the first position that predicts a label (`logits_to_keep`), and the stats cover that window
[B, T-1-start]. Every statistic is masked to answer tokens, so no value changes; with a long chat
template prompt this removes most of the vocabulary-sized work.

Reductions over tokens (`answer_mean`): "token" pools every counted token of the batch (Σ values /
number of counted tokens, as Hugging Face's causal-LM loss and the reference unlearning code do);
"example" averages per example, then over examples (long and short answers weigh the same).
"""
from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from obliviate.errors import ConfigError

IGNORE_INDEX = -100
REDUCTIONS = ("token", "example")


def check_reduction(reduction: str) -> None:
    """Raise ConfigError unless `reduction` is one of REDUCTIONS."""
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")


def answer_mean(values: Tensor, mask: Tensor, reduction: str, total: float | Tensor | None = None) -> Tensor:
    """THE token reduction: mean of `values` [B, T] over the True positions of `mask` [B, T] -> scalar.

    "token": Σ_{b,t} m·v / N with N = `total` when given (the loop passes the count of the whole
    optimizer step, all ranks and accumulation micro-batches) else Σ m; "example": mean over b of
    Σ_t m·v / Σ_t m (an empty row counts 0). Masked entries are replaced by 0 first, so a NaN or
    ±inf at a prompt/padding position changes neither the value nor the gradient.
    """
    check_reduction(reduction)
    v = values.masked_fill(~mask, 0.0)
    if reduction == "token":
        n = mask.sum().clamp_min(1).to(v.dtype) if total is None else total
        return v.sum() / n
    return (v.sum(-1) / mask.sum(-1).clamp_min(1).to(v.dtype)).mean()


@dataclass
class TokenStats:
    """Statistics of one model on one batch, aligned to next-token targets.

    logits: [B, T-1, V] (may be None when only token log-probs were kept); from `forward_stats` every
    [.., T-1] here is the window from `label_start` on, [.., T-1-start];
    token_logp: [B, T-1] log p(y_t | x, y_<t) (0 where mask is False);
    mask: [B, T-1] bool, True on answer tokens that count;
    targets: [B, T-1] long next-token ids (0 where mask is False), or None when not kept;
    token_total: the N of "token" pooling over `mask` (None = this batch's own count); the loop sets
    it so that pooling spans every rank and accumulation micro-batch of the optimizer step;
    hidden: [B, T, H] output of decoder layer `hidden_layer` (RMU), from a forward hook on it;
    hidden_mask: [B, T] bool, positions whose hidden state counts (labels != -100, unshifted);
    hidden_total: the N of "token" pooling over `hidden_mask`, like `token_total`.
    """

    logits: Tensor | None
    token_logp: Tensor
    mask: Tensor
    targets: Tensor | None = None
    token_total: float | None = None
    hidden: Tensor | None = None
    hidden_layer: int | None = None
    hidden_mask: Tensor | None = None
    hidden_total: float | None = None
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

    def mean(self, values: Tensor, reduction: str) -> Tensor:
        """`answer_mean` of [B, T-1] `values` over this batch's answer tokens -> scalar."""
        return answer_mean(values, self.mask, reduction, self.token_total)

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


def every_token_labels(batch: Mapping[str, Any]) -> Tensor:
    """[B, T] labels counting every real token (prompt included, padding not): a sequence-level loss."""
    return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of decoder layers (the ModuleList as long as config.num_hidden_layers); DDP/PEFT unwrapped."""
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    n = getattr(getattr(inner, "config", None), "num_hidden_layers", None)
    for module in inner.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise ConfigError(f"cannot find the decoder layers of {type(inner).__name__}; RMU needs a model with "
                      "config.num_hidden_layers and a ModuleList of that many layers")


@contextmanager
def layer_output(model: torch.nn.Module, layer: int) -> Iterator[list[Tensor]]:
    """Capture the output [B, T, H] of decoder layer `layer` (0-based) with a forward hook (as WMDP's RMU)."""
    stack = decoder_layers(model)
    if not 0 <= layer < len(stack):
        raise ValueError(f"layer {layer} out of range: the model has {len(stack)} decoder layers (0..{len(stack) - 1})")
    seen: list[Tensor] = []
    handle = stack[layer].register_forward_hook(
        lambda _m, _i, out: seen.append(out[0] if isinstance(out, tuple) else out))
    try:
        yield seen
    finally:
        handle.remove()


def forward_stats(model: torch.nn.Module, batch: Mapping[str, Any], *, keep_logits: bool = True,
                  hidden_layer: int | None = None) -> TokenStats:
    """Run `model` on a collated batch and return its TokenStats on the batch's labels.

    Logits are computed from `label_start` on (module docstring); the stats cover that window. With
    `hidden_layer`, the output of that decoder layer is captured by a hook (stats.hidden [B, T, H]),
    with the label positions as its mask."""
    labels = batch["labels"]
    start = label_start(labels) if takes_logits_to_keep(model) else 0
    extra = {"logits_to_keep": labels.shape[1] - start} if start else {}
    if hidden_layer is None:
        out = model(**model_inputs(batch), use_cache=False, **extra)
        return token_stats(out.logits, labels[:, start:], keep_logits=keep_logits)
    with layer_output(model, hidden_layer) as seen:
        out = model(**model_inputs(batch), use_cache=False, **extra)
    stats = token_stats(out.logits, labels[:, start:], keep_logits=keep_logits)
    stats.hidden, stats.hidden_layer, stats.hidden_mask = seen[-1], hidden_layer, labels != IGNORE_INDEX
    return stats


def kl_per_token(p_log_probs: Tensor, q_log_probs: Tensor, skip: Tensor | None = None) -> Tensor:
    """KL(p ‖ q) = Σ_v p_v·(log p_v − log q_v) per position; [..., V] log-probs -> [...]; p is the target.

    Terms with p_v = 0 (log p_v = −inf) contribute 0, also where q_v = 0 too, and pass zero
    gradient to q (0·(−inf) would be NaN in the forward and the backward alike). `skip` (bool,
    broadcastable to [..., V]) marks more terms to drop the same way, e.g. masked positions.
    """
    zero = torch.isneginf(p_log_probs) if skip is None else torch.isneginf(p_log_probs) | skip
    diff = (p_log_probs - q_log_probs).masked_fill(zero, 0.0)  # −inf − x and −inf − (−inf) alike
    return (p_log_probs.exp() * diff).sum(-1)


def sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` [B, T] over the True positions of `mask` per row -> [B] (0 for empty rows)."""
    m = mask.bool()
    return values.masked_fill(~m, 0.0).sum(-1) / m.sum(-1).clamp_min(1).to(values.dtype)


def token_kl(p: TokenStats, q: TokenStats) -> Tensor:
    """[B, T-1] KL(p ‖ q) at each position, 0 where `q.mask` (the student's) is False.

    Masked positions' terms are dropped inside the KL, so a non-finite teacher row there (e.g. NaN
    logits of a fully masked padding query) reaches neither the value nor the student's gradient.
    """
    if p.mask.shape != q.mask.shape:
        raise ValueError(f"teacher and student batches differ in shape: {tuple(p.mask.shape)} vs {tuple(q.mask.shape)}")
    return kl_per_token(p.log_probs(), q.log_probs(), ~q.mask.unsqueeze(-1)).masked_fill(~q.mask, 0.0)


def masked_token_kl(p: TokenStats, q: TokenStats, reduction: str = "example") -> Tensor:
    """KL(p ‖ q) averaged over answer tokens (`q`'s mask and token_total) -> scalar; see `answer_mean`."""
    return q.mean(token_kl(p, q), reduction)


@torch.no_grad()
def per_example_avg_loss(model: torch.nn.Module, batch: Mapping[str, Any]) -> Tensor:
    """[B] mean answer-token NLL of each example (METRICS.md `avg_loss`), no gradients kept."""
    return forward_stats(model, batch, keep_logits=False).nll


def hidden_at(stats: TokenStats, layer: int) -> Tensor:
    """[B, T, H] output of decoder layer `layer` (0-based), captured by `forward_stats(hidden_layer=layer)`."""
    if stats.hidden is None:
        raise ValueError("these TokenStats carry no hidden states (the objective must need 'hidden')")
    if stats.hidden_layer != layer:
        raise ValueError(f"these TokenStats hold decoder layer {stats.hidden_layer}'s output, not layer {layer}'s")
    return stats.hidden


def hidden_mean(stats: TokenStats, sq_err: Tensor, reduction: str) -> Tensor:
    """`answer_mean` of per-token errors [B, T] over the hidden-state positions (label tokens) -> scalar."""
    if stats.hidden_mask is None:
        raise ValueError("these TokenStats carry no hidden-state mask (build them with forward_stats(hidden_layer=...))")
    return answer_mean(sq_err, stats.hidden_mask, reduction, stats.hidden_total)


def token_mse(h: Tensor, target: Tensor) -> Tensor:
    """Mean over hidden units of the squared error: h [B, T, H], target broadcastable -> [B, T]."""
    return ((h - target) ** 2).mean(-1)
