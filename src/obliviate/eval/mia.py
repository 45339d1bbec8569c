"""Membership-inference attacks (docs/METRICS.md §3): per-example scores and their AUCs.

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

Last answer token (`token_rule`). open-unlearning (src/evals/metrics/utils.py, `tokenwise_logprobs` and
`tokenwise_vocab_logprobs`: `nonzero(...)[0][:-1]`, "-1 to ignore eos prediction") drops the last labelled
token, the EOS its template appends, from Min-K%, Min-K%++, exact memorisation and extraction strength,
while its LOSS and zlib attacks (`evaluate_probability`) keep every token. TOKEN_RULES:
  open_unlearning  (default) the same: logp / correct / mu / sigma of a (prompt, answer) pair lose their
                   last counted token (kept when it is the only one); avg_loss keeps it
  all_tokens       every token avg_loss counts, EOS included
Raw texts are never cut: their reference is MUSE's code, which scores every token after BOS.
Long raw texts can be scored whole in overlapping windows (`document_windows`, `document_logp`).
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
from obliviate.data.text import document_ids
from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id
from obliviate.eval.generate import eval_mode, model_device, score_tokens, token_batches
from obliviate.eval.metrics import MetricInfo, register
from obliviate.modeling.logprobs import IGNORE_INDEX, TokenStats, forward_stats

Item = Union[str, tuple[str, str]]
ATTACKS: tuple[str, ...] = ("loss", "zlib", "min_k", "min_k_plus_plus", "reference")
DEFAULT_K = 0.4  # MUSE's PrivLeak uses Min-40%
# A one-hot next-token distribution has sigma 0; open-unlearning clamps the variance at 1e-6 (min_k_plus_plus.py),
# i.e. sigma at 1e-3, so z-scores stay finite and equal theirs.
SIGMA_FLOOR = 1e-3
TOKEN_RULES: tuple[str, ...] = ("open_unlearning", "all_tokens")
DEFAULT_TOKEN_RULE = "open_unlearning"


def _auc_info(attack: str, what: str, version: int = 1) -> tuple[MetricInfo, MetricInfo]:
    """The attack's AUC and its two-sided gap |AUC - 0.5| (an AUC far below 0.5 tells members apart as well)."""
    return (MetricInfo(f"mia_{attack}_auc", False, version,
                       f"{what}; AUC = P(score_nonmember > score_member) (0.5 = cannot tell; 1 = members exposed; "
                       "near 0 = members stand out the other way, e.g. over-unlearned: read mia_*_auc_gap)"),
            MetricInfo(f"mia_{attack}_auc_gap", False, 1,
                       f"{what}; two-sided: |AUC - 0.5| (0 = cannot tell members from non-members either way, "
                       "0.5 = fully separated in one direction or the other)"))


MIA_METRICS: dict[str, MetricInfo] = register("mia", {m.name: m for pair in (
    _auc_info("loss", "LOSS attack, score avg_loss (every answer token)"),
    _auc_info("zlib", "zlib attack, score avg_loss / zlib-compressed bytes of the text"),
    _auc_info("min_k", "Min-K% attack (Shi et al. 2024), score -mean of the lowest k share of token log-probs "
              "(eval.token_rule: open_unlearning drops the answer's EOS)", 2),
    _auc_info("min_k_plus_plus", "Min-K%++ attack (Zhang et al. 2024), Min-K% on standardised log-probs "
              "(eval.token_rule: open_unlearning drops the answer's EOS)", 2),
    _auc_info("reference", "reference attack, score avg_loss - reference model's avg_loss; absent without one"),
) for m in pair})


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


def keeps_last_token(token_rule: str) -> bool:
    """True for 'all_tokens', False for 'open_unlearning' (TOKEN_RULES); ValueError for any other rule."""
    if token_rule not in TOKEN_RULES:
        raise ValueError(f"unknown token_rule {token_rule!r}; valid rules: {', '.join(TOKEN_RULES)}")
    return token_rule == "all_tokens"


def drop_last_token(x: np.ndarray) -> np.ndarray:
    """open-unlearning's cut (utils.py `[:-1]`): all counted tokens but the last; a lone token is kept. [n] -> [n-1]."""
    return x[:-1] if len(x) >= 2 else x


def _is_pair(item: Item) -> bool:
    """A (prompt, answer) pair scored through encode_qa (its last counted token is the appended EOS)."""
    return not isinstance(item, str) and item[0] != ""


