"""MUSE (Shi et al. 2024): VerbMem, KnowMem and PrivLeak, and a loader for the MUSE data layout.

Layout: a local directory mirroring the hub configs of muse-bench/MUSE-News and MUSE-Books, one
`.jsonl` or `.json` (a list) file per split, or that hub id itself (datasets.load_dataset):
  verbmem/forget                      {"prompt", "gt"}        VerbMem passages (prompt, true continuation)
  knowmem/forget_qa, forget_qa_icl    {"question", "answer"}  KnowMem questions and few-shot examples
  knowmem/retain_qa, retain_qa_icl    (older hub revisions: retain2_qa, retain2_qa_icl)
  privleak/forget, holdout, retain    {"text"}                PrivLeak MIA sets (retain: or retain2)
  raw/forget, retain1, retain2, holdout  {"text"}             training corpora: data.text.load_texts
Missing parts are allowed (their metrics are left out with a note); a source with none is an error.

Scoring follows MUSE's released code: ROUGE-L F1 of rouge_score with use_stemmer=False (docs/METRICS.md §1.1's
general ROUGE stems: pass use_stemmer=True for that), in [0, 1] (MUSE's tables print x100).
VerbMem: greedy continuation (<= 128 new tokens) of the prompt vs the first 128 ids of gt as the tokenizer encodes
it WITH its special tokens, decoded without them (MUSE's `tokenizer(gt).input_ids[:, :128]`): a tokenizer that
adds a BOS (Llama) keeps 127 text tokens, one that adds none (GPT-2, Qwen) keeps 128.
KnowMem: "Question: {q}\\nAnswer: {a}\\n\\n" per ICL example, then "Question: {q}\\nAnswer: ";
the greedy answer (<= 32 new tokens, decoded and stripped) is cut at the first "\\n\\n", "\\nQuestion"
or "Question:" (MUSE cuts before stripping: an answer opening with a blank line scores 0 there).
Prompts are BOS + text (like MUSE's Llama tokenizer); generation is batched, left padded, cut at EOS.
PrivLeak: Min-K% (k = 0.4) over every token after BOS of each whole document, as MUSE's privleak code
(`tokenizer.encode(text)`, one forward, no truncation); a document longer than the model's context
(or `window`) is scored in overlapping windows (mia.document_windows; stride window // 2 by default), each
token once, and the result's notes say how many documents that took. Empty privleak documents are
skipped with a note.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from obliviate.data.rows import QARow, read_records, row_from_record
from obliviate.data.text import document_ids, is_blank_document, is_hub_id, text_from_record
from obliviate.errors import DataError
from obliviate.eval.generate import greedy_ids
from obliviate.eval.memorization import privleak, privleak_auc  # one definition, shared with TOFU
from obliviate.eval.metrics import MetricInfo, register
from obliviate.eval.mia import DEFAULT_K, document_logp, min_k_score
from obliviate.hub import require_hub

MUSE_METRICS: dict[str, MetricInfo] = register("muse", {m.name: m for m in (
    MetricInfo("verbmem_forget", False, 1, "mean ROUGE-L F1, greedy continuation of forget passages vs the true one"),
    MetricInfo("knowmem_forget", False, 1, "mean ROUGE-L F1, few-shot greedy answers to forget-set QA"),
    MetricInfo("knowmem_retain", True, 1, "mean ROUGE-L F1, few-shot greedy answers to retain-set QA"),
    MetricInfo("privleak", False, 1, "SIGNED (AUC - AUC_retrain) / AUC_retrain x 100, Min-K% forget vs holdout;"
               " ideal 0, < 0 still leaks (target ~ -100), > 0 over-unlearned; flag moot: rank by privleak_abs"),
    MetricInfo("privleak_abs", False, 1, "|privleak|: distance from the retrained model's leakage"),
)})
# Metrics whose best value is 0 rather than an extreme; higher_is_better cannot say that.
CLOSER_TO_ZERO: frozenset[str] = frozenset({"privleak"})
# MUSE's released AUC_RETRAIN["forget_holdout_Min-40%"] of its retrained Llama-2-7B models: valid only
# for MUSE's own target models and data, never for another base model.
MUSE_RETRAIN_AUC: dict[str, float] = {"news": 0.4772, "books": 0.5393}
STOP_STRINGS: tuple[str, ...] = ("\n\n", "\nQuestion", "Question:")
# field -> (hub config / sub-folder, split names tried in order)
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "verbmem_forget": ("verbmem", ("forget",)),
    "knowmem_forget": ("knowmem", ("forget_qa",)),
    "knowmem_forget_icl": ("knowmem", ("forget_qa_icl",)),
    "knowmem_retain": ("knowmem", ("retain_qa", "retain2_qa")),
    "knowmem_retain_icl": ("knowmem", ("retain_qa_icl", "retain2_qa_icl")),
    "privleak_forget": ("privleak", ("forget",)),
    "privleak_holdout": ("privleak", ("holdout",)),
    "privleak_retain": ("privleak", ("retain", "retain2")),
}
MiaAucFn = Callable[[Any, Any, Sequence[str], Sequence[str]], float]


@dataclass(frozen=True)
class VerbMemItem:
    """One VerbMem passage: the prompt (its first part) and gt (its true continuation)."""

    prompt: str
    gt: str


@dataclass(frozen=True)
class MuseData:
    """The MUSE evaluation sets; an empty part means "not available" (its metric is skipped)."""

    verbmem_forget: tuple[VerbMemItem, ...] = ()
    knowmem_forget: tuple[QARow, ...] = ()
    knowmem_forget_icl: tuple[QARow, ...] = ()
    knowmem_retain: tuple[QARow, ...] = ()
    knowmem_retain_icl: tuple[QARow, ...] = ()
    privleak_forget: tuple[str, ...] = ()
    privleak_holdout: tuple[str, ...] = ()
    privleak_retain: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # locations of empty documents left out while loading

    def missing(self) -> list[str]:
        """Names of the empty parts."""
        return [name for name in PARTS if not getattr(self, name)]

    def head(self, n: int) -> "MuseData":
        """The first n items of every evaluated part (few-shot examples kept whole), for quick looks."""
        cut = [name for name in PARTS if not name.endswith("_icl")]
        return replace(self, **{name: getattr(self, name)[:n] for name in cut})


@lru_cache(maxsize=2)
def _scorer(use_stemmer: bool) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=use_stemmer)


def rouge_l_f1(generations: Sequence[str], targets: Sequence[str], *, use_stemmer: bool = False) -> np.ndarray:
    """MUSE ROUGE-L F1 of each generation against its target (Shi et al. 2024). -> [N] float64."""
    if len(generations) != len(targets):
        raise ValueError(f"rouge_l_f1: {len(generations)} generations but {len(targets)} targets")
    scorer = _scorer(use_stemmer)
    return np.array([scorer.score(t, g)["rougeL"].fmeasure for g, t in zip(generations, targets)], dtype=np.float64)


def fewshot_prompt(question: str, shots: Sequence[tuple[str, str]]) -> str:
    """MUSE KnowMem prompt: "Question: q\\nAnswer: a\\n\\n" per (q, a) shot, then the question."""
    return "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in shots) + f"Question: {question}\nAnswer: "


def cut_answer(text: str) -> str:
    """A KnowMem answer up to the first of STOP_STRINGS (MUSE's post-processing)."""
    for stop in STOP_STRINGS:
        text = text.split(stop)[0]
    return text


def fit_prompt(ids: list[int], keep: int, n_prefix: int) -> list[int]:
    """Prompt ids cut from the left to at most `keep` ids, keeping the first `n_prefix` (BOS)."""
    if len(ids) <= keep:
        return ids
    return ids[:n_prefix] + ids[len(ids) - (keep - n_prefix):]


def truncate_tokens(tokenizer: Any, text: str, n_tokens: int) -> str:
    """`text` cut to the first `n_tokens` ids of its encoding WITH the special tokens the tokenizer adds, decoded
    without them (MUSE's VerbMem gold): a BOS counts among the n_tokens; a text that fits is returned whole."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return text if len(ids) <= n_tokens else tokenizer.decode(ids[:n_tokens], skip_special_tokens=True)


@torch.no_grad()
def greedy_continuations(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int,
                         batch_size: int = 8, max_length: int | None = None) -> tuple[list[str], int]:
    """Greedy continuations of raw prompts (BOS + text), in input order, and how many prompts were cut
    from the left to fit `max_length` (default: the model's max_position_embeddings) - max_new_tokens."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    limit = max_length or getattr(getattr(model, "config", None), "max_position_embeddings", None)
    n_prefix = int(getattr(tokenizer, "bos_token_id", None) is not None)
    keep = (limit - max_new_tokens) if limit else None
    if keep is not None and keep < n_prefix + 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in a {limit}-token context")
    ids = [document_ids(tokenizer, p) for p in prompts]
    n_cut = sum(keep is not None and len(x) > keep for x in ids)
    ids = [fit_prompt(x, keep, n_prefix) if keep is not None else x for x in ids]
    return greedy_ids(model, tokenizer, ids, max_new_tokens=max_new_tokens, batch_size=batch_size), n_cut


def verbmem_scores(model: Any, tokenizer: Any, items: Sequence[VerbMemItem], *, max_new_tokens: int = 128,
                   batch_size: int = 8, max_length: int | None = None,
                   use_stemmer: bool = False) -> tuple[np.ndarray, list[str], int]:
    """MUSE VerbMem per passage: ROUGE-L F1 [N], continuations, number of prompts cut to fit."""
    gens, n_cut = greedy_continuations(model, tokenizer, [it.prompt for it in items], max_new_tokens=max_new_tokens,
                                       batch_size=batch_size, max_length=max_length)
    refs = [truncate_tokens(tokenizer, it.gt, max_new_tokens) for it in items]
    return rouge_l_f1(gens, refs, use_stemmer=use_stemmer), gens, n_cut


def knowmem_scores(model: Any, tokenizer: Any, rows: Sequence[QARow], icl: Sequence[QARow], *,
                   max_new_tokens: int = 32, batch_size: int = 8, max_length: int | None = None,
                   use_stemmer: bool = False) -> tuple[np.ndarray, list[str], int]:
    """MUSE KnowMem per question: ROUGE-L F1 [N] of few-shot answers, answers, prompts cut to fit."""
    shots = [(r.question, r.answer) for r in icl]
    gens, n_cut = greedy_continuations(model, tokenizer, [fewshot_prompt(r.question, shots) for r in rows],
                                       max_new_tokens=max_new_tokens, batch_size=batch_size, max_length=max_length)
    answers = [cut_answer(g) for g in gens]
    return rouge_l_f1(answers, [r.answer for r in rows], use_stemmer=use_stemmer), answers, n_cut


def muse_min_k_auc(model: Any, tokenizer: Any, forget: Sequence[str], holdout: Sequence[str], *, k: float = DEFAULT_K,
                   window: int | None = None, stride: int | None = None, max_tokens: int | None = None,
                   batch_size: int = 8, notes: list[str] | None = None) -> float:
    """MUSE PrivLeak AUC (MUSE orientation) of Min-K% over whole documents, windowed past `window` tokens.

    window None: the model's max_position_embeddings (None there: one pass however long). `notes` gets one line
    saying what was scored (window, stride, documents that needed several windows).
    """
    limit = window or getattr(getattr(model, "config", None), "max_position_embeddings", None)
    step = stride if stride is not None else (limit // 2 if limit else None)
    logps, n_windowed = document_logp(model, tokenizer, list(forget) + list(holdout), window=limit, stride=step,
                                      max_tokens=max_tokens, batch_size=batch_size)
    scores = np.array([min_k_score(lp, k) for lp in logps])
    if notes is not None:
        what = f"the first {max_tokens} tokens" if max_tokens else "whole documents"
        notes.append(f"privleak: Min-{round(k * 100)}% over {what}; {n_windowed} of {len(logps)} documents longer "
                     f"than the {limit}-token window, scored in windows of {limit} with stride {step}"
                     if n_windowed else f"privleak: Min-{round(k * 100)}% over {what}, each in one pass")
    return privleak_auc(scores[:len(forget)], scores[len(forget):])


def evaluate_muse(model: Any, tokenizer: Any, data: MuseData, *, mia_auc_fn: MiaAucFn | None = None,
                  retrain_auc: float | None = None, verbmem_max_new_tokens: int = 128,
                  knowmem_max_new_tokens: int = 32, batch_size: int = 8, max_length: int | None = None,
                  use_stemmer: bool = False) -> dict[str, Any]:
    """MUSE metrics (Shi et al. 2024) of MUSE_METRICS that `data` allows, plus notes and per-example results.

    mia_auc_fn(model, tokenizer, forget_texts, holdout_texts) -> AUC in MUSE's orientation (see
    muse_min_k_auc; MUSE uses Min-K%, k = 0.4); privleak is left out (with a note) without it.
    """
    out: dict[str, Any] = {}
    notes: list[str] = []
    if data.skipped:
        notes.append(f"{len(data.skipped)} empty document(s) skipped while loading: {', '.join(data.skipped[:5])}")
    per_example: dict[str, Any] = {}
    kw = dict(batch_size=batch_size, max_length=max_length, use_stemmer=use_stemmer)

    def record(name: str, scores: np.ndarray, gens: list[str], n_cut: int) -> None:
        out[name] = float(scores.mean())
        per_example[name] = {"rougeL_f1": scores.tolist(), "generations": gens}
        if n_cut:
            notes.append(f"{name}: {n_cut} of {len(gens)} prompts were cut from the left to fit the context")

    if data.verbmem_forget:
        record("verbmem_forget", *verbmem_scores(model, tokenizer, data.verbmem_forget,
                                                 max_new_tokens=verbmem_max_new_tokens, **kw))
    else:
        notes.append("verbmem_forget not computed: no verbmem/forget data")
    for side in ("forget", "retain"):
        rows, icl = getattr(data, f"knowmem_{side}"), getattr(data, f"knowmem_{side}_icl")
        if not rows:
            notes.append(f"knowmem_{side} not computed: no knowmem/{side}_qa data")
            continue
        if not icl:
            notes.append(f"knowmem_{side}: no {side}_qa_icl examples, so zero-shot prompts (MUSE uses few-shot)")
        record(f"knowmem_{side}", *knowmem_scores(model, tokenizer, rows, icl,
                                                  max_new_tokens=knowmem_max_new_tokens, **kw))
    _privleak(out, notes, model, tokenizer, data, mia_auc_fn, retrain_auc)
    out["notes"] = notes
    out["per_example"] = per_example
    return out


def _privleak(out: dict[str, Any], notes: list[str], model: Any, tokenizer: Any, data: MuseData,
              mia_auc_fn: MiaAucFn | None, retrain_auc: float | None) -> None:
    """Add privleak, privleak_abs, privleak_auc and privleak_auc_retrain to `out`, or a note why not."""
    if mia_auc_fn is None:
        notes.append("privleak not computed: no membership-inference AUC function given")
        return
    if not (data.privleak_forget and data.privleak_holdout):
        notes.append("privleak not computed: needs privleak/forget and privleak/holdout texts")
        return
    auc = float(mia_auc_fn(model, tokenizer, list(data.privleak_forget), list(data.privleak_holdout)))
    value, note = privleak(auc, retrain_auc)
    if note:
        notes.append(note)
    out.update(privleak=value, privleak_abs=None if value is None else abs(value), privleak_auc=auc,
               privleak_auc_retrain=0.5 if retrain_auc is None else float(retrain_auc))


def _parse(name: str, where: str, rec: Any) -> Any:
    """One record of part `name` as a VerbMemItem, a QARow or a text (errors name `where`)."""
    config = PARTS[name][0]
    if config == "knowmem":
        return row_from_record(rec, where)
    if config == "privleak":
        return text_from_record(rec, where)
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object with 'prompt' and 'gt', got {type(rec).__name__}")
    for key in ("prompt", "gt"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise DataError(f"{where}: field {key!r} must be a non-empty string (verbmem rows need 'prompt' and 'gt')")
    return VerbMemItem(rec["prompt"], rec["gt"])


def _local_records(root: Path, name: str) -> list[tuple[str, Any]] | None:
    config, splits = PARTS[name]
    for split in splits:
        for ext in (".jsonl", ".json"):
            path = root / config / f"{split}{ext}"
            if path.is_file():
                recs = read_records(path)
                if not recs:
                    raise DataError(f"{path}: the split is empty")
                return recs
    return None


def _hub_records(repo_id: str) -> dict[str, list[tuple[str, Any]] | None]:
    require_hub(f"MUSE source {repo_id!r}")  # seconds, not minutes of retries, when offline
    import datasets  # heavy import, only on this path

    out: dict[str, list[tuple[str, Any]] | None] = {}
    for config in dict.fromkeys(c for c, _ in PARTS.values()):
        try:
            dd = datasets.load_dataset(repo_id, config)
        except Exception as exc:  # network, unknown config, ... all become one clear message
            raise DataError(f"could not load {repo_id!r} config {config!r} from the hub: {exc}. "
                            "Offline? Point the source at a local directory in the MUSE layout instead.") from None
        for name, (c, splits) in PARTS.items():
            if c == config:
                split = next((s for s in splits if s in dd), None)
                out[name] = None if split is None else [
                    (f"{repo_id}/{config}/{split} row {i}", dict(r)) for i, r in enumerate(dd[split])]
    return out


def load_muse(source: str | Path) -> MuseData:
    """MuseData from a local directory in the MUSE layout (module docstring) or a hub id (muse-bench/MUSE-News)."""
    path = Path(source)
    if path.is_dir():
        records = {name: _local_records(path, name) for name in PARTS}
    elif is_hub_id(str(source)):
        records = _hub_records(str(source))
    else:
        raise DataError(f"MUSE source {str(source)!r} is neither a directory nor a hub dataset id (owner/name)")
    if not any(records.values()):
        raise DataError(f"{source}: no MUSE data found; expected files such as verbmem/forget.json, "
                        "knowmem/forget_qa.json, privleak/forget.json (.json or .jsonl)")
    blank = [w for name, recs in records.items() if recs and PARTS[name][0] == "privleak"
             for w, r in recs if is_blank_document(r)]
    skip = set(blank)
    parts = {name: tuple(_parse(name, w, r) for w, r in recs if w not in skip)
             for name, recs in records.items() if recs}
    return MuseData(**parts, skipped=tuple(blank))
