"""TOFU metrics (Maini et al. 2024) exactly as docs/METRICS.md §1 defines them, plus the split evaluator.

Pure metric functions take per-example losses as numpy arrays; `evaluate_split` / `evaluate_tofu`
run the model (through `generate_answers` and `batched_avg_loss`) and assemble them. A number that
cannot be computed from what was given (forget quality without a retain model, a truth ratio
without perturbed answers) is None, and the result's notes say why: nothing is invented.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from scipy.special import logsumexp
from scipy.stats import ks_2samp

from obliviate.data.rows import QARow
from obliviate.errors import ConfigError, DataError
from obliviate.eval.fluency import fluency_rows, fluency_summary
from obliviate.eval.generate import batched_avg_loss, generate_answers
from obliviate.eval.metrics import MetricInfo, register

Kind = Literal["forget", "retain", "real_authors", "world_facts"]
KINDS: tuple[str, ...] = ("forget", "retain", "real_authors", "world_facts")
UTILITY_SPLITS: tuple[str, ...] = ("retain", "real_authors", "world_facts")
UTILITY_PARTS: tuple[str, ...] = ("prob", "rougeL_recall", "truth_ratio")
UTILITY_KEYS: tuple[str, ...] = tuple(f"{s}_{p}" for s in UTILITY_SPLITS for p in UTILITY_PARTS)
# the per-row values forget quality is computed from, kept in an evaluation's rows beside the row means: the model's
# TOFU truth ratio of each forget row and the retain model's of the same row (a bootstrap resamples them in pairs)
FQ_ROWS: tuple[str, str] = ("forget_quality_tr", "forget_quality_tr_retain")


SPLIT_WHERE = {"forget": "forget set", "retain": "retain set", "real_authors": "real authors",
               "world_facts": "world facts"}
_PROB_DOC = {"qa": "mean exp(-avg_loss(q, answer))",
             "mcq": "mean c/(c + sum w), length-normalised probs of the answer vs its perturbed answers"}
_OTHER_METRICS = (
    MetricInfo("forget_truth_ratio", True, 1, "forget set: mean(min(TR, 1/TR)); 1 = cannot tell true from perturbed"),
    MetricInfo("forget_quality", True, 1, "KS-test p-value of forget TRs vs a retain model's; None without one"),
    MetricInfo("model_utility", True, 1, "hmean of {prob, rougeL_recall, truth_ratio} x {retain, ra, wf}"),
    MetricInfo("forget_token_entropy", True, 1, "forget set: mean normalised unigram entropy of greedy answers"),
    MetricInfo("forget_repetition_rate", False, 1, "forget set: mean share of repeated word bigrams in answers"),
    MetricInfo("forget_degenerate_share", False, 1, "forget set: share of empty/degenerate greedy answers"),
)


def _build_metrics() -> dict[str, MetricInfo]:
    """The METRICS table: on the forget set lower prob/ROUGE/fact recall is better, elsewhere higher."""
    infos = list(_OTHER_METRICS)
    for s in KINDS:
        up, where = s != "forget", SPLIT_WHERE[s]
        prob_doc = _PROB_DOC["qa" if s in ("forget", "retain") else "mcq"]
        infos += [MetricInfo(f"{s}_prob", up, 1, f"{where}: {prob_doc}"),
                  MetricInfo(f"{s}_rougeL_recall", up, 1, f"{where}: mean ROUGE-L recall, greedy answer vs answer"),
                  MetricInfo(f"{s}_fact_recall", up, 1, f"{where}: mean share of annotated facts in greedy answers")]
        if s != "forget":
            infos.append(MetricInfo(f"{s}_truth_ratio", True, 1, f"{where}: mean(max(0, 1 - TR))"))
    return {m.name: m for m in infos}


METRICS: dict[str, MetricInfo] = register("tofu", _build_metrics())


def truth_ratio(correct_loss: np.ndarray, perturbed_loss: np.ndarray) -> np.ndarray:
    """TOFU truth ratio exp(-mean_i perturbed_i) / exp(-correct), in log space. [N], [N, K] -> [N]."""
    c, p = np.asarray(correct_loss, dtype=np.float64), np.asarray(perturbed_loss, dtype=np.float64)
    if c.ndim != 1 or p.ndim != 2 or p.shape[0] != c.shape[0] or p.shape[1] == 0:
        raise ValueError(f"truth_ratio needs correct_loss [N] and perturbed_loss [N, K>0]; "
                         f"got {c.shape} and {p.shape}")
    return np.exp(c - p.mean(axis=1))


def truth_ratio_terms(tr: np.ndarray, kind: str) -> np.ndarray:
    """Each row's term of a split's TOFU truth ratio: min(TR, 1/TR) on the forget split, max(0, 1 - TR) on the
    others. [N] -> [N]; their mean is the split's truth ratio."""
    tr = _nonempty(tr, "truth ratios")
    return np.minimum(tr, 1.0 / tr) if kind == "forget" else np.maximum(0.0, 1.0 - tr)


