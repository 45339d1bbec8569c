"""A published retain reference for forget quality: the per-row forget truth ratios of a retain model, read from
the evaluation log the reference framework (open-unlearning) writes, instead of running the retain model here.

The layout, as open-unlearning writes and reads it (locuslab/open-unlearning): its evaluator saves one JSON object
per evaluated model, `TOFU_EVAL.json` (src/evals/base.py `save_logs`), with one entry per metric; the entry
`forget_truth_ratio` (configs/eval/tofu_metrics/forget_Truth_Ratio.yaml, handler `truth_ratio` in
src/evals/metrics/memorization.py) is

    {"agg_value": <float>, "value_by_index": {"0": {"score": <float>}, "1": {"score": <float>}, ...}}

one item per row of the forget split, keyed by the row's index. Its forget quality (handler `ks_test` in
src/evals/metrics/privacy.py, configs/eval/tofu_metrics/forget_quality.yaml) loads the retain model's log named by
`retain_logs_path`, takes the `score` of every `value_by_index` item of that entry and returns the p-value of
scipy.stats.ks_2samp(the model's scores, those). Only `value_by_index` is read here (`agg_value` is a mean).

Direction: each score is P(perturbed) / (P(paraphrased) + 1e-10), both probabilities exp(-mean token loss) and the
perturbed one the geometric mean over the perturbed answers (exp of minus the mean of their losses): the "false /
true" ratio eval/tofu.py `truth_ratio` computes, so the scores are used as they are, not inverted. The 1e-10 in the
denominator moves a score by a relative 1e-10 / P(paraphrased), far below any gap that could reorder the samples.
(open-unlearning's `prob_mean` aggregator stores another quantity, P(true) / (P(true) + P(false)); its default
forget_truth_ratio, and the one forget quality reads, is the ratio above.)
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from obliviate.errors import DataError
from obliviate.eval.tofu import reference_forget_rows

KEY = "forget_truth_ratio"
LAYOUT = '{"forget_truth_ratio": {"agg_value": ..., "value_by_index": {"0": {"score": <truth ratio>}, ...}}, ...}'


def _kind(x: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if x is None else names.get(type(x), type(x).__name__)


@lru_cache(maxsize=4)
def _parsed(path: str, mtime_ns: int, size: int) -> Any:
    """The JSON at `path`, parsed once per version of the file (the pre-flight and the evaluation both read the
    log, a few MB with every generation in it); callers only read it."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_retain_reference(path: str | Path, n_forget: int) -> np.ndarray:
    """The forget truth ratios [n_forget] held by open-unlearning's evaluation log `path` of a retain model, in row
    order; DataError naming the file, what was expected and what was found when it is not that log."""
    p = Path(path)
    where = f"eval.retain_reference {str(path)!r}"
    expect = f"expected open-unlearning's evaluation log of a retain model (TOFU_EVAL.json): {LAYOUT}"
    if not p.is_file():
        raise DataError(f"{where}: {'is a directory' if p.is_dir() else 'no such file'}; {expect}")
    try:
        stat = p.stat()
        data = _parsed(str(p.resolve()), stat.st_mtime_ns, stat.st_size)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{where}: not JSON ({exc}); {expect}") from None
    if not isinstance(data, dict):
        raise DataError(f"{where}: the top level is {_kind(data)}, not an object of metric entries; {expect}")
    if KEY not in data:
        found = ", ".join(sorted(map(str, data))[:12]) or "none"
        raise DataError(f"{where}: no {KEY!r} entry (entries found: {found}); {expect}. open-unlearning writes it "
                        "when its TOFU evaluation includes forget_Truth_Ratio (or forget_quality)")
    entry = data[KEY]
    by_index = entry.get("value_by_index") if isinstance(entry, dict) else None
    if not isinstance(by_index, dict):
        found = f"{KEY} is {_kind(entry)}" if not isinstance(entry, dict) else \
            f"{KEY}.value_by_index is {_kind(by_index) if 'value_by_index' in entry else 'missing'}"
        raise DataError(f"{where}: {found}; expected {KEY}.value_by_index, an object of per-row scores "
                        '{"0": {"score": <truth ratio>}, ...}')
    rows: list[tuple[int, float]] = []
    for index, item in by_index.items():
        score = item.get("score") if isinstance(item, dict) else None
        if not (index.isascii() and index.isdigit()):
            raise DataError(f"{where}: {KEY}.value_by_index has the key {index!r}; expected row indices "
                            '("0", "1", ...) of the forget split')
        if not isinstance(item, dict) or isinstance(score, bool) or not isinstance(score, (int, float)) or \
                not math.isfinite(score) or score <= 0:
            shown = f"score {score!r}" if isinstance(item, dict) else _kind(item)
            raise DataError(f"{where}: {KEY}.value_by_index[{index!r}] holds {shown}; expected "
                            '{"score": <truth ratio>}, a finite number > 0')
        rows.append((int(index), float(score)))
    if len(rows) != n_forget:
        raise DataError(f"{where}: {KEY} holds {len(rows)} per-row truth ratios, but the forget split evaluated here "
                        f"has {n_forget} rows; expected one per row: the log of the same forget split, every row "
                        "(eval.max_examples unset)")
    return np.array([s for _, s in sorted(rows)], dtype=np.float64)


MIA_KEY = "mia_min_k"  # configs/eval/tofu_metrics/mia_min_k.yaml: the AUC its privleak reads from a retain log


def retain_reference_privleak_auc(path: str | Path) -> float | None:
    """PrivLeak's reference AUC from open-unlearning's evaluation log of a retain model: 1 - its `mia_min_k`
    agg_value (its privleak handler, src/evals/metrics/privacy.py, reads that entry of the retain log and takes
    1 - AUC, MUSE's direction), or None when the log has no such number (then 0.5 applies, with a note)."""
    p = Path(path)
    stat = p.stat()
    entry = _parsed(str(p.resolve()), stat.st_mtime_ns, stat.st_size).get(MIA_KEY)
    value = entry.get("agg_value") if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return None
    return 1.0 - float(value)


def retain_reference_truth_ratios(cfg: Any, splits: dict[str, list]) -> np.ndarray:
    """The forget truth ratios eval.retain_reference gives for the loaded evaluation `splits` (pre-flight and
    evaluation both call it): the forget split must be there and give truth ratios of its own."""

    return load_retain_reference(cfg.retain_reference, len(reference_forget_rows(splits, "eval.retain_reference")))