def document_windows(ids: Sequence[int], window: int, stride: int) -> list[Encoded]:
    """Windows ids[j*stride : j*stride + window] that together score every id after the first exactly once.

    Each window labels only ids past the previous window's end, so after the first window every scored id has
    at least window - stride ids of context (sliding-window perplexity). ids [L] -> ceil-many windows.
    """
    if not 1 <= stride < window:
        raise ValueError(f"need 1 <= stride < window, got stride={stride}, window={window}")
    if len(ids) < 2:
        raise ValueError(f"a document needs at least 2 tokens to score one, got {len(ids)}")
    out: list[Encoded] = []
    done, start = 1, 0
    while True:
        end = min(start + window, len(ids))
        chunk = list(ids[start:end])
        out.append(Encoded(chunk, [t if start + i >= done else IGNORE_INDEX for i, t in enumerate(chunk)],
                           len(ids) > window))
        if end == len(ids):
            return out
        done, start = end, start + stride


def _rows(stats: TokenStats, moments: bool) -> list[tuple[np.ndarray, ...]]:
    """Per row of one batch: (logp, correct, mu, sigma) at counted positions (mu, sigma empty if not asked)."""
    mask = stats.mask.cpu()
    targets = stats.targets[stats.mask]  # type: ignore[index]
    correct = stats.spread(stats.answer_logits().argmax(-1) == targets).cpu()
    logp = stats.token_logp.double().cpu()
    mu = sigma = torch.zeros_like(logp)
    if moments:
        mu, sigma = (stats.spread(t).double().cpu() for t in next_token_moments(stats.answer_log_probs()))
    return [tuple(t[b][mask[b]].numpy() for t in (logp, correct, mu, sigma)) for b in range(mask.shape[0])]


@torch.no_grad()
def _score_encoded(model: Any, tokenizer: Any, encoded: Sequence[Encoded], batch_size: int | None, moments: bool,
                   logp_only: bool = False) -> tuple[list[tuple[np.ndarray, ...]], np.ndarray]:
    """(logp, correct, mu, sigma) at the counted positions of each Encoded, and avg_loss [N]; length-sorted batches.
    logp_only: (logp,) alone, without keeping the [B, T, V] logits (long documents)."""
    n = len(encoded)
    per: list[tuple[np.ndarray, ...]] = [()] * n
    avg_loss = np.zeros(n, dtype=np.float64)
    device, pad = model_device(model), pad_id(tokenizer)
    with eval_mode(model):
        for idx in token_batches([len(e.input_ids) for e in encoded], batch_size, score_tokens(device)):
            batch = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad).items()}
            stats = forward_stats(model, batch, keep_logits=not logp_only)
            avg_loss[list(idx)] = stats.nll.double().cpu().numpy()
            rows = ([(lp[m].double().numpy(),) for lp, m in zip(stats.token_logp.cpu(), stats.mask.cpu())]
                    if logp_only else _rows(stats, moments))
            for i, row in zip(idx, rows):
                per[i] = row
    return per, avg_loss


def token_scores(model: Any, tokenizer: Any, items: Sequence[QARow | Item], *, batch_size: int | None = 16,
                 max_length: int = 256, moments: bool = True, token_rule: str = DEFAULT_TOKEN_RULE) -> TokenScores:
    """Everything every attack and memorisation metric needs, one forward per length-sorted batch -> TokenScores.

    token_rule 'open_unlearning' drops a pair's last counted token (EOS) from logp/correct/mu/sigma, not avg_loss.
    """
    keep = keeps_last_token(token_rule)
    its = [as_item(x) for x in items]
    per, avg_loss = _score_encoded(model, tokenizer, [encode_item(tokenizer, it, max_length) for it in its],
                                   batch_size, moments)
    per = [row if keep or not _is_pair(it) else tuple(drop_last_token(a) for a in row) for row, it in zip(per, its)]
    return TokenScores(logp=[p[0] for p in per], correct=[p[1].astype(bool) for p in per],
                       mu=[p[2] for p in per] if moments else None, sigma=[p[3] for p in per] if moments else None,
                       avg_loss=avg_loss, texts=[_zlib_text(it) for it in its])


