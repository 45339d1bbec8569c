"""Cached θ0 statistics (teacher and reference): computed once per example, reused every epoch.

The ASU teacher and the reference θ0 are frozen and the forget/retain sets fixed, so their stats on
an example never change. A `RoleCache` stores, per example index, what the objective reads on that
example's answer tokens (the positions of the shifted mask, in order), and rebuilds TokenStats for
any batch composition aligned to the POLICY's window (`label_start` of that batch):

- "scalar": token log-probs of the targets only (npo, dpo: they read `.logp`); a few bytes a token.
- "exact": log-softmax over the vocabulary, [n_answer_tokens, V] per example, in the model's own
  precision (float32; float64 stays float64), or bfloat16 with `cache_bf16` (relative error
  ≤ 2^-9 of each log-prob; the rows are then no longer exactly normalised).
- "hidden": with vocabulary chunks (train.vocab_chunk, modeling/logprobs.py), θ0's final hidden states
  [n_answer_tokens, H] per example and its LM head, which recomputes the rows chunk by chunk: exact, and
  H/V the size of "exact" (4,096 / 128,256 = 3% for Llama-3-8B). What method.cache=auto keeps then.
- "topk": the k largest log-probs with their ids and log P_tail (mass of the other V-k). KL(p ‖ q)
  is then taken with the tail as ONE bucket: Σ_top p_v log(p_v/q_v) + P_tail log(P_tail/Q_tail).
  `complete_topk` realises it as a full teacher row (tail mass spread over the tail in proportion
  to the detached student q), so the objective's KL code and its gradient (q − p̃) are unchanged.
  Error: exact − bucketed = P_tail·KL(p_tail/P_tail ‖ q_tail/Q_tail) ≥ 0 (log-sum inequality);
  0 when k = V or the student's tail is proportional to the teacher's; ≤ P_tail·max_tail log(p̂/q̂).

Only the rows a run will use are counted (the caller passes them), and over `max_gb` method.cache=auto keeps
the largest caches on disk instead (`spill`: one file per example in a fresh folder, read back memory-mapped, so
the operating system pages them in and out; the folder is removed when the run's caches are gone), or computes
them live. The estimate and the choice are printed before anything is stored.

Entries are filled lazily: a batch holding an index not yet cached runs the live frozen forward
once, uses it, and stores each missing example. Under data parallelism each rank caches only the
examples it has seen (a rank may meet an index later that another rank cached: that is a miss, run
live once); the memory estimate counts every example of the side (an upper bound per rank).
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from obliviate.errors import ConfigError
from obliviate.modeling.logprobs import HeadRows, TokenStats, shift_labels

MODES = ("auto", "none", "exact", "topk")


@dataclass
class CacheBudget:
    """Every RoleCache of one run: one memory estimate (printed before anything is stored) and limit."""

    mode: str
    max_gb: float
    topk: int
    bf16: bool
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))
    caches: list[RoleCache] = field(default_factory=list)
    vocab: int | None = None
    chunked: bool = False  # the run's stats are vocabulary-chunked: auto keeps hidden states, topk is refused
    spill: bool = False  # auto over max_gb: the largest caches go to disk (memory-mapped) rather than live
    directory: str | None = None  # where spilled caches' folder is made (None: the system's temporary directory)
    _disk: Path | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"method.cache must be one of {list(MODES)}, got {self.mode!r}")
        if not (isinstance(self.topk, int) and self.topk >= 1):
            raise ConfigError(f"method.cache_topk must be an int >= 1, got {self.topk!r}")
        if not self.max_gb >= 0:
            raise ConfigError(f"method.cache_max_gb must be >= 0, got {self.max_gb!r}")

    def role(self, objective: str, role: str, n_tokens: int, frozen_use: str = "rows") -> RoleCache | None:
        """The cache of one frozen role of one side, or None when it stays live; `frozen_use`: how the objective reads
        θ0's stats (its registration's trait: "scalar", "kl" or "rows")."""
        if self.mode == "none":
            return None
        if self.chunked and self.mode == "topk":
            raise ConfigError("method.cache=topk completes θ0's rows against the student's whole [tokens, vocab] "
                              "rows, which vocabulary chunks never build; with train.vocab_chunk use method.cache=auto "
                              "(θ0's hidden states: exact and H/V the size), or set train.vocab_chunk=0")
        auto = "hidden" if self.chunked else "exact"
        kind = "scalar" if frozen_use == "scalar" else (auto if self.mode == "auto" else self.mode)
        if kind == "topk" and frozen_use != "kl":
            raise ConfigError(f"method.cache=topk approximates a KL with its tail as one bucket, which {objective!r} "
                              "does not compute; use method.cache=exact or auto")
        cache = RoleCache(f"{objective} {role}", kind, n_tokens, self)
        self.caches.append(cache)
        return cache

    def ensure(self, vocab: int, dtype: torch.dtype, width: int | None = None) -> None:
        """On the first frozen forward (V and the hidden width H known): print the estimate, refuse or fall back
        over the limit."""
        if self.vocab is not None:
            return
        self.vocab = vocab
        lines = [c.estimate(vocab, dtype, width) for c in self.caches]
        total = sum(b for _, b in lines)
        self.log("θ0 cache (method.cache={}): {}; total {:.3f} GB (limit method.cache_max_gb={:g})".format(self.mode, "; ".join(t for t, _ in lines), total / 1e9, self.max_gb))
        if total <= self.max_gb * 1e9:
            return
        if self.mode == "auto":  # move the largest distribution caches out of memory until the rest fits
            for c, (_, size) in sorted(zip(self.caches, lines), key=lambda x: -x[1][1]):
                if total <= self.max_gb * 1e9:
                    break
                if c.kind == "scalar":
                    continue
                total -= size
                where = self.spill_dir(size) if self.spill else None
                if where is None:
                    c.kind = "off"
                    why = "method.cache_spill=false" if not self.spill else "not enough free disk space"
                    self.log(f"θ0 cache: {c.name} computed live instead (over method.cache_max_gb; {why})")
                else:
                    c.disk = where
                    self.log(f"θ0 cache: {c.name} kept on disk in {where}, memory-mapped (over "
                             f"method.cache_max_gb; method.cache_spill)")
            return
        raise ConfigError(f"the θ0 cache needs {total / 1e9:.3f} GB > method.cache_max_gb={self.max_gb:g}; set "
                          f"method.cache=none (live θ0 forwards), method.cache=topk (method.cache_topk={self.topk}), "
                          "method.cache_bf16=true, or raise method.cache_max_gb")


    def spill_dir(self, size: int) -> Path | None:
        """The run's folder for spilled caches (made on first use, removed with this budget), or None when its disk
        has less than `size` bytes free."""
        import shutil
        import tempfile
        import weakref

        if self._disk is None:
            base = Path(self.directory).expanduser() if self.directory else Path(tempfile.gettempdir())
            base.mkdir(parents=True, exist_ok=True)
            if shutil.disk_usage(base).free < size:
                return None
            self._disk = Path(tempfile.mkdtemp(prefix="obliviate-cache-", dir=base))
            weakref.finalize(self, shutil.rmtree, str(self._disk), True)
        elif shutil.disk_usage(self._disk).free < size:
            return None
        return self._disk


class RoleCache:
    """Per-example frozen stats of one role (e.g. the ASU teacher of the forget side), keyed by index."""

    def __init__(self, name: str, kind: str, n_tokens: int, budget: CacheBudget) -> None:
        self.name, self.kind, self.n_tokens, self.budget = name, kind, n_tokens, budget
        self.store: dict[int, tuple[Tensor, ...]] = {}
        self.head: tuple[Any, int, int] | None = None  # kind "hidden": θ0's head, rows per chunk, V
        self.disk: Path | None = None  # spilled: entries are files here, read back memory-mapped

    def estimate(self, vocab: int, dtype: torch.dtype, width: int | None = None) -> tuple[str, int]:
        """A line 'name kind: N answer tokens × V × b B = x GB' and its bytes."""
        item = 2 if self.budget.bf16 else torch.finfo(dtype).bits // 8
        if self.kind == "hidden":
            item = torch.finfo(dtype).bits // 8  # hidden states are kept exact (bf16 applies to log-prob rows)
            per, what = (width or 0) * item, f"{width} hidden × {item} B (θ0's head recomputes the rows)"
        elif self.kind == "exact":
            per, what = vocab * item, f"{vocab} vocab × {item} B"
        elif self.kind == "topk":
            per, what = self.budget.topk * (item + 8) + item, f"(k={self.budget.topk} × ({item} B + 8 B id) + {item} B tail)"
        else:
            per, what = item, f"{item} B"
        return f"{self.name} {self.kind}: {self.n_tokens} answer tokens × {what} = {self.n_tokens * per / 1e9:.4f} GB", \
            self.n_tokens * per

    def get(self, batch: Mapping[str, Any], idx: list[int], policy_model: torch.nn.Module,
            live: Callable[[], TokenStats], force_live: bool = False) -> TokenStats | TopK:
        """Stats of this role on `batch` (rows = examples `idx`), packed (answer rows only); `force_live` runs
        the live forward even when every example is cached (FSDP: another rank missed one)."""
        if self.kind == "off":
            return live()
        if force_live or any(i not in self.store for i in idx):
            stats = live()
            if self.kind == "hidden" and stats.rows is None:  # the head ignored the hook: plain rows after all
                self.kind = "exact"
            self.budget.ensure(stats.vocab_size or stats.token_logp.shape[-1], stats.token_logp.dtype,
                               None if stats.rows is None else int(stats.rows.hidden.shape[-1]))
            if self.kind == "off":
                return stats
            for b, i in enumerate(idx):
                if i not in self.store:
                    self.store[i] = self._save(i, self._entry(stats, b))
            if self.kind != "topk":
                return stats
        return self._build(batch["labels"], idx)

    def _save(self, i: int, entry: tuple[Tensor, ...]) -> Any:
        """What the store keeps for example i: the entry, or (spilled) the file it was written to."""
        if self.disk is None:
            return entry
        path = self.disk / f"{self.name.replace(' ', '_')}-{i}.pt"
        torch.save([t.detach().cpu().contiguous() for t in entry], path)
        return path

    def _load(self, i: int) -> tuple[Tensor, ...]:
        """Example i's entry, memory-mapped from disk when spilled."""
        kept = self.store[i]
        return tuple(torch.load(kept, mmap=True, weights_only=True)) if isinstance(kept, Path) else kept

    def _entry(self, stats: TokenStats, b: int) -> tuple[Tensor, ...]:
        m = stats.mask[b]
        logp = stats.token_logp[b][m].clone()
        if self.kind == "scalar":
            return (logp,)
        if self.kind == "hidden":
            rows = stats.rows
            self.head = (rows.head, rows.chunk, rows.vocab)  # type: ignore[union-attr]
            start = int(stats.mask[:b].sum())
            return (logp, rows.hidden[start: start + int(m.sum())].clone())  # type: ignore[union-attr]
        lp = stats.example_rows(b)
        if self.kind == "exact":
            return (logp, lp.to(torch.bfloat16) if self.budget.bf16 else lp.clone())
        k = min(self.budget.topk, lp.shape[-1])
        vals, ids = lp.topk(k, dim=-1)
        tail = torch.logsumexp(lp.scatter(-1, ids, float("-inf")), dim=-1)
        if self.budget.bf16:
            vals, tail = vals.to(torch.bfloat16), tail.to(torch.bfloat16)
        return (logp, vals, ids, tail)

    def _build(self, labels: Tensor, idx: list[int]) -> TokenStats | TopK:
        targets, mask = shift_labels(labels)
        entries = [self._load(i) for i in idx]
        dtype = entries[0][0].dtype
        token_logp = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        token_logp[mask] = torch.cat([e[0] for e in entries]).to(mask.device)
        if self.kind == "scalar":
            return TokenStats(logits=None, token_logp=token_logp, mask=mask, targets=targets, packed=True)
        if self.kind == "hidden":
            head, chunk, vocab = self.head
            hidden = torch.cat([e[1] for e in entries]).to(mask.device)  # [N, H]
            return TokenStats(logits=None, token_logp=token_logp, mask=mask, targets=targets, packed=True,
                              rows=HeadRows(hidden, head, chunk, vocab))
        if self.kind == "exact":
            rows = torch.cat([e[1] for e in entries]).to(mask.device, dtype)  # [N, V]
            return TokenStats(logits=rows, token_logp=token_logp, mask=mask, targets=targets, _log_probs=rows,
                              packed=True)
        vals = torch.cat([e[1] for e in entries]).to(mask.device, dtype)
        ids = torch.cat([e[2] for e in entries]).to(mask.device)
        tail = torch.cat([e[3] for e in entries]).to(mask.device, dtype)
        stats = TokenStats(logits=None, token_logp=token_logp, mask=mask, targets=targets, packed=True)
        return TopK(stats, vals, ids, tail)


