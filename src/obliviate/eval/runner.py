"""Evaluation as a run step: load the configured splits, get the retain model's forget truth
ratios (for forget quality), and evaluate a model on all of them; plus the other benchmarks."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from obliviate.config import EvalConfig, McqEvalConfig, MuseEvalConfig, RwkuEvalConfig, need
from obliviate.data.rows import Fields, QARow, load_split
from obliviate.errors import DataError
from obliviate.eval.closer_look import PROTOCOL_MAX_LENGTH, PROTOCOL_ROWS, evaluate_closer_look, load_closer_look_models
from obliviate.eval.mcq import load_mcq, mcq_accuracy, metric_name, run_lm_eval
from obliviate.eval.memorization import forget_memorization, memorization_from_scores
from obliviate.eval.metrics import metric_infos
from obliviate.eval.mia import as_item, attack_scores, mia_from_scores, token_scores
from obliviate.eval.muse import evaluate_muse, load_muse, muse_min_k_auc
from obliviate.eval.retain_reference import retain_reference_privleak_auc, retain_reference_truth_ratios
from obliviate.eval.rwku import evaluate_rwku, load_rwku
from obliviate.eval.tofu import (
    SplitResult,
    correct_answers,
    evaluate_tofu,
    perturbed_count,
    reference_forget_rows,
    split_losses,
    truth_ratio,
)
from obliviate.modeling import chat
from obliviate.modeling.load import load_pretrained, to_eval_device

SPLIT_FIELDS = {"forget": "forget_split", "retain": "retain_split",
                "real_authors": "real_authors_split", "world_facts": "world_facts_split"}


def row_cap(cfg: EvalConfig) -> int | None:
    """Rows evaluated per split: max_examples; under protocol closer_look at most 300 (the authors' ds_size)."""
    if cfg.protocol != "closer_look":
        return cfg.max_examples

    return min(PROTOCOL_ROWS, cfg.max_examples or PROTOCOL_ROWS)


def length_limits(cfg: EvalConfig, max_length: int) -> tuple[int, int | None]:
    """(max_length of scored QA sequences, max_total_tokens of generation): under protocol closer_look both are
    200 tokens of prompt + answer (the authors' generation max_length); otherwise (max_length, None)."""
    if cfg.protocol != "closer_look":
        return max_length, None

    return min(max_length, PROTOCOL_MAX_LENGTH), PROTOCOL_MAX_LENGTH


def load_eval_splits(source: str, cfg: EvalConfig, fields: Fields | None = None) -> dict[str, list[QARow]]:
    """{kind: rows} for each configured (non-null) split, its first `row_cap(cfg)` rows when that is set; `fields`
    (data.fields) renames the columns of splits read from the run's own `source` (not of eval.source)."""
    out = {}
    cap = row_cap(cfg)
    for kind, attr in SPLIT_FIELDS.items():
        name = getattr(cfg, attr)
        if name:
            rows = load_split(cfg.source or source, name, None if cfg.source else fields)
            out[kind] = rows[:cap] if cap else rows
    if not out:
        raise DataError("no evaluation split configured: set eval.forget_split / eval.retain_split / ...")
    return out


def forget_truth_ratios(model: Any, tokenizer: Any, rows: list[QARow], cfg: EvalConfig, max_length: int = 256) -> np.ndarray:
    """Per-example forget truth ratios [N] of `model` (no generation): what forget_quality compares against."""
    k, why = perturbed_count(rows)
    if k is None:
        raise DataError(f"forget split cannot give truth ratios: {why}; use a *_perturbed split")
    correct, _ = correct_answers(rows, "forget")
    _, para, pert = split_losses(model, tokenizer, rows, correct, k, cfg.rows, length_limits(cfg, max_length)[0])
    return truth_ratio(para, pert)


def evaluate_model(model: Any, tokenizer: Any, splits: dict[str, list[QARow]], cfg: EvalConfig,
                   retain_tr: np.ndarray | None = None, max_length: int = 256, *, source: str | None = None,
                   retain_model: Any = None, fields: Fields | None = None,
                   retain_scores: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every TOFU metric of `model` on `splits`; with `source`, also the extras `cfg` asks for:
    extraction strength / exact memorisation, PrivLeak + MIA AUCs against `cfg.holdout_split`
    (the retain model, when given, is PrivLeak's retrained reference and the MIA reference model),
    and closer-look FE/MU (cfg.closer_look or protocol closer_look). forget_quality only when `retain_tr` is given.
    Under protocol closer_look, generation and scored sequences hold <= 200 tokens of prompt + answer.
    `retain_scores`: the retain model's scores already made (`reference_scores`), read instead of running it, and
    where those it runs now are kept."""
    results: dict[str, SplitResult] = {}
    loss_length, total = length_limits(cfg, max_length)
    out = evaluate_tofu(model, tokenizer, splits, retain_model_forget_tr=retain_tr, max_new_tokens=cfg.max_new_tokens,
                        batch_size=cfg.rows, max_length=loss_length, max_total_tokens=total, results_out=results)
    out["protocol"] = cfg.protocol
    if cfg.protocol == "closer_look":
        out["notes"].append(f"protocol closer_look: first {row_cap(cfg)} rows per split, prompt + answer <= {total} "
                            "tokens in generation and scoring")
    forget = splits.get("forget")
    if forget and cfg.memorization:
        out.update(_memorization(model, tokenizer, forget, source, cfg, retain_model, max_length, out["notes"], fields,
                                 retain_scores))
    if cfg.closer_look or cfg.protocol == "closer_look":
        out.update(_closer_look(model, tokenizer, splits, results, cfg, loss_length, out["notes"], out["rows"]))
    return out


def quick_tofu(model: Any, tokenizer: Any, splits: dict[str, list[QARow]], rows: int, cfg: EvalConfig,
               max_length: int = 256) -> dict[str, Any]:
    """The cheap evaluation during training: TOFU's metrics of the first `rows` forget and retain rows (greedy
    ROUGE-L, truth ratio, Prob, fact recall, fluency), no memorisation or MIA passes."""

    part = {k: splits[k][:rows] for k in ("forget", "retain") if splits.get(k)}
    return evaluate_tofu(model, tokenizer, part, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.rows,
                         max_length=max_length)


def tofu_metric_names() -> set[str]:
    """Every metric a TOFU evaluation can report (the names objectives and keep-best scores may read)."""

    return set(metric_infos("tofu", "memorization", "mia", "closer_look")) | {
        "forget_degenerate_share", "forget_token_entropy", "forget_repetition_rate", "train_seconds"}


def scores_key(items: list[Any], kw: dict[str, Any]) -> str:
    """What the retain model's scores on `items` are kept under: a digest of the rows and the scoring settings."""
    rows = [list(as_item(x)) if not isinstance(x, str) else x for x in items]
    return hashlib.sha256(json.dumps([rows, sorted(kw.items())], default=str).encode()).hexdigest()


def reference_scores(retain_model: Any, tokenizer: Any, items: list[Any], n_forget: int,
                     kw: dict[str, Any]) -> dict[str, Any]:
    """The retain model's part of PrivLeak and the reference attack on forget + holdout `items` (the first
    `n_forget` forget rows): its Min-K% AUC (PrivLeak's AUC_retrain) and its mean answer loss per row [N]."""
    ref = token_scores(retain_model, tokenizer, items, moments=False, **kw)
    return {"auc_retrain": memorization_from_scores(ref, n_forget, token_rule=kw["token_rule"])["privleak_auc"],
            "avg_loss": [float(x) for x in ref.avg_loss]}


def _memorization(model: Any, tokenizer: Any, forget: list[QARow], source: str | None, cfg: EvalConfig,
                  retain_model: Any, max_length: int, notes: list[str], fields: Fields | None = None,
                  retain_scores: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """ES/EM of the forget answers; with a holdout split also PrivLeak and the MIA AUCs. One scoring
    pass per model over forget + holdout serves every one of these metrics (the retain model's: read from
    `retain_scores` when they hold it, else made and kept there)."""

    kw = {"batch_size": cfg.rows, "max_length": max_length, "token_rule": cfg.token_rule}
    if not (cfg.holdout_split and source):
        notes.append("privleak and MIA AUCs not computed: no eval.holdout_split")
        return {**forget_memorization(token_scores(model, tokenizer, forget, moments=False, **kw).correct,
                                      token_rule=cfg.token_rule), "token_rule": cfg.token_rule}
    holdout = load_split(cfg.source or source, cfg.holdout_split, None if cfg.source else fields)
    cap = row_cap(cfg)
    holdout = holdout[:cap] if cap else holdout
    items, n = forget + holdout, len(forget)
    ts = token_scores(model, tokenizer, items, **kw)
    key = scores_key(items, kw)
    ref = (retain_scores or {}).get(key)
    if ref is None and retain_model is not None:
        ref = reference_scores(retain_model, tokenizer, items, n, kw)
        if retain_scores is not None:
            retain_scores[key] = ref
    elif ref is None and retain_scores is not None:  # a record stands in for the retain model, but not for these rows
        raise DataError("the retain model is not here and its recorded scores do not cover these forget + holdout rows "
                        "(or these scoring settings): run a worker that has the retain model")
    auc_retrain = None if ref is None else ref["auc_retrain"]
    if ref is None and cfg.retain_reference:  # the retain model's log holds its Min-K% AUC, as for forget quality
        auc_retrain = retain_reference_privleak_auc(cfg.retain_reference)
        if auc_retrain is not None:
            notes.append(f"privleak's AUC_retrain = 1 - mia_min_k of {cfg.retain_reference} = {auc_retrain:.6g}")
    mem = memorization_from_scores(ts, n, auc_retrain=auc_retrain, token_rule=cfg.token_rule)
    mia = mia_from_scores(attack_scores(ts, reference_loss=None if ref is None else np.asarray(ref["avg_loss"])), n)
    notes.extend(mem.pop("notes") + mia.pop("notes"))
    return {**mem, **mia}


def _closer_look(model: Any, tokenizer: Any, splits: dict[str, list[QARow]], results: dict[str, SplitResult],
                 cfg: EvalConfig, max_length: int, notes: list[str], rows: dict[str, list[float]]) -> dict[str, Any]:
    """Closer-look FE / MU from the TOFU results already made; notes and per-row values go into `notes`, `rows`."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    models = load_closer_look_models(cfg.embedding_model, cfg.nli_model, local_files_only=offline)
    cl = evaluate_closer_look(model, tokenizer, splits, models=models, tofu_results=results,
                              max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, max_length=max_length,
                              max_total_tokens=length_limits(cfg, max_length)[1])
    notes.extend(cl.pop("notes", []))
    rows.update(cl.pop("rows", {}))
    return {k: v for k, v in cl.items() if k not in ("forget_prob", "forget_rougeL_recall")}


def evaluate_muse_run(model: Any, tokenizer: Any, cfg: MuseEvalConfig) -> dict[str, Any]:
    """MUSE VerbMem / KnowMem / PrivLeak; PrivLeak's reference AUC from cfg.retrain_model when given.
    PrivLeak scores whole documents (windowed past muse.privleak_window), as MUSE's code does."""
    from functools import partial

    if not cfg.source:
        raise DataError("muse.source is not set; give a MUSE directory or hub id (muse.source=muse-bench/MUSE-News)")
    data = load_muse(cfg.source)
    data = data.head(cfg.max_examples) if cfg.max_examples else data
    notes: list[str] = []
    auc_fn = partial(muse_min_k_auc, window=cfg.privleak_window, stride=cfg.privleak_stride,
                     max_tokens=cfg.privleak_max_tokens, batch_size=cfg.batch_size)
    retrain_auc = None
    if cfg.retrain_model and data.privleak_forget and data.privleak_holdout:
        rmodel, rtok = load_pretrained(cfg.retrain_model)
        to_eval_device(rmodel)
        retrain_auc = auc_fn(rmodel, rtok, list(data.privleak_forget), list(data.privleak_holdout))
    res = evaluate_muse(model, tokenizer, data, mia_auc_fn=partial(auc_fn, notes=notes), retrain_auc=retrain_auc,
                        verbmem_max_new_tokens=cfg.verbmem_max_new_tokens,
                        knowmem_max_new_tokens=cfg.knowmem_max_new_tokens, batch_size=cfg.batch_size)
    res["notes"] += notes
    res.pop("per_example", None)
    return res


def evaluate_mcq_run(model: Any, tokenizer: Any, cfg: McqEvalConfig) -> dict[str, Any]:
    """Native 4-way accuracy on the configured data, plus lm-eval tasks when asked for."""
    from pathlib import Path

    out: dict[str, Any] = {"notes": []}
    if cfg.source:
        items = load_mcq(cfg.source, cfg.config, cfg.split)
        items = items[: cfg.max_examples] if cfg.max_examples else items
        res = mcq_accuracy(model, tokenizer, items, target=cfg.target, batch_size=cfg.batch_size, max_length=cfg.max_length)
        name = cfg.name or cfg.config or Path(cfg.source).stem
        out.update({metric_name(name): res["accuracy"], "mcq_n": res["n"], "mcq_chance": res["chance"],
                    "mcq_truncated": res["n_truncated"]})
    if cfg.lm_eval_tasks:
        got = run_lm_eval(model, tokenizer, list(cfg.lm_eval_tasks), limit=cfg.lm_eval_limit,
                          num_fewshot=cfg.lm_eval_num_fewshot, batch_size=cfg.lm_eval_batch_size,
                          include_path=cfg.lm_eval_include_path)
        for task in cfg.lm_eval_tasks:  # accuracy, the few-shot count lm-eval used and the examples it scored
            out[f"lm_eval_{task}_accuracy"] = got.get(task)
            out[f"lm_eval_{task}_n_shot"] = got.get(f"{task}_n_shot")
            out[f"lm_eval_{task}_n"] = got.get(f"{task}_n")
    if len(out) == 1:
        raise DataError("nothing to evaluate: set mcq.source (a file or hub id) or mcq.lm_eval_tasks")
    return out


def evaluate_rwku_run(model: Any, tokenizer: Any, cfg: RwkuEvalConfig) -> dict[str, Any]:
    """RWKU forget / neighbour probes scored by ROUGE-L recall."""

    probes = load_rwku(cfg.source, list(cfg.levels), subject=cfg.subject)
    if cfg.max_examples:
        probes = {k: v[: cfg.max_examples] for k, v in probes.items()}
    res = evaluate_rwku(model, tokenizer, probes, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
    res.pop("rougeL_recall_per_example", None)
    return res


def evaluate_tofu_run(model: Any, tok: Any, source: str, cfg: Any, max_length: int,
                      splits: dict[str, list] | None = None, fields: dict | None = None) -> dict[str, Any]:
    """TOFU evaluation on the configured splits (loaded here unless the pre-flight already did); eval.retain_model
    gives forget quality, PrivLeak's retrained reference and the MIA reference model; eval.retain_reference (a retain
    model's evaluation log) gives forget quality alone."""

    splits = load_eval_splits(source, cfg, fields) if splits is None else splits
    retain_tr = retain_model = None
    if cfg.retain_model:
        reference_forget_rows(splits, "eval.retain_model")
        retain_model, rtok = load_pretrained(cfg.retain_model)
        to_eval_device(retain_model)
        chat.set_format(rtok, **chat.get_format(tok))  # the reference answers the same prompts as the model
        retain_tr = forget_truth_ratios(retain_model, rtok, splits["forget"], cfg, max_length)
        if rtok.get_vocab() != tok.get_vocab():  # token-level comparisons need one tokenizer
            retain_model = None
    elif cfg.retain_reference:
        retain_tr = retain_reference_truth_ratios(cfg, splits)
    metrics = evaluate_model(model, tok, splits, cfg, retain_tr, max_length, source=source, retain_model=retain_model,
                             fields=fields)
    if cfg.retain_model and retain_model is None:
        metrics["notes"].append("retain model has another tokenizer: not used as PrivLeak / MIA reference")
    if cfg.retain_reference:
        metrics["notes"].append(f"forget_quality against the retain model's forget truth ratios in {cfg.retain_reference}")
    fr = splits.get("forget", [])
    return {"eval": metrics, "questions": [r.question for r in fr], "answers": [r.answer for r in fr]}


def reference_line(ev: Any, splits: dict[str, list]) -> str:
    """eval.retain_reference: the forget split gives truth ratios and the log holds one per row (a line for
    `validate`)."""

    n = len(retain_reference_truth_ratios(ev, splits))
    return f"eval retain reference: {ev.retain_reference} ({n} forget truth ratios)"


# ---- the benchmarks' steps, as eval/benchmarks.py names them: preflight(cfg), run(model, tokenizer, cfg, state)

def preflight_tofu(cfg: Any) -> tuple[dict[str, list], list[str]]:
    """TOFU before the model loads: the splits (kept for the run) and their sizes; the retain log checked."""

    source = need(cfg.eval.source or "", "eval.source", "<data dir or hub id>")
    splits = load_eval_splits(source, cfg.eval)
    lines = ["eval splits: " + ", ".join(f"{k} {len(v)}" for k, v in splits.items())]
    if cfg.eval.retain_reference:
        lines.append(reference_line(cfg.eval, splits))
    return splits, lines


def run_tofu(model: Any, tokenizer: Any, cfg: Any, splits: Any) -> dict[str, Any]:
    """TOFU on the pre-flight's splits (eval.*): the metrics dict `obliviate eval` writes."""
    return evaluate_tofu_run(model, tokenizer, cfg.eval.source or "", cfg.eval, cfg.max_length, splits)


def run_muse(model: Any, tokenizer: Any, cfg: Any, state: Any = None) -> dict[str, Any]:
    """MUSE (muse.*): the metrics dict `obliviate eval` writes."""
    return {"eval": evaluate_muse_run(model, tokenizer, cfg.muse)}


def run_mcq(model: Any, tokenizer: Any, cfg: Any, state: Any = None) -> dict[str, Any]:
    """Multiple choice (mcq.*): the metrics dict `obliviate eval` writes."""
    return {"eval": evaluate_mcq_run(model, tokenizer, cfg.mcq)}


def run_rwku(model: Any, tokenizer: Any, cfg: Any, state: Any = None) -> dict[str, Any]:
    """RWKU (rwku.*): the metrics dict `obliviate eval` writes."""
    return {"eval": evaluate_rwku_run(model, tokenizer, cfg.rwku)}