def document_logp(model: Any, tokenizer: Any, texts: Sequence[str], *, window: int | None, stride: int | None = None,
                  max_tokens: int | None = None, batch_size: int = 8) -> tuple[list[np.ndarray], int]:
    """Log-probs of every token after BOS of whole documents (MUSE's privleak scoring), windowed past `window`.

    window None: one pass per document, however long; stride defaults to window // 2; max_tokens keeps only the
    first ids (BOS included). -> ([n_i] per document, number of documents that needed more than one window).
    """
    docs = []
    for text in texts:
        ids = document_ids(tokenizer, text)
        docs.append(ids[:max_tokens] if max_tokens else ids)
    if any(len(ids) < 2 for ids in docs):
        raise ValueError("a document gives fewer than 2 tokens: nothing to score (it needs a token after BOS)")
    step = stride if stride is not None else (window // 2 if window else None)
    wins = [document_windows(ids, window, step) if window and step and len(ids) > window  # type: ignore[arg-type]
            else [Encoded(list(ids), [IGNORE_INDEX] + list(ids[1:]), False)] for ids in docs]
    flat = [w for ws in wins for w in ws]
    per, _ = _score_encoded(model, tokenizer, flat, batch_size, moments=False, logp_only=True)
    out, pos = [], 0
    for ws in wins:
        out.append(np.concatenate([per[pos + j][0] for j in range(len(ws))]))
        pos += len(ws)
    return out, sum(len(ws) > 1 for ws in wins)


# ---------------------------------------------------------------- scores and AUCs
def attack_scores(ts: TokenScores, *, k: float = DEFAULT_K,
                  reference_loss: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Scores of each attack from one TokenScores ([N] each); 'reference' only with reference losses."""
    out = {"loss": ts.avg_loss.copy(),
           "zlib": np.array([zlib_score(loss, t) for loss, t in zip(ts.avg_loss, ts.texts)]),
           "min_k": np.array([min_k_score(lp, k) for lp in ts.logp])}
    if ts.mu is not None and ts.sigma is not None:
        out["min_k_plus_plus"] = np.array([min_k_plus_plus_score(lp, m, s, k)
                                           for lp, m, s in zip(ts.logp, ts.mu, ts.sigma)])
    if reference_loss is not None:
        out["reference"] = reference_score(ts.avg_loss, reference_loss)
    return out


def mia_scores(model: Any, tokenizer: Any, items: Sequence[QARow | Item], *, reference_model: Any = None,
               reference_tokenizer: Any = None, k: float = DEFAULT_K, batch_size: int = 16,
               max_length: int = 256, token_rule: str = DEFAULT_TOKEN_RULE) -> dict[str, np.ndarray]:
    """Per-example scores of every attack on `items` (higher = less likely a member) -> {attack: [N]}."""
    ts = token_scores(model, tokenizer, items, batch_size=batch_size, max_length=max_length, token_rule=token_rule)
    ref_loss = None
    if reference_model is not None:
        ref_loss = token_scores(reference_model, reference_tokenizer or tokenizer, items, batch_size=batch_size,
                                max_length=max_length, moments=False).avg_loss
    return attack_scores(ts, k=k, reference_loss=ref_loss)


def evaluate_mia(model: Any, tokenizer: Any, members: Sequence[QARow | Item], nonmembers: Sequence[QARow | Item],
                 *, reference_model: Any = None, reference_tokenizer: Any = None, k: float = DEFAULT_K,
                 batch_size: int = 16, max_length: int = 256, token_rule: str = DEFAULT_TOKEN_RULE) -> dict[str, Any]:
    """Every attack's AUC (MIA_METRICS) of members vs nonmembers; mia_reference_auc only with a reference model."""
    if not members or not nonmembers:
        raise ValueError(f"evaluate_mia needs members and nonmembers; got {len(members)} and {len(nonmembers)}")
    kw = dict(reference_model=reference_model, reference_tokenizer=reference_tokenizer, k=k,
              batch_size=batch_size, max_length=max_length, token_rule=token_rule)
    scores = mia_scores(model, tokenizer, list(members) + list(nonmembers), **kw)
    return mia_from_scores(scores, len(members), k=k)


def mia_from_scores(scores: dict[str, np.ndarray], n_members: int, *, k: float = DEFAULT_K) -> dict[str, Any]:
    """Every attack's AUC and its two-sided gap |AUC - 0.5| from per-example scores of members (first
    `n_members`) then nonmembers."""
    n = n_members
    out: dict[str, Any] = {f"mia_{a}_auc": mia_auc(s[:n], s[n:]) for a, s in scores.items()}
    out.update({f"{key}_gap": abs(auc - 0.5) for key, auc in list(out.items())})
    notes = [] if "reference" in scores else ["mia_reference_auc not computed: no reference model given"]
    out.update(mia_k=k, n_members=n, n_nonmembers=len(next(iter(scores.values()))) - n, notes=notes)
    return out