def forget_truth_ratio(tr: np.ndarray) -> float:
    """TOFU forget-set truth ratio: mean(min(TR, 1/TR)). tr: [N] -> scalar."""
    return float(np.mean(truth_ratio_terms(tr, "forget")))


def retain_truth_ratio(tr: np.ndarray) -> float:
    """TOFU retain / real-authors / world-facts truth ratio: mean(max(0, 1 - TR)). tr: [N] -> scalar."""
    return float(np.mean(truth_ratio_terms(tr, "retain")))


def normalised_prob(correct_loss: np.ndarray, option_losses: np.ndarray) -> np.ndarray:
    """TOFU ra/wf Prob c/(c + sum_i w_i), c = exp(-correct), w_i = exp(-option_i). [N], [N, K] -> [N]."""
    c, w = np.asarray(correct_loss, dtype=np.float64), np.asarray(option_losses, dtype=np.float64)
    if c.ndim != 1 or w.ndim != 2 or w.shape[0] != c.shape[0]:
        raise ValueError(f"normalised_prob needs correct_loss [N] and option_losses [N, K]; "
                         f"got {c.shape} and {w.shape}")
    # log c - log(c + sum w) = -c_loss - logsumexp(-[c_loss, w_losses]): stable for large losses.
    return np.exp(-c - logsumexp(-np.concatenate([c[:, None], w], axis=1), axis=1))


