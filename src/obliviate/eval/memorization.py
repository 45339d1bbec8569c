"""TOFU memorisation extras and MUSE PrivLeak (docs/METRICS.md §1.5 and §2.3).

Extraction strength and exact memorisation both come from one teacher-forced pass: `correct[t]` says whether
answer token t is the argmax given the gold prefix. Which tokens count follows `token_rule` (mia.TOKEN_RULES):
  open_unlearning (default, as open-unlearning's src/evals/metrics/memorization.py): the answer without its
      last token (the EOS), and ES = 1 - k/N for the smallest k in 0..N-1 whose rest is all correct, k = N - 1
      when none is (their loop falls through at its last k), so ES >= 1/N;
  all_tokens: every token avg_loss counts, EOS included, and k ranges over 0..N (k = N, an empty rest,
      always qualifies), so ES = 0 when the last token is wrong.
EM = mean(correct) under either rule. A model that only ever predicts EOS has EM 0 under open_unlearning and
1/N under all_tokens.

PrivLeak (MUSE, Shi et al. 2024) = (AUC_unlearned - AUC_retrain) / AUC_retrain x 100 with MUSE's AUC
orientation: AUC = P(score_forget > score_holdout) of Min-K% (k = 0.4) scores (higher = less likely a member),
i.e. 1 - `mia_auc(forget, holdout)`. A model that still knows the forget set scores it low: AUC near 0,
PrivLeak near -100 (under-unlearning); a retrained model sits near 0.5 (PrivLeak ~0); positive = over-unlearning.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from obliviate.data.rows import QARow
from obliviate.eval.metrics import MetricInfo, register
from obliviate.eval.mia import (
    DEFAULT_K,
    DEFAULT_TOKEN_RULE,
    Item,
    TokenScores,
    keeps_last_token,
    mia_auc,
    min_k_score,
    token_scores,
)

DEFAULT_AUC_RETRAIN = 0.5

MEMORIZATION_METRICS: dict[str, MetricInfo] = register("memorization", {m.name: m for m in (
    MetricInfo("forget_extraction_strength", False, 2,
               "forget set: mean 1 - k/N, k the shortest gold prefix after which teacher-forced argmax "
               "reproduces the rest of the answer (eval.token_rule: open_unlearning drops the EOS, ES >= 1/N)"),
    MetricInfo("forget_exact_memorization", False, 2,
               "forget set: mean share of answer tokens that are the argmax given the gold prefix "
               "(eval.token_rule: open_unlearning drops the EOS)"),
    # The best PrivLeak is 0, not an extreme: higher_is_better cannot say that (as in eval/muse.py).
    MetricInfo("privleak", False, 1,
               "SIGNED MUSE PrivLeak (AUC - AUC_retrain)/AUC_retrain x 100; ideal 0, negative = under-unlearning "
               "(target ~ -100), positive = over-unlearning; its flag is moot: rank by privleak_abs"),
    MetricInfo("privleak_abs", False, 1, "|privleak|: distance from a retrained model's leakage"),
    MetricInfo("privleak_auc", True, 1,
               "MUSE orientation: P(Min-K% score forget > holdout); ~0 = forget set exposed, ~0.5 = like a "
               "retrained model"),
)})


# ---------------------------------------------------------------- pure functions on arrays
def _correct(correct: np.ndarray) -> np.ndarray:
    c = np.asarray(correct)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"expected a non-empty 1-D correctness vector, got shape {c.shape}")
    return c.astype(bool)


def extraction_strength_from_correct(correct: np.ndarray, *, empty_rest: bool = False) -> float:
    """Extraction strength 1 - k/N, k = smallest prefix length with all tokens >= k correct. [N] -> scalar.

    empty_rest False (open-unlearning): k <= N - 1, so ES >= 1/N; True: k = N allowed, ES 0 if the last is wrong.
    """
    c = _correct(correct)
    wrong = np.flatnonzero(~c)
    k = 0 if wrong.size == 0 else int(wrong[-1]) + 1  # the rest must start after the last wrong token
    return 1.0 - (k if empty_rest else min(k, c.size - 1)) / c.size


def exact_memorization_from_correct(correct: np.ndarray) -> float:
    """TOFU exact memorisation: share of answer tokens that are the teacher-forced argmax. [N] -> scalar."""
    return float(_correct(correct).mean())


def privleak_auc(forget_scores: np.ndarray, holdout_scores: np.ndarray) -> float:
    """MUSE's PrivLeak AUC: P(score_forget > score_holdout) + ties/2 = 1 - mia_auc(forget, holdout)."""
    # mia_auc(members, nonmembers) = P(nonmember > member); MUSE labels the other way round.
    return mia_auc(holdout_scores, forget_scores)


def privleak(auc_unlearned: float, auc_retrain: float | None = None) -> tuple[float | None, str | None]:
    """MUSE PrivLeak (AUC_unlearned - AUC_retrain) / AUC_retrain x 100; AUC_retrain defaults to 0.5 with a note;
    None (with a note) when AUC_retrain is 0."""
    note = None
    if auc_retrain is None:
        auc_retrain = DEFAULT_AUC_RETRAIN
        note = "privleak uses AUC_retrain = 0.5 (no retrained model given), as MUSE does without one"
    for name, v in (("auc_unlearned", auc_unlearned), ("auc_retrain", auc_retrain)):
        if not 0 <= v <= 1:
            raise ValueError(f"{name} must be an AUC in [0, 1], got {v}")
    if auc_retrain == 0:  # MUSE divides by it: undefined, reported as such rather than invented
        return None, ("privleak undefined: the reference AUC_retrain is 0 (the retrained model separates forget "
                      "from holdout perfectly the other way, which happens with a handful of rows); privleak_auc is "
                      "still reported")
    return (auc_unlearned - auc_retrain) / auc_retrain * 100.0, note


