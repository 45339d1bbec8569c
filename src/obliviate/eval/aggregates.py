"""TOFU's set-level numbers recomputed from their per-row parts, so that their intervals resample rows too.

Model utility (the harmonic mean of nine row means; TOFU, Maini et al. 2024, §2.5), forget quality (the p-value of a
KS test between two per-row truth-ratio arrays) and the closer-look FE and MU (Yuan et al. 2024; eval/closer_look.py)
are not means of rows. A bootstrap draw (eval/intervals.py) resamples their parts, each split's rows on their own
(`row_group`), and `with_tofu_aggregates` recomputes them from the draw, so their intervals are over rows × seeds,
not over seeds alone. A part a trial recorded no rows of enters as the trial's value (trials made before these rows
were kept: no per-row truth ratios for forget quality, no per-row token entropy outside the forget split).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from obliviate.eval.closer_look import partial_aggregates
from obliviate.eval.intervals import REFERENCE
from obliviate.eval.tofu import FQ_ROWS, KINDS, UTILITY_KEYS, UTILITY_SPLITS, forget_quality, model_utility

_CLOSER = ("rougeL_recall", "prob", "truth_ratio", "token_entropy", "cosine_similarity", "entailment_score")
# each aggregate and the per-row metrics it is made of (what a bootstrap of it resamples)
PARTS: dict[str, tuple[str, ...]] = {
    "model_utility": UTILITY_KEYS,
    "forget_quality": FQ_ROWS,
    "mu": tuple(f"{s}_{p}" for s in UTILITY_SPLITS for p in _CLOSER),
    "fe": tuple(f"forget_{p}" for p in _CLOSER if p != "token_entropy"),
}
PARTS |= {"mu_partial": PARTS["mu"], "fe_partial": PARTS["fe"]}


def row_group(key: str, n: int) -> str:
    """The split a per-row metric belongs to (its name's prefix: forget, retain, real_authors, world_facts): a
    bootstrap draws each split's rows on its own, as the splits are separate samples; other keys by their length.
    A reference's copy of a metric (REFERENCE-prefixed) goes with the metric: both are drawn on the same rows."""
    key = key[len(REFERENCE):] if key.startswith(REFERENCE) else key  # a reference's rows are drawn with the model's
    for kind in sorted(KINDS, key=len, reverse=True):
        if key.startswith(f"{kind}_"):
            return kind
    return f"{n} rows"


def parts_of(metrics: tuple[str, ...]) -> tuple[str, ...]:
    """`metrics` and the per-row parts of those that are aggregates (PARTS): what an interval of them rests on."""
    return tuple(dict.fromkeys(k for m in metrics for k in (m, *PARTS.get(m, ()))))


def with_tofu_aggregates(metrics: Mapping[str, Any], which: Iterable[str] = tuple(PARTS)) -> dict[str, Any]:
    """`metrics` with model utility, forget quality and the closer-look FE / MU (those of them in `which`)
    recomputed from their parts where the parts are there (forget quality: both FQ_ROWS arrays; FE / MU: only when
    the trial had them), for a bootstrap draw whose row means (and FQ_ROWS rows) replaced the trial's values."""
    out, which = dict(metrics), set(which)
    if "model_utility" in which and out.get("model_utility") is not None \
            and all(out.get(k) is not None for k in UTILITY_KEYS):
        out["model_utility"] = model_utility(out)
    unlearned, retain = (out.get(k) for k in FQ_ROWS)
    if "forget_quality" in which and isinstance(unlearned, np.ndarray) and isinstance(retain, np.ndarray):
        out["forget_quality"] = forget_quality(unlearned, retain)
    closer = {"fe", "mu", "fe_partial", "mu_partial"}
    if which & closer and any(out.get(k) is not None for k in closer):
        # the closer-look truth ratio is TOFU's row term (1 - it on the forget split): eval/closer_look.py
        for kind in KINDS:
            tr, cl = out.get(f"{kind}_truth_ratio"), f"{kind}_cl_truth_ratio"
            if tr is not None and out.get(cl) is not None:
                out[cl] = 1.0 - tr if kind == "forget" else tr
        agg, _ = partial_aggregates(out)
        out |= {k: agg[k] for k in ("fe", "mu", "fe_partial", "mu_partial")}
    return out