@dataclass
class TopK:
    """Cached top-k teacher rows, completed against the student's distribution by `complete_topk`."""

    stats: TokenStats
    vals: Tensor  # [N, k] log-probs of the k most likely tokens at each answer token
    ids: Tensor  # [N, k] their ids
    tail: Tensor  # [N] log of the remaining mass (−inf when k = V)


def complete_topk(top: TopK, student_log_probs: Tensor) -> TokenStats:
    """Full teacher rows p̃ [N, V] (packed): top-k exact, tail mass spread ∝ the detached student q [N, V].

    KL(p̃ ‖ q) = Σ_top p log(p/q) + P_tail log(P_tail/Q_tail), the one-bucket tail KL, and its
    gradient w.r.t. the student's logits is q − p̃, that of the bucketed KL (module docstring)."""
    q = student_log_probs.detach()
    log_q_tail = torch.logsumexp(q.scatter(-1, top.ids, float("-inf")), dim=-1, keepdim=True)
    shift = top.tail.unsqueeze(-1) - log_q_tail
    spread = torch.where(torch.isneginf(top.tail).unsqueeze(-1), torch.full_like(q, float("-inf")), q + shift)
    lp = spread.scatter(-1, top.ids, top.vals)
    s = top.stats
    return TokenStats(logits=lp, token_logp=s.token_logp, mask=s.mask, targets=s.targets, _log_probs=lp, packed=s.packed)


