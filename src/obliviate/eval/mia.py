"""Membership-inference attacks (METRICS.md "Membership inference"): per-example scores and their AUCs.

Every score follows one orientation: higher = less likely a member. The attacks:
  loss             avg_loss, the mean NLL of the counted tokens (Yeom et al. 2018)
  zlib             avg_loss / len(zlib.compress(text.encode("utf-8"))) (Carlini et al. 2021); `text` is the
                   answer of a (prompt, answer) pair or the raw text itself (MUSE's "PPL/zlib")
  min_k            -mean of the lowest share k of token log-probs (count below) (Shi et al. 2024, "Min-K% Prob")
  min_k_plus_plus  the same on (logp - mu) / sigma, mu and sigma^2 the mean and variance of log p_v under the
                   model's next-token distribution at that position (Zhang et al. 2024, "Min-K%++")
  reference        avg_loss - avg_loss under a reference model (Carlini et al. 2021); only with a reference model

Min-K% token count: m = max(1, floor(k * n)) of the n counted tokens. For k * n >= 1 this is MUSE's and the
Min-K%++ authors' `int(n * k)`; where that is 0 they average nothing (NaN) and we keep the single lowest token.
Encoding: a (prompt, answer) pair is tokenised by `encode_qa` (answer tokens + EOS counted, exactly what
`avg_loss` counts); a raw text (a str, or a pair whose prompt is "") is BOS + text tokens, all text tokens
counted, no EOS added, cut at its right end to max_length (MUSE scores `tokenizer.encode(text)` the same way).
A tokenizer without BOS cannot score the first text token. One forward per batch gives every attack.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np
import torch
from sklearn.metrics import roc_auc_score
from torch import Tensor

from obliviate.data.rows import QARow
from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id
from obliviate.eval.generate import chunks, eval_mode, length_order, model_device
from obliviate.eval.tofu import MetricInfo
from obliviate.modeling.logprobs import IGNORE_INDEX, TokenStats, forward_stats

Item = Union[str, tuple[str, str]]
ATTACKS: tuple[str, ...] = ("loss", "zlib", "min_k", "min_k_plus_plus", "reference")
DEFAULT_K = 0.4  # MUSE's PrivLeak uses Min-40%
SIGMA_FLOOR = 1e-8  # a one-hot next-token distribution has sigma 0; its z-scores stay finite


def _auc_info(attack: str, what: str) -> MetricInfo:
    return MetricInfo(f"mia_{attack}_auc", False, 1,
                      f"{what}; AUC = P(score_nonmember > score_member) (0.5 = cannot tell; 1 = members exposed)")


MIA_METRICS: dict[str, MetricInfo] = {m.name: m for m in (
    _auc_info("loss", "LOSS attack, score avg_loss"),
    _auc_info("zlib", "zlib attack, score avg_loss / zlib-compressed bytes of the text"),
    _auc_info("min_k", "Min-K% attack (Shi et al. 2024), score -mean of the lowest k share of token log-probs"),
    _auc_info("min_k_plus_plus", "Min-K%++ attack (Zhang et al. 2024), Min-K% on standardised log-probs"),
    _auc_info("reference", "reference attack, score avg_loss - reference model's avg_loss; absent without one"),
)}


# ---------------------------------------------------------------- pure functions on arrays
def _count(n: int, k: float) -> int:
    """How many of n tokens Min-K% averages: max(1, floor(k n)) (the 1e-9 keeps 0.3 * 10 at 3)."""
    if not 0 < k <= 1:
        raise ValueError(f"k must be a share in (0, 1], got {k}")
    if n < 1:
        raise ValueError("Min-K% needs at least one scored token, got none")
    return max(1, math.floor(k * n + 1e-9))


def min_k_score(logp: np.ndarray, k: float = DEFAULT_K) -> float:
    """Min-K% (Shi et al. 2024): -mean of the lowest max(1, floor(k n)) token log-probs. logp [n] -> scalar."""
    x = np.asarray(logp, dtype=np.float64)
    return float(-np.sort(x)[:_count(x.size, k)].mean())


def min_k_plus_plus_score(logp: np.ndarray, mu: np.ndarray, sigma: np.ndarray, k: float = DEFAULT_K) -> float:
    """Min-K%++ (Zhang et al. 2024, eq. 4): Min-K% of (logp - mu) / sigma. logp, mu, sigma [n] -> scalar."""
    x, m, s = (np.asarray(a, dtype=np.float64) for a in (logp, mu, sigma))
    if not x.shape == m.shape == s.shape:
        raise ValueError(f"logp, mu and sigma must have one shape; got {x.shape}, {m.shape}, {s.shape}")
    return min_k_score((x - m) / np.maximum(s, SIGMA_FLOOR), k)


def zlib_score(avg_loss: float, text: str) -> float:
    """zlib attack (Carlini et al. 2021): avg_loss / len(zlib.compress(text.encode("utf-8"))) -> scalar."""
    return float(avg_loss) / len(zlib.compress(text.encode("utf-8")))


def reference_score(loss: np.ndarray, reference_loss: np.ndarray) -> np.ndarray:
    """Reference attack (Carlini et al. 2021): avg_loss - the reference model's avg_loss. [N], [N] -> [N]."""
    a, b = np.asarray(loss, dtype=np.float64), np.asarray(reference_loss, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"loss and reference_loss differ in shape: {a.shape} vs {b.shape}")
    return a - b


