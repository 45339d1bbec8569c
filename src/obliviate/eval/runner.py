"""Evaluation as a run step: load the configured splits, get the retain model's forget truth
ratios (for forget quality), and evaluate a model on all of them."""
from __future__ import annotations

from typing import Any

import numpy as np

from obliviate.config import EvalConfig
from obliviate.data.rows import QARow, load_split
from obliviate.eval.tofu import _correct_answers, _perturbed_count, _split_losses, evaluate_tofu, truth_ratio
from obliviate.errors import DataError

SPLIT_FIELDS = {"forget": "forget_split", "retain": "retain_split",
                "real_authors": "real_authors_split", "world_facts": "world_facts_split"}


def load_eval_splits(source: str, cfg: EvalConfig) -> dict[str, list[QARow]]:
    """{kind: rows} for each configured (non-null) split, first `max_examples` rows when set."""
    out = {}
    for kind, attr in SPLIT_FIELDS.items():
        name = getattr(cfg, attr)
        if name:
            rows = load_split(cfg.source or source, name)
            out[kind] = rows[: cfg.max_examples] if cfg.max_examples else rows
    if not out:
        raise DataError("no evaluation split configured: set eval.forget_split / eval.retain_split / ...")
    return out


def forget_truth_ratios(model: Any, tokenizer: Any, rows: list[QARow], cfg: EvalConfig, max_length: int = 256) -> np.ndarray:
    """Per-example forget truth ratios [N] of `model` (no generation): what forget_quality compares against."""
    k, why = _perturbed_count(rows)
    if k is None:
        raise DataError(f"forget split cannot give truth ratios: {why}; use a *_perturbed split")
    correct, _ = _correct_answers(rows, "forget")
    _, para, pert = _split_losses(model, tokenizer, rows, correct, k, cfg.batch_size, max_length)
    return truth_ratio(para, pert)


def evaluate_model(model: Any, tokenizer: Any, splits: dict[str, list[QARow]], cfg: EvalConfig,
                   retain_tr: np.ndarray | None = None, max_length: int = 256) -> dict[str, Any]:
    """Every TOFU metric of `model` on `splits` (forget_quality only when `retain_tr` is given)."""
    return evaluate_tofu(model, tokenizer, splits, retain_model_forget_tr=retain_tr,
                         max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, max_length=max_length)
