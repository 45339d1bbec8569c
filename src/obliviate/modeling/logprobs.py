"""The ONE place that shifts, masks and reduces token log-probs and KL divergences.

Convention: a batch holds `input_ids` [B, T], `attention_mask` [B, T] and `labels` [B, T] with
-100 on prompt and padding positions. Position t of the logits predicts token t+1, so every
statistic here is aligned to the shifted targets `labels[:, 1:]` and has length T-1.

Logits only where labels are: `forward_stats` puts a pre-hook on the model's output embedding (the
LM head) that hands it only the hidden states of the N positions that predict an answer token, so
the LM head, the softmax and every vocabulary-sized KL/entropy run on [N, V] rows ("packed" stats,
row-major over the mask) instead of [B, T-1, V]: prompt and padding positions cost nothing past
the last decoder layer. Per-token statistics (`token_logp`, `mask`, `targets`) stay [B, T-1];
`answer_log_probs()` gives the [N, V] rows of any TokenStats, packed or not, so objectives never
depend on the layout. Models whose head ignores the hook (it did not fire) are handled by
selecting the same rows from the full logits: the values are identical either way.

Reductions over tokens (`answer_mean`): "token" pools every counted token of the batch (Σ values /
number of counted tokens, as Hugging Face's causal-LM loss and the reference unlearning code do);
"example" averages per example, then over examples (long and short answers weigh the same).

Vocabulary chunks (`forward_stats(..., chunk=c)`, the technique of fused linear cross-entropy kernels in plain
torch): the LM head is not run in the forward at all; the stats keep the answer rows' final hidden states [N, H]
and the head (`HeadRows`), and every vocabulary-sized quantity — the target log-probs, KL in either direction,
entropy, UNDIAL's cross-entropy — is computed by `map_rows` over c rows at a time, each chunk under activation
checkpointing, so its [c, V] logits and log-softmax are dropped after the forward and recomputed in the backward.
No [N, V] tensor of the whole batch exists; values and gradients equal the unchunked path to float rounding.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from obliviate.errors import ConfigError
from obliviate.modeling.prefix import eligible, prefix_forward, prefix_is_exact, shared_prefix_length

IGNORE_INDEX = -100
REDUCTIONS = ("token", "example")
CHUNK_AUTO_ELEMENTS = 2**23  # train.vocab_chunk=auto: rows per chunk = this / V (32 MiB of float32 logits)
CHUNK_AUTO_MIN_VOCAB = 65_536  # ... and only from this vocabulary size on (below it the [tokens, V] rows of a
# batch stay small and the recompute would cost more than it saves: SmolLM2 49k, Llama-2 and Mistral 32k)


def resolve_vocab_chunk(setting: int | str, vocab: int) -> int | None:
    """Rows per vocabulary chunk for `train.vocab_chunk` (an int >= 1, 0 = off, or "auto") at vocabulary `vocab`;
    None = unchunked. auto: max(64, 2^23 // V) rows from V = 65,536 on (Llama-3's 128,256 -> 65 rows), else off."""
    if setting == "auto":
        return max(64, CHUNK_AUTO_ELEMENTS // vocab) if vocab >= CHUNK_AUTO_MIN_VOCAB else None
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 0:
        raise ConfigError(f"train.vocab_chunk must be 'auto', 0 (off) or a number of rows >= 1, got {setting!r}")
    return setting or None


@dataclass
class HeadRows:
    """The answer rows' final hidden states and the LM head that maps them to logits, for chunked use.

    hidden: [N, H] (row-major over the stats' mask); head: hidden [n, H] -> logits [n, V] (the model's output
    embedding, or a function that runs it as θ0); chunk: rows per chunk."""

    hidden: Tensor
    head: Callable[[Tensor], Tensor]
    chunk: int
    vocab: int

    def log_probs(self, start: int, end: int) -> Tensor:
        """[end - start, V] log-softmax rows (float32 or wider) of rows start..end."""
        return F.log_softmax(_wide(self.head(self.hidden[start:end])), dim=-1)


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

    logits: [B, T-1, V], or [N, V] answer rows when `packed` (N = mask.sum(), row-major over the mask);
    None when only token log-probs were kept;
    token_logp: [B, T-1] log p(y_t | x, y_<t) (0 where mask is False);
    mask: [B, T-1] bool, True on answer tokens that count;
    targets: [B, T-1] long next-token ids (0 where mask is False), or None when not kept;
    token_total: the N of "token" pooling over `mask` (None = this batch's own count); the loop sets
    it so that pooling spans every rank and accumulation micro-batch of the optimizer step;
    hidden: [B, T, H] output of decoder layer `hidden_layer` (RMU), from a forward hook on it;
    hidden_mask: [B, T] bool, positions whose hidden state counts (labels != -100, unshifted);
    hidden_total: the N of "token" pooling over `hidden_mask`, like `token_total`;
    packed: the vocabulary tensors hold only the answer rows (module docstring);
    rows: the chunked form (module docstring): hidden states and head instead of logits, read through `map_rows`.
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
    packed: bool = False
    _dense: Tensor | None = field(default=None, repr=False)
    rows: HeadRows | None = None

    @property
    def vocab_size(self) -> int | None:
        """V of the vocabulary rows, None when these stats keep none."""
        if self.rows is not None:
            return self.rows.vocab
        return None if self.logits is None else int(self.logits.shape[-1])

    @property
    def n_tokens(self) -> Tensor:
        """[B] number of counted tokens, at least 1 (so empty answers give 0, not NaN)."""
        return self.mask.sum(-1).clamp_min(1).to(self.token_logp.dtype)

    @property
    def logp(self) -> Tensor:
        """[B] summed answer log-prob `logp_θ(y|x)` (docs/METHODS.md, Notation)."""
        return (self.token_logp * self.mask).sum(-1)

    @property
    def nll(self) -> Tensor:
        """[B] mean per-token negative log-likelihood `-logp/|y|`."""
        return -self.logp / self.n_tokens

    def mean(self, values: Tensor, reduction: str) -> Tensor:
        """`answer_mean` of [B, T-1] `values` over this batch's answer tokens -> scalar."""
        return answer_mean(values, self.mask, reduction, self.token_total)

    def _vocab_rows(self) -> Tensor:
        """log-softmax of `logits` in their own layout, computed once (float32 or wider)."""
        if self.rows is not None:
            raise ValueError("these TokenStats are vocabulary-chunked (train.vocab_chunk): read their rows through "
                             "map_rows, which never builds the whole [N, V] tensor")
        if self.logits is None:
            raise ValueError("these TokenStats were built without logits (keep_logits=False)")
        if self._log_probs is None:
            self._log_probs = F.log_softmax(_wide(self.logits), dim=-1)
        return self._log_probs

    def answer_log_probs(self) -> Tensor:
        """[N, V] log-softmax rows at the answer tokens (row-major over `mask`), packed or not."""
        rows = self._vocab_rows()
        return rows if self.packed else rows[self.mask]

    def answer_logits(self) -> Tensor:
        """[N, V] logits at the answer tokens (row-major over `mask`)."""
        if self.logits is None:
            raise ValueError("these TokenStats were built without logits (keep_logits=False)")
        return self.logits if self.packed else self.logits[self.mask]

    def spread(self, values: Tensor) -> Tensor:
        """[N, ...] values at the answer tokens -> [B, T-1, ...] with 0 elsewhere (differentiable)."""
        out = values.new_zeros((*self.mask.shape, *values.shape[1:]))
        out[self.mask] = values
        return out

    def example_rows(self, b: int) -> Tensor:
        """[n_b, V] log-softmax rows of example b's answer tokens."""
        if self.rows is not None:
            start = int(self.mask[:b].sum())
            return self.rows.log_probs(start, start + int(self.mask[b].sum()))
        if not self.packed:
            return self._vocab_rows()[b][self.mask[b]]
        counts = self.mask.sum(-1).tolist()
        start = sum(counts[:b])
        return self._vocab_rows()[start: start + counts[b]]

    def log_probs(self) -> Tensor:
        """[B, T-1, V] log-softmax over the vocabulary (computed once, in float32 or wider).

        Packed stats are spread into that shape on demand, with a uniform row (−log V) at positions
        that carry no label; objectives should prefer `answer_log_probs()` ([N, V], no copy)."""
        rows = self._vocab_rows()
        if not self.packed:
            return rows
        if self._dense is None:
            dense = rows.new_full((*self.mask.shape, rows.shape[-1]), -math.log(rows.shape[-1]))
            dense[self.mask] = rows
            self._dense = dense
        return self._dense


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


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a causal LM forward takes from a collated batch (labels are not passed: no HF loss); position_ids
    and a KV `cache` pass through when present (answers scored after a shared, cached prompt)."""
    extra = {k: batch[k] for k in ("position_ids", "cache") if k in batch}
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], **extra}


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


def packed_token_stats(rows: Tensor, labels: Tensor, *, keep_logits: bool = True) -> TokenStats:
    """Token log-probs from logits at the answer positions only: rows [N, V] (row-major over the shifted
    mask of `labels` [B, T]) -> packed TokenStats (token_logp [B, T-1], vocabulary tensors [N, V])."""
    targets, mask = shift_labels(labels)
    if rows.shape[0] != int(mask.sum()):
        raise ValueError(f"{rows.shape[0]} logit rows for {int(mask.sum())} answer tokens")
    log_probs = F.log_softmax(_wide(rows), dim=-1)
    picked = torch.gather(log_probs, -1, targets[mask].unsqueeze(-1)).squeeze(-1)
    token_logp = picked.new_zeros(mask.shape).masked_scatter(mask, picked)
    return TokenStats(logits=rows if keep_logits else None, token_logp=token_logp, mask=mask, targets=targets,
                      _log_probs=log_probs if keep_logits else None, packed=True)


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The LM head (output embedding) of a causal LM, DDP/PEFT unwrapped; None when the model exposes none."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def head_width(head: torch.nn.Module) -> int:
    """V, the number of logits an LM head gives (nn.Linear, or a PEFT layer around one)."""
    width = getattr(head, "out_features", None)
    return int(width) if isinstance(width, int) else int(head.weight.shape[0])


def map_rows(fn: Callable[..., Tensor], stats: Sequence[TokenStats], extra: Sequence[Tensor] = ()) -> Tensor:
    """`fn(*rows, *extra)` on the answer rows of every `stats` (the same N rows in the same order): rows [n, V]
    log-probs, extra [n, ...] per-row tensors -> [n, ...]; returns [N, ...].

    All rows at once when no stats is chunked; else c rows at a time (c: the smallest chunk), each chunk under
    activation checkpointing when gradients are on, so its [c, V] tensors are freed after the forward and
    recomputed in the backward (module docstring)."""
    chunked = [s.rows for s in stats if s.rows is not None]
    if not chunked:
        return fn(*(s.answer_log_probs() for s in stats), *extra)
    heads = [s.rows for s in stats]
    inputs = [s.rows.hidden if s.rows is not None else s.answer_log_probs() for s in stats]
    n, c = int(inputs[0].shape[0]), min(r.chunk for r in chunked)

    def piece(*args: Tensor) -> Tensor:
        rows = [a if h is None else F.log_softmax(_wide(h.head(a)), dim=-1) for h, a in zip(heads, args)]
        return fn(*rows, *args[len(heads):])

    outs = []
    for start in range(0, max(n, 1), c):  # an empty batch still gives fn's [0, ...] shape
        args = [t[start:start + c] for t in (*inputs, *extra)]
        outs.append(torch.utils.checkpoint.checkpoint(piece, *args, use_reentrant=False, preserve_rng_state=False)
                    if torch.is_grad_enabled() else piece(*args))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def chunked_token_stats(hidden: Tensor, head: Callable[[Tensor], Tensor], vocab: int, labels: Tensor,
                        chunk: int) -> TokenStats:
    """Packed TokenStats in chunked form: hidden [N, H] answer rows (row-major over the shifted mask of `labels`
    [B, T]), `head` hidden -> logits [n, V]; token_logp [B, T-1] through `map_rows`, c = `chunk` rows at a time."""
    targets, mask = shift_labels(labels)
    if hidden.shape[0] != int(mask.sum()):
        raise ValueError(f"{hidden.shape[0]} hidden rows for {int(mask.sum())} answer tokens")
    stats = TokenStats(logits=None, token_logp=hidden.new_zeros(0), mask=mask, targets=targets, packed=True,
                       rows=HeadRows(hidden, head, chunk, vocab))
    picked = map_rows(lambda lp, t: lp.gather(-1, t.unsqueeze(-1)).squeeze(-1), [stats], [targets[mask]])
    stats.token_logp = picked.new_zeros(mask.shape).masked_scatter(mask, picked)
    return stats


@contextmanager
def answer_rows_only(model: torch.nn.Module, mask: Tensor, capture: list[Tensor] | None = None
                     ) -> Iterator[list[bool]]:
    """While active, the LM head receives only the hidden states [1, N, H] of the positions that predict a
    label (`mask` [B, T-1], shifted): a forward pre-hook on it. Yields a list that holds True once it fired.
    With `capture`, the [N, H] rows are appended to it and the head gets none of them (chunked stats)."""
    head, fired = output_head(model), []
    if head is None:
        yield fired
        return
    B, T = mask.shape[0], mask.shape[1] + 1

    def pre(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        h = args[0] if args else None
        if fired or not isinstance(h, Tensor) or h.dim() != 3 or tuple(h.shape[:2]) != (B, T):
            return None  # not the call on the full sequence (or a second call): leave it alone
        fired.append(True)
        rows = h[:, :-1][mask]
        if capture is not None:
            capture.append(rows)
            rows = rows[:0]
        return (rows.unsqueeze(0), *args[1:]), kwargs

    handle = head.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield fired
    finally:
        handle.remove()


def forward_stats(model: torch.nn.Module, batch: Mapping[str, Any], *, keep_logits: bool = True,
                  hidden_layer: int | None = None, chunk: int | None = None,
                  head: Callable[[Tensor], Tensor] | None = None, share_prefix: bool = True) -> TokenStats:
    """Run `model` on a collated batch and return its packed TokenStats on the batch's labels.

    The LM head runs on the answer positions only (module docstring). With `hidden_layer`, the output
    of that decoder layer is captured by a hook (stats.hidden [B, T, H]), with the label positions as
    its mask. With `chunk`, the head does not run here: the stats are chunked (`chunked_token_stats`), their
    head the model's own or `head` (e.g. θ0's head of a LoRA model, run with its adapters off). With
    `share_prefix`, leading tokens that every row shares and that predict no label run once (modeling/prefix.py;
    same values to float rounding, and the plain path wherever that does not hold)."""
    labels = batch["labels"]
    length = _prefix_length(model, batch, labels) if share_prefix else 0
    return _stats_of(model, batch, length, keep_logits, hidden_layer, chunk, head)


def _prefix_length(model: torch.nn.Module, batch: Mapping[str, Any], labels: Tensor) -> int:
    """P of `prefix.shared_prefix_length` when sharing may run on this model and batch and is exact there, else 0."""
    if "cache" in batch or "position_ids" in batch or "input_ids" not in batch:
        return 0
    length = shared_prefix_length(batch["input_ids"], batch["attention_mask"], shift_labels(labels)[1])
    if not length or not eligible(model):
        return 0

    def measure() -> bool:
        plain = _stats_of(model, batch, 0, False, None, None, None).token_logp.double()
        shared = _stats_of(model, batch, length, False, None, None, None).token_logp.double()
        # float32 models differ by ~1e-5 nats between the two paths (another summation order); a forward that
        # ignored the cache or the positions would differ by tenths
        return bool(torch.allclose(shared, plain, rtol=1e-3, atol=1e-4))
    return length if prefix_is_exact(model, measure) else 0


def _stats_of(model: torch.nn.Module, batch: Mapping[str, Any], length: int, keep_logits: bool,
              hidden_layer: int | None, chunk: int | None, head: Callable[[Tensor], Tensor] | None) -> TokenStats:
    """`forward_stats` with the first `length` positions run once as a shared prefix (0: the plain forward)."""
    labels = batch["labels"]
    seen_labels = labels[:, length:]  # the positions whose logits this forward gives
    _, mask = shift_labels(seen_labels)
    own_head = output_head(model) if chunk else None
    captured: list[Tensor] | None = [] if own_head is not None else None
    with answer_rows_only(model, mask, captured) as fired, \
            (layer_output(model, hidden_layer) if hidden_layer is not None else _no_capture()) as seen:
        if length:
            out = prefix_forward(model, batch["input_ids"], batch["attention_mask"], length)
        else:
            out = model(**model_inputs(batch), use_cache=False)
    if captured:
        stats = chunked_token_stats(captured[0], head or own_head, head_width(own_head), seen_labels, int(chunk))
    else:
        logits = out.logits
        rows = logits.reshape(-1, logits.shape[-1]) if fired else logits[:, :-1][mask]
        stats = packed_token_stats(rows, seen_labels, keep_logits=keep_logits)
    if length:
        stats = _behind_prefix(stats, length)
    if hidden_layer is not None:
        hidden = seen[-1]
        if length:  # seen: the prefix's [1, P, H], then the rest's [B, T-P, H]
            hidden = torch.cat([seen[-2].expand(hidden.shape[0], -1, -1), hidden], dim=1)
        stats.hidden, stats.hidden_layer, stats.hidden_mask = hidden, hidden_layer, labels != IGNORE_INDEX
    return stats


def _behind_prefix(stats: TokenStats, length: int) -> TokenStats:
    """Stats of the positions after a shared prefix widened back to the whole batch: `length` leading columns of
    the [B, T-1-P] per-token tensors (no label there), so their layout is the plain forward's [B, T-1]; the
    packed [N, V] rows keep their row-major order."""
    stats.token_logp = F.pad(stats.token_logp, (length, 0))
    stats.mask = F.pad(stats.mask, (length, 0), value=False)
    if stats.targets is not None:
        stats.targets = F.pad(stats.targets, (length, 0))
    return stats


@contextmanager
def _no_capture() -> Iterator[list[Tensor]]:
    yield []


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
    """[B, T-1] KL(p ‖ q) at each answer token, 0 elsewhere (`q`, the student, gives the layout).

    Computed on the [N, V] answer rows of both (packed or not: the same rows in the same order), so a
    non-finite teacher value at a prompt or padding position reaches neither the value nor the
    student's gradient.
    """
    if p.mask.shape[0] != q.mask.shape[0] or int(p.mask.sum()) != int(q.mask.sum()):
        raise ValueError(f"teacher and student batches differ in shape: {tuple(p.mask.shape)} vs {tuple(q.mask.shape)} "
                         f"({int(p.mask.sum())} vs {int(q.mask.sum())} answer tokens)")
    return q.spread(map_rows(kl_per_token, [p, q]))


def masked_token_kl(p: TokenStats, q: TokenStats, reduction: str = "example") -> Tensor:
    """KL(p ‖ q) averaged over answer tokens (`q`'s mask and token_total) -> scalar; see `answer_mean`."""
    return q.mean(token_kl(p, q), reduction)


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