def forget_quality(tr_unlearned: np.ndarray, tr_retain_model: np.ndarray | None) -> float | None:
    """TOFU forget quality: p-value of ks_2samp(forget TRs, retain model's forget TRs); None without the latter.

    TOFU's code feeds exp(perturbed - paraphrased) = 1/TR; KS is invariant under that monotone map.
    """
    if tr_retain_model is None or len(tr_retain_model) == 0:
        return None
    a = _nonempty(tr_unlearned, "forget truth ratios of the unlearned model")
    b = np.asarray(tr_retain_model, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("forget_quality: truth ratios must be finite")
    return float(ks_2samp(a, b).pvalue)


def harmonic_mean(nums: np.ndarray) -> float:
    """n / sum(1/x) of positive numbers [n] (scipy.stats.hmean's value without its argument handling)."""
    return float(len(nums) / np.sum(1.0 / nums))


def model_utility(values: Mapping[str, float | None]) -> float:
    """TOFU model utility: the harmonic mean n / sum(1/x) of the 9 numbers UTILITY_KEYS (TOFU's code calls
    scipy.stats.hmean, the same number; written out, it is ~25x faster, which the bootstraps that recompute it
    thousands of times need); a zero gives 0."""
    missing = [k for k in UTILITY_KEYS if values.get(k) is None]
    if missing:
        raise ValueError(f"model_utility needs all of {', '.join(UTILITY_KEYS)}; missing: {', '.join(missing)}")
    nums = np.array([float(values[k]) for k in UTILITY_KEYS])  # type: ignore[arg-type]
    bad = [k for k, v in zip(UTILITY_KEYS, nums) if not (np.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"model_utility needs finite non-negative numbers; bad: {', '.join(bad)}")
    if np.any(nums == 0):
        return 0.0  # the harmonic mean's limit; scipy would warn about division by zero
    return harmonic_mean(nums)


def utility_elasticities(values: Mapping[str, float | None]) -> dict[str, float]:
    """Each part's elasticity in model utility, d log MU / d log x_k = (1/x_k) / sum_j 1/x_j (they sum to 1): the
    share of a relative change in part k that MU follows (a harmonic mean leans on its smallest parts); {} when a part
    of UTILITY_KEYS is missing or not positive."""
    nums = [values.get(k) for k in UTILITY_KEYS]
    if any(v is None or not np.isfinite(v) or v <= 0 for v in nums):  # type: ignore[operator]
        return {}
    inverse = 1.0 / np.array(nums, dtype=np.float64)
    return {k: float(w) for k, w in zip(UTILITY_KEYS, inverse / inverse.sum())}


class _RememberingStemmer:
    """rouge_score's Porter stemmer with each word's stem remembered: the same stems, each word stemmed once
    (stemming is most of ROUGE's time on long generations)."""

    def __init__(self, stemmer: Any) -> None:
        self.stem = lru_cache(maxsize=2**17)(stemmer.stem)


@lru_cache(maxsize=1)
def _rouge_tokenizer() -> Any:
    """rouge_score's own tokenizer with Porter stemming (as TOFU and open-unlearning score ROUGE-L), stems remembered."""
    from rouge_score import tokenizers

    tokenizer = tokenizers.DefaultTokenizer(use_stemmer=True)
    tokenizer._stemmer = _RememberingStemmer(tokenizer._stemmer)  # rouge_score offers no hook for the stemmer
    return tokenizer


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists, bit-parallel (Hyyrö 2004: one bit per token of
    `a`, V' = (V + (V & M_y)) | (V & ~M_y) for each token y of `b`; LCS = |a| - ones(V)): the number rouge_score's
    O(|a|·|b|) table gives, with Python's integers doing |a| cells per operation."""
    if not a or not b:
        return 0
    match: dict[str, int] = {}
    for i, tok in enumerate(a):
        match[tok] = match.get(tok, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for tok in b:
        m = match.get(tok)
        if m:
            u = v & m
            v = ((v + u) | (v - u)) & full
    return len(a) - bin(v).count("1")


def rouge_recall(generations: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """TOFU ROUGE-L recall of each generation against its target (docs/METRICS.md §1.1): LCS of rouge_score's
    stemmed tokens / target tokens, 0 when either side has none (rouge_score's RougeScorer value). -> [N]."""
    if len(generations) != len(targets):
        raise ValueError(f"rouge_recall: {len(generations)} generations but {len(targets)} targets")
    tok = _rouge_tokenizer()
    out = np.zeros(len(targets), dtype=np.float64)
    for i, (g, t) in enumerate(zip(generations, targets)):
        ref = tok.tokenize(t)
        if ref:
            out[i] = lcs_length(ref, tok.tokenize(g)) / len(ref)
    return out


def fact_recall(generations: Sequence[str], rows: Sequence[QARow]) -> float | None:
    """Mean over annotated rows of the share of row.asked_facts() found (case-insensitive) in the generation.

    Facts the question already states are not counted: copying them proves no memory.
    """
    if len(generations) != len(rows):
        raise ValueError(f"fact_recall: {len(generations)} generations but {len(rows)} rows")
    shares = []
    for gen, row in zip(generations, rows):
        facts = row.asked_facts()
        if facts:
            low = gen.lower()
            shares.append(sum(f.lower() in low for f in facts) / len(facts))
    return float(np.mean(shares)) if shares else None


def _nonempty(x: Any, what: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"expected a non-empty 1-D array of {what}, got shape {arr.shape}")
    return arr


@dataclass
class SplitResult:
    """Per-example results of one split ([N] arrays; None where docs/METRICS.md §1 cannot define them)."""

    kind: str
    avg_loss: np.ndarray
    prob: np.ndarray | None
    truth_ratio: np.ndarray | None
    rougeL_recall: np.ndarray
    generations: list[str]
    summary: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> dict[str, list[float]]:
        """Per-row values of this split's row-mean metrics, keyed by metric name ({kind}_rougeL_recall, _prob,
        _truth_ratio where defined): each list's mean is the metric; what interval bootstraps resample."""
        out = {f"{self.kind}_rougeL_recall": [float(v) for v in self.rougeL_recall]}
        if self.prob is not None:
            out[f"{self.kind}_prob"] = [float(v) for v in self.prob]
        if self.truth_ratio is not None:
            out[f"{self.kind}_truth_ratio"] = [float(v) for v in truth_ratio_terms(self.truth_ratio, self.kind)]
        return out


def perturbed_count(rows: Sequence[QARow]) -> tuple[int | None, str | None]:
    """K, the number of perturbed answers per row, or None and the reason truth ratios cannot be computed."""
    lacking = sum(1 for r in rows if not r.perturbed_answer)
    if lacking:
        return None, f"{lacking} of {len(rows)} rows lack perturbed answers: truth ratio not computed"
    counts = sorted({len(r.perturbed_answer) for r in rows})
    if len(counts) > 1:
        return None, f"rows hold different numbers of perturbed answers {counts}: truth ratio not computed"
    return counts[0], None


def reference_forget_rows(splits: Mapping[str, Sequence[QARow]], key: str) -> Sequence[QARow]:
    """The forget rows a forget-quality reference (config `key`) compares on: the forget split must be loaded and
    give truth ratios (perturbed answers); a ConfigError / DataError naming the fix otherwise."""
    if "forget" not in splits:
        raise ConfigError(f"{key} is set but eval.forget_split is null: forget quality needs a forget split")
    k, why = perturbed_count(splits["forget"])
    if k is None:
        raise DataError(f"forget split cannot give truth ratios: {why}; use a *_perturbed split")
    return splits["forget"]


def correct_answers(rows: Sequence[QARow], kind: str) -> tuple[list[str], int]:
    """The TR 'correct' answer per row (paraphrase on forget/retain, answer on ra/wf) and the fallback count."""
    if kind in ("real_authors", "world_facts"):
        return [r.answer for r in rows], 0
    para = [r.paraphrased_answer if r.paraphrased_answer and r.paraphrased_answer.strip() else None for r in rows]
    return [r.answer if p is None else p for r, p in zip(rows, para)], para.count(None)


def split_losses(model: Any, tokenizer: Any, rows: Sequence[QARow], correct: list[str] | None, k: int | None,
                  batch_size: int, max_length: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One batched pass: avg_loss of answers [N], of separate correct answers [N] (if given), of perturbed [N, K]."""
    n = len(rows)
    pairs = [(r.question, r.answer) for r in rows]
    if correct is not None:
        pairs += [(r.question, c) for r, c in zip(rows, correct)]
    if k is not None:
        pairs += [(r.question, p) for r in rows for p in r.perturbed_answer]
    losses = batched_avg_loss(model, tokenizer, pairs, batch_size=batch_size, max_length=max_length,
                              desc="evaluating: answer likelihoods")
    end = 2 * n if correct is not None else n
    return losses[:n], (losses[n:end] if correct is not None else None), (losses[end:].reshape(n, k) if k else None)


def evaluate_split(model: Any, tokenizer: Any, rows: Sequence[QARow], *, kind: Kind, max_new_tokens: int = 200,
                   batch_size: int = 16, max_length: int = 256, max_total_tokens: int | None = None,
                   generations: Sequence[str] | None = None) -> SplitResult:
    """TOFU Prob, truth ratio, ROUGE-L recall and fact recall of one split (docs/METRICS.md §1).

    max_total_tokens bounds prompt + generated answer (closer-look protocol: 200) instead of max_new_tokens.
    `generations`: the rows' greedy answers when the caller generated them already (`evaluate_tofu` generates
    every split's in one pool)."""
    if kind not in KINDS:
        raise ValueError(f"unknown split kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if not rows:
        raise ValueError(f"split {kind!r} has no rows to evaluate")
    notes: list[str] = []
    k, why = perturbed_count(rows)
    if why:
        notes.append(why)
    qa_split = kind in ("forget", "retain")
    correct, fallback = correct_answers(rows, kind)
    if qa_split and k is not None and fallback:
        notes.append(f"{fallback} of {len(rows)} rows lack paraphrased_answer: their truth ratio uses the answer")
    answer_loss, para_loss, pert_loss = split_losses(
        model, tokenizer, rows, correct if qa_split and k is not None else None, k, batch_size, max_length)
    tr = None if pert_loss is None else truth_ratio(para_loss if qa_split else answer_loss, pert_loss)
    if qa_split:
        prob: np.ndarray | None = np.exp(-answer_loss)
    elif pert_loss is not None:
        prob = normalised_prob(answer_loss, pert_loss)
    else:
        prob = None
        notes.append("prob not computed: real-authors/world-facts Prob is normalised over perturbed answers")
    if generations is None:
        generations = generate_answers(model, tokenizer, [r.question for r in rows], max_new_tokens=max_new_tokens,
                                       batch_size=batch_size, max_total_tokens=max_total_tokens,
                                       desc=f"evaluating {kind}: answers")
    elif len(generations) != len(rows):
        raise ValueError(f"{len(generations)} generations for {len(rows)} rows of split {kind!r}")
    generations = list(generations)
    rouge = rouge_recall(generations, [r.answer for r in rows])
    aggregate = forget_truth_ratio if kind == "forget" else retain_truth_ratio
    summary = {
        "n": len(rows),
        "prob": None if prob is None else float(prob.mean()),
        "rougeL_recall": float(rouge.mean()),
        "truth_ratio": None if tr is None else aggregate(tr),
        "fact_recall": fact_recall(generations, rows),
        "n_perturbed": k,
        "n_paraphrase_fallback": fallback if qa_split else 0,
        "notes": notes,
    }
    return SplitResult(kind, answer_loss, prob, tr, rouge, generations, summary)


def evaluate_tofu(model: Any, tokenizer: Any, splits: Mapping[str, Sequence[QARow]], *,
                  retain_model_forget_tr: np.ndarray | None = None, max_new_tokens: int = 200,
                  batch_size: int = 16, max_length: int = 256, max_total_tokens: int | None = None,
                  results_out: dict[str, SplitResult] | None = None) -> dict[str, Any]:
    """All TOFU metrics of METRICS (None where undefined, with a note), per-example forget TRs and generations.

    `results_out`, when given, receives each split's SplitResult (so FE/MU can reuse the generations).
    """
    unknown = sorted(set(splits) - set(KINDS))
    if unknown or not splits:
        raise ValueError(f"splits must be a non-empty dict keyed by {', '.join(KINDS)}; unknown: {unknown or 'none'}")
    out: dict[str, Any] = {name: None for name in METRICS}
    notes: list[str] = []
    results = {}
    rows: dict[str, list[float]] = {}
    kinds = [k for k in KINDS if k in splits]
    for kind in kinds:  # the empty-split error before any generation
        if not splits[kind]:
            raise ValueError(f"split {kind!r} has no rows to evaluate")
    pooled = generate_answers(model, tokenizer, [r.question for k in kinds for r in splits[k]],
                              max_new_tokens=max_new_tokens, batch_size=batch_size, max_total_tokens=max_total_tokens,
                              desc="evaluating: answers")  # one pool, batched in length order across the splits
    at = 0
    for kind in kinds:
        n = len(splits[kind])
        res = evaluate_split(model, tokenizer, splits[kind], kind=kind,  # type: ignore[arg-type]
                             max_new_tokens=max_new_tokens, batch_size=batch_size, max_length=max_length,
                             max_total_tokens=max_total_tokens, generations=pooled[at:at + n])
        at += n
        results[kind] = res
        if results_out is not None:
            results_out[kind] = res
        out.update({f"{kind}_{p}": res.summary[p] for p in ("prob", "rougeL_recall", "truth_ratio", "fact_recall")})
        rows.update(res.rows())
        notes += [f"{kind}: {n}" for n in res.summary["notes"]]
    out.update(_forget_extras(results.get("forget"), retain_model_forget_tr, tokenizer, notes, rows))
    missing = [k for k in UTILITY_KEYS if out.get(k) is None]
    if missing:
        notes.append(f"model_utility undefined: missing {', '.join(missing)}")
    else:
        out["model_utility"] = model_utility(out)
    out["rows"] = rows
    out["notes"] = notes
    return out


def _forget_extras(res: SplitResult | None, retain_tr: np.ndarray | None, tokenizer: Any,
                   notes: list[str], rows: dict[str, list[float]]) -> dict[str, Any]:
    """Forget quality, per-example forget TRs, forget generations and their fluency (appends to notes; the
    fluency's per-row values go into `rows`)."""
    if res is None:
        notes.append("no forget split: forget metrics and forget_quality undefined")
        return {"forget_truth_ratio_per_example": None, "forget_generations": None}
    fq = None
    if retain_tr is None or len(retain_tr) == 0:
        notes.append("forget_quality undefined: no retain-model forget truth ratios given")
    elif res.truth_ratio is None:
        notes.append("forget_quality undefined: forget truth ratios could not be computed")
    else:
        fq = forget_quality(res.truth_ratio, retain_tr)
        if len(retain_tr) == len(res.truth_ratio):
            rows.update(dict(zip(FQ_ROWS, ([float(v) for v in res.truth_ratio], [float(v) for v in retain_tr]))))
    per_row = fluency_rows(res.generations, tokenizer)
    rows.update({f"forget_{k}": v for k, v in per_row.items()})
    flu = fluency_summary(res.generations, tokenizer, per_row)
    return {
        "forget_quality": fq,
        "forget_token_entropy": flu["token_entropy"],
        "forget_repetition_rate": flu["repetition_rate"],
        "forget_degenerate_share": flu["degenerate_share"],
        "forget_truth_ratio_per_example": None if res.truth_ratio is None else res.truth_ratio.tolist(),
        "forget_generations": list(res.generations),
    }