class CachePool(OrderedDict):
    """RoleCaches kept across runs on the same θ0 (a sweep's trials): at most `max_entries`, and the entries earlier
    runs filled at most `max_gb` of memory together (spilled entries count nothing). The least recently used leave
    first, so a sweep over many teacher temperatures holds a bounded number of teacher caches, and a large reference
    cache that every trial reads stays."""

    def __init__(self, max_entries: int = 8, max_gb: float = 4.0) -> None:
        super().__init__()
        self.max_entries, self.max_gb = max_entries, max_gb

    def take(self, key: Any) -> RoleCache | None:
        """The cache under `key` (now the most recently used), or None."""
        if key not in self:
            return None
        self.move_to_end(key)
        return self[key]

    def __setitem__(self, key: Any, value: RoleCache) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.max_entries or (len(self) > 1 and self.stored_bytes(skip=key) > self.max_gb * 1e9):
            self.popitem(last=False)

    def stored_bytes(self, skip: Any = None) -> int:
        """Bytes of the entries held in memory by every cache but `skip`'s."""
        return sum(cache_bytes(c) for k, c in self.items() if k != skip)


def cache_bytes(cache: Any) -> int:
    """Bytes of a RoleCache's in-memory entries (0 for spilled entries and for anything that is not a RoleCache)."""
    store = getattr(cache, "store", {})
    return sum(t.nbytes for entry in store.values() if not isinstance(entry, Path) for t in entry)