# ---------------------------------------------------------------- model-running
def _pairs(rows: Sequence[QARow | Item]) -> list[QARow | Item]:
    if not rows:
        raise ValueError("no rows to evaluate")
    return list(rows)


def extraction_strength(model: Any, tokenizer: Any, rows: Sequence[QARow | Item], *, batch_size: int = 16,
                        max_length: int = 256, token_rule: str = DEFAULT_TOKEN_RULE) -> np.ndarray:
    """Per-example TOFU extraction strength of the answers (one teacher-forced pass per batch) -> [N]."""
    ts = token_scores(model, tokenizer, _pairs(rows), batch_size=batch_size, max_length=max_length, moments=False,
                      token_rule=token_rule)
    return np.array([extraction_strength_from_correct(c, empty_rest=keeps_last_token(token_rule))
                     for c in ts.correct])


def exact_memorization(model: Any, tokenizer: Any, rows: Sequence[QARow | Item], *, batch_size: int = 16,
                       max_length: int = 256, token_rule: str = DEFAULT_TOKEN_RULE) -> np.ndarray:
    """Per-example TOFU exact memorisation of the answers (one teacher-forced pass per batch) -> [N]."""
    ts = token_scores(model, tokenizer, _pairs(rows), batch_size=batch_size, max_length=max_length, moments=False,
                      token_rule=token_rule)
    return np.array([exact_memorization_from_correct(c) for c in ts.correct])


def _min_k_auc(ts: TokenScores, n_forget: int, k: float) -> float:
    scores = np.array([min_k_score(lp, k) for lp in ts.logp])
    return privleak_auc(scores[:n_forget], scores[n_forget:])


def min_k_privleak_auc(model: Any, tokenizer: Any, forget: Sequence[QARow | Item], holdout: Sequence[QARow | Item],
                       *, k: float = DEFAULT_K, batch_size: int = 16, max_length: int = 256,
                       token_rule: str = DEFAULT_TOKEN_RULE) -> float:
    """PrivLeak AUC of Min-K% scores, forget vs holdout (rows, pairs or raw texts cut at max_length) -> scalar.

    MUSE's own PrivLeak scores whole documents: see muse.muse_min_k_auc.
    """
    items = _pairs(forget) + _pairs(holdout)
    ts = token_scores(model, tokenizer, items, batch_size=batch_size, max_length=max_length, moments=False,
                      token_rule=token_rule)
    return _min_k_auc(ts, len(forget), k)


def forget_memorization(correct: Sequence[np.ndarray], *, token_rule: str = DEFAULT_TOKEN_RULE) -> dict[str, float]:
    """Mean extraction strength and exact memorisation over examples' per-token correctness vectors
    (already cut by `token_scores` under the same token_rule)."""
    rest = keeps_last_token(token_rule)
    return {"forget_extraction_strength": float(np.mean([extraction_strength_from_correct(c, empty_rest=rest)
                                                         for c in correct])),
            "forget_exact_memorization": float(np.mean([exact_memorization_from_correct(c) for c in correct]))}


def memorization_from_scores(ts: TokenScores, n_forget: int, *, retrain_ts: TokenScores | None = None,
                             auc_retrain: float | None = None, k: float = DEFAULT_K,
                             token_rule: str = DEFAULT_TOKEN_RULE) -> dict[str, Any]:
    """ES, EM and PrivLeak from TokenScores of forget + holdout (first `n_forget` rows are the forget set);
    `retrain_ts` (a retrained model's scores on the same rows) gives PrivLeak's reference AUC."""
    if retrain_ts is not None and auc_retrain is not None:
        raise ValueError("give either a retrained model's scores or auc_retrain, not both")
    if retrain_ts is not None:
        auc_retrain = _min_k_auc(retrain_ts, n_forget, k)
    auc = _min_k_auc(ts, n_forget, k)
    value, note = privleak(auc, auc_retrain)
    return {
        **forget_memorization(ts.correct[:n_forget], token_rule=token_rule),
        "privleak": value,
        "privleak_abs": None if value is None else abs(value),
        "privleak_auc": auc,
        "privleak_auc_retrain": auc_retrain,
        "privleak_k": k,
        "token_rule": token_rule,
        "n_forget": n_forget,
        "n_holdout": len(ts.correct) - n_forget,
        "notes": [note] if note else [],
    }


def evaluate_memorization(model: Any, tokenizer: Any, forget_rows: Sequence[QARow | Item],
                          holdout_rows: Sequence[QARow | Item], *, retain_model: Any = None,
                          auc_retrain: float | None = None, k: float = DEFAULT_K, batch_size: int = 16,
                          max_length: int = 256, token_rule: str = DEFAULT_TOKEN_RULE) -> dict[str, Any]:
    """Forget-set ES and EM and PrivLeak (Min-K% forget vs holdout; retain model's AUC or a given one, else 0.5)."""
    if retain_model is not None and auc_retrain is not None:
        raise ValueError("give either retain_model or auc_retrain, not both")
    items = _pairs(forget_rows) + _pairs(holdout_rows)
    kw = {"batch_size": batch_size, "max_length": max_length, "moments": False, "token_rule": token_rule}
    ts = token_scores(model, tokenizer, items, **kw)
    retrain_ts = token_scores(retain_model, tokenizer, items, **kw) if retain_model is not None else None
    return memorization_from_scores(ts, len(forget_rows), retrain_ts=retrain_ts, auc_retrain=auc_retrain, k=k,
                                    token_rule=token_rule)