def next_token_moments(log_probs: Tensor) -> tuple[Tensor, Tensor]:
    """mu = E_{v~p}[log p_v], sigma = sqrt(Var_{v~p}[log p_v]) (Min-K%++). [..., V] log-probs -> [...], [...]."""
    p = log_probs.exp()
    # p = 0 where log p = -inf (a masked vocabulary entry): such terms are 0, not NaN.
    mu = torch.where(p > 0, p * log_probs, 0.0).sum(-1)
    var = torch.where(p > 0, p * (log_probs - mu.unsqueeze(-1)) ** 2, 0.0).sum(-1)
    return mu, var.clamp_min(0).sqrt()


def mia_auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """Attack AUC = P(score_nonmember > score_member) + P(tie)/2, via roc_auc_score with nonmembers as 1."""
    m, n = np.asarray(member_scores, dtype=np.float64), np.asarray(nonmember_scores, dtype=np.float64)
    if m.ndim != 1 or n.ndim != 1 or m.size == 0 or n.size == 0:
        raise ValueError(f"mia_auc needs two non-empty 1-D score arrays; got shapes {m.shape} and {n.shape}")
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(n))):
        raise ValueError("mia_auc: scores must be finite")
    # Scores grow with "less likely a member", so nonmembers are the positive class.
    labels = np.concatenate([np.zeros(m.size), np.ones(n.size)])
    return float(roc_auc_score(labels, np.concatenate([m, n])))


# ---------------------------------------------------------------- one model pass
@dataclass
class TokenScores:
    """Per-example arrays of one model on N items, each [n_i] over the i-th item's counted tokens.

    logp: log p(token); correct: token == argmax (teacher forced); mu, sigma: next-token moments (None when
    not asked for); avg_loss: [N] mean NLL (`TokenStats.nll`, so `batched_avg_loss` on pairs); texts: zlib's text.
    """

    logp: list[np.ndarray]
    correct: list[np.ndarray]
    mu: list[np.ndarray] | None
    sigma: list[np.ndarray] | None
    avg_loss: np.ndarray
    texts: list[str]


def as_item(x: QARow | Item) -> Item:
    """A QARow becomes its (question, answer) pair; a str or a pair is kept."""
    return (x.question, x.answer) if isinstance(x, QARow) else x


def _zlib_text(item: Item) -> str:
    return item if isinstance(item, str) else item[1]


def encode_text(tokenizer: Any, text: str, max_length: int) -> Encoded:
    """Raw text as BOS + text tokens (right-cut to max_length), every token after the first counted."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = ([bos] if bos is not None else []) + tokenizer(text, add_special_tokens=False)["input_ids"]
    truncated = len(ids) > max_length
    ids = ids[:max_length]
    if len(ids) < 2:
        raise ValueError(f"raw text {text[:40]!r} gives {len(ids)} token(s) within max_length={max_length}: "
                         "nothing to score (it needs a token after the first)")
    return Encoded(ids, [IGNORE_INDEX] + ids[1:], truncated)


def encode_item(tokenizer: Any, item: Item, max_length: int) -> Encoded:
    """A (prompt, answer) pair through `encode_qa`; a str or a pair with prompt "" as raw text."""
    if isinstance(item, str):
        return encode_text(tokenizer, item, max_length)
    prompt, answer = item
    if prompt == "":
        return encode_text(tokenizer, answer, max_length)
    return encode_qa(tokenizer, prompt, answer, max_length)


def _rows(stats: TokenStats, moments: bool) -> list[tuple[np.ndarray, ...]]:
    """Per row of one batch: (logp, correct, mu, sigma) at counted positions (mu, sigma empty if not asked)."""
    mask = stats.mask.cpu()
    logits = stats.logits
    correct = (logits.argmax(-1) == stats.targets).cpu()  # type: ignore[union-attr]
    logp = stats.token_logp.double().cpu()
    mu = sigma = torch.zeros_like(logp)
    if moments:
        mu, sigma = (t.double().cpu() for t in next_token_moments(stats.log_probs()))
    return [tuple(t[b][mask[b]].numpy() for t in (logp, correct, mu, sigma)) for b in range(mask.shape[0])]


@torch.no_grad()
def token_scores(model: Any, tokenizer: Any, items: Sequence[QARow | Item], *, batch_size: int = 16,
                 max_length: int = 256, moments: bool = True) -> TokenScores:
    """Everything every attack and memorisation metric needs, one forward per length-sorted batch -> TokenScores."""
    its = [as_item(x) for x in items]
    encoded = [encode_item(tokenizer, it, max_length) for it in its]
    n = len(encoded)
    per: list[tuple[np.ndarray, ...]] = [()] * n
    avg_loss = np.zeros(n, dtype=np.float64)
    device, pad = model_device(model), pad_id(tokenizer)
    with eval_mode(model):
        for idx in chunks(length_order([len(e.input_ids) for e in encoded]), batch_size):
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad).items()}
            stats = forward_stats(model, batch, keep_logits=True)
            avg_loss[list(idx)] = stats.nll.double().cpu().numpy()
            for i, row in zip(idx, _rows(stats, moments)):
                per[i] = row
    return TokenScores(logp=[p[0] for p in per], correct=[p[1].astype(bool) for p in per],
                       mu=[p[2] for p in per] if moments else None, sigma=[p[3] for p in per] if moments else None,
                       avg_loss=avg_loss, texts=[_zlib_text(it) for it in its])


# ---------------------------------------------------------------- scores and AUCs
def attack_scores(ts: TokenScores, *, k: float = DEFAULT_K,
                  reference_loss: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Scores of each attack from one TokenScores ([N] each); 'reference' only with reference losses."""
    out = {"loss": ts.avg_loss.copy(),
           "zlib": np.array([zlib_score(l, t) for l, t in zip(ts.avg_loss, ts.texts)]),
           "min_k": np.array([min_k_score(lp, k) for lp in ts.logp])}
    if ts.mu is not None and ts.sigma is not None:
        out["min_k_plus_plus"] = np.array([min_k_plus_plus_score(lp, m, s, k)
                                           for lp, m, s in zip(ts.logp, ts.mu, ts.sigma)])
    if reference_loss is not None:
        out["reference"] = reference_score(ts.avg_loss, reference_loss)
    return out


def mia_scores(model: Any, tokenizer: Any, items: Sequence[QARow | Item], *, reference_model: Any = None,
               reference_tokenizer: Any = None, k: float = DEFAULT_K, batch_size: int = 16,
               max_length: int = 256) -> dict[str, np.ndarray]:
    """Per-example scores of every attack on `items` (higher = less likely a member) -> {attack: [N]}."""
    ts = token_scores(model, tokenizer, items, batch_size=batch_size, max_length=max_length)
    ref_loss = None
    if reference_model is not None:
        ref_loss = token_scores(reference_model, reference_tokenizer or tokenizer, items, batch_size=batch_size,
                                max_length=max_length, moments=False).avg_loss
    return attack_scores(ts, k=k, reference_loss=ref_loss)


def evaluate_mia(model: Any, tokenizer: Any, members: Sequence[QARow | Item], nonmembers: Sequence[QARow | Item],
                 *, reference_model: Any = None, reference_tokenizer: Any = None, k: float = DEFAULT_K,
                 batch_size: int = 16, max_length: int = 256) -> dict[str, Any]:
    """Every attack's AUC (MIA_METRICS) of members vs nonmembers; mia_reference_auc only with a reference model."""
    if not members or not nonmembers:
        raise ValueError(f"evaluate_mia needs members and nonmembers; got {len(members)} and {len(nonmembers)}")
    kw = dict(reference_model=reference_model, reference_tokenizer=reference_tokenizer, k=k,
              batch_size=batch_size, max_length=max_length)
    scores = mia_scores(model, tokenizer, list(members) + list(nonmembers), **kw)
    return mia_from_scores(scores, len(members), k=k)


def mia_from_scores(scores: dict[str, np.ndarray], n_members: int, *, k: float = DEFAULT_K) -> dict[str, Any]:
    """Every attack's AUC from per-example scores of members (first `n_members`) then nonmembers."""
    n = n_members
    out: dict[str, Any] = {f"mia_{a}_auc": mia_auc(s[:n], s[n:]) for a, s in scores.items()}
    notes = [] if "reference" in scores else ["mia_reference_auc not computed: no reference model given"]
    out.update(mia_k=k, n_members=n, n_nonmembers=len(next(iter(scores.values()))) - n, notes=notes)
    return out
